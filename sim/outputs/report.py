"""The main job (README's first command): a report that answers a question, in ``reports/``.

The question is the one capacity planning exists for (docs/design.md §20): *how many nodes keep the
95th-percentile queue wait within ten minutes on a real workload* — the NASA Ames iPSC/860 1993
log — and how many as the load grows. The front page (``index.html``) opens with that answer and
its confirmation (every one of the 18,239 jobs replayed on the real Mediator at the recommended
size and its neighbours, with the largest per-job wait difference from the model), then the
target, the recommended fleet and its headroom, says in one paragraph how it was reached, and
then gives the evidence in the order a reader asks for it:

- a compact table of every built-in scenario on the real Mediator, in plain names and units, with
  the intervals ``summary()`` reports (labelled with their method when the summary names one);
- one short panel of correctness evidence: invariant violations (I1–I7, by SQL; must be 0), the
  differential check against the reference model (same runs promoted at the same instants,
  design.md §20), and theory where it applies (Erlang C for ``steady``, the FIFO G/G/c recursion for
  the trace);
- chart thumbnails, each linking to that scenario's own page (``<case>/index.html``: what the
  scenario is, every figure, full-size charts, the CSV files), and the capacity plan's page
  (``capacity/index.html``: the chart and the table per fleet size);
- the notebooks, executed and rendered to HTML beside it.

Every number is formatted for people (``11,600 s`` as ``3.2 h``, shares as percentages) and the
page fits a 1,100-pixel column. ``summary.csv`` and ``theory.json`` keep the machine-readable
figures. Progress is shown while it works.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd  # type: ignore[import-untyped, unused-ignore]

from sim.analysis import erlang_c, mmc_wq
from sim.brokers.entry import run
from sim.inputs import scenarios as S
from sim.inputs.scenarios import Scenario
from sim.inputs.theory import mmc_params
from sim.inputs.traces import fifo_waits
from sim.inputs.workload import materialize
from sim.outputs.notebooks import parameter_names, render
from sim.parallel import spawn_pool
from sim.platform.measure import promotions_diff
from sim.studies.plan import plan as capacity_plan
from sim.studies.plan import start_confirmation

# name → (scenario at full scale, at CI scale); the full scale keeps the job within ~10 minutes.
CASES: dict[str, tuple[Callable[[], Scenario], Callable[[], Scenario]]] = {
    "steady": (lambda: S.steady(runs=4000, seed=1), lambda: S.steady(runs=300, seed=1)),
    "mixed": (lambda: S.mixed(runs=2000, seed=1), lambda: S.mixed(runs=200, seed=1)),
    "vanished_node_on": (lambda: S.vanished_node(True), lambda: S.vanished_node(True)),
    "vanished_node_off": (lambda: S.vanished_node(False), lambda: S.vanished_node(False)),
    "vanished_churn_on": (
        lambda: S.vanished_node(True, churn=True, runs=1200, seed=1),
        lambda: S.vanished_node(True, churn=True, runs=150, seed=1),
    ),
    "vanished_churn_off": (
        lambda: S.vanished_node(False, churn=True, runs=1200, seed=1),
        lambda: S.vanished_node(False, churn=True, runs=150, seed=1),
    ),
    "drain": (lambda: S.drain(runs=1500, seed=1), lambda: S.drain(runs=200, seed=1)),
    "restart": (lambda: S.restart(runs=1500, seed=1), lambda: S.restart(runs=200, seed=1)),
    "burst": (lambda: S.burst(runs=1500, seed=1), lambda: S.burst(runs=200, seed=1)),
    "asks": (lambda: S.asks(runs=800, seed=1), lambda: S.asks(runs=100, seed=1)),
    "trace": (lambda: S.trace(runs=3000), lambda: S.trace(runs=300)),
    "capabilities": (lambda: S.capabilities(), lambda: S.capabilities()),
}

# Plain names and what each case shows, for people (the table, the thumbnails, the pages).
TITLES: dict[str, tuple[str, str]] = {
    "steady": (
        "Steady load (M/M/3)",
        "Random arrivals on identical nodes, the textbook queue; checked against its formula "
        "(Erlang C).",
    ),
    "mixed": (
        "Mixed fleet",
        "Several kinds of node, runs that need more than one node; a scarce board never holds "
        "back other runs (rule R6, docs/design.md §7).",
    ),
    "vanished_node_on": (
        "A node drops out and returns",
        "A queued run waits for node X, which drops off the network and comes back; its return "
        "starts the waiting run at once (wake point 7, docs/design.md §8).",
    ),
    "vanished_node_off": (
        "A node drops out and returns (old design)",
        "The same window as the original design handled it: the returning node does not start "
        "the waiting run, which waits for an unrelated event.",
    ),
    "vanished_churn_on": (
        "Nodes drop out at random",
        "Nodes drop out and return at random over a long horizon; how long runs sit stuck when "
        "a returning node starts them at once.",
    ),
    "vanished_churn_off": (
        "Nodes drop out at random (old design)",
        "The same churn when a returning node does not start waiting runs: the stuck time that "
        "costs.",
    ),
    "drain": (
        "Drains",
        "Nodes taken out of service gracefully or at a step boundary, and put back (wake point 6, "
        "docs/design.md §8).",
    ),
    "restart": (
        "Daemon restarts",
        "Nodes restart mid-run: runs lost, leases fenced, waiting runs started on what is freed "
        "(wake point 4, docs/design.md §8).",
    ),
    "burst": ("Burst", "200 extra arrivals in ten minutes: the queue builds and drains."),
    "asks": (
        "Person-gated steps",
        "Steps that wait for a person's answer hold their node meanwhile.",
    ),
    "trace": (
        "NASA jobs, first weeks",
        "The first jobs of the NASA Ames 1993 log on 4 nodes; every wait must equal the "
        "first-come-first-served formula (the FIFO G/G/c recursion).",
    ),
    "capabilities": (
        "A node gains a capability",
        "An idle node that starts to offer a needed capability starts the waiting run (wake "
        "point 9, docs/design.md §8).",
    ),
}

TRACE_NAME = "NASA Ames iPSC/860 log (1993)"

# The capacity question: the target, the grid, the growth factors. The confirmation replays
# every job of the workload on the real Mediator (all 18,239 at full scale: about 80 s per fleet
# size on one CPU; the three sizes run side by side on both cores).
CAPACITY: dict[str, dict[str, Any]] = {
    "full": {
        "runs": None,
        "sizes": range(2, 13),
        "growth": (1.0, 1.25, 1.5, 2.0),
        "growth_span": 11,
    },
    "ci": {
        "runs": 3_000,
        "sizes": range(3, 11),
        "growth": (1.0, 1.5),
        "growth_span": 7,
    },
}
TARGET = {"quantile": 0.95, "wait_s": 600.0}


# ---------------------------------------------------------------------------------------------
# Formatting for people
# ---------------------------------------------------------------------------------------------


def _unit(seconds: float) -> tuple[float, str]:
    a = abs(seconds)
    if a < 120:
        return 1.0, "s"
    if a < 7_200:
        return 60.0, "min"
    if a < 172_800:
        return 3_600.0, "h"
    return 86_400.0, "days"


def _num(x: float, scale: float) -> str:
    v = x / scale
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:,.1f}".rstrip("0").rstrip(".")
    return f"{v:,.2f}".rstrip("0").rstrip(".")


def duration(seconds: float | None, low: float | None = None, high: float | None = None) -> str:
    """``12.3 s``, ``4.5 min``, ``3.2 h``, ``2.1 days``; with an interval, in the estimate's unit
    (the upper bound in its own when it needs a larger one)."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        scale, unit = _unit(seconds)
        return f"{_num(seconds, scale)} {unit}"
    scale, unit = _unit(seconds)
    top_scale, top_unit = _unit(high)
    # A wait or a duration is never negative: show the interval within what is possible.
    bottom = _num(max(0.0, low), scale)
    if top_unit == unit:
        return f"{_num(seconds, scale)} {unit} [{bottom}–{_num(high, scale)}]"
    return f"{_num(seconds, scale)} {unit} [{bottom} {unit}–{_num(high, top_scale)} {top_unit}]"


