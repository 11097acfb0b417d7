"""The one orchestration layer: submit, the promotion sweep, adverts, reads (docs/design.md §9).

The HTTP API, the CLI and the simulator all call :class:`Mediator`; none of them re-implements a
flow. Decisions come from the pure modules (``contract``, ``match``, ``states``); persistence from
``store.db``; files from ``records``. Every run-changing transaction follows the locking rule of
docs/design.md §9: the run row first, then steps, leases, asks.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mediator import contract as contract_mod
from mediator.clock import Clock, wall_clock
from mediator.config import Config
from mediator.errors import (
    ConfigError,
    ContractError,
    Forbidden,
    NodeTaken,
    NotFound,
    StoreUnavailable,
)
from mediator.lifecycle import LifecycleMixin
from mediator.match import (
    ALL_BUSY,
    NO_CANDIDATE,
    TOO_WIDE,
    Advert,
    AdvertIndex,
    Assignment,
    Reject,
    match,
)
from mediator.pg import EmbeddedPostgres
from mediator.records import Records
from mediator.rows import Fleet, FleetNode, Run, RunList
from mediator.states import RunState, StepState, Verdict, run_transition, step_transition
from mediator.store.db import Store, Tx

log = logging.getLogger("mediator")

RUN_STATES = frozenset(s.value for s in RunState)
DRAIN_POLICIES = ("", "graceful", "at-boundary")
_CACHEABLE = (ALL_BUSY, NO_CANDIDATE)  # monotone within a sweep (design.md §4); TOO_WIDE is not
_PAGE = 64


@dataclass(frozen=True)
class Submission:
    """What ``submit`` answers: the HTTP status and the run as committed (or the dry-run body)."""

    status: int
    run: Run | None
    dry_run: dict[str, Any] | None = None

    def body(self) -> dict[str, Any]:
        if self.dry_run is not None:
            return self.dry_run
        assert self.run is not None
        return self.run.to_dict()


@dataclass(frozen=True)
class _NewRun:
    """A submitted run on its way into the database: what every submit path writes."""

    run_id: str
    parsed: contract_mod.Contract
    doc: dict[str, Any]
    needs: dict[str, dict[str, Any]]
    key: str
    submitter: str


@dataclass
class WakeReport:
    """What one sweep did: promoted run ids in order, and how much it looked at."""

    promoted: list[str] = field(default_factory=list)
    assigned: dict[str, dict[str, str]] = field(default_factory=dict)  # run_id → {role: node}
    classes: int = 0
    examined: int = 0
    too_wide: list[str] = field(default_factory=list)
    errors: int = 0


def _too_wide(res: Assignment | Reject) -> bool:
    return isinstance(res, Reject) and res.code == TOO_WIDE


def _chosen(role_needs: dict[str, Any], node: FleetNode) -> dict[str, Any]:
    """runAcquires' record of what hardware serves a role (FR-3)."""
    return {
        "node": node.node_id,
        "instance": node.instance,
        "matched": contract_mod.matched(role_needs, node.capabilities),
    }


