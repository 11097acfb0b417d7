"""Materialize a scenario into a plan: every arrival and fleet event, fully pre-sampled.

The reference model (`sim.brokers.model`) and the real-Mediator engine both consume the *same*
`Plan`, so the only thing that can make them differ is the scheduler — which is what the
differential test of docs/design.md §20 is about. Everything random is drawn here, up front, from
separate streams (design.md §20): arrival times and template choice, step durations, step
failures/retries, human answers, and fleet events each come from their own
`numpy.random.SeedSequence` child, keyed by (stream, template, step) or (stream, process, node). So
changing the fleet size leaves the arrival sequence and every duration untouched (common random
numbers), and changing a failure probability leaves the durations untouched.

Times are in seconds, rounded to whole microseconds: an engine should convert them with
`round(s * 1_000_000)` and do its clock arithmetic in integers, which is also PostgreSQL's
timestamp resolution — the model and the database then agree on every tie.
"""

from __future__ import annotations

import dataclasses
import gc
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sim.inputs import traces, twin
from sim.inputs.scenarios import (
    Burst,
    FleetEvent,
    NodeSpec,
    Piecewise,
    Poisson,
    Recorded,
    Scenario,
    Scripted,
    Template,
    Trace,
)
from sim.inputs.twin import Answer as Answer  # exported: the run records are this module's API
from sim.inputs.twin import Attempt as Attempt

# Stream numbers: the first element of every spawn key (design.md §20: separate random streams).
ARRIVALS, DURATIONS, FAILURES, ANSWERS, FLEET = range(5)

PASS, FAIL, RETRY = "pass", "fail", "retry"


@dataclass(frozen=True, slots=True)
class Arrival:
    """One run of the plan.

    Attributes:
        at_s: submit time (seconds of virtual time, whole microseconds).
        run_id: `r0000000`, `r0000001`, … — sorts in arrival order, because FIFO ties break on
            run_id (R6) and both engines must see the same order.
        template: the template's name (also the contract's `work_id`).
        contract: the JSON contract the Mediator receives, `run_id` set. Nested objects are shared
            between runs of one template: treat it as read-only.
        step_outcomes: per step, in `contract["steps"]` order, the attempts in order: attempts stop
            at the first `pass` or `fail`, or after `max_attempts` (the Mediator turns a `retry`
            on the last attempt into a failure). `()` for ask steps.
        ask_answers: per step, in the same order, the `Answer` of an ask step; None for exec steps.
    """

    at_s: float
    run_id: str
    template: str
    contract: dict[str, Any]
    step_outcomes: tuple[tuple[Attempt, ...], ...]
    ask_answers: tuple[Answer | None, ...]


@dataclass(frozen=True)
class Plan:
    """A scenario made concrete: nodes, arrivals in submit order, fleet events in apply order.

    `source_ids`, for a trace replay, holds each arrival's id in the trace (a CSV's `run_id`,
    an SWF job number), in arrival order, so results join back to the user's data (issue 14
    §7); empty otherwise. The plan's own run_ids are renumbered: they must sort in arrival order.
    """

    scenario: Scenario
    nodes: tuple[NodeSpec, ...]
    arrivals: tuple[Arrival, ...]
    fleet_events: tuple[FleetEvent, ...]
    source_ids: tuple[str, ...] = ()

    @property
    def end_s(self) -> float | None:
        """Where the simulation stops (the scenario's `horizon_s`), or None: when quiescent."""
        return self.scenario.horizon_s


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


Floats = npt.NDArray[np.float64]


