"""Measurement: the tables a simulation produces, and how two of them are compared (issue 14 §1).

Why its own module: the reference model (`sim.brokers.model`) is the scheduling policy and nothing
else; what is recorded about a run — the `runs`, `promotions`, `queue`, `stuck`, `leases` and
`events` tables, the counts, `summary()` — is the same for every broker, so there is one `Result`
type (the model fills it from memory, `sim.brokers.readback` from the Mediator's database, adding
what only the real database shows: `violations`, a `manifest`), and `promotions_diff` is the
differential test's comparison. Times arrive as integer microseconds (`sim.platform.core`) and
leave as float seconds.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter as _get
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd  # type: ignore[import-untyped, unused-ignore]

from sim.analysis import wait_statistics
from sim.inputs.scenarios import Scenario
from sim.inputs.theory import mmc_params
from sim.inputs.workload import Arrival, Plan, materialize
from sim.platform.core import US, gc_paused

PASSED, FAILED = "PASSED", "FAILED"


@dataclass(eq=False)
class Result:
    """What a simulation produced, whichever broker ran it; times in seconds of virtual time.

    Attributes:
        runs: one row per run — run_id, template, created_at, started_at, ended_at, wait_s,
            run_s, state, verdict, width, nodes (distinct node ids, sorted, comma-joined),
            reject, warmup (among the first `warmup_runs`), source_id (the run's id in the
            replayed trace; None when the workload is not a trace).
        promotions: every start of a run in order — at_s, run_id, nodes, how (`created`: at
            submit, 201; `promoted`: by a sweep), wake (the wake point of that sweep; 0 at submit).
            The differential test compares (at_s, run_id, nodes) with the real Mediator's.
        events: at_s, kind, run_id, node_id, detail — the Mediator's event kinds plus `fleet`
            (a fleet event applied or ignored) and `wake` (a sweep ran; detail = its point).
            Built on first access (it is by far the largest table).
        queue: at_s, length — the QUEUED count after every change.
        stuck: run_id, start_s, end_s, duration_s, open (still stuck when the simulation ended).
        leases: node_id, run_id, granted_at, released_at (NaN if still held at the end).
        counts: Mediator calls by kind (submit, advert, claim, report, answer, reaper passes
            that could matter, reaper_ticks that the real timer makes, wakes, promotions).
        end_s: where the simulation stopped.
        scenario_hash: `Scenario.scenario_hash()` of the plan's scenario.
        wall_s: how long the simulation took (wall clock; for virtual seconds per wall second).
        nodes: node_id, label, capabilities (canonical JSON: nodes with equal text form one
            capability class).
        violations: I1–I7 violations the real Mediator's run found by SQL (must be empty; the
            model checks none).
        manifest: seed, scenario hash, versions (a run of the real Mediator).
        mediator_s: wall seconds spent inside the Mediator's calls (a run of the real Mediator).
        scenario: the simulated scenario.
    """

    runs: pd.DataFrame
    promotions: pd.DataFrame
    event_rows: list[tuple[int, str, str, str, str]] = field(repr=False)
    queue: pd.DataFrame
    stuck: pd.DataFrame
    leases: pd.DataFrame
    counts: dict[str, int] = field(default_factory=dict)
    end_s: float = 0.0
    scenario_hash: str = ""
    wall_s: float = 0.0
    nodes: pd.DataFrame = field(default_factory=pd.DataFrame)
    violations: list[str] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)
    mediator_s: float = 0.0
    scenario: Scenario | None = None

    @functools.cached_property
    def events(self) -> pd.DataFrame:
        """The event log as a DataFrame (see the class docstring)."""
        with gc_paused():
            return frame(
                self.event_rows, ("at_s", "kind", "run_id", "node_id", "detail"), ("at_s",)
            )

    def advert_share(self) -> float:
        """Adverts as a share of all Mediator calls the real engine would make (design.md §20)."""
        c = self.counts
        calls = sum(c.get(k, 0) for k in ("submit", "advert", "claim", "report", "answer"))
        calls += c.get("reaper_ticks", 0)
        return c.get("advert", 0) / calls if calls else 0.0

    def utilization(self) -> pd.DataFrame:
        """Per node: seconds it held a lease (busy_s) and that share of [0, end_s].

        Group by `capabilities` for the utilization per capability class.
        """
        leases = self.leases
        end = self.end_s
        held = (leases["released_at"].fillna(end).clip(upper=end) - leases["granted_at"]).clip(
            lower=0
        )
        busy = held.groupby(leases["node_id"]).sum()
        out = self.nodes[["node_id", "capabilities"]].copy()
        out["busy_s"] = out["node_id"].map(busy).fillna(0.0).astype(float)
        out["utilization"] = out["busy_s"] / end if end else 0.0
        return out

    def summary(self, digits: int | None = 4) -> dict[str, Any]:
        """Counts, throughput, waits of the measured runs with intervals, utilization, stuck
        time, advert share, virtual seconds per wall second.

        The wait intervals come from one run, by batch means and batch quantiles
        (`sim.analysis.wait_statistics`; each `Interval` names its method), which hold for
        correlated waits; a run too short for its load adds `warnings` (the command line
        prints them). Replications (`replicate`) are stronger still.

        Args:
            digits: significant digits every float (and every interval's bounds) is rounded to,
                so the dict reads at a glance (``4.444``, not ``4.444444444443``); figures of
                ``10**digits`` and more keep no decimals. None: full precision (what
                ``save`` writes to ``summary.json`` and what the gate compares).
        """
        full = self._summary()
        return full if digits is None else rounded(full, digits)

    def _summary(self) -> dict[str, Any]:
        runs = self.runs[~self.runs["warmup"]]
        waits = runs["wait_s"].dropna().to_numpy(dtype=float)
        out: dict[str, Any] = {
            "runs": len(self.runs),
            "measured": len(runs),
            "by_verdict": self.runs["verdict"].value_counts().to_dict(),
            "end_s": self.end_s,
            "throughput_per_s": float(runs["state"].isin([PASSED, FAILED]).sum() / self.end_s)
            if self.end_s
            else 0.0,
            "stuck_s": float(self.stuck["duration_s"].sum()),
            "advert_share": self.advert_share(),
        }
        if not self.nodes.empty and self.end_s:
            out["utilization"] = float(self.utilization()["utilization"].mean())
        if self.wall_s:
            out["virtual_s_per_wall_s"] = self.end_s / self.wall_s
        out.update(wait_statistics(waits))
        return out

    # ---- the decisions table (what the CI gate, sim.outputs.gate, compares) --------------------
    def decisions(self) -> pd.DataFrame:
        """Every scheduling decision, in the order the Mediator made it: the CI gate's input.

        One row per start of a run — at submit (``how`` = ``created``: a 201) or by a promotion
        sweep (``promoted``) — with ``at_s`` (virtual seconds, whole microseconds), ``run_id``,
        ``how``, ``roles`` (``role=node`` pairs sorted by role, space-separated) and ``queued``
        (the QUEUED runs at that moment, this one included when it was queued). The gate
        (``sim.outputs.gate``, issue 16) depends on this table, ``queued_before``, ``summary()``
        and ``violations`` only, so the engine behind them can change freely. Read back from the
        real Mediator (`sim.brokers.readback`).
        """
        return self.promotions[["at_s", "run_id", "how", "roles", "queued"]].reset_index(drop=True)

    def queued_before(self, decision: int, at_s: float | None = None) -> list[str]:
        """The QUEUED run ids, in queue order, just before decision number ``decision`` (an index
        into ``decisions()``) — or at the instant ``at_s``, if that comes first."""
        limit = None if at_s is None else round(at_s * US)
        queued: dict[str, None] = {}
        made = 0
        for at_us, kind, run_id, _node, detail in self.event_rows:
            if limit is not None and at_us > limit:
                break
            state = json.loads(detail).get("state") if kind == "submitted" else None
            if state == "RUNNING" or kind == "promoted":
                if made == decision:
                    break
                made += 1
            if state == "QUEUED":
                queued[run_id] = None
            elif kind in ("promoted", "settled"):
                queued.pop(run_id, None)
        return list(queued)

    # ---- theory and charts --------------------------------------------------------------------
    def mmc_params(self) -> tuple[float, float, int] | None:
        """(λ, μ, c) when the scenario is M/M/c (`sim.inputs.theory`), for the charts' theory."""
        return mmc_params(self.scenario)

    def planned_fleet_events(self) -> list[tuple[str, str, float]]:
        """(node_id, kind, at_s) of the scenario's fleet events, as the loop applies them: the
        charts' fleet windows when the result has no event log."""
        sc = self.scenario
        if sc is None or not (sc.fleet.events or sc.fleet.random):
            return []
        return [(e.node_id, e.kind, e.at_s) for e in materialize(sc).fleet_events]

    def plot_waits(self, ax: Any = None) -> Any:
        from sim import plots  # matplotlib, imported when a chart is drawn

        return plots.waits(self, ax)

    def plot_queue(self, ax: Any = None) -> Any:
        from sim import plots  # matplotlib, imported when a chart is drawn

        return plots.queue(self, ax)

    def plot_gantt(self, ax: Any = None) -> Any:
        from sim import plots  # matplotlib, imported when a chart is drawn

        return plots.gantt(self, ax)

    def save(self, out: str | Path) -> Path:
        """CSV tables, PNG charts, ``summary.json`` and ``manifest.json`` into ``out``."""
        from sim import plots  # matplotlib, imported when a chart is drawn

        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        for name in ("runs", "promotions", "queue", "stuck", "leases"):
            getattr(self, name).to_csv(d / f"{name}.csv", index=False)
        self.events.to_csv(d / "events.csv", index=False)
        self.utilization().to_csv(d / "utilization.csv", index=False)
        summary = plain(self.summary(digits=None))
        (d / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (d / "manifest.json").write_text(json.dumps(self.manifest, indent=2) + "\n")
        (d / "violations.txt").write_text("".join(v + "\n" for v in self.violations))
        plots.save_all(self, d)
        return d


# One result type for every broker; the old names stay importable for one release.
ModelResult = Result
SimResult = Result


def round_to(x: float, digits: int) -> float:
    """`x` to `digits` significant digits (``4.444444 → 4.444``, ``0.0012345 → 0.001235``), but
    never rounding the whole part (``123456.7 → 123457``); inf and NaN unchanged."""
    if not math.isfinite(x) or x == 0:
        return x
    return round(x, max(0, digits - 1 - math.floor(math.log10(abs(x)))))


def rounded(obj: Any, digits: int) -> Any:
    """`obj` with every float — in dicts, lists and intervals — rounded by `round_to`."""
    if isinstance(obj, bool | int | str) or obj is None:
        return obj
    if isinstance(obj, float | np.floating):
        return round_to(float(obj), digits)
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, list):
        return [rounded(v, digits) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {
            f.name: rounded(getattr(obj, f.name), digits)
            for f in dataclasses.fields(obj)
            if isinstance(getattr(obj, f.name), float)
        }
        return dataclasses.replace(obj, **fields)
    return obj


def plain(obj: Any) -> Any:
    """`obj` with named tuples, dataclasses and NumPy scalars turned into plain JSON values."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    if hasattr(obj, "_asdict"):
        return plain(obj._asdict())
    if hasattr(obj, "__dataclass_fields__"):
        return {k: plain(getattr(obj, k)) for k in obj.__dataclass_fields__}
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


class NodeRecord(Protocol):
    @property
    def node_id(self) -> str: ...


class RunRecord(Protocol):
    """What `model_result` reads of one run (µs times, -1 for never)."""

    @property
    def arrival(self) -> Arrival: ...
    @property
    def created(self) -> int: ...
    @property
    def started(self) -> int: ...
    @property
    def ended(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def verdict(self) -> str: ...
    @property
    def reject(self) -> str: ...
    @property
    def nodes(self) -> Sequence[NodeRecord]: ...


def model_result(
    plan: Plan,
    runs: Sequence[RunRecord],
    *,
    promotions: list[tuple[int, str, str, str, int]],
    queue: list[tuple[int, int]],
    stuck: list[tuple[str, int, int, bool]],
    leases: list[tuple[str, str, int, int]],
    event_rows: list[tuple[int, str, str, str, str]],
    counts: dict[str, int],
    end_us: int,
) -> Result:
    """The tables of one simulation from what the broker and the loop recorded (µs rows).

    Args:
        plan: the simulated plan (node list, source ids, warm-up count).
        runs: one record per submitted run, in arrival order.
        promotions: (at, run_id, nodes, how, wake) per start of a run.
        queue: (at, QUEUED count) after every change.
        stuck: (run_id, start, end, open) — `sim.platform.driver.Driver.stuck_rows`, in their order.
        leases: (node_id, run_id, granted_at, released_at; -1 while held).
        event_rows: the event log (may be empty).
        counts: calls by kind.
        end_us: where the simulation stopped.
    """
    warmup = plan.scenario.warmup_runs
    n = len(runs)
    created = _seconds(list(map(_get("created"), runs)))
    started = _seconds(list(map(_get("started"), runs)))
    ended = _seconds(list(map(_get("ended"), runs)))
    nodes = list(map(_get("nodes"), runs))
    runs_df = pd.DataFrame(
        {
            "run_id": list(map(_get("arrival.run_id"), runs)),
            "template": list(map(_get("arrival.template"), runs)),
            "created_at": created,
            "started_at": started,
            "ended_at": ended,
            "wait_s": started - created,
            "run_s": ended - started,
            "state": list(map(_get("state"), runs)),
            "verdict": [v or None for v in map(_get("verdict"), runs)],
            "width": np.fromiter(map(len, nodes), dtype=np.int64, count=n),
            "nodes": list(map(_ids, nodes)),
            "reject": [v or None for v in map(_get("reject"), runs)],
            "warmup": np.arange(n) < warmup,
            "source_id": _source_ids(plan, n),
        }
    )
    promos = frame(promotions, ("at_s", "run_id", "nodes", "how", "wake"), ("at_s",))
    queue_df = frame(queue, ("at_s", "length"), ("at_s",))
    stuck_df = frame(stuck, ("run_id", "start_s", "end_s", "open"), ("start_s", "end_s"))
    stuck_df.insert(3, "duration_s", stuck_df["end_s"] - stuck_df["start_s"])
    leases_df = frame(leases, ("node_id", "run_id", "granted_at", "released_at"),
                       ("granted_at", "released_at"))  # fmt: skip
    return Result(
        runs=runs_df,
        promotions=promos,
        event_rows=event_rows,
        queue=queue_df,
        stuck=stuck_df,
        leases=leases_df,
        counts=counts,
        end_s=end_us / US,
        scenario_hash=plan.scenario.scenario_hash(),
        nodes=nodes_frame(plan),
        scenario=plan.scenario,
    )


def nodes_frame(plan: Plan) -> pd.DataFrame:
    """node_id, label, capabilities (canonical JSON: equal text, one capability class)."""
    return pd.DataFrame(
        {
            "node_id": [n.node_id for n in plan.nodes],
            "label": [n.label for n in plan.nodes],
            "capabilities": [json.dumps(n.capabilities, sort_keys=True) for n in plan.nodes],
        }
    )


def _seconds(values: list[int]) -> np.ndarray:
    """Integer µs → float seconds; negative (never happened) → NaN."""
    a = np.asarray(values, dtype=np.int64)
    out = a / US
    out[a < 0] = np.nan
    return out


def _source_ids(plan: Plan, n: int) -> Any:
    """The trace's own ids of the first `n` arrivals (issue 14 §7), or None for each run."""
    if plan.source_ids:
        return list(plan.source_ids[:n])
    return np.full(n, None, dtype=object)


def _ids(nodes: Sequence[NodeRecord]) -> str:
    if len(nodes) == 1:
        return nodes[0].node_id
    return ",".join(sorted(n.node_id for n in nodes))


def frame(
    rows: list[tuple[Any, ...]], columns: tuple[str, ...], times: tuple[str, ...]
) -> pd.DataFrame:
    """Rows → DataFrame by columns (much faster than row-wise), µs columns → seconds."""
    data: dict[str, Any] = {}
    cols = zip(*rows, strict=True) if rows else ([] for _ in columns)
    for name, col in zip(columns, cols, strict=True):  # (zip transposes in C)
        data[name] = _seconds(list(col)) if name in times else list(col)
    return pd.DataFrame(data, columns=list(columns))


def promotions_diff(a: pd.DataFrame, b: pd.DataFrame, tol_s: float = 0.0) -> str | None:
    """The first difference between two promotion lists (at_s, run_id, nodes), or None.

    For the differential test: both lists are compared row by row in their recorded order.

    Args:
        a: the model's `promotions`.
        b: the other engine's, with at least the columns at_s, run_id, nodes.
        tol_s: tolerance on times (0: exact, as integer-microsecond clocks allow).

    Returns:
        A one-line description of the first diverging row, or None if they agree.
    """
    rows_a = list(a[["at_s", "run_id", "nodes"]].itertuples(index=False, name=None))
    rows_b = list(b[["at_s", "run_id", "nodes"]].itertuples(index=False, name=None))
    for i, (x, y) in enumerate(itertools.zip_longest(rows_a, rows_b)):
        if x is None or y is None or x[1:] != y[1:] or abs(x[0] - y[0]) > tol_s:
            return f"promotion #{i}: {x} != {y}"
    return None
