"""After commit: seal what settled, PushAsks, wake — the one path every flow hands its changes to.

Nothing outside the database may see an uncommitted change (R12), and nothing after the commit may
change the committed answer (R16, issue 11 §5–6). So every flow commits first, then gives this
object what the transaction did (:class:`Change`) and the wake point it triggers (:class:`Wake`):
records are sealed one by one, each isolated (a failing record is logged, counted and retried by
the reaper and at startup), asks are published, and the queue is swept — in that order. Opening a
record after submit's commit and the records' retries live here too: they are the same kind of
work, and failing the same way must be survived the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from mediator.core.errors import StoreUnavailable
from mediator.core.rows import Ask, SealSource
from mediator.core.states import RunState
from mediator.flows import sweep as sweep_flow
from mediator.flows.sweep import HEAD_PAGE, WakeReport
from mediator.flows.wake import Wake
from mediator.store.tx import SweepHead

if TYPE_CHECKING:
    from mediator.flows.context import Context

log = logging.getLogger("mediator")


@dataclass
class Change:
    """What one transaction did to a run, for the after-commit work."""

    run_id: str
    settled: str = ""
    released: list[str] = field(default_factory=list)
    asks: list[Ask] = field(default_factory=list)
    # The record's source, when the transaction that settled the run returned it (issue 13: a
    # result's write does); None: the seal reads it.
    source: SealSource | None = None


class Sealed(NamedTuple):
    """What sealing one record did: whether this call created ``seal.json`` (I6), and the
    sweep's first read when it was made in the same round trip (None: not read)."""

    created: bool
    head: SweepHead | None = None


