"""What a claim left behind, kept for the result that follows (issue 13).

A result decides from the run as it is (``result_source``) and writes under the run's version
(docs/design.md §9). The claim already returns the run as it left it, so this process keeps that
snapshot and the step's result decides from it without a read of its own. Nothing here is
trusted: the result's write matches only if the run's version, the node's daemon instance and
the run's at-boundary nodes are still the snapshot's, and any snapshot that refuses or loses
that race is dropped for a fresh read — a stale snapshot costs one statement, never a wrong
answer. A result that reaches another process (another worker of ``mediator serve``) simply
reads.

Bounded (docs/security.md: every resource a client can make the Mediator hold has a limit): a
daemon that claims and never reports (it died) leaves its snapshot behind, so the oldest are
dropped past ``limit``; and a run whose contract is longer than ``max_bytes`` is not kept at all
(its result reads), so the snapshots hold at most ``limit × max_bytes`` of contract text however
large the contracts a submitter sends (1 MiB each at most).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from mediator.core.rows import ResultSource

LIMIT = 1024  # snapshots: about one per busy node is what a lab uses
MAX_BYTES = 8192  # of a run's contract text: larger runs' results read (a one-step run: ~300)


class ClaimedRuns:
    """Snapshots by (run_id, seq, node_id, attempt), oldest dropped first past ``limit``."""

    def __init__(self, limit: int = LIMIT, max_bytes: int = MAX_BYTES) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._snapshots: OrderedDict[tuple[str, int, str, int], ResultSource] = OrderedDict()

    def keep(self, node_id: str, seq: int, src: ResultSource, size: int) -> None:
        """Keep what a claim of step ``seq`` by ``node_id`` left; ``size`` is the length of
        the run's contract text (a larger one than ``max_bytes`` is not kept)."""
        if size > self.max_bytes:
            return
        step = next(s for s in src.steps if s.seq == seq)
        key = (src.run.run_id, seq, node_id, step.attempt)
        with self._lock:
            self._snapshots[key] = src
            self._snapshots.move_to_end(key)
            while len(self._snapshots) > self.limit:
                self._snapshots.popitem(last=False)

    def take(self, run_id: str, seq: int, node_id: str, attempt: int) -> ResultSource | None:
        """The snapshot for this result, once (a second result of the same attempt reads)."""
        with self._lock:
            return self._snapshots.pop((run_id, seq, node_id, attempt), None)

    def __len__(self) -> int:
        return len(self._snapshots)
