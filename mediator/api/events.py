"""``GET /v1/events``: Server-Sent Events fed by PostgreSQL NOTIFY (docs/design.md §19 route 14).

Every commit that inserts into ``events`` NOTIFYs ``mediator_events`` (a statement trigger), and
NOTIFY is delivered on commit only — so subscribers of every Mediator process hear of every
committed change and never of a rolled-back one (PushAsks, R12).

Rows are read in (tx, id) order — ``tx`` is the inserting transaction's id — after the place a
stream has reached, and only from transactions older than the reading snapshot's xmin: those have
all ended, so nothing can still appear behind a stream's place. Reading in id order skipped an
event whose transaction took a smaller id but committed after a bigger one had been sent (issue 13
§6). Frames still carry the event ``id``; ``Last-Event-ID`` resumes at that event's place. The
transaction id is compared as the number it is (xid8), never as text: text order put 10000 before
9999, pages came back out of order, streams skipped events and re-sent others endlessly (issue 24).

A stream's place only moves forward: the buffer keeps rows in strictly increasing (tx, id) order and
a stream sends a frame only if its place is after the last one it sent. So every frame reaches a
stream at most once, whatever order a read returns — a read out of order would lose rows rather than
re-send them without bound, and is counted (``mediator_event_rows_out_of_order``: zero unless the
order itself is broken).

Why it is shaped this way (issue 11 §2, docs/security.md "Event streams"): a stream is idle for
hours — an open panel tab — so it must cost no thread. A stream is an async generator on the event
loop; the process has **one** LISTEN connection (a dedicated thread, not a thread-pool slot) and
**one** pump task that reads new rows once per wake-up for every stream and keeps them in a shared
buffer; a stream only copies frames out of that buffer. A stream that replays older history
(``Last-Event-ID``) reads the table itself, a page at a time, until it reaches the buffer. Each
stream sends a ``: keepalive`` comment when it has sent nothing for ``keepalive_s`` seconds, so a
client that vanished is noticed at the latest by that write. The number of open streams is capped
in total and per principal (:class:`StreamsFull` → 503 with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from mediator.core.errors import MediatorError
from mediator.core.rows import Event

if TYPE_CHECKING:
    from mediator.flows import Mediator

log = logging.getLogger("mediator.events")

Place = tuple[int, int]  # (inserting transaction's id, event id): the order streams read in

CHANNEL = "mediator_events"
KEEPALIVE_S = 15.0  # the default; Config.events_keepalive_seconds
MAX_STREAMS = 512  # the defaults of Config.events_max_streams / _per_principal
MAX_STREAMS_PER_PRINCIPAL = 64
RETRY_AFTER_S = 10  # what a refused client is told to wait (seconds)
# How often the pump re-reads while streams are open even without a NOTIFY: a row held back by
# the xmin horizon (an older transaction still open) becomes deliverable without one.
HORIZON_S = 1.0
PAGE = 500  # rows per read
BUFFER = 2000  # frames kept for streams that are a little behind
LISTEN_TIMEOUT_S = 5.0  # the listener checks stop this often (its connection is kept)


class StreamsFull(Exception):
    """Too many open streams (in total or for this principal): answer 503 with Retry-After."""

    def __init__(self, message: str, retry_after: int = RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class Ticket:
    """One admitted stream's place under the caps; released exactly once (or when collected,
    should a response never start streaming)."""

    def __init__(self, feed: EventFeed, principal: str) -> None:
        self._feed = feed
        self.principal = principal
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._feed._release(self.principal)

    def __del__(self) -> None:
        self.release()


class EventFeed:
    """Fan-out of committed ``events`` rows to any number of SSE streams (see the module doc)."""

    def __init__(
        self,
        med: Mediator,
        keepalive_s: float = KEEPALIVE_S,
        max_streams: int = MAX_STREAMS,
        max_per_principal: int = MAX_STREAMS_PER_PRINCIPAL,
        horizon_s: float = HORIZON_S,
    ) -> None:
        self.med = med
        self.keepalive_s = keepalive_s
        self.max_streams = max_streams
        self.max_per_principal = max_per_principal
        self.horizon_s = horizon_s
        self._lock = threading.RLock()  # admission counts (a Ticket's __del__ may run anywhere)
        self._by_principal: dict[str, int] = {}
        self._open = 0
        # Told the number of open streams at every change (the /metrics gauge; under the lock,
        # so the last value it hears is the current one).
        self.on_open_streams: Callable[[int], None] | None = None
        # Told how many rows a read returned out of (tx, id) order and were dropped (the /metrics
        # counter mediator_event_rows_out_of_order; never non-zero while the order holds).
        self.on_out_of_order: Callable[[int], None] | None = None
        # Set once the first stream starts, on that stream's event loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None  # the listener's NOTIFY, or stop()
        self._changed: asyncio.Event | None = None  # replaced at every change; waiters hold one
        self._pump_task: asyncio.Task[None] | None = None
        self._listener: threading.Thread | None = None  # the LISTEN thread, once started
        self.listener_error: str | None = None  # why the listener's last attempt failed
        self._stopping = threading.Event()
        # Called on the event loop at every NOTIFY, when the listener (re)starts listening (a
        # NOTIFY may have gone unheard before) and at stop(): the work polls' wake
        # (mediator.api.waits, docs/design.md §19 "The wake of a waiting node").
        self._subscribers: list[Callable[[], None]] = []
        # The shared buffer: places (tx, id) and frames of rows after ``_floor`` (None: not read).
        self._floor: Place | None = None
        self._ids: list[Place] = []
        self._frames: list[bytes] = []

    # ---- admission (issue 11 §2: every resource a client can hold has a limit) ------------------
    @property
    def open_streams(self) -> int:
        return self._open

    def admit(self, principal: str) -> Ticket:
        """A place for one more stream of ``principal``, or :class:`StreamsFull`."""
        with self._lock:
            if self._stopping.is_set():
                raise StreamsFull("The server is shutting down; reconnect to another.")
            if self._open >= self.max_streams:
                raise StreamsFull(
                    f"This server holds its limit of {self.max_streams} event streams; "
                    f"retry after {RETRY_AFTER_S} s."
                )
            mine = self._by_principal.get(principal, 0)
            if mine >= self.max_per_principal:
                raise StreamsFull(
                    f"This principal holds its limit of {self.max_per_principal} event streams; "
                    f"close one or retry after {RETRY_AFTER_S} s."
                )
            self._open += 1
            self._by_principal[principal] = mine + 1
            if self.on_open_streams is not None:
                self.on_open_streams(self._open)
        return Ticket(self, principal)

    def _release(self, principal: str) -> None:
        with self._lock:
            self._open -= 1
            if self.on_open_streams is not None:
                self.on_open_streams(self._open)
            left = self._by_principal.get(principal, 1) - 1
            if left > 0:
                self._by_principal[principal] = left
            else:
                self._by_principal.pop(principal, None)

    # ---- lifecycle ---------------------------------------------------------------------------
    def stop(self) -> None:
        """End every stream and the pump (server shutdown). Safe from any thread."""
        self._stopping.set()
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                loop.call_soon_threadsafe(self._on_stop)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the event loop at every change heard (see ``_subscribers``)."""
        self._subscribers.append(callback)

    def _on_stop(self) -> None:
        if self._wake is not None:
            self._wake.set()
        self._notify_changed()
        self._tell_subscribers()

    def _tell_subscribers(self) -> None:
        for callback in self._subscribers:
            try:
                callback()
            except Exception:  # one subscriber's fault must not deafen the others
                log.exception("an event subscriber failed")

    def _ensure_started(self) -> None:
        """Start the pump task once, on the calling event loop, and the listener thread — again
        if it has ended (issue 25 §4: each admitted stream pokes it)."""
        if self._pump_task is None:
            self._bind_loop()
            assert self._loop is not None
            self._pump_task = self._loop.create_task(self._pump(), name="mediator-events-pump")
        self.ensure_listening()

    def _bind_loop(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._wake = asyncio.Event()
            self._changed = asyncio.Event()

    def ensure_listening(self) -> None:
        """Start the listener thread (again, if it has ended) without the pump: a held work poll
        needs to hear of changes, not to read the events (mediator.api.waits)."""
        self._bind_loop()
        listener = self._listener
        if (listener is None or not listener.is_alive()) and not self._stopping.is_set():
            assert self._loop is not None
            if listener is not None:
                log.error("the event listener had ended; starting it again")
            self._listener = threading.Thread(
                target=self._listen, args=(self._loop,), name="mediator-listen", daemon=True
            )
            self._listener.start()

    @property
    def listener_state(self) -> str:
        """``idle`` (no stream yet), ``ok``, ``failing`` (retrying with backoff) or ``dead``
        (the thread ended; the next stream starts it again): ``/healthz`` shows it."""
        listener = self._listener
        if listener is None or self._stopping.is_set():
            return "idle"
        if not listener.is_alive():
            return "dead"
        return "failing" if self.listener_error else "ok"

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """The one LISTEN connection of this process: each NOTIFY wakes the pump. Any failure
        — the database gone, EMFILE inside the driver's connect — is logged and retried with
        backoff; only the event loop closing (the server gone) ends it (issue 25 §4)."""
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                for heard in self.med.store.notifications(CHANNEL, timeout=LISTEN_TIMEOUT_S):
                    backoff, self.listener_error = 0.5, None
                    if self._stopping.is_set():
                        break
                    if heard:
                        loop.call_soon_threadsafe(self._poke)
                backoff, self.listener_error = 0.5, None
            except RuntimeError:
                if loop.is_closed():
                    return  # the event loop is closed: the server is gone
                self._listen_failed(RuntimeError("unexpected"), backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception as exc:
                self._listen_failed(exc, backoff)
                backoff = min(backoff * 2, 10.0)

    def _listen_failed(self, exc: Exception, backoff: float) -> None:
        first = self.listener_error is None
        self.listener_error = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"
        if first or backoff >= 10.0:  # one line when it starts failing, then one per ~10 s
            log.warning(
                "event listener failed (%s); retrying in %.1fs", self.listener_error, backoff
            )
        self._stopping.wait(backoff)

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()
        self._tell_subscribers()

    def _notify_changed(self) -> None:
        old, self._changed = self._changed, asyncio.Event()
        if old is not None:
            old.set()

    async def _pump(self) -> None:
        """Read new rows once per wake-up (NOTIFY, or every ``horizon_s`` while streams are open)
        into the shared buffer, and wake the streams if there were any."""
        assert self._wake is not None
        while not self._stopping.is_set():
            try:
                if self._floor is None:
                    self._floor = await _in_thread(self._place, None)
                rows = await _in_thread(self._read, self._ids[-1] if self._ids else self._floor)
            except MediatorError:
                rows = []  # the database is away; the next wake-up tries again
            full = len(rows) == PAGE
            rows = self._forward(rows, self._ids[-1] if self._ids else self._floor)
            if rows:
                for row in rows:
                    self._ids.append(row[0])
                    self._frames.append(row[1])
                if len(self._ids) > 2 * BUFFER:
                    cut = len(self._ids) - BUFFER
                    self._floor = self._ids[cut - 1]
                    del self._ids[:cut], self._frames[:cut]
                self._notify_changed()
            if full:
                continue  # more are waiting
            timeout = self.horizon_s if self._open else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()

    # ---- reading -----------------------------------------------------------------------------
    def _place(self, event_id: int | None) -> Place:
        """Where a stream starts: after event ``event_id``, or from now on (None)."""
        if event_id == 0:
            return (0, 0)  # from the very first event
        with self.med.store.tx() as tx:
            return tx.event_position(event_id)

    def _read(self, after: Place) -> list[tuple[Place, bytes]]:
        with self.med.store.tx() as tx:
            rows = tx.events_since(after[0], after[1], PAGE)
        return [((place, row.id), _frame(row)) for place, row in rows]

    def _forward(
        self, rows: list[tuple[Place, bytes]], last: Place | None
    ) -> list[tuple[Place, bytes]]:
        """The rows whose place is after ``last`` and after every row before them: places only
        move forward, so nothing is sent twice (issue 24). Any other row is dropped and counted."""
        out: list[tuple[Place, bytes]] = []
        for row in rows:
            if last is None or row[0] > last:
                out.append(row)
                last = row[0]
        if len(out) < len(rows) and self.on_out_of_order is not None:
            self.on_out_of_order(len(rows) - len(out))
        return out

    def _buffered_after(self, last: Place) -> list[tuple[Place, bytes]] | None:
        """Frames after ``last`` from the shared buffer; None if it does not reach back that far."""
        if self._floor is None or last < self._floor:
            return None
        i = bisect.bisect_right(self._ids, last)
        return list(zip(self._ids[i:], self._frames[i:], strict=True))

    async def stream(
        self, ticket: Ticket, after: int | None, limit: int | None = None
    ) -> AsyncIterator[bytes]:
        """SSE frames from event id ``after`` (None: from now on); ``limit`` ends the stream after
        that many events (for scripts and tests). Releases ``ticket`` when it ends, however."""
        try:
            self._ensure_started()
            last = await _in_thread(self._place, after)
            sent = 0
            yield b": connected\n\n"
            quiet_since = time.monotonic()
            while not self._stopping.is_set():
                assert self._changed is not None
                changed = self._changed  # taken before reading, so no change is missed
                rows = self._buffered_after(last)
                if rows is None:  # behind the buffer: read the table ourselves (one page)
                    try:
                        rows = await _in_thread(self._read, last)
                    except MediatorError:
                        rows = []
                rows = self._forward(rows, last)  # a place is sent once, in order
                for place, frame in rows:
                    last = place
                    yield frame
                    sent += 1
                    if limit is not None and sent >= limit:
                        return
                if rows:
                    quiet_since = time.monotonic()
                    continue
                left = self.keepalive_s - (time.monotonic() - quiet_since)
                if left <= 0:
                    yield b": keepalive\n\n"  # a vanished client fails this write
                    quiet_since = time.monotonic()
                    continue
                # Replaying or not, wait for the pump: it re-reads every horizon_s for all
                # streams, so a replaying stream needs no polling of its own (it reads again
                # after the next change, or at the keepalive).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), left)
        finally:
            ticket.release()


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """A short database read off the event loop (it holds a worker thread only while it runs)."""
    return await anyio.to_thread.run_sync(fn, *args)


def _frame(row: Event) -> bytes:
    data = row.to_dict()  # `at` in ISO 8601
    return f"id: {row.id}\nevent: {row.kind}\ndata: {json.dumps(data)}\n\n".encode()