class AfterCommit:
    """Seal, PushAsks, wake after a commit; record work that failed, kept for a retry."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        # Records whose contract.json could not be written after their commit (issue 11 §5):
        # run_id → contract, retried by every reaper pass. Sealing writes contract.json too, so
        # a run that ends first loses nothing even if this process restarts.
        self.unopened: dict[str, dict[str, Any]] = {}

    def __call__(
        self,
        changes: Iterable[Change] = (),
        wake: Wake | None = None,
        guard: bool = False,
    ) -> WakeReport | None:
        """Seal what settled, PushAsks, then wake — in that order, after the commit. The one
        place every flow's after-commit work goes through: each seal is isolated (a failing
        record is logged, counted and retried by the reaper, issue 11 §5–6), so neither the
        committed answer nor the wake ever depends on the records folder.

        When a wake follows, a seal's last round trip — marking the record sealed, after the
        commit — also carries the sweep's first read (the waiting classes, the fleet, the queue's
        head; issue 13), so the wake sends no statement of its own to begin: none at all when
        nothing is QUEUED. A run queued after that read is its submitter's to sweep: R17's guard
        runs after that submit's commit and sees every release committed before this read.
        ``guard``: the wake is R17's guard (wake 8), whose first read may end it (``sweep``)."""
        head: SweepHead | None = None  # the sweep's first read, when a seal did it
        for c in changes:
            if c.settled:
                seen = self._seal_reading_head(c.run_id, c.source, wake is not None)
                head = seen if seen is not None else head
            if c.asks:
                self.push_asks(c.asks)
        if wake is not None:
            return self.wake_safely(wake, head=head, guard=guard)
        return None

    # ---- wake ------------------------------------------------------------------------------------
    def wake_safely(
        self,
        why: Wake,
        *,
        head: SweepHead | None = None,
        guard: bool = False,
    ) -> WakeReport | None:
        """R16: a failing wake never changes the triggering call's result; it is logged.

        Wake 5: a sweep that failed because the database could not be reached is not left to
        some later event (steady heartbeats never sweep, R14): the store's reconnect watcher
        sweeps as soon as the database answers again. ``head``: the sweep's first read, done
        by the caller after its commit (issue 13), handed down to the sweep; with no class
        waiting the wake happens (observers see it) at no cost."""
        try:
            return sweep_flow.wake_queued(self.ctx, head, guard)
        except StoreUnavailable:
            self.ctx.count("wake")
            log.warning("wake after %s failed: the database is unreachable; "
                        "sweeping again as soon as it answers (wake 5)", why)  # fmt: skip
            self.ctx.store.watch()
            return None
        except Exception:
            self.ctx.count("wake")
            log.exception("wake after %s failed; the next event will sweep again", why)
            return None

    # ---- asks ------------------------------------------------------------------------------------
    def push_asks(self, asks: list[Any]) -> None:
        """PushAsks runs after commit only (R12): a question from a rolled-back transaction
        must never reach a person. Subscribers are notified through the events feed."""
        for ask in asks:
            log.info("ask %s raised for run %s step %s", ask.ask_id, ask.run_id, ask.seq)

    # ---- records (issue 11 §5–6) -----------------------------------------------------------------
    def open_record(self, run_id: str, doc: dict[str, Any]) -> None:
        """Records.open after a commit. A failure never turns the committed answer into an
        error: it is logged, counted and retried by the reaper (and sealing writes it too)."""
        try:
            self.ctx.records.open(run_id, doc)
        except Exception:
            self.ctx.count("record_open")
            log.exception("opening the record of run %s failed; the reaper retries", run_id)
            with self.ctx.lock:
                self.unopened[run_id] = doc

    def open_unopened(self) -> None:
        """Startup: a record whose open failed after its commit in an earlier process (issue 11
        §5) is opened now; a run that ended meanwhile was completed by its seal."""
        try:
            with self.ctx.store.autocommit() as tx:
                missing = [
                    r for r in tx.active_runs()
                    if not (self.ctx.records.dir(r) / "contract.json").exists()
                ]  # fmt: skip
                docs = {r: tx.live_contract(r) or {} for r in missing}
        except Exception:
            log.exception("checking for unopened records at startup failed")
            return
        for run_id, doc in docs.items():
            self.open_record(run_id, doc)

    def retry_unopened(self) -> list[str]:
        """Write the contract.json that failed after commit; returns the runs now opened."""
        with self.ctx.lock:
            pending = list(self.unopened.items())
        done = []
        for run_id, doc in pending:
            try:
                self.ctx.records.open(run_id, doc)
            except Exception:
                self.ctx.count("record_open")
                log.warning("opening the record of run %s failed again", run_id)
                continue
            done.append(run_id)
            with self.ctx.lock:
                self.unopened.pop(run_id, None)
        return done

    def record_backlog(self) -> dict[str, int]:
        """Record work waiting for a retry (/healthz): terminal runs not sealed (database-wide)
        and records this process could not open."""
        with self.ctx.store.autocommit() as tx:
            unsealed = tx.unsealed_count()
        with self.ctx.lock:
            unopened = len(self.unopened)
        return {"unsealed": unsealed, "unopened": unopened}

    def seal(self, run_id: str) -> bool:
        """Seal a terminal run's record from the database, after its terminal commit (§7.7).

        Idempotent: True only for the call that created ``seal.json`` (I6).
        """
        return self._seal(run_id).created

    def _seal(self, run_id: str, src: SealSource | None = None, then_head: bool = False) -> Sealed:
        """:meth:`seal` from ``src`` (None: read it); with ``then_head``, the sweep's first
        read made with the sealed mark, in its round trip (None: not read)."""
        if src is None:
            with self.ctx.store.autocommit() as tx:
                src = tx.seal_source(run_id)
        if src is None or src.state not in (RunState.PASSED, RunState.FAILED):
            return Sealed(False)
        sealed = self.ctx.records.seal(
            run_id,
            contract=src.contract or {},
            state=src.state,
            verdict=src.verdict,
            ended_at=src.ended_at.isoformat() if src.ended_at else None,
            events=src.events,
            step_logs=[(seq, name, log) for seq, name, log in src.logs],
        )
        with self.ctx.store.autocommit() as tx:  # one round trip, atomic on its own
            if then_head:
                mark = self.ctx.sweep_memo.mark  # §6: only what changed since
                return Sealed(sealed, tx.sweep_head(HEAD_PAGE, sealed=run_id, since=mark))
            tx.mark_sealed(run_id)
        return Sealed(sealed)

    def seal_safely(self, run_id: str) -> bool:
        """Seal after a commit, isolated: a failing record is logged and counted, stays
        unsealed in the database (runs.sealed) and is retried at startup and by every reaper
        pass; it never stops other seals or the wake that follows (issue 11 §6)."""
        return self._seal_safely(run_id).created

    def _seal_reading_head(
        self, run_id: str, src: SealSource | None, then_head: bool
    ) -> SweepHead | None:
        """:meth:`seal_safely`; with ``then_head`` the sweep's first read (None: not read, or
        the seal failed)."""
        return self._seal_safely(run_id, src, then_head).head

    def _seal_safely(
        self, run_id: str, src: SealSource | None = None, then_head: bool = False
    ) -> Sealed:
        try:
            return self._seal(run_id, src, then_head)
        except StoreUnavailable:
            return Sealed(False)  # the database is gone: the next pass finds it unsealed
        except Exception:
            self.ctx.count("record_seal")
            log.exception("sealing the record of run %s failed; the reaper retries", run_id)
            return Sealed(False)

    def seal_unsealed(self) -> list[str]:
        """Seal terminal runs left unsealed (a crash between commit and seal, or a failed seal;
        §7.7). Each is isolated: one bad record is logged and counted, the others proceed."""
        try:
            with self.ctx.store.autocommit() as tx:
                pending = tx.unsealed_runs()
        except Exception:
            log.exception("listing unsealed records failed; the next pass tries again")
            return []
        return [r for r in pending if self.seal_safely(r)]
