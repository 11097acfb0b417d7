// Small DOM and formatting helpers shared by the panel's screens (docs/panel.md).
// Text always goes in through textContent, never as HTML, so nothing a contract or a node says can
// inject markup. Countdowns live here too: they are computed from the server's observed_at
// (seed 003 §3.2) and then counted down locally against performance.now(), never the browser's
// wall clock, and are clamped at 0.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// el("a", {href: "#/", text: "back"}) or el("p", {}, "text ", el("code", {text: "x"})).
export function el(tag, attrs = {}, ...children) {
  return build(document.createElement(tag), attrs, children);
}

// The same for SVG elements (the work graph).
export function svg(tag, attrs = {}, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

// Replaces a container's children; returns the container.
export function fill(container, ...children) {
  container.replaceChildren();
  return build(container, {}, children);
}

// A capability or `matched` value as a person reads it: strings bare, the rest as JSON.
export function showValue(value) {
  return typeof value === "string" ? value : JSON.stringify(value);
}

export function pairs(object) {
  return Object.entries(object || {}).map(([k, v]) => `${k}=${showValue(v)}`);
}

// A timestamp as local HH:MM:SS (the full ISO form goes in a title attribute).
export function clockTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleTimeString([], { hour12: false });
}

export function duration(ms) {
  if (!(ms >= 0)) return "";
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

// How long before `observedAt` something happened, both server times (no browser clock).
export function ago(iso, observedAt) {
  if (!iso || !observedAt) return "—";
  return `${duration(Math.max(0, Date.parse(observedAt) - Date.parse(iso)))} ago`;
}

export function timeCell(iso, observedAt) {
  const text = observedAt ? ago(iso, observedAt) : clockTime(iso);
  return el("time", { datetime: iso || null, title: iso || null, text });
}

// ---- countdowns (seed 003 §3.2) ----------------------------------------------------------------
// remaining = expires_at − observed_at, both read by the server in that order, so it is > 0 when
// it arrives; from then on it counts down on the page's monotonic clock and stops at 0.

export function countdown(expiresAt, observedAt, receivedAt) {
  const remaining = Math.max(0, Date.parse(expiresAt) - Date.parse(observedAt));
  const span = el("span", {
    class: "countdown",
    "data-deadline": receivedAt + remaining,
    title: `expires_at ${expiresAt}`,
  });
  paintCountdown(span, performance.now());
  return span;
}

function paintCountdown(span, now) {
  const left = Math.max(0, Number(span.dataset.deadline) - now);
  const seconds = Math.ceil(left / 1000);
  span.textContent = `${seconds} s`;
  span.dataset.seconds = String(seconds);
  span.classList.toggle("expired", seconds === 0);
}

export function tickCountdowns() {
  const now = performance.now();
  for (const span of document.querySelectorAll(".countdown[data-deadline]")) paintCountdown(span, now);
}
