// The ticket board (seed 001): draws what /api/board says and re-reads it every refresh_ms
// (5 s by default). It keeps no state of its own about tickets – the files are the only truth – so
// nothing here can disagree with the queue for longer than one refresh.
"use strict";

const board = {
  data: null,
  refreshMs: 5000,
  timer: null,
  detailHash: null,
  detailAnswering: null,
  refreshes: 0,
};

function $(selector, root = document) {
  return root.querySelector(selector);
}

// Builds an element; text goes in through textContent only, never as HTML.
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "text") node.textContent = value;
    else if (key === "onclick") node.addEventListener("click", value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

async function api(path, options = {}) {
  const response = await fetch(path, { cache: "no-store", ...options });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || body.detail || `HTTP ${response.status}`);
  return body;
}

// Every write carries the page's CSRF token (docs/security.md "Browsers and local pages").
const CSRF = document.querySelector('meta[name="csrf-token"]')?.content || "";

function post(path, payload) {
  return api(path, {
    method: "POST",
    headers: { "content-type": "application/json", "x-csrf-token": CSRF },
    body: JSON.stringify(payload || {}),
  });
}

// ---- reading the queue -------------------------------------------------------------------------

async function refresh() {
  clearTimeout(board.timer);
  try {
    const data = await api("/api/board");
    board.data = data;
    board.refreshMs = data.refresh_ms;
    drawTotals(data.totals);
    drawBell(data.bell);
    drawLanes(data);
    if (board.detailHash) await drawDetail(board.detailHash);
    $("#load-error").hidden = true;
  } catch (error) {
    const banner = $("#load-error");
    banner.textContent = `cannot read the queue: ${error.message}`;
    banner.hidden = false;
  }
  board.refreshes += 1;
  document.body.dataset.refreshes = String(board.refreshes);
  board.timer = setTimeout(refresh, board.refreshMs);
}

// ---- the board ---------------------------------------------------------------------------------

function drawTotals(totals) {
  $("#totals").textContent = totals.text;
}

function meter(card) {
  const level = card.effective_priority;
  const title = card.inherited_from
    ? `priority ${card.priority}, ranked ${level} (inherited from ${card.inherited_from})`
    : `priority ${level}`;
  const node = el("span", { class: "meter", "data-level": level, title });
  for (let bar = 1; bar <= 5; bar += 1) node.append(el("i", { class: bar <= level ? "bar on" : "bar" }));
  return node;
}

// Markers that are not lanes (tickets.md §3): the deps tag, the answer badge, and ours.
function marks(card) {
  const node = el("div", { class: "marks" });
  const waiting = card.deps_unmet.filter((dep) => !card.deps_impossible.includes(dep));
  if (waiting.length) node.append(el("span", { class: "tag deps", text: `deps ${waiting.join(" ")}` }));
  if (card.deps_impossible.length) {
    node.append(el("span", { class: "tag deps-impossible", text: `deps ? ${card.deps_impossible.join(" ")}` }));
  }
  if (card.answer) {
    node.append(el("span", { class: "badge answer", text: `answer waiting · ${card.answer.days}d` }));
  }
  if (card.failed_out) node.append(el("span", { class: "tag failed", text: `failed ×${card.failures}` }));
  if (card.status === "assigned") node.append(el("span", { class: "badge assigned", text: "assigned" }));
  return node;
}

function cardNode(card) {
  return el(
    "article",
    {
      class: "card",
      "data-hash": card.hash,
      "data-status": card.status,
      tabindex: "0",
      onclick: () => openCardDialog(card.hash),
    },
    el("div", { class: "card-head" }, meter(card), el("span", { class: "hash", text: card.hash })),
    el("p", { class: "title", text: card.title }),
    marks(card),
  );
}

function drawLanes(data) {
  for (const lane of data.lanes) {
    const section = document.querySelector(`.lane[data-lane="${lane.lane}"]`);
    $(".count", section).textContent = String(lane.total);
    $(".cards", section).replaceChildren(...lane.cards.map(cardNode));
    const more = $(".more", section);
    if (more) {
      more.hidden = lane.total <= lane.cards.length;
      more.textContent = `${lane.total - lane.cards.length} older not shown`;
    }
  }
  $("#unlaned .cards").replaceChildren(...data.unlaned.map(cardNode));
  // Files the queue refuses (issue 12 §8): in no lane, never dispatched, always shown with why.
  $("#invalid").hidden = data.invalid.length === 0;
  $("#invalid ul").replaceChildren(...data.invalid.map(invalidItem));
  drawFilterChoices(data.statuses);
  applyFilter();
}

