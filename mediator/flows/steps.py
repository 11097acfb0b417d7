"""Steps: work, claim, result — and the shared moves that end or advance a run (docs/design.md §9).

Steps are claimed and reported by nodes; a result releases nodes as soon as they are done with a
run (applyRelease), settles the run when every step is terminal (SettleIfDone), and wakes the queue
(wake 1). A result is one read and one write (issue 13): :mod:`mediator.core.progress` decides from
the
read, and the write applies only if the run is unchanged since (its version), else the result
reads and decides again. :func:`progress`, :func:`end` and :func:`release` are the moves the other
flows share (answers, cancel, the reaper, restart detection, drains): each runs inside its
caller's transaction, which follows the locking rule — run row, then steps, leases, asks. Sealing,
PushAsks and the wake run after commit through :class:`~mediator.flows.after.AfterCommit`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mediator.core import limits
from mediator.core.errors import (
    Conflict,
    ContractError,
    Forbidden,
    MediatorError,
    NotFound,
    StoreBusy,
)
from mediator.core.progress import Decision, decide_result, end_early
from mediator.core.progress import progress as decide_progress
from mediator.core.rows import Applied, ClaimRefusal, ResultSource, Run, Step
from mediator.core.states import (
    TERMINAL_RUN,
    RunState,
    StepState,
    Verdict,
    step_transition,
)
from mediator.flows.after import Change
from mediator.flows.wake import Wake
from mediator.store.tx import Tx

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

    def to_dict(self) -> dict[str, Any]:
        """The JSON answer of a result and of an answer (docs/design.md §19)."""
        return {
            "settled": self.settled,
            "rolled": self.rolled,
            "released": list(self.released),
            "step_state": self.step_state,
        }


def ev(run_id: str, kind: str, node_id: str = "", **data: Any) -> dict[str, Any]:
    return {"run_id": run_id, "node_id": node_id, "kind": kind, "data": data}


# ---- shared moves of every flow ------------------------------------------------------------------
def release(
    tx: Tx, run_id: str, nodes: Iterable[str], reason: str, events: list[dict[str, Any]]
) -> list[str]:
    """Free the run's leases on ``nodes``, one ``lease_released`` event each; the nodes freed."""
    released = tx.delete_leases(run_id, sorted(set(nodes)))
    events += [ev(run_id, "lease_released", n, reason=reason) for n in released]
    return released


def apply_locked(tx: Tx, run: Run, decision: Decision, events: list[dict[str, Any]]) -> Change:
    """Apply a decision of :mod:`mediator.core.progress` inside the caller's transaction, which
    holds
    the run row (the locking rule): skips, asks raised, the run ended, asks closed, leases
    released. The caller inserts ``events`` (the decision's ``tail`` and one ``lease_released``
    per node freed are appended to it; ``raise_asks`` writes its own ``ask_raised`` events)."""
    change = Change(run.run_id, settled=decision.settled)
    tx.skip_steps(run.run_id, decision.skipped)
    if decision.asks:
        change.asks = tx.raise_asks(run.run_id)
    if decision.close_asks:
        tx.close_asks(run.run_id)
    if decision.run_to is not None:
        tx.end_run(run.run_id, decision.run_to, str(decision.verdict))
    events += [{**e, "run_id": run.run_id} for e in decision.tail]
    change.released = release(tx, run.run_id, decision.release, decision.release_reason, events)
    return change


def end(
    tx: Tx,
    run: Run,
    steps: list[Step],
    verdict: Verdict,
    events: list[dict[str, Any]],
    *,
    gone: Iterable[str] = (),
) -> list[str]:
    """End a run early (cancel, lost, drained) as :func:`mediator.core.progress.end_early` decides:
    open steps SKIPPED, asks closed, FAILED; a node still running a CLAIMED step keeps its lease
    (I2's exception) unless it is ``gone``. Returns the released nodes."""
    decision = end_early(run.state, steps, tx.run_leases(run.run_id), verdict, gone=gone)
    return apply_locked(tx, run, decision, events).released


