"""Wake 9 in the simulator (issue 12 §2): the real Mediator in virtual time, on the scenario in
which a node gains, loses and regains a capability. The differential test (test_sim.py) runs
the same scenario against the reference model; this one states what must happen."""

from __future__ import annotations

import pytest

import sim
from sim.inputs import scenarios as S

pytestmark = [
    pytest.mark.db,
    pytest.mark.slow,
]  # scripts/test --fast leaves it out: simulations on the real Mediator


def test_a_capability_gained_by_an_idle_node_promotes_the_waiting_run_at_that_advert(cluster):
    """b waits for a scope (s000 busy until 1001); x000 advertises one at 100 → b starts at 100
    on x000 (wake 9). x000 drops it at 400; c (t=500) waits; x000 regains it at 700 → c starts
    at 700. Nothing is ever stuck: no interval in which a free live node could serve a queued
    run that did not move."""
    result = sim.run(S.capabilities(), database_url=cluster.url("postgres"), progress=False)
    runs = result.runs.set_index("run_id")
    assert runs.loc["r0000001", "started_at"] == pytest.approx(100.0)
    assert runs.loc["r0000002", "started_at"] == pytest.approx(700.0)
    assert result.promotions["nodes"].tolist() == ["s000", "x000", "x000"]
    assert result.stuck["duration_s"].sum() == 0.0
    assert result.violations == []


# ---- the other amended rules, in the model and the real Mediator alike ----


def _amended(drain_first: bool):
    """max_width 2. F{p,q,r}, P{p}, Q{q}, R{r}, A{a}, B{b}. t=1: `onF` holds F for 100 s. t=2:
    `wide` (a{p}, b{q}, c{r}) finds F busy: P+Q+R is width 3 → TOO_WIDE now, but width 1 on F
    once F is free, so it waits (R1/R10 amended) and goes onto F at 101. t=3: `ab` runs a1 on A
    (50 s) and b1, b2 on B (100 s each); A drains at-boundary just before (drain_first) or after
    a1's result at 53: either way A is released and `ab` passes (at-boundary drain amended)."""
    from sim.inputs.scenarios import (
        Constant,
        Fleet,
        FleetEvent,
        NodeGroup,
        Scenario,
        Scripted,
        Settings,
        StepSpec,
        Template,
        Workload,
    )

    groups = tuple(NodeGroup(1, caps, id_prefix=p) for p, caps in (
        ("F", {"p": True, "q": True, "r": True}), ("P", {"p": True}), ("Q", {"q": True}),
        ("R", {"r": True}), ("A", {"a": True}), ("B", {"b": True})))  # fmt: skip
    at = 52.999999 if drain_first else 53.000001
    templates = (
        Template("onF", {"f": {"p": True, "q": True, "r": True}},
                 (StepSpec("s", role="f", duration=Constant(100.0)),)),
        Template("wide", {"a": {"p": True}, "b": {"q": True}, "c": {"r": True}},
                 tuple(StepSpec(f"s{r}", role=r, duration=Constant(10.0)) for r in "abc")),
        Template("ab", {"ra": {"a": True}, "rb": {"b": True}},
                 (StepSpec("a1", role="ra", duration=Constant(50.0)),
                  StepSpec("b1", role="rb", duration=Constant(100.0)),
                  StepSpec("b2", role="rb", after=("b1",), duration=Constant(100.0)))),
    )  # fmt: skip
    return Scenario(
        name="amended",
        fleet=Fleet(groups, 10.0, (FleetEvent(at, "A000", "drain", "at-boundary"),)),
        workload=Workload(Scripted(((1.0, "onF"), (2.0, "wide"), (3.0, "ab"))), templates),
        settings=Settings(max_width=2),
        horizon_s=1000.0,
    )


@pytest.mark.parametrize("drain_first", [True, False])
def test_model_and_mediator_agree_on_too_wide_and_at_boundary_drain(cluster, drain_first):
    """issue 12 §3 and §5 through the simulator: both implementations queue `wide` and promote
    it onto F at 101, and `ab` passes whichever commits first; the differential is exact."""
    plan = sim.materialize(_amended(drain_first))
    result = sim.run(plan, database_url=cluster.url("postgres"), progress=False)
    model = sim.run_model(plan)
    assert sim.promotions_diff(model.promotions, result.promotions, tol_s=1e-6) is None
    for runs in (result.runs, model.runs):
        r = runs.set_index("run_id")
        assert r.loc["r0000001", "started_at"] == pytest.approx(101.0)
        assert r.loc["r0000002", "verdict"] == "pass"
    assert result.violations == []
