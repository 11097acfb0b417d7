"""Time you can trust: stalls and clock jumps are given back like outages (docs/design.md §13).

Adverts and leases expire on the database's clock (``mediator_now()``). Two things can make a
live node look expired without any heartbeat being missed by the node:

* **a stall of a Mediator process** (SIGSTOP, a frozen VM, swapping): the heartbeats wait in
  its socket while the database's clock runs on; after the stall, a submit or the reaper that
  runs before the waiting adverts would see every node expired;
* **a forward jump of the database host's wall clock**: every expiry is suddenly in the past.

Both are given back to adverts and leases exactly like a database outage (``Tx.give_back``,
the same shift as the outage give-back) and recorded in the ``gaps`` table, so a gap that
several processes notice is given back once. A :class:`Timekeeper` per process notices them:

* a **ticker** thread ticks every :data:`TICK_S` on the monotonic clock; a tick that comes
  :data:`STALL_S` late means the process stood still (the monotonic clock runs on through a
  SIGSTOP). A request that could wrongly expire or refuse (submit, the reaper) first calls
  :meth:`Timekeeper.settle`, which sees the ticker's lateness itself — one clock read, no
  statement — so it never acts before the stall is given back, whichever thread runs first;
* **readings of the database's clock** that a path makes anyway (an advert returns its new
  expiry, the fleet listing reads ``observed_at``; the reaper and a submit about to refuse read
  it once more) are compared with the monotonic clock: when the database's clock ran ahead by
  more than :data:`JUMP_S` (plus a drift allowance) between two readings, that is a jump.

And a submit never refuses a run (NO_CANDIDATE, TOO_WIDE) for good while a node that could
serve it was live when a recent gap began (:func:`may_return`): the run is queued instead.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mediator.clock import monotonic as steady
from mediator.core.errors import MediatorError
from mediator.core.match import Advert, Assignment, match
from mediator.flows.wake import Wake

if TYPE_CHECKING:
    from mediator.flows.context import Context

log = logging.getLogger("mediator")

TICK_S = 0.25  # the ticker's period
STALL_S = 1.0  # a tick this late (beyond its period): the process stood still
JUMP_S = 1.0  # the database's clock ran this much ahead of the monotonic clock: a jump …
DRIFT = 0.001  # … beyond this share of the time between the two readings (clock rate error)
EXPIRED_IN_GAP = "EXPIRED_IN_GAP"  # the wait reason of a run queued by may_return


@dataclass(frozen=True)
class Gap:
    """A gap this process noticed: its kind, its length and what was given back for it."""

    kind: str  # "stall", "jump" or "outage"
    seconds: float
    given: float


def give_back(
    ctx: Context,
    kind: str,
    seconds: float,
    *,
    began: datetime | None = None,
    ended: datetime | None = None,
    minimum: float = 0.0,
) -> float:
    """Give adverts and leases back a gap once across every Mediator process (the gaps table);
    returns the seconds given now (0: nothing left to give, or below ``minimum``). The caller
    then wakes the queue as a reconnect does (wake 5), if anything was given: nodes are live
    again."""
    with ctx.store.tx() as tx:
        given = tx.give_back(
            kind,
            seconds,
            ctx.config.advert_ttl_seconds,
            ctx.config.lease_ttl_seconds,
            began=began,
            ended=ended,
            minimum=minimum,
        )
    if given > 0:
        log.warning("gave nodes back a %s of %.1f s (%.1f s given)", kind, seconds, given)
    return given


class Timekeeper:
    """Notices this process's stalls and the database clock's jumps, and gives them back.

    One give-back at a time, and a caller that must not act before a gap is given back (a
    submit, the reaper, a listing) waits for one under way: the ``_giving`` lock is held while
    a gap is given back, and while the jump baseline is read and moved.

    Args:
        ctx: the flows' context (store, configuration, after-commit).
        monotonic: the steady clock (a test passes its own).
        ticker: start the ticker thread (a test ticks by hand with :meth:`tick`).
    """

    def __init__(
        self, ctx: Context, monotonic: Callable[[], float] = steady, *, ticker: bool = True
    ) -> None:
        self.ctx = ctx
        self.monotonic = monotonic
        self._lock = threading.Lock()  # the ticker's state
        self._giving = threading.RLock()  # a give-back under way; the jump baseline
        self._last_tick = monotonic()
        # (length, monotonic instant it ended) of each stall noticed, removed once given back
        self._stalls: list[tuple[float, float]] = []
        self._seen: tuple[float, datetime] | None = None  # (monotonic, database) of a reading
        self.noticed: deque[Gap] = deque(maxlen=1000)  # the gaps this process noticed, latest
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if ticker:
            self._thread = threading.Thread(target=self._run, name="mediator-ticker", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self.read_clock()  # the first reading: what a jump is measured against
        except Exception:
            log.warning("the ticker could not read the database's clock", exc_info=True)
        while not self._stop.wait(TICK_S):
            self.tick()
            if self._stalls:
                self.settle()
                with self._lock:  # the give-back's own time is no stall
                    self._last_tick = max(self._last_tick, self.monotonic())

    # ---- stalls ----------------------------------------------------------------------------------
    def tick(self) -> None:
        """One tick: a tick more than :data:`STALL_S` late records a stall as long as the time
        since the last tick."""
        now = self.monotonic()
        with self._lock:
            late = now - self._last_tick - TICK_S
            if now > self._last_tick:
                self._last_tick = now
            if late >= STALL_S:
                self._stalls.append((late + TICK_S, now))

    def stalled(self) -> bool:
        """A stall is waiting to be given back, or being given back (one clock read: every
        submit asks)."""
        return bool(self._stalls) or self.monotonic() - self._last_tick - TICK_S >= STALL_S

    def settle(self) -> float:
        """Give back a stall that just ended before anything is expired or refused because of it
        (docs/design.md §13); wait for one being given back by another thread. Cheap when
        there was none. Returns the seconds given back."""
        if not self.stalled():
            return 0.0
        given = 0.0
        with self._giving:
            self.tick()
            with self._lock:
                stalls = list(self._stalls)
            kept = []
            for seconds, ended in stalls:
                # A give-back that comes late (tried again) gives the wait too: heartbeats could
                # not land meanwhile either (capped at one TTL from now, like every give-back).
                late = max(0.0, self.monotonic() - ended)
                got = self._give("stall", seconds + late, minimum=STALL_S)
                if got is None and not self.ctx.store.down:
                    # The database answered but the give-back did not commit (a lock wait, a
                    # deadlock, a pool busy for its whole wait): kept, and tried again at the next
                    # tick — lost, it would let the reaper take live nodes' runs (docs/design.md
                    # §13). With an outage known, the outage began at the last statement that
                    # reached the database, before this stall, and its give-back covers it.
                    # After one advert TTL every live node has advertised since (adverts renew
                    # leases too): nothing is left to protect, and the reaper must not wait on.
                    if late < self.ctx.config.advert_ttl_seconds:
                        kept.append((seconds, ended))
                    else:
                        log.error("gave up giving back a stall of %.1f s", seconds)
                given += got or 0.0
            with self._lock:
                self._stalls[: len(stalls)] = kept
        self._woken(given)
        return given

    def pending_s(self) -> float | None:
        """How long ago the earliest stall not given back yet began (None: none is pending):
        what a submit about to refuse counts as an open gap, and why the reaper waits."""
        with self._lock:
            if not self._stalls:
                return None
            seconds, ended = self._stalls[0]
        return max(0.0, self.monotonic() - ended) + seconds

    # ---- jumps -----------------------------------------------------------------------------------
    def observe(self, db_now: datetime, mono: float) -> float:
        """A reading of the database's clock, ``db_now``, made by a statement that started after
        the monotonic instant ``mono``. If the database's clock ran ahead of the monotonic one
        since the last reading, the difference is a jump: given back before this returns.
        Returns the seconds given back (0 almost always)."""
        with self._giving:
            prev = self._seen
            if prev is not None and mono <= prev[0]:
                return 0.0  # an older reading than the one kept (threads finish out of order)
            self._seen = (mono, db_now)
            if prev is None:
                return 0.0
            elapsed = mono - prev[0]
            ahead = (db_now - prev[1]).total_seconds() - elapsed
            if ahead < JUMP_S + DRIFT * elapsed:
                return 0.0  # a backward jump only makes nodes live longer: nothing to give back
            given = self._give("jump", ahead, began=prev[1], ended=db_now, minimum=JUMP_S)
            if given is None:
                self._seen = prev  # not given: the next reading sees the jump again
                return 0.0
        self._woken(given)
        return given

    def read_clock(self) -> float:
        """Read the database's clock now and :meth:`observe` it: one statement (the reaper's
        and a refusing submit's; adverts and listings read it anyway)."""
        with self.ctx.store.autocommit() as tx:
            mono = self.monotonic()  # with a connection, just before the statement
            db_now = tx.observed_at()
        return self.observe(db_now, mono)

    # ---- both ------------------------------------------------------------------------------------
    def _give(self, kind: str, seconds: float, **kw: Any) -> float | None:
        """The seconds given back; None when the database could not be reached."""
        try:
            given = give_back(self.ctx, kind, seconds, **kw)
        except MediatorError:
            log.warning("could not give back a %s of %.1f s", kind, seconds)
            return None
        self.noticed.append(Gap(kind, seconds, given))
        return given

    def _woken(self, given: float) -> None:
        if given > 0:
            self.ctx.after(wake=Wake.RECONNECT)  # nodes are live again: as after an outage

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)


