// The Mediator's panel (docs/panel.md): hash routing between S1 (#/, #/?state=QUEUED) and S2
// (#/runs/<run_id>), and the refresh loop that re-reads the API every 5 s. Settings come from the
// page URL so an operator or a test can change them without a build step:
//   ?refresh=<ms>   the refresh interval (default 5000; tests use a few hundred ms)
//   ?board=<url>    the ticket board of seed 001 (default: the tickets-board meta tag)

import { ApiError, auth } from "./api.js";
import { el, fill, tickCountdowns } from "./dom.js";
import { fleetScreen } from "./fleet.js";
import { runScreen } from "./run.js";

const settings = new URLSearchParams(location.search);
const REFRESH_MS = Math.max(100, Number(settings.get("refresh")) || 5000);
const BOARD_URL = settings.get("board") || document.querySelector('meta[name="tickets-board"]').content;

const view = document.getElementById("view");
const status = document.getElementById("status");
let screen = null; // the current screen: {refresh, title}
let timer = null;
let running = null; // the refresh in flight, so two never overlap

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  const run = path.match(/^\/runs\/(.+)$/);
  if (run) return { name: "run", runId: decodeURIComponent(run[1]) };
  return { name: "fleet", params: new URLSearchParams(query || "") };
}

const ctx = {
  navigate(hash) {
    if (location.hash !== hash) location.hash = hash;
  },
  refreshNow() {
    refresh();
  },
};

function mount() {
  const r = route();
  const root = el("div", { class: `screen screen-${r.name}` });
  fill(view, root);
  document.getElementById("counts").hidden = true; // S1 shows it again with fresh figures
  screen = r.name === "run" ? runScreen(root, r.runId, ctx) : fleetScreen(root, r.params, ctx);
  document.title = `${screen.title} · Mediator`;
  for (const link of document.querySelectorAll("nav a[data-route]")) {
    link.classList.toggle("current", link.dataset.route === r.name);
  }
  refresh();
}

// One refresh of the current screen, then the next one REFRESH_MS later. A refresh asked for
// while one is in flight runs right after it, so an answer or a navigation is never lost.
async function refresh() {
  clearTimeout(timer);
  if (running) {
    running.again = true;
    return;
  }
  const current = screen;
  running = { again: false };
  try {
    await current.refresh();
    status.className = "status ok";
    const now = new Date().toLocaleTimeString([], { hour12: false });
    status.textContent = `updated ${now} · every ${REFRESH_MS / 1000} s`;
  } catch (e) {
    status.className = "status error";
    status.textContent = e.status === 404 ? e.message : `${e.message} Retrying every ${REFRESH_MS / 1000} s.`;
    if (e.status === 401) askForToken();
    if (!(e instanceof ApiError)) reportError(e); // a bug in the panel, not the server: let it show
  } finally {
    const again = running.again || current !== screen;
    running = null;
    if (again) refresh();
    else timer = setTimeout(refresh, REFRESH_MS);
  }
}

// A 401 means no token or a refused one: forget it and ask (the form sits in the header).
const tokenForm = document.getElementById("token-form");
function askForToken() {
  auth.token = "";
  tokenForm.hidden = false;
}
tokenForm.addEventListener("submit", (event) => {
  event.preventDefault();
  auth.token = tokenForm.elements.token.value.trim();
  tokenForm.reset();
  tokenForm.hidden = true;
  refresh();
});

// A link to where nothing listens is worse than none: shown only when configured (issue 29).
if (BOARD_URL) {
  const link = document.getElementById("tickets-link");
  link.href = BOARD_URL;
  link.hidden = false;
}
window.addEventListener("hashchange", mount);
setInterval(tickCountdowns, 250);
mount();
