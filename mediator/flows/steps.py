"""Steps: work, claim, result — and the shared moves that end or advance a run (docs/design.md §9).

Steps are claimed and reported by nodes; a result releases nodes as soon as they are done with a
run (applyRelease), settles the run when every step is terminal (SettleIfDone), and wakes the queue
(wake 1). :func:`progress`, :func:`end` and :func:`release` are the moves the other flows share
(answers, cancel, the reaper, restart detection, drains): each runs inside its caller's
transaction, which follows the locking rule — run row, then steps, leases, asks. Sealing, PushAsks
and the wake run after commit through :class:`~mediator.flows.after.AfterCommit`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from mediator import contract as contract_mod
from mediator.errors import Conflict, ContractError, Forbidden, NotFound
from mediator.flows.after import Change
from mediator.flows.wake import Wake
from mediator.rows import ClaimRefusal, Run, Step
from mediator.states import (
    TERMINAL_RUN,
    TERMINAL_STEP,
    RunState,
    StepState,
    Verdict,
    run_transition,
    settle_verdict,
    step_transition,
)
from mediator.store.db import Tx

if TYPE_CHECKING:
    from mediator.flows.context import Context

OUTCOMES = ("pass", "fail", "retry")
MAX_LOG = 1_000_000
OPEN = (StepState.PENDING, StepState.ASKED)


@dataclass(frozen=True)
class ReportResult:
    """What a result did: ``settled`` is SettleIfDone's answer (the new state or "")."""

    settled: str
    rolled: bool
    released: tuple[str, ...]
    step_state: str


def ev(run_id: str, kind: str, node_id: str = "", **data: Any) -> dict[str, Any]:
    return {"run_id": run_id, "node_id": node_id, "kind": kind, "data": data}


def drained_at_boundary(node_id: str, steps: Iterable[Step]) -> bool:
    """At-boundary drain ends a run only if the run still needs the node: no step of it is
    CLAIMED on the node (the boundary) and some step of it on the node is still open. Called
    only for nodes whose policy is ``at-boundary`` (amended rule, docs/design.md)."""
    mine = [s for s in steps if s.node_id == node_id]
    return not any(s.state == StepState.CLAIMED for s in mine) and any(
        s.state not in TERMINAL_STEP for s in mine
    )


# ---- shared moves of every flow ------------------------------------------------------------------
def release(
    tx: Tx, run_id: str, nodes: Iterable[str], reason: str, events: list[dict[str, Any]]
) -> list[str]:
    """Free the run's leases on ``nodes``, one ``lease_released`` event each; the nodes freed."""
    released = tx.delete_leases(run_id, sorted(set(nodes)))
    events += [ev(run_id, "lease_released", n, reason=reason) for n in released]
    return released


def end(
    tx: Tx,
    run: Run,
    steps: list[Step],
    verdict: Verdict,
    events: list[dict[str, Any]],
    *,
    gone: Iterable[str] = (),
) -> list[str]:
    """End a run early (cancel, lost, drained): open steps SKIPPED, asks closed, FAILED.

    A node still running a CLAIMED step keeps its lease until that step's result arrives or
    the lease expires (I2's exception; our departure from the original design, design.md
    §21), unless the node is ``gone`` (its lease expired or its daemon restarted): then the
    step can never report and is SKIPPED too. Returns the released nodes.
    """
    gone = set(gone)
    skip = []
    for s in steps:
        if s.state in OPEN or (s.state == StepState.CLAIMED and s.node_id in gone):
            step_transition(s.state, StepState.SKIPPED)
            skip.append(s.seq)
    tx.skip_steps(run.run_id, skip)
    tx.close_asks(run.run_id)
    run_transition(run.state, RunState.FAILED)
    tx.end_run(run.run_id, RunState.FAILED, verdict)
    events.append(ev(run.run_id, "settled", state="FAILED", verdict=str(verdict)))
    still = {s.node_id for s in steps if s.state == StepState.CLAIMED and s.node_id not in gone}
    leased = [r["node_id"] for r in tx.run_leases(run.run_id)]
    return release(tx, run.run_id, [n for n in leased if n not in still], str(verdict), events)


