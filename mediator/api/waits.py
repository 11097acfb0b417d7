"""Held work polls: ``GET /v1/nodes/{node_id}/work?wait=S`` (docs/design.md §19 "The wake of a
waiting node", docs/security.md "Held work polls").

An idle node used to ask for work every second; now it asks once and the server holds the answer
while the node has nothing to claim, for at most ``S`` seconds (capped at
``work_wait_max_seconds``), and answers as soon as the node may have a step. The answer is always
the plain poll's — the node's claimable steps, read again when the hold ends — so nothing depends
on the wake arriving: a lost one costs at most the wait.

How the wake reaches a held poll, in every worker process: each process already LISTENs for the
NOTIFY that every commit inserting an ``events`` row sends (:class:`mediator.api.events.EventFeed`,
one listener thread per process); every change that can give a node a step (a run started or
promoted, a lease granted, a step's ``after`` passing, a retry) inserts an event in the same
transaction. On each NOTIFY the process runs **one** statement for all its held polls — which of
their nodes have a claimable step now (``nodes_with_work``) — and answers those polls. Nothing
else runs while nothing happens: no timer, no per-poll read.

The check-then-wait race: a poll registers its node *before* it reads the node's work. A change
committed after that read sends a NOTIFY that the check then answers; one committed before it is
in the read. The listener also reports each (re)start of listening as a change, since a NOTIFY may
have gone unheard meanwhile.

Every held poll counts against a cap, in total and per principal (as event streams do). Past a
cap, or while the server stops, a poll is answered at once — the plain poll, never a refusal —
with ``X-Mediator-Wait: 0``, so the node falls back to polling at its own pace. A client that
disconnects frees its place at once; the server's stop answers every held poll at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from mediator.core.errors import MediatorError

if TYPE_CHECKING:
    from mediator.api.events import EventFeed
    from mediator.flows import Mediator

log = logging.getLogger("mediator.waits")

WAIT_HEADER = "X-Mediator-Wait"  # how long the server would hold this poll (seconds; 0: not held)
# How a poll with a wait was answered (mediator_work_polls_total{answer}): not held (no place, or
# stopping), ready (work at once), woken (a wake found work), waited (the wait ended), gone (the
# client left), stopped (the server stops).
ANSWERS = ("not_held", "ready", "woken", "waited", "gone", "stopped")

Read = Callable[[], list[dict[str, Any]]]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class WorkWaits:
    """The held work polls of one process (see the module doc)."""

    def __init__(
        self,
        med: Mediator,
        feed: EventFeed,
        *,
        max_wait_s: float,
        max_held: int,
        max_per_principal: int,
    ) -> None:
        self.med = med
        self.feed = feed
        self.max_wait_s = max_wait_s
        self.max_held = max_held
        self.max_per_principal = max_per_principal
        # node_id → the wake events of the polls held for it. Touched on the event loop only.
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._held = 0
        self._by_principal: dict[str, int] = {}
        self._dirty = False  # a change was heard since the running check took its node list
        self._checking: asyncio.Task[None] | None = None
        # Told the number of held polls at every change (the /metrics gauge), and how each
        # poll with a wait was answered (ANSWERS; the /metrics counter).
        self.on_held: Callable[[int], None] | None = None
        self.on_answer: Callable[[str], None] | None = None
        self.heard = 0  # changes heard (tests: the check-then-wait interleaving)
        # Tests: awaited between a held poll's first read and its wait (the check-then-wait race).
        self.after_read: Callable[[str], Awaitable[None]] | None = None
        feed.subscribe(self._on_change)

    @property
    def held(self) -> int:
        return self._held

    # ---- admission -------------------------------------------------------------------------------
    def _admit(self, principal: str, wanted: float) -> float:
        """The seconds this poll may be held: 0 when it asked for none, past a cap, or while the
        server stops (then it is the plain poll)."""
        granted = min(wanted, self.max_wait_s)
        if granted <= 0 or self.feed.stopping:
            return 0.0
        mine = self._by_principal.get(principal, 0)
        if self._held >= self.max_held or mine >= self.max_per_principal:
            return 0.0
        self._held += 1
        self._by_principal[principal] = mine + 1
        self._tell_held()
        return granted

    def _release(self, principal: str) -> None:
        self._held -= 1
        left = self._by_principal.get(principal, 1) - 1
        if left > 0:
            self._by_principal[principal] = left
        else:
            self._by_principal.pop(principal, None)
        self._tell_held()

    def _tell_held(self) -> None:
        if self.on_held is not None:
            self.on_held(self._held)

    # ---- the poll --------------------------------------------------------------------------------
    async def poll(
        self, node_id: str, principal: str, wanted: float, read: Read, receive: Receive
    ) -> tuple[list[dict[str, Any]], float]:
        """The node's claimable steps (``read()``), held up to ``wanted`` seconds (capped) while
        there are none; and the seconds granted (0: answered at once)."""
        granted = self._admit(principal, wanted)
        if not granted:
            steps = await _in_thread(read)
            self._answered("not_held")
            return steps, 0.0
        woken = asyncio.Event()
        try:
            # Registered before the read: a change committed after it wakes this poll.
            self._waiters.setdefault(node_id, set()).add(woken)
            self.feed.ensure_listening()
            steps = await _in_thread(read)
            if steps:
                self._answered("ready")
                return steps, granted
            if self.after_read is not None:
                await self.after_read(node_id)
            steps, how = await self._hold(woken, granted, read, receive)
            self._answered(how)
            return steps, granted
        finally:
            mine = self._waiters.get(node_id)
            if mine is not None:
                mine.discard(woken)
                if not mine:
                    del self._waiters[node_id]
            self._release(principal)

    def _answered(self, how: str) -> None:
        if self.on_answer is not None:
            self.on_answer(how)

    async def _hold(
        self, woken: asyncio.Event, seconds: float, read: Read, receive: Receive
    ) -> tuple[list[dict[str, Any]], str]:
        """Wait for a wake, the client leaving, the server stopping or the end; the steps and
        which of these ended the hold (ANSWERS)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            while True:
                left = deadline - loop.time()
                if left > 0 and not self.feed.stopping:
                    waiting = asyncio.ensure_future(woken.wait())
                    done, _ = await asyncio.wait(
                        {waiting, gone}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                    )
                    waiting.cancel()
                    if gone in done:
                        return [], "gone"  # nobody to answer: the place is freed now
                if self.feed.stopping:
                    return [], "stopped"  # answer at once; the node asks another server
                was_woken = woken.is_set()
                woken.clear()
                steps: list[dict[str, Any]] = await _in_thread(read)  # the plain answer
                if steps or not was_woken or loop.time() >= deadline:
                    return steps, "woken" if was_woken and steps else "waited"
                # Woken, but nothing to claim (another poll of the node took it): wait on.
        finally:
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await gone

    # ---- the wake --------------------------------------------------------------------------------
    def _on_change(self) -> None:
        """A commit inserted events (or the listener restarted, or the server stops)."""
        self.heard += 1
        if self.feed.stopping:
            for events in self._waiters.values():
                for event in events:
                    event.set()
            return
        if not self._waiters:
            return
        self._dirty = True
        if self._checking is None or self._checking.done():
            self._checking = asyncio.get_running_loop().create_task(
                self._check(), name="mediator-work-wake"
            )

    async def settled(self) -> None:
        """Return once no wake check is running (tests: the check-then-wait interleaving)."""
        while self._checking is not None and not self._checking.done():
            await asyncio.shield(self._checking)

    async def _check(self) -> None:
        """One ``nodes_with_work`` read per burst of changes, for every held poll."""
        while self._dirty:
            self._dirty = False
            nodes = sorted(self._waiters)
            if not nodes:
                return
            try:
                ready = await _in_thread(self.med.nodes_with_work, nodes)
            except MediatorError as exc:
                # The polls end at their wait and read then: no wake is needed for correctness.
                log.warning("work wake check failed: %s", getattr(exc, "message", exc))
                return
            for node_id in ready:
                for event in self._waiters.get(node_id, ()):
                    event.set()


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (the ASGI ``http.disconnect``)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await anyio.to_thread.run_sync(fn, *args)