def share(x: float | None) -> str:
    """0.667 → ``67 %``."""
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x * 100:.0f} %" if x >= 0.01 or x == 0 else f"{x * 100:.1f} %"


def count(n: float | None) -> str:
    return "–" if n is None or not math.isfinite(float(n)) else f"{round(float(n)):,}"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


# ---------------------------------------------------------------------------------------------
# Intervals, read generically from a summary
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ci:
    """An interval as a summary reports it (an ``Interval`` object or its JSON form)."""

    estimate: float
    low: float
    high: float
    conf: float | None
    method: str | None


def interval(summary: Mapping[str, Any], stat: str) -> Ci | None:
    """The interval ``summary`` reports for ``stat`` (e.g. ``wait_p95``), or None.

    Looks for ``<stat>_ci`` or ``<stat>_interval``, accepts an object with ``low``/``high`` or a
    dict with those keys, and takes the method from the interval itself (``method``) or from the
    summary (``interval_method`` / ``ci_method``) when either names one.
    """
    for key in (f"{stat}_ci", f"{stat}_interval", f"{stat}_s_ci"):
        raw = summary.get(key)
        if raw is None:
            continue
        get = raw.get if isinstance(raw, Mapping) else lambda k, r=raw: getattr(r, k, None)
        low, high = get("low"), get("high")
        if low is None or high is None:
            continue
        estimate = get("estimate")
        method = get("method") or summary.get("interval_method") or summary.get("ci_method")
        conf = get("conf")
        return Ci(
            float(estimate) if estimate is not None else math.nan,
            float(low),
            float(high),
            float(conf) if conf is not None else None,
            str(method) if method else None,
        )
    return None


def _methods(summaries: Iterable[Mapping[str, Any]], stats: Sequence[str]) -> list[str]:
    found: list[str] = []
    for s in summaries:
        for stat in stats:
            ci = interval(s, stat)
            if ci is not None and ci.method and ci.method not in found:
                found.append(ci.method)
    return found


# ---------------------------------------------------------------------------------------------
# Running the cases
# ---------------------------------------------------------------------------------------------


def _row(name: str, sc: Scenario, result: Any, model: Any, wall: float) -> dict[str, Any]:
    s = result.summary(digits=None)
    diff = promotions_diff(model.promotions, result.promotions, tol_s=1e-6)
    row = {
        "scenario": name,
        "runs": s["runs"],
        "wait_mean_s": s.get("wait_mean_s", np.nan),
        "wait_p95_s": s.get("wait_p95_s", np.nan),
        "p_wait": s.get("p_wait", np.nan),
        "utilization": s.get("utilization", np.nan),
        "stuck_s": s["stuck_s"],
        "violations": len(result.violations),
        "model_agrees": diff is None,
        "runs_per_wall_s": s["runs"] / wall if wall else np.nan,
        "virtual_s_per_wall_s": s.get("virtual_s_per_wall_s", np.nan),
    }
    if diff is not None:
        row["first_divergence"] = diff
    return row


def _theory(name: str, sc: Scenario, result: Any, plan: Any) -> dict[str, Any] | None:
    if name == "steady":
        params = mmc_params(sc)
        if params is None:
            return None
        lam, mu, c = params
        s = result.summary(digits=None)
        return {
            "what": f"Erlang C, M/M/{c} (λ={lam}, μ={mu})",
            "Wq theory": mmc_wq(lam, mu, c),
            "Wq simulated": s.get("wait_mean_s"),
            "P(wait) theory": erlang_c(c, lam / mu),
            "P(wait) simulated": s.get("p_wait"),
        }
    if name == "trace":
        arrivals = np.array([a.at_s for a in plan.arrivals])
        durations = np.array([a.step_outcomes[0][0].duration_s for a in plan.arrivals])
        c = len(plan.nodes)
        expected = fifo_waits(arrivals, durations, c)
        got = result.runs["wait_s"].to_numpy(dtype=float)
        return {
            "what": f"FIFO G/G/{c} recursion on the NASA Ames trace",
            "max |wait - recursion| (s)": float(np.max(np.abs(got - expected))),
            "mean wait (s)": float(got.mean()),
        }
    return None


@dataclass
class Capacity:
    """The answer: the plan for today's load and the fleet needed as it grows."""

    plan: Any  # sim.studies.plan.CapacityPlan
    growth: pd.DataFrame  # growth, offered, nodes, p95_s, utilization
    jobs: int
    days: float
    offered: float  # Erlangs: nodes the work keeps busy on average
    peak_day: float = math.nan  # Erlangs on the busiest day