function drawFilterChoices(statuses) {
  const select = $("#status-filter");
  if (select.options.length > 1) return;
  for (const status of statuses) select.append(el("option", { value: status, text: status }));
}

// The filter picks engine states; the lanes still draw the flow (tickets.md §3).
function applyFilter() {
  const chosen = $("#status-filter").value;
  for (const card of document.querySelectorAll(".lane .card")) {
    card.hidden = Boolean(chosen) && card.dataset.status !== chosen;
  }
  $("#unlaned").hidden = chosen !== "assigned";
}

// ---- the bell ----------------------------------------------------------------------------------

function invalidItem(item) {
  return el(
    "li",
    { class: "invalid-file", "data-file": item.file },
    el("span", { class: "file", text: item.file }),
    el("span", { class: "details", text: ` invalid: ${item.reason}` }),
  );
}

function drawBell(bell) {
  const count = $("#bell-count");
  count.textContent = String(bell.count);
  count.hidden = bell.count === 0;
  $("#bell-empty").hidden = bell.count !== 0;

  const stuckTitle = $("#bell-stuck-title");
  stuckTitle.hidden = bell.stuck.length === 0;
  stuckTitle.textContent = `${bell.stuck.length} tickets nobody picks up`;
  $("#bell-stuck").replaceChildren(
    ...bell.stuck.map((item) =>
      el(
        "li",
        { "data-hash": item.hash },
        el("a", { href: `#/ticket/${item.hash}`, text: item.title }),
        el("span", { class: "hash", text: ` ${item.hash} ` }),
        el("span", { class: "details", text: item.details.join("; ") }),
        ...item.actions.map((action) =>
          el("button", {
            type: "button",
            class: action,
            text: action,
            onclick: () => act(action, item.hash),
          }),
        ),
      ),
    ),
  );

  const answersTitle = $("#bell-answers-title");
  answersTitle.hidden = bell.answers.length === 0;
  answersTitle.textContent = `${bell.answers.length} questions waiting for an answer`;
  $("#bell-answers").replaceChildren(
    ...bell.answers.map((item) =>
      el(
        "li",
        { "data-hash": item.hash },
        el("a", { href: `#/ticket/${item.hash}`, text: item.title }),
        el("span", { class: "details", text: ` ${item.question} (${item.days}d) ` }),
        el("a", {
          href: "#",
          class: "answer-link",
          text: "answer",
          onclick: (event) => {
            event.preventDefault();
            openAnswerDialog(item.hash);
          },
        }),
      ),
    ),
  );

  const invalidTitle = $("#bell-invalid-title");
  invalidTitle.hidden = bell.invalid.length === 0;
  invalidTitle.textContent = `${bell.invalid.length} invalid files nobody picks up`;
  $("#bell-invalid").replaceChildren(...bell.invalid.map(invalidItem));
}

async function act(action, hash) {
  try {
    await post(`/api/tickets/${encodeURIComponent(hash)}/${action}`);
  } catch (error) {
    window.alert(`${action} ${hash}: ${error.message}`);
  }
  await refresh();
}

function toggleBell() {
  const panel = $("#bell-panel");
  panel.hidden = !panel.hidden;
  $("#bell-button").setAttribute("aria-expanded", String(!panel.hidden));
}

// ---- the one answer form -----------------------------------------------------------------------

function findCard(hash) {
  const data = board.data;
  if (!data) return null;
  for (const lane of data.lanes) for (const card of lane.cards) if (card.hash === hash) return card;
  return data.unlaned.find((card) => card.hash === hash) || null;
}

