"""Charts of a simulation (design.md §20): waits (histogram and ECDF, with the Erlang C curve where
M/M/c applies), queue length over time, a per-node Gantt chart of leases.

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

from sim.analysis import mmc_p_wait_gt
from sim.scenarios import Exponential, Poisson, Scenario


def mmc_params(scenario: Scenario | None) -> tuple[float, float, int] | None:
    """(λ, μ, c) when the scenario is M/M/c: Poisson arrivals, one template with one exec step of
    exponential duration, no failures, identical nodes; else None."""
    if scenario is None:
        return None
    wl = scenario.workload
    groups = scenario.fleet.groups
    if not isinstance(wl.arrivals, Poisson) or len(wl.templates) != 1 or len(groups) != 1:
        return None
    steps = wl.templates[0].steps
    if len(steps) != 1 or steps[0].kind != "exec" or not isinstance(steps[0].duration, Exponential):
        return None
    if steps[0].fail_p or steps[0].retry_p or scenario.fleet.events:
        return None
    return wl.arrivals.rate, 1.0 / steps[0].duration.mean, groups[0].count


def _measured_waits(result: Any) -> np.ndarray:
    runs = result.runs[~result.runs["warmup"]]
    return runs["wait_s"].dropna().to_numpy(dtype=float)


def waits(result: Any, ax: Any = None) -> Any:
    """Histogram of queue waits and their ECDF, with theory when it applies."""
    if ax is None:
        _, ax = plt.subplots(1, 2, figsize=(11, 4))
    hist_ax, ecdf_ax = ax if isinstance(ax, np.ndarray | list | tuple) else (ax, None)
    w = _measured_waits(result)
    params = mmc_params(getattr(result, "scenario", None))
    if w.size:
        hist_ax.hist(w, bins=50, color="#4C72B0", alpha=0.85)
    hist_ax.set_xlabel("queue wait (s)")
    hist_ax.set_ylabel("runs")
    hist_ax.set_title(f"Queue waits ({w.size} runs, mean {w.mean() if w.size else 0:.2f} s)")
    if ecdf_ax is not None:
        if w.size:
            xs = np.sort(w)
            ecdf_ax.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", label="simulated")
        if params is not None:
            lam, mu, c = params
            t = np.linspace(0, max(float(w.max()) if w.size else 1.0, 1e-9), 200)
            theory = [1 - mmc_p_wait_gt(lam, mu, c, float(x)) for x in t]
            ecdf_ax.plot(t, theory, "--", color="#C44E52", label=f"Erlang C (M/M/{c})")
        ecdf_ax.set_xlabel("queue wait (s)")
        ecdf_ax.set_ylabel("P(wait ≤ t)")
        ecdf_ax.set_title("ECDF of queue waits")
        ecdf_ax.legend(loc="lower right")
    return ax


def queue(result: Any, ax: Any = None) -> Any:
    """Queue length over time (a step function)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3))
    q = result.queue
    if len(q):
        ax.step(q["at_s"], q["length"], where="post", color="#55A868")
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("queued runs")
    ax.set_title("Queue length")
    return ax


def gantt(result: Any, ax: Any = None, max_nodes: int = 40) -> Any:
    """Per-node lease bars: which run held which node when."""
    nodes = list(result.nodes["node_id"])[:max_nodes]
    if ax is None:
        _, ax = plt.subplots(figsize=(11, max(2.0, 0.35 * len(nodes) + 1)))
    leases = result.leases
    end = result.end_s
    for i, node in enumerate(nodes):
        mine = leases[leases["node_id"] == node]
        spans = [
            (g, (r if r == r else end) - g)
            for g, r in zip(mine["granted_at"], mine["released_at"], strict=True)
        ]
        ax.broken_barh(spans, (i - 0.4, 0.8), color="#8172B2")
    ax.set_yticks(range(len(nodes)), nodes)
    ax.set_xlabel("virtual time (s)")
    ax.set_title("Leases per node")
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
