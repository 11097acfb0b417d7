"""Charts of a simulation (design.md §20): waits (histogram and ECDF, with the Erlang C curve where
M/M/c applies), queue length over time, a per-node Gantt chart of leases.

The timeline and the Gantt chart show the window (issue 14 §6): intervals in which a queued run
was stuck (a free live node matched it but it was not promoted) are shaded red, nodes' dark
periods (vanished until they return) grey and drains yellow, restarts are ticks. Above
`STRIP_ABOVE` leases the Gantt chart becomes a per-node utilisation strip (busy share per time
bin), since thousands of bars are a solid block. Counts tick at integers; long time axes are in
hours or days.

Work with any result that has the shared tables (``SimResult`` or the model's ``ModelResult``).
Matplotlib's non-interactive backend is used when no display is set, so charts render in CI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
    matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd  # type: ignore[import-untyped, unused-ignore]
from matplotlib.ticker import MaxNLocator

from sim.analysis import mmc_p_wait_gt


def pyplot() -> Any:
    """`matplotlib.pyplot`, with the headless backend this module selected when no display is
    set: what a caller drawing its own figure (a capacity plan's chart) asks for."""
    return plt


def _measured_waits(result: Any) -> np.ndarray:
    runs = result.runs[~result.runs["warmup"]]
    waits: np.ndarray = runs["wait_s"].dropna().to_numpy(dtype=float)
    return waits


def waits(result: Any, ax: Any = None) -> Any:
    """Histogram of queue waits and their ECDF, with theory when it applies."""
    if ax is None:
        _, ax = plt.subplots(1, 2, figsize=(11, 4))
    hist_ax, ecdf_ax = ax if isinstance(ax, np.ndarray | list | tuple) else (ax, None)
    w = _measured_waits(result)
    unit, name = time_unit(float(w.max()) if w.size else 0.0)
    params = result.mmc_params() if hasattr(result, "mmc_params") else None
    if w.size:
        hist_ax.hist(w / unit, bins=50, color="#4C72B0", alpha=0.85)
    hist_ax.set_xlabel(f"queue wait ({name})")
    hist_ax.set_ylabel("runs")
    hist_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    hist_ax.set_title(f"Queue waits ({w.size} runs, mean {w.mean() if w.size else 0:.2f} s)")
    if ecdf_ax is not None:
        if w.size:
            xs = np.sort(w)
            ecdf_ax.step(
                xs / unit, np.arange(1, xs.size + 1) / xs.size, where="post", label="simulated"
            )
        if params is not None:
            lam, mu, c = params
            t = np.linspace(0, max(float(w.max()) if w.size else 1.0, 1e-9), 200)
            theory = [1 - mmc_p_wait_gt(lam, mu, c, float(x)) for x in t]
            ecdf_ax.plot(t / unit, theory, "--", color="#C44E52", label=f"Erlang C (M/M/{c})")
        ecdf_ax.set_xlabel(f"queue wait ({name})")
        ecdf_ax.set_ylabel("P(wait ≤ t)")
        ecdf_ax.set_title("ECDF of queue waits")
        ecdf_ax.legend(loc="lower right")
    return ax


#: Above this many leases the Gantt chart draws a utilisation strip per node instead of bars.
STRIP_ABOVE = 300

STUCK_COLOR, DARK_COLOR, DRAIN_COLOR = "#C44E52", "#7f7f7f", "#DD8452"


def time_unit(span_s: float) -> tuple[float, str]:
    """Seconds per unit and its name for an axis spanning `span_s`: s, min, h or days."""
    if span_s > 3 * 86400:
        return 86400.0, "days"
    if span_s > 3 * 3600:
        return 3600.0, "h"
    if span_s > 3 * 60:
        return 60.0, "min"
    return 1.0, "s"


def fleet_windows(result: Any) -> pd.DataFrame:
    """Per node, the periods it was dark (vanished → returned) or draining (drain → undrain),
    and its restarts (start = end): node_id, kind (dark / draining / restart), start_s, end_s.

    Read from the model's event log (``fleet`` events) when it has one, else from the result's
    scenario's plan (the engine applies exactly those events)."""
    rows: list[tuple[str, str, float]] = []
    events = None
    try:
        ev = result.events
        events = ev[ev["kind"] == "fleet"] if len(ev) and "detail" in ev else None
    except (AttributeError, KeyError):
        events = None
    if events is not None and len(events):
        rows = [
            (n, d, float(t))
            for n, d, t in zip(events["node_id"], events["detail"], events["at_s"], strict=True)
            if "ignored" not in str(d)
        ]
    elif hasattr(result, "planned_fleet_events"):
        rows = result.planned_fleet_events()
    end = float(result.end_s)
    out: list[tuple[str, str, float, float]] = []
    opened: dict[tuple[str, str], float] = {}
    closes = {"return": ("vanish", "dark"), "undrain": ("drain", "draining")}
    for node, kind, t in sorted(rows, key=lambda r: r[2]):
        if kind in ("vanish", "drain"):
            opened.setdefault((node, kind), t)
        elif kind in closes:
            start_kind, name = closes[kind]
            if (node, start_kind) in opened:
                out.append((node, name, opened.pop((node, start_kind)), t))
        elif kind == "restart":
            out.append((node, "restart", t, t))
    for (node, kind), t in opened.items():
        out.append((node, "dark" if kind == "vanish" else "draining", t, end))
    return pd.DataFrame(out, columns=["node_id", "kind", "start_s", "end_s"])


def _shade_stuck(ax: Any, result: Any, unit: float) -> None:
    stuck = getattr(result, "stuck", None)
    if stuck is None or not len(stuck):
        return
    first = True
    for a, b in zip(stuck["start_s"], stuck["end_s"], strict=True):
        ax.axvspan(a / unit, b / unit, color=STUCK_COLOR, alpha=0.25, lw=0,
                   label="a queued run stuck" if first else None)  # fmt: skip
        first = False


def _shade_fleet(ax: Any, windows: pd.DataFrame, unit: float, rows: dict[str, int] | None) -> None:
    """Dark and draining periods: per node row (Gantt) or across the axis (timeline)."""
    seen: set[str] = set()
    for node, kind, a, b in windows.itertuples(index=False):
        label = None
        if kind not in seen:
            seen.add(kind)
            label = {"dark": "node dark", "draining": "node draining", "restart": "restart"}[kind]
        color = {"dark": DARK_COLOR, "draining": DRAIN_COLOR, "restart": "black"}[kind]
        if rows is None:
            if kind == "restart":
                ax.axvline(a / unit, color=color, lw=0.6, alpha=0.5, label=label)
            else:
                ax.axvspan(a / unit, b / unit, color=color, alpha=0.18, lw=0, label=label)
        elif node in rows:
            y = rows[node]
            if kind == "restart":
                ax.plot([a / unit] * 2, [y - 0.45, y + 0.45], color=color, lw=1.2, label=label)
            else:
                ax.broken_barh([(a / unit, (b - a) / unit)], (y - 0.45, 0.9), color=color,
                               alpha=0.35, hatch="//", lw=0, label=label)  # fmt: skip


def queue(result: Any, ax: Any = None) -> Any:
    """Queue length over time (a step function), with stuck intervals and fleet windows shaded."""
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3))
    q = result.queue
    unit, name = time_unit(float(result.end_s))
    if len(q):
        ax.step(q["at_s"] / unit, q["length"], where="post", color="#55A868", label="queued")
    _shade_stuck(ax, result, unit)
    _shade_fleet(ax, fleet_windows(result), unit, None)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.set_xlim(0, max(float(result.end_s), 1e-9) / unit)
    ax.set_xlabel(f"virtual time ({name})")
    ax.set_ylabel("queued runs")
    ax.set_title("Queue length")
    if ax.get_legend_handles_labels()[0][1:]:
        ax.legend(fontsize=8, loc="upper right")
    return ax


