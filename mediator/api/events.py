"""``GET /v1/events``: Server-Sent Events fed by PostgreSQL NOTIFY (docs/design.md §19 route 14).

Every commit that inserts into ``events`` NOTIFYs ``mediator_events`` (a statement trigger), and
NOTIFY is delivered on commit only — so subscribers of every Mediator process hear of every
committed change and never of a rolled-back one (PushAsks, R12). One listener thread per process
wakes the streams; each stream then reads the ``events`` table after its last id, keeping only
rows older than the snapshot's xmin, so an id that commits late is delivered, not skipped.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from mediator.errors import MediatorError

if TYPE_CHECKING:
    from mediator.flows import Mediator

log = logging.getLogger("mediator.events")

KEEPALIVE_S = 15.0


class EventFeed:
    """Fan-out of NOTIFY wake-ups to any number of SSE streams."""

    def __init__(self, med: Mediator, keepalive_s: float = KEEPALIVE_S) -> None:
        self.med = med
        self.keepalive_s = keepalive_s
        self._cond = threading.Condition()
        self._generation = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure_listener(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._listen, name="mediator-listen", daemon=True
                )
                self._thread.start()

    def _listen(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                for _ in self.med.store.notifications("mediator_events", timeout=1.0):
                    self._bump()
                    backoff = 0.5
                # A timeout: wake streams anyway so they re-check the xmin horizon.
                self._bump()
            except MediatorError:
                log.warning("event listener lost the database; retrying in %.1fs", backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _bump(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def stop(self) -> None:
        self._stop.set()
        self._bump()

    def stream(self, after: int | None, limit: int | None = None) -> Iterator[bytes]:
        """SSE frames from event id ``after`` (None: from now on); ``limit`` ends the stream after
        that many events (for scripts and tests)."""
        self._ensure_listener()
        with self.med.store.tx() as tx:
            last = tx.last_event_id() if after is None else after
        sent = 0
        yield b": connected\n\n"
        while not self._stop.is_set():
            with self._cond:
                seen = self._generation
            with self.med.store.tx() as tx:
                rows = tx.events_since(last)
            for row in rows:
                last = row["id"]
                data = {**row, "at": row["at"].isoformat()}
                frame = f"id: {row['id']}\nevent: {row['kind']}\ndata: {json.dumps(data)}\n\n"
                yield frame.encode()
                sent += 1
                if limit is not None and sent >= limit:
                    return
            if rows:
                continue
            with self._cond:
                if self._generation == seen:
                    woke = self._cond.wait(self.keepalive_s)
                    if not woke:
                        yield b": keepalive\n\n"