@dataclass
class CapacityRun:
    """The capacity question under way (``start_capacity``): the grid and the growth are done,
    the confirmation on the real Mediator is running on the pool; ``result()`` waits for it."""

    grid: Any  # sim.studies.plan.CapacityPlan, not yet confirmed
    pending: Any  # sim.studies.plan.PendingConfirmation, or None
    growth: pd.DataFrame
    jobs: int
    days: float
    offered: float
    peak_day: float

    def result(self, progress: bool = True) -> Capacity:
        plan = self.grid if self.pending is None else self.pending.result(progress)
        return Capacity(plan, self.growth, self.jobs, self.days, self.offered, self.peak_day)


def start_capacity(scale: str, database_url: str, pool: Any, progress: bool = True) -> CapacityRun:
    """Plan the NASA workload at ``scale`` (``CAPACITY``) on ``pool``: the grid on the model and
    the recommended fleet as the same jobs arrive 1.25×, 1.5×, 2× as fast (submit times
    compressed; run times and bursts as in 1993) — seconds on the model — then submit the
    confirmation: every job replayed on the real Mediator at the recommended size and its
    neighbours, side by side, the model beside them. Returns without waiting for it, so the
    report's scenarios share the pool meanwhile."""
    p = CAPACITY[scale]
    workload = S.trace(runs=p["runs"])
    jobs = materialize(workload)
    submit = np.array([a.at_s for a in jobs.arrivals])
    run_s = np.array([a.step_outcomes[0][0].duration_s for a in jobs.arrivals])
    span = float(submit[-1] - submit[0]) or 1.0
    offered = float(run_s.sum() / span)
    day = ((submit - submit[0]) // 86_400).astype(int)
    peak_day = float((np.bincount(day, weights=run_s) / 86_400).max())
    today = capacity_plan(
        workload, TARGET, p["sizes"], replications=1, executor=pool, confirm_replications=0,
        progress=progress,
    )  # fmt: skip
    rows = []
    for g in p["growth"]:
        wl = S.trace(runs=p["runs"], time_scale=1 / g)
        start = int(np.floor(offered * g)) + 1  # the smallest fleet that can carry it at all
        grown = capacity_plan(
            wl, TARGET, range(start, start + p["growth_span"]), replications=1, executor=pool,
            confirm_replications=0, progress=False,
        )  # fmt: skip
        r = grown.row(grown.recommended) if grown.recommended is not None else None
        rows.append(
            {
                "growth": g,
                "offered": offered * g,
                "nodes": grown.recommended,
                "p95_s": float(r[grown.column]) if r is not None else math.nan,
                "utilization": float(r["utilization"]) if r is not None else math.nan,
            }
        )
    # Then every job on the real Mediator (the front page says so and gives the largest per-job
    # difference from the model: confirmation_text). Submitted last, after the quick model
    # grids, and before anything else the pool gets: it is the longest work.
    pending = start_confirmation(today, workload, pool, database_url, runs=None, progress=progress)
    return CapacityRun(
        today, pending, pd.DataFrame(rows), len(run_s), span / 86_400, offered, peak_day
    )


def capacity(scale: str, database_url: str | None) -> Capacity:
    """The capacity question at ``scale`` answered in full (``start_capacity``, then its
    confirmation awaited) on a pool of its own."""
    from sim.brokers.mediator import server_url

    pool = spawn_pool(2)
    try:
        return start_capacity(scale, server_url(database_url), pool).result()
    finally:
        pool.shutdown()


#: Rough cost of a case relative to its runs (heartbeats every 10 s make churn the costliest):
#: the pool takes the long ones first.
CASE_WEIGHT = {"vanished_churn_on": 6.0, "vanished_churn_off": 6.0, "mixed": 1.5}


def _case(name: str, sc: Scenario, out: str, database_url: str) -> tuple[dict[str, Any], Any]:
    """One scenario of the report, in a pool worker: on the real Mediator and on the model, its
    tables and charts saved under ``out/<name>``; returns its summary row and its theory."""
    plan = materialize(sc)
    t = time.time()
    result = run(plan, "mediator", database_url=database_url, progress=False)
    wall = time.time() - t
    model = run(plan, "model")
    result.save(Path(out) / name)
    return _row(name, sc, result, model, wall), _theory(name, sc, result, plan)


def main_job(out: Path, scale: str = "full", database_url: str | None = None) -> int:
    """Run every case and the capacity plan, write ``out/`` (front page, one page per case, the
    capacity page, CSV/JSON), print the summary table. Returns 1 if an invariant was violated,
    the model disagreed with the Mediator, or the confirmation found a difference, else 0.

    Both cores work throughout (docs/notebooks.md): one pool of two processes takes the
    capacity grid, then the confirmation's real-Mediator simulations (the longest work, so it
    starts first), then the scenarios, longest first; the notebooks run meanwhile in their own
    kernels."""
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

    from sim.brokers.mediator import server_url  # the database stack

    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    url = server_url(database_url)  # one server for every simulation, started once here
    scenarios = {name: (full if scale == "full" else ci)() for name, (full, ci) in CASES.items()}
    pool = spawn_pool(2)
    books = ThreadPoolExecutor(1)
    try:
        print("capacity plan: the NASA workload", flush=True)
        cap_run = start_capacity(scale, url, pool)
        cost = {n: (sc.horizon_runs or 10) * CASE_WEIGHT.get(n, 1.0) for n, sc in scenarios.items()}
        cases = {
            name: pool.submit(_case, name, scenarios[name], str(out), url)
            for name in sorted(scenarios, key=lambda n: -cost[n])
        }
        saved: Future[Path] = Future()  # the plan, for the notebooks that show it
        rendered = books.submit(_render_notebooks, out, scale, url, saved)
        try:
            cap = cap_run.result()
            saved.set_result(save_capacity(out, cap))
        finally:
            saved.cancel()  # no plan: a notebook waiting for it stops waiting (no-op once set)
        bar = tqdm(total=len(cases), desc="scenarios", unit="scenario")
        for _ in as_completed(cases.values()):
            bar.update(1)
        bar.close()
        done = {name: f.result() for name, f in cases.items()}
        notebooks = rendered.result()
    finally:
        books.shutdown(wait=True)
        pool.shutdown(cancel_futures=True)
    rows = [done[name][0] for name in scenarios]
    theory = {name: done[name][1] for name in scenarios if done[name][1] is not None}
    table = pd.DataFrame(rows)
    table.to_csv(out / "summary.csv", index=False)
    (out / "theory.json").write_text(json.dumps(theory, indent=2, default=float) + "\n")
    write_site(out, table, theory, scenarios, cap, notebooks, time.time() - started)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(
            table.drop(columns=[c for c in ("first_divergence",) if c in table]).to_string(
                index=False, float_format=lambda v: f"{v:,.3g}"
            )
        )
    for name, th in theory.items():
        print(
            f"{name}: "
            + ", ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in th.items()
            )
        )
    print(headline(cap))
    print(confirmation_text(cap))
    print(f"\nreport written to {out}/index.html in {time.time() - started:.0f} s")
    bad = table["violations"].sum() or (~table["model_agrees"]).sum()
    check = cap.plan.confirmation_check()
    if check is not None and (check.max_abs_diff_s != 0 or check.violations):
        bad = True
    return 1 if bad else 0


