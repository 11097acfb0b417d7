"""The run lifecycle half of the orchestration layer (docs/design.md §9–7.6).

Steps are claimed and reported by nodes; results release nodes as soon as they are done with a run
(applyRelease), settle the run when every step is terminal (SettleIfDone), and wake the queue
(wake point 1). Cancel, the reaper, restart detection and at-boundary drains end runs early. Every
transaction here follows the locking rule: run row, then steps, leases, asks. Sealing, PushAsks and
the wake run after commit, so nothing outside the database sees an uncommitted change.

:class:`mediator.flows.Mediator` inherits these methods; they are a separate module only to keep
each file readable.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from mediator import contract as contract_mod
from mediator.errors import Conflict, ContractError, Forbidden, NotFound
from mediator.rows import Ask, ClaimRefusal, Run, Step
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
    from mediator.config import Config
    from mediator.records import Records
    from mediator.store.db import Store

log = logging.getLogger("mediator")

OUTCOMES = ("pass", "fail", "retry")
MAX_LOG = 1_000_000
_OPEN = (StepState.PENDING, StepState.ASKED)


@dataclass(frozen=True)
class ReportResult:
    """What a result did: ``settled`` is SettleIfDone's answer (the new state or "")."""

    settled: str
    rolled: bool
    released: tuple[str, ...]
    step_state: str


@dataclass
class ReapReport:
    """One reaper pass: leases it released, runs it ended as lost, records it sealed."""

    released: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    sealed: list[str] = field(default_factory=list)
    woke: bool = False


@dataclass
class _Change:
    """What one transaction did to a run, for the after-commit work."""

    run_id: str
    settled: str = ""
    released: list[str] = field(default_factory=list)
    asks: list[Ask] = field(default_factory=list)


def _ev(run_id: str, kind: str, node_id: str = "", **data: Any) -> dict[str, Any]:
    return {"run_id": run_id, "node_id": node_id, "kind": kind, "data": data}


def _drained_at_boundary(node_id: str, steps: Iterable[Step]) -> bool:
    """At-boundary drain ends a run only if the run still needs the node: no step of it is
    CLAIMED on the node (the boundary) and some step of it on the node is still open. Called
    only for nodes whose policy is ``at-boundary`` (amended rule, docs/design.md)."""
    mine = [s for s in steps if s.node_id == node_id]
    return not any(s.state == StepState.CLAIMED for s in mine) and any(
        s.state not in TERMINAL_STEP for s in mine
    )


