// The work graph of S2 as inline SVG: one box per step, coloured by its state, and an arrow for
// every name in a step's `after` (panel.md). The layout is layered: a step's column is the length
// of the longest `after` chain leading to it, so every arrow points right; within a column, steps
// sit near the average height of what they wait for (one barycentre pass), which keeps most arrows
// short and uncrossed. `layout` is pure (steps in, coordinates out); `drawGraph` only paints it.

import { el, svg, pairs } from "./dom.js";

export const BOX = { w: 196, h: 76, gapX: 64, gapY: 18, pad: 12 };

export function layout(steps) {
  const byName = new Map(steps.map((s) => [s.name, s]));
  const depth = new Map();
  const visiting = new Set();
  const depthOf = (s) => {
    if (depth.has(s.name)) return depth.get(s.name);
    if (visiting.has(s.name)) return 0; // a cycle cannot pass submit (R5); never loop on one
    visiting.add(s.name);
    let d = 0;
    for (const name of s.after || []) {
      const dep = byName.get(name);
      if (dep) d = Math.max(d, depthOf(dep) + 1);
    }
    visiting.delete(s.name);
    depth.set(s.name, d);
    return d;
  };
  const columns = [];
  for (const s of steps) (columns[depthOf(s)] ||= []).push(s);

  const row = new Map();
  columns.forEach((column, d) => {
    if (d > 0) {
      const centre = (s) => {
        const rows = (s.after || []).filter((n) => row.has(n)).map((n) => row.get(n));
        return rows.length ? rows.reduce((a, b) => a + b, 0) / rows.length : Infinity;
      };
      column.sort((a, b) => centre(a) - centre(b) || a.seq - b.seq);
    }
    column.forEach((s, i) => row.set(s.name, i));
  });

  const tallest = Math.max(1, ...columns.map((c) => c.length));
  const height = BOX.pad * 2 + tallest * BOX.h + (tallest - 1) * BOX.gapY;
  const boxes = new Map();
  columns.forEach((column, d) => {
    const used = column.length * BOX.h + (column.length - 1) * BOX.gapY;
    const top = (height - used) / 2;
    column.forEach((s, i) => {
      const x = BOX.pad + d * (BOX.w + BOX.gapX);
      boxes.set(s.name, { step: s, depth: d, x, y: top + i * (BOX.h + BOX.gapY) });
    });
  });

  const edges = [];
  for (const s of steps) {
    for (const name of s.after || []) {
      const a = boxes.get(name);
      const b = boxes.get(s.name);
      if (!a || !b) continue;
      const x1 = a.x + BOX.w;
      const y1 = a.y + BOX.h / 2;
      const x2 = b.x;
      const y2 = b.y + BOX.h / 2;
      const mid = (x1 + x2) / 2;
      const d = `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2 - 2},${y2}`;
      edges.push({ from: name, to: s.name, done: a.step.state === "PASSED", d });
    }
  }
  const width = BOX.pad * 2 + columns.length * BOX.w + Math.max(0, columns.length - 1) * BOX.gapX;
  return { boxes: [...boxes.values()], edges, width, height };
}

function clip(text, chars) {
  return text.length > chars ? `${text.slice(0, chars - 1)}…` : text;
}

// The lines inside a box: name; state and kind; once running, node and attempt; what was chosen.
function boxLines(s) {
  const lines = [clip(s.name, 24)];
  const uses = s.uses && s.uses !== "shell" ? ` · ${s.uses}` : "";
  lines.push(s.kind === "ask" ? `${s.state} · ask` : `${s.state} · ${s.role}${uses}`);
  if (s.node_id && s.attempt > 0) lines.push(`on ${s.node_id} · attempt ${s.attempt}`);
  else if (s.node_id) lines.push(`for ${s.node_id} · not claimed`);
  else if (s.kind === "ask") lines.push(clip(s.ask || "", 28));
  else lines.push("no node yet");
  const matched = s.chosen && s.chosen.matched ? pairs(s.chosen.matched).join(", ") : "";
  if (matched) lines.push(clip(`chosen ${matched}`, 30));
  return lines;
}

function tooltip(s) {
  const parts = [`${s.name} (seq ${s.seq}, ${s.kind}) — ${s.state}`];
  if (s.kind === "ask") parts.push(`ask: ${s.ask}`);
  if (s.after && s.after.length) parts.push(`after: ${s.after.join(", ")}`);
  if (s.node_id) parts.push(`node ${s.node_id}, attempt ${s.attempt}`);
  if (s.chosen) parts.push(`chosen: ${JSON.stringify(s.chosen)}`);
  return parts.join("\n");
}

export function drawGraph(steps) {
  const g = layout(steps);
  const arrow = svg("marker", {
    id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto",
  },
    svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow-head" }));
  const edges = g.edges.map((e) =>
    svg("path", {
      class: `edge${e.done ? " done" : ""}`,
      d: e.d,
      "data-from": e.from,
      "data-to": e.to,
      "marker-end": "url(#arrow)",
    }));
  const boxes = g.boxes.map(({ step: s, x, y, depth }) =>
    svg("g", {
      class: `step kind-${s.kind} state-${s.state}`,
      transform: `translate(${x},${y})`,
      "data-step": s.name,
      "data-seq": s.seq,
      "data-state": s.state,
      "data-depth": depth,
      "data-node": s.node_id || null,
      "data-attempt": s.attempt,
    },
    svg("title", { text: tooltip(s) }),
    svg("rect", { width: BOX.w, height: BOX.h, rx: 7 }),
    boxLines(s).map((line, i) =>
      svg("text", { x: 10, y: 18 + i * 17, class: i === 0 ? "name" : "line", text: line }))));
  return el("div", { class: "graph-scroll" },
    svg("svg", {
      class: "graph",
      width: g.width,
      height: g.height,
      viewBox: `0 0 ${g.width} ${g.height}`,
      role: "img",
      "aria-label": `work graph of ${steps.length} steps`,
    },
      svg("defs", {}, arrow), svg("g", { class: "edges" }, edges), svg("g", { class: "boxes" }, boxes)));
}
