"""The run and step state machines as tables (docs/design.md §2), checked move by move.

The tables are asserted literally first, so any change to them is a visible change to this file;
then every allowed move is accepted and every other move refused.
"""

from __future__ import annotations

import itertools

import pytest

from mediator.core.errors import Conflict, MediatorError
from mediator.core.states import (
    RUN_TRANSITIONS,
    STEP_TRANSITIONS,
    TERMINAL_RUN,
    TERMINAL_STEP,
    InvalidTransition,
    RunState,
    StepState,
    Verdict,
    run_transition,
    settle_verdict,
    step_transition,
)

Q, R, P, F = RunState.QUEUED, RunState.RUNNING, RunState.PASSED, RunState.FAILED
PE, CL, AS = StepState.PENDING, StepState.CLAIMED, StepState.ASKED
SP, SF, SK = StepState.PASSED, StepState.FAILED, StepState.SKIPPED


def test_run_table_is_exactly_section_2() -> None:
    """Submit goes to QUEUED (202), RUNNING (201) or FAILED (422); no READY state (NFR-I2)."""
    assert dict(RUN_TRANSITIONS) == {
        None: {Q, R, F},
        Q: {R, F},
        R: {P, F},
        P: set(),
        F: set(),
    }
    assert [s.value for s in RunState] == ["QUEUED", "RUNNING", "PASSED", "FAILED"]


def test_step_table_is_exactly_section_2() -> None:
    assert dict(STEP_TRANSITIONS) == {
        None: {PE, SK},
        PE: {CL, AS, SK},
        CL: {SP, SF, PE, SK},
        AS: {SP, SF, SK},
        SP: set(),
        SF: set(),
        SK: set(),
    }


def test_verdicts_are_the_stored_lowercase_words() -> None:
    assert [v.value for v in Verdict] == [
        "pass",
        "fail",
        "rejected",
        "cancelled",
        "lost",
        "drained",
    ]


def test_tables_cannot_be_changed_at_run_time() -> None:
    with pytest.raises(TypeError):
        RUN_TRANSITIONS[Q] = frozenset({P})  # type: ignore[index]


@pytest.mark.parametrize(
    ("frm", "to"), [(frm, to) for frm, tos in RUN_TRANSITIONS.items() for to in sorted(tos)]
)
def test_every_allowed_run_move_is_accepted(frm: RunState | None, to: RunState) -> None:
    assert run_transition(frm, to) is to
    # Rows come back from the database as plain strings.
    assert run_transition(None if frm is None else str(frm), str(to)) is to


@pytest.mark.parametrize(
    ("frm", "to"), [(frm, to) for frm, tos in STEP_TRANSITIONS.items() for to in sorted(tos)]
)
def test_every_allowed_step_move_is_accepted(frm: StepState | None, to: StepState) -> None:
    assert step_transition(frm, to) is to
    assert step_transition(None if frm is None else str(frm), str(to)) is to


RUN_FORBIDDEN = [
    (frm, to)
    for frm, to in itertools.product([None, *RunState], RunState)
    if to not in RUN_TRANSITIONS[frm]
]
STEP_FORBIDDEN = [
    (frm, to)
    for frm, to in itertools.product([None, *StepState], StepState)
    if to not in STEP_TRANSITIONS[frm]
]


@pytest.mark.parametrize(("frm", "to"), RUN_FORBIDDEN)
def test_every_other_run_move_is_refused(frm: RunState | None, to: RunState) -> None:
    with pytest.raises(InvalidTransition):
        run_transition(frm, to)


@pytest.mark.parametrize(("frm", "to"), STEP_FORBIDDEN)
def test_every_other_step_move_is_refused(frm: StepState | None, to: StepState) -> None:
    with pytest.raises(InvalidTransition):
        step_transition(frm, to)


@pytest.mark.parametrize(
    ("frm", "to", "why"),
    [
        (Q, P, "a queued run has run nothing, so it cannot pass"),
        (R, Q, "promotion is one way: a running run never goes back to the queue"),
        (F, R, "a terminal run stays terminal"),
        (P, F, "a passed run is not failed afterwards"),
        (None, P, "a run is never created already passed"),
    ],
)
def test_named_forbidden_run_moves(frm: RunState | None, to: RunState, why: str) -> None:
    with pytest.raises(InvalidTransition) as caught:
        run_transition(frm, to)
    assert str(to) in caught.value.message, why


@pytest.mark.parametrize(
    ("frm", "to", "why"),
    [
        (PE, SP, "an exec step must be claimed before it can pass"),
        (PE, SF, "dependants of a failure become SKIPPED, not FAILED"),
        (AS, CL, "an ask is answered by a person, never claimed by a node"),
        (AS, PE, "an ask is not rolled back"),
        (SK, PE, "a skipped step never runs again"),
        (SP, PE, "a passed step is not retried"),
        (None, CL, "every step starts PENDING (R5)"),
    ],
)
def test_named_forbidden_step_moves(frm: StepState | None, to: StepState, why: str) -> None:
    with pytest.raises(InvalidTransition) as caught:
        step_transition(frm, to)
    assert str(to) in caught.value.message, why


