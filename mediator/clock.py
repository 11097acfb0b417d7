"""Clocks. Domain code never reads the wall clock directly (docs/design.md §13).

The database's ``mediator_now()`` is the time of record. A Python-side clock is needed only to
generate time-ordered run ids and, in the simulator, to set ``mediator.now``; both go through a
``Clock`` so virtual time reaches them too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def wall_clock() -> datetime:
    """The real time, tz-aware (UTC). The only place the wall clock is read."""
    return datetime.now(UTC)


def monotonic() -> float:
    """The process's steady clock in seconds: it never jumps and runs on through a stall, so a
    gap between two of its readings is real time (docs/design.md §13, "time you can trust").
    Used to notice stalls and jumps of the database's clock, never as a time of record."""
    return time.monotonic()
