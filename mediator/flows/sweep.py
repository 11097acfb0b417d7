"""WakeQueued: the promotion sweep and promote (docs/design.md §6, R6–R12).

A sweep walks the queue in arrival order, one page at a time, deciding once per needs class with
the pure matcher; each promotion is its own statement (R7, issue 13) made of a conditional update
(R8) and the leases whose primary key decides races with other sweepers (R9). Every wake point ends
here, through :class:`~mediator.flows.after.AfterCommit`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mediator.core.errors import ConfigError, NodeTaken, StoreUnavailable
from mediator.core.match import (
    ALL_BUSY,
    NO_CANDIDATE,
    TOO_WIDE,
    AdvertIndex,
    Assignment,
    ClassIndex,
    Reject,
    match,
)
from mediator.core.rows import FleetNode, QueuedRun
from mediator.flows.fleet import lease_rows, run_acquires, view
from mediator.store.tx import SweepHead

if TYPE_CHECKING:
    from mediator.flows.context import Context

log = logging.getLogger("mediator")

HEAD_PAGE = 64  # the queue's head a sweep reads first; pages of this size past it

# Monotone within a sweep (design.md §4). TOO_WIDE is too, now that it is exact ("Width,
# exactly"), but is left out: each run it leaves queued is logged (R10), and the memo holds it
# until a promotion.
_CACHEABLE = (ALL_BUSY, NO_CANDIDATE)


@dataclass
class WakeReport:
    """What one sweep did: promoted run ids in order, and how much it looked at."""

    promoted: list[str] = field(default_factory=list)
    assigned: dict[str, dict[str, str]] = field(default_factory=dict)  # run_id → {role: node}
    classes: int = 0
    examined: int = 0
    too_wide: list[str] = field(default_factory=list)
    errors: int = 0
    matched: int = 0  # matcher calls; classes answered from the last sweep's answers are not
    remembered: int = 0  # classes whose answer came from the last sweep (§6 "Sweeps remember")
    # R17's guard's first read found no waiting class that the free nodes could serve: it
    # returned the mark alone and nothing else was read, matched or promoted.
    blocked: bool = False


# node_id → ((capabilities as text, busy, drain), capabilities): what the matcher sees of it
Snapshot = dict[str, tuple[tuple[str, bool, str], dict[str, Any]]]


def snapshot(fleet: list[FleetNode]) -> Snapshot:
    """What the matcher sees of each live node. ``repr`` keeps JSON types apart (``true`` is
    not ``1`` to the matcher, §4) where dict equality would not; a key order that differs only
    makes the node count as changed, which is safe."""
    return {n.node_id: ((repr(n.capabilities), n.busy, n.drain), n.capabilities) for n in fleet}


def changed_capabilities(old: Snapshot, new: Snapshot) -> list[dict[str, Any]]:
    """The capabilities, as they were and as they are, of every node that changed between two
    snapshots (a node that came or went counts as changed)."""
    out: list[dict[str, Any]] = []
    for node_id in old.keys() | new.keys():
        before, after = old.get(node_id), new.get(node_id)
        if (before and before[0]) != (after and after[0]):
            out.extend(seen[1] for seen in (before, after) if seen is not None)
    return out


@dataclass
class Plan:
    """What a sweep starts from (SweepMemo.plan): the classes worth walking the queue for —
    each class waiting whose answer against the fleet as read is not a refusal that holds for
    the whole sweep — with their needs and those answers."""

    needs: dict[str, dict[str, Any]]
    answers: dict[str, Assignment | Reject]
    classes: int = 0  # classes waiting, as far as this process knows (a superset: §6)
    matched: int = 0
    remembered: int = 0


class SweepMemo:
    """The waiting classes and their answers, kept from sweep to sweep (docs/design.md §6
    "Sweeps remember"). One per process, shared by its threads under one lock.

    *The classes.* A sweep's read returns only the classes whose waiting may have changed since
    this process's last read (its ``mark``); the memo applies them to the classes it holds.
    Invariant: every QUEUED run of a class missing here was queued by a transaction whose id is
    at or past the mark, so the next read finds it. A read newer than the mark (the mark never
    goes back) is applied in full and moves the mark; an older one, which a thread sweeping
    beside another can hold, only adds classes.
    So the classes held may include a few that no longer wait (a run of one would be refused by
    R8, it is never promoted twice), never miss one that waits.

    *The answers.* ``match`` is pure: a class's answer depends only on its needs, ``max_width``,
    and — of the whole fleet — only the nodes that serve one of its roles: their capabilities
    and whether they are available. So between two fleet snapshots, a class none of whose roles
    any *changed* node serves (with its old capabilities or its new ones; a node that came or
    went counts as changed) gets the same answer as before, and is not matched again; the
    changed nodes find those classes through a :class:`ClassIndex`, in time proportional to
    them. Only answers computed against the fleet as read (before the sweep's own promotions)
    are kept, each with that snapshot, so an answer is never reused against another fleet.
    Each sweep still reads the fleet itself (R9), so processes need not share anything.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.mark: int | None = None  # the last read's; None: the next read reads every class
        self._needs: dict[str, dict[str, Any]] = {}  # the waiting classes (§6: a superset)
        self._index = ClassIndex()
        self._fleet: Snapshot | None = None  # what the answers were computed against
        self._width = 0
        self._answers: dict[str, Assignment | Reject] = {}
        self._unknown: set[str] = set()  # waiting, no answer against _fleet
        self._open: set[str] = set()  # waiting, answer unknown or not in _CACHEABLE

    # ---- the classes -----------------------------------------------------------------------------
    def _add(self, key: str, needs: dict[str, Any]) -> None:
        if key not in self._needs:
            self._needs[key] = needs
            self._index.add(key, needs)
            self._unknown.add(key)
            self._open.add(key)

    def _drop(self, key: str) -> None:
        if self._needs.pop(key, None) is not None:
            self._index.remove(key)
            self._answers.pop(key, None)
            self._unknown.discard(key)
            self._open.discard(key)

    def _learn(self, first: SweepHead) -> None:
        exact = first.full or not first.queued  # every class waiting (none when none is queued)
        # A mark past the read's own ids: the database's ids went back (another database, one
        # restored from a backup), read whole by the store; it starts the marks afresh.
        rewound = first.since is not None and first.mark is not None and first.mark < first.since
        newest = first.mark is not None and (
            self.mark is None or first.mark >= self.mark or (exact and rewound)
        )
        based = exact or (first.since is not None and self.mark is not None
                          and first.since <= self.mark)  # fmt: skip
        if newest and based:
            if exact:
                waiting = {key for key, needs in first.classes if needs is not None}
                for key in [k for k in self._needs if k not in waiting]:
                    self._drop(key)
            for key, needs in first.classes:
                if needs is None:
                    self._drop(key)
                else:
                    self._add(key, needs)
            self.mark = first.mark
        else:  # an older read: it may only add (the held classes stay a superset, §6)
            for key, needs in first.classes:
                if needs is not None:
                    self._add(key, needs)

    # ---- the sweep's start ---------------------------------------------------------------------
    def plan(
        self,
        first: SweepHead,
        seen: Snapshot | None,
        index: AdvertIndex | None,
        unavailable: set[str],
        max_width: int,
    ) -> Plan:
        """Apply ``first``'s classes; then, given the fleet as read (``seen``, its ``index``;
        None: nothing is free, nothing to match), re-match the classes new since the last sweep
        and those a changed node can serve, and return the classes worth walking for."""
        with self._lock:
            self._learn(first)
            if seen is None or index is None:
                return Plan({}, {}, len(self._needs))
            if self._fleet is None or self._width != max_width:
                self._answers.clear()
                self._unknown = set(self._needs)
                self._open = set(self._needs)
            elif self._fleet is not seen:
                changed = changed_capabilities(self._fleet, seen)
                if changed:
                    for key in self._index.touched(changed) & self._needs.keys():
                        self._unknown.add(key)  # re-matched below, its answer replaced
                        self._open.add(key)
            self._fleet, self._width = seen, max_width
            for key in self._unknown:
                res = self._answers[key] = match(self._needs[key], index, unavailable, max_width)
                if isinstance(res, Reject) and res.code in _CACHEABLE:
                    self._open.discard(key)
            matched = len(self._unknown)
            self._unknown = set()
            return Plan(
                {k: self._needs[k] for k in self._open},
                {k: self._answers[k] for k in self._open},
                len(self._needs),
                matched,
                len(self._needs) - matched,
            )

    def answer(self, key: str) -> Assignment | Reject | None:
        """The answer kept for class ``key`` (None: none), for tests and tools."""
        with self._lock:
            return self._answers.get(key)


# ---- WakeQueued (docs/design.md §6, R6–R12) ------------------------------------------------------
def wake_queued(ctx: Context, first: SweepHead | None = None, guard: bool = False) -> WakeReport:
    """The promotion sweep over the queue, FIFO with skipping (timed for the observers).
    ``first``: the sweep's first read, when the caller made it after its commit (issue 13).
    ``guard``: R17's guard's sweep (see :func:`sweep`)."""
    started = time.perf_counter()
    report = sweep(ctx, first, guard)
    for observe in ctx.sweep_observers:
        observe(time.perf_counter() - started, report)
    return report


def sweep(ctx: Context, first: SweepHead | None = None, guard: bool = False) -> WakeReport:
    """The promotion sweep over the queue, FIFO with skipping.

    Safe to call again and concurrently from any number of processes (R9): the conditional
    update (R8) and the lease primary key (I1) decide every race; no hand-made locks.
    ``first``: the waiting classes, the fleet and the queue's head, read by the caller's seal
    after its commit (issue 13, ``AfterCommit``); None: the sweep reads them itself.
    ``guard``: R17's guard's sweep (False: any other wake). Its first read ends the sweep, having
    read nothing more, when no waiting class could be assigned the nodes free in its snapshot
    (docs/design.md R17 "The guard's first read": the same decisions, none made).
    """
    ttl = ctx.config.lease_ttl_seconds
    # R11: refuse before anything else rather than issue leases that never expire.
    if not isinstance(ttl, int | float) or ttl <= 0:
        raise ConfigError(
            "lease_ttl_seconds must be greater than 0 to promote queued runs (R11).",
            field="lease_ttl_seconds",
        )
    report = WakeReport()
    book = ctx.sweep_memo
    if first is None:
        with ctx.store.autocommit() as tx:  # classes, fleet and the queue's head: one statement
            first = tx.sweep_head(HEAD_PAGE, since=book.mark, guard=guard)
    if first.blocked:
        # R17 (docs/design.md, "The guard's first read"): in this read's snapshot every waiting
        # class has a role that no live, free, undrained node might meet (a superset of the
        # matcher's candidates), so every class would be refused and the sweep below, reading
        # this same snapshot, would promote nothing: stopping here decides exactly what it
        # would. Nor is the guard's run stranded (the lost wake R17 exists for): this snapshot
        # was taken after the run committed QUEUED, and any change that later gives its role a
        # node — a release (wakes 1-4), the database or a gap back (5), a drain lifted (6), a
        # node back (7, unless turned off: then the full sweep missed it too), new capabilities
        # (9) — commits after this snapshot, hence after the run, and sweeps after its own
        # commit, so that sweep reads the run. Nothing else was read, so the memo learns
        # nothing and its mark stays (the next read covers this one; §6 "Sweeps remember").
        report.blocked = True
        return report
    fleet, head = first.fleet, first.head
    adverts, busy, draining = view(fleet)
    unavailable = busy | draining
    live = {n.node_id for n in fleet}
    free = bool(first.queued and live - unavailable)
    by_id = {n.node_id: n for n in fleet}
    index = AdvertIndex(adverts) if free else None  # candidates per role computed once per sweep
    max_width = ctx.config.max_width
    # §6 "Sweeps remember": the classes and answers this process holds, brought up to date with
    # this read; a class that no node changed since the last sweep can serve keeps that sweep's
    # answer, only the others are matched (against the fleet as read, before this sweep's own
    # promotions change `unavailable`).
    plan = book.plan(first, snapshot(fleet) if free else None, index, unavailable, max_width)
    report.classes, report.matched, report.remembered = plan.classes, plan.matched, plan.remembered
    if not free or index is None:
        return report  # R13's cost argument: an empty queue costs one query
    needs = plan.needs
    failed: set[str] = set()
    memo: dict[str, Assignment | Reject] = dict(plan.answers)

    def decide(key: str) -> Assignment | Reject:
        # match() is pure: with `unavailable` unchanged its answer for a class is the same
        # for every run of the class, so compute it once per class until a promotion.
        res = memo.get(key)
        if res is None:
            res = memo[key] = match(needs[key], index, unavailable, max_width)
            report.matched += 1
            if isinstance(res, Reject) and res.code in _CACHEABLE:
                failed.add(key)  # stays true for the rest of the sweep (§6)
        return res

    viable = list(needs)
    # The first page is the queue's head, read with the classes; past a full head, pages of
    # the viable classes only, in the same (created_at, run_id) order (R6).
    walked = set(viable)
    page: list[QueuedRun] | None = [q for q in head if q.needs_key in walked]
    more = len(head) == HEAD_PAGE
    after_at: datetime | str = head[-1].created_at if head else "-infinity"
    after_id = head[-1].run_id if head else ""
    while viable and live - unavailable:
        if page is None:
            if not more:
                break  # the queue's end: a run queued since is its submitter's to sweep (R17)
            with ctx.store.autocommit() as tx:
                page = tx.queued_page(viable, after_at, after_id, HEAD_PAGE)
            more = len(page) == HEAD_PAGE
            if page:
                after_at, after_id = page[-1].created_at, page[-1].run_id
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
                    ok = promote(ctx, q.run_id, res, needs[q.needs_key], by_id)
                except NodeTaken:
                    # R9: the taken nodes join unavailable. Which ones: those now busy in
                    # the database; if none shows yet (a competitor not yet committed, or
                    # a lock timeout), every node of this assignment, conservatively.
                    nodes = set(res.roles.values())
                    with ctx.store.autocommit() as tx:
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
                    ctx.count("sweep_run")
                    break
                if ok:
                    report.promoted.append(q.run_id)
                    report.assigned[q.run_id] = dict(res.roles)
                    unavailable |= set(res.roles.values())  # R9: taken by us now
                    memo.clear()
                break  # promoted, or R8: another sweep or a cancel got there first
        page = None
        viable = [k for k in viable if k not in failed]
    return report


def promote(
    ctx: Context,
    run_id: str,
    res: Assignment,
    needs: dict[str, dict[str, Any]],
    by_id: dict[str, FleetNode],
) -> bool:
    """Move one run QUEUED → RUNNING in one statement (issue 13; R7, R12): the conditional
    update, its leases, the steps' nodes and ``chosen``, the asks due and the events.

    Returns False when the run was no longer QUEUED (R8: another sweep or a cancel got there
    first). Raises NodeTaken when a lease conflicts (R9, I1); nothing was written then.
    """
    assigned = dict(res.roles)
    leases = lease_rows(assigned, by_id)
    events = [
        {"kind": "promoted", "data": {"assigned": assigned}},
        *({"node_id": x["node_id"], "kind": "lease_granted", "data": {}} for x in leases),
    ]
    with ctx.store.autocommit() as tx:
        asks = tx.promote(
            run_id,
            assigned,
            run_acquires(assigned, needs, by_id),
            leases,
            events,
            ctx.config.lease_ttl_seconds,
        )
    if asks is None:
        return False
    ctx.after.push_asks(asks)  # R12: after the commit; a promotion settles nothing, wakes nothing
    return True
