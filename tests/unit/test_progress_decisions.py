"""mediator.core.progress, whole decisions: each worked example states the complete
:class:`Decision` a result, an answer's progress or an early end writes — the events too, since
the store writes them as they are and the records, the event feed and the simulator read them
back (docs/design.md §9, §10, §12).

``tests/unit/test_progress.py`` checks one rule at a time; these pin every field at once, so a
changed event name, a dropped field of an event or a lost ``run_from`` guard shows here (issue 24:
the mutation score of the policy code).
"""

from __future__ import annotations

from typing import Any

import pytest

from mediator.core.progress import (
    Decision,
    StepMove,
    decide_result,
    drained_at_boundary,
    end_early,
    event,
    progress,
)
from mediator.core.rows import RunLease, Step
from mediator.core.states import InvalidTransition, RunState, StepState, Verdict


def step(seq: int, name: str, node: str = "", state: str = "PENDING", **kw: Any) -> Step:
    fields: dict[str, Any] = {
        "seq": seq, "name": name, "kind": "exec", "role": "r", "uses": "shell", "with_": {},
        "after": [], "ask": "", "state": state, "node_id": node, "instance": "i1",
        "attempt": 1 if state != "PENDING" else 0, "chosen": None, "started_at": None,
        "ended_at": None, "run_id": "run",
    }  # fmt: skip
    fields.update(kw)
    return Step(**fields)


def ask(seq: int, name: str, state: str = "PENDING", **kw: Any) -> Step:
    return step(seq, name, "", state, kind="ask", role="", uses="", ask="ok?", **kw)


def lease(node: str, drain: str = "") -> RunLease:
    return RunLease(node_id=node, instance="i1", drain=drain)


def decide(steps: list[Step], leases: list[RunLease], seq: int, outcome: str, **kw: Any) -> Any:
    s = next(x for x in steps if x.seq == seq)
    args: dict[str, Any] = {"max_attempts": 3, "instance_matches": True}
    args.update(kw)
    run_state = args.pop("run_state", "RUNNING")
    attempt = args.pop("attempt", s.attempt)
    return decide_result(run_state, steps, leases, s, s.node_id, attempt, outcome, **args)


def test_an_event_is_its_kind_node_and_data() -> None:
    assert event("result", "X", seq=1) == {"node_id": "X", "kind": "result", "data": {"seq": 1}}
    assert event("settled") == {"node_id": "", "kind": "settled", "data": {}}


def test_the_last_pass_settles_passed_whole_decision() -> None:
    d = decide([step(1, "a", "X", "CLAIMED", attempt=2)], [lease("X")], 1, "pass")
    assert d == Decision(
        step=StepMove(1, StepState.PASSED, ends=True),
        release=("X",),
        release_reason="settled",
        run_to=RunState.PASSED,
        run_from=RunState.RUNNING,
        verdict=Verdict.PASS,
        close_asks=False,
        head=(event("result", "X", seq=1, attempt=2, outcome="pass"),),
        tail=(event("settled", state="PASSED", verdict="pass"),),
    )


def test_a_failure_with_an_open_ask_settles_failed_and_closes_asks() -> None:
    """b depends on a and is an ask not yet raised: skipped; the run ends FAILED/fail."""
    steps = [step(1, "a", "X", "CLAIMED"), ask(2, "b", after=["a"])]
    d = decide(steps, [lease("X")], 1, "fail")
    assert d == Decision(
        step=StepMove(1, StepState.FAILED, ends=True),
        skipped=(2,),
        release=("X",),
        release_reason="settled",
        run_to=RunState.FAILED,
        verdict=Verdict.FAIL,
        close_asks=True,
        head=(event("result", "X", seq=1, attempt=1, outcome="fail"),),
        tail=(event("settled", state="FAILED", verdict="fail"),),
    )


def test_a_pass_that_makes_an_ask_due_raises_it_and_releases_the_done_node() -> None:
    """R15's partial release rides on the result; the ask after a is raised (§11)."""
    steps = [step(1, "a", "X", "CLAIMED"), ask(2, "q", after=["a"]),
             step(3, "c", "Y", after=["q"])]  # fmt: skip
    d = decide(steps, [lease("X"), lease("Y")], 1, "pass")
    assert d == Decision(
        step=StepMove(1, StepState.PASSED, ends=True),
        asks=(2,),
        release=("X",),
        release_reason="partial",
        head=(event("result", "X", seq=1, attempt=1, outcome="pass"),),
    )


def test_a_retry_rolls_back_whole_decision() -> None:
    d = decide([step(1, "a", "X", "CLAIMED", attempt=2)], [lease("X")], 1, "retry")
    assert d == Decision(
        step=StepMove(1, StepState.PENDING, ends=False),
        head=(event("result", "X", seq=1, attempt=2, outcome="retry", rolled=True),),
    )


def test_a_retry_on_the_last_attempt_fails_the_step() -> None:
    d = decide([step(1, "a", "X", "CLAIMED", attempt=3)], [lease("X")], 1, "retry")
    assert d.step == StepMove(1, StepState.FAILED, ends=True)
    assert d.head == (event("result", "X", seq=1, attempt=3, outcome="retry"),)
    assert (d.run_to, d.verdict) == (RunState.FAILED, Verdict.FAIL)


def test_a_late_result_frees_its_node_whole_decision() -> None:
    """I2's exception ends: the run was cancelled while a ran; its result frees X."""
    steps = [step(1, "a", "X", "CLAIMED"), step(2, "b", "X", "SKIPPED")]
    d = decide(steps, [lease("X")], 1, "fail", run_state="FAILED")
    assert d == Decision(
        step=StepMove(1, StepState.FAILED, ends=True),
        release=("X",),
        release_reason="late_result",
        head=(event("result", "X", seq=1, attempt=1, outcome="fail", late=True),),
    )