// Mounts the answer form in `host`; `place` names where it is (detail, card, bell) for the tests.
function mountAnswerForm(host, card, place, onSent) {
  const form = $("#answer-form-template").content.firstElementChild.cloneNode(true);
  form.dataset.place = place;
  form.dataset.hash = card.hash;
  $(".question", form).textContent = card.answer ? card.answer.question : "";
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = $("button[type=submit]", form);
    button.disabled = true;
    try {
      await post(`/api/tickets/${encodeURIComponent(card.hash)}/answer`, {
        text: form.elements.text.value,
        by: form.elements.by.value,
      });
      if (onSent) onSent();
      await refresh();
    } catch (error) {
      const message = $(".form-error", form);
      message.textContent = error.message;
      message.hidden = false;
      button.disabled = false;
    }
  });
  host.replaceChildren(form);
  return form;
}

function openCardDialog(hash) {
  const card = findCard(hash);
  if (!card) return;
  const dialog = $("#card-dialog");
  dialog.dataset.hash = hash;
  $(".title", dialog).textContent = card.title;
  $(".hash", dialog).textContent = `${card.hash} · ${card.status}`;
  $(".marks", dialog).replaceWith(marks(card));
  $(".detail-link", dialog).setAttribute("href", `#/ticket/${hash}`);
  const host = $(".dialog-answer", dialog);
  if (card.answer) mountAnswerForm(host, card, "card", () => dialog.close());
  else host.replaceChildren();
  dialog.showModal();
}

function openAnswerDialog(hash) {
  const card = findCard(hash);
  if (!card) return;
  const dialog = $("#answer-dialog");
  dialog.dataset.hash = hash;
  $(".title", dialog).textContent = `answer: ${card.title}`;
  mountAnswerForm($(".dialog-answer", dialog), card, "bell", () => dialog.close());
  dialog.showModal();
}

// ---- the ticket detail -------------------------------------------------------------------------

async function drawDetail(hash) {
  let detail;
  try {
    detail = await api(`/api/tickets/${encodeURIComponent(hash)}`);
  } catch (error) {
    $("#detail-title").textContent = `ticket ${hash}: ${error.message}`;
    return;
  }
  const card = detail.card;
  $("#detail-title").textContent = card.title;
  $("#detail-hash").textContent = `${card.hash} · ${card.status} · ${card.lane || "in no lane"}`;
  const marksNode = marks(card);
  marksNode.id = "detail-marks";
  $("#detail-marks").replaceWith(marksNode);
  $("#detail-fields").replaceChildren(
    ...detail.fields.map(([key, value]) => el("tr", {}, el("th", { text: key }), el("td", { text: value }))),
  );
  $("#detail-log").textContent = detail.body;
  $("#detail-answers").replaceChildren(
    ...detail.answers.map((answer) =>
      el("li", { text: `answer by ${answer.by || "someone"} (${answer.file}): ${answer.text}` }),
    ),
  );
  // The progress-log box's input stands in answer mode while the session waits for an answer
  // (seed 001); it is re-mounted only when the mode changes, so a refresh never eats typing.
  const answering = Boolean(card.answer);
  if (answering !== board.detailAnswering) {
    board.detailAnswering = answering;
    const input = $("#log-input");
    $("#log-box").classList.toggle("answer-mode", answering);
    if (answering) mountAnswerForm(input, card, "detail");
    else {
      input.replaceChildren(
        el("p", {
          class: "log-readonly",
          text: "The worker writes this log. When a session asks a question, this box takes the answer.",
        }),
      );
    }
  }
}

// ---- routing and start-up ----------------------------------------------------------------------

async function route() {
  const match = location.hash.match(/^#\/ticket\/(.+)$/);
  board.detailHash = match ? decodeURIComponent(match[1]) : null;
  board.detailAnswering = null;
  $("#board-view").hidden = Boolean(match);
  $("#detail-view").hidden = !match;
  if (match) await drawDetail(board.detailHash);
}

async function loadHelp() {
  const rows = await api("/api/help");
  $("#help-table tbody").replaceChildren(
    ...rows.map((row) =>
      el("tr", {}, el("td", { text: row.keys.join(", ") }), el("td", { text: row.writer }), el("td", { text: row.meaning })),
    ),
  );
}

document.addEventListener("DOMContentLoaded", () => {
  $("#bell-button").addEventListener("click", toggleBell);
  $("#help-button").addEventListener("click", () => $("#help-dialog").showModal());
  $("#status-filter").addEventListener("change", applyFilter);
  window.addEventListener("hashchange", route);
  loadHelp().catch(() => {});
  route().then(refresh);
});
