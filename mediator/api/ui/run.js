// S2 — one run's work graph (panel.md). The steps exist from submit (R5), so the graph is drawn
// while the run is still QUEUED, with its queue position and wait reason above it; once running,
// each box says which node took it, the attempt and what was `chosen`. Open asks of the run are
// answered in place (POST /v1/asks/{id}/answer). The record link leads to the record manifest,
// which is sealed once the run ends (docs/design.md I6).

import { api, auth, openWithToken } from "./api.js";
import { el, fill, pairs, clockTime, duration } from "./dom.js";
import { drawGraph } from "./graph.js";
import { queueLine } from "./fleet.js";

const STEP_STATES = ["PENDING", "CLAIMED", "ASKED", "PASSED", "FAILED", "SKIPPED"];

export function runScreen(root, runId, ctx) {
  const head = el("section", { class: "run-head" }, el("p", { class: "muted", text: "loading…" }));
  const queue = el("section", { class: "queue-banner", hidden: true });
  const asks = el("section", { class: "asks", hidden: true },
    el("h3", { text: "Open asks" }), el("div", { class: "ask-list" }));
  const graph = el("section", { class: "graph-box" });
  const table = el("section", { class: "step-table" });
  fill(root,
    el("p", { class: "back" }, el("a", { href: "#/", text: "← Fleet & runs" })),
    head, queue, asks, graph, table);
  const askForms = new Map(); // ask_id → form, kept across refreshes so typed answers survive

  async function refresh() {
    const [run, open, record] = await Promise.all([
      api.run(runId),
      api.asks(),
      api.record(runId).catch(() => null),
    ]);
    drawHead(head, run, record);
    drawQueue(queue, run);
    drawAsks(asks, askForms, open.asks.filter((a) => a.run_id === run.run_id), run, ctx);
    const signature = JSON.stringify(run.steps);
    if (graph.dataset.signature !== signature) {
      graph.dataset.signature = signature;
      fill(graph,
        el("div", { class: "graph-title" }, el("h3", { text: `Steps (${run.steps.length})` }), legend()),
        drawGraph(run.steps));
      fill(table, stepTable(run.steps));
    }
  }

  return { refresh, title: `Run ${runId}` };
}

function drawHead(head, run, record) {
  const took = duration(Date.parse(run.ended_at) - Date.parse(run.started_at || run.created_at));
  const ended = run.ended_at ? `${clockTime(run.ended_at)} (${took})` : "—";
  const facts = [
    ["work", run.work_id || "—"],
    ["submitted by", run.submitter || "—"],
    ["created", clockTime(run.created_at)],
    ["started", clockTime(run.started_at)],
    ["ended", ended],
  ];
  if (run.assigned) {
    facts.push(["nodes", Object.entries(run.assigned).map(([r, n]) => `${r} → ${n}`).join(", ")]);
  }
  if (run.reject) facts.push(["refused", run.reject.message || run.reject.code]);
  fill(head,
    el("h2", {}, "Run ", el("code", { class: "run-id", text: run.run_id }), " ",
      el("span", { class: `pill state-${run.state}`, id: "run-state", text: run.state }),
      run.verdict ? el("span", { class: "verdict", text: ` ${run.verdict}` }) : null),
    el("dl", { class: "facts" }, facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })])),
    recordLine(run, record));
}

function recordLine(run, record) {
  const sealed = record && record.sealed;
  const files = record ? record.files || [] : [];
  const link = (href, attrs) =>
    el("a", { href, target: "_blank", rel: "noopener", onclick: opener(href), ...attrs });
  const state = sealed ? " · sealed · " : " · open until the run ends, then sealed · ";
  return el("p", { class: "record" },
    link(api.recordUrl(run.run_id), { id: "record-link", text: sealed ? "Sealed record" : "Record" }),
    el("span", { class: "muted", text: state }),
    files.map((f, i) => [i ? ", " : "", link(api.recordUrl(run.run_id, f), { text: f })]));
}