def test_a_late_result_keeps_a_node_still_running_another_step_or_not_leased() -> None:
    steps = [step(1, "a", "X", "CLAIMED"), step(2, "b", "X", "CLAIMED")]
    assert decide(steps, [lease("X")], 1, "pass", run_state="FAILED").release == ()
    one = [step(1, "a", "X", "CLAIMED")]
    assert decide(one, [], 1, "pass", run_state="FAILED").release == ()


@pytest.mark.parametrize(
    "kw",
    [{"instance_matches": False}, {"attempt": 2}],
    ids=["another daemon", "an older attempt"],
)
def test_a_late_result_of_another_attempt_or_daemon_changes_nothing(kw: dict[str, Any]) -> None:
    d = decide([step(1, "a", "X", "CLAIMED")], [lease("X")], 1, "pass", run_state="FAILED", **kw)
    assert d == Decision()


def test_a_late_result_for_a_step_no_longer_claimed_changes_nothing() -> None:
    d = decide([step(1, "a", "X", "SKIPPED")], [lease("X")], 1, "pass", run_state="FAILED")
    assert d == Decision()


def test_cancel_whole_decision_keeps_the_node_of_a_claimed_step() -> None:
    """§10 cancel: open steps (PENDING, ASKED) SKIPPED, asks closed, FAILED/cancelled; X runs a
    CLAIMED step and keeps its lease, Y is released."""
    steps = [step(1, "a", "X", "CLAIMED"), ask(2, "q", "ASKED"), step(3, "c", "Y"),
             step(4, "d", "Y", "PASSED")]  # fmt: skip
    d = end_early("RUNNING", steps, [lease("X"), lease("Y")], Verdict.CANCELLED)
    assert d == Decision(
        skipped=(2, 3),
        release=("Y",),
        release_reason="cancelled",
        run_to=RunState.FAILED,
        run_from=RunState.RUNNING,
        verdict=Verdict.CANCELLED,
        close_asks=True,
        tail=(event("settled", state="FAILED", verdict="cancelled"),),
    )


def test_a_queued_run_cancelled_is_failed_from_queued() -> None:
    d = end_early("QUEUED", [step(1, "a")], [], Verdict.CANCELLED)
    assert (d.run_from, d.run_to, d.skipped, d.release) == (
        RunState.QUEUED, RunState.FAILED, (1,), (),
    )  # fmt: skip


def test_lost_with_the_node_gone_skips_its_claimed_step_and_frees_it() -> None:
    steps = [step(1, "a", "X", "CLAIMED"), step(2, "b", "Y", "CLAIMED")]
    d = end_early("RUNNING", steps, [lease("X"), lease("Y")], Verdict.LOST, gone=["X"])
    assert (d.skipped, d.release, d.release_reason) == ((1,), ("X",), "lost")


def test_an_ended_run_cannot_end_again() -> None:
    """Every state the decision writes is an edge of mediator.core.states: PASSED → FAILED is
    not, nor is skipping a step that already ended."""
    with pytest.raises(InvalidTransition):
        end_early("PASSED", [step(1, "a", "X", "PASSED")], [], Verdict.CANCELLED)


def test_a_retry_of_a_step_that_is_not_claimed_is_refused() -> None:
    s = step(1, "a", "X", "PASSED")
    with pytest.raises(InvalidTransition):
        decide_result("RUNNING", [s], [lease("X")], s, "X", 1, "retry", max_attempts=3,
                      instance_matches=True)  # fmt: skip


def test_a_settling_result_of_an_ended_run_state_is_refused() -> None:
    """progress settles only a RUNNING run: run_transition(PASSED, PASSED) is no edge."""
    with pytest.raises(InvalidTransition):
        progress("PASSED", [step(1, "a", "X", "PASSED")], [lease("X")])


def test_at_boundary_drain_whole_decision() -> None:
    """§10 amended: X drains at the boundary, b is still to run on X: the run ends drained."""
    steps = [step(1, "a", "X", "PASSED"), step(2, "b", "X", after=["a"]), step(3, "c", "Y")]
    d = progress("RUNNING", steps, [lease("X", "at-boundary"), lease("Y")])
    assert d == Decision(
        skipped=(2, 3),
        release=("X", "Y"),
        release_reason="drained",
        run_to=RunState.FAILED,
        verdict=Verdict.DRAINED,
        close_asks=True,
        tail=(event("settled", state="FAILED", verdict="drained"),),
    )


def test_drained_at_boundary_needs_no_claimed_step_and_an_open_one() -> None:
    assert drained_at_boundary("X", [step(1, "a", "X")])
    assert not drained_at_boundary("X", [step(1, "a", "X", "CLAIMED"), step(2, "b", "X")])
    assert not drained_at_boundary("X", [step(1, "a", "X", "PASSED")])
    assert not drained_at_boundary("X", [step(1, "a", "Y")])


def test_a_failure_beside_a_passed_step_skips_only_the_open_dependants() -> None:
    """Only the failed step's open dependants move to SKIPPED; a step that already PASSED stays
    as it is (PASSED → SKIPPED is no edge), and the run settles FAILED/fail."""
    steps = [step(1, "a", "X", "PASSED"), step(2, "b", "X", "CLAIMED", after=["a"]),
             step(3, "c", "X", after=["b"])]  # fmt: skip
    d = decide(steps, [lease("X")], 2, "fail")
    assert (d.skipped, d.run_to, d.verdict, d.release) == (
        (3,), RunState.FAILED, Verdict.FAIL, ("X",),
    )  # fmt: skip
