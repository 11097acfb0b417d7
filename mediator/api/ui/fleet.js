// S1 — fleet and runs (docs/panel.md). A card per live node: label, capabilities, drain state, the
// run its lease belongs to and a countdown to its advert's expires_at. Below, the run list with
// state chips that filter it. A QUEUED run is a real row with its queue position and wait reason,
// which GET /v1/runs gives for the whole page (issue 15 §4: before, one GET /v1/runs/{id} per
// queued row, up to 50 a refresh); it sits on no node card, because a queued run holds no node
// (docs/design.md I3) — the cards show only what leases say.
//
// What blocks the lab (issue 15 §5): a running run whose ask waits for a person holds its nodes
// and so the queue behind them — its row carries an ask badge, and the header counts the queued
// and running runs, the open asks and the idle and draining nodes. Three requests a refresh:
// nodes, runs, asks.

import { api } from "./api.js";
import { el, fill, pairs, countdown, timeCell } from "./dom.js";

export const RUN_STATES = ["QUEUED", "RUNNING", "PASSED", "FAILED"];
const RUN_LIMIT = 100;

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
    const [fleet, list, open] = await Promise.all([api.nodes(), api.runs(filter, RUN_LIMIT), api.asks()]);
    const receivedAt = performance.now();
    const asks = new Map();
    for (const a of open.asks) asks.set(a.run_id, [...(asks.get(a.run_id) || []), a]);
    drawCounts(list.counts || {}, open.asks, fleet);
    drawNodes(cards, fleet, receivedAt);
    drawRuns(runs, list, asks, filter, ctx);
  }

  return { refresh, title: "Fleet & runs" };
}

const runHref = (runId) => `#/runs/${encodeURIComponent(runId)}`;

// The header's counts: what waits, what runs, what waits for a person, which nodes are free.
function drawCounts(counts, asks, fleet) {
  const container = document.getElementById("counts");
  if (!container) return;
  const idle = fleet.nodes.filter((n) => !n.lease && !n.drain).length;
  const draining = fleet.nodes.filter((n) => n.drain).length;
  const item = (key, n, label, extra = {}) =>
    el("a", { class: `count count-${key}${n ? "" : " zero"}`, "data-count": key, ...extra },
      el("b", { text: String(n) }), ` ${label}`);
  const firstAsk = asks.length ? runHref(asks[0].run_id) : null;
  fill(container,
    item("queued", counts.queued || 0, "queued", { href: "#/?state=QUEUED" }),
    item("running", counts.running || 0, "running", { href: "#/?state=RUNNING" }),
    item("asks", asks.length, asks.length === 1 ? "waiting for an answer" : "waiting for answers",
      firstAsk ? { href: firstAsk, title: "open the first run that waits for an answer" } : {}),
    item("idle", idle, idle === 1 ? "idle node" : "idle nodes"),
    item("draining", draining, draining === 1 ? "draining node" : "draining nodes"));
  container.hidden = false;
}

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

function drawRuns(container, list, asks, filter, ctx) {
  if (!list.runs.length) {
    fill(container, el("p", { class: "muted empty", text: filter ? `No ${filter} run.` : "No run yet." }));
    return;
  }
  const columns = ["run", "state", "waiting / where", "steps now", "work", "created", "ended"];
  const head = el("tr", {}, columns.map((h) => el("th", { text: h })));
  const rows = list.runs.map((r) => runRow(r, asks.get(r.run_id) || [], list.observed_at, ctx));
  const note = list.runs.length >= RUN_LIMIT
    ? el("p", { class: "muted", text: `The latest ${RUN_LIMIT} runs are shown.` })
    : null;
  fill(container, el("table", { class: "run-list" }, el("thead", {}, head), el("tbody", {}, rows)), note);
}

function runRow(r, asks, observedAt, ctx) {
  const open = () => ctx.navigate(runHref(r.run_id));
  // data-label: the column's name, shown beside each cell when a narrow screen stacks them
  const cell = (label, attrs, ...children) => el("td", { "data-label": label, ...attrs }, ...children);
  return el("tr", { class: `run-row${asks.length ? " has-ask" : ""}`, "data-run": r.run_id,
    "data-state": r.state, onclick: open },
    cell("run", {}, el("a", { class: "run-id", href: runHref(r.run_id), text: r.run_id })),
    cell("state", {}, el("span", { class: `pill state-${r.state}`, text: r.state }),
      r.verdict ? el("span", { class: "verdict", text: ` ${r.verdict}` }) : null),
    cell("waiting / where", { class: "where" }, where(r)),
    cell("steps now", { class: "current" },
      asks.map((a) => el("a", { class: "ask-badge", href: runHref(r.run_id), "data-ask": a.ask_id,
        title: `Open the run to answer: ${a.question}` },
        el("b", { text: "ask" }), " waiting for an answer: ", el("q", { text: a.question }))),
      (r.current || []).map((c) =>
        el("div", { text: `${c.node}: ${c.step}${c.attempt > 1 ? ` (attempt ${c.attempt})` : ""}` }))),
    cell("work", { class: "work", text: r.work_id || "" }),
    cell("created", {}, timeCell(r.created_at, observedAt)),
    cell("ended", {}, r.ended_at ? timeCell(r.ended_at, observedAt) : ""));
}

// What a person wants to know in the middle column: why a queued run waits, where a running run
// runs, why a refused run was refused.
function where(r) {
  if (r.state === "QUEUED") {
    // promoted between the page's statements: the next refresh shows it running
    if (r.queue_position === undefined) return el("span", { class: "muted", text: "queued" });
    return el("div", { class: "queued" }, queueLine(r));
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