def progress(
    tx: Tx,
    run: Run,
    events: list[dict[str, Any]],
    steps: list[Step] | None = None,
) -> Change:
    """After a step became terminal in a RUNNING run: at-boundary drain, raiseAsks,
    applyRelease, SettleIfDone — all inside the caller's transaction (R15's point: the
    partial release rides on the result's wake). ``steps`` is the run's steps as this
    transaction left them, when the caller knows them (saves a read)."""
    change = Change(run.run_id)
    if steps is None:
        steps = tx.steps(run.run_id)
    leases = tx.run_leases(run.run_id)
    leased = [r["node_id"] for r in leases]
    if any(drained_at_boundary(r["node_id"], steps) for r in leases if r["drain"] == "at-boundary"):
        # at-boundary drain (docs/design.md §10, amended): a node the run still needs, with
        # no step CLAIMED on it, ends the run — remaining steps SKIPPED, FAILED/drained.
        # A node the run no longer needs is simply released below (applyRelease), so the
        # outcome does not depend on whether the drain advert or the result came first.
        change.released = end(tx, run, steps, Verdict.DRAINED, events)
        change.settled = RunState.FAILED
        return change
    if any(s.kind == "ask" and s.state == StepState.PENDING for s in steps):
        change.asks = tx.raise_asks(run.run_id)
        if change.asks:
            steps = tx.steps(run.run_id)
    # applyRelease: a node whose steps in this run are all terminal is free at once.
    done = [n for n in leased if all(s.state in TERMINAL_STEP for s in steps if s.node_id == n)]
    decision = settle_verdict(s.state for s in steps)
    if decision is not None:
        state, verdict = decision
        run_transition(run.state, state)
        tx.end_run(run.run_id, state, verdict)
        if any(s.kind == "ask" for s in steps):
            tx.close_asks(run.run_id)
        events.append(ev(run.run_id, "settled", state=str(state), verdict=str(verdict)))
        change.settled = state
        change.released = release(tx, run.run_id, leased, "settled", events)
    else:
        change.released = release(tx, run.run_id, done, "partial", events)
    return change


# ---- steps (docs/design.md §9) -------------------------------------------------------------------
def work(ctx: Context, node_id: str) -> list[Step]:
    """Claimable steps of ``node_id``: PENDING, on it, every ``after`` PASSED, run RUNNING."""
    with ctx.store.autocommit() as tx:
        return tx.work(node_id)


def locked(
    tx: Tx, run_id: str, seq: int, node_id: str | None = None
) -> tuple[Run, list[Step], Step]:
    """Lock the run, then its steps (the locking rule); with ``node_id``, refuse a step
    that belongs to another node (403 ``not_your_step``)."""
    run, steps, step, _ = locked_with_node(tx, run_id, seq, node_id)
    return run, steps, step


def locked_with_node(
    tx: Tx, run_id: str, seq: int, node_id: str | None = None
) -> tuple[Run, list[Step], Step, dict[str, Any] | None]:
    """:func:`locked` and the node's row, read in the same statement (issue 13)."""
    run, steps, node = tx.lock_run_steps(run_id, node_id)
    if run is None:
        raise NotFound(f"No run with run_id {run_id!r}.", code="unknown_run")
    step = next((s for s in steps if s.seq == seq), None)
    if step is None:
        raise NotFound(f"Run {run_id} has no step {seq}.", code="unknown_step")
    if node_id is not None and step.node_id != node_id:
        raise Forbidden(
            f"Step {seq} of run {run_id} is not assigned to {node_id}.", code="not_your_step"
        )
    return run, steps, step, node


def claim(ctx: Context, run_id: str, seq: int, node_id: str, instance: str | None = None) -> Step:
    """PENDING → CLAIMED for the node the step belongs to.

    Raises:
        Forbidden: ``not_your_step`` — the step is another node's (403).
        Conflict: ``run_ended``, ``stale_instance``, ``draining``, ``already_claimed`` or
            ``not_claimable`` (409).
    """
    step_transition(StepState.PENDING, StepState.CLAIMED)  # the only move a claim makes
    # issue 13: one guarded statement; the read that picks the error code runs only when it
    # matched nothing. A refusal read that finds the step claimable after all (a
    # concurrent change between the two statements) tries the claim again.
    for _ in range(3):
        with ctx.store.autocommit() as tx:
            claimed = tx.claim_step(run_id, seq, node_id, instance)
            if claimed is not None:
                return claimed
            why = tx.claim_refusal(run_id, seq, node_id)
        refuse_claim(run_id, seq, node_id, instance, why)
    raise Conflict(f"Step {seq} of run {run_id} cannot be claimed now.", code="not_claimable")


def refuse_claim(
    run_id: str, seq: int, node_id: str, instance: str | None, why: ClaimRefusal | None
) -> None:
    """Raise the error a claim that matched nothing deserves, in the order of
    docs/design.md §9; return only if every condition holds now (the caller tries again)."""
    if why is None:
        raise NotFound(f"No run with run_id {run_id!r}.", code="unknown_run")
    if why.step_seq is None:
        raise NotFound(f"Run {run_id} has no step {seq}.", code="unknown_step")
    if why.step_node != node_id:
        raise Forbidden(
            f"Step {seq} of run {run_id} is not assigned to {node_id}.", code="not_your_step"
        )
    if why.run_state != RunState.RUNNING:
        raise Conflict(f"Run {run_id} has ended ({why.run_state}).", code="run_ended")
    if instance is not None and instance != why.node_instance:
        raise Conflict(
            "This daemon instance is stale; advertise again first.", code="stale_instance"
        )
    if why.node_drain == "at-boundary":
        raise Conflict(f"Node {node_id} is draining at the step boundary.", code="draining")
    if why.step_state == StepState.CLAIMED:
        raise Conflict(f"Step {seq} of run {run_id} is already claimed.", code="already_claimed")
    if why.step_state != StepState.PENDING or why.step_kind != "exec" or not why.after_passed:
        raise Conflict(f"Step {seq} of run {run_id} cannot be claimed now.", code="not_claimable")