def save_capacity(out: Path, cap: Capacity) -> Path:
    """Save the capacity plan and its growth table under ``out/capacity`` (the folder a
    notebook's ``capacity_dir`` names): ``plan/`` as ``CapacityPlan.save`` writes it, and
    ``growth.csv``. Returns the folder."""
    d = out / "capacity"
    cap.plan.save(d / "plan")
    cap.growth.to_csv(d / "growth.csv", index=False)
    return d


def _render_notebooks(
    out: Path, scale: str, database_url: str | None = None, saved: Future[Path] | None = None
) -> list[str]:
    """Execute every notebook in notebooks/ and render it to HTML in out/ (docs/notebooks.md).

    A notebook with a ``capacity_dir`` parameter shows the report's own capacity plan rather
    than planning the same workload again: it is rendered last, once ``saved`` gives the
    folder (``save_capacity``), while the others render beside the confirmation. Its kernel
    then costs seconds, not the half-minute of a second plan."""
    root = Path(__file__).resolve().parents[2] / "notebooks"
    books = sorted(root.glob("*.ipynb")) if root.is_dir() else []
    later = [b for b in books if saved is not None and "capacity_dir" in parameter_names(b)]
    rendered = []
    for book in [b for b in books if b not in later] + later:
        extra = {"capacity_dir": str(saved.result().resolve())} if saved and book in later else {}
        # No bar: the notebooks run beside the scenarios and the confirmation (main_job).
        page = render(book, out, scale, database_url, progress=False, parameters=extra)
        rendered.append(page.name)
        print(f"notebook rendered: {rendered[-1]}", flush=True)
    return sorted(rendered)


# ---------------------------------------------------------------------------------------------
# The pages
# ---------------------------------------------------------------------------------------------

CSS = """
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d232b;margin:0 auto;
 padding:1.5rem 1.25rem 3rem;max-width:1100px}
h1{font-size:1.6rem;margin:.2rem 0 .6rem}h2{font-size:1.15rem;margin:2rem 0 .6rem}
a{color:#1f5fa8}p{margin:.5rem 0}.muted{color:#5b6470;font-size:.9rem}
.answer{border:2px solid #2e7d4f;border-radius:10px;padding:1rem 1.25rem;background:#f3faf5}
.answer .big{font-size:1.35rem;font-weight:600;margin:0 0 .6rem}
.facts{display:grid;grid-template-columns:repeat(3,1fr);gap:.75rem;margin:.4rem 0 .2rem}
.facts div{background:#fff;border:1px solid #cfe3d6;border-radius:8px;padding:.55rem .75rem}
.facts b{display:block;font-size:.8rem;color:#3e6b4f;text-transform:uppercase;letter-spacing:.03em}
table{border-collapse:collapse;width:100%;font-size:.9rem;margin:.4rem 0}
th,td{padding:.35rem .5rem;border-bottom:1px solid #e1e4e8;text-align:left;vertical-align:top}
th{background:#f5f6f8;font-weight:600}td.n,th.n{text-align:right;white-space:nowrap}
.evidence{display:grid;grid-template-columns:repeat(3,1fr);gap:.75rem}
.evidence div{border:1px solid #d6dae0;border-radius:8px;padding:.6rem .75rem}
.ok{color:#2e7d4f;font-weight:600}.bad{color:#b3261e;font-weight:600}
.thumbs{display:grid;grid-template-columns:repeat(4,1fr);gap:.75rem}
.thumbs a{display:block;border:1px solid #d6dae0;border-radius:8px;padding:.4rem;
 text-decoration:none;
 color:inherit;font-size:.85rem}
.thumbs img{width:100%;height:auto;display:block;margin-bottom:.3rem}
img.full{max-width:100%;height:auto;display:block;margin:.5rem 0 1rem}
@media (max-width:700px){.facts,.evidence{grid-template-columns:1fr}
 .thumbs{grid-template-columns:repeat(2,1fr)}}
"""


def _page(title: str, body: Sequence[str], root: str = "") -> str:
    return "\n".join(
        [
            "<!doctype html>",
            "<html lang='en'><head><meta charset='utf-8'>",
            "<meta name='viewport' content='width=device-width, initial-scale=1'>",
            f"<title>{_e(title)}</title>",
            f"<link rel='stylesheet' href='{root}report.css'>",
            "</head><body>",
            *body,
            "</body></html>",
            "",
        ]
    )


def headline(cap: Capacity) -> str:
    """The answer in one sentence (also printed on the terminal)."""
    p = cap.plan
    q, wait = _pct(p.quantile), duration(p.wait_s)
    if p.recommended is None:
        return (
            f"No fleet of {p.sizes[0]}–{p.sizes[-1]} nodes keeps the {q} queue wait within "
            f"{wait} on the {TRACE_NAME}."
        )
    return f"{p.recommended} nodes keep the {q} queue wait within {wait} on the {TRACE_NAME}."


def _pct(q: float) -> str:
    return f"{q * 100:g}th-percentile"


def _plan_row(p: Any, size: int, engine: str | None = None, stage: str = "grid") -> Any:
    try:
        return p.row(size, engine=engine, stage=stage)
    except (KeyError, IndexError):
        return None


