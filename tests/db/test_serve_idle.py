"""An idle server sleeps: the serving loop wakes once a second at most while nothing happens
(docs/performance.md "Idle CPU"; the product's goal: no polling while nothing happens).

The server's own main loop is run on an event loop with a virtual clock: a wait with a timeout
that nothing ends returns at once with the clock moved forward by the timeout. So a minute of
idleness takes no real time, and the wake-ups in it are counted exactly — no timing in the test.
uvicorn's loop (before) woke every 0.1 s: 600 wake-ups in that minute.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

from mediator.api.auth import Tokens
from mediator.cli.main import IDLE_TICK_S, Serving, _server
from mediator.config import Config
from mediator.flows import Mediator


class _VirtualSelector:
    """The loop's selector, but a wait that would time out moves the virtual clock instead."""

    def __init__(self, real: selectors.BaseSelector, loop: VirtualClockLoop) -> None:
        self.real = real
        self.loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = self.real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # nothing scheduled at all: only a real event can come
            return self.real.select(None)
        self.loop.now += timeout
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        real: Any = self._selector  # type: ignore[has-type]
        self._selector = _VirtualSelector(real, self)

    def time(self) -> float:
        return self.now


def _idle_minute(med: Mediator, stop_at: float) -> tuple[int, float]:
    """Run the server's main loop with nothing to do until ``stop()`` at virtual ``stop_at``;
    return how many times it woke (``on_tick`` calls) and the virtual time it ended at."""
    serving = Serving(Config(), Tokens(None), True, "", "")
    server, stop = _server(med, serving, lambda port: None)
    ticks = 0
    on_tick = server.on_tick

    async def counted(counter: int) -> bool:
        nonlocal ticks
        ticks += 1
        return bool(await on_tick(counter))

    server.on_tick = counted
    loop = VirtualClockLoop()
    try:
        loop.call_at(stop_at, stop)
        loop.run_until_complete(server.main_loop())
        return ticks, loop.time()
    finally:
        loop.close()


def test_an_idle_server_wakes_once_a_second_not_ten_times(med: Mediator) -> None:
    """A minute with no request: one wake-up a second (the Date header), plus the first check
    and the stop; uvicorn's own loop woke 600 times."""
    ticks, _ = _idle_minute(med, stop_at=60.5)
    assert IDLE_TICK_S == 1.0
    assert ticks == 1 + 60 + 1


def test_stop_wakes_the_idle_loop_at_once_not_at_the_next_tick(med: Mediator) -> None:
    """SIGTERM's handler and the workers' stop call ``stop()``; the loop ends at that moment."""
    ticks, ended = _idle_minute(med, stop_at=2.25)
    assert ended == 2.25
    assert ticks == 1 + 2 + 1


def test_every_wake_up_refreshes_the_date_header(med: Mediator) -> None:
    """uvicorn refreshes the Date header when on_tick's counter is a multiple of 10: with one
    wake-up a second, each must pass one, or the header would go stale for ten seconds."""
    serving = Serving(Config(), Tokens(None), True, "", "")
    server, stop = _server(med, serving, lambda port: None)
    counters: list[int] = []
    on_tick = server.on_tick

    async def seen(counter: int) -> bool:
        counters.append(counter)
        return bool(await on_tick(counter))

    server.on_tick = seen
    loop = VirtualClockLoop()
    try:
        loop.call_at(5.5, stop)
        loop.run_until_complete(server.main_loop())
    finally:
        loop.close()
    assert counters == [0, 10, 20, 30, 40, 50, 60]
