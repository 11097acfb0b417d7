"""The main job (README's first command): every built-in scenario on the real Mediator, measured,
charted and summarised in ``reports/``.

For each scenario the plan is simulated on the real Mediator (embedded PostgreSQL, a fresh
database each) and on the reference model; the report shows the Mediator's figures, whether the
model promoted the same runs at the same instants (the differential check of sim.md §6), the
invariant violations found (must be none), and the theory where it applies (Erlang C for
``steady``, the FIFO G/G/c recursion for the NASA trace). Notebooks in ``notebooks/`` are executed
and rendered to HTML beside them when present. Progress is shown while it works.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim import scenarios as S
from sim.analysis import erlang_c, mmc_wq
from sim.model import promotions_diff, run_model
from sim.scenarios import Scenario
from sim.traces import fifo_waits
from sim.workload import materialize

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
}


def _row(name: str, sc: Scenario, result: Any, model: Any, wall: float) -> dict[str, Any]:
    s = result.summary()
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
        from sim.plots import mmc_params

        params = mmc_params(sc)
        if params is None:
            return None
        lam, mu, c = params
        s = result.summary()
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


def main_job(out: Path, scale: str = "full", database_url: str | None = None) -> int:
    """Run every case, write ``out/<case>/`` and ``out/index.html``, print the summary table."""
    from tqdm import tqdm

    from sim.result import run

    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows: list[dict[str, Any]] = []
    theory: dict[str, dict[str, Any]] = {}
    bar = tqdm(list(CASES.items()), desc="scenarios", unit="scenario")
    for name, (full, ci) in bar:
        sc = (full if scale == "full" else ci)()
        bar.set_postfix_str(f"{name}: {sc.horizon_runs or 'scripted'} runs")
        plan = materialize(sc)
        t = time.time()
        result = run(plan, database_url=database_url, progress=True)
        wall = time.time() - t
        model = run_model(plan)
        result.save(out / name)
        rows.append(_row(name, sc, result, model, wall))
        th = _theory(name, sc, result, plan)
        if th is not None:
            theory[name] = th
    table = pd.DataFrame(rows)
    table.to_csv(out / "summary.csv", index=False)
    (out / "theory.json").write_text(json.dumps(theory, indent=2, default=float) + "\n")
    from sim.engine import server_url

    notebooks = _render_notebooks(out, scale, server_url(database_url))
    _index(out, table, theory, notebooks, time.time() - started)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.drop(columns=[c for c in ("first_divergence",) if c in table]).to_string(
            index=False, float_format=lambda v: f"{v:,.3g}"))  # fmt: skip
    for name, th in theory.items():
        print(f"{name}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in th.items()))  # fmt: skip
    print(f"\nreport written to {out}/index.html in {time.time() - started:.0f} s")
    bad = table["violations"].sum() or (~table["model_agrees"]).sum()
    return 1 if bad else 0


def _render_notebooks(out: Path, scale: str, database_url: str | None = None) -> list[str]:
    """Execute every notebook in notebooks/ and render it to HTML in out/ (sim.md §9)."""
    root = Path(__file__).resolve().parents[1] / "notebooks"
    books = sorted(root.glob("*.ipynb")) if root.is_dir() else []
    rendered = []
    for book in books:
        from sim.notebooks import render

        rendered.append(render(book, out, scale=scale, database_url=database_url).name)
    return rendered


def _index(out: Path, table: pd.DataFrame, theory: dict[str, Any], notebooks: list[str],
           took_s: float) -> None:  # fmt: skip
    parts = [
        "<!doctype html><meta charset='utf-8'><title>Mediator simulation report</title>",
        "<style>body{font:14px system-ui;margin:2rem;max-width:1100px}"
        "table{border-collapse:collapse}td,th{padding:.2rem .5rem;border-bottom:1px solid #ddd}"
        "img{max-width:100%}</style>",
        "<h1>Mediator simulation report</h1>",
        f"<p>Every scenario ran on the real Mediator and PostgreSQL in virtual time, and on the "
        f"reference model; {took_s:.0f} s in all.</p>",
        table.to_html(index=False, float_format=lambda v: f"{v:,.3g}"),
    ]
    if theory:
        parts.append("<h2>Against theory</h2><ul>")
        for name, th in theory.items():
            items = ", ".join(f"{html.escape(k)} = {v:.4g}" if isinstance(v, float)
                              else f"{html.escape(str(k))}: {html.escape(str(v))}"
                              for k, v in th.items())  # fmt: skip
            parts.append(f"<li><b>{name}</b>: {items}</li>")
        parts.append("</ul>")
    if notebooks:
        parts.append("<h2>Notebooks</h2><ul>")
        parts += [f"<li><a href='{n}'>{n}</a></li>" for n in notebooks]
        parts.append("</ul>")
    for name in table["scenario"]:
        parts.append(f"<h2 id='{name}'>{name}</h2>")
        for chart in ("waits", "queue", "gantt"):
            parts.append(f"<img src='{name}/{chart}.png' alt='{name} {chart}'>")
    (out / "index.html").write_text("\n".join(parts) + "\n")