def _answer(cap: Capacity) -> list[str]:
    p = cap.plan
    col = p.column
    base = col[:-2]
    parts = [
        "<section class='answer' id='answer'>",
        f"<p class='big' id='headline'>{_e(headline(cap))}</p>",
    ]
    facts: list[tuple[str, str]] = [
        ("Target", f"{_pct(p.quantile)} wait ≤ {duration(p.wait_s)}"),
    ]
    if p.recommended is not None:
        r = _plan_row(p, p.recommended)
        est = float(r[col]) if r is not None else math.nan
        lo = float(r.get(base + "_low", math.nan)) if r is not None else math.nan
        hi = float(r.get(base + "_high", math.nan)) if r is not None else math.nan
        util = float(r["utilization"]) if r is not None else math.nan
        facts.append(
            (
                "Recommended fleet",
                f"{p.recommended} nodes: {_pct(p.quantile)} wait "
                f"{duration(est, lo, hi)}, {share(util)} busy",
            )
        )
        facts.append(("Headroom", _headroom(cap)))
    else:
        facts.append(("Recommended fleet", "none in the sizes tried"))
        facts.append(("Headroom", "–"))
    parts.append(f"<p id='confirmed'>{_e(confirmation_text(cap))}</p>")
    parts.append("<div class='facts'>")
    parts += [f"<div><b>{_e(k)}</b> {_e(v)}</div>" for k, v in facts]
    parts.append("</div></section>")
    return parts


def _and(items: Sequence[object]) -> str:
    """ "4", "4 and 5", "4, 5 and 6"."""
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def confirmation_text(cap: Capacity) -> str:
    """The confirmation in one sentence, from the plan's real-Mediator and model simulations
    compared job by job (``CapacityPlan.confirmation_check``): which sizes, how many of the jobs,
    and the largest per-job wait difference (the front page's second line, and the terminal's)."""
    check = cap.plan.confirmation_check()
    if check is None:
        return "Not confirmed on the real Mediator (no size met the target)."
    covered = (
        f"all {check.jobs:,} jobs"
        if check.jobs >= cap.jobs
        else f"the first {check.jobs:,} of the {cap.jobs:,} jobs"
    )
    d = check.max_abs_diff_s
    largest = "the largest difference between any job's wait there and on the reference model is"
    if not math.isfinite(d):
        diff = "the two did not start the same jobs"
    elif d == 0:
        diff = f"{largest} 0 s"
    else:
        diff = f"{largest} {duration(d)} (job {check.worst_job + 1:,} at {check.worst_size} nodes)"
    bad = f"; {check.violations} invariant violations" if check.violations else ""
    return (
        f"Confirmed on the real Mediator and PostgreSQL: {covered} replayed at "
        f"{_and(check.sizes)} nodes; {diff}{bad}."
    )


def _headroom(cap: Capacity) -> str:
    """How far the recommended fleet is from its limits: the wait margin, the smaller fleet, and
    the largest load growth it still carries."""
    p = cap.plan
    rec = p.recommended
    r = _plan_row(p, rec)
    text = []
    if r is not None:
        hi = float(r.get(p.column[:-2] + "_high", r[p.column]))
        if math.isfinite(hi) and p.wait_s > 0:
            text.append(
                f"the {_pct(p.quantile)} wait is {share(1 - hi / p.wait_s)} under the target "
                "even at its interval's top"
            )
    smaller = _plan_row(p, rec - 1) if rec - 1 in p.sizes else None
    if smaller is not None:
        text.append(f"{rec - 1} nodes would give {duration(float(smaller[p.column]))}")
    g = cap.growth
    carried = g[(g["nodes"].notna()) & (g["nodes"] <= rec)]["growth"]
    if len(carried) and float(carried.max()) > 1:
        text.append(f"it carries up to ×{float(carried.max()):g} today's load")
    else:
        more = g[(g["growth"] > 1) & g["nodes"].notna()]
        if len(more):
            first = more.iloc[0]
            text.append(f"×{first['growth']:g} today's load needs {int(first['nodes'])} nodes")
    if not text:
        return "–"
    joined = "; ".join(text) + "."
    return joined[0].upper() + joined[1:]


def _method(cap: Capacity) -> str:
    p = cap.plan
    grid = f"{p.sizes[0]}–{p.sizes[-1]}"
    check = p.confirmation_check()
    confirmed = ""
    if check is not None:
        jobs = f"all {check.jobs:,}" if check.jobs >= cap.jobs else f"the first {check.jobs:,}"
        confirmed = (
            f" The recommended size and its neighbours ({_and(check.sizes)} nodes) were then "
            f"replayed on the real Mediator and PostgreSQL for {jobs} jobs, side by side, and "
            f"compared job by job with the model: {duration(check.max_abs_diff_s)} apart at most."
        )
    intervals = (
        " Intervals are 95 % confidence intervals; the 1993 jobs are replayed exactly as they "
        "happened, so there is nothing random to repeat, and the interval comes from comparing "
        f"consecutive stretches of the {cap.days:.0f} days with each other."
        if cap.days > 30
        else " Intervals are 95 % confidence intervals, from comparing consecutive stretches of "
        "the replayed jobs with each other."
    )
    return (
        f"<p id='method'><b>Method.</b> The {TRACE_NAME} — {cap.jobs:,} jobs over "
        f"{cap.days:.0f} days, keeping {cap.offered:.2f} nodes busy on average — is replayed "
        f"job for job: each job becomes a one-node run, submitted at its original time and "
        f"lasting its original run time. Every fleet size from {grid} nodes is simulated on the "
        f"reference model of the Mediator's scheduling policy, and the smallest size whose "
        f"{_pct(p.quantile)} wait stays within {duration(p.wait_s)}, upper confidence bound "
        f"included, is recommended.{confirmed} For tomorrow's load the same jobs arrive faster "
        f"(submit times compressed by the growth factor) and the plan is repeated.{intervals}</p>"
    )


