"""Multi-process races over one queue folder: the claim race and the dead-session reclaimer race.

Used by the e2e tests (performance.md: six processes racing over thousands of tickets claim each
exactly once, with hard links and with the exclusive-create fallback; the reclaimer never creates
an "assigned" ticket; issue 12 §8: eight workers among planted symlinks and garbage dispatch each
valid ticket once and write nothing outside the queue) and by ``python -m
mediator.tickets.races``, which prints the claim throughput recorded in docs/performance.md. The
functions run in real processes (``spawn``), all released at once by a barrier; every wait is
bounded.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from queue import Empty
from typing import Any

from mediator.tickets.claim import claim, close, finish, heartbeat, read, start_session, write
from mediator.tickets.names import Lane, parse_name
from mediator.tickets.reclaim import reclaim_stale
from mediator.tickets.rules import candidates
from mediator.tickets.store import QueueDir, read_snapshot

TIMEOUT = 120.0
_TICKET = "---\ntitle: race {n}\npriority: 3\ncreated: 2025-01-01T00:00:00Z\nkind: ticket\n---\n"


@dataclass(frozen=True)
class RacerReport:
    """What one racing process did: the hashes it won and when it started and stopped."""

    pid: int
    won: tuple[str, ...]
    began: float
    ended: float


@dataclass(frozen=True)
class RaceResult:
    """All racers' reports, with the counts the tests assert on."""

    reports: tuple[RacerReport, ...]
    holder_passes: int = 0  # reclaim race: full rounds of late heartbeats the stalled holder wrote

    @property
    def wins(self) -> Counter[str]:
        """How many racers won each hash (exactly one each, if claiming is exclusive)."""
        return Counter(h for report in self.reports for h in report.won)

    @property
    def elapsed(self) -> float:
        """Seconds from the first racer's start to the last racer's end."""
        return max(r.ended for r in self.reports) - min(r.began for r in self.reports)

    @property
    def claims_per_second(self) -> float:
        """Successful claims per second over the whole race."""
        return sum(len(r.won) for r in self.reports) / self.elapsed


def make_tickets(root: Path, count: int) -> list[str]:
    """Writes ``count`` open tickets quickly (no fsync: set-up, not the subject of the race)."""
    hashes = [f"race{n:06d}" for n in range(count)]
    for n, ticket_hash in enumerate(hashes):
        (root / f"{ticket_hash}.md").write_text(_TICKET.format(n=n))
    return hashes


def open_hashes(queue: QueueDir) -> list[str]:
    """The hashes of the open tickets, sorted: the listing every racer starts from."""
    names = (parse_name(name, queue.suffixes) for name in os.listdir(queue.root))
    return sorted(p.ticket_hash for p in names if p and p.lane is Lane.QUEUED and not p.is_answer)


def claim_racer(
    root: str, hard_links: bool, start: Barrier, results: Any, finish_each: bool
) -> None:
    """One racing worker: claims every ticket of the shared listing it can, in the same order.

    All racers walk the same sorted listing, so they reach the same ticket at the same moment – the
    situation of seed 001 ("동시에 같은 티켓을 본 워커 여섯"). With ``finish_each`` every win is
    finished at once, so late racers meet finished tickets: the case the fallback's re-check exists
    for.
    """
    queue = QueueDir(Path(root), hard_links=hard_links)
    hashes = open_hashes(queue)
    won = []
    start.wait(timeout=TIMEOUT)
    began = time.monotonic()
    for ticket_hash in hashes:
        held = claim(queue, ticket_hash)
        if held is None:
            continue
        won.append(ticket_hash)
        if finish_each:
            finish(held)
        else:
            close(held)
    results.put(RacerReport(os.getpid(), tuple(won), began, time.monotonic()))


