"""What every flow works with: one explicit context instead of a shared ``self``.

The modules of :mod:`mediator.flows` are functions of a :class:`Context` — the store, the
configuration, the records folder, the clock, the failure counters and the after-commit object
(seal, PushAsks, wake: it calls the sweep itself, so no wake is handed back up). The
:class:`~mediator.flows.Mediator` facade builds one and hands it to each flow, so every call
from one flow into another is a visible import.
"""

from __future__ import annotations

import secrets
import threading
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from mediator.clock import Clock, wall_clock
from mediator.config import Config
from mediator.flows.after import AfterCommit
from mediator.flows.claimed import ClaimedRuns
from mediator.flows.sweep import SweepMemo
from mediator.records import Records
from mediator.store.db import Store

if TYPE_CHECKING:
    from mediator.flows.gaps import Timekeeper
    from mediator.flows.sweep import WakeReport


class Context:
    """The Mediator's state shared by its flows (docs/design.md §9)."""

    def __init__(
        self,
        store: Store,
        config: Config,
        records: Records,
        clock: Clock | None,
    ) -> None:
        self.store = store
        self.config = config
        self.records = records
        self.clock = clock
        # Test seam for the missed-wake race (R17): called between submit's fleet read and its
        # insert, so a test can commit a release exactly there. None in production.
        self.after_fleet_read: Callable[[str], None] | None = None
        # R17's guard, switchable only so a test can show the race it closes is real.
        self.missed_wake_guard = True
        # Called with (seconds, WakeReport) after every sweep: metrics, the simulator's counters.
        self.sweep_observers: list[Callable[[float, WakeReport], None]] = []
        # Failures this process survived (R7, R16, issue 11 §5–6), for /metrics: keys
        # "sweep_run" (one run's promotion), "record_open", "record_seal", "wake".
        self.failures: Counter[str] = Counter()
        # Told of each one as it is counted: /metrics keeps them where a scrape of any worker of
        # `mediator serve --workers N` sees every process's (mediator/api/metrics.py).
        self.count_observers: list[Callable[[str], None]] = []
        self.lock = threading.Lock()
        # What each claim left, for the result that follows (issue 13): one read less.
        self.claimed = ClaimedRuns()
        # Seal what settled, PushAsks, wake: the one after-commit path of every flow.
        self.after = AfterCommit(self)
        # The last sweep's answers, for the next (docs/design.md §6 "Sweeps remember").
        self.sweep_memo = SweepMemo()
        # Stalls and clock jumps given back (docs/design.md §13); None under a virtual clock.
        self.timekeeper: Timekeeper | None = None

    def now(self) -> datetime:
        return self.clock() if self.clock is not None else wall_clock()

    def new_run_id(self) -> str:
        """Time-ordered from the Mediator's clock (docs/design.md §4), unique by a random suffix."""
        return self.now().strftime("%Y%m%dT%H%M%S%f") + "-" + secrets.token_hex(4)

    def count(self, what: str) -> None:
        """One more survived failure of kind ``what`` (request threads count concurrently)."""
        with self.lock:
            self.failures[what] += 1
        for observer in self.count_observers:
            observer(what)