def _growth_table(cap: Capacity) -> list[str]:
    q = _pct(cap.plan.quantile)
    out = [
        "<table id='growth'><thead><tr><th>Load</th><th class='n'>Busy nodes on average</th>"
        f"<th class='n'>Nodes needed</th><th class='n'>{_e(q.capitalize())} wait there</th>"
        "<th class='n'>Utilization</th></tr></thead><tbody>"
    ]
    for _, r in cap.growth.iterrows():
        nodes = "more than tried" if pd.isna(r["nodes"]) else f"{int(r['nodes'])}"
        label = "today (1993)" if r["growth"] == 1 else f"×{r['growth']:g}"
        out.append(
            f"<tr><td>{_e(label)}</td><td class='n'>{r['offered']:.2f}</td>"
            f"<td class='n'><b>{_e(nodes)}</b></td><td class='n'>{duration(r['p95_s'])}</td>"
            f"<td class='n'>{share(r['utilization'])}</td></tr>"
        )
    out.append("</tbody></table>")
    out.append(f"<p class='muted' id='growth-why'>{_e(growth_note(cap))}</p>")
    return out


def growth_note(cap: Capacity) -> str:
    """Why the waits in the growth table do not fall or rise steadily: each row is the smallest
    fleet that meets the target, and the bursts, not the average, decide how big it must be."""
    peak = f" (the busiest day keeps {cap.peak_day:.1f} nodes busy)" if cap.peak_day > 0 else ""
    return (
        f"Each row is the smallest fleet whose {_pct(cap.plan.quantile)} wait stays within "
        f"{duration(cap.plan.wait_s)}, so its wait lands anywhere below the target and need not "
        f"grow with the load. Bursts size the fleet, not the average: jobs arrive in bunches"
        f"{peak}, and one node more or less decides whether a bunch clears within the target — "
        f"which is why the busy-node average is far below the nodes needed."
    )


def _nasa_note(cap: Capacity, sc: Scenario | None, summary: Mapping[str, Any]) -> list[str]:
    """Why the NASA row of the scenario table differs from the capacity plan's figures for the
    same fleet size: it replays only the first jobs (a correctness check), the plan all of them."""
    if sc is None:
        return []
    nodes = sum(g.count for g in sc.fleet.groups)
    first = f"only the first {sc.horizon_runs:,} jobs" if sc.horizon_runs else "the jobs"
    span = summary.get("end_s")
    over = f" (about {duration(float(span))} of the log)" if span else ""
    return [
        f"<p class='muted' id='nasa-note'>Two figures for the NASA jobs on {nodes} nodes: the "
        f"row above replays {_e(first)}{_e(over)} to check the Mediator against the "
        f"first-come-first-served formula, while the capacity plan covers all {cap.jobs:,} jobs "
        f"over {cap.days:.0f} days, bursts included — so their waits differ.</p>"
    ]


SCENARIO_HEADERS = (
    "Scenario",
    "Fleet and load",
    "Runs",
    "Mean wait",
    "95th-percentile wait",
    "Runs that waited",
    "Utilization",
    "Stuck time",
)


def _describe(sc: Scenario) -> str:
    groups = sc.fleet.groups
    n = sum(g.count for g in groups)
    fleet = f"{n} identical nodes" if len(groups) == 1 else f"{n} nodes of {len(groups)} kinds"
    arrivals = sc.workload.arrivals
    tag = getattr(arrivals, "tag", "")
    if tag in ("poisson", "burst"):
        rate = float(arrivals.rate)  # type: ignore[union-attr]
        load = f"a run every {duration(1 / rate)} on average" if rate > 0 else "no arrivals"
        if tag == "burst":
            load += f", plus a burst of {arrivals.count}"  # type: ignore[union-attr]
    elif tag == "trace":
        first = f"the first {sc.horizon_runs:,} " if sc.horizon_runs else "the "
        load = first + "NASA Ames 1993 jobs"
    elif tag == "scripted":
        load = "a scripted sequence"
    else:
        load = f"{tag} arrivals"
    return f"{fleet}; {load}"


def _scenario_table(
    table: pd.DataFrame,
    summaries: Mapping[str, Mapping[str, Any]],
    scenarios: Mapping[str, Scenario],
) -> list[str]:
    out = ["<table id='scenarios'><thead><tr>"]
    out += [
        f"<th{' class=n' if i >= 2 else ''}>{_e(h)}</th>" for i, h in enumerate(SCENARIO_HEADERS)
    ]
    out.append("</tr></thead><tbody>")
    for _, row in table.iterrows():
        name = row["scenario"]
        s = summaries.get(name, {})
        title = TITLES.get(name, (name.replace("_", " ").capitalize(), ""))[0]
        mean_ci, p95_ci = interval(s, "wait_mean"), interval(s, "wait_p95")
        cells = [
            f"<a href='{_e(name)}/index.html'>{_e(title)}</a>",
            _e(_describe(scenarios[name])) if name in scenarios else "",
            count(row["runs"]),
            duration(row["wait_mean_s"], *((mean_ci.low, mean_ci.high) if mean_ci else ())),
            duration(row["wait_p95_s"], *((p95_ci.low, p95_ci.high) if p95_ci else ())),
            share(row["p_wait"]),
            share(row["utilization"]),
            duration(row["stuck_s"]),
        ]
        out.append(
            "<tr>"
            + "".join(f"<td{' class=n' if i >= 2 else ''}>{c}</td>" for i, c in enumerate(cells))
            + "</tr>"
        )
    out.append("</tbody></table>")
    return out


