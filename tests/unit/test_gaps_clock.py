"""The Timekeeper's own arithmetic (docs/design.md §13, "time you can trust"), without a database:
when a tick is a stall, what a request sees before the ticker has run, and which readings of the
database's clock count as a jump. Only a gap to give back would reach the database, and these
examples have none (the give-back itself: tests/db/test_gaps.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mediator.flows.gaps import JUMP_S, STALL_S, TICK_S, Timekeeper

T0 = datetime(2031, 3, 1, 12, 0, tzinfo=UTC)


class Steady:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def keeper() -> tuple[Timekeeper, Steady]:
    steady = Steady()
    ctx: Any = None  # nothing here reaches the context: no gap is given back
    return Timekeeper(ctx, steady, ticker=False), steady


def test_ticks_on_time_are_no_stall_and_a_late_one_is_a_stall_as_long_as_the_wait() -> None:
    tk, steady = keeper()
    for _ in range(20):
        steady.t += TICK_S
        tk.tick()
    assert not tk.stalled() and tk._stalls == []
    steady.t += TICK_S + STALL_S - 0.01  # late, but by less than STALL_S
    tk.tick()
    assert tk._stalls == []
    steady.t += 40.0
    tk.tick()
    # kept as (length, when it ended on the steady clock) until given back
    assert tk._stalls == [(pytest.approx(40.0), pytest.approx(steady.t))]


def test_a_request_sees_the_stall_before_the_ticker_has_run_again() -> None:
    """After SIGCONT any thread may run first: the ticker's lateness is visible to a request."""
    tk, steady = keeper()
    steady.t += TICK_S
    assert not tk.stalled()
    steady.t += 40.0
    assert tk.stalled()


def test_readings_that_keep_pace_or_fall_behind_are_no_jump() -> None:
    tk, steady = keeper()
    assert tk.observe(T0, steady.t) == 0.0  # the first reading: what later ones are measured by
    for real, db in ((10.0, 10.0), (10.0, 10.0 + JUMP_S / 2), (3600.0, 3601.0), (5.0, -60.0)):
        steady.t += real
        kept = tk._seen
        assert kept is not None
        assert tk.observe(kept[1] + timedelta(seconds=db), steady.t) == 0.0
    assert list(tk.noticed) == []


def test_an_older_reading_than_the_one_kept_is_ignored() -> None:
    """Threads finish out of order: a reading taken before the kept one neither moves the
    baseline back nor is compared with it."""
    tk, _ = keeper()
    tk.observe(T0, 100.0)
    assert tk.observe(T0 - timedelta(seconds=500), 99.0) == 0.0
    assert tk._seen == (100.0, T0)
