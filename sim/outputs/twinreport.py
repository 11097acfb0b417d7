"""The report for one lab (docs/notebooks.md, "Your lab's report"): ``python -m sim report --twin
DIR`` writes a front page that answers for *that* lab, from its exported twin:

- how many nodes of each capability class keep the target wait quantile (the per-class plan of
  `sim.studies.classplan`) at the recorded load and at grown load (arrivals scaled);
- what each what-if changes — a node more or fewer per class, the largest class's first node dark
  for a quarter of the window, arrivals ×growth, wake 7 off, `max_width` 1 — against the replay
  of the window as recorded (p95 wait overall and per class, runs that never started);
- the audit's verdict (`sim.outputs.audit`): whether the lab's broker did what the policy does.

Everything runs on the reference model (the audit included); the replay is exact on either broker
(docs/design.md §20, "Replaying a twin").
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.brokers.entry import run
from sim.inputs.scenarios import Scenario
from sim.inputs.twin import dark, manifest, scaled, with_nodes
from sim.outputs.audit import Audit, audit
from sim.outputs.report import CSS, duration
from sim.studies.classplan import ClassPlan, class_templates
from sim.studies.plan import plan


@dataclass
class WhatIf:
    """One variant of the twin, replayed on the model: p95 wait of every run and per class
    (``id_prefix`` → seconds; NaN where the class served no run), runs never started."""

    name: str
    p95_s: float
    by_class: dict[str, float]
    runs: int
    unstarted: int


@dataclass
class TwinReport:
    """What the front page shows (see the module docstring)."""

    twin: Scenario
    target: dict[str, float]
    growth: float
    today: ClassPlan
    grown: ClassPlan
    recorded: WhatIf
    what_ifs: list[WhatIf]
    audit: Audit
    path: Path | None = None

    def headline(self) -> str:
        """The answer in one sentence (also printed on the terminal)."""
        q = f"p{self.target['quantile'] * 100:g}"
        t = duration(self.target["wait_s"])

        def fleet(p: ClassPlan) -> str:
            if p.counts is None:
                return "no fleet within the sizes tried"
            return ", ".join(f"{n} × {g.rstrip('+')}" for g, n in p.counts.items())

        return (f"To keep the {q} wait within {t}: {fleet(self.today)} at the recorded "
                f"load; {fleet(self.grown)} at ×{self.growth:g}. "
                f"Audit: {self.audit.verdict()}.")  # fmt: skip


def _p95(values: Any) -> float:
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    return float(np.quantile(a, 0.95)) if a.size else float("nan")


def measure(name: str, sc: Scenario, uses: Mapping[str, list[str]]) -> WhatIf:
    """Replay one variant on the model and read its waits (per class: the runs of templates the
    class serves)."""
    r = run(sc, "model", record_events=False)
    runs = r.runs
    by = {g: _p95(runs.loc[runs["template"].isin(t), "wait_s"]) for g, t in uses.items()}
    started = runs["started_at"].notna()
    unstarted = int((~started & runs["reject"].isna()).sum()) if "reject" in runs else 0
    return WhatIf(name, _p95(runs["wait_s"]), by, len(runs), unstarted)


def default_what_ifs(twin: Scenario, growth: float) -> list[tuple[str, Scenario]]:
    """A node more and one fewer per class, the largest class's first node dark for the second
    quarter of the window, arrivals ×growth, wake 7 off, max_width 1."""
    out: list[tuple[str, Scenario]] = []
    for g in twin.fleet.groups:
        label = g.id_prefix.rstrip("+")
        out.append((f"+1 {label}", with_nodes(twin, g.capabilities, 1)))
        if g.count > 1:
            out.append((f"−1 {label}", with_nodes(twin, g.capabilities, -1)))
    big = max(twin.fleet.groups, key=lambda g: g.count)
    node = (big.names or (big.id_prefix + "000",))[0]
    span = twin.horizon_s or 0.0
    out.append((f"{node} dark {duration(span / 4)}–{duration(span / 2)}",
                dark(twin, [node], span / 4, span / 2)))  # fmt: skip
    out.append((f"arrivals ×{growth:g}", scaled(twin, growth)))
    out.append(("wake 7 off", twin.with_overrides({"wake_on_return": False})))
    out.append(("max_width 1", twin.with_overrides({"max_width": 1})))
    return out


def twin_report(
    twin: Scenario,
    out: str | Path | None = None,
    target: Mapping[str, float] | None = None,
    growth: float = 1.5,
    what_ifs: Sequence[tuple[str, Scenario]] | None = None,
) -> TwinReport:
    """Compute the lab's front page and, with ``out``, write ``out/index.html`` (and its CSS)."""
    tgt = {"quantile": 0.95, "wait_s": 600.0, **(target or {})}
    largest = max(g.count for g in twin.fleet.groups)
    sizes = range(1, largest + 3)
    today = plan(twin, tgt, sizes, per_class=True)
    grown = plan(scaled(twin, growth), tgt, sizes, per_class=True)
    uses = class_templates(twin)
    recorded = measure("as recorded", twin, uses)
    variants = list(what_ifs) if what_ifs is not None else default_what_ifs(twin, growth)
    rows = [measure(name, sc, uses) for name, sc in variants]
    report = TwinReport(twin, tgt, growth, today, grown, recorded, rows, audit(twin))  # type: ignore[arg-type]
    if out is not None:
        report.path = write(report, Path(out))
    return report