def _evidence(
    table: pd.DataFrame,
    theory: Mapping[str, Mapping[str, Any]],
    cap: Capacity,
    summaries: Mapping[str, Mapping[str, Any]],
) -> list[str]:
    n = len(table)
    runs = int(table["runs"].sum())
    violations = int(table["violations"].sum())
    agree = int(table["model_agrees"].sum())
    confirm = cap.plan.confirmation
    if confirm is not None and len(confirm):
        violations += int(confirm["violations"].sum())
    inv = (
        f"<div id='invariants'><b>Invariant violations: "
        f"<span class='{'ok' if not violations else 'bad'}'>"
        f"{violations}</span></b><br>I1–I7 checked by SQL during and after every simulation "
        f"({n} scenarios, {runs:,} runs on the real Mediator).</div>"
    )
    model = (
        f"<div id='model'><b>Model agrees: "
        f"<span class='{'ok' if agree == n else 'bad'}'>{agree} of "
        f"{n}</span></b><br>The independent reference model promoted the same runs onto the same "
        f"nodes at the same instants as the Mediator.</div>"
    )
    lines = []
    th_ok = True
    steady = theory.get("steady")
    if steady:
        wq, sim_wq = steady.get("Wq theory"), steady.get("Wq simulated")
        ci = interval(summaries.get("steady", {}), "wait_mean")
        inside = ci is not None and wq is not None and ci.low <= wq <= ci.high
        th_ok = th_ok and (inside or ci is None)
        where = f" [{_num(ci.low, 1)}–{_num(ci.high, 1)}]" if ci else ""
        lines.append(
            f"Erlang C mean wait {duration(wq)}, simulated {duration(sim_wq)}{where}"
            f"{'' if inside or ci is None else ' (outside the interval)'}; P(wait) "
            f"{share(steady.get('P(wait) theory'))} vs {share(steady.get('P(wait) simulated'))}."
        )
    trace = theory.get("trace")
    if trace:
        d = float(trace.get("max |wait - recursion| (s)", math.nan))
        th_ok = th_ok and d < 1e-6
        lines.append(
            f"NASA jobs against the first-come-first-served formula: largest difference "
            f"{duration(d)}."
        )
    theory_div = (
        f"<div id='theory'><b>Theory agrees: <span class='{'ok' if th_ok else 'bad'}'>"
        f"{'yes' if th_ok else 'no'}</span></b><br>"
        f"{_e(' '.join(lines)) or 'No scenario here has a closed form.'}</div>"
    )
    return ["<section class='evidence' id='evidence'>", inv, model, theory_div, "</section>"]


def theory_text(th: Mapping[str, Any]) -> str:
    """A scenario's theory check in words."""
    if "Wq theory" in th:
        return (
            f"{th['what']}: mean wait {duration(th['Wq theory'])} in theory, "
            f"{duration(th.get('Wq simulated'))} simulated; share of runs that wait "
            f"{share(th.get('P(wait) theory'))} in theory, {share(th.get('P(wait) simulated'))} "
            "simulated."
        )
    if "max |wait - recursion| (s)" in th:
        return (
            f"{th['what']}: the largest difference between a run's wait and the recursion's is "
            f"{duration(th['max |wait - recursion| (s)'])} (mean wait "
            f"{duration(th.get('mean wait (s)'))})."
        )
    return "; ".join(
        f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in th.items()
    )


def _thumbnail(src: Path, dst: Path, width: int = 260) -> None:
    """A small copy of a chart (Pillow, which matplotlib itself depends on)."""
    from PIL import Image

    with Image.open(src) as im:
        im.thumbnail((width, width * 4))
        im.save(dst, optimize=True)


def _thumbs(names: Iterable[str], out: Path) -> list[str]:
    """Thumbnails of each scenario's waiting-time chart, linking to its page."""
    parts = ["<div class='thumbs' id='charts'>"]
    cap_png = out / "capacity" / "plan.png"
    if cap_png.exists():
        _thumbnail(cap_png, out / "capacity" / "thumb.png")
        parts.append(
            "<a href='capacity/index.html'><img src='capacity/thumb.png' "
            "alt='capacity plan chart'>Capacity plan</a>"
        )
    for name in names:
        src = out / name / "waits.png"
        if not src.exists():
            continue
        _thumbnail(src, out / name / "thumb.png")
        title = TITLES.get(name, (name, ""))[0]
        parts.append(
            f"<a href='{_e(name)}/index.html'><img src='{_e(name)}/thumb.png' "
            f"alt='{_e(title)}: waiting times'>{_e(title)}</a>"
        )
    parts.append("</div>")
    return parts


FIGURES: tuple[tuple[str, str, str], ...] = (
    ("runs", "Runs", "count"),
    ("measured", "Runs measured (after warm-up)", "count"),
    ("end_s", "Simulated time", "duration"),
    ("throughput_per_s", "Throughput", "rate"),
    ("wait_mean_s", "Mean wait", "duration"),
    ("wait_p50_s", "Median wait", "duration"),
    ("wait_p95_s", "95th-percentile wait", "duration"),
    ("wait_p99_s", "99th-percentile wait", "duration"),
    ("p_wait", "Runs that waited", "share"),
    ("utilization", "Utilization", "share"),
    ("stuck_s", "Stuck time (a free node could have taken a queued run)", "duration"),
    ("advert_share", "Share of work spent on heartbeats", "share"),
    ("virtual_s_per_wall_s", "Simulated seconds per wall second", "number"),
)


def _figure(value: Any, kind: str, ci: Ci | None = None) -> str:
    if value is None:
        return "–"
    v = float(value)
    if kind == "duration":
        return duration(v, *((ci.low, ci.high) if ci else ()))
    if kind == "share":
        return share(v)
    if kind == "count":
        return count(v)
    if kind == "rate":
        return f"{v * 3600:,.1f} runs per hour"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}".rstrip("0").rstrip(".")


def _scenario_page(
    out: Path,
    name: str,
    sc: Scenario | None,
    row: Mapping[str, Any],
    s: Mapping[str, Any],
    th: Mapping[str, Any] | None,
) -> None:
    title, what = TITLES.get(name, (name.replace("_", " ").capitalize(), ""))
    body = [
        "<p class='muted'><a href='../index.html'>← the report</a></p>",
        f"<h1>{_e(title)}</h1>",
        f"<p>{_e(what)}</p>",
    ]
    if sc is not None:
        st = sc.settings
        body.append(
            f"<p class='muted'>Fleet and load: {_e(_describe(sc))}. Scenario "
            f"<code>{_e(sc.name)}</code>, seed {sc.seed}; "
            f"lease TTL {duration(st.lease_ttl_seconds)}, "
            f"advert TTL {duration(st.advert_ttl_seconds)}, "
            f"reaper every {duration(st.renew_seconds)}, "
            f"wake on return {'on' if st.wake_on_return else 'off'}.</p>"
        )
    body.append("<table><tbody>")
    for key, label, kind in FIGURES:
        if key in s:
            stat = key[:-2] if key.endswith("_s") else key
            ci = interval(s, stat) if kind == "duration" else None
            note = f" <span class='muted'>({_e(ci.method)})</span>" if ci and ci.method else ""
            body.append(
                f"<tr><th>{_e(label)}</th><td class='n'>{_figure(s[key], kind, ci)}{note}</td></tr>"
            )
    agrees = bool(row.get("model_agrees"))
    body.append(
        "<tr><th>Invariant violations (I1–I7)</th>"
        f"<td class='n'>{int(row.get('violations', 0))}</td></tr>"
        f"<tr><th>Reference model agrees</th><td class='n'>{'yes' if agrees else 'no'}</td></tr>"
        "</tbody></table>"
    )
    if not agrees and row.get("first_divergence"):
        body.append(f"<p class='bad'>First divergence: {_e(row['first_divergence'])}</p>")
    if th:
        body.append(f"<p><b>Against theory.</b> {_e(theory_text(th))}</p>")
    for chart, alt in (
        ("waits", "waiting times"),
        ("queue", "queue length over time"),
        ("gantt", "leases per node"),
    ):
        if (out / name / f"{chart}.png").exists():
            body.append(
                f"<h2>{_e(alt.capitalize())}</h2>"
                f"<img class='full' src='{chart}.png' alt='{_e(title)}: {alt}'>"
            )
    files = sorted(p.name for p in (out / name).glob("*") if p.suffix in (".csv", ".json", ".txt"))
    body.append(
        "<p class='muted'>Data: "
        + ", ".join(f"<a href='{_e(f)}'>{_e(f)}</a>" for f in files)
        + "</p>"
    )
    (out / name / "index.html").write_text(_page(title, body, root="../"), encoding="utf-8")


