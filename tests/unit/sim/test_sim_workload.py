"""The pre-sampled plan: determinism, separate random streams, common random numbers
(design.md §20)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim.inputs import scenarios as S
from sim.inputs.scenarios import Burst, Exponential, Piecewise, StepSpec, Template, Workload
from sim.inputs.workload import Plan, materialize


def _durations(plan: Plan) -> list[float]:
    return [att.duration_s for a in plan.arrivals for step in a.step_outcomes for att in step]


def test_same_scenario_and_seed_give_an_equal_plan() -> None:
    assert materialize(S.mixed(runs=300)) == materialize(S.mixed(runs=300))
    assert materialize(S.mixed(runs=300, seed=1)) != materialize(S.mixed(runs=300))


def test_run_ids_sort_in_arrival_order_and_the_contract_carries_them() -> None:
    plan = materialize(S.steady(runs=500))
    ids = [a.run_id for a in plan.arrivals]
    assert ids == sorted(ids) and len(set(ids)) == 500 and ids[0] == "r0000000"
    assert all(a.contract["run_id"] == a.run_id for a in plan.arrivals)
    times = [a.at_s for a in plan.arrivals]
    assert times == sorted(times)
    assert all(round(t * 1e6) == t * 1e6 or abs(round(t * 1e6) - t * 1e6) < 1e-3 for t in times)


def test_common_random_numbers_across_fleet_sizes() -> None:
    """Changing the fleet keeps every arrival and every duration."""
    three, eight = materialize(S.steady(nodes=3)), materialize(S.steady(nodes=8))
    assert [a.at_s for a in three.arrivals] == [a.at_s for a in eight.arrivals]
    assert _durations(three) == _durations(eight)


def test_failure_probabilities_do_not_move_the_durations() -> None:
    base = S.asks(runs=300)
    tpl = base.workload.templates[0]
    flaky_steps = tuple(
        dataclasses.replace(s, fail_p=0.2, retry_p=0.3) if s.kind == "exec" else s
        for s in tpl.steps
    )
    flaky = dataclasses.replace(
        base,
        workload=Workload(base.workload.arrivals, (dataclasses.replace(tpl, steps=flaky_steps),)),
    )
    a, b = materialize(base), materialize(flaky)
    assert [x.at_s for x in a.arrivals] == [x.at_s for x in b.arrivals]
    assert [x.ask_answers for x in a.arrivals] == [x.ask_answers for x in b.arrivals]
    first = [x.step_outcomes[0][0].duration_s for x in a.arrivals]
    assert first == [x.step_outcomes[0][0].duration_s for x in b.arrivals]


def test_attempts_stop_at_the_first_pass_or_fail_and_at_max_attempts() -> None:
    tpl = Template(
        "flaky",
        {"node": {"pool": "lab"}},
        (StepSpec("s", "node", duration=Exponential(1.0), fail_p=0.2, retry_p=0.5),),
    )
    sc = dataclasses.replace(S.steady(runs=2000), workload=Workload(S.Poisson(0.1), (tpl,)))
    outcomes = [a.step_outcomes[0] for a in materialize(sc).arrivals]
    assert all(1 <= len(o) <= 3 for o in outcomes)
    for o in outcomes:
        assert all(att.outcome == "retry" for att in o[:-1])
        assert o[-1].outcome in ("pass", "fail") or len(o) == 3
    assert any(o[-1].outcome == "retry" for o in outcomes)  # the Mediator fails these (R15)
    fail_share = sum(o[0].outcome == "fail" for o in outcomes) / len(outcomes)
    assert fail_share == pytest.approx(0.2, abs=0.03)


def test_ask_answers_sit_on_ask_steps_only() -> None:
    a = materialize(S.asks(runs=50)).arrivals[0]
    kinds = [s.get("kind", "exec") for s in a.contract["steps"]]
    assert [ans is not None for ans in a.ask_answers] == [k == "ask" for k in kinds]
    assert [len(o) > 0 for o in a.step_outcomes] == [k == "exec" for k in kinds]


def test_template_mix_follows_the_weights() -> None:
    plan = materialize(S.mixed(runs=20_000))
    share = np.mean([a.template == "unit" for a in plan.arrivals])
    total = sum(t.weight for t in S.mixed().workload.templates)
    assert abs(share - 0.5 / total) < 0.015


def test_piecewise_rates_by_inversion() -> None:
    proc = Piecewise(((0.0, 0.01), (1000.0, 0.1), (2000.0, 0.0)), period_s=3000.0)
    sc = dataclasses.replace(
        S.steady(),
        workload=dataclasses.replace(S.steady().workload, arrivals=proc),
        horizon_runs=None,
        horizon_s=300_000.0,
    )
    t = np.array([a.at_s for a in materialize(sc).arrivals]) % 3000.0
    counts = np.histogram(t, bins=[0, 1000, 2000, 3000])[0]
    assert counts[2] == 0  # rate 0
    assert abs(counts[0] / 100 - 10) < 1.5 and abs(counts[1] / 100 - 100) < 4  # per period


def test_burst_adds_its_count_inside_its_window() -> None:
    sc = dataclasses.replace(
        S.burst(),
        workload=dataclasses.replace(S.burst().workload, arrivals=Burst(0.001, 5000.0, 100, 50.0)),
        horizon_runs=None,
        horizon_s=20_000.0,
    )
    t = np.array([a.at_s for a in materialize(sc).arrivals])
    assert ((t >= 5000.0) & (t <= 5050.0)).sum() >= 100


def test_random_fleet_events_alternate_per_node_and_are_sorted() -> None:
    plan = materialize(S.vanished_node(churn=True, runs=500))
    times = [e.at_s for e in plan.fleet_events]
    assert times == sorted(times)
    for node in {e.node_id for e in plan.fleet_events}:
        kinds = [e.kind for e in plan.fleet_events if e.node_id == node]
        assert kinds == ["vanish", "return"] * (len(kinds) // 2)
    # the fleet stream is separate: arrivals do not change when the fleet churns
    quiet = materialize(S.vanished_node(churn=True, runs=500, mean_up_s=1e12))
    assert [a.at_s for a in quiet.arrivals] == [a.at_s for a in plan.arrivals]
