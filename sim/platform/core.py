"""The simulation core both engines share: time units, the event heap, same-instant ordering.

Why one module: the differential test (real Mediator vs reference model, exact on every
scenario) holds only if both engines order simultaneous events identically. When each engine
carried its own copy of a constant (the `(run, step)` key packing was defined twice), a change to
one would silently reorder the other. Here every piece of that contract is defined once; it
imports nothing from the simulator, so `sim.brokers.mediator`, `sim.brokers.model` and
`sim.analysis` can all depend on it without depending on each other.

**Time.** Virtual time is an integer number of microseconds (`US` per second): integer
arithmetic keeps k·interval heartbeats and sums of durations exact, so both engines land on the
same instant.

**Same-instant ordering.** Events are ordered by `(time, class, key)`, with an insertion sequence
number only as the last resort (SimPy orders equal times by insertion alone, which is why the
engines do not use its scheduler). Every key is an integer *position* — never an id string such
as "r0000012" or "n003", whose order is only the order of positions by a naming convention (and
costs a string comparison on the hottest path):

    class 0 RESULT   step results and ask answers     key step_key(run position, step position)
    class 1 CLAIM    delayed claims (latency > 0)      key the node's position in plan.nodes
    class 2 FLEET    the plan's fleet events           key their position in plan.fleet_events
    class 3 ADVERT   periodic heartbeats               key the node's position
    class 4 REAPER   the reaper, at k·renew_seconds    key 0
    class 5 ARRIVAL  submits                           key the run's position in plan.arrivals
    class 6 MARK     bookkeeping only (no broker call) key the node's position

so at one instant results free nodes before fleet changes, heartbeats and the reaper look, and
arrivals see all of that. The one loop that pushes these events is `sim.platform.driver`'s; its
docstring gives the whole fleet contract. Outside the heap, whatever else happens at one instant
in some order — idle nodes asking for work, stuck intervals opening — goes by the same positions.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Any, Final

US: Final = 1_000_000  # virtual time unit: one microsecond

# Same-instant event classes (see the module docstring).
RESULT, CLAIM, FLEET, ADVERT, REAPER, ARRIVAL, MARK = range(7)

STEP_KEY: Final = 4096  # > 1,000 steps per contract: (run, step) packs into one int key


def step_key(run_pos: int, step_pos: int) -> int:
    """The RESULT tie-break key of step `step_pos` of the `run_pos`-th arrival: run order first,
    then step order, packed into one int (a tuple would cost more on the model's hot path)."""
    return run_pos * STEP_KEY + step_pos


def to_us(seconds: float) -> int:
    """Seconds → integer microseconds, both engines' clock unit."""
    return round(seconds * US)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building large, long-lived structures.

    The model keeps every run alive until the end, so the collector would rescan a growing heap
    again and again (it halved throughput at 10^5 runs); nothing allocated meanwhile needs it.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


Event = tuple[int, int, int, int, Callable[[Any], object], Any]

_heappush, _heappop = heapq.heappush, heapq.heappop  # (module globals: the model's hot path)
_STOP_CLASS: Final = 1 << 30  # `events`' stop event: after every class at its instant
_FOREVER: Final = 1 << 62  # µs, the stop event's time when the loop has no end


class EventQueue:
    """A heap of `(time_us, class, key, seq, action, arg)`; pop order is the same-instant rule.

    Small on purpose (SimPy's core is the model). It owns its heap and its loop: events go in by
    `push` and come out by `events(end)` (or `pop`); nothing outside reads the heap, so the
    same-instant order cannot be bypassed by a caller that builds its own tuples.
    """

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = itertools.count()

    def push(self, t: int, cls: int, key: int, action: Callable[[Any], object], arg: Any) -> None:
        """Schedule `action(arg)` at `t` µs with the given class and tie-break key."""
        _heappush(self._heap, (t, cls, key, next(self._seq), action, arg))

    def pop(self) -> Event:
        """Remove and return the next event."""
        return _heappop(self._heap)

    def events(self, end: int | None = None) -> Iterator[Event]:
        """The loop: events in same-instant order until none is left or the next one lies after
        `end` (µs), where the simulation stops. Actions may push while it runs; a consumer that
        stops iterating leaves the rest queued.

        A stop event goes into the heap behind every event at `end` (its class sorts after all
        the others), and the iterator is C's `iter(pop, stop)`: a generator's resume per event
        cost the model about 5 % of its throughput.
        """
        stop: Event = (_FOREVER if end is None else end, _STOP_CLASS, 0, -1, _noop, None)
        _heappush(self._heap, stop)
        return iter(functools.partial(_heappop, self._heap), stop)

    def queued(self) -> list[Event]:
        """The events still queued, in no particular order (for inspection in tests)."""
        return [ev for ev in self._heap if ev[1] != _STOP_CLASS]

    def __len__(self) -> int:
        return sum(1 for ev in self._heap if ev[1] != _STOP_CLASS)


def _noop(_: object) -> None:
    return None