def race(
    root: Path, *, workers: int = 6, hard_links: bool = True, finish_each: bool = True
) -> RaceResult:
    """Runs ``workers`` claim racers over the open tickets in ``root``; collects their reports."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(workers)
    results = context.Queue()
    processes = [
        context.Process(
            target=claim_racer, args=(str(root), hard_links, start, results, finish_each)
        )
        for _ in range(workers)
    ]
    return RaceResult(tuple(_collect(processes, results)))


def stalled_holder(root: str, hard_links: bool, start: Barrier, stop: Event, results: Any) -> None:
    """Claims every ticket, then goes silent – except for late heartbeats through its descriptors.

    After the barrier it keeps rewriting each held file, ``session_id`` included, through the
    descriptor it claimed with, until told to stop; then it writes once more, after every reclaimer
    has finished. If a reclaimer stripped the keys in place (same inode), these writes would put
    ``session_id`` back on open tickets – the accident of tickets.md §4.4 made by the engine.
    """
    queue = QueueDir(Path(root), hard_links=hard_links)
    held = []
    for n, ticket_hash in enumerate(open_hashes(queue)):
        ticket = claim(queue, ticket_hash)
        assert ticket is not None, f"nobody else races the holder for {ticket_hash}"
        start_session(ticket, f"stalled-{n}", now=0.0)  # its last heartbeat: 1970
        held.append((ticket, read(ticket)))
    start.wait(timeout=TIMEOUT)
    passes = 0
    while not stop.is_set():
        for ticket, doc in held:
            write(ticket, doc)
        passes += 1
    for ticket, doc in held:
        write(ticket, doc)
        close(ticket)
    results.put(passes)


def reclaim_racer(root: str, hard_links: bool, start: Barrier, results: Any) -> None:
    """One reclaimer, racing the others over the same stale ``.wip`` files."""
    queue = QueueDir(Path(root), hard_links=hard_links)
    start.wait(timeout=TIMEOUT)
    began = time.monotonic()
    # An hour in the future: every session counts as dead, however recently it wrote.
    reclaimed = reclaim_stale(queue, ttl=600.0, now=time.time() + 3600.0)
    won = tuple(item.hash for item in reclaimed)
    results.put(RacerReport(os.getpid(), won, began, time.monotonic()))


def reclaim_race(root: Path, *, reclaimers: int = 5, hard_links: bool = True) -> RaceResult:
    """One stalled holder and ``reclaimers`` reclaimers, released together by one barrier.

    Returns:
        The reclaimers' reports (``won`` = the hashes each one put back in the queue).
    """
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(reclaimers + 1)
    stop = context.Event()
    holder_results = context.Queue()
    results = context.Queue()
    holder = context.Process(
        target=stalled_holder, args=(str(root), hard_links, start, stop, holder_results)
    )
    holder.start()
    processes = [
        context.Process(target=reclaim_racer, args=(str(root), hard_links, start, results))
        for _ in range(reclaimers)
    ]
    try:
        reports = _collect(processes, results)
    finally:
        stop.set()
        passes = holder_results.get(timeout=TIMEOUT)
        holder.join(timeout=TIMEOUT)
    return RaceResult(tuple(reports), holder_passes=passes)


def _collect(processes: Sequence[Any], results: Any) -> list[RacerReport]:
    """Starts the processes and gathers one report from each; fails fast if one of them dies."""
    for process in processes:
        process.start()
    deadline = time.monotonic() + TIMEOUT
    reports: list[RacerReport] = []
    try:
        while len(reports) < len(processes):
            try:
                reports.append(results.get(timeout=0.5))
            except Empty:
                dead = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a racing process died (exit codes {dead})") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"racers did not finish within {TIMEOUT} s") from None
        return reports
    finally:
        for process in processes:
            process.join(timeout=TIMEOUT)
            if process.is_alive():
                process.kill()


@dataclass(frozen=True)
class Traps:
    """What ``plant_traps`` put in a queue, and the files outside it that must never change.

    Attributes:
        valid: Hashes of the real tickets.
        planted: Queue file name → what it is (``symlink``, ``empty``, ``binary`` ...).
        canaries: Paths outside the queue → (content, mtime_ns) at planting time.
    """

    valid: tuple[str, ...]
    planted: dict[str, str]
    canaries: dict[str, tuple[bytes, int]]


def plant_traps(root: Path, outside: Path, count: int, every: int = 5) -> Traps:
    """``count`` tickets; every ``every``-th slot also gets a trap beside the real tickets.

    The traps: symlinks to canary files outside the queue, named as open tickets, as in-progress
    tickets and as answers; a hard link to a canary; and garbage – empty, binary, unterminated
    frontmatter, a FIFO. The canaries look like valid tickets, so following a link would dispatch
    one. Their content and mtime are recorded for the check that nothing outside was written.
    """
    valid = make_tickets(root, count)
    planted: dict[str, str] = {}
    canaries: dict[str, tuple[bytes, int]] = {}
    kinds = ["symlink", "wip symlink", "answer symlink", "hard link"]
    kinds += ["empty", "binary", "open", "fifo"]
    for n in range(0, count, every):
        kind = kinds[(n // every) % len(kinds)]
        trap = f"trap{n:06d}"
        canary = outside / f"canary{n:06d}.md"
        canary.write_text(_TICKET.format(n=f"canary {n}") + "token=do-not-show\n")
        os.utime(canary, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
        if kind == "symlink":
            name = f"{trap}.md"
            (root / name).symlink_to(canary)
        elif kind == "wip symlink":
            name = f"{trap}.wip.md"
            (root / name).symlink_to(canary)
        elif kind == "answer symlink":
            name = f"{valid[n]}.answer.1.md"
            (root / name).symlink_to(canary)
        elif kind == "hard link":
            name = f"{trap}.md"
            os.link(canary, root / name)
        elif kind == "empty":
            name = f"{trap}.md"
            (root / name).write_bytes(b"")
        elif kind == "fifo":
            name = f"{trap}.md"
            os.mkfifo(root / name)
        elif kind == "binary":
            name = f"{trap}.md"
            (root / name).write_bytes(b"---\x00\x89PNG\r\n" + os.urandom(64))
        else:
            name = f"{trap}.md"
            (root / name).write_text("---\ntitle: never closed\npriority: 5\n")
        planted[name] = kind
        stat = canary.stat()
        canaries[str(canary)] = (canary.read_bytes(), stat.st_mtime_ns)
    return Traps(tuple(valid), planted, canaries)


def trap_worker(root: str, hard_links: bool, start: Barrier, results: Any) -> None:
    """One worker among the traps: the worker's own steps, over and over, until nothing is left.

    Each round: reclaim dead sessions, list, and walk the candidates – claim, start the session,
    heartbeat, finish – as ``tickets worker`` does. A worker with a stale listing would try names
    that have since become traps, so every round also tries to claim every trap's name directly:
    the claim itself must refuse them. A trap that is won, or offered as a candidate, is reported.
    """
    queue = QueueDir(Path(root), hard_links=hard_links)
    traps = sorted(
        {
            p.ticket_hash
            for p in (parse_name(n, queue.suffixes) for n in os.listdir(root))
            if p and not p.is_answer and p.ticket_hash.startswith("trap")
        }
    )
    won: list[str] = []
    start.wait(timeout=TIMEOUT)
    began = time.monotonic()
    while True:
        reclaim_stale(queue)
        offered = [t.hash for t in candidates(read_snapshot(queue).judge())]
        if not offered:
            break
        for ticket_hash in sorted(offered + traps):
            held = claim(queue, ticket_hash)
            if held is None:
                continue
            won.append(ticket_hash)
            start_session(held, f"racer-{os.getpid()}", time.time())
            heartbeat(held, time.time())
            finish(held, log="done")
    for ticket_hash in traps:  # one more try at every trap once the queue is empty
        if claim(queue, ticket_hash) is not None:
            won.append(ticket_hash)
    results.put(RacerReport(os.getpid(), tuple(won), began, time.monotonic()))


def trap_race(root: Path, *, workers: int = 8, hard_links: bool = True) -> RaceResult:
    """Runs ``workers`` trap workers over ``root`` (see ``plant_traps``), released together."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(workers)
    results = context.Queue()
    processes = [
        context.Process(target=trap_worker, args=(str(root), hard_links, start, results))
        for _ in range(workers)
    ]
    return RaceResult(tuple(_collect(processes, results)))