def _capacity_page(out: Path, cap: Capacity) -> None:
    from sim import plots  # matplotlib, imported when a chart is drawn

    plt = plots.pyplot()
    d = out / "capacity"
    d.mkdir(parents=True, exist_ok=True)
    fig = cap.plan.plot(path=d / "plan.png", title=f"Capacity plan: {TRACE_NAME}")
    plt.close(fig)
    p = cap.plan
    frame = p.to_frame()
    q = _pct(p.quantile)
    body = [
        "<p class='muted'><a href='../index.html'>← the report</a></p>",
        f"<h1>Capacity plan: {_e(TRACE_NAME)}</h1>",
        f"<p><b>{_e(headline(cap))}</b></p>",
        "<img class='full' src='plan.png' alt='wait and utilization per fleet size'>",
        "<table id='plan'><thead><tr><th>Stage</th><th>Engine</th><th class='n'>Nodes</th>"
        "<th class='n'>Runs</th><th class='n'>Mean wait</th><th class='n'>Median wait</th>"
        f"<th class='n'>{_e(q.capitalize())} wait</th><th class='n'>Utilization</th>"
        "<th>Meets the target</th></tr></thead><tbody>",
    ]
    stage_names = {"grid": "grid", "confirm": "confirmation"}
    engine_names = {"model": "reference model", "mediator": "real Mediator"}
    for _, r in frame.iterrows():

        def cell(base: str, r: Any = r) -> str:
            return duration(r.get(base + "_s"), r.get(base + "_low"), r.get(base + "_high"))

        body.append(
            f"<tr><td>{_e(stage_names.get(r['stage'], r['stage']))}</td>"
            f"<td>{_e(engine_names.get(r['engine'], r['engine']))}</td>"
            f"<td class='n'>{int(r['size'])}</td>"
            f"<td class='n'>{count(r['runs'])}</td><td class='n'>{cell('wait_mean')}</td>"
            f"<td class='n'>{cell('wait_p50')}</td><td class='n'>{cell(p.column[:-2])}</td>"
            f"<td class='n'>{share(r['utilization'])}</td>"
            f"<td>{'yes' if r.get('meets_target') else 'no'}</td></tr>"
        )
    body.append("</tbody></table>")
    body.append("<h2>Tomorrow's load</h2>")
    body += _growth_table(cap)
    frame.to_csv(d / "plan.csv", index=False)
    cap.growth.to_csv(d / "growth.csv", index=False)
    body.append(
        "<p class='muted'>Data: <a href='plan.csv'>plan.csv</a>, "
        "<a href='growth.csv'>growth.csv</a></p>"
    )
    (d / "index.html").write_text(_page("Capacity plan", body, root="../"), encoding="utf-8")


def write_site(
    out: Path,
    table: pd.DataFrame,
    theory: Mapping[str, Mapping[str, Any]],
    scenarios: Mapping[str, Scenario],
    cap: Capacity,
    notebooks: Sequence[str],
    took_s: float,
) -> None:
    """Write the front page, the capacity page and one page per scenario into ``out``."""
    (out / "report.css").write_text(CSS.strip() + "\n", encoding="utf-8")
    summaries: dict[str, dict[str, Any]] = {}
    for name in table["scenario"]:
        path = out / name / "summary.json"
        summaries[name] = json.loads(path.read_text()) if path.exists() else {}
    _capacity_page(out, cap)
    rows = {r["scenario"]: r.to_dict() for _, r in table.iterrows()}
    for name in table["scenario"]:
        _scenario_page(
            out, name, scenarios.get(name), rows[name], summaries[name], theory.get(name)
        )
    body = ["<h1>Mediator capacity report</h1>"]
    body += _answer(cap)
    body.append(_method(cap))
    body.append("<h2>As the load grows</h2>")
    body += _growth_table(cap)
    body.append("<h2>Every scenario on the real Mediator</h2>")
    body.append(
        "<p class='muted'>Waits are queue waits (submit to start) of the measured runs; "
        "[low–high] is a 95 % confidence interval, from consecutive stretches of the run compared "
        "with each other, shown where a scenario has enough runs. Stuck time: how long a queued "
        "run could have been started by a free node but was not.</p>"
    )
    body += _scenario_table(table, summaries, scenarios)
    body += _nasa_note(cap, scenarios.get("trace"), summaries.get("trace", {}))
    body.append("<h2>Is it right?</h2>")
    body += _evidence(table, theory, cap, summaries)
    body.append("<h2>Charts</h2>")
    body += _thumbs(table["scenario"], out)
    if notebooks:
        body.append(
            "<h2>Notebooks</h2><p>"
            + " · ".join(
                f"<a href='{_e(n)}'>{_e(Path(n).stem.replace('-', ' '))}</a>" for n in notebooks
            )
            + "</p>"
        )
    body.append(
        f"<p class='muted'>Every scenario ran on the real Mediator and PostgreSQL in virtual time "
        f"and on the reference model; the whole report took {duration(took_s)}. Machine-readable: "
        "<a href='summary.csv'>summary.csv</a>, <a href='theory.json'>theory.json</a>.</p>"
    )
    (out / "index.html").write_text(_page("Mediator capacity report", body), encoding="utf-8")
