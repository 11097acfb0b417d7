"""Capacity planning (docs/design.md §20): how many nodes keep a wait quantile under a target?

``sim.plan(workload, target, fleet_sizes, replications)`` answers "how many nodes with capability
X keep the 95th-percentile queue wait under 5 minutes at this load?" the way design.md §20 asks
it to:

- **The grid on the reference model.** Every fleet size is simulated ``replications`` times on
  the in-memory model (``engine="model"``, ~60,000 runs per wall second), or on the real Mediator
  (``engine="mediator"``) when you want every figure from the database.
- **Common random numbers.** Replication k uses the same seed at every fleet size, and
  ``sim.inputs.workload.materialize`` draws arrivals and durations from streams the fleet does not
  touch, so two sizes see the very same runs: differences between sizes are the fleet's, not noise.
- **Honest intervals.** p50/p95/p99 (and the target's quantile) and the mean wait come with
  confidence intervals over independent replications (``sim.analysis.quantile_ci``). A workload
  with no randomness — a trace replay — gives identical replications; then the interval comes
  from ``batches`` consecutive stretches of the one run (batch quantiles, like batch means).
- **Theory beside it.** Where the scenario is M/M/c (``sim.inputs.theory.mmc_params``), the Erlang C
mean
  and quantiles are shown for every size.
- **The recommendation, confirmed.** The smallest size whose target quantile is within the target
  (upper confidence bound included) is recommended; it and its grid neighbours are then simulated
  on the real Mediator with the same seeds (``sim.run``, each simulation on a fresh database) and
  shown beside the model's figures for the same workload. The two engines promote the same runs at
  the same instants (design.md §20), so the confirmation also reports the largest wait difference.

Replications run on any ``concurrent.futures.Executor``: a local process pool by default (spawned
workers, one per core), or a Dask cluster's executor (``distributed.Client.get_executor()``) when
one machine is not enough. Each task is a picklable ``PlanTask``; each result is a small
``Replication`` (waits and utilization), so only numbers travel back.

How the fleet is varied: ``workload`` is either a ``Scenario`` — then node group ``group`` (an
index, or a group's ``id_prefix``) gets ``count = size`` and the other groups stay as they are —
or any callable ``size -> Scenario`` for anything else (scaling two groups together, say).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import html
import io
import json
import math
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd  # type: ignore[import-untyped, unused-ignore]

from sim.analysis import Interval, erlang_c, mmc_wait_quantile, mmc_wq, sectioning
from sim.analysis import replication_seeds as _seeds
from sim.brokers.entry import BROKERS, run
from sim.inputs.scenarios import Constant, Recorded, Scenario, Scripted, Trace
from sim.inputs.theory import mmc_params
from sim.inputs.workload import materialize
from sim.parallel import local_pool
from sim.platform.measure import plain
from sim.studies.classplan import plan_classes

ENGINES = BROKERS  # the old name, kept for one release
QUANTILES = (0.5, 0.95, 0.99)
#: The version of what ``CapacityPlan.save`` writes; ``load`` refuses any other.
PLAN_FORMAT = 1

Workload = Scenario | Callable[[int], Scenario]


@dataclass(frozen=True)
class PlanTask:
    """One simulation of a plan: a sized, seeded scenario on one engine.

    Attributes:
        scenario: the scenario with its fleet size and replication seed already set.
        size: the fleet size it stands for.
        rep: the replication index (same index, same seed at every size).
        engine: ``"model"`` or ``"mediator"``.
        database_url: the PostgreSQL server the Mediator's fresh database is created on.
        progress_path: a file the simulation keeps rewriting with the number of runs it has
            submitted so far (the confirmation's progress bar reads it; None: no progress).
    """

    scenario: Scenario
    size: int
    rep: int
    engine: str
    database_url: str | None = None
    progress_path: str | None = None


@dataclass(frozen=True)
class Replication:
    """What one simulation contributes to a plan.

    Attributes:
        size: fleet size.
        rep: replication index.
        seed: the scenario seed it ran with.
        engine: ``"model"`` or ``"mediator"``.
        waits: queue waits of the measured runs (warm-up left out), in arrival order; runs that
            never started are not in it (see ``unstarted``).
        unstarted: measured runs still waiting when the simulation stopped.
        utilization: mean share of time the nodes held a lease.
        wall_s: wall-clock seconds the simulation took.
        violations: invariant breaches the real Mediator's run found (0 for the model).
        stage: ``"grid"`` or ``"confirm"`` (the confirmation's simulations, both engines).
    """

    size: int
    rep: int
    seed: int
    engine: str
    waits: npt.NDArray[np.float64]
    unstarted: int
    utilization: float
    wall_s: float
    violations: int = 0
    stage: str = "grid"


def simulate_one(task: PlanTask) -> Replication:
    """Run one task (the function executors receive; module-level so it pickles).

    Args:
        task: what to simulate and on which engine.

    Returns:
        The replication's waits and utilization.
    """
    return _simulate(task, None)


def _simulate(task: PlanTask, callback: Callable[[int], None] | None) -> Replication:
    """``simulate_one``, with the Mediator's progress going to ``callback`` (runs submitted so
    far) or else to the task's progress file."""
    if task.engine not in BROKERS:
        raise ValueError(f"engine {task.engine!r} not in {BROKERS}")
    progress: Any = False
    if task.engine == "mediator":
        if callback is not None:
            progress = callback
        elif task.progress_path is not None:
            progress = functools.partial(_write_progress, task.progress_path)
    with _task_template(task.database_url if task.engine == "mediator" else None) as template:
        result = run(task.scenario, task.engine, database_url=task.database_url,
                     progress=progress, template=template, drop=task.database_url is not None,
                     record_events=False)  # fmt: skip
    violations = len(result.violations)
    runs = result.runs[~result.runs["warmup"].astype(bool)]
    started = runs["wait_s"].notna()
    util = result.utilization()["utilization"]
    return Replication(
        size=task.size,
        rep=task.rep,
        seed=task.scenario.seed,
        engine=task.engine,
        waits=runs.loc[started, "wait_s"].to_numpy(dtype=float),
        unstarted=int((~started).sum()),
        utilization=float(util.mean()) if len(util) else math.nan,
        wall_s=float(result.wall_s),
        violations=violations,
    )


def _write_progress(path: str, submitted: int) -> None:
    """Write a simulation's progress (runs submitted so far) where the parent's bar reads it: a
    file works across a spawned or forked pool without another process or a queue."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(str(int(submitted)))
    os.replace(tmp, path)


def _read_progress(path: str) -> int:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0


@contextlib.contextmanager
def _task_template(database_url: str | None) -> Iterator[str | None]:
    """A schema-loaded template database of this task's own on the server, dropped afterwards
    (issue 14 §8): tasks on a Dask cluster share one PostgreSQL server and nothing else."""
    if database_url is None:
        yield None
        return
    from mediator.databases import create_schema_database, drop_database

    name = f"simtpl_{uuid.uuid4().hex}"
    try:
        create_schema_database(database_url, name)
        yield name
    finally:
        drop_database(database_url, name)


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


def _pct(q: float) -> str:
    """0.95 → "p95", 0.999 → "p99.9" (column names)."""
    return "p" + f"{q * 100:.6g}"


def _ordinal(q: float) -> str:
    """0.95 → "95th-percentile" (the chart's words)."""
    return f"{q * 100:g}th-percentile"


def _human(seconds: float) -> str:
    """A wait for people: ``45 s``, ``12 min``, ``3.2 h``, ``11 days``."""
    for size, unit in ((86_400.0, "days"), (3_600.0, "h"), (60.0, "min")):
        if abs(seconds) >= 2 * size:
            v = seconds / size
            return f"{v:,.0f} {unit}" if abs(v) >= 10 else f"{v:.1f} {unit}"
    return f"{seconds:.0f} s" if abs(seconds) >= 10 else f"{seconds:.2g} s"


_NON_INTERACTIVE = ("agg", "cairo", "pdf", "pgf", "ps", "svg", "template")  # matplotlib's


def _headless() -> bool:
    """Whether a chart cannot be shown: matplotlib's backend is a non-interactive one (Agg, which
    ``sim.plots`` selects when there is no display) and this is not a notebook kernel (whose
    inline backend shows every figure)."""
    import sys

    import matplotlib

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None and getattr(shell, "kernel", None) is not None:
        return False  # inside a running kernel, not merely a program that imported ipykernel
    return matplotlib.get_backend().lower() in _NON_INTERACTIVE


@dataclass(frozen=True)
class ConfirmationCheck:
    """The confirmation's finding (``CapacityPlan.confirmation_check``).

    Attributes:
        sizes: the fleet sizes replayed on the real Mediator (the recommendation and its grid
            neighbours).
        replications: simulations per size.
        jobs: jobs (runs) each simulation replayed — the whole workload unless ``confirm_runs``
            capped it (the smallest count if they differ).
        max_abs_diff_s: the largest |wait on the real Mediator − wait on the model| over every
            job of every confirmed simulation (0 when they agree, as they must; inf when they
            did not start the same runs).
        worst_size: the size where that largest difference occurred.
        worst_job: its job's index in arrival order (-1 when there is no single job).
        violations: invariant violations (I1–I7) the real Mediator's simulations found.
    """

    sizes: list[int]
    replications: int
    jobs: int
    max_abs_diff_s: float
    worst_size: int
    worst_job: int
    violations: int


@dataclass(eq=False)
class CapacityPlan:
    """The answer of ``sim.plan``: a table per fleet size, the recommendation and its check.

    Attributes:
        target: ``{"quantile": q, "wait_s": t}`` — the q-quantile of the wait must be at most t.
        sizes: the fleet sizes of the grid, ascending.
        engine: the grid's engine.
        grid: one row per size on the grid's engine (see ``to_frame`` for the columns).
        recommended: the smallest size meeting the target, or None when no size does.
        confirmation: rows for the recommended size and its grid neighbours on the real Mediator
            and, beside them, on the model for the same workload (empty when not confirmed).
        replications: every simulation's ``Replication``, grid and confirmation.
        scenario_name: the workload scenario's name, for titles.
        confirmation_note: what the confirmation ran and what it shows.
    """

    target: dict[str, float]
    sizes: list[int]
    engine: str
    grid: pd.DataFrame
    recommended: int | None
    confirmation: pd.DataFrame
    replications: list[Replication] = field(repr=False)
    scenario_name: str = ""
    confirmation_note: str = ""

    @property
    def quantile(self) -> float:
        """The target's quantile (0.95 for a p95 target)."""
        return float(self.target["quantile"])

    @property
    def wait_s(self) -> float:
        """The target's wait bound in seconds."""
        return float(self.target["wait_s"])

    @property
    def column(self) -> str:
        """The frame column holding the target quantile's estimate, e.g. ``wait_p95_s``."""
        return f"wait_{_pct(self.quantile)}_s"

    def row(self, size: int, engine: str | None = None, stage: str = "grid") -> pd.Series:
        """The frame row of one size (the grid's engine by default)."""
        frame = self.to_frame()
        engine = engine or (self.engine if stage == "grid" else "mediator")
        hit = frame[
            (frame["size"] == size) & (frame["engine"] == engine) & (frame["stage"] == stage)
        ]
        if hit.empty:
            raise KeyError(f"no {stage} row for size {size} on {engine}")
        return hit.iloc[0]

    def to_frame(self) -> pd.DataFrame:
        """Grid and confirmation rows in one table.

        Columns: stage (``grid`` / ``confirm``), engine, size, replications, runs (measured,
        summed over replications), unstarted, wait_mean_s with _low/_high, wait_pXX_s with
        _low/_high for p50, p95, p99 and the target's quantile, p_wait (share of runs that
        waited), utilization, erlang_wait_mean_s and erlang_pXX_s (NaN where M/M/c does not
        apply, inf where the queue is unstable), meets_target, wall_s, violations, and on
        confirmation rows max_abs_diff_s (largest |wait on the Mediator − wait on the model| over
        the same runs).
        """
        if self.confirmation.empty:
            return self.grid.copy()
        return pd.concat([self.grid, self.confirmation], ignore_index=True)

    def confirmation_check(self) -> ConfirmationCheck | None:
        """What the confirmation found, computed job by job from its simulations' waits: each
        real-Mediator simulation beside the model's simulation of the same size and seed.

        Returns:
            None when nothing was confirmed; else the sizes, the jobs each simulation replayed,
            and the largest per-job wait difference between the real Mediator and the model
            (``inf`` when the two did not even start the same runs), with where it occurred.
        """
        conf = [r for r in self.replications if r.stage == "confirm"]
        med = {(r.size, r.rep): r for r in conf if r.engine == "mediator"}
        mod = {(r.size, r.rep): r for r in conf if r.engine == "model"}
        if not med:
            return None
        worst, where = -1.0, (0, 0, -1)
        for key in sorted(med):
            a, b = med[key], mod[key]
            if a.waits.shape != b.waits.shape or a.unstarted != b.unstarted:
                worst, where = math.inf, (*key, -1)
                break
            if a.waits.size:
                d = np.abs(a.waits - b.waits)
                j = int(np.argmax(d))
                if float(d[j]) > worst:
                    worst, where = float(d[j]), (*key, j)
        jobs = sorted({r.waits.size + r.unstarted for r in med.values()})
        return ConfirmationCheck(
            sizes=sorted({s for s, _ in med}),
            replications=len({k for _, k in med}),
            jobs=jobs[-1] if len(jobs) == 1 else jobs[0],
            max_abs_diff_s=max(worst, 0.0),
            worst_size=where[0],
            worst_job=where[2],
            violations=sum(r.violations for r in med.values()),
        )

    def headline(self) -> str:
        """One sentence with the answer, e.g. for a notebook's markdown."""
        q, t = _pct(self.quantile), self.wait_s
        if self.recommended is None:
            biggest = self.row(self.sizes[-1])
            return (
                f"No fleet size in {self.sizes[0]}–{self.sizes[-1]} keeps the {q} wait within "
                f"{t:g} s: at {self.sizes[-1]} nodes it is {biggest[self.column]:,.0f} s."
            )
        r = self.row(self.recommended)
        text = (
            f"{self.recommended} nodes is the smallest fleet whose {q} wait stays within {t:g} s: "
            f"{r[self.column]:,.1f} s [{r[self.column[:-2] + '_low']:,.1f}, "
            f"{r[self.column[:-2] + '_high']:,.1f}] at {r['utilization']:.0%} utilization"
        )
        smaller = [s for s in self.sizes if s < self.recommended]
        if smaller:
            below = self.row(smaller[-1])
            est, high = below[self.column], below[self.column[:-2] + "_high"]
            text += f"; {smaller[-1]} nodes give {est:,.1f} s"
            if est <= t:
                text += (
                    f", within the target as an estimate but not with confidence "
                    f"(up to {high:,.1f} s)"
                )
        return text + "."

    def plot(
        self, ax: Any = None, path: str | os.PathLike[str] | None = None, title: str | None = None
    ) -> Any:
        """The target quantile's wait per fleet size (with intervals, the target line, Erlang C
        where it applies, the Mediator's confirmation) and the utilization below it.

        Waits are drawn in the target's unit (minutes for a ten-minute target) on a linear axis
        up to three times the target; a size whose wait is above that is marked at the top edge
        with its value written beside it ("11 days"), so the sizes that matter stay readable.

        Where the chart goes: in a notebook it shows inline; with a display, ``plt.show()``
        shows it. In a plain script without a display (matplotlib's non-interactive backend,
        where ``plt.show()`` shows nothing) and without ``ax``, it is also written to
        ``capacity-plan.png`` in the working directory, and the path is printed. ``path``
        writes it there instead, in every case.

        Args:
            ax: two matplotlib axes (wait, utilization); None makes a new figure.
            path: write the chart to this file (PNG, or any format matplotlib knows by suffix).
            title: the chart's title (default: "Capacity plan: " and the scenario's name).

        Returns:
            The figure.
        """
        fig = self._figure(ax, title)
        if path is None and ax is None and _headless():
            path = os.path.abspath("capacity-plan.png")
            fig.savefig(path, dpi=110)
            print(
                f"capacity plan chart written to {path} (no display to show it on; "
                "plot(path=...) chooses the file)",
                flush=True,
            )
        elif path is not None:
            fig.savefig(path, dpi=110)
        return fig

    def _figure(self, ax: Any = None, title: str | None = None) -> Any:
        from matplotlib.ticker import PercentFormatter

        from sim import plots  # matplotlib, imported when a chart is drawn

        plt = plots.pyplot()  # (headless when no display is set)

        if ax is None:
            fig, (wait_ax, util_ax) = plt.subplots(
                2, 1, figsize=(9, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
            )
        else:
            wait_ax, util_ax = ax
            fig = wait_ax.figure
        col, base = self.column, self.column[:-2]
        g = self.grid
        # The target's unit (s, min, h): a ten-minute target reads in minutes.
        unit, name = plots.time_unit(3 * self.wait_s if self.wait_s > 0 else 180.0)
        top = 3 * self.wait_s / unit if self.wait_s > 0 else None
        est = g[col].to_numpy(dtype=float) / unit
        low = g[base + "_low"].to_numpy(dtype=float) / unit
        high = g[base + "_high"].to_numpy(dtype=float) / unit
        shown = est if top is None else np.minimum(est, top)
        err = np.vstack([shown - np.minimum(low, shown), np.minimum(high, top or np.inf) - shown])
        wait_ax.errorbar(
            g["size"],
            shown,
            yerr=np.nan_to_num(err.clip(min=0)),
            fmt="o-",
            capsize=4,
            label=f"{_ordinal(self.quantile)} wait, "
            + ("reference model" if self.engine == "model" else "real Mediator"),
        )
        if top is not None:
            over = est > top
            if over.any():
                wait_ax.plot(g["size"][over], np.full(over.sum(), top), "^", color="#4C72B0", ms=9)
                for size, value in zip(g["size"][over], est[over] * unit, strict=True):
                    wait_ax.annotate(
                        _human(value),
                        (size, top),
                        xytext=(0, -14),
                        textcoords="offset points",
                        ha="center",
                        fontsize=8,
                    )
        erl = g[f"erlang_{_pct(self.quantile)}_s"].to_numpy(dtype=float)
        if np.isfinite(erl).any():
            wait_ax.plot(g["size"], erl / unit, "--", color="#C44E52", label="Erlang C (M/M/c)")
        c = self.confirmation
        if not c.empty:
            med = c[c["engine"] == "mediator"]
            wait_ax.plot(
                med["size"],
                med[col] / unit,
                "s",
                mfc="none",
                mec="black",
                ms=11,
                label="real Mediator (confirmation)",
            )
        wait_ax.axhline(
            self.wait_s / unit, color="gray", ls=":", label=f"target {_human(self.wait_s)}"
        )
        if self.recommended is not None:
            wait_ax.axvline(self.recommended, color="#55A868", alpha=0.4, lw=6, label="recommended")
        if top is not None:
            wait_ax.set_ylim(0, top * 1.04)
        else:
            wait_ax.set_ylim(bottom=0)
        wait_ax.set_ylabel(f"{_ordinal(self.quantile)} queue wait ({name})")
        wait_ax.set_title(title or f"Capacity plan: {self.scenario_name}")
        wait_ax.legend(fontsize=8, loc="upper right")
        util_ax.plot(g["size"], g["utilization"], "o-", color="#8172B2")
        util_ax.set_ylim(0, 1)
        util_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        util_ax.set_ylabel("utilization")
        util_ax.set_xlabel("fleet size (nodes)")
        util_ax.set_xticks(self.sizes)
        fig.tight_layout()
        return fig

    def _table_html(self) -> str:
        full = self.to_frame()
        keep = ["stage", "engine", "size", "replications", "runs", "wait_mean_s"]
        keep += [f"wait_{_pct(q)}_s" for q in self._quantiles()]
        keep += ["utilization", "p_wait", "erlang_wait_mean_s", f"erlang_{_pct(self.quantile)}_s"]
        keep += ["meets_target", "max_abs_diff_s"]
        # Leave out what says nothing here: theory where M/M/c does not apply, no confirmation.
        keep = [k for k in keep if k in full and not full[k].isna().all()]
        frame = full[keep].copy()
        for q in self._quantiles():
            col, base = f"wait_{_pct(q)}_s", f"wait_{_pct(q)}"
            frame[col] = [
                f"{e:,.1f} [{lo:,.1f}, {hi:,.1f}]" if lo == lo else f"{e:,.1f}"
                for e, lo, hi in zip(
                    full[col], full[base + "_low"], full[base + "_high"], strict=True
                )
            ]
        return str(frame.to_html(index=False, float_format=lambda v: f"{v:,.3g}", na_rep="–"))

    def _quantiles(self) -> list[float]:
        return sorted({*QUANTILES, self.quantile})

    def _repr_html_(self) -> str:
        return f"<p>{html.escape(self.headline())}</p>" + self._table_html()

    def to_html(self, path: str | os.PathLike[str] | None = None) -> str:
        """A self-contained HTML report: the answer, the chart (inline PNG), the table, and how
        the numbers were made.

        Args:
            path: also write it there.

        Returns:
            The HTML document.
        """
        from sim import plots  # matplotlib, imported when a chart is drawn

        plt = plots.pyplot()
        fig = self._figure()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        png = base64.b64encode(buf.getvalue()).decode()
        method = (
            f"Grid on the {self.engine} engine with common random numbers (the same seeds at every "
            f"size); intervals are 95% confidence intervals over replications (or over batches of "
            f"one run when the workload has no randomness). The recommended size and its "
            f"neighbours ran on the real Mediator and PostgreSQL with the same seeds."
        )
        doc = "\n".join(
            [
                "<!doctype html><meta charset='utf-8'>",
                f"<title>Capacity plan: {html.escape(self.scenario_name)}</title>",
                "<style>body{font:14px system-ui;margin:2rem;max-width:1100px}"
                "table{border-collapse:collapse}td,th{padding:.2rem .5rem;"
                "border-bottom:1px solid #ddd}img{max-width:100%}</style>",
                f"<h1>Capacity plan: {html.escape(self.scenario_name)}</h1>",
                f"<p><b>{html.escape(self.headline())}</b></p>",
                f"<p>{html.escape(method)}</p>",
                f"<p>{html.escape(self.confirmation_note)}</p>",
                f"<img alt='capacity plan chart' src='data:image/png;base64,{png}'>",
                self._table_html(),
            ]
        )
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(doc + "\n")
        return doc

    def save(self, folder: str | os.PathLike[str]) -> Path:
        """Write the plan to ``folder`` so that ``CapacityPlan.load`` gives it back equal: every
        table, every replication's waits, the recommendation and the notes. The report saves
        its plan there and its capacity notebook shows it instead of planning the same workload
        again (docs/notebooks.md).

        Files: ``plan.json`` (target, sizes, engine, recommendation, notes and each
        replication's figures), ``grid.csv`` and ``confirmation.csv`` (floats written to round
        trip exactly), ``waits.npz`` (each replication's waits, by its index in ``plan.json``).

        Returns:
            The folder.
        """
        d = Path(folder)
        d.mkdir(parents=True, exist_ok=True)
        # every figure but the waits (waits.npz), numpy scalars as plain numbers
        reps = [
            plain({f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "waits"})
            for r in self.replications
        ]
        meta = {
            "format": PLAN_FORMAT,
            "target": self.target,
            "sizes": list(self.sizes),
            "engine": self.engine,
            "recommended": self.recommended,
            "scenario_name": self.scenario_name,
            "confirmation_note": self.confirmation_note,
            "replications": reps,
        }
        (d / "plan.json").write_text(json.dumps(plain(meta), indent=1) + "\n")
        self.grid.to_csv(d / "grid.csv", index=False)
        self.confirmation.to_csv(d / "confirmation.csv", index=False)
        waits: dict[str, Any] = {str(i): r.waits for i, r in enumerate(self.replications)}
        np.savez_compressed(d / "waits.npz", allow_pickle=False, **waits)
        return d

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> CapacityPlan:
        """The plan ``save`` wrote to ``folder``.

        Raises:
            ValueError: the folder holds no plan in this format (named in the message).
        """
        d = Path(folder)
        try:
            meta = json.loads((d / "plan.json").read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{d}: no saved capacity plan ({e.__class__.__name__})") from None
        if not isinstance(meta, dict) or meta.get("format") != PLAN_FORMAT:
            raise ValueError(f"{d}: not a capacity plan of format {PLAN_FORMAT}")

        def frame(name: str) -> pd.DataFrame:
            path = d / name
            if path.stat().st_size <= 1:  # an empty frame is written as a bare newline
                return pd.DataFrame()
            return pd.read_csv(path)

        try:
            with np.load(d / "waits.npz") as waits:
                reps = [
                    Replication(**r, waits=waits[str(i)])
                    for i, r in enumerate(meta["replications"])
                ]
            return cls(
                target={k: float(v) for k, v in meta["target"].items()},
                sizes=[int(s) for s in meta["sizes"]],
                engine=str(meta["engine"]),
                grid=frame("grid.csv"),
                recommended=meta["recommended"],
                confirmation=frame("confirmation.csv"),
                replications=reps,
                scenario_name=str(meta["scenario_name"]),
                confirmation_note=str(meta["confirmation_note"]),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{d}: an incomplete capacity plan ({e.__class__.__name__})") from None


# ---------------------------------------------------------------------------------------------
# Statistics of one (engine, size) cell
# ---------------------------------------------------------------------------------------------


def _nan_interval(estimate: float) -> Interval:
    return Interval(estimate, math.nan, math.nan, 0, 0.95)


def _intervals(
    reps: Sequence[Replication], quantiles: Iterable[float], batches: int
) -> dict[str, Interval]:
    """Mean and quantile intervals over replications, or over batches of one run when the
    replications are identical (a deterministic workload) or there is only one."""
    samples = [r.waits for r in reps if r.waits.size]
    if not samples:
        return {}
    distinct = len(samples) > 1 and not all(np.array_equal(samples[0], s) for s in samples[1:])
    if not distinct:
        one = samples[0]
        samples = [b for b in np.array_split(one, min(batches, one.size // 2)) if b.size]
    pooled = np.concatenate(samples)
    out: dict[str, Interval] = {}
    if len(samples) < 2:
        out["mean"] = _nan_interval(float(pooled.mean()))
        for q in quantiles:
            out[_pct(q)] = _nan_interval(float(np.quantile(pooled, q)))
        return out
    # Sectioning: centred on the pooled figure, so the estimate is always inside its interval.
    how = f"replications, {len(samples)}" if distinct else f"batches of one run, {len(samples)}"
    out["mean"] = sectioning(samples, lambda a: float(a.mean()), method=how)
    for q in quantiles:
        out[_pct(q)] = sectioning(samples, functools.partial(_quantile_of, q=q), method=how)
    return out


def _quantile_of(a: npt.NDArray[np.float64], q: float) -> float:
    return float(np.quantile(a, q))


def _erlang(scenario: Scenario, quantiles: Iterable[float]) -> dict[str, float]:
    """Erlang C's mean and quantiles for a sized scenario; NaN where M/M/c does not apply."""
    params = mmc_params(scenario)
    out = {"erlang_wait_mean_s": math.nan, "erlang_p_wait": math.nan}
    out.update({f"erlang_{_pct(q)}_s": math.nan for q in quantiles})
    if params is None:
        return out
    lam, mu, c = params
    if lam >= c * mu:
        return {k: (1.0 if k == "erlang_p_wait" else math.inf) for k in out}
    out["erlang_wait_mean_s"] = mmc_wq(lam, mu, c)
    out["erlang_p_wait"] = erlang_c(c, lam / mu)
    for q in quantiles:
        out[f"erlang_{_pct(q)}_s"] = mmc_wait_quantile(lam, mu, c, q)
    return out


def _row(
    stage: str,
    engine: str,
    size: int,
    reps: Sequence[Replication],
    scenario: Scenario,
    quantiles: Sequence[float],
    target: Mapping[str, float],
    batches: int,
) -> dict[str, Any]:
    iv = _intervals(reps, quantiles, batches)
    all_waits = np.concatenate([r.waits for r in reps]) if reps else np.array([])
    row: dict[str, Any] = {
        "stage": stage,
        "engine": engine,
        "size": size,
        "replications": len(reps),
        "runs": int(sum(r.waits.size + r.unstarted for r in reps)),
        "unstarted": int(sum(r.unstarted for r in reps)),
    }
    for key, name in [("mean", "wait_mean"), *[(_pct(q), f"wait_{_pct(q)}") for q in quantiles]]:
        i = iv.get(key, _nan_interval(math.nan))
        # Waits are never negative: a t-interval reaching below 0 is cut there.
        low = max(0.0, i.low) if math.isfinite(i.low) else i.low
        row[f"{name}_s"], row[f"{name}_low"], row[f"{name}_high"] = i.estimate, low, i.high
    row["interval_method"] = iv["mean"].method if "mean" in iv else ""
    row["p_wait"] = float((all_waits > 0).mean()) if all_waits.size else math.nan
    row["utilization"] = float(np.mean([r.utilization for r in reps])) if reps else math.nan
    row.update(_erlang(scenario, quantiles))
    q = _pct(float(target["quantile"]))
    # Conservative: the estimate *and* the upper confidence bound must be within the target;
    # unstarted runs have waited at least until the end, so a size that leaves any fails.
    worst = np.nanmax([row[f"wait_{q}_s"], row[f"wait_{q}_high"]])
    row["meets_target"] = bool(worst <= float(target["wait_s"]) and row["unstarted"] == 0)
    row["wall_s"] = float(sum(r.wall_s for r in reps))
    row["violations"] = int(sum(r.violations for r in reps))
    return row


# ---------------------------------------------------------------------------------------------
# sim.plan
# ---------------------------------------------------------------------------------------------


def sized(workload: Workload, size: int, group: int | str = 0) -> Scenario:
    """The workload's scenario with `size` nodes (see the module docstring for how).

    Args:
        workload: a ``Scenario`` or a callable ``size -> Scenario``.
        size: the fleet size.
        group: for a ``Scenario``, which node group to resize: an index or an ``id_prefix``.

    Returns:
        The scenario for that size.
    """
    if not isinstance(workload, Scenario):
        return workload(size)
    groups = list(workload.fleet.groups)
    idx = [g.id_prefix for g in groups].index(group) if isinstance(group, str) else group
    groups[idx] = dataclasses.replace(groups[idx], count=size)
    fleet = dataclasses.replace(workload.fleet, groups=tuple(groups))
    return dataclasses.replace(workload, fleet=fleet)


def _max_abs_diff(a: Replication, b: Replication) -> float:
    """Largest wait difference between two engines' runs of the same plan (inf: not the same
    runs started)."""
    if a.waits.shape != b.waits.shape or a.unstarted != b.unstarted:
        return math.inf
    return float(np.max(np.abs(a.waits - b.waits))) if a.waits.size else 0.0


def _truncated(scenario: Scenario, runs: int | None) -> Scenario:
    if runs is None or (scenario.horizon_runs is not None and scenario.horizon_runs <= runs):
        return scenario
    warmup = scenario.warmup_runs if scenario.warmup_runs < runs // 2 else runs // 10
    return dataclasses.replace(scenario, horizon_runs=runs, warmup_runs=warmup)


@dataclass(eq=False)
class _Running:
    """Tasks submitted to an executor (or, with none, to be run in-process by ``_collect``)."""

    pool: Executor | None
    tasks: list[PlanTask]
    futures: list[Future[Replication]]
    totals: dict[int, int]  # task index → runs, for the Mediator's tasks when the bar counts jobs
    folder: str | None  # the progress files' directory


def _start(pool: Executor | None, tasks: list[PlanTask], progress: bool) -> _Running:
    """Submit tasks (nothing yet when there is no executor). With ``progress``, each real-Mediator
    task writes its runs submitted so far to a file of its own, for a bar over jobs (a local
    pool or in-process only: the files are on this machine, a Dask cluster's workers are not)."""
    med = [i for i, t in enumerate(tasks) if t.engine == "mediator"]
    local = pool is None or isinstance(pool, ProcessPoolExecutor)
    folder = None
    totals: dict[int, int] = {}
    if progress and med and local:
        folder = tempfile.mkdtemp(prefix="sim-plan-progress-")
        tasks = [
            dataclasses.replace(t, progress_path=os.path.join(folder, str(i)))
            if t.engine == "mediator"
            else t
            for i, t in enumerate(tasks)
        ]
        totals = {i: _jobs(tasks[i].scenario) for i in med}
    # Submit before any bar: a fork pool starts its workers on the first submit, before tqdm's
    # monitor thread exists (forking a process with threads is unsafe).
    futures = [pool.submit(simulate_one, t) for t in tasks] if pool is not None else []
    return _Running(pool, tasks, futures, totals, folder)


def _collect(run: _Running, desc: str, progress: bool) -> list[Replication]:
    """Wait for started tasks (in the order of the list) with a progress bar: over the jobs the
    real Mediator's simulations have submitted when ``_start`` set that up (read twice a
    second), else over the tasks' completions."""
    tasks, totals = run.tasks, run.totals
    bar: Any = None
    if progress:
        from tqdm.auto import tqdm  # type: ignore[import-untyped, unused-ignore]

        if totals:
            bar = tqdm(total=sum(totals.values()), desc=desc, unit="job", smoothing=0.1)
        else:
            bar = tqdm(total=len(tasks), desc=desc, unit="sim")

    def tick(done: set[int]) -> None:
        if bar is None:
            return
        if not totals:
            bar.update(len(done) - bar.n)
            return
        n = sum(
            top if i in done else min(top, _read_progress(str(tasks[i].progress_path)))
            for i, top in totals.items()
        )
        bar.update(n - bar.n)

    try:
        if run.pool is None:
            out: list[Replication] = []
            for i, t in enumerate(tasks):
                callback = None
                if bar is not None and i in totals:
                    # In-process: the simulation's own callback drives the bar.
                    def callback(n: int, base: int = bar.n, top: int = totals[i]) -> None:
                        bar.update(base + min(n, top) - bar.n)

                out.append(_simulate(t, callback))
                tick(set(range(i + 1)))
            return out
        pending = set(run.futures)
        while pending:
            _done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            tick({i for i, f in enumerate(run.futures) if f.done()})
        return [f.result() for f in run.futures]
    finally:
        if bar is not None:
            bar.close()
        if run.folder is not None:
            shutil.rmtree(run.folder, ignore_errors=True)


def _map(
    pool: Executor | None, tasks: list[PlanTask], desc: str, progress: bool
) -> list[Replication]:
    """Run tasks (in order of the list) with a progress bar (``_start``, then ``_collect``)."""
    return _collect(_start(pool, tasks, progress), desc, progress)


def _jobs(scenario: Scenario) -> int:
    """How many runs a scenario submits (its horizon, or its materialized arrivals)."""
    if scenario.horizon_runs is not None:
        return int(scenario.horizon_runs)
    return len(materialize(scenario).arrivals)


def _check_target(target: Mapping[str, float]) -> tuple[float, float]:
    """The target's (quantile, wait_s); a wrong key is named with the keys expected."""
    keys = set(target)
    if keys != {"quantile", "wait_s"}:
        wrong = sorted(keys - {"quantile", "wait_s"})
        missing = sorted({"quantile", "wait_s"} - keys)
        what = f"unknown key {wrong[0]!r}" if wrong else f"missing key {missing[0]!r}"
        raise ValueError(
            f"target: {what}; expected {{'quantile': 0.95, 'wait_s': 600}} "
            f"(the q-quantile of the wait must be at most wait_s seconds)"
        )
    q, wait_s = float(target["quantile"]), float(target["wait_s"])
    if not 0 < q < 1 or wait_s < 0:
        raise ValueError("target needs a quantile in (0, 1) and wait_s >= 0")
    return q, wait_s


def is_deterministic(scenario: Scenario) -> bool:
    """Whether the seed changes nothing: a trace or scripted arrivals, constant (or traced)
    durations, no failures, asks or random fleet processes — replications would be identical."""
    wl = scenario.workload
    if isinstance(wl.arrivals, Recorded):  # a twin: every instant and outcome as recorded
        return wl.arrivals.scale == 1 and not scenario.fleet.random
    if not isinstance(wl.arrivals, Trace | Scripted) or scenario.fleet.random:
        return False
    for t in wl.templates:
        for st in t.steps:
            if st.kind == "ask" or st.fail_p or st.retry_p:
                return False
            if not isinstance(wl.arrivals, Trace) and not isinstance(st.duration, Constant):
                return False
    return True


#: The real Mediator's confirmation replays at most this many runs per simulation by default:
#: it checks that the Mediator schedules them exactly as the model does (same waits), which a
#: bounded prefix shows as well as the whole; the target itself is judged on the grid.
CONFIRM_RUNS = 1500


def plan(
    workload: Workload,
    target: Mapping[str, float],
    fleet_sizes: Iterable[int],
    replications: int | None = None,
    executor: Executor | None = None,
    broker: str = "model",
    *,
    engine: str | None = None,
    group: int | str = 0,
    confirm_replications: int | None = None,
    confirm_runs: int | None = CONFIRM_RUNS,
    database_url: str | None = None,
    batches: int = 10,
    progress: bool = True,
    scheduler: str | None = None,
    per_class: bool = False,
) -> CapacityPlan:
    """Find the smallest fleet whose wait quantile meets a target (docs/design.md §20).

    Args:
        workload: a ``Scenario`` whose node group ``group`` is resized, or a callable
            ``size -> Scenario``. Its seed is the base of the replication seeds.
        target: ``{"quantile": 0.95, "wait_s": 300}`` — the q-quantile of the queue wait (warm-up
            excluded) must be at most ``wait_s`` seconds.
        fleet_sizes: the sizes to simulate.
        replications: independent replications per size (common random numbers: the same seeds
            at every size). None: 1 for a workload with no randomness (a trace replay,
            ``is_deterministic``) — intervals then come from ``batches`` consecutive stretches of
            the run — else 5.
        executor: where the simulations run; None: a local process pool, one worker per core
            (or in-process when a pool cannot start safely, see ``sim.parallel.local_pool``). A Dask
            cluster's ``client.get_executor()`` works the same.
        broker: the grid's broker, ``"model"`` (fast) or ``"mediator"`` (every figure from the
            real Mediator), as ``sim.run`` takes it.
        engine: the old name of ``broker``, kept for one release.
        group: which node group a ``Scenario`` workload resizes (index or ``id_prefix``).
        confirm_replications: replications of the recommended size and its grid neighbours on
            the real Mediator, with the grid's first seeds; None: as many as the grid, at most 2;
            0: no confirmation.
        confirm_runs: cap the confirmation workload at this many runs (the first ones), to keep
            the real Mediator within a time budget (default ``CONFIRM_RUNS``; None: the whole
            workload); the model runs the same capped workload beside it, so both are shown on
            equal terms. What it confirms is ``CapacityPlan.confirmation_note``.
        database_url: the PostgreSQL server the Mediator's databases are created on (each task
            makes its own template database and its simulation's database, and drops both);
            None starts one embedded cluster for the whole plan.
        batches: how many batches make the interval when there is a single distinct replication.
        progress: progress bars (tqdm) for the grid and the confirmation, and the
            confirmation's size and meaning printed before it runs.
        scheduler: a Dask scheduler's address: the simulations run on that cluster
            (``executor`` is then ignored); give ``database_url`` a server its workers reach.
        per_class: for a fleet of several node groups, size each group (capability class)
            separately — see ``CapacityPlan.per_class``.

    Returns:
        The ``CapacityPlan``.
    """
    engine = broker if engine is None else engine
    if engine not in BROKERS:
        raise ValueError(f"broker {engine!r} not in {BROKERS}")
    q, wait_s = _check_target(target)
    if per_class:
        if not isinstance(workload, Scenario):
            raise ValueError("per_class needs a Scenario (its node groups are the classes)")
        # a workload the seed changes nothing of (a twin, a trace) needs one replication
        n_reps = replications or (1 if is_deterministic(workload) else 5)
        return plan_classes(workload, target, fleet_sizes, n_reps)  # type: ignore[return-value]
    sizes = sorted(set(int(s) for s in fleet_sizes))
    if replications is None:
        first = sized(workload, sizes[0], group) if sizes else None
        replications = 1 if first is not None and is_deterministic(first) else 5
    if not sizes or sizes[0] < 1 or replications < 1:
        raise ValueError("need fleet sizes >= 1 and replications >= 1")
    tgt = {"quantile": q, "wait_s": wait_s}
    quantiles = sorted({*QUANTILES, q})
    scenarios = {s: sized(workload, s, group) for s in sizes}
    base_seed = scenarios[sizes[0]].seed
    seeds = _seeds(base_seed, replications)
    n_confirm = min(replications, 2) if confirm_replications is None else confirm_replications

    client: Any = None
    if scheduler is not None:
        from distributed import Client

        client = Client(scheduler)  # type: ignore[no-untyped-call, unused-ignore]
        executor = client.get_executor()
    own_pool = executor is None
    pool = executor if executor is not None else local_pool(len(sizes) * replications)
    embedded: Any = None

    def server() -> str:
        # One embedded cluster for the whole plan, started only if the Mediator runs at all.
        nonlocal embedded
        if database_url is not None:
            return database_url
        if embedded is None:
            from mediator.pg import EmbeddedPostgres

            embedded = EmbeddedPostgres(database="postgres")
        return str(embedded.url("postgres"))

    def tasks(at: Iterable[int], eng: str, n: int, runs: int | None) -> list[PlanTask]:
        url = server() if eng == "mediator" else None
        return [
            PlanTask(
                dataclasses.replace(_truncated(scenarios[s], runs), seed=seeds[k]), s, k, eng, url
            )
            for s in at
            for k in range(n)
        ]

    try:
        grid_reps = _map(pool, tasks(sizes, engine, replications, None), "grid", progress)
        rows = [
            _row(
                "grid",
                engine,
                s,
                [r for r in grid_reps if r.size == s],
                scenarios[s],
                quantiles,
                tgt,
                batches,
            )
            for s in sizes
        ]
        grid = pd.DataFrame(rows)
        meeting = grid.loc[grid["meets_target"], "size"]
        recommended = int(meeting.min()) if len(meeting) else None

        grid_plan = CapacityPlan(
            target=tgt,
            sizes=sizes,
            engine=engine,
            grid=grid,
            recommended=recommended,
            confirmation=pd.DataFrame(),
            replications=grid_reps,
            scenario_name=scenarios[sizes[0]].name,
            confirmation_note="No confirmation on the real Mediator.",
        )
        # A grid on the Mediator needs no confirmation: it already is the real thing.
        if recommended is None or not n_confirm or engine != "model":
            return grid_plan
        url = server()
        pending = _start_confirmation(
            grid_plan, scenarios, seeds, min(n_confirm, replications), confirm_runs, url, pool,
            batches, progress,
        )  # fmt: skip
        return pending.result(progress)
    finally:
        if own_pool and pool is not None:
            pool.shutdown()
        if client is not None:
            client.close()
        if embedded is not None:
            embedded.stop()


@dataclass(eq=False)
class PendingConfirmation:
    """A confirmation submitted to an executor (``start_confirmation``): the recommended size
    and its grid neighbours on the real Mediator, the model beside them. ``result()`` waits for
    it (with a progress bar over the jobs) and returns the confirmed plan.

    Attributes:
        note: what it runs and what it shows (``CapacityPlan.confirmation_note``).
        jobs: jobs each real-Mediator simulation replays.
        sizes: the fleet sizes it replays.
    """

    grid_plan: CapacityPlan
    scenarios: dict[int, Scenario]  # by size, as confirmed (capped at ``runs``)
    running: _Running
    note: str
    jobs: int
    sizes: list[int]
    batches: int

    def result(self, progress: bool = True) -> CapacityPlan:
        """Wait for the confirmation and return the plan with it (``confirmation``,
        ``confirmation_check()``)."""
        p = self.grid_plan
        reps = [
            dataclasses.replace(r, stage="confirm")
            for r in _collect(self.running, "confirmation on the real Mediator", progress)
        ]
        quantiles = sorted({*QUANTILES, p.quantile})
        crows: list[dict[str, Any]] = []
        for s in self.sizes:
            med = [r for r in reps if r.size == s and r.engine == "mediator"]
            mod = [r for r in reps if r.size == s and r.engine == "model"]
            diff = max(_max_abs_diff(a, b) for a, b in zip(med, mod, strict=True))
            sc = self.scenarios[s]
            for eng, rs in (("mediator", med), ("model", mod)):
                row = _row("confirm", eng, s, rs, sc, quantiles, p.target, self.batches)
                crows.append({**row, "max_abs_diff_s": diff})
        return dataclasses.replace(
            p,
            confirmation=pd.DataFrame(crows),
            replications=[*p.replications, *reps],
            confirmation_note=self.note,
        )


def _start_confirmation(
    p: CapacityPlan,
    scenarios: Mapping[int, Scenario],
    seeds: Sequence[int],
    n: int,
    runs: int | None,
    database_url: str,
    pool: Executor | None,
    batches: int,
    progress: bool,
) -> PendingConfirmation:
    assert p.recommended is not None
    i = p.sizes.index(p.recommended)
    near = p.sizes[max(0, i - 1) : i + 2]
    capped = {s: _truncated(scenarios[s], runs) for s in near}
    # The Mediator's simulations first: they are the long ones, so a pool starts them first.
    work = [
        PlanTask(dataclasses.replace(capped[s], seed=seeds[k]), s, k, eng, url)
        for eng, url in (("mediator", database_url), ("model", None))
        for s in near
        for k in range(n)
    ]
    jobs = _jobs(work[0].scenario)
    note = _confirm_note(near, n, jobs, capped[near[0]] is not scenarios[near[0]])
    if progress:
        print(note, flush=True)
    return PendingConfirmation(p, capped, _start(pool, work, progress), note, jobs, near, batches)


def start_confirmation(
    p: CapacityPlan,
    workload: Workload,
    executor: Executor | None,
    database_url: str,
    *,
    group: int | str = 0,
    replications: int | None = None,
    runs: int | None = None,
    batches: int = 10,
    progress: bool = True,
) -> PendingConfirmation | None:
    """Submit the confirmation of a plan made with ``confirm_replications=0`` and return at once,
    so other work can share the executor meanwhile (the report runs its scenarios beside it);
    ``.result()`` waits for it. ``plan`` itself confirms this way and waits at once.

    Args:
        p: the grid's plan (on the model, for ``workload``).
        workload: the same workload the plan was made for.
        executor: where the simulations run (None: in-process, when ``result()`` is called).
        database_url: the PostgreSQL server the Mediator's databases are created on.
        group: as for ``plan``.
        replications: replications per size (None: as many as the grid, at most 2).
        runs: cap each simulation at this many runs (None, the default here: every job).
        batches: as for ``plan``.
        progress: print what it runs now, and show a bar over the jobs in ``result()``.

    Returns:
        The running confirmation, or None when there is nothing to confirm (no size met the
        target, or the grid already ran on the Mediator).
    """
    if p.recommended is None or p.engine != "model":
        return None
    grid_reps = int(p.grid["replications"].iloc[0])
    n = min(grid_reps, 2) if replications is None else min(replications, grid_reps)
    scenarios = {s: sized(workload, s, group) for s in p.sizes}
    seeds = _seeds(scenarios[p.sizes[0]].seed, grid_reps)
    return _start_confirmation(
        p, scenarios, seeds, n, runs, database_url, executor, batches, progress
    )


def _confirm_note(near: Sequence[int], n: int, jobs: int, capped: bool) -> str:
    """What the confirmation runs and what it shows (printed before it runs, issue 14 §4)."""
    size = f"the first {jobs:,} runs" if capped else f"all {jobs:,} runs"
    return (
        f"Confirmation on the real Mediator: sizes {', '.join(map(str, near))}, {size}, "
        f"{n} replication(s), side by side, beside the model on the same runs. It checks that the "
        f"Mediator schedules these runs exactly as the model did (the largest per-run wait "
        f"difference); the target itself is judged on the grid. To shorten it: confirm_runs=N "
        f"(--confirm-runs N); to skip it: confirm_replications=0 (--confirm-replications 0)."
    )