def report(
    ctx: Context,
    run_id: str,
    seq: int,
    node_id: str,
    attempt: int,
    outcome: str,
    log: str = "",
    instance: str | None = None,
) -> ReportResult:
    """A step's result (docs/design.md §9); wakes the queue after commit (wake 1) unless it
    was a ``retry`` rollback (R15).

    Raises:
        ContractError: a malformed outcome, attempt or log (400).
        Forbidden: ``not_your_step`` (403).
        Conflict: ``stale_instance``, ``stale_attempt``, or ``run_ended`` — for a run that
            already ended the result is still recorded and its lease freed first (409).
    """
    if outcome not in OUTCOMES:
        raise ContractError("outcome must be 'pass', 'fail' or 'retry'.", field="outcome")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise ContractError("attempt must be a whole number ≥ 1.", field="attempt")
    if not isinstance(log, str) or len(log) > MAX_LOG:
        raise ContractError(f"log must be text of at most {MAX_LOG} characters.", field="log")
    log = contract_mod.escape_log(log)  # NUL → ␀, lone surrogates → U+FFFD (docs/security.md)
    events: list[dict[str, Any]] = []
    ended = False
    rolled = False
    change = Change(run_id)
    with ctx.store.tx() as tx:
        run, steps, step, node = locked_with_node(tx, run_id, seq, node_id)
        current = node["instance"] if node else ""
        inst = current if instance is None else instance
        fresh = step.state == StepState.CLAIMED and step.attempt == attempt
        if run.state in TERMINAL_RUN:
            # A late result for an ended run: record it, free the node's lease (I2's
            # exception ends here), answer run_ended so the daemon stops.
            ended = True
            if fresh and inst == step.instance:
                state = StepState.PASSED if outcome == "pass" else StepState.FAILED
                tx.finish_step(run_id, seq, step_transition(step.state, state), log)
                events.append(
                    ev(
                        run_id,
                        "result",
                        node_id,
                        seq=seq,
                        attempt=attempt,
                        outcome=outcome,
                        late=True,
                    )
                )
                busy = {s.node_id for s in steps if s.state == StepState.CLAIMED and s.seq != seq}
                if node_id not in busy:
                    change.released = release(tx, run_id, [node_id], "late_result", events)
            tx.insert_events(events)
        else:
            if inst != step.instance or inst != current:
                raise Conflict(
                    "This result comes from a stale daemon instance.", code="stale_instance"
                )
            if not fresh:
                raise Conflict(
                    f"Attempt {attempt} of step {seq} is not the current one.",
                    code="stale_attempt",
                )
            if outcome == "retry" and attempt < ctx.config.max_attempts:
                # R15: a rollback releases nothing, so it does not wake.
                step_transition(step.state, StepState.PENDING)
                tx.rollback_step(run_id, seq, log)
                tx.insert_events(
                    [
                        ev(
                            run_id,
                            "result",
                            node_id,
                            seq=seq,
                            attempt=attempt,
                            outcome="retry",
                            rolled=True,
                        )
                    ]
                )
                rolled = True
            else:
                state = StepState.PASSED if outcome == "pass" else StepState.FAILED
                tx.finish_step(run_id, seq, step_transition(step.state, state), log)
                events.append(
                    ev(run_id, "result", node_id, seq=seq, attempt=attempt, outcome=outcome)
                )
                skipped: set[int] = set()
                if state == StepState.FAILED:
                    skip = contract_mod.dependants(steps, step.name)  # type: ignore[arg-type]
                    skipped = {s.seq for s in steps if s.name in skip and s.state in OPEN}
                    tx.skip_steps(run_id, sorted(skipped))
                now_steps = [
                    replace(s, state=state)
                    if s.seq == seq
                    else replace(s, state=StepState.SKIPPED)
                    if s.seq in skipped
                    else s
                    for s in steps
                ]
                change = progress(tx, run, events, now_steps)
                tx.insert_events(events)
    if rolled:
        return ReportResult("", True, (), StepState.PENDING)
    ctx.after([change], Wake.RESULT if not ended or change.released else None)
    if ended:
        raise Conflict(f"Run {run_id} has ended; stop working on it.", code="run_ended")
    final = StepState.PASSED if outcome == "pass" else StepState.FAILED
    return ReportResult(change.settled, False, tuple(change.released), final)