def _e(x: object) -> str:
    return html.escape(str(x))


def _s(x: float) -> str:
    return "–" if not np.isfinite(x) else duration(x)


def write(rep: TwinReport, out: Path) -> Path:
    """The front page: ``out/index.html``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.css").write_text(CSS)
    proc = rep.twin.workload.arrivals
    m = manifest(getattr(proc, "path", ""))
    groups = [g.id_prefix for g in rep.twin.fleet.groups]
    q = f"p{rep.target['quantile'] * 100:g}"

    def plan_rows(p: ClassPlan) -> str:
        cells = []
        for g in rep.twin.fleet.groups:
            n = p.counts.get(g.id_prefix) if p.counts else None
            cells.append(f"<td class='n'>{g.count}</td><td class='n'>{n if n else '–'}</td>")
        return "".join(cells)

    head = "".join(f"<th class='n'>{_e(g.rstrip('+'))} now</th><th class='n'>needed</th>"
                   for g in groups)  # fmt: skip
    wi_head = "".join(f"<th class='n'>{q} {_e(g.rstrip('+'))}</th>" for g in groups)
    wi_rows = []
    for w in [rep.recorded, *rep.what_ifs]:
        per = "".join(f"<td class='n'>{_s(w.by_class.get(g, float('nan')))}</td>" for g in groups)
        tail = f"<td class='n'>{w.runs}</td><td class='n'>{w.unstarted}</td></tr>"
        wi_rows.append(f"<tr><td>{_e(w.name)}</td><td class='n'>{_s(w.p95_s)}</td>{per}{tail}")
    verdict_class = "ok" if rep.audit.clean else "bad"
    body = [
        f"<h1>Your lab: {_e(m.get('since'))} → {_e(m.get('until'))}</h1>",
        f"<div class='answer'><p class='big'>{_e(rep.headline())}</p></div>",
        f"<h2>Nodes per class for the {q} wait within {_e(duration(rep.target['wait_s']))}</h2>",
        f"<table><tr><th>load</th>{head}</tr>",
        f"<tr><td>as recorded</td>{plan_rows(rep.today)}</tr>",
        f"<tr><td>arrivals ×{rep.growth:g}</td>{plan_rows(rep.grown)}</tr></table>",
        "<p class='muted'>The per-class plan on the reference model: each class's smallest count "
        "keeping the target for the runs it serves, the classes simulated together.</p>",
        "<h2>What-ifs</h2>",
        f"<table><tr><th>variant</th><th class='n'>{q} wait</th>{wi_head}"
        "<th class='n'>runs</th><th class='n'>never started</th></tr>",
        *wi_rows,
        "</table>",
        "<h2>Audit</h2>",
        f"<p class='{verdict_class}'>{_e(rep.audit.verdict())}</p>",
        f"<pre>{_e(rep.audit.text())}</pre>" if not rep.audit.clean else "",
        "<p class='muted'>Every decision of the window replayed against the policy "
        "(docs/design.md §20, “Auditing a twin”).</p>",
    ]
    page = "\n".join([
        "<!doctype html>", "<html lang='en'><head><meta charset='utf-8'>",
        f"<title>Your lab: {_e(rep.twin.name)}</title>",
        "<link rel='stylesheet' href='report.css'>", "</head><body>", *body, "</body></html>", "",
    ])  # fmt: skip
    path = out / "index.html"
    path.write_text(page)
    return path
