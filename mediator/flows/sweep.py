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
    Advert,
    AdvertIndex,
    Assignment,
    Reject,
    match,
    need_signature,
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


# node_id → ((capabilities as text, busy, drain), capabilities): what the matcher sees of it
Snapshot = dict[str, tuple[tuple[str, bool, str], dict[str, Any]]]


def snapshot(fleet: list[FleetNode]) -> Snapshot:
    """What the matcher sees of each live node. ``repr`` keeps JSON types apart (``true`` is
    not ``1`` to the matcher, §4) where dict equality would not; a key order that differs only
    makes the node count as changed, which is safe."""
    return {n.node_id: ((repr(n.capabilities), n.busy, n.drain), n.capabilities) for n in fleet}


class SweepMemo:
    """The answers of the last sweep, kept for the next (docs/design.md §6 "Sweeps remember").

    ``match`` is pure: a class's answer depends only on its needs, ``max_width``, and — of the
    whole fleet — only the nodes that serve one of its roles: their capabilities and whether
    they are available. So between two fleet snapshots, a class none of whose roles any
    *changed* node serves (with its old capabilities or its new ones; a node that came or went
    counts as changed) gets the same answer as before, and is not matched again. A release of
    nodes S thus re-matches only the classes some node of S serves; wakes 5/6/7/9 (a node back,
    a drain lifted, new capabilities) change the nodes they name the same way. Only answers
    computed against the snapshot as read (before the sweep's own promotions) are kept, and
    each is kept with that snapshot, so an answer is never reused against another fleet.

    One per process, shared by its threads; each sweep still reads the fleet itself (R9), so
    processes need not share it. Only Rejects are kept: a promotable class is promoted.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fleet: Snapshot | None = None
        self._width = 0
        self._answers: dict[str, Reject] = {}
        # needs_key → its roles' distinct needs, as (signatures, one need per signature): a
        # class's needs never change, and a flood's thousands of classes share few role needs.
        self._roles: dict[str, tuple[frozenset[Any], ...]] = {}
        self._need_of: dict[frozenset[Any], dict[str, Any]] = {}

    def _signatures(self, key: str, needs: dict[str, dict[str, Any]]) -> tuple[frozenset[Any], ...]:
        sigs = self._roles.get(key)
        if sigs is None:
            out = []
            for need in needs.values():
                sig = need_signature(need)
                self._need_of.setdefault(sig, need)
                out.append(sig)
            sigs = self._roles[key] = tuple(out)
        return sigs

    def recall(
        self, fleet: Snapshot, needs: dict[str, dict[str, dict[str, Any]]], max_width: int
    ) -> dict[str, Reject]:
        """The kept answers that still hold for ``fleet``, for the classes in ``needs``."""
        with self._lock:
            old, answers = self._fleet, self._answers
            if old is None or self._width != max_width:
                return {}
        kept = {k: r for k, r in answers.items() if k in needs}
        changed: list[Advert] = []
        for node_id in old.keys() | fleet.keys():
            before, after = old.get(node_id), fleet.get(node_id)
            if (before and before[0]) != (after and after[0]):
                for tag, seen in (("old", before), ("new", after)):
                    if seen is not None:
                        changed.append(Advert(f"{node_id}\0{tag}", seen[1]))
        if not changed or not kept:
            return kept
        touched = AdvertIndex(changed)
        if len(self._roles) > 200_000:  # bounded: forget and rebuild (before any lookup)
            self._roles, self._need_of = {}, {}
        try:
            sigs = {k: self._signatures(k, needs[k]) for k in kept}
        except TypeError:  # a need value that is not hashable: check each class directly
            return {
                k: r
                for k, r in kept.items()
                if not any(touched.serves_any(need) for need in needs[k].values())
            }
        distinct = {sig for roles in sigs.values() for sig in roles}
        need_of = self._need_of
        # A signature another thread just forgot counts as touched: matching again is exact.
        hit = {sig for sig in distinct if sig not in need_of or touched.serves_any(need_of[sig])}
        return {k: r for k, r in kept.items() if hit.isdisjoint(sigs[k])}

    def keep(self, fleet: Snapshot, answers: dict[str, Reject], max_width: int) -> None:
        """Keep ``answers``, each computed against ``fleet`` as read."""
        with self._lock:
            self._fleet, self._answers, self._width = fleet, answers, max_width


# ---- WakeQueued (docs/design.md §6, R6–R12) ------------------------------------------------------
def wake_queued(ctx: Context, first: SweepHead | None = None) -> WakeReport:
    """The promotion sweep over the queue, FIFO with skipping (timed for the observers).
    ``first``: the sweep's first read, when the caller made it after its commit (issue 13)."""
    started = time.perf_counter()
    report = sweep(ctx, first)
    for observe in ctx.sweep_observers:
        observe(time.perf_counter() - started, report)
    return report


def sweep(ctx: Context, first: SweepHead | None = None) -> WakeReport:
    """The promotion sweep over the queue, FIFO with skipping.

    Safe to call again and concurrently from any number of processes (R9): the conditional
    update (R8) and the lease primary key (I1) decide every race; no hand-made locks.
    ``first``: the waiting classes, the fleet and the queue's head, read by the caller's seal
    after its commit (issue 13, ``AfterCommit``); None: the sweep reads them itself.
    """
    ttl = ctx.config.lease_ttl_seconds
    # R11: refuse before anything else rather than issue leases that never expire.
    if not isinstance(ttl, int | float) or ttl <= 0:
        raise ConfigError(
            "lease_ttl_seconds must be greater than 0 to promote queued runs (R11).",
            field="lease_ttl_seconds",
        )
    report = WakeReport()
    if first is None:
        with ctx.store.autocommit() as tx:  # classes, fleet and the queue's head: one statement
            first = tx.sweep_head(HEAD_PAGE)
    classes, fleet, head = first
    if not classes:
        return report  # R13's cost argument: an empty queue costs one query
    report.classes = len(classes)
    adverts, busy, draining = view(fleet)
    unavailable = busy | draining
    live = {n.node_id for n in fleet}
    if not live - unavailable:
        return report
    by_id = {n.node_id: n for n in fleet}
    index = AdvertIndex(adverts)  # candidates per role computed once per sweep
    needs = {c.needs_key: c.needs for c in classes}
    max_width = ctx.config.max_width
    failed: set[str] = set()
    memo: dict[str, Assignment | Reject] = {}

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

    # §6 "Sweeps remember": a class that no node changed since the last sweep can serve keeps
    # that sweep's answer; only the others are matched. Kept: the answers against the fleet
    # as read, before this sweep's own promotions change `unavailable`.
    seen = snapshot(fleet)
    remembered = ctx.sweep_memo.recall(seen, needs, max_width)
    report.remembered = len(remembered)
    for key, kept in remembered.items():
        memo[key] = kept
        if kept.code in _CACHEABLE:
            failed.add(key)
    for key in needs:
        decide(key)
    ctx.sweep_memo.keep(seen, {k: r for k, r in memo.items() if isinstance(r, Reject)}, max_width)
    viable = [k for k in needs if k not in failed]
    # The first page is the queue's head, read with the classes; past a full head, pages of
    # the viable classes only, in the same (created_at, run_id) order (R6).
    page: list[QueuedRun] | None = [q for q in head if q.needs_key in set(viable)]
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