def progress(
    tx: Tx,
    run: Run,
    events: list[dict[str, Any]],
    steps: list[Step] | None = None,
) -> Change:
    """After a step became terminal in a RUNNING run (an answer): at-boundary drain, raiseAsks,
    applyRelease, SettleIfDone as :func:`mediator.core.progress.progress` decides, applied inside
    the
    caller's transaction. ``steps`` is the run's steps as this transaction left them, when the
    caller knows them (saves a read)."""
    if steps is None:
        steps = tx.steps(run.run_id)
    decision = decide_progress(run.state, steps, tx.run_leases(run.run_id))
    return apply_locked(tx, run, decision, events)


# ---- steps (docs/design.md §9) -------------------------------------------------------------------
def work(ctx: Context, node_id: str) -> list[Step]:
    """Claimable steps of ``node_id``: PENDING, on it, every ``after`` PASSED, run RUNNING."""
    limits.check_node_id(node_id)
    with ctx.store.autocommit() as tx:
        return tx.work(node_id)


def nodes_with_work(ctx: Context, node_ids: list[str]) -> set[str]:
    """The nodes among ``node_ids`` that :func:`work` would answer a step for: one statement
    for every held long poll of a process (docs/design.md §19 "The wake of a waiting node")."""
    if not node_ids:
        return set()
    with ctx.store.autocommit() as tx:
        return tx.nodes_with_work(node_ids)


def locked(tx: Tx, run_id: str, seq: int) -> tuple[Run, list[Step], Step]:
    """Lock the run, then its steps (the locking rule), in one statement (issue 13); the run,
    its steps and step ``seq``. Raises NotFound ``unknown_run`` or ``unknown_step``."""
    run, steps = tx.lock_run_steps(run_id)
    if run is None:
        raise NotFound(f"No run with run_id {run_id!r}.", code="unknown_run")
    step = next((s for s in steps if s.seq == seq), None)
    if step is None:
        raise NotFound(f"Run {run_id} has no step {seq}.", code="unknown_step")
    return run, steps, step


def claim(ctx: Context, run_id: str, seq: int, node_id: str, instance: str | None = None) -> Step:
    """PENDING → CLAIMED for the node the step belongs to.

    Raises:
        Forbidden: ``not_your_step`` — the step is another node's (403).
        Conflict: ``run_ended``, ``stale_instance``, ``draining``, ``already_claimed`` or
            ``not_claimable`` (409).
    """
    limits.check_node_id(node_id)  # 400 invalid_node_id, as every route that takes one
    step_transition(StepState.PENDING, StepState.CLAIMED)  # the only move a claim makes
    # issue 13: one guarded statement; the read that picks the error code runs only when it
    # matched nothing. A refusal read that finds the step claimable after all (a
    # concurrent change between the two statements) tries the claim again.
    for _ in range(3):
        with ctx.store.autocommit() as tx:
            claimed = tx.claim_step(run_id, seq, node_id, instance)
            if claimed is not None:
                src, size = claimed
                ctx.claimed.keep(node_id, seq, src, size)  # the result's read, done (issue 13)
                return next(s for s in src.steps if s.seq == seq)
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


# issue 13: optimistic tries before a result takes the run row first; lost races are rare (two
# results, a claim or a cancel of the same run between one statement and the next).
_OPTIMISTIC = 3
_TRIES = 10


def _apply_result(
    ctx: Context,
    run_id: str,
    seq: int,
    node_id: str,
    attempt: int,
    outcome: str,
    log: str,
    instance: str | None,
) -> tuple[Decision, Applied, bool]:
    """A result as one read and one write (issue 13): ``result_source`` reads the run without
    locks, :func:`mediator.core.progress.decide_result` decides, ``apply_result`` writes it all in
    one
    statement guarded by the run's version. A write that matched nothing (the run, the node's
    instance or a drain changed since the read) reads and decides again; after
    ``_OPTIMISTIC`` lost races the read is taken under the run row's lock (docs/design.md §9), so
    a result always completes. Returns the decision, what was applied, and whether the run had
    ended (a late result)."""
    kept = ctx.claimed.take(run_id, seq, node_id, attempt)
    if kept is not None:
        # The claim's snapshot (issue 13): a write decided from it is guarded like any other.
        # Only a write is taken from it; a refusal, a no-op or a lost race reads afresh.
        try:
            decision, ended = _decide(ctx, kept, run_id, seq, node_id, attempt, outcome, instance)
        except MediatorError:
            decision = Decision()
        if decision != Decision():
            with ctx.store.autocommit() as tx:
                applied = tx.apply_result(kept, node_id, decision, log)
            if applied.matched:
                return decision, applied, ended
    for i in range(_TRIES):
        locked = i >= _OPTIMISTIC
        with ctx.store.tx() if locked else ctx.store.autocommit() as tx:
            if locked:
                tx.get_run(run_id, lock=True)  # the locking rule: the run row first
            src = tx.result_source(run_id, node_id)
            decision, ended = _decide(ctx, src, run_id, seq, node_id, attempt, outcome, instance)
            if decision == Decision():
                return decision, Applied(True), ended  # a stale late result: nothing to write
            assert src is not None  # _decide refused a missing run
            applied = tx.apply_result(src, node_id, decision, log)
        if applied.matched:
            return decision, applied, ended
    raise StoreBusy(f"Run {run_id} changed too often to record this result; try again.")