class LifecycleMixin:
    """Work, claim, report, cancel, reap, restart detection, drain, asks."""

    store: Store
    config: Config
    records: Records

    def seal(self, run_id: str) -> bool:  # provided by Mediator
        raise NotImplementedError

    def _wake_safely(self, why: str) -> Any:  # provided by Mediator
        raise NotImplementedError

    def _push_asks(self, asks: list[Any]) -> None:  # provided by Mediator
        raise NotImplementedError

    def _seal_safely(self, run_id: str) -> bool:  # provided by Mediator
        raise NotImplementedError

    def retry_unopened(self) -> list[str]:  # provided by Mediator
        raise NotImplementedError

    # ---- shared steps of every flow --------------------------------------------------------
    @staticmethod
    def _release(
        tx: Tx, run_id: str, nodes: Iterable[str], reason: str, events: list[dict[str, Any]]
    ) -> list[str]:
        released = tx.delete_leases(run_id, sorted(set(nodes)))
        events += [_ev(run_id, "lease_released", n, reason=reason) for n in released]
        return released

    def _end(
        self,
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
            if s.state in _OPEN or (s.state == StepState.CLAIMED and s.node_id in gone):
                step_transition(s.state, StepState.SKIPPED)
                skip.append(s.seq)
        tx.skip_steps(run.run_id, skip)
        tx.close_asks(run.run_id)
        run_transition(run.state, RunState.FAILED)
        tx.end_run(run.run_id, RunState.FAILED, verdict)
        events.append(_ev(run.run_id, "settled", state="FAILED", verdict=str(verdict)))
        still = {s.node_id for s in steps if s.state == StepState.CLAIMED and s.node_id not in gone}
        leased = [r["node_id"] for r in tx.run_leases(run.run_id)]
        return self._release(
            tx, run.run_id, [n for n in leased if n not in still], str(verdict), events
        )

    def _progress(
        self,
        tx: Tx,
        run: Run,
        events: list[dict[str, Any]],
        steps: list[Step] | None = None,
    ) -> _Change:
        """After a step became terminal in a RUNNING run: at-boundary drain, raiseAsks,
        applyRelease, SettleIfDone — all inside the caller's transaction (R15's point: the
        partial release rides on the result's wake). ``steps`` is the run's steps as this
        transaction left them, when the caller knows them (saves a read)."""
        change = _Change(run.run_id)
        if steps is None:
            steps = tx.steps(run.run_id)
        leases = tx.run_leases(run.run_id)
        leased = [r["node_id"] for r in leases]
        if any(
            _drained_at_boundary(r["node_id"], steps) for r in leases if r["drain"] == "at-boundary"
        ):
            # at-boundary drain (docs/design.md §10, amended): a node the run still needs, with
            # no step CLAIMED on it, ends the run — remaining steps SKIPPED, FAILED/drained.
            # A node the run no longer needs is simply released below (applyRelease), so the
            # outcome does not depend on whether the drain advert or the result came first.
            change.released = self._end(tx, run, steps, Verdict.DRAINED, events)
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
            events.append(_ev(run.run_id, "settled", state=str(state), verdict=str(verdict)))
            change.settled = state
            change.released = self._release(tx, run.run_id, leased, "settled", events)
        else:
            change.released = self._release(tx, run.run_id, done, "partial", events)
        return change

    def _after_commit(self, changes: Iterable[_Change], why: str, *, wake: bool) -> None:
        """Seal what settled, PushAsks, then wake — in that order, after the commit. The one
        place every flow's after-commit work goes through: each seal is isolated (a failing
        record is logged, counted and retried by the reaper, issue 11 §5–6), so neither the
        committed answer nor the wake ever depends on the records folder."""
        for c in changes:
            if c.settled:
                self._seal_safely(c.run_id)
            if c.asks:
                self._push_asks(c.asks)
        if wake:
            self._wake_safely(why)

    # ---- steps (docs/design.md §9) ------------------------------------------------------------
    def work(self, node_id: str) -> list[Step]:
        """Claimable steps of ``node_id``: PENDING, on it, every ``after`` PASSED, run RUNNING."""
        with self.store.autocommit() as tx:
            return tx.work(node_id)

    def _locked(
        self, tx: Tx, run_id: str, seq: int, node_id: str | None = None
    ) -> tuple[Run, list[Step], Step]:
        """Lock the run, then its steps (the locking rule); with ``node_id``, refuse a step
        that belongs to another node (403 ``not_your_step``)."""
        run, steps, step, _ = self._locked_with_node(tx, run_id, seq, node_id)
        return run, steps, step

    def _locked_with_node(
        self, tx: Tx, run_id: str, seq: int, node_id: str | None = None
    ) -> tuple[Run, list[Step], Step, dict[str, Any] | None]:
        """:meth:`_locked` and the node's row, read in the same statement (issue 13)."""
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

    def claim(self, run_id: str, seq: int, node_id: str, instance: str | None = None) -> Step:
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
            with self.store.autocommit() as tx:
                claimed = tx.claim_step(run_id, seq, node_id, instance)
                if claimed is not None:
                    return claimed
                why = tx.claim_refusal(run_id, seq, node_id)
            self._refuse_claim(run_id, seq, node_id, instance, why)
        raise Conflict(f"Step {seq} of run {run_id} cannot be claimed now.", code="not_claimable")

    @staticmethod
    def _refuse_claim(
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
            raise Conflict(
                f"Step {seq} of run {run_id} is already claimed.", code="already_claimed"
            )
        if why.step_state != StepState.PENDING or why.step_kind != "exec" or not why.after_passed:
            raise Conflict(
                f"Step {seq} of run {run_id} cannot be claimed now.", code="not_claimable"
            )

    def report(
        self,
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
        change = _Change(run_id)
        with self.store.tx() as tx:
            run, steps, step, node = self._locked_with_node(tx, run_id, seq, node_id)
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
                        _ev(
                            run_id,
                            "result",
                            node_id,
                            seq=seq,
                            attempt=attempt,
                            outcome=outcome,
                            late=True,
                        )
                    )
                    busy = {
                        s.node_id for s in steps if s.state == StepState.CLAIMED and s.seq != seq
                    }
                    if node_id not in busy:
                        change.released = self._release(
                            tx, run_id, [node_id], "late_result", events
                        )
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
                if outcome == "retry" and attempt < self.config.max_attempts:
                    # R15: a rollback releases nothing, so it does not wake.
                    step_transition(step.state, StepState.PENDING)
                    tx.rollback_step(run_id, seq, log)
                    tx.insert_events(
                        [
                            _ev(
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
                        _ev(run_id, "result", node_id, seq=seq, attempt=attempt, outcome=outcome)
                    )
                    skipped: set[int] = set()
                    if state == StepState.FAILED:
                        skip = contract_mod.dependants(steps, step.name)  # type: ignore[arg-type]
                        skipped = {s.seq for s in steps if s.name in skip and s.state in _OPEN}
                        tx.skip_steps(run_id, sorted(skipped))
                    now_steps = [
                        replace(s, state=state)
                        if s.seq == seq
                        else replace(s, state=StepState.SKIPPED)
                        if s.seq in skipped
                        else s
                        for s in steps
                    ]
                    change = self._progress(tx, run, events, now_steps)
                    tx.insert_events(events)
        if rolled:
            return ReportResult("", True, (), StepState.PENDING)
        self._after_commit([change], "result", wake=not ended or bool(change.released))
        if ended:
            raise Conflict(f"Run {run_id} has ended; stop working on it.", code="run_ended")
        final = StepState.PASSED if outcome == "pass" else StepState.FAILED
        return ReportResult(change.settled, False, tuple(change.released), final)

    # ---- cancel (docs/design.md §10) ----------------------------------------------------------
    def cancel(self, run_id: str, principal: str | None = None, *, admin: bool = False) -> Run:
        """QUEUED or RUNNING → FAILED/cancelled; a terminal run is a no-op. Always wakes (wake 2).

        ``principal=None`` is an in-process caller (trusted); otherwise only the submitter or an
        admin may cancel (403).
        """
        changed = False
        with self.store.tx() as tx:
            run = tx.get_run(run_id, lock=True)
            if run is None:
                raise NotFound(f"No run with run_id {run_id!r}.", code="unknown_run")
            if principal is not None and not admin and principal != run.submitter:
                raise Forbidden(
                    "Only the submitter or an admin may cancel this run.", code="not_your_run"
                )
            if run.state not in TERMINAL_RUN:
                events = [_ev(run_id, "cancelled", by=principal or "")]
                steps = tx.lock_steps(run_id)
                self._end(tx, run, steps, Verdict.CANCELLED, events)
                tx.insert_events(events)
                changed = True
        if changed:
            self._after_commit([_Change(run_id, settled=RunState.FAILED)], "cancel", wake=False)
        self._wake_safely("cancel")  # wake 2: always
        return self.get_run(run_id)  # type: ignore[attr-defined,no-any-return]

    # ---- reaper (docs/design.md §10) ----------------------------------------------------------
    def reap(self) -> ReapReport:
        """One reaper pass: expired leases released, their RUNNING runs FAILED/lost, unsealed
        terminal runs sealed. Wakes only if it released something (R14, wake 3)."""
        report = ReapReport()
        with self.store.autocommit() as tx:
            candidates = tx.expired_lease_runs()
        changes = []
        for run_id in candidates:
            events: list[dict[str, Any]] = []
            with self.store.tx() as tx:
                run = tx.get_run(run_id, lock=True)
                if run is None:
                    continue
                steps = tx.lock_steps(run_id)
                expired = tx.delete_expired_leases(run_id)  # re-checked under the run lock
                if not expired:
                    continue
                events += [_ev(run_id, "lease_released", n, reason="expired") for n in expired]
                released = list(expired)
                if run.state == RunState.RUNNING:
                    released += self._end(tx, run, steps, Verdict.LOST, events, gone=expired)
                    report.lost.append(run_id)
                    changes.append(_Change(run_id, settled=RunState.FAILED))
                tx.insert_events(events)
            report.released += released
        self._after_commit(changes, "reap", wake=False)
        # Record work left over (a crash between commit and seal, or a records folder that
        # refused a write) never stops the wake below: each seal is isolated (issue 11 §6).
        report.sealed = self.seal_unsealed()
        self.retry_unopened()
        if report.released:
            report.woke = True
            self._wake_safely("reap")  # wake 3
        return report

    def seal_unsealed(self) -> list[str]:
        """Seal terminal runs left unsealed (a crash between commit and seal, or a failed seal;
        §7.7). Each is isolated: one bad record is logged and counted, the others proceed."""
        try:
            with self.store.autocommit() as tx:
                pending = tx.unsealed_runs()
        except Exception:
            log.exception("listing unsealed records failed; the next pass tries again")
            return []
        return [r for r in pending if self._seal_safely(r)]

    # ---- advert side effects (restart detection, at-boundary drain) ---------------------------
    def _advert_effects(self, node_id: str, instance: str, drain: str) -> bool:
        """Restart detection and at-boundary drain for a node's leases; True if anything was
        released (wake 4)."""
        with self.store.autocommit() as tx:
            leases = tx.node_leases(node_id)
        released_any = False
        changes = []
        for lease in leases:
            restarted = lease["instance"] != instance
            if not restarted and drain != "at-boundary":
                continue
            events: list[dict[str, Any]] = []
            with self.store.tx() as tx:
                run = tx.get_run(lease["run_id"], lock=True)
                if run is None:
                    continue
                steps = tx.lock_steps(run.run_id)
                current = {r["node_id"]: r for r in tx.run_leases(run.run_id)}.get(node_id)
                if current is None:
                    continue
                mine = [s for s in steps if s.node_id == node_id]
                released: list[str] = []
                if current["instance"] != instance:
                    old = current["instance"]
                    ran = any(s.attempt > 0 and s.instance == old for s in mine)
                    if run.state in TERMINAL_RUN:
                        # A late lease kept for a CLAIMED step whose daemon is gone.
                        tx.skip_steps(
                            run.run_id, [s.seq for s in mine if s.state == StepState.CLAIMED]
                        )
                        released = self._release(tx, run.run_id, [node_id], "restart", events)
                    elif ran:
                        # Something ran under the old instance: that work is lost (wake 4).
                        released = self._end(tx, run, steps, Verdict.LOST, events, gone=[node_id])
                        changes.append(_Change(run.run_id, settled=RunState.FAILED))
                    else:
                        # Nothing ran there yet: the lease follows the new daemon (ours).
                        tx.rebind_lease(
                            node_id, run.run_id, instance, self.config.lease_ttl_seconds
                        )
                elif (
                    drain == "at-boundary"
                    and run.state == RunState.RUNNING
                    # only if the run still needs the node (one it no longer needs was released
                    # by applyRelease when its last step ended): the amended rule
                    and _drained_at_boundary(node_id, steps)
                ):
                    released = self._end(tx, run, steps, Verdict.DRAINED, events)
                    changes.append(_Change(run.run_id, settled=RunState.FAILED))
                tx.insert_events(events)
            released_any = released_any or bool(released)
        self._after_commit(changes, "advert", wake=False)
        return released_any

    # ---- asks (docs/design.md §11) ------------------------------------------------------------
    def asks(self) -> list[Ask]:
        """Open asks, oldest first."""
        with self.store.autocommit() as tx:
            return tx.open_asks()

    def answer(
        self, ask_id: int, answer: str, ok: bool = True, principal: str | None = None
    ) -> ReportResult:
        """Answer an ask: its step → PASSED (ok) or FAILED, then as a result (settle, wake 1)."""
        if not isinstance(ask_id, int) or isinstance(ask_id, bool):
            raise ContractError("ask_id must be a whole number.", field="ask_id")
        if not isinstance(answer, str) or len(answer) > 10_000:
            raise ContractError("answer must be text of at most 10000 characters.", field="answer")
        if not isinstance(ok, bool):
            raise ContractError("ok must be true or false.", field="ok")
        events: list[dict[str, Any]] = []
        with self.store.tx() as tx:
            found = tx.get_ask(ask_id)
            if found is None:
                raise NotFound(f"No ask with ask_id {ask_id}.", code="unknown_ask")
            run, steps, step = self._locked(tx, found["run_id"], found["seq"])
            ask = tx.lock_ask(ask_id)
            if ask is None or ask["closed"] or step.state != StepState.ASKED:
                raise Conflict(f"Ask {ask_id} is no longer open.", code="ask_closed")
            if run.state != RunState.RUNNING:
                raise Conflict(f"Run {run.run_id} has ended.", code="run_ended")
            state = StepState.PASSED if ok else StepState.FAILED
            tx.finish_step(run.run_id, step.seq, step_transition(step.state, state), answer)
            tx.answer_ask(ask_id, answer, ok, principal or "")
            events.append(_ev(run.run_id, "ask_answered", ask_id=ask_id, seq=step.seq, ok=ok))
            if not ok:
                skip = contract_mod.dependants(steps, step.name)  # type: ignore[arg-type]
                tx.skip_steps(
                    run.run_id, [s.seq for s in steps if s.name in skip and s.state in _OPEN]
                )
            change = self._progress(tx, run, events)
            tx.insert_events(events)
        self._after_commit([change], "answer", wake=True)
        return ReportResult(change.settled, False, tuple(change.released), state)