def _us(x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Round seconds to whole microseconds (the clock's resolution, and PostgreSQL's)."""
    out: npt.NDArray[np.float64] = np.round(np.asarray(x, dtype=float) * 1e6) / 1e6
    return out


def _us1(x: float) -> float:
    return round(x * 1e6) / 1e6


def _poisson_times(
    rate: float, n: int | None, until: float | None, rng: np.random.Generator
) -> Floats:
    """Cumulative Exp(1/rate) gaps: the first n, or all below `until`."""
    if n is not None:
        t = np.cumsum(rng.exponential(1.0 / rate, n))
        return t if until is None else t[t < until]
    assert until is not None
    chunks, last = [], 0.0
    size = max(1024, int(rate * until * 1.1) + 16)
    while last < until:
        c = last + np.cumsum(rng.exponential(1.0 / rate, size))
        chunks.append(c)
        last = float(c[-1])
    t = np.concatenate(chunks)
    return t[t < until]


def _piecewise_times(
    proc: Piecewise, n: int | None, until: float | None, rng: np.random.Generator
) -> np.ndarray:
    """Non-homogeneous Poisson by inversion: unit-rate arrivals mapped through Λ⁻¹."""
    pts = sorted(proc.points)
    if not pts or pts[0][0] > 0:
        pts = [(0.0, pts[0][1] if pts else 0.0), *pts]
    ts = np.array([p[0] for p in pts], dtype=float)
    rates = np.array([p[1] for p in pts], dtype=float)
    if np.any(rates < 0):
        raise ValueError("piecewise rates must be non-negative")
    if proc.period_s is None:
        if rates[-1] <= 0 and n is not None and until is None:
            raise ValueError("piecewise: the last rate is 0, so n arrivals may never come")
        seg = np.diff(ts)
        lam = np.concatenate([[0.0], np.cumsum(rates[:-1] * seg)])

        def inverse(u: Floats) -> Floats:
            out = np.asarray(np.interp(u, lam, ts), dtype=np.float64)
            beyond = u > lam[-1]
            if rates[-1] > 0:
                out[beyond] = ts[-1] + (u[beyond] - lam[-1]) / rates[-1]
            else:
                out[beyond] = np.inf
            return out
    else:
        period = float(proc.period_s)
        edges = np.concatenate([ts, [period]])
        per = np.concatenate([[0.0], np.cumsum(rates * np.diff(edges))])
        if per[-1] <= 0:
            raise ValueError("piecewise: the rate is 0 over the whole period")

        def inverse(u: Floats) -> Floats:
            k = np.floor(u / per[-1])
            return np.asarray(k * period + np.interp(u - k * per[-1], per, edges), np.float64)

    u = _poisson_times(1.0, n, None, rng) if n is not None else None
    if u is None:
        assert until is not None
        chunks, last_t, last_u = [], 0.0, 0.0
        while last_t < until:
            c = last_u + np.cumsum(rng.exponential(1.0, 4096))
            chunks.append(c)
            last_u = float(c[-1])
            last_t = float(inverse(np.array([last_u]))[0])
        u = np.concatenate(chunks)
    t = inverse(u)
    t = t[np.isfinite(t)]
    return t if until is None else np.asarray(t[t < until], dtype=np.float64)


def _arrival_times(scenario: Scenario) -> tuple[np.ndarray, np.ndarray | None, Any]:
    """(times, template index per arrival or None, trace rows or None)."""
    proc = scenario.workload.arrivals
    n, until, seed = scenario.horizon_runs, scenario.horizon_s, scenario.seed
    names = [t.name for t in scenario.workload.templates]
    if isinstance(proc, Poisson):
        return _poisson_times(proc.rate, n, until, _rng(seed, ARRIVALS, 0)), None, None
    if isinstance(proc, Piecewise):
        return _piecewise_times(proc, n, until, _rng(seed, ARRIVALS, 0)), None, None
    if isinstance(proc, Burst):
        base = _poisson_times(proc.rate, n, until, _rng(seed, ARRIVALS, 0))
        extra = proc.at_s + proc.spread_s * np.sort(_rng(seed, ARRIVALS, 2).random(proc.count))
        t = np.sort(np.concatenate([base, extra]), kind="stable")
        t = t if until is None else t[t < until]
        return (t if n is None else t[:n]), None, None
    if isinstance(proc, Scripted):
        items = sorted(proc.items, key=lambda it: it[0])
        unknown = {name for _, name in items} - set(names)
        if unknown:
            raise ValueError(f"scripted arrivals name unknown templates {sorted(unknown)}")
        t = np.array([it[0] for it in items], dtype=float)
        idx = np.array([names.index(it[1]) for it in items], dtype=int)
        keep = np.ones(len(t), bool) if until is None else t < until
        t, idx = t[keep], idx[keep]
        return (t, idx, None) if n is None else (t[:n], idx[:n], None)
    if isinstance(proc, Trace):
        if proc.format == "swf":
            df = traces.read_swf(proc.path)
            rows = df.assign(duration_s=df["run_s"], run_id=df["job"].astype(str))
            rows = rows[["submit_s", "duration_s", "run_id"]]
        elif proc.format == "csv":
            if proc.path is None:
                raise ValueError("a CSV trace needs a path")
            rows = traces.read_csv_trace(proc.path)
        else:
            raise ValueError(f"trace format {proc.format!r} not in ('swf', 'csv')")
        t = rows["submit_s"].to_numpy(dtype=float) * proc.time_scale
        keep = np.ones(len(t), bool) if until is None else t < until
        rows = rows[keep]
        if n is not None:
            rows = rows.iloc[:n]
        t = rows["submit_s"].to_numpy(dtype=float) * proc.time_scale
        return t, np.zeros(len(t), dtype=int), rows
    raise TypeError(f"unknown arrival process {proc!r}")


def _template_choice(scenario: Scenario, n: int) -> np.ndarray:
    tpls = scenario.workload.templates
    if len(tpls) == 1:
        return np.zeros(n, dtype=int)
    w = np.array([t.weight for t in tpls], dtype=float)
    return _rng(scenario.seed, ARRIVALS, 1).choice(len(tpls), size=n, p=w / w.sum())


def _outcomes(u: np.ndarray, fail_p: float, retry_p: float) -> np.ndarray:
    """0 pass, 1 fail, 2 retry per uniform draw."""
    return np.where(u < fail_p, 1, np.where(u < fail_p + retry_p, 2, 0))


_OUTCOME = (PASS, FAIL, RETRY)


def _attempts_for(
    tpl: Template, k: int, n_k: int, seed: int, max_attempts: int, trace_d: np.ndarray | None
) -> tuple[list[list[tuple[Attempt, ...]]], list[list[Answer | None]]]:
    """Per step (outer), per run of this template (inner): attempts and answers."""
    attempts: list[list[tuple[Attempt, ...]]] = []
    answers: list[list[Answer | None]] = []
    for j, step in enumerate(tpl.steps):
        if step.kind == "ask":
            delay = _us(np.maximum(step.answer_delay.sample(_rng(seed, ANSWERS, k, j), n_k), 0))
            ok = _rng(seed, ANSWERS, k, j, 1).random(n_k) < step.ok_p
            attempts.append([()] * n_k)
            answers.append([Answer(float(d), bool(o)) for d, o in zip(delay, ok, strict=True)])
            continue
        if trace_d is not None:
            d = np.repeat(trace_d[:, None], max_attempts, axis=1)
        else:
            d = step.duration.sample(_rng(seed, DURATIONS, k, j), (n_k, max_attempts))
        d = _us(np.maximum(d, 0)).tolist()
        answers.append([None] * n_k)
        if step.fail_p == 0 and step.retry_p == 0:
            attempts.append([(Attempt(row[0], PASS),) for row in d])
            continue
        codes = _outcomes(
            _rng(seed, FAILURES, k, j).random((n_k, max_attempts)), step.fail_p, step.retry_p
        ).tolist()
        per_run: list[tuple[Attempt, ...]] = []
        for drow, crow in zip(d, codes, strict=True):
            run: list[Attempt] = []
            for dur, code in zip(drow, crow, strict=True):
                run.append(Attempt(dur, _OUTCOME[code]))
                if code != 2:
                    break
            per_run.append(tuple(run))
        attempts.append(per_run)
    return attempts, answers


def _fleet_events(scenario: Scenario, nodes: list[NodeSpec], end: float) -> list[FleetEvent]:
    scripted = sorted(scenario.fleet.events, key=lambda e: e.at_s)
    scripted = [dataclasses.replace(e, at_s=_us1(e.at_s)) for e in scripted]
    ids = [n.node_id for n in nodes]
    rand: list[FleetEvent] = []
    for p, proc in enumerate(scenario.fleet.random):
        targets = list(proc.nodes) or ids
        for node_id in targets:
            if node_id not in ids:
                raise ValueError(f"random fleet process names unknown node {node_id!r}")
            rng = _rng(scenario.seed, FLEET, p, ids.index(node_id))
            t = proc.start_s
            while True:
                t += float(rng.exponential(proc.mean_up_s))
                if t >= end:
                    break
                if proc.kind == "restart":
                    rand.append(FleetEvent(_us1(t), node_id, "restart"))
                    continue
                rand.append(FleetEvent(_us1(t), node_id, "vanish"))
                # The return is kept even past the end, so no node stays dark for ever.
                t += float(rng.exponential(proc.mean_down_s))
                rand.append(FleetEvent(_us1(t), node_id, "return"))
    rand.sort(key=lambda e: (e.at_s, e.node_id))
    # Scripted events precede random ones at the same instant; the order is the apply order.
    return sorted(scripted + rand, key=lambda e: e.at_s)


def _interned_roles(tpl: Template, needs: Any, cache: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if needs is None:
        return cache.setdefault("", tpl.contract())
    if all(isinstance(v, dict) for v in needs.values()):
        roles = needs
    else:
        (role,) = tpl.roles  # a single role's needs: the template must have exactly one role
        roles = {role: needs}
    key = json.dumps(roles, sort_keys=True)
    if key not in cache:
        cache[key] = tpl.contract(roles)
    return cache[key]


def materialize(scenario: Scenario) -> Plan:
    """Turn a scenario and its seed into a deterministic, fully pre-sampled `Plan`.

    Args:
        scenario: what to simulate.

    Returns:
        The plan both engines run: same scenario and seed → an equal plan.
    """
    enabled = gc.isenabled()
    gc.disable()  # many small long-lived objects: the cyclic collector would only rescan them
    try:
        return _materialize(scenario)
    finally:
        if enabled:
            gc.enable()


def _materialize(scenario: Scenario) -> Plan:
    if isinstance(scenario.workload.arrivals, Recorded):  # a lab's own twin (sim.inputs.twin)
        return _twin_plan(scenario)
    st = scenario.settings
    nodes = scenario.fleet.nodes()
    times, choice, rows = _arrival_times(scenario)
    times = _us(times)
    n = len(times)
    if choice is None:
        choice = _template_choice(scenario, n)
    tpls = scenario.workload.templates
    width = max(7, len(str(max(n - 1, 0))))
    run_ids = [f"r{i:0{width}d}" for i in range(n)]

    outcomes: list[tuple[tuple[Attempt, ...], ...] | None] = [None] * n
    answers: list[tuple[Answer | None, ...] | None] = [None] * n
    contracts: list[dict[str, Any] | None] = [None] * n
    for k, tpl in enumerate(tpls):
        idx = np.flatnonzero(choice == k)
        if not len(idx):
            continue
        trace_d = None
        if rows is not None:
            proc = scenario.workload.arrivals
            assert isinstance(proc, Trace)
            if sum(s.kind == "exec" for s in tpl.steps) != 1:
                raise ValueError("a trace template needs exactly one exec step")
            trace_d = rows["duration_s"].to_numpy(dtype=float)[idx] * proc.duration_scale
        att, ans = _attempts_for(tpl, k, len(idx), scenario.seed, st.max_attempts, trace_d)
        per_step_att = list(zip(*att, strict=True))
        per_step_ans = list(zip(*ans, strict=True))
        cache: dict[str, dict[str, Any]] = {}
        needs_col = rows["needs"].tolist() if rows is not None and "needs" in rows.columns else None
        base = tpl.contract()
        for pos, i in enumerate(idx.tolist()):
            if needs_col is not None:
                base = _interned_roles(tpl, needs_col[i], cache)
            contracts[i] = {"run_id": run_ids[i], **base}
            outcomes[i] = per_step_att[pos]
            answers[i] = per_step_ans[pos]

    arrivals = tuple(
        Arrival(float(t), rid, tpls[k].name, c, o, a)  # type: ignore[arg-type, unused-ignore]
        for t, rid, k, c, o, a in zip(
            times.tolist(), run_ids, choice.tolist(), contracts, outcomes, answers, strict=True
        )
    )
    end = scenario.horizon_s if scenario.horizon_s is not None else float(times[-1]) if n else 0.0
    sources = tuple(rows["run_id"].astype(str)) if rows is not None and "run_id" in rows else ()
    fleet = tuple(_fleet_events(scenario, nodes, end))
    return Plan(scenario, tuple(nodes), arrivals, fleet, sources)


def _twin_plan(scenario: Scenario) -> Plan:
    parts = twin.plan_parts(scenario)
    arrivals = tuple(
        Arrival(a.at_s, a.run_id, a.template, a.contract, a.step_outcomes, a.ask_answers)
        for a in parts.arrivals
    )
    return Plan(scenario, parts.nodes, arrivals, parts.fleet_events, parts.source_ids)
