"""The run and step state machines, written once as tables (docs/design.md §2).

Every state change in the Mediator goes through ``run_transition`` or ``step_transition``, so the
tables below are the whole truth about which moves exist; a move not in a table is a bug or a race
lost to another process, and raises ``InvalidTransition`` (409) instead of writing it.

Run::

    (no row) → QUEUED | RUNNING | FAILED    submit: 202 queued, 201 matched, 422 rejected
    QUEUED   → RUNNING                      promotion (R8)
    QUEUED   → FAILED                       cancel while queued
    RUNNING  → PASSED | FAILED              settle; cancel, lost, drained

There is no READY state (NFR-I2), and a QUEUED run never settles PASSED: it has run nothing.

Step::

    (no row) → PENDING                      every step exists from submit (R5)
    (no row) → SKIPPED                      a rejected run (422): recorded, drawable, never runnable
    PENDING  → CLAIMED                      a node claims an exec step
    PENDING  → ASKED                        raiseAsks: an ask step is due (never while QUEUED, R4)
    PENDING  → SKIPPED                      a dependency failed; run cancelled, lost or drained
    CLAIMED  → PASSED | FAILED              the node's result (also after the run ended, §7.5)
    CLAIMED  → PENDING                      a ``retry`` result: rollback, attempt kept (R15)
    CLAIMED  → SKIPPED                      the node that claimed it is gone (see below)
    ASKED    → PASSED | FAILED              the person's answer
    ASKED    → SKIPPED                      run cancelled, lost or drained; the ask is closed

Why CLAIMED → SKIPPED exists. Cancel and at-boundary drain leave CLAIMED steps alone: their node is
still working and its result, when it comes, is recorded (CLAIMED → PASSED | FAILED) while the node
keeps its lease (I2's exception). But two events mean the result can never come: the node's lease
expired (the reaper found it gone) and restart detection (a new daemon instance; results under the
old instance are refused with 409). Left CLAIMED, such a step would show as running forever on a
terminal run. FAILED would assert an outcome nobody observed; SKIPPED says what the seeds mean by
it — the step can no longer run — while its ``attempt`` and ``started_at`` still show that it had
started, and the run's verdict (``lost``) says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final, TypeVar

from mediator.core.errors import Conflict


class RunState(StrEnum):
    """``runs.state``."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    PASSED = "PASSED"
    FAILED = "FAILED"


class StepState(StrEnum):
    """``steps.state``."""

    PENDING = "PENDING"
    CLAIMED = "CLAIMED"
    ASKED = "ASKED"
    PASSED = "PASSED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"


class Verdict(StrEnum):
    """``runs.verdict``: null until the run is terminal, then why it ended (docs/design.md §2)."""

    PASS = "pass"
    FAIL = "fail"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    LOST = "lost"
    DRAINED = "drained"


_Q, _R = RunState.QUEUED, RunState.RUNNING
_RP, _RF = RunState.PASSED, RunState.FAILED

RUN_TRANSITIONS: Final[Mapping[RunState | None, frozenset[RunState]]] = MappingProxyType(
    {
        None: frozenset({_Q, _R, _RF}),
        _Q: frozenset({_R, _RF}),
        _R: frozenset({_RP, _RF}),
        _RP: frozenset(),
        _RF: frozenset(),
    }
)

_PE, _CL, _AS = StepState.PENDING, StepState.CLAIMED, StepState.ASKED
_SP, _SF, _SK = StepState.PASSED, StepState.FAILED, StepState.SKIPPED

STEP_TRANSITIONS: Final[Mapping[StepState | None, frozenset[StepState]]] = MappingProxyType(
    {
        None: frozenset({_PE, _SK}),
        _PE: frozenset({_CL, _AS, _SK}),
        _CL: frozenset({_SP, _SF, _PE, _SK}),
        _AS: frozenset({_SP, _SF, _SK}),
        _SP: frozenset(),
        _SF: frozenset(),
        _SK: frozenset(),
    }
)