def _decide(
    ctx: Context,
    src: ResultSource | None,
    run_id: str,
    seq: int,
    node_id: str,
    attempt: int,
    outcome: str,
    instance: str | None,
) -> tuple[Decision, bool]:
    """Refuse a result that is not this node's current one (docs/design.md §9), else decide it.
    A late result for an ended run is recorded and frees the node's lease (I2's exception ends
    here); the caller answers it run_ended so the daemon stops."""
    if src is None:
        raise NotFound(f"No run with run_id {run_id!r}.", code="unknown_run")
    step = next((s for s in src.steps if s.seq == seq), None)
    if step is None:
        raise NotFound(f"Run {run_id} has no step {seq}.", code="unknown_step")
    if step.node_id != node_id:
        raise Forbidden(
            f"Step {seq} of run {run_id} is not assigned to {node_id}.", code="not_your_step"
        )
    current = src.node.instance if src.node is not None else ""
    inst = current if instance is None else instance
    ended = src.run.state in TERMINAL_RUN
    if not ended:
        if inst != step.instance or inst != current:
            raise Conflict("This result comes from a stale daemon instance.", code="stale_instance")
        if not (step.state == StepState.CLAIMED and step.attempt == attempt):
            raise Conflict(
                f"Attempt {attempt} of step {seq} is not the current one.", code="stale_attempt"
            )
    decision = decide_result(
        src.run.state, src.steps, src.leases, step, node_id, attempt, outcome,
        max_attempts=ctx.config.max_attempts, instance_matches=inst == step.instance,
    )  # fmt: skip
    return decision, ended


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
    was a ``retry`` rollback (R15). One statement when this process saw the step's claim and
    nothing raced it since (the claim's snapshot, :mod:`mediator.flows.claimed`), two otherwise
    (issue 13), plus the seal's when it settles the run.

    Raises:
        ContractError: a malformed outcome, attempt or log (400).
        Forbidden: ``not_your_step`` (403).
        Conflict: ``stale_instance``, ``stale_attempt``, or ``run_ended`` — for a run that
            already ended the result is still recorded and its lease freed first (409).
    """
    limits.check_node_id(node_id)  # 400 invalid_node_id, as every route that takes one
    if outcome not in OUTCOMES:
        raise ContractError("outcome must be 'pass', 'fail' or 'retry'.", field="outcome")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise ContractError("attempt must be a whole number ≥ 1.", field="attempt")
    if not isinstance(log, str) or len(log) > MAX_LOG:
        raise ContractError(f"log must be text of at most {MAX_LOG} characters.", field="log")
    log = limits.escape_log(log)  # NUL → ␀, lone surrogates → U+FFFD (docs/security.md)
    decision, applied, ended = _apply_result(ctx, run_id, seq, node_id, attempt, outcome, log,
                                             instance)  # fmt: skip
    if decision.step is not None and not decision.step.ends:
        return ReportResult("", True, (), StepState.PENDING)  # R15: a rollback does not wake
    change = Change(
        run_id, decision.settled, list(applied.released), list(applied.asks), applied.seal
    )
    ctx.after([change], Wake.RESULT if not ended or change.released else None)
    if ended:
        raise Conflict(f"Run {run_id} has ended; stop working on it.", code="run_ended")
    final = StepState.PASSED if outcome == "pass" else StepState.FAILED
    return ReportResult(change.settled, False, tuple(change.released), final)