def measure(tickets: int, workers: int, hard_links: bool, repeat: int) -> list[float]:
    """Claims per second (claim + finish) of ``repeat`` fresh races."""
    rates = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="ticket-race-") as folder:
            make_tickets(Path(folder), tickets)
            result = race(Path(folder), workers=workers, hard_links=hard_links)
            assert set(result.wins.values()) == {1} and len(result.wins) == tickets
            rates.append(result.claims_per_second)
    return rates


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the claim throughput, one line per mode (docs/performance.md).

    The baseline is one worker alone on the same folder in the same run (performance.md: a figure
    that depends on the machine comes with its ratio to a baseline measured alongside it).
    """
    parser = argparse.ArgumentParser(description="Claim throughput of the ticket queue.")
    parser.add_argument("--tickets", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    for label, hard_links in (("hard links", True), ("O_CREAT|O_EXCL fallback", False)):
        rates = measure(args.tickets, args.workers, hard_links, args.repeat)
        alone = statistics.median(measure(args.tickets, 1, hard_links, args.repeat))
        median = statistics.median(rates)
        print(
            f"claims/s (claim + finish), {args.workers} workers, {args.tickets} tickets, {label}: "
            f"median {median:,.0f} (min {min(rates):,.0f}, max {max(rates):,.0f}); "
            f"one worker alone {alone:,.0f}; ratio {median / alone:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
