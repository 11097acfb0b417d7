"""mediator.core.progress: what a result does to its run, decided without a database (issue 13).

The result flow reads the run once and applies this decision in one guarded statement; these
worked examples pin each rule of docs/design.md §9–10 on the pure function alone.
"""

from __future__ import annotations

from typing import Any

from mediator.core.progress import StepMove, decide_result, due_asks, end_early, progress
from mediator.core.rows import RunLease, Step
from mediator.core.states import RunState, StepState, Verdict


def step(seq: int, name: str, node: str = "", state: str = "PENDING", **kw: Any) -> Step:
    fields: dict[str, Any] = {
        "seq": seq, "name": name, "kind": "exec", "role": "r", "uses": "shell", "with_": {},
        "after": [], "ask": "", "state": state, "node_id": node, "instance": "i1",
        "attempt": 1 if state != "PENDING" else 0, "chosen": None, "started_at": None,
        "ended_at": None, "run_id": "run",
    }  # fmt: skip
    fields.update(kw)
    return Step(**fields)


def lease(node: str, drain: str = "") -> RunLease:
    return RunLease(node_id=node, instance="i1", drain=drain)


def result(steps: list[Step], leases: list[RunLease], seq: int, outcome: str, **kw: Any) -> Any:
    s = next(x for x in steps if x.seq == seq)
    args: dict[str, Any] = {"max_attempts": 3, "instance_matches": True}
    args.update(kw)
    run_state = args.pop("run_state", "RUNNING")
    return decide_result(run_state, steps, leases, s, s.node_id, s.attempt, outcome, **args)


def test_the_last_step_passing_settles_the_run_and_frees_every_node() -> None:
    d = result([step(1, "a", "X", "CLAIMED")], [lease("X")], 1, "pass")
    assert d.step == StepMove(1, StepState.PASSED, ends=True)
    assert (d.run_to, d.verdict, d.release, d.release_reason) == (
        RunState.PASSED, Verdict.PASS, ("X",), "settled",
    )  # fmt: skip
    assert [e["kind"] for e in (*d.head, *d.tail)] == ["result", "settled"]
    assert d.settled == "PASSED"


def test_a_failure_skips_its_dependants_and_settles_failed() -> None:
    steps = [step(1, "a", "X", "CLAIMED"), step(2, "b", "X", after=["a"]), step(3, "c", "X")]
    d = result(steps, [lease("X")], 1, "fail")
    assert d.step == StepMove(1, StepState.FAILED, ends=True)
    assert d.skipped == (2,)  # c does not depend on a: it still runs
    assert d.run_to is None and d.release == ()  # X still has c to run


def test_partial_release_frees_a_node_whose_steps_are_all_done() -> None:
    # applyRelease: X is done with the run, Y still has work; only X goes (R15's point).
    steps = [step(1, "a", "X", "CLAIMED"), step(2, "b", "Y")]
    d = result(steps, [lease("X"), lease("Y")], 1, "pass")
    assert (d.release, d.release_reason, d.run_to) == (("X",), "partial", None)


def test_an_at_boundary_node_the_run_still_needs_ends_it_drained() -> None:
    # docs/design.md §10 (amended): Y drains at the boundary and still has a PENDING step.
    steps = [step(1, "a", "X", "CLAIMED"), step(2, "b", "Y"), step(3, "c", "Z", "CLAIMED")]
    leases = [lease("X"), lease("Y", "at-boundary"), lease("Z")]
    d = result(steps, leases, 1, "pass")
    assert (d.run_to, d.verdict, d.skipped) == (RunState.FAILED, Verdict.DRAINED, (2,))
    assert d.release == ("X", "Y")  # Z still runs its CLAIMED step: I2's exception
    assert d.close_asks and d.release_reason == "drained"


def test_an_ask_whose_after_steps_passed_is_raised_and_holds_the_run_open() -> None:
    ask = step(2, "ok?", kind="ask", ask="Fine?", after=["a"], role="")
    d = result([step(1, "a", "X", "CLAIMED"), ask], [lease("X")], 1, "pass")
    assert d.asks == (2,)
    assert d.run_to is None and d.release == ("X",)  # X is done; the run waits for a person
    assert due_asks([step(1, "a", "X", "CLAIMED"), ask]) == ()


def test_a_retry_rolls_back_until_the_last_attempt_which_fails() -> None:
    d = result([step(1, "a", "X", "CLAIMED")], [lease("X")], 1, "retry")
    assert d.step == StepMove(1, StepState.PENDING, ends=False)
    assert d.release == () and d.step.ends is False  # R15: no release, no ended_at
    last = step(1, "a", "X", "CLAIMED", attempt=3)
    d = result([last], [lease("X")], 1, "retry")
    assert d.step == StepMove(1, StepState.FAILED, ends=True) and d.run_to == RunState.FAILED


def test_a_late_result_records_the_step_and_frees_the_node_unless_it_is_still_busy() -> None:
    steps = [step(1, "a", "X", "CLAIMED"), step(2, "b", "X", "CLAIMED")]
    d = result(steps, [lease("X")], 1, "pass", run_state="FAILED")
    assert d.step == StepMove(1, StepState.PASSED, ends=True)
    assert d.release == () and d.run_to is None  # b is still CLAIMED on X
    d = result([step(1, "a", "X", "CLAIMED")], [lease("X")], 1, "pass", run_state="FAILED")
    assert (d.release, d.release_reason) == (("X",), "late_result")
    assert d.head[0]["data"]["late"] is True
    stale = result([step(1, "a", "X", "CLAIMED")], [lease("X")], 1, "pass",
                   run_state="FAILED", instance_matches=False)  # fmt: skip
    assert stale.step is None and stale.head == ()  # nothing to write


def test_ending_early_keeps_the_lease_of_a_node_still_running_a_claimed_step() -> None:
    steps = [step(1, "a", "X", "CLAIMED"), step(2, "b", "Y"), step(3, "c", "Y", "ASKED")]
    d = end_early("RUNNING", steps, [lease("X"), lease("Y")], Verdict.CANCELLED)
    assert (d.skipped, d.release) == ((2, 3), ("Y",))
    gone = end_early("RUNNING", steps, [lease("X"), lease("Y")], Verdict.LOST, gone=["X"])
    assert (gone.skipped, gone.release) == ((1, 2, 3), ("X", "Y"))


def test_progress_settles_from_the_steps_as_the_result_left_them() -> None:
    d = progress("RUNNING", [step(1, "a", "X", "PASSED"), step(2, "b", "X", "SKIPPED")],
                 [lease("X")])  # fmt: skip
    assert (d.run_to, d.verdict) == (RunState.FAILED, Verdict.FAIL)
