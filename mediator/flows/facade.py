"""The Mediator facade: the one orchestration layer's public face (docs/design.md §9, §19).

The HTTP API, the CLI and the simulator all call :class:`Mediator`; none of them re-implements a
flow. Each public method delegates to one flow module of this package, handing it the shared
:class:`~mediator.flows.context.Context`; decisions come from the pure modules (``contract``,
``match``, ``states``), persistence from the store, files from ``records``, and everything after
a commit (seal, PushAsks, wake) from :class:`~mediator.flows.after.AfterCommit`. Every
run-changing transaction follows the locking rule of docs/design.md §9: the run row first, then
steps, leases, asks.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

import mediator.flows.advert as advert_flow
import mediator.flows.asks as asks_flow
import mediator.flows.ending as ending_flow
import mediator.flows.gaps as gaps_flow
import mediator.flows.reads as reads_flow
import mediator.flows.steps as steps_flow
import mediator.flows.submit as submit_flow
import mediator.flows.sweep as sweep_flow
from mediator import tmpdirs
from mediator.clock import Clock
from mediator.config import Config
from mediator.core.errors import StoreUnavailable
from mediator.core.rows import Ask, Fleet, Run, RunList, Step
from mediator.flows.after import AfterCommit
from mediator.flows.context import Context
from mediator.flows.ending import ReapReport
from mediator.flows.gaps import Timekeeper
from mediator.flows.steps import ReportResult
from mediator.flows.submit import Submission
from mediator.flows.sweep import WakeReport
from mediator.flows.wake import Wake
from mediator.pg import EmbeddedPostgres
from mediator.records import Records
from mediator.store.db import Store

RECORDS_PREFIX = "mediator-records-"  # then the owner's pid (mediator/tmpdirs.py)

log = logging.getLogger("mediator")


class Mediator:
    """The Mediator's Python interface (docs/design.md §19). Build it with :meth:`connect`."""

    def __init__(
        self,
        store: Store,
        config: Config,
        records: Records,
        clock: Clock | None = None,
        embedded: EmbeddedPostgres | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.records = records
        self.clock = clock
        self._embedded = embedded
        self._throwaway_records: str | None = None  # made by connect(), removed by close()
        self.ctx = Context(store, config, records, clock)
        # Wake 5 on reconnect, and outages given back to nodes (docs/design.md).
        store.on_reconnect.append(self._on_reconnect)
        # Stalls of this process and jumps of the database's clock given back like outages
        # (docs/design.md §13). Not under a virtual clock: the simulator's time jumps by design.
        if clock is None:
            self.ctx.timekeeper = Timekeeper(self.ctx)

    # ---- what callers observe and the tests' seams -----------------------------------------------
    @property
    def after(self) -> AfterCommit:
        """Seal, PushAsks, wake after a commit: the one path of every flow."""
        return self.ctx.after

    @property
    def failures(self) -> Counter[str]:
        """Failures this process survived (R7, R16, issue 11 §5–6), for /metrics."""
        return self.ctx.failures

    @property
    def sweep_observers(self) -> list[Callable[[float, WakeReport], None]]:
        """Called with (seconds, WakeReport) after every sweep: metrics, the simulator."""
        return self.ctx.sweep_observers

    @property
    def _after_fleet_read(self) -> Callable[[str], None] | None:
        """R17's test seam: called between submit's fleet read and its insert."""
        return self.ctx.after_fleet_read

    @_after_fleet_read.setter
    def _after_fleet_read(self, hook: Callable[[str], None] | None) -> None:
        self.ctx.after_fleet_read = hook

    @property
    def _missed_wake_guard(self) -> bool:
        """R17's guard, switchable only so a test can show the race it closes is real."""
        return self.ctx.missed_wake_guard

    @_missed_wake_guard.setter
    def _missed_wake_guard(self, on: bool) -> None:
        self.ctx.missed_wake_guard = on

    # ---- process ---------------------------------------------------------------------------------
    @classmethod
    def connect(
        cls,
        database_url: str | None = None,
        config: Config | None = None,
        clock: Clock | None = None,
        *,
        records_root: str | None = None,
        pool_size: int = 8,
        startup_wake: bool = True,
        data_dir: str | None = None,
        on_backend: Callable[[int], None] | None = None,
    ) -> Mediator:
        """Connect to ``database_url`` (or ``MEDIATOR_DATABASE_URL``, or the config's), else start
        an embedded PostgreSQL (throw-away, or persistent in ``data_dir``); load the schema if the
        database is empty; seal what a crash left unsealed and wake once (wake 5).
        ``on_backend`` gets the server pid of each new local connection (the simulator's CPU
        pinning, sim/affinity.py)."""
        config = config or Config()
        url = database_url or os.environ.get("MEDIATOR_DATABASE_URL") or config.database_url
        embedded = None
        if not url:
            embedded = EmbeddedPostgres(data_dir)
            url = embedded.dsn()
        try:
            store = Store(url, clock, max_size=pool_size, on_backend=on_backend)
        except BaseException:
            if embedded is not None:
                embedded.stop()
            raise
        root = records_root or config.records_root
        throwaway = None
        if root is None:
            if embedded is not None and data_dir is None:
                # A throw-away database's records go with it at close() (issue 29 §4); one left
                # by a killed process is removed by the next (mediator/tmpdirs.py).
                tmpdirs.remove_orphans(RECORDS_PREFIX)
                root = throwaway = tmpdirs.make(RECORDS_PREFIX)
            else:
                root = os.path.join(os.getcwd(), "var", "records")
        med = cls(store, config, Records(root), clock, embedded)
        med._throwaway_records = throwaway
        if startup_wake:
            med.startup()
        return med

    @property
    def database_url(self) -> str:
        """The DSN in use (the embedded one too), so other threads and processes can connect."""
        return self.store.dsn

    def startup(self) -> WakeReport | None:
        """Process start: seal what a crash left unsealed (§7.7), then one wake (wake 5).
        Neither failure stops startup (R16): a Mediator that cannot promote must still serve."""
        self.ctx.after.seal_unsealed()  # each seal isolated; never raises
        self.ctx.after.open_unopened()
        return self.ctx.after(wake=Wake.STARTUP)

    def _on_reconnect(self, outage_s: float) -> None:
        """The database answers again after ``outage_s`` seconds out of reach (called by the
        store's reconnect watcher). Outages don't count against nodes: every advert and lease
        that was live when it began gets the time back, so no node is reaped and no submit
        refused only because heartbeats could not land. Then one sweep: wake 5."""
        if outage_s > 0:
            try:
                # A jump of the database's clock during the outage (a host that rebooted) first,
                # measured in the clock as it was; then the outage, once across the processes
                # on this database: the gaps table (docs/design.md §13).
                if self.ctx.timekeeper is not None:
                    self.ctx.timekeeper.read_clock()
                gaps_flow.give_back(self.ctx, "outage", outage_s)
            except StoreUnavailable:
                return  # down again: the watcher calls us once more when it is back
            except Exception:
                log.exception("giving nodes back an outage of %.1f s failed", outage_s)
        self.ctx.after(wake=Wake.RECONNECT)

    @property
    def embedded(self) -> EmbeddedPostgres | None:
        """The embedded cluster this Mediator started, if it started one."""
        return self._embedded

    def close(self) -> None:
        """Close the pool; stop the embedded cluster this Mediator started, and remove the
        records folder it made for a throw-away one (nothing of either is left behind)."""
        if self.ctx.timekeeper is not None:
            self.ctx.timekeeper.stop()
        self.store.close()
        if self._embedded is not None:
            self._embedded.stop()
            self._embedded = None
        if self._throwaway_records is not None:
            shutil.rmtree(self._throwaway_records, ignore_errors=True)
            self._throwaway_records = None

    def __enter__(self) -> Mediator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- submit and the queue (mediator/flows/submit.py, sweep.py) -------------------------------
    def submit(
        self,
        contract: dict[str, Any],
        principal: str | None = "cli",
        dry_run: bool = False,
        *,
        capped: bool = False,
    ) -> Submission:
        """Submit a run: its :class:`~mediator.flows.submit.Outcome` — started (RUNNING), queued,
        existing (R3) or dry run, rejected (FAILED) — and the run as committed.

        Raises:
            ContractError: the contract is malformed (400); nothing is written.
            TooMany: ``capped`` and the principal's queue is full (429, docs/security.md).
        """
        return submit_flow.submit(self.ctx, contract, principal, dry_run, capped=capped)

    def wake_queued(self) -> WakeReport:
        """The promotion sweep over the queue, FIFO with skipping (timed for the observers).
        Every wake point sweeps through ``AfterCommit``, which calls the sweep itself; this is
        the sweep on demand (tools, benchmarks, tests)."""
        return sweep_flow.wake_queued(self.ctx)

    # ---- nodes (mediator/flows/advert.py, steps.py) ----------------------------------------------
    def advert(
        self,
        node_id: str,
        capabilities: dict[str, Any],
        instance: str,
        label: str = "",
        drain: str = "",
        principal: str | None = None,
        actions: list[str] | None = None,
    ) -> float:
        """A node's heartbeat: upsert, renew its lease; wakes 4, 6, 7, 9 only when capacity may
        have appeared. Returns ``advert_ttl_seconds`` so nodes pace themselves. ``actions``: the
        actions the node offers (None: not said, any; docs/design.md §4 "Actions")."""
        return advert_flow.advert(
            self.ctx, node_id, capabilities, instance, label, drain, principal, actions
        )

    def work(self, node_id: str) -> list[Step]:
        """Claimable steps of ``node_id``: PENDING, on it, every ``after`` PASSED, run RUNNING."""
        return steps_flow.work(self.ctx, node_id)

    def nodes_with_work(self, node_ids: list[str]) -> set[str]:
        """Which of ``node_ids`` have a claimable step now (what :meth:`work` would answer)."""
        return steps_flow.nodes_with_work(self.ctx, node_ids)

    def claim(self, run_id: str, seq: int, node_id: str, instance: str | None = None) -> Step:
        """PENDING → CLAIMED for the node the step belongs to (403 ``not_your_step``; 409
        ``run_ended``, ``stale_instance``, ``draining``, ``already_claimed``, ``not_claimable``)."""
        return steps_flow.claim(self.ctx, run_id, seq, node_id, instance)

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
        was a ``retry`` rollback (R15)."""
        return steps_flow.report(self.ctx, run_id, seq, node_id, attempt, outcome, log, instance)

    # ---- ending runs (mediator/flows/ending.py) --------------------------------------------------
    def cancel(self, run_id: str, principal: str | None = None, *, admin: bool = False) -> Run:
        """QUEUED or RUNNING → FAILED/cancelled; a terminal run is a no-op; always wakes
        (wake 2). Only the submitter or an admin may cancel (403)."""
        return ending_flow.cancel(self.ctx, run_id, principal, admin=admin)

    def reap(self) -> ReapReport:
        """One reaper pass: expired leases released, their runs FAILED/lost, records sealed;
        wakes only if it released something (R14, wake 3)."""
        return ending_flow.reap(self.ctx)

    # ---- asks (mediator/flows/asks.py) -----------------------------------------------------------
    def asks(self) -> list[Ask]:
        """Open asks, oldest first."""
        return reads_flow.asks(self.ctx)

    def answer(
        self, ask_id: int, answer: str, ok: bool = True, principal: str | None = None
    ) -> ReportResult:
        """Answer an ask: its step → PASSED (ok) or FAILED, then as a result (settle, wake 1)."""
        return asks_flow.answer(self.ctx, ask_id, answer, ok, principal)

    # ---- reads (mediator/flows/reads.py) ---------------------------------------------------------
    def get_run(self, run_id: str) -> Run:
        """The run with its steps (and ``queue_position``/``wait_reason`` while QUEUED)."""
        return reads_flow.get_run(self.ctx, run_id)

    def list_runs(
        self,
        state: str | None = None,
        work_id: str | None = None,
        since: datetime | None = None,
        limit: int = 100,
    ) -> RunList:
        """Runs newest first (seed 003 §4), with ``observed_at`` read first."""
        return reads_flow.list_runs(self.ctx, state, work_id, since, limit)

    def list_nodes(self, after: str = "", limit: int | None = None) -> Fleet:
        """Live nodes with their lease (seed 003 §3), ``observed_at`` read before the rows;
        paged by ``after`` (a node_id) and ``limit`` (None: every node, in one answer)."""
        return reads_flow.list_nodes(self.ctx, after, limit)

    def node_principal(self, node_id: str) -> str | None:
        """The principal a node is bound to (None: unknown node) — for authorization only."""
        return reads_flow.node_principal(self.ctx, node_id)

    def query(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        """A read-only SQL query (rows as dicts) for analytics; a write raises MediatorError."""
        return reads_flow.query(self.ctx, sql, params)

    def ping(self) -> bool:
        """The database answers (``/healthz``), within about a second either way."""
        return reads_flow.ping(self.ctx)

    # ---- records (mediator/flows/after.py) -------------------------------------------------------
    def seal(self, run_id: str) -> bool:
        """Seal a terminal run's record (§7.7); True only for the call that created it (I6)."""
        return self.ctx.after.seal(run_id)

    def seal_unsealed(self) -> list[str]:
        """Seal terminal runs left unsealed, each isolated (§7.7, issue 11 §6)."""
        return self.ctx.after.seal_unsealed()

    def retry_unopened(self) -> list[str]:
        """Write the contract.json that failed after commit; returns the runs now opened."""
        return self.ctx.after.retry_unopened()

    def record_backlog(self) -> dict[str, int]:
        """Record work waiting for a retry (/healthz): unsealed runs, unopened records."""
        return self.ctx.after.record_backlog()
