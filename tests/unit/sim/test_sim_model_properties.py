"""The reference model on random fleets, workloads and fleet events: invariants that must hold
whatever happens (docs/design.md §3), checked on every generated scenario."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.analysis import littles_law
from sim.brokers.model import run_model
from sim.inputs.scenarios import (
    Constant,
    Exponential,
    Fleet,
    FleetEvent,
    NodeGroup,
    Poisson,
    Scenario,
    Settings,
    StepSpec,
    Template,
    Workload,
)
from tests.conftest import examples

CLASSES = ("a", "b", "c")


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n_nodes = draw(st.integers(1, 5))
    groups = tuple(
        NodeGroup(1, {"cls": draw(st.sampled_from(CLASSES)), "all": True}, id_prefix=f"n{i}")
        for i in range(n_nodes)
    )
    ids = [g.node_ids()[0] for g in groups]
    templates = []
    for k in range(draw(st.integers(1, 3))):
        roles = {
            f"r{j}": {"cls": draw(st.sampled_from(CLASSES))} for j in range(draw(st.integers(1, 2)))
        }
        steps = []
        for j, role in enumerate(sorted(roles)):
            steps.append(
                StepSpec(
                    f"s{j}",
                    role,
                    after=(f"s{j - 1}",) if j and draw(st.booleans()) else (),
                    duration=Exponential(draw(st.sampled_from([5.0, 30.0, 120.0]))),
                    fail_p=draw(st.sampled_from([0.0, 0.1])),
                    retry_p=draw(st.sampled_from([0.0, 0.3])),
                )
            )
        if draw(st.booleans()):
            steps.append(
                StepSpec("ask", kind="ask", ask="ok?", after=("s0",), answer_delay=Constant(20.0))
            )
        templates.append(Template(f"t{k}", roles, tuple(steps)))
    events = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["vanish", "return", "drain", "undrain", "restart"]))
        policy = draw(st.sampled_from(["graceful", "at-boundary"]))
        at = float(draw(st.integers(0, 3000)))
        events.append(FleetEvent(at, draw(st.sampled_from(ids)), kind, policy))
    return Scenario(
        name="random",
        fleet=Fleet(
            groups,
            advert_interval_s=10.0,
            events=tuple(events),
            claim_latency_s=draw(st.sampled_from([0.0, 1.0])),
        ),
        workload=Workload(Poisson(draw(st.sampled_from([0.01, 0.05]))), tuple(templates)),
        settings=Settings(max_width=4, wake_on_return=draw(st.booleans())),
        horizon_runs=60,
        horizon_s=4000.0,
        seed=draw(st.integers(0, 1000)),
    )


def _leases_never_overlap(leases: pd.DataFrame, end: float) -> bool:
    for _, g in leases.groupby("node_id"):
        g = g.sort_values("granted_at")
        released = g["released_at"].fillna(end).to_numpy()
        granted = g["granted_at"].to_numpy()
        if (granted[1:] < released[:-1]).any():
            return False
    return True


@settings(
    max_examples=examples(60),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(scenarios())
def test_invariants_hold_on_random_scenarios(scenario: Scenario) -> None:
    result = run_model(scenario)
    runs = result.runs
    # I1: a node holds at most one lease at a time.
    assert _leases_never_overlap(result.leases, result.end_s)
    # states and verdicts are consistent (§2)
    verdicts: dict[str, set[Any]] = {
        "PASSED": {"pass"},
        "FAILED": {"fail", "rejected", "lost", "drained"},
        "QUEUED": {None},
        "RUNNING": {None},
    }
    for row in runs.itertuples():
        assert (None if pd.isna(row.verdict) else row.verdict) in verdicts[row.state], row
        assert (row.width == 0) == np.isnan(row.started_at)  # I3/I5: all leases or none
        assert row.width <= scenario.settings.max_width
        if not np.isnan(row.started_at):
            assert row.started_at >= row.created_at
    # only runs that started appear in the promotion list, once each, in time order
    assert result.promotions["run_id"].is_unique
    assert result.promotions["at_s"].is_monotonic_increasing
    # I7: runs of one template (one needs_key) start in (created_at, run_id) order — unless
    # wake 7 is off: then a returned node can go to a new submit before a stuck queued run
    # (the vanished-node window of docs/design.md §8)
    if scenario.settings.wake_on_return:
        for _, g in runs[runs["started_at"].notna()].groupby("template"):
            started = g.sort_values(["created_at", "run_id"])["started_at"].to_numpy()
            assert (np.diff(started) >= 0).all()
    # the queue-length series and the waits tell the same story (Little's law, exactly)
    check = littles_law(runs, result.queue, start_s=0.0, end_s=result.end_s)
    assert check.L == 0 or check.rel_err < 1e-9
    # wake 7 on: no run waits beside a free node that could serve it (no TOO_WIDE: width <= 2)
    if scenario.settings.wake_on_return:
        assert result.stuck["duration_s"].sum() == 0
    # the cheap stuck bookkeeping equals checking after every event
    slow = run_model(scenario, exhaustive_stuck=True)
    pd.testing.assert_frame_equal(result.stuck, slow.stuck)
    pd.testing.assert_frame_equal(result.runs, slow.runs)
