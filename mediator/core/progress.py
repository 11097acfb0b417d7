"""What a step's result does to its run, decided without I/O (docs/design.md §9, issue 13).

A result used to be a locked transaction that asked the database one question at a time (the
leases, the steps again after raising asks, ...). Now the flow reads the run once, this module
decides everything from that one snapshot — the step's new state, the dependants SKIPPED, the
at-boundary drain, the asks due, applyRelease, SettleIfDone — and the store applies the
:class:`Decision` in one statement guarded by the run's version, so a concurrent change makes it
match nothing and the flow reads again. Every state it writes is an edge of
``mediator.core.states``:
the decision checks each move with ``run_transition``/``step_transition`` as it makes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from mediator.core import contract as contract_mod
from mediator.core.rows import RunLease, Step
from mediator.core.states import (
    TERMINAL_RUN,
    TERMINAL_STEP,
    RunState,
    StepState,
    Verdict,
    run_transition,
    settle_verdict,
    step_transition,
)

OPEN = (StepState.PENDING, StepState.ASKED)


def event(kind: str, node_id: str = "", **data: Any) -> dict[str, Any]:
    """An event of the run being decided (the store adds the run_id and the instant)."""
    return {"node_id": node_id, "kind": kind, "data": data}


class StepMove(NamedTuple):
    """What a result does to its own step: ``seq`` moves to ``state``; ``ends`` says whether
    it ends now (a rollback, R15, goes back to PENDING and sets no ``ended_at``)."""

    seq: int
    state: StepState
    ends: bool


@dataclass(frozen=True)
class Decision:
    """Everything one result (or answer) writes, for ``Tx.apply_result``.

    ``step`` is the result's own step (:class:`StepMove`). ``head`` events come first, then one
    ``ask_raised`` per raised ask (the store knows their ids), then ``tail``, then one
    ``lease_released`` per node released, with ``release_reason``. ``settled`` is the run's new
    state when it ends, else "".
    """

    step: StepMove | None = None
    step_from: StepState = StepState.CLAIMED
    skipped: tuple[int, ...] = ()
    asks: tuple[int, ...] = ()
    release: tuple[str, ...] = ()
    release_reason: str = ""
    run_to: RunState | None = None
    run_from: RunState = RunState.RUNNING
    verdict: Verdict | None = None
    close_asks: bool = False
    head: tuple[dict[str, Any], ...] = ()
    tail: tuple[dict[str, Any], ...] = ()

    @property
    def settled(self) -> str:
        return str(self.run_to) if self.run_to is not None else ""


def drained_at_boundary(node_id: str, steps: Iterable[Step]) -> bool:
    """At-boundary drain ends a run only if the run still needs the node: no step of it is
    CLAIMED on the node (the boundary) and some step of it on the node is still open. Called
    only for nodes whose policy is ``at-boundary`` (amended rule, docs/design.md §10)."""
    mine = [s for s in steps if s.node_id == node_id]
    return not any(s.state == StepState.CLAIMED for s in mine) and any(
        s.state not in TERMINAL_STEP for s in mine
    )


def due_asks(steps: Sequence[Step]) -> tuple[int, ...]:
    """raiseAsks (docs/design.md §11): the PENDING ask steps whose ``after`` steps all PASSED."""
    passed = {s.name for s in steps if s.state == StepState.PASSED}
    return tuple(
        s.seq
        for s in steps
        if s.kind == "ask" and s.state == StepState.PENDING and set(s.after) <= passed
    )


def end_early(
    run_state: str,
    steps: Sequence[Step],
    leases: Sequence[RunLease],
    verdict: Verdict,
    *,
    gone: Iterable[str] = (),
) -> Decision:
    """A run ended early (cancel, lost, drained): open steps SKIPPED, asks closed, FAILED.

    A node still running a CLAIMED step keeps its lease until that step's result arrives or the
    lease expires (I2's exception, docs/design.md §10), unless the node is ``gone``: then the
    step can never report and is SKIPPED too.
    """
    gone = set(gone)
    skip = []
    for s in steps:
        if s.state in OPEN or (s.state == StepState.CLAIMED and s.node_id in gone):
            step_transition(s.state, StepState.SKIPPED)
            skip.append(s.seq)
    run_to = run_transition(run_state, RunState.FAILED)
    still = {s.node_id for s in steps if s.state == StepState.CLAIMED and s.node_id not in gone}
    return Decision(
        skipped=tuple(skip),
        release=tuple(sorted(lease.node_id for lease in leases if lease.node_id not in still)),
        release_reason=str(verdict),
        run_to=run_to,
        run_from=RunState(run_state),
        verdict=verdict,
        close_asks=True,
        tail=(event("settled", state=str(RunState.FAILED), verdict=str(verdict)),),
    )


def progress(run_state: str, steps: Sequence[Step], leases: Sequence[RunLease]) -> Decision:
    """After a step became terminal in a RUNNING run: at-boundary drain, raiseAsks,
    applyRelease, SettleIfDone (R15's point: the partial release rides on the result's wake).
    ``steps`` are the run's steps as this result leaves them."""
    if any(drained_at_boundary(x.node_id, steps) for x in leases if x.drain == "at-boundary"):
        # at-boundary drain (docs/design.md §10, amended): a node the run still needs, with no
        # step CLAIMED on it, ends the run — remaining steps SKIPPED, FAILED/drained. A node the
        # run no longer needs is simply released below (applyRelease), so the outcome does not
        # depend on whether the drain advert or the result came first.
        return end_early(run_state, steps, leases, Verdict.DRAINED)
    asks = due_asks(steps)
    if asks:
        for s in steps:
            if s.seq in asks:
                step_transition(s.state, StepState.ASKED)
        steps = [replace(s, state=StepState.ASKED) if s.seq in asks else s for s in steps]
    leased = [x.node_id for x in leases]
    decision = settle_verdict(s.state for s in steps)
    if decision is not None:
        state, verdict = decision
        return Decision(
            asks=asks,
            release=tuple(sorted(leased)),
            release_reason="settled",
            run_to=run_transition(run_state, state),
            run_from=RunState(run_state),
            verdict=verdict,
            close_asks=any(s.kind == "ask" for s in steps),
            tail=(event("settled", state=str(state), verdict=str(verdict)),),
        )
    # applyRelease: a node whose steps in this run are all terminal is free at once.
    done = [n for n in leased if all(s.state in TERMINAL_STEP for s in steps if s.node_id == n)]
    return Decision(asks=asks, release=tuple(sorted(done)), release_reason="partial")


def decide_result(
    run_state: str,
    steps: Sequence[Step],
    leases: Sequence[RunLease],
    step: Step,
    node_id: str,
    attempt: int,
    outcome: str,
    *,
    max_attempts: int,
    instance_matches: bool,
) -> Decision:
    """A result the flow has already accepted (the node's step, the current attempt and
    instance while the run is RUNNING; see ``report``), as one :class:`Decision`.

    For a run that already ended, the result is recorded only for the current attempt of the
    current instance (``instance_matches``) and frees the node unless another step of the run is
    still CLAIMED on it (I2's exception ends here); the flow answers 409 ``run_ended``.
    """
    if run_state in TERMINAL_RUN:
        if not (step.state == StepState.CLAIMED and step.attempt == attempt and instance_matches):
            return Decision()
        state = step_transition(step.state, _final(outcome))
        busy = {s.node_id for s in steps if s.state == StepState.CLAIMED and s.seq != step.seq}
        held = {x.node_id for x in leases}
        return Decision(
            step=StepMove(step.seq, state, ends=True),
            release=(node_id,) if node_id not in busy and node_id in held else (),
            release_reason="late_result",
            head=(
                event("result", node_id, seq=step.seq, attempt=attempt, outcome=outcome, late=True),
            ),
        )
    if outcome == "retry" and attempt < max_attempts:
        # R15: a rollback releases nothing, so it does not wake.
        return Decision(
            step=StepMove(step.seq, step_transition(step.state, StepState.PENDING), ends=False),
            head=(
                event(
                    "result", node_id, seq=step.seq, attempt=attempt, outcome="retry", rolled=True
                ),
            ),
        )
    state = step_transition(step.state, _final(outcome))
    skipped: tuple[int, ...] = ()
    if state == StepState.FAILED:
        names = contract_mod.dependants(steps, step.name)  # type: ignore[arg-type]
        skipped = tuple(s.seq for s in steps if s.name in names and s.state in OPEN)
        for s in steps:
            if s.seq in skipped:
                step_transition(s.state, StepState.SKIPPED)
    after = [
        replace(s, state=state)
        if s.seq == step.seq
        else replace(s, state=StepState.SKIPPED)
        if s.seq in skipped
        else s
        for s in steps
    ]
    rest = progress(run_state, after, leases)
    head = (event("result", node_id, seq=step.seq, attempt=attempt, outcome=outcome),)
    return replace(
        rest,
        step=StepMove(step.seq, state, ends=True),
        skipped=tuple(sorted({*skipped, *rest.skipped})),
        head=head,
    )


def _final(outcome: str) -> StepState:
    return StepState.PASSED if outcome == "pass" else StepState.FAILED
