// S1 — fleet and runs (docs/panel.md). A card per live node: label, capabilities, drain state, the
// run its lease belongs to and a countdown to its advert's expires_at. Below, the run list with
// state chips that filter it. A QUEUED run is a real row with its queue position and wait reason
// (read from GET /v1/runs/{id}, which computes both on demand); it sits on no node card, because a
// queued run holds no node (design.md §7, design.md I3) — the cards show only what leases say.

import { api } from "./api.js";
import { el, fill, pairs, countdown, timeCell } from "./dom.js";

export const RUN_STATES = ["QUEUED", "RUNNING", "PASSED", "FAILED"];
const RUN_LIMIT = 100;
const QUEUED_DETAILS = 50; // queued rows whose position and reason are fetched each refresh

export function fleetScreen(root, params, ctx) {
  const filter = RUN_STATES.includes(params.get("state")) ? params.get("state") : "";

  const chips = el("div", { class: "chips", role: "group", "aria-label": "filter runs by state" },
    [["", "All"], ...RUN_STATES.map((s) => [s, s])].map(([state, label]) =>
      el("a", {
        class: `chip ${state ? `state-${state}` : "all"}`,
        href: state ? `#/?state=${state}` : "#/",
        "data-chip": state || "ALL",
        "aria-pressed": String(state === filter),
        text: label,
      })));
  const cards = el("div", { class: "cards", id: "nodes" }, el("p", { class: "muted", text: "loading…" }));
  const runs = el("div", { id: "runs" }, el("p", { class: "muted", text: "loading…" }));
  fill(root,
    el("section", { class: "fleet" }, el("h2", { text: "Fleet" }), cards),
    el("section", { class: "runs" },
      el("div", { class: "runs-head" }, el("h2", { text: "Runs" }), chips),
      runs));

  async function refresh() {
    const [fleet, list] = await Promise.all([api.nodes(), api.runs(filter, RUN_LIMIT)]);
    const receivedAt = performance.now();
    const queued = list.runs.filter((r) => r.state === "QUEUED").slice(0, QUEUED_DETAILS);
    const details = new Map();
    await Promise.all(queued.map(async (r) => {
      try {
        details.set(r.run_id, await api.run(r.run_id));
      } catch {
        // gone or promoted between the two reads: the row shows without its reason this time
      }
    }));
    drawNodes(cards, fleet, receivedAt);
    drawRuns(runs, list, details, filter, ctx);
  }

  return { refresh, title: "Fleet & runs" };
}

const runHref = (runId) => `#/runs/${encodeURIComponent(runId)}`;

function drawNodes(container, fleet, receivedAt) {
  if (!fleet.nodes.length) {
    fill(container, el("p", { class: "muted empty" },
      "No live node. Start one with ",
      el("code", { text: "enode --url URL --node-id ID --caps caps.json" }), "."));
    return;
  }
  fill(container, fleet.nodes.map((n) => nodeCard(n, fleet.observed_at, receivedAt)));
}

function nodeCard(n, observedAt, receivedAt) {
  const lease = n.lease
    ? el("dd", { class: "lease" },
      el("a", { href: runHref(n.lease.run_id), class: "run-id", "data-lease": n.lease.run_id },
        n.lease.run_id))
    : el("dd", { class: "lease idle", text: "idle" });
  const drain = n.drain
    ? el("dd", { class: "drain draining", text: `draining (${n.drain})` })
    : el("dd", { class: "drain", text: "accepting" });
  const classes = ["card", "node", n.drain ? "is-draining" : "", n.lease ? "is-leased" : ""];
  return el("article", { class: classes.join(" ").trim(), "data-node": n.node_id },
    el("header", {},
      el("h3", { text: n.label || n.node_id }),
      n.label ? el("code", { class: "node-id", text: n.node_id }) : null),
    el("ul", { class: "caps" }, pairs(n.capabilities).map((c) => el("li", { text: c, title: c }))),
    el("dl", {},
      el("dt", { text: "drain" }), drain,
      el("dt", { text: "lease" }), lease,
      el("dt", { text: "advert" }),
      el("dd", { class: "advert" }, "expires in ", countdown(n.expires_at, observedAt, receivedAt))));
}

function drawRuns(container, list, details, filter, ctx) {
  if (!list.runs.length) {
    fill(container, el("p", { class: "muted empty", text: filter ? `No ${filter} run.` : "No run yet." }));
    return;
  }
  const columns = ["run", "state", "waiting / where", "steps now", "work", "created", "ended"];
  const head = el("tr", {}, columns.map((h) => el("th", { text: h })));
  const rows = list.runs.map((r) => runRow(r, details.get(r.run_id), list.observed_at, ctx));
  const note = list.runs.length >= RUN_LIMIT
    ? el("p", { class: "muted", text: `The latest ${RUN_LIMIT} runs are shown.` })
    : null;
  fill(container, el("table", { class: "run-list" }, el("thead", {}, head), el("tbody", {}, rows)), note);
}

function runRow(r, detail, observedAt, ctx) {
  const open = () => ctx.navigate(runHref(r.run_id));
  return el("tr", { class: "run-row", "data-run": r.run_id, "data-state": r.state, onclick: open },
    el("td", {}, el("a", { class: "run-id", href: runHref(r.run_id), text: r.run_id })),
    el("td", {}, el("span", { class: `pill state-${r.state}`, text: r.state }),
      r.verdict ? el("span", { class: "verdict", text: ` ${r.verdict}` }) : null),
    el("td", { class: "where" }, where(r, detail)),
    el("td", { class: "current" }, (r.current || []).map((c) =>
      el("div", { text: `${c.node}: ${c.step}${c.attempt > 1 ? ` (attempt ${c.attempt})` : ""}` }))),
    el("td", { class: "work", text: r.work_id || "" }),
    el("td", {}, timeCell(r.created_at, observedAt)),
    el("td", {}, r.ended_at ? timeCell(r.ended_at, observedAt) : ""));
}

// What a person wants to know in the middle column: why a queued run waits, where a running run
// runs, why a refused run was refused.
function where(r, detail) {
  if (r.state === "QUEUED") {
    if (!detail || detail.queue_position === undefined) return el("span", { class: "muted", text: "queued" });
    return el("div", { class: "queued" }, queueLine(detail));
  }
  if (r.reject) return el("span", { class: "reject", text: r.reject.message || r.reject.code });
  if (r.assigned) {
    return Object.entries(r.assigned).map(([role, node]) => el("div", { text: `${role} → ${node}` }));
  }
  return "";
}

// "#1 in queue · ALL_BUSY · the message · busy: X": shared with S2's banner.
export function queueLine(detail) {
  const w = detail.wait_reason || {};
  const extra = [];
  if (w.busy && w.busy.length) extra.push(`busy: ${w.busy.join(", ")}`);
  if (w.draining && w.draining.length) extra.push(`draining: ${w.draining.join(", ")}`);
  return [
    el("span", {
      class: "queue-pos",
      "data-position": detail.queue_position,
      text: `#${detail.queue_position} in queue`,
    }),
    w.code ? el("span", { class: "wait-code", text: w.code }) : null,
    el("span", { class: "wait-reason", text: w.message || "" }),
    extra.length ? el("span", { class: "wait-nodes", text: extra.join(" · ") }) : null,
  ];
}
