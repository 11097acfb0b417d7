"""The reference model, worked example by worked example (docs/design.md §4–7, seed 000 rules).

Each test scripts a tiny fleet and a few arrivals with constant durations, so the expected
promotion list can be worked out by hand and asserted whole — the form the differential test
against the real Mediator compares.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sim.brokers.model import promotions_diff, run_model, satisfies
from sim.inputs import scenarios as S
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
from sim.inputs.traces import fifo_waits
from sim.inputs.workload import materialize


def one(name: str, needs: dict[str, Any], dur: float, **step: Any) -> Template:
    """A one-role, one-step template."""
    return Template(
        name, {"node": needs}, (StepSpec("run", "node", duration=Constant(dur), **step),)
    )


def scripted(
    nodes: dict[str, dict[str, Any]],
    templates: tuple[Template, ...],
    items: tuple[tuple[float, str], ...],
    events: tuple[FleetEvent, ...] = (),
    horizon_s: float = 5000.0,
    interval: float = 10.0,
    claim_latency_s: float = 0.0,
    **settings: Any,
) -> Scenario:
    """One node per entry of `nodes` (id = key + "000"), scripted arrivals r0000000, r0000001, …"""
    groups = tuple(NodeGroup(1, caps, id_prefix=p) for p, caps in nodes.items())
    return Scenario(
        name="example",
        fleet=Fleet(
            groups, advert_interval_s=interval, events=events, claim_latency_s=claim_latency_s
        ),
        workload=Workload(Scripted(items), templates),
        settings=Settings(**settings),
        horizon_s=horizon_s,
    )


def promotions(result: Any) -> list[tuple[float, str, str, str]]:
    p = result.promotions
    return list(zip(p["at_s"], p["run_id"], p["nodes"], p["how"], strict=True))


def runs(result: Any) -> dict[str, dict[str, Any]]:
    return result.runs.set_index("run_id").to_dict("index")


def wakes(result: Any) -> list[tuple[float, str]]:
    ev = result.events
    w = ev[ev["kind"] == "wake"]
    return list(zip(w["at_s"], w["detail"], strict=True))


# -- the matcher's capability rule ------------------------------------------------------------


def test_satisfies_keeps_json_types() -> None:
    """§5: `true` wants a truthy capability; other values compare with JSON types kept."""
    assert satisfies({"usb": True}, {"usb": 1})  # present and truthy
    assert not satisfies({"usb": True}, {"usb": 0})
    assert not satisfies({"usb": True}, {})
    assert not satisfies({"cores": 1}, {"cores": True})  # no bool/int coercion
    assert not satisfies({"flag": True}, {"flag": []})
    assert satisfies({"cores": 1}, {"cores": 1.0})  # numbers compare as numbers
    assert not satisfies({"rev": "1"}, {"rev": 1})
    assert satisfies({"board": "f4"}, {"board": ["f1", "f4"]})  # member of a list capability
    assert not satisfies({"board": "f7"}, {"board": ["f1", "f4"]})
    assert satisfies({}, {"anything": 1})


# -- submit and the sweep ---------------------------------------------------------------------


def test_R6_a_run_waiting_for_the_board_never_blocks_a_later_run_that_can_go() -> None:
    """R6 / I7: the sweep skips the head that cannot go and promotes the later run that can."""
    sc = scripted(
        {"b": {"board": "x"}, "l": {"os": "linux"}},
        (one("hil", {"board": "x"}, 100.0), one("unit", {"os": "linux"}, 10.0)),
        ((0.0, "hil"), (1.0, "hil"), (2.0, "unit"), (3.0, "unit")),
    )
    assert promotions(run_model(sc)) == [
        (0.0, "r0000000", "b000", "created"),
        (2.0, "r0000002", "l000", "created"),
        (12.0, "r0000003", "l000", "promoted"),  # overtakes r0000001, which waits for the board
        (100.0, "r0000001", "b000", "promoted"),
    ]


def test_I7_runs_competing_for_one_node_go_in_created_at_then_run_id_order() -> None:
    """I7: FIFO by (created_at, run_id) — simultaneous submits are ordered by run_id."""
    sc = scripted(
        {"n": {"pool": "lab"}},
        (one("job", {"pool": "lab"}, 10.0),),
        ((0.0, "job"), (5.0, "job"), (5.0, "job"), (6.0, "job")),
    )
    got = promotions(run_model(sc))
    assert [(t, r) for t, r, *_ in got] == [
        (0.0, "r0000000"),
        (10.0, "r0000001"),
        (20.0, "r0000002"),
        (30.0, "r0000003"),
    ]


def test_R1_no_candidate_and_too_wide_are_rejected_at_submit() -> None:
    """R1: NO_CANDIDATE and TOO_WIDE at submit are FAILED/rejected, never queued."""
    wide = Template(
        "wide",
        {"a": {"x": True}, "b": {"y": True}},
        (StepSpec("s1", "a", duration=Constant(1.0)), StepSpec("s2", "b", duration=Constant(1.0))),
    )
    sc = scripted(
        {"p": {"x": True}, "q": {"y": True}},
        (one("ghost", {"gpu": True}, 1.0), wide),
        ((0.0, "ghost"), (1.0, "wide")),
        max_width=1,
    )
    r = runs(run_model(sc))
    assert (r["r0000000"]["verdict"], r["r0000000"]["reject"]) == ("rejected", "NO_CANDIDATE")
    assert (r["r0000001"]["verdict"], r["r0000001"]["reject"]) == ("rejected", "TOO_WIDE")


def test_no_candidate_for_any_role_wins_over_a_busy_earlier_role() -> None:
    """As `mediator.core.match`: every role needs a live candidate before ALL_BUSY is considered,
    so a
    contract no fleet can serve is refused (422) rather than queued for ever behind a busy role."""
    tpl = Template(
        "two",
        {"a": {"x": True}, "b": {"gpu": True}},
        (StepSpec("s1", "a", duration=Constant(1.0)), StepSpec("s2", "b", duration=Constant(1.0))),
    )
    sc = scripted(
        {"p": {"x": True}},
        (one("hold", {"x": True}, 50.0), tpl),
        ((0.0, "hold"), (1.0, "two")),
    )
    assert runs(run_model(sc))["r0000001"]["reject"] == "NO_CANDIDATE"


def test_folding_and_candidate_order() -> None:
    """§6 steps 3–4: the node serving most of the remaining roles is taken first, and later roles
    fold onto it (width 1); ties go by node_id."""
    tpl = Template(
        "pair",
        {"build": {"os": "linux"}, "test": {"scope": True}},
        (
            StepSpec("b", "build", duration=Constant(5.0)),
            StepSpec("t", "test", after=("b",), duration=Constant(5.0)),
        ),
    )
    sc = scripted(
        {"a": {"os": "linux"}, "z": {"os": "linux", "scope": True}},
        (tpl, one("lin", {"os": "linux"}, 5.0)),
        ((0.0, "pair"), (1.0, "lin")),
    )
    r = runs(run_model(sc))
    assert (r["r0000000"]["nodes"], r["r0000000"]["width"]) == ("z000", 1)
    assert r["r0000001"]["nodes"] == "a000"


def test_R10_too_wide_at_promotion_stays_queued_until_a_narrow_assignment_exists() -> None:
    """R10: at promotion TOO_WIDE depends on which nodes are free, so the run stays QUEUED."""
    wide = Template(
        "wide",
        {"a": {"x": True}, "b": {"y": True}},
        (StepSpec("s1", "a", duration=Constant(1.0)), StepSpec("s2", "b", duration=Constant(1.0))),
    )
    sc = scripted(
        {
            "n1": {"x": True, "y": True, "id": 1},
            "n2": {"x": True, "id": 2},
            "n3": {"y": True, "id": 3},
        },
        (
            one("occ1", {"id": 1}, 100.0),
            one("occ2", {"id": 2}, 10.0),
            one("occ3", {"id": 3}, 10.0),
            wide,
        ),
        ((0.0, "occ1"), (0.0, "occ2"), (0.0, "occ3"), (1.0, "wide")),
        max_width=1,
    )
    result = run_model(sc)
    assert promotions(result)[-1] == (100.0, "r0000003", "n1000", "promoted")
    assert runs(result)["r0000003"]["width"] == 1
    assert result.stuck.empty  # TOO_WIDE is not "a free node could have served it"


def test_R17_the_submit_guard_wakes_the_queue() -> None:
    """R17 (wake 8): with wake_on_return off, a returned node leaves b stuck; the next submit that
    is queued runs one WakeQueued, which promotes b."""
    sc = scripted(
        {"x": {"board": "x"}, "y": {"board": "y"}},
        (one("on_x", {"board": "x"}, 1000.0), one("on_y", {"board": "y"}, 1000.0)),
        ((1.0, "on_x"), (2.0, "on_x"), (350.0, "on_y"), (400.0, "on_y")),
        events=(FleetEvent(100.0, "x000", "vanish"), FleetEvent(300.0, "x000", "return")),
        wake_on_return=False,
    )
    result = run_model(sc)
    p = result.promotions
    assert list(zip(p["at_s"], p["run_id"], p["wake"], strict=True))[:3] == [
        (1.0, "r0000000", 0),
        (350.0, "r0000002", 0),
        (400.0, "r0000001", 8),
    ]
    stuck = result.stuck
    assert list(zip(stuck["run_id"], stuck["start_s"], stuck["end_s"], strict=True)) == [
        ("r0000001", 300.0, 400.0)
    ]


def test_vanished_node_window_seed_000_section_5() -> None:
    """The window wake point 7 closes (docs/design.md §8), step by step: b waits for an
    unrelated event without wake 7, not with it."""
    on = run_model(S.vanished_node(wake_on_return=True))
    off = run_model(S.vanished_node(wake_on_return=False))
    lost = runs(on)["r0000000"]
    assert (lost["verdict"], lost["ended_at"]) == ("lost", 150.0)  # reaped at the k·renew pass
    assert promotions(on) == [
        (1.0, "r0000000", "x000", "created"),
        (300.0, "r0000001", "x000", "promoted"),  # wake 7: the moment X is back
        (600.0, "r0000002", "y000", "created"),
    ]
    assert promotions(off) == [
        (1.0, "r0000000", "x000", "created"),
        (600.0, "r0000002", "y000", "created"),
        (700.0, "r0000001", "x000", "promoted"),  # wake 1 of c's result, an unrelated event
    ]
    assert on.stuck["duration_s"].sum() == 0
    assert off.stuck["duration_s"].tolist() == [400.0]


def test_stuck_time_over_a_long_random_vanish_return_process() -> None:
    """docs/design.md §20: no stuck time with wake 7; some without it."""
    kw = {"churn": True, "runs": 800}
    on = run_model(S.vanished_node(wake_on_return=True, **kw))
    off = run_model(S.vanished_node(wake_on_return=False, **kw))
    assert on.stuck["duration_s"].sum() == 0
    assert off.stuck["duration_s"].sum() > 0
    assert (off.runs["verdict"] == "lost").any()


@pytest.mark.parametrize(
    "scenario",
    [S.mixed(runs=800), S.vanished_node(churn=True, wake_on_return=False, runs=400), S.drain()],
)
def test_fast_stuck_bookkeeping_equals_checking_after_every_event(scenario: Scenario) -> None:
    fast = run_model(scenario)
    slow = run_model(scenario, exhaustive_stuck=True)
    pd.testing.assert_frame_equal(fast.stuck, slow.stuck)
    pd.testing.assert_frame_equal(fast.promotions, slow.promotions)


# -- steps, results, release ------------------------------------------------------------------


def test_R15_a_retry_is_a_rollback_without_release_or_wake() -> None:
    """R15: attempts 1 and 2 retry (no wake, node kept); the 3rd (max_attempts) fails and wakes."""
    sc = scripted(
        {"n": {"pool": "lab"}},
        (one("flaky", {"pool": "lab"}, 10.0, retry_p=1.0), one("job", {"pool": "lab"}, 10.0)),
        ((0.0, "flaky"), (1.0, "job")),
    )
    result = run_model(sc)
    r = runs(result)
    assert (r["r0000000"]["verdict"], r["r0000000"]["ended_at"]) == ("fail", 30.0)
    assert r["r0000001"]["started_at"] == 30.0
    assert [w for w in wakes(result) if w[1] == "1"] == [(30.0, "1"), (40.0, "1")]


def test_a_failed_step_skips_its_dependants() -> None:
    tpl = Template(
        "chain",
        {"node": {"pool": "lab"}},
        (
            StepSpec("a", "node", duration=Constant(5.0), fail_p=1.0),
            StepSpec("b", "node", after=("a",), duration=Constant(5.0)),
        ),
    )
    sc = scripted({"n": {"pool": "lab"}}, (tpl,), ((0.0, "chain"),))
    r = runs(run_model(sc))["r0000000"]
    assert (r["state"], r["verdict"], r["ended_at"]) == ("FAILED", "fail", 5.0)


def test_partial_release_frees_a_node_before_the_run_ends_and_wakes() -> None:
    """applyRelease: a node whose steps are all terminal is released at once (wake 1)."""
    tpl = Template(
        "two",
        {"p": {"kind": "p"}, "q": {"kind": "q"}},
        (
            StepSpec("short", "p", duration=Constant(10.0)),
            StepSpec("long", "q", duration=Constant(100.0)),
        ),
    )
    sc = scripted(
        {"p": {"kind": "p"}, "q": {"kind": "q"}},
        (tpl, one("on_p", {"kind": "p"}, 5.0)),
        ((0.0, "two"), (1.0, "on_p")),
    )
    r = runs(run_model(sc))
    assert r["r0000001"]["started_at"] == 10.0
    assert r["r0000000"]["ended_at"] == 100.0


def test_asks_hold_the_node_until_a_person_answers() -> None:
    """§7.6: an ask is raised once its `after` passed; the node stays leased meanwhile."""
    tpl = Template(
        "gated",
        {"dut": {"pool": "lab"}},
        (
            StepSpec("flash", "dut", duration=Constant(10.0)),
            StepSpec("probe", kind="ask", ask="ok?", after=("flash",), answer_delay=Constant(50.0)),
            StepSpec("measure", "dut", after=("probe",), duration=Constant(10.0)),
        ),
    )
    refused = Template(
        "refused",
        {"dut": {"pool": "lab"}},
        (
            StepSpec("probe", kind="ask", ask="ok?", answer_delay=Constant(5.0), ok_p=0.0),
            StepSpec("measure", "dut", after=("probe",), duration=Constant(10.0)),
        ),
    )
    sc = scripted(
        {"n": {"pool": "lab"}},
        (tpl, refused, one("job", {"pool": "lab"}, 1.0)),
        ((0.0, "gated"), (1.0, "job"), (100.0, "refused")),
    )
    r = runs(run_model(sc))
    assert r["r0000000"]["ended_at"] == 70.0
    assert r["r0000001"]["started_at"] == 70.0
    assert (r["r0000002"]["verdict"], r["r0000002"]["ended_at"]) == ("fail", 105.0)


def test_claim_latency_delays_the_step_not_the_promotion() -> None:
    sc = scripted(
        {"n": {"pool": "lab"}},
        (one("job", {"pool": "lab"}, 10.0),),
        ((0.0, "job"), (1.0, "job")),
        claim_latency_s=2.0,
    )
    r = runs(run_model(sc))
    assert (r["r0000000"]["started_at"], r["r0000000"]["ended_at"]) == (0.0, 12.0)
    assert (r["r0000001"]["started_at"], r["r0000001"]["ended_at"]) == (12.0, 24.0)


# -- restart, drain ----------------------------------------------------------------------------


def _two_node_run(after: bool) -> Template:
    return Template(
        "two",
        {"a": {"id": 1}, "b": {"id": 2}},
        (
            StepSpec("s1", "a", duration=Constant(50.0)),
            StepSpec("s2", "b", after=("s1",) if after else (), duration=Constant(200.0)),
        ),
    )


def test_restart_loses_the_run_but_a_node_still_running_a_step_keeps_its_lease() -> None:
    """§7.5 restart detection + I2: n1 restarts mid-step (run lost, wake 4, n1 free at once);
    n2 still runs its CLAIMED step and keeps its lease until that result (wake 1)."""
    sc = scripted(
        {"n1": {"id": 1}, "n2": {"id": 2}},
        (_two_node_run(after=False), one("on1", {"id": 1}, 5.0), one("on2", {"id": 2}, 5.0)),
        ((0.0, "two"), (1.0, "on1"), (2.0, "on2")),
        events=(FleetEvent(20.0, "n1000", "restart"),),
    )
    result = run_model(sc)
    r = runs(result)
    assert (r["r0000000"]["verdict"], r["r0000000"]["ended_at"]) == ("lost", 20.0)
    assert r["r0000001"]["started_at"] == 20.0  # wake 4
    assert r["r0000002"]["started_at"] == 200.0  # the late result frees n2 (I2)
    assert (20.0, "4") in wakes(result)


def test_restart_rebinds_a_lease_when_nothing_ran_on_the_node_yet() -> None:
    """§7.5: a restarted node that has run nothing of its run keeps it (lease rebound)."""
    sc = scripted(
        {"n1": {"id": 1}, "n2": {"id": 2}},
        (_two_node_run(after=True),),
        ((0.0, "two"),),
        events=(FleetEvent(20.0, "n2000", "restart"),),
    )
    result = run_model(sc)
    r = runs(result)["r0000000"]
    assert (r["verdict"], r["ended_at"]) == ("pass", 250.0)
    assert (result.events["kind"] == "lease_rebound").sum() == 1


def test_graceful_drain_lets_the_run_finish_and_undrain_wakes_the_queue() -> None:
    """graceful: unavailable, current run finishes; undrain is wake 6."""
    sc = scripted(
        {"n": {"pool": "lab"}},
        (one("job", {"pool": "lab"}, 50.0),),
        ((0.0, "job"), (10.0, "job")),
        events=(FleetEvent(5.0, "n000", "drain", "graceful"), FleetEvent(80.0, "n000", "undrain")),
    )
    result = run_model(sc)
    r = runs(result)
    assert (r["r0000000"]["verdict"], r["r0000000"]["ended_at"]) == ("pass", 50.0)
    assert r["r0000001"]["state"] == "PASSED"  # queued (ALL_BUSY), not rejected
    assert promotions(result)[-1][:2] == (80.0, "r0000001")
    assert (80.0, "6") in wakes(result)


def test_at_boundary_drain_stops_the_run_once_the_node_has_no_claimed_step() -> None:
    """at-boundary: claims refused; the run ends FAILED/drained once the node has no CLAIMED step
    — found by the result transaction of s1 (wake 1), as `mediator.flows.steps` does."""
    tpl = Template(
        "three",
        {"node": {"pool": "lab"}},
        tuple(
            StepSpec(n, "node", after=a, duration=Constant(30.0))
            for n, a in (("s1", ()), ("s2", ("s1",)), ("s3", ("s2",)))
        ),
    )
    sc = scripted(
        {"n": {"pool": "lab"}},
        (tpl,),
        ((0.0, "three"),),
        events=(FleetEvent(5.0, "n000", "drain", "at-boundary"),),
    )
    result = run_model(sc)
    r = runs(result)["r0000000"]
    assert (r["verdict"], r["ended_at"]) == ("drained", 30.0)
    assert (30.0, "1") in wakes(result)


def test_at_boundary_drain_of_an_idle_leased_node_is_found_by_its_advert() -> None:
    """The drain advert itself finds n2 holding a lease with nothing CLAIMED: drained, wake 4."""
    sc = scripted(
        {"n1": {"id": 1}, "n2": {"id": 2}},
        (_two_node_run(after=True),),
        ((0.0, "two"),),
        events=(FleetEvent(5.0, "n2000", "drain", "at-boundary"),),
    )
    result = run_model(sc)
    r = runs(result)["r0000000"]
    assert (r["verdict"], r["ended_at"]) == ("drained", 5.0)
    assert (5.0, "4") in wakes(result)
    leases = result.leases.set_index("node_id")
    assert leases.loc["n2000", "released_at"] == 5.0
    assert leases.loc["n1000", "released_at"] == 50.0  # n1 kept its lease for its CLAIMED s1 (I2)


# -- determinism and the boundary ----------------------------------------------------------------


def test_same_scenario_and_seed_give_identical_frames() -> None:
    """docs/design.md §20: row for row."""
    a, b = run_model(S.mixed(runs=500)), run_model(S.mixed(runs=500))
    for name in ("runs", "promotions", "events", "queue", "stuck", "leases"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
    c = run_model(S.mixed(runs=500, seed=1))
    assert not a.runs["created_at"].equals(c.runs["created_at"])


def test_the_model_does_not_import_mediator() -> None:
    """design.md §20: an independent implementation, no `mediator` import in the model's modules
    but the settings' own check in the scenarios (`Config`: names, ranges — no policy)."""
    root = Path(__file__).resolve().parents[3] / "sim"
    for name in (
        "brokers/model",
        "inputs/scenarios",
        "inputs/workload",
        "inputs/traces",
        "analysis",
    ):
        tree = ast.parse((root / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "mediator" for a in node.names), name
            elif (
                isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mediator"
            ):
                names = sorted(a.name for a in node.names)
                ok = (name, node.module, names) == (
                    "inputs/scenarios",
                    "mediator",
                    ["Config", "ConfigError"],
                )
                assert ok, name


def test_I7_a_burst_queue_of_thousands_stays_fifo() -> None:
    """I7 with a queue long enough that the model compacts its FIFO lists: one-role runs on
    identical nodes must still wait exactly as the FIFO multi-server recursion says."""
    plan = materialize(S.burst(nodes=3, burst_count=5000, spread_s=10.0, runs=6000))
    result = run_model(plan, record_events=False)
    assert result.queue["length"].max() > 2500
    arrivals = np.array([a.at_s for a in plan.arrivals])
    durations = np.array([a.step_outcomes[0][0].duration_s for a in plan.arrivals])
    np.testing.assert_allclose(
        result.runs["wait_s"].to_numpy(), fifo_waits(arrivals, durations, 3), rtol=0, atol=2e-6
    )


def test_claim_latency_and_a_restart_between_promotion_and_claim() -> None:
    """A restart while a claim is pending: nothing ran yet, so the lease is rebound and the new
    daemon claims after its own latency."""
    sc = scripted(
        {"n": {"pool": "lab"}},
        (one("job", {"pool": "lab"}, 10.0),),
        ((0.0, "job"),),
        events=(FleetEvent(1.0, "n000", "restart"),),
        claim_latency_s=2.0,
    )
    r = runs(run_model(sc))["r0000000"]
    assert (r["verdict"], r["started_at"], r["ended_at"]) == ("pass", 0.0, 13.0)


def test_utilization_and_summary() -> None:
    sc = scripted(
        {"b": {"board": "x"}, "l": {"os": "linux"}},
        (one("hil", {"board": "x"}, 100.0), one("unit", {"os": "linux"}, 10.0)),
        ((0.0, "hil"), (1.0, "hil"), (2.0, "unit"), (3.0, "unit")),
        horizon_s=1000.0,
    )
    result = run_model(sc)
    util = result.utilization().set_index("node_id")
    assert util.loc["b000", "busy_s"] == 200.0 and util.loc["l000", "busy_s"] == 20.0
    assert util.loc["b000", "utilization"] == 0.2
    summary = result.summary()
    assert summary["runs"] == 4 and summary["by_verdict"] == {"pass": 4}
    assert summary["wait_mean_s"] == (0 + 99 + 0 + 9) / 4
    assert summary["utilization"] == (0.2 + 0.02) / 2
    assert summary["virtual_s_per_wall_s"] > 0


def test_R6_and_I7_in_the_mixed_scenario() -> None:
    """R6 at scale: hil runs wait for the scarce board while later unit/arm/pair runs go past
    them, and no queued run ever waits beside a free node that could serve it (stuck = 0);
    I7: runs with the same needs start in (created_at, run_id) order."""
    result = run_model(S.mixed(runs=1500))
    runs_df = result.runs
    hil = runs_df[runs_df["template"] == "hil"]
    others = runs_df[runs_df["template"] != "hil"]
    overtaken = 0
    for row in hil[hil["wait_s"] > 0].itertuples():
        later = others[(others["created_at"] > row.created_at)]
        overtaken += int((later["started_at"] < row.started_at).sum())
    assert overtaken > 0  # narrow runs went past waiting wide ones
    assert result.stuck["duration_s"].sum() == 0
    for _, group in runs_df.groupby("template"):
        started = group.sort_values(["created_at", "run_id"])["started_at"].to_numpy()
        assert (np.diff(started) >= 0).all()


def test_promotions_diff_names_the_first_divergence() -> None:
    """The differential test's report: None when equal, else the first diverging promotion."""
    ours = run_model(S.vanished_node()).promotions
    assert promotions_diff(ours, ours.copy()) is None
    theirs = ours.copy()
    theirs.loc[1, "at_s"] = 700.0
    assert promotions_diff(ours, theirs) == (
        "promotion #1: (300.0, 'r0000001', 'x000') != (700.0, 'r0000001', 'x000')"
    )
    assert promotions_diff(ours, theirs.iloc[:1]).startswith("promotion #1:")


def test_summary_reads_at_a_glance_and_keeps_full_precision_on_request() -> None:
    """issue 29: summary() was a dict of 4.444444444443-style floats. Every float — intervals'
    bounds too — now has 4 significant digits (whole parts never cut); digits=None gives the
    full figures, which the rounded ones equal to that precision."""
    import math

    from sim.platform.measure import round_to

    result = run_model(S.steady(runs=2000, seed=3))
    full, shown = result.summary(digits=None), result.summary()
    assert full.keys() == shown.keys()

    def significant(x: float) -> int:
        digits = f"{abs(x):.15g}".replace(".", "").lstrip("0").rstrip("0")
        return len(digits) if abs(x) < 10_000 else 0  # whole parts are never cut

    for key, value in full.items():
        if isinstance(value, float) and math.isfinite(value):
            assert shown[key] == round_to(value, 4) and significant(shown[key]) <= 4, key
            assert shown[key] == pytest.approx(value, rel=1e-3), key
        elif hasattr(value, "low"):  # an Interval
            assert (shown[key].low, shown[key].high, shown[key].method) == (
                round_to(value.low, 4), round_to(value.high, 4), value.method)  # fmt: skip
        else:
            assert shown[key] == value, key
    assert round_to(4.444444444443, 4) == 4.444 and round_to(123456.7, 4) == 123457
    assert round_to(0.0012345678, 4) == 0.001235 and math.isnan(round_to(math.nan, 4))