def test_rejected_run_is_created_failed_with_its_steps_skipped() -> None:
    """R1, R5: a 422 run still has its steps (for the record and S2), and none of them can run."""
    assert run_transition(None, "FAILED") is F
    assert step_transition(None, "SKIPPED") is SK


def test_retry_is_a_rollback_from_claimed_to_pending() -> None:
    """R15: a `retry` result puts the step back to PENDING (and wakes nothing)."""
    assert step_transition("CLAIMED", "PENDING") is PE


def test_claimed_step_of_an_ended_run_can_still_get_its_result() -> None:
    """§7.5: cancel leaves CLAIMED steps alone; the late result is still recorded."""
    assert step_transition(CL, SP) is SP
    assert step_transition(CL, SF) is SF


def test_terminal_sets_agree_with_the_tables() -> None:
    assert {s for s in RunState if not RUN_TRANSITIONS[s]} == TERMINAL_RUN == {P, F}
    assert {s for s in StepState if not STEP_TRANSITIONS[s]} == TERMINAL_STEP == {SP, SF, SK}


def test_every_state_is_reachable_from_no_row() -> None:
    for table, states in ((RUN_TRANSITIONS, set(RunState)), (STEP_TRANSITIONS, set(StepState))):
        seen: set[object] = set()
        todo: list[object] = [None]
        while todo:
            for nxt in table[todo.pop()]:  # type: ignore[index]
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert seen == states


def test_invalid_transition_is_a_409_conflict() -> None:
    with pytest.raises(InvalidTransition) as caught:
        run_transition("PASSED", "RUNNING")
    err = caught.value
    assert isinstance(err, Conflict)
    assert isinstance(err, MediatorError)
    assert (err.status, err.code) == (409, "invalid_transition")
    assert err.as_dict() == {
        "code": "invalid_transition",
        "message": "A run cannot go from PASSED to RUNNING.",
        "field": None,
    }


def test_no_row_is_named_in_the_message() -> None:
    with pytest.raises(InvalidTransition, match="from no row to CLAIMED"):
        step_transition(None, "CLAIMED")


@pytest.mark.parametrize("bad", ["READY", "queued", ""])
def test_unknown_states_are_refused(bad: str) -> None:
    """NFR-I2: there is no READY state; states are case-sensitive database words."""
    with pytest.raises(InvalidTransition, match="is not a run state"):
        run_transition(bad, "RUNNING")
    with pytest.raises(InvalidTransition, match="is not a run state"):
        run_transition("QUEUED", bad)
    with pytest.raises(InvalidTransition, match="is not a step state"):
        step_transition(bad, "PENDING")


# --- settle_verdict (SettleIfDone) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        (["PASSED"], (P, Verdict.PASS)),
        (["PASSED", "PASSED", "PASSED"], (P, Verdict.PASS)),
        (["PASSED", "FAILED", "SKIPPED"], (F, Verdict.FAIL)),
        (["FAILED"], (F, Verdict.FAIL)),
        (["SKIPPED", "PASSED"], (F, Verdict.FAIL)),
        (["PASSED", "PENDING"], None),
        (["FAILED", "CLAIMED"], None),
        (["PASSED", "ASKED", "SKIPPED"], None),
        ([PE], None),
    ],
)
def test_settle_verdict(states: list[str], expected: tuple[RunState, Verdict] | None) -> None:
    """§7.4 SettleIfDone: nothing while a step is open; PASSED only if every step passed."""
    assert settle_verdict(states) == expected


def test_settle_verdict_accepts_any_iterable() -> None:
    assert settle_verdict(s for s in ("PASSED", "PASSED")) == (P, Verdict.PASS)


def test_settle_verdict_refuses_an_empty_run() -> None:
    """A contract has at least one step (R5), so an empty run is a bug, not a pass."""
    with pytest.raises(ValueError, match="at least one step"):
        settle_verdict([])


def test_settle_verdict_refuses_unknown_states() -> None:
    with pytest.raises(ValueError):
        settle_verdict(["PASSED", "DONE"])


def test_an_unknown_state_is_named_with_its_machine_in_the_refusal() -> None:
    """The sources of a target that is no state: the refusal says which machine it is not a state
    of (the message a caller of a guarded statement sees), and settling no steps is refused."""
    from mediator.core.states import InvalidTransition, run_sources, settle_verdict, step_sources

    with pytest.raises(InvalidTransition, match=r"^'DONE' is not a run state\.$"):
        run_sources("DONE")
    with pytest.raises(InvalidTransition, match=r"^'DONE' is not a step state\.$"):
        step_sources("DONE")
    with pytest.raises(ValueError, match=r"^a run has at least one step; refusing to settle an "
                                         r"empty one$"):  # fmt: skip
        settle_verdict([])