def settle(ctx: Context) -> None:
    """Before a path that could expire or refuse: give back a stall that just ended."""
    if ctx.timekeeper is not None:
        ctx.timekeeper.settle()


def may_return(ctx: Context, needs: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Submit's last look before refusing a run for good (docs/design.md §13): a stall or jump
    not given back yet is given back now; then, within one advert TTL after a gap ended, if the
    nodes that were live when it began (live now, or expired since) could serve the run, the run
    is queued, not refused. Returns the wait reason to queue with, or None to refuse.
    Two statements, on the refusing path only."""
    tk = ctx.timekeeper
    pending = None
    if tk is not None:
        tk.settle()
        tk.read_clock()
        pending = tk.pending_s()  # a stall whose give-back failed is a gap too
    open_s = ctx.store.open_outage_s()  # an outage not given back yet is a gap too
    if pending is not None:
        open_s = max(open_s or 0.0, pending)
    with ctx.store.autocommit() as tx:
        nodes = tx.gap_fleet(ctx.config.advert_ttl_seconds, open_s)
    if not nodes:
        return None
    adverts = [Advert(node_id, caps) for node_id, caps, _ in nodes]
    res = match(needs, adverts, set(), ctx.config.max_width)
    if not isinstance(res, Assignment):
        return None
    expired = sorted(set(res.roles.values()) & {n for n, _, gone in nodes if gone})
    return {
        "code": EXPIRED_IN_GAP,
        "candidates": expired,
        "message": (
            "Nodes able to serve this run were live when a stall of the Mediator, a jump of "
            "the database's clock or a database outage began; the run waits for them to "
            "advertise again."
        ),
    }