class Mediator(LifecycleMixin):
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
        # Test seam for the missed-wake race (R17): called between submit's fleet read and its
        # insert, so a test can commit a release exactly there. None in production.
        self._after_fleet_read: Callable[[str], None] | None = None
        # R17's guard, switchable only so a test can show the race it closes is real.
        self._missed_wake_guard = True
        # Called with (seconds, WakeReport) after every sweep: metrics, the simulator's counters.
        self.sweep_observers: list[Callable[[float, WakeReport], None]] = []
        # Failures this process survived (R7, R16, issue 11 §5–6), for /metrics: keys
        # "sweep_run" (one run's promotion), "record_open", "record_seal", "wake".
        self.failures: Counter[str] = Counter()
        # Records whose contract.json could not be written after their commit (issue 11 §5):
        # run_id → contract, retried by every reaper pass. Sealing writes contract.json too, so
        # a run that ends first loses nothing even if this process restarts.
        self._unopened: dict[str, dict[str, Any]] = {}
        self._records_lock = threading.Lock()
        # Wake 5 on reconnect, and outages given back to nodes (docs/design.md).
        store.on_reconnect.append(self._on_reconnect)

    # ---- lifecycle -----------------------------------------------------------------------------
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
    ) -> Mediator:
        """Connect to ``database_url`` (or ``MEDIATOR_DATABASE_URL``, or the config's), else start
        an embedded PostgreSQL (throw-away, or persistent in ``data_dir``); load the schema if the
        database is empty; seal what a crash left unsealed and wake once (wake 5)."""
        config = config or Config()
        url = database_url or os.environ.get("MEDIATOR_DATABASE_URL") or config.database_url
        embedded = None
        if not url:
            embedded = EmbeddedPostgres(data_dir)
            url = embedded.dsn()
        try:
            store = Store(url, clock, max_size=pool_size)
        except BaseException:
            if embedded is not None:
                embedded.stop()
            raise
        root = records_root or config.records_root
        if root is None:
            root = (
                tempfile.mkdtemp(prefix="mediator-records-")
                if embedded is not None and data_dir is None
                else os.path.join(os.getcwd(), "var", "records")
            )
        med = cls(store, config, Records(root), clock, embedded)
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
        self.seal_unsealed()  # each seal isolated; never raises
        self._open_unopened()
        return self._wake_safely("startup")

    def _open_unopened(self) -> None:
        """Startup: a record whose open failed after its commit in an earlier process (issue 11
        §5) is opened now; a run that ended meanwhile was completed by its seal."""
        try:
            with self.store.autocommit() as tx:
                missing = [
                    r for r in tx.active_runs()
                    if not (self.records.dir(r) / "contract.json").exists()
                ]  # fmt: skip
                docs = {r: tx.live_contract(r) or {} for r in missing}
        except Exception:
            log.exception("checking for unopened records at startup failed")
            return
        for run_id, doc in docs.items():
            self._open_record(run_id, doc)

    def _on_reconnect(self, outage_s: float) -> None:
        """The database answers again after ``outage_s`` seconds out of reach (called by the
        store's reconnect watcher). Outages don't count against nodes: every advert and lease
        that was live when it began gets the time back, so no node is reaped and no submit
        refused only because heartbeats could not land. Then one sweep: wake 5."""
        if outage_s > 0:
            try:
                with self.store.tx() as tx:
                    tx.shift_expiries(
                        outage_s,
                        self.config.advert_ttl_seconds,
                        self.config.lease_ttl_seconds,
                    )
            except StoreUnavailable:
                return  # down again: the watcher calls us once more when it is back
            except Exception:
                log.exception("giving nodes back an outage of %.1f s failed", outage_s)
        self._wake_safely("reconnect")

    def close(self) -> None:
        self.store.close()
        if self._embedded is not None:
            self._embedded.stop()
            self._embedded = None

    def __enter__(self) -> Mediator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- helpers -------------------------------------------------------------------------------
    def _now(self) -> datetime:
        return self.clock() if self.clock is not None else wall_clock()

    def _new_run_id(self) -> str:
        """Time-ordered from the Mediator's clock (docs/design.md §4), unique by a random suffix."""
        return self._now().strftime("%Y%m%dT%H%M%S%f") + "-" + secrets.token_hex(4)

    def _wake_safely(self, why: str) -> WakeReport | None:
        """R16: a failing wake never changes the triggering call's result; it is logged.

        Wake 5: a sweep that failed because the database could not be reached is not left to
        some later event (steady heartbeats never sweep, R14): the store's reconnect watcher
        sweeps as soon as the database answers again."""
        try:
            return self.wake_queued()
        except StoreUnavailable:
            self._count("wake")
            log.warning("wake after %s failed: the database is unreachable; "
                        "sweeping again as soon as it answers (wake 5)", why)  # fmt: skip
            self.store.watch()
            return None
        except Exception:
            self._count("wake")
            log.exception("wake after %s failed; the next event will sweep again", why)
            return None

    def _count(self, what: str) -> None:
        """One more survived failure of kind ``what`` (request threads count concurrently)."""
        with self._records_lock:
            self.failures[what] += 1

    # ---- after-commit record work (issue 11 §5–6) -----------------------------------------
    def _open_record(self, run_id: str, doc: dict[str, Any]) -> None:
        """Records.open after a commit. A failure never turns the committed answer into an
        error: it is logged, counted and retried by the reaper (and sealing writes it too)."""
        try:
            self.records.open(run_id, doc)
        except Exception:
            self._count("record_open")
            log.exception("opening the record of run %s failed; the reaper retries", run_id)
            with self._records_lock:
                self._unopened[run_id] = doc

    def _seal_safely(self, run_id: str) -> bool:
        """Seal after a commit, isolated: a failing record is logged and counted, stays
        unsealed in the database (runs.sealed) and is retried at startup and by every reaper
        pass; it never stops other seals or the wake that follows (issue 11 §6)."""
        try:
            return self.seal(run_id)
        except StoreUnavailable:
            return False  # the database is gone: the next pass finds it unsealed
        except Exception:
            self._count("record_seal")
            log.exception("sealing the record of run %s failed; the reaper retries", run_id)
            return False

    def retry_unopened(self) -> list[str]:
        """Write the contract.json that failed after commit; returns the runs now opened."""
        with self._records_lock:
            pending = list(self._unopened.items())
        done = []
        for run_id, doc in pending:
            try:
                self.records.open(run_id, doc)
            except Exception:
                self._count("record_open")
                log.warning("opening the record of run %s failed again", run_id)
                continue
            done.append(run_id)
            with self._records_lock:
                self._unopened.pop(run_id, None)
        return done

    def record_backlog(self) -> dict[str, int]:
        """Record work waiting for a retry (/healthz): terminal runs not sealed (database-wide)
        and records this process could not open."""
        with self.store.autocommit() as tx:
            unsealed = tx.unsealed_count()
        with self._records_lock:
            unopened = len(self._unopened)
        return {"unsealed": unsealed, "unopened": unopened}

    @staticmethod
    def _view(fleet: Iterable[FleetNode]) -> tuple[list[Advert], set[str], set[str]]:
        nodes = list(fleet)
        adverts = [Advert(n.node_id, n.capabilities) for n in nodes]
        busy = {n.node_id for n in nodes if n.busy}
        draining = {n.node_id for n in nodes if n.drain}
        return adverts, busy, draining

    # ---- submit (docs/design.md §5) -----------------------------------------------------------
    def submit(
        self, contract: dict[str, Any], principal: str | None = "cli", dry_run: bool = False
    ) -> Submission:
        """Submit a run: 201 RUNNING, 202 QUEUED, 200 existing / dry run, 422 FAILED.

        Raises:
            ContractError: the contract is malformed (400); nothing is written.
        """
        # R3, NFR-I7: GetRun is at the head of submit, before anything else is checked.
        given = contract.get("run_id") if isinstance(contract, dict) else None
        if isinstance(given, str) and contract_mod.valid_run_id(given):
            existing = self._read_run(given)
            if existing is not None:
                return Submission(200, existing)
        parsed = contract_mod.parse(contract)  # R5: structure checked synchronously
        needs = {role: dict(n) for role, n in parsed.roles.items()}
        key = contract_mod.needs_key(needs)
        max_width = self.config.max_width

        if dry_run:
            with self.store.autocommit() as tx:
                adverts, busy, _ = self._view(tx.fleet_for(needs))
            # NFR-I6: unavailable = busy only, so the answer does not change when nodes drain.
            dry = match(needs, adverts, busy, max_width)
            if isinstance(dry, Assignment):
                body = {"dry_run": True, "assigned": dict(dry.roles), "width": dry.width}
            else:
                body = {"dry_run": True, "reject": dry.as_dict()}
            return Submission(200, None, body)

        run_id = parsed.run_id or self._new_run_id()
        doc = dict(parsed.doc)
        doc["run_id"] = run_id
        submitter = principal or ""

        new = _NewRun(run_id, parsed, doc, needs, key, submitter)
        with self.store.autocommit() as tx:
            fleet = tx.fleet_for(needs)  # only nodes that might serve it: flat in fleet size
        if self._after_fleet_read is not None:
            self._after_fleet_read(run_id)
        adverts, busy, draining = self._view(fleet)
        res: Assignment | Reject | None = match(needs, adverts, busy | draining, max_width)
        if isinstance(res, Reject) and res.code in (ALL_BUSY, TOO_WIDE):
            # R1, R10 (amended, docs/design.md): TOO_WIDE is refused only if a match that
            # ignores availability is too wide as well; otherwise freeing nodes can make the
            # run narrow (folding), so it waits in the queue, its wait_reason TOO_WIDE. And
            # the converse: a run that is ALL_BUSY now but too wide with every node free could
            # never be promoted, so it is refused now rather than after nodes free up. Either
            # way the answer does not depend on which nodes happen to be busy.
            free = match(needs, adverts, set(), max_width)
            res = free if _too_wide(free) else None

        if isinstance(res, Assignment):
            try:
                run = self._create_run(new, res, fleet)
            except NodeTaken:
                res = None  # R2: the same as ALL_BUSY; the transaction rolled back whole
            else:
                if run is None:
                    return Submission(200, self._require_run(run_id))
                self._open_record(run_id, doc)
                return Submission(201, run)

        if res is None:  # ALL_BUSY (R1), NodeTaken (R2), or TOO_WIDE only for now (R10)
            run = self._create_queued_run(new)
            if run is None:
                return Submission(200, self._require_run(run_id))
            self._open_record(run_id, doc)
            if self._missed_wake_guard:
                # R17 (ours): a release that committed between our fleet read and this insert
                # swept before the row was visible; sweep once more so the run does not wait
                # beside a free node. The 202 still shows the run as committed.
                self._wake_safely("queued submit")
            return Submission(202, run)

        # NO_CANDIDATE, or TOO_WIDE even with every node free: permanent (R1) → FAILED, 422.
        assert isinstance(res, Reject)  # an Assignment returned above, None was queued
        run = self._create_rejected_run(new, res)
        if run is None:
            return Submission(200, self._require_run(run_id))
        self._open_record(run_id, doc)
        self._seal_safely(run_id)
        return Submission(422, run)

    def _step_rows(
        self,
        parsed: contract_mod.Contract,
        state: str,
        assigned: dict[str, str] | None,
        chosen: dict[str, dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        return [
            {
                "seq": s.seq,
                "name": s.name,
                "kind": s.kind,
                "role": s.role,
                "uses": s.uses,
                "with": dict(s.with_),
                "after": list(s.after),
                "ask": s.ask,
                "state": state,
                "node_id": (assigned or {}).get(s.role, "") if s.kind == "exec" else "",
                "chosen": (chosen or {}).get(s.role) if s.kind == "exec" else None,
            }
            for s in parsed.steps
        ]

    def _insert(
        self,
        tx: Tx,
        new: _NewRun,
        state: RunState,
        step_state: StepState,
        *,
        verdict: Verdict | None = None,
        assigned: dict[str, str] | None = None,
        reject: dict[str, Any] | None = None,
    ) -> Run | None:
        """The run row and its steps, as every submit path writes them first (R5: steps exist
        from submit); None when the run_id exists already (R3)."""
        tx.insert_needs_class(new.key, new.needs)
        row = tx.insert_run(
            run_id=new.run_id,
            work_id=new.parsed.work_id,
            state=state,
            verdict=verdict,
            contract=new.doc,
            needs_key=new.key,
            assigned=assigned,
            reject=reject,
            submitter=new.submitter,
        )
        if row is not None:
            tx.insert_steps(new.run_id, self._step_rows(new.parsed, step_state, assigned))
        return row

    def _create_run(self, new: _NewRun, res: Assignment, fleet: list[FleetNode]) -> Run | None:
        """CreateRun: one transaction in R12's order; None if the run_id exists (R3)."""
        run_id, parsed, needs = new.run_id, new.parsed, new.needs
        assigned = dict(res.roles)
        by_id = {n.node_id: n for n in fleet}
        if not any(s.kind == "ask" for s in parsed.steps):
            # issue 13: the whole CreateRun in one statement (raiseAsks has nothing to raise).
            nodes = sorted(set(assigned.values()))
            chosen = {role: _chosen(needs[role], by_id[node]) for role, node in assigned.items()}
            events = [
                {"kind": "submitted", "data": {"state": "RUNNING", "assigned": assigned}},
                *({"node_id": n, "kind": "lease_granted", "data": {}} for n in nodes),
            ]
            return self._create(
                new,
                RunState.RUNNING,
                StepState.PENDING,
                events,
                assigned=assigned,
                chosen=chosen,
                leases=[{"node_id": n, "instance": by_id[n].instance} for n in nodes],
            )
        with self.store.tx() as tx:
            row = self._insert(tx, new, RunState.RUNNING, StepState.PENDING, assigned=assigned)
            if row is None:
                return None
            has_asks = True
            asks = self._acquire(
                tx, run_id, assigned, needs, by_id, promoted=False, has_asks=has_asks
            )
            # The 201 body is the run as committed: read inside the transaction, no extra trip.
            run = Run(**{**row.__dict__, "steps": tuple(tx.steps(run_id))})
        self._push_asks(asks)
        return run

    def _acquire(
        self,
        tx: Tx,
        run_id: str,
        assigned: dict[str, str],
        needs: dict[str, dict[str, Any]],
        by_id: dict[str, FleetNode],
        *,
        promoted: bool,
        has_asks: bool = True,
    ) -> list[Any]:
        """Leases → runAcquires → raiseAsks → events: the common tail of CreateRun and promote."""
        nodes = sorted(set(assigned.values()))
        leases = [{"node_id": n, "instance": by_id[n].instance} for n in nodes]
        tx.insert_leases(run_id, leases, self.config.lease_ttl_seconds)  # NodeTaken → rollback
        chosen = {role: _chosen(needs[role], by_id[node]) for role, node in assigned.items()}
        tx.assign_steps(run_id, assigned, chosen)
        asks = tx.raise_asks(run_id) if has_asks else []
        events: list[dict[str, Any]] = []
        if promoted:
            events.append({"run_id": run_id, "kind": "promoted", "data": {"assigned": assigned}})
        else:
            events.append(
                {
                    "run_id": run_id,
                    "kind": "submitted",
                    "data": {"state": "RUNNING", "assigned": assigned},
                }
            )
        events += [
            {"run_id": run_id, "node_id": n, "kind": "lease_granted", "data": {}} for n in nodes
        ]
        tx.insert_events(events)
        return asks

    def _create(
        self,
        new: _NewRun,
        state: RunState,
        step_state: StepState,
        events: list[dict[str, Any]],
        *,
        verdict: Verdict | None = None,
        assigned: dict[str, str] | None = None,
        chosen: dict[str, dict[str, Any]] | None = None,
        reject: dict[str, Any] | None = None,
        leases: list[dict[str, str]] | None = None,
    ) -> Run | None:
        """A submit's write as one autocommit statement (issue 13): needs class, run, steps,
        leases, events; the run as committed, or None if the run_id exists (R3). NodeTaken
        (R2) leaves nothing written. ``state`` and ``step_state`` are edges from no row."""
        run_transition(None, state)
        step_transition(None, step_state)
        with self.store.autocommit() as tx:
            return tx.create_run(
                run={
                    "run_id": new.run_id,
                    "work_id": new.parsed.work_id,
                    "state": state,
                    "verdict": verdict,
                    "contract": new.doc,
                    "needs_key": new.key,
                    "assigned": assigned,
                    "reject": reject,
                    "submitter": new.submitter,
                },
                needs=new.needs,
                steps=self._step_rows(new.parsed, step_state, assigned, chosen),
                leases=leases or [],
                events=events,
                ttl_s=self.config.lease_ttl_seconds,
            )

    def _create_queued_run(self, new: _NewRun) -> Run | None:
        """CreateQueuedRun: QUEUED, every step PENDING with node_id '', nothing held (R4, R5).
        The 202 body is the run exactly as committed."""
        events = [{"kind": "submitted", "data": {"state": "QUEUED"}}]
        return self._create(new, RunState.QUEUED, StepState.PENDING, events)

    def _create_rejected_run(self, new: _NewRun, res: Reject) -> Run | None:
        """R1: no node could ever serve it (or too wide at t=0) → FAILED/rejected, steps SKIPPED."""
        reject = res.as_dict()
        events = [{"kind": "rejected", "data": {"reject": reject}}]
        return self._create(
            new, RunState.FAILED, StepState.SKIPPED, events, verdict=Verdict.REJECTED, reject=reject
        )

    # ---- WakeQueued (docs/design.md §6, R6–R12) ----------------------------------------------
    def wake_queued(self) -> WakeReport:
        """The promotion sweep over the queue, FIFO with skipping (timed for the observers)."""
        started = time.perf_counter()
        report = self._sweep()
        for observe in self.sweep_observers:
            observe(time.perf_counter() - started, report)
        return report

    def _sweep(self) -> WakeReport:
        """The promotion sweep over the queue, FIFO with skipping.

        Safe to call again and concurrently from any number of processes (R9): the conditional
        update (R8) and the lease primary key (I1) decide every race; no hand-made locks.
        """
        ttl = self.config.lease_ttl_seconds
        # R11: refuse before anything else rather than issue leases that never expire.
        if not isinstance(ttl, int | float) or ttl <= 0:
            raise ConfigError(
                "lease_ttl_seconds must be greater than 0 to promote queued runs (R11).",
                field="lease_ttl_seconds",
            )
        report = WakeReport()
        with self.store.autocommit() as tx:
            classes = tx.queued_classes()
            if not classes:
                return report  # R13's cost argument: an empty queue costs one query
            fleet = tx.fleet()
        report.classes = len(classes)
        adverts, busy, draining = self._view(fleet)
        unavailable = busy | draining
        live = {n.node_id for n in fleet}
        if not live - unavailable:
            return report
        by_id = {n.node_id: n for n in fleet}
        index = AdvertIndex(adverts)  # candidates per role computed once per sweep
        needs = {c.needs_key: c.needs for c in classes}
        max_width = self.config.max_width
        failed: set[str] = set()
        memo: dict[str, Assignment | Reject] = {}

        def decide(key: str) -> Assignment | Reject:
            # match() is pure: with `unavailable` unchanged its answer for a class is the same
            # for every run of the class, so compute it once per class until a promotion.
            res = memo.get(key)
            if res is None:
                res = memo[key] = match(needs[key], index, unavailable, max_width)
                if isinstance(res, Reject) and res.code in _CACHEABLE:
                    failed.add(key)  # stays true for the rest of the sweep (§6)
            return res

        for key in needs:
            decide(key)
        viable = [k for k in needs if k not in failed]
        after_at: datetime | str = "-infinity"
        after_id = ""
        while viable and live - unavailable:
            with self.store.autocommit() as tx:
                page = tx.queued_page(viable, after_at, after_id, _PAGE)
            if not page:
                break
            for q in page:
                if not live - unavailable:
                    break  # early stop: nothing left to give
                report.examined += 1
                # A lost lease race re-matches the same run with the taken node excluded:
                # skipping it instead would let a later run of the same class take the next
                # free node first (I7; found by the six-sweeper test). Each retry makes
                # `unavailable` grow, so the loop ends.
                while q.needs_key not in failed:  # R6: a failed class is skipped, not a stop
                    res = decide(q.needs_key)
                    if isinstance(res, Reject):
                        if res.code == TOO_WIDE:
                            # R10: at promotion the width depends on which nodes are free.
                            log.info("run %s stays queued: %s", q.run_id, res.message)
                            report.too_wide.append(q.run_id)
                        break
                    try:
                        ok = self.promote(q.run_id, res, needs[q.needs_key], by_id)
                    except NodeTaken:
                        # R9: the taken nodes join unavailable. Which ones: those now busy in
                        # the database; if none shows yet (a competitor not yet committed, or
                        # a lock timeout), every node of this assignment, conservatively.
                        nodes = set(res.roles.values())
                        with self.store.autocommit() as tx:
                            taken = nodes & tx.busy_nodes()
                        unavailable |= taken or nodes
                        memo.clear()
                        continue
                    except StoreUnavailable:
                        raise  # the database is gone: no run can move; wake 5 sweeps again
                    except Exception:
                        # R7: any failure of one run's promotion (a foreign exception too) is
                        # logged with the run id, counted, and the sweep goes on.
                        log.exception("promoting run %s failed; the sweep goes on", q.run_id)
                        report.errors += 1
                        self._count("sweep_run")
                        break
                    if ok:
                        report.promoted.append(q.run_id)
                        report.assigned[q.run_id] = dict(res.roles)
                        unavailable |= set(res.roles.values())  # R9: taken by us now
                        memo.clear()
                    break  # promoted, or R8: another sweep or a cancel got there first
            after_at, after_id = page[-1].created_at, page[-1].run_id
            viable = [k for k in viable if k not in failed]
        return report

    def promote(
        self,
        run_id: str,
        res: Assignment,
        needs: dict[str, dict[str, Any]],
        by_id: dict[str, FleetNode],
    ) -> bool:
        """Move one run QUEUED → RUNNING in its own transaction (R7, R12).

        Returns False when the conditional update found the run no longer QUEUED (R8: another
        sweep or a cancel got there first). Raises NodeTaken when a lease conflicts (R9).
        """
        assigned = dict(res.roles)
        with self.store.tx() as tx:
            if not tx.promote_run(run_id, assigned):
                return False
            asks = self._acquire(tx, run_id, assigned, needs, by_id, promoted=True)
        self._push_asks(asks)
        return True

    def _push_asks(self, asks: list[Any]) -> None:
        """PushAsks runs after commit only (R12): a question from a rolled-back transaction
        must never reach a person. Subscribers are notified through the events feed."""
        for ask in asks:
            log.info("ask %s raised for run %s step %s", ask.ask_id, ask.run_id, ask.seq)

    # ---- adverts ---------------------------------------------------------------------------
    def advert(
        self,
        node_id: str,
        capabilities: dict[str, Any],
        instance: str,
        label: str = "",
        drain: str = "",
        principal: str | None = None,
    ) -> float:
        """A node's heartbeat: upsert, renew its lease; wakes only on drain release (6) or a
        node's return (7). Returns ``advert_ttl_seconds`` so nodes pace themselves."""
        if not contract_mod.valid_run_id(node_id):
            raise ContractError(
                "node_id must be 1-64 characters of letters, digits, '.', '_' or '-'.",
                field="node_id",
            )
        caps = contract_mod.validate_capabilities(capabilities)
        contract_mod.check_texts(label=label, instance=instance)  # NUL, surrogates: 400
        if not isinstance(instance, str) or not instance or len(instance) > 128:
            raise ContractError(
                "instance must be a non-empty string of at most 128 characters.", field="instance"
            )
        if not isinstance(label, str) or len(label) > 200:
            raise ContractError("label must be a string of at most 200 characters.", field="label")
        if drain not in DRAIN_POLICIES:
            raise ContractError(
                "drain must be '', 'graceful' or 'at-boundary'.", field="policy.drain"
            )
        ttl = self.config.advert_ttl_seconds
        lease_ttl = self.config.lease_ttl_seconds
        with self.store.autocommit() as tx:  # one statement: upsert and lease renewal (issue 13)
            prev = tx.upsert_advert(
                node_id, label, principal or "", caps, instance, drain, ttl, lease_ttl
            )
        if prev is None:
            raise Forbidden(f"Node {node_id} belongs to another principal.", code="not_your_node")
        released = False
        if not prev.inserted and (prev.prev_instance != instance or drain == "at-boundary"):
            # (a node advertising for the first time holds no lease to check)
            # Restart detection and at-boundary drains (§7.5); wake 4 if they released a node.
            released = self._advert_effects(node_id, instance, drain)
        released_drain = prev.prev_drain != "" and drain == ""
        # Wake 7 (ours): the node was absent (never seen counts) or expired before this advert.
        returned = self.config.wake_on_return and not prev.prev_live
        # Wake 9: capabilities differ from the stored ones — capacity can appear that way too
        # (a node that gains a capability is the vanished node's window by another door).
        changed = not prev.inserted and prev.caps_changed
        if released or released_drain or returned or changed:
            # Wake 4 (restart/drain settled a run), 6 (drain released), 7, 9. A steady
            # heartbeat (same policy, same capabilities) does none of these: never sweeps (R14).
            self._wake_safely("advert")
        return ttl

    # ---- reads -----------------------------------------------------------------------------
    def _read_run(self, run_id: str) -> Run | None:
        with self.store.autocommit() as tx:
            run = tx.get_run(run_id)
            if run is None:
                return None
            steps = tuple(tx.steps(run_id))
            if run.state != RunState.QUEUED:
                return Run(**{**run.__dict__, "steps": steps})
            position = tx.queue_position(run_id)
            contract = tx.live_contract(run_id) or {}
            needs = {r: dict(n) for r, n in (contract.get("roles") or {}).items()}
            fleet = tx.fleet_for(needs)  # the wait reason needs only this run's candidates
        reason = self._wait_reason(needs, fleet)
        return Run(
            **{**run.__dict__, "steps": steps, "queue_position": position, "wait_reason": reason}
        )

    def _wait_reason(
        self, needs: dict[str, dict[str, Any]], fleet: Iterable[FleetNode]
    ) -> dict[str, Any]:
        """A queued run's ``wait_reason``: the reject a dry match against the fleet gives now."""
        adverts, busy, draining = self._view(fleet)
        res = match(needs, adverts, busy | draining, self.config.max_width)
        if not isinstance(res, Reject):
            return {
                "code": "PROMOTABLE",
                "message": "A matching node is free now; the next wake promotes this run.",
            }
        reason = res.as_dict()
        cands = set(reason.get("candidates") or ())
        reason["busy"] = sorted(cands & busy)
        reason["draining"] = sorted(cands & draining)
        return reason

    def _require_run(self, run_id: str) -> Run:
        run = self._read_run(run_id)
        if run is None:
            raise NotFound(f"No run with run_id {run_id!r}.", code="unknown_run")
        return run

    def get_run(self, run_id: str) -> Run:
        """The run with its steps (and ``queue_position``/``wait_reason`` while QUEUED)."""
        if not isinstance(run_id, str) or not contract_mod.valid_run_id(run_id):
            raise NotFound(f"No run with run_id {run_id!r}.", code="unknown_run")
        return self._require_run(run_id)

    def list_runs(
        self,
        state: str | None = None,
        work_id: str | None = None,
        since: datetime | None = None,
        limit: int = 100,
    ) -> RunList:
        """Runs newest first (seed 003 §4), with ``observed_at`` read first."""
        if state is not None and state not in RUN_STATES:
            raise ContractError(
                f"state must be one of {', '.join(sorted(RUN_STATES))}.", field="state"
            )
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 1000:
            raise ContractError("limit must be a whole number from 1 to 1000.", field="limit")
        if since is not None and not isinstance(since, datetime):
            raise ContractError("since must be a timestamp.", field="since")
        with self.store.autocommit() as tx:  # observed_at first, then the rows (seed 003 §3.2)
            observed = tx.observed_at()
            rows = tx.list_runs(state, work_id, since, limit)
            by_state = tx.run_counts()  # the panel's header (issue 15 §5), lab-wide
            queued = [r.run_id for r in rows if r.state == RunState.QUEUED]
            # Issue 15 §4: position and needs of the whole page in one statement, then one
            # fleet read for all their candidates — never a statement per queued row.
            details = {d["run_id"]: d for d in tx.queued_details(queued)} if queued else {}
            merged = {f"{i}.{role}": dict(need) for i, d in enumerate(details.values())
                      for role, need in d["needs"].items()}  # fmt: skip
            fleet = tx.fleet_for(merged) if details else []
        if details:
            rows = [
                dataclasses.replace(
                    r,
                    queue_position=int(details[r.run_id]["position"]),
                    wait_reason=self._wait_reason(details[r.run_id]["needs"], fleet),
                )
                if r.run_id in details
                else r
                for r in rows
            ]
        counts = {s.lower(): by_state.get(s, 0) for s in (RunState.QUEUED, RunState.RUNNING)}
        return RunList(observed, tuple(rows), counts)

    def list_nodes(self) -> Fleet:
        """Live nodes with their lease (seed 003 §3), ``observed_at`` read before the rows."""
        with self.store.autocommit() as tx:  # observed_at first, then the rows (seed 003 §3.2)
            observed = tx.observed_at()
            nodes = tx.list_nodes()
        return Fleet(observed, tuple(nodes))

    def node_principal(self, node_id: str) -> str | None:
        """The principal a node is bound to (None: unknown node) — for authorization only."""
        with self.store.autocommit() as tx:
            return tx.node_principal(node_id)

    def query(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        """A read-only SQL query (rows as dicts) for analytics: the simulator and notebooks read
        runs, steps and events this way; a write raises MediatorError."""
        return self.store.read_only(sql, params)

    def ping(self) -> bool:
        """The database answers (``/healthz``), within about a second either way."""
        return self.store.ping()

    # ---- records ---------------------------------------------------------------------------
    def seal(self, run_id: str) -> bool:
        """Seal a terminal run's record from the database, after its terminal commit (§7.7).

        Idempotent: True only for the call that created ``seal.json`` (I6).
        """
        with self.store.autocommit() as tx:
            src = tx.seal_source(run_id)
        if src is None or src["state"] not in (RunState.PASSED, RunState.FAILED):
            return False
        sealed = self.records.seal(
            run_id,
            contract=src["contract"] or {},
            state=src["state"],
            verdict=src["verdict"],
            ended_at=src["ended_at"].isoformat() if src["ended_at"] else None,
            events=src["events"],
            step_logs=[(seq, name, log) for seq, name, log in src["logs"]],
        )
        with self.store.autocommit() as tx:  # one statement: atomic on its own
            tx.mark_sealed(run_id)
        return sealed