def gantt(result: Any, ax: Any = None, max_nodes: int = 40) -> Any:
    """Per-node lease bars (which run held which node when), or above `STRIP_ABOVE` leases a
    per-node utilisation strip; stuck intervals and the nodes' dark and draining periods shaded."""
    nodes = list(result.nodes["node_id"])[:max_nodes]
    if ax is None:
        _, ax = plt.subplots(figsize=(11, max(2.0, 0.35 * len(nodes) + 1)))
    leases = result.leases
    end = float(result.end_s)
    unit, name = time_unit(end)
    rows = {n: i for i, n in enumerate(nodes)}
    strip = len(leases) > STRIP_ABOVE
    if strip:
        bins = 200
        edges = np.linspace(0.0, max(end, 1e-9), bins + 1)
        share = np.zeros((len(nodes), bins))
        for node, g, r in zip(leases["node_id"], leases["granted_at"], leases["released_at"],
                              strict=True):  # fmt: skip
            if node not in rows:
                continue
            r = end if r != r else r
            lo, hi = np.clip(edges[:-1], g, r), np.clip(edges[1:], g, r)
            share[rows[node]] += hi - lo
        share /= np.diff(edges)
        im = ax.imshow(share, aspect="auto", cmap="Purples", vmin=0, vmax=1, interpolation="none",
                       extent=(0, end / unit, len(nodes) - 0.5, -0.5))  # fmt: skip
        ax.figure.colorbar(im, ax=ax, pad=0.01, label="busy share")
        title = f"Utilisation per node ({len(leases):,} leases, {bins} time bins)"
    else:
        for node, i in rows.items():
            mine = leases[leases["node_id"] == node]
            spans = [
                (g / unit, ((r if r == r else end) - g) / unit)
                for g, r in zip(mine["granted_at"], mine["released_at"], strict=True)
            ]
            ax.broken_barh(spans, (i - 0.4, 0.8), color="#8172B2")
        title = "Leases per node"
    _shade_fleet(ax, fleet_windows(result), unit, rows)
    _shade_stuck(ax, result, unit)
    ax.set_yticks(range(len(nodes)), nodes)
    ax.set_ylim(len(nodes) - 0.5, -0.5)
    ax.set_xlim(0, max(end, 1e-9) / unit)
    ax.set_xlabel(f"virtual time ({name})")
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=8, loc="upper right")
    return ax


def save_all(result: Any, out: Path) -> list[Path]:
    """Write the charts as PNG files into ``out``."""
    paths = []
    for name, draw, size in (
        ("waits", waits, (11, 4)),
        ("queue", queue, (11, 3)),
        ("gantt", gantt, (11, 6)),
    ):
        if name == "waits":
            fig, ax = plt.subplots(1, 2, figsize=size)
        else:
            fig, ax = plt.subplots(figsize=size)
        draw(result, ax)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