// Without a token the link itself does the work; with one, it must carry the header.
function opener(href) {
  return (event) => {
    if (!auth.token) return;
    event.preventDefault();
    openWithToken(href).catch(() => {}); // a refused file shows in its own tab
  };
}

function drawQueue(banner, run) {
  banner.hidden = run.state !== "QUEUED" || run.queue_position === undefined;
  if (!banner.hidden) fill(banner, el("strong", { text: "Queued. " }), queueLine(run));
}

function drawAsks(section, forms, open, run, ctx) {
  const list = section.querySelector(".ask-list");
  const ids = new Set(open.map((a) => a.ask_id));
  for (const [id, form] of forms) {
    if (!ids.has(id)) {
      form.remove();
      forms.delete(id);
    }
  }
  for (const ask of open) {
    if (!forms.has(ask.ask_id)) {
      const form = askForm(ask, run, ctx);
      forms.set(ask.ask_id, form);
      list.append(form);
    }
  }
  section.hidden = open.length === 0;
}

function askForm(ask, run, ctx) {
  const step = run.steps.find((s) => s.seq === ask.seq);
  const raised = clockTime(ask.raised_at);
  const input = el("input", {
    name: "answer",
    type: "text",
    placeholder: "answer (a note for the record)",
    "aria-label": "answer",
    autocomplete: "off",
  });
  const error = el("span", { class: "ask-error", role: "alert" });
  const okButton = el("button", { type: "submit", class: "ok", text: "OK" });
  const noButton = el("button", { type: "button", class: "not-ok", text: "Not OK" });
  const form = el("form", { class: "ask", "data-ask": ask.ask_id },
    el("p", { class: "question", text: ask.question }),
    el("p", { class: "muted", text: `step ${step ? step.name : ask.seq} · raised ${raised}` }),
    el("div", { class: "ask-controls" }, input, okButton, noButton, error));
  const send = async (ok) => {
    okButton.disabled = noButton.disabled = true;
    error.textContent = "";
    try {
      await api.answer(ask.ask_id, input.value, ok);
      form.classList.add("answered");
      ctx.refreshNow();
    } catch (e) {
      error.textContent = e.message;
      okButton.disabled = noButton.disabled = false;
    }
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    send(true);
  });
  noButton.addEventListener("click", () => send(false));
  return form;
}

function legend() {
  return el("ul", { class: "legend" }, STEP_STATES.map((s) => el("li", { class: `state-${s}`, text: s })));
}

function stepTable(steps) {
  const head = ["seq", "step", "kind", "role", "after", "state", "node", "attempt", "chosen",
    "started", "ended"];
  return el("table", { class: "steps" },
    el("thead", {}, el("tr", {}, head.map((h) => el("th", { text: h })))),
    el("tbody", {}, steps.map((s) => el("tr", { "data-seq": s.seq },
      // data-label: on a phone each row is a block of labelled lines (panel.css), as the run list
      cells(head, [
        { text: s.seq },
        { text: s.name },
        { text: s.kind === "ask" ? "ask" : `${s.kind} (${s.uses})` },
        { text: s.role || "—" },
        { text: (s.after || []).join(", ") },
        { child: el("span", { class: `pill state-${s.state}`, text: s.state }) },
        { text: s.node_id || "—" },
        { text: s.attempt },
        {
          class: "chosen",
          text: s.chosen ? `${s.chosen.node} · ${pairs(s.chosen.matched).join(", ")}` : "—",
          title: s.chosen ? JSON.stringify(s.chosen) : null,
        },
        { text: clockTime(s.started_at) },
        { text: clockTime(s.ended_at) },
      ])))));
}

function cells(labels, specs) {
  return specs.map(({ child, ...attrs }, i) =>
    el("td", { "data-label": labels[i], ...attrs }, ...(child ? [child] : [])));
}