TERMINAL_RUN: Final = frozenset({RunState.PASSED, RunState.FAILED})
TERMINAL_STEP: Final = frozenset({StepState.PASSED, StepState.FAILED, StepState.SKIPPED})


_E = TypeVar("_E", RunState, StepState)


class InvalidTransition(Conflict):
    """A state change the tables do not allow: a bug, or a race lost to another process (409)."""

    code = "invalid_transition"


def run_transition(frm: RunState | str | None, to: RunState | str) -> RunState:
    """Check a run state change against ``RUN_TRANSITIONS``.

    Args:
        frm: The current state (a database string is fine), or ``None`` for a run not yet stored.
        to: The state to move to.

    Returns:
        ``to`` as a ``RunState``, for writing.

    Raises:
        InvalidTransition: The move is not in the table, or a state is unknown.
    """
    return _transition(RUN_TRANSITIONS, RunState, "run", frm, to)


def step_transition(frm: StepState | str | None, to: StepState | str) -> StepState:
    """Check a step state change against ``STEP_TRANSITIONS``.

    Args:
        frm: The current state (a database string is fine), or ``None`` for a step not yet stored.
        to: The state to move to.

    Returns:
        ``to`` as a ``StepState``, for writing.

    Raises:
        InvalidTransition: The move is not in the table, or a state is unknown.
    """
    return _transition(STEP_TRANSITIONS, StepState, "step", frm, to)


def run_sources(to: RunState | str) -> tuple[RunState, ...]:
    """The stored run states from which ``to`` is an edge of ``RUN_TRANSITIONS``, in table order:
    a state-writing statement guards on them (``state = ANY(...)``), so the table decides in SQL
    too (issue 13)."""
    target = _member(RunState, to, "run")
    return tuple(s for s, targets in RUN_TRANSITIONS.items() if s is not None and target in targets)


def step_sources(to: StepState | str) -> tuple[StepState, ...]:
    """The stored step states from which ``to`` is an edge of ``STEP_TRANSITIONS`` (see
    :func:`run_sources`)."""
    target = _member(StepState, to, "step")
    return tuple(
        s for s, targets in STEP_TRANSITIONS.items() if s is not None and target in targets
    )


def settle_verdict(step_states: Iterable[str]) -> tuple[RunState, Verdict] | None:
    """Decide ``SettleIfDone`` for a RUNNING run from its steps' states (docs/design.md §9).

    Args:
        step_states: The state of every step of the run.

    Returns:
        ``None`` while any step is not terminal (the run goes on); ``(PASSED, pass)`` when every
        step PASSED; ``(FAILED, fail)`` otherwise (a FAILED or SKIPPED step).

    Raises:
        ValueError: A state is unknown, or there are no steps (every contract has at least one,
            so settling an empty run would be a bug, not a pass).
    """
    states = [StepState(s) for s in step_states]
    if not states:
        raise ValueError("a run has at least one step; refusing to settle an empty one")
    if not all(s in TERMINAL_STEP for s in states):
        return None
    if all(s is StepState.PASSED for s in states):
        return RunState.PASSED, Verdict.PASS
    return RunState.FAILED, Verdict.FAIL


def _transition(
    table: Mapping[_E | None, frozenset[_E]],
    enum: type[_E],
    machine: str,
    frm: _E | str | None,
    to: _E | str,
) -> _E:
    """One table lookup shared by both machines: the move must be listed, or it is refused."""
    source = None if frm is None else _member(enum, frm, machine)
    target = _member(enum, to, machine)
    if target not in table[source]:
        raise InvalidTransition(f"A {machine} cannot go from {source or 'no row'} to {target}.")
    return target


def _member(enum: type[_E], value: _E | str, machine: str) -> _E:
    try:
        return enum(value)
    except ValueError:
        raise InvalidTransition(f"{value!r} is not a {machine} state.") from None
