"""Live event streams must not slow submits (issue 24; docs/performance.md "Submits beside live
event streams").

One ``mediator serve`` process (a real uvicorn, one worker) on an embedded PostgreSQL. ``--clients``
threads (default 8) each submit runs back to back on a lane of nodes of their own (every submit is
a 201 RUNNING: one run, its lease and two events), ``--per-phase`` submits each per phase. The
phases alternate, in the same run, between:

* baseline — no event stream open;
* figure — ``--streams`` live ``GET /v1/events`` streams open, every one read to the end by a
  reader thread (so every submit's events are fanned out to all of them while the load runs).

Before each streams phase the cluster's transaction ids are used up to a little below the next
power of ten, so that phase's submits take ids on both sides of it — where text order put 10000
before 9999 (``--no-cross`` leaves the ids alone). Between phases every run is ended and every node
freed by SQL (set-up, not measured). Prints p50
and p99 of the submit latency in both, the ratio of the p99s (goal ≤ 1.5), and how many frames
each stream received against the events written while it was open — each event once per stream,
so nothing skipped and nothing re-sent (before issue 24's fix a buffer out of order re-sent frames
tens of thousands of times and submits took seconds).

Run: ``.venv/bin/python bench/bench_sse_fanout.py [--streams 50] [--clients 8] [--per-phase 40]
[--rounds 2]``.
"""

from __future__ import annotations

import argparse
import re
import selectors
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _common import start_server as _start
from _common import stop_server

from mediator import Config, Mediator
from mediator.pg import EmbeddedPostgres

ID = re.compile(rb"^id: (\d+)$", re.M)


def submit_phase(url: str, clients: int, per_client: int) -> list[float]:
    """Latencies (seconds) of ``per_client`` submits from each of ``clients`` threads."""
    out: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def client(k: int) -> None:
        contract = {"roles": {"dut": {"pool": "bench", "lane": k}},
                    "steps": [{"name": "s", "role": "dut", "uses": "fail"}]}  # fmt: skip
        mine = []
        with httpx.Client(base_url=url, timeout=30) as http:
            http.get("/healthz")
            barrier.wait()
            for _ in range(per_client):
                t0 = time.perf_counter()
                try:
                    r = http.post("/v1/runs", json=contract)
                except httpx.HTTPError as e:
                    with lock:
                        errors.append(f"{type(e).__name__} after {time.perf_counter() - t0:.1f} s")
                    continue
                mine.append(time.perf_counter() - t0)
                if r.status_code != 201:
                    with lock:
                        errors.append(f"{r.status_code}: {r.text[:200]}")
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} submits failed, e.g. {errors[0]}; slowest that "
                           f"answered: {max(out, default=0):.1f} s")  # fmt: skip
    return out


class Readers:
    """``n`` live streams on raw sockets, read to the end by one thread; counts ids per stream."""

    def __init__(self, url: str, n: int) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.socks = []
        for _ in range(n):
            s = socket.create_connection((host, int(port)), timeout=30)
            s.sendall(b"GET /v1/events HTTP/1.1\r\nHost: b\r\nAccept: text/event-stream\r\n\r\n")
            self.socks.append(s)
        self.data = {s: b"" for s in self.socks}
        for s in self.socks:  # admitted and streaming from now on
            while b": connected" not in self.data[s]:
                chunk = s.recv(65536)
                if not chunk:
                    raise RuntimeError(f"stream refused: {self.data[s]!r}")
                self.data[s] += chunk
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        sel = selectors.DefaultSelector()
        for s in self.socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, data=s)
        while not self._stop.is_set():
            for key, _ in sel.select(0.1):
                sock: socket.socket = key.data
                try:
                    chunk = sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                self.data[sock] += chunk

    def ids(self) -> list[list[int]]:
        return [[int(m) for m in ID.findall(self.data[s])] for s in self.socks]

    def wait_for(self, last_id: int, timeout: float = 120.0) -> None:
        """Until every stream has sent ``last_id`` (the phase's last event)."""
        deadline = time.monotonic() + timeout
        while not all(ids and ids[-1] >= last_id for ids in self.ids()):
            if time.monotonic() > deadline:
                raise RuntimeError("streams did not deliver the phase's events")
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for s in self.socks:
            s.close()


def burn_below_next_power(med: Mediator, margin: int) -> int:
    """Use transaction ids up to ``margin`` below the next power of ten (subtransactions that
    write take one each); returns that power. Set-up, not measured."""
    with med.store.pool.connection() as conn:
        conn.autocommit = True
        now = int(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])  # type: ignore[index]
        power = 10
        while power - margin <= now:
            power *= 10
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS burn (x int)")
        conn.execute(
            f"""DO $$ BEGIN FOR i IN 1..{power - margin - now} LOOP
                BEGIN INSERT INTO burn VALUES (i); EXCEPTION WHEN others THEN NULL; END;
              END LOOP; END $$"""
        )
        conn.execute("DROP TABLE burn")
    return power


def free_everything(med: Mediator) -> None:
    """End every run and free every node by SQL: set-up between phases, not measured."""
    with med.store.pool.connection() as conn, conn.transaction():
        conn.execute("DELETE FROM leases")
        conn.execute("UPDATE runs SET state = 'PASSED', verdict = 'pass', ended_at = now() "
                     "WHERE state <> 'PASSED'")  # fmt: skip


def quantiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=100, method="inclusive")
    return q[49] * 1e3, q[98] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--streams", type=int, default=50, help="live streams (default: 50)")
    ap.add_argument("--clients", type=int, default=8, help="submitters (default: 8)")
    ap.add_argument("--per-phase", type=int, default=40, help="submits per client per phase")
    ap.add_argument("--rounds", type=int, default=2, help="baseline+streams pairs (default: 2)")
    ap.add_argument("--no-cross", action="store_true", help="do not cross a power of ten")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as work, EmbeddedPostgres() as pg:
        cfg = Config(advert_ttl_seconds=3600, lease_ttl_seconds=3600)
        med = Mediator.connect(pg.dsn(), cfg, records_root=f"{work}/records")
        for k in range(args.clients):
            for i in range(args.per_phase):
                med.advert(f"n{k}-{i:04d}", {"pool": "bench", "lane": k}, "i1")
        env = {
            "MEDIATOR_ADVERT_TTL_SECONDS": "3600",
            "MEDIATOR_LEASE_TTL_SECONDS": "3600",
            "MEDIATOR_EVENTS_MAX_STREAMS": str(args.streams + 10),
            "MEDIATOR_EVENTS_MAX_STREAMS_PER_PRINCIPAL": str(args.streams + 10),
        }
        proc, url = _start(pg.dsn(), work, workers=1, env=env)
        base: list[float] = []
        live: list[float] = []
        delivered: list[tuple[int, int, int]] = []  # (events written, min, max frames a stream)
        try:
            submit_phase(url, args.clients, 4)  # warm-up: imports, prepared statements, pools
            free_everything(med)
            for _ in range(args.rounds):
                base += submit_phase(url, args.clients, args.per_phase)
                free_everything(med)
                if not args.no_cross:
                    power = burn_below_next_power(med, args.clients * args.per_phase)
                    print(f"  streams phase: transaction ids cross {power:,}")
                with med.store.tx() as tx:
                    first = tx.last_event_id()
                readers = Readers(url, args.streams)
                try:
                    live += submit_phase(url, args.clients, args.per_phase)
                    with med.store.tx() as tx:
                        last = tx.last_event_id()
                    readers.wait_for(last)
                    got = [len([i for i in ids if first < i <= last]) for ids in readers.ids()]
                    dupes = sum(len(ids) - len(set(ids)) for ids in readers.ids())
                    if dupes:
                        raise RuntimeError(f"{dupes} frames re-sent")
                    delivered.append((last - first, min(got), max(got)))
                finally:
                    readers.close()
                free_everything(med)
        finally:
            stop_server(proc)
            med.close()
    (b50, b99), (l50, l99) = quantiles(base), quantiles(live)
    print(f"POST /v1/runs (201), {args.clients} submitters, {args.per_phase} submits each per "
          f"phase, {args.rounds} rounds")  # fmt: skip
    print(f"baseline (no streams):       n={len(base):5d}  p50 {b50:7.2f} ms  p99 {b99:7.2f} ms")
    print(f"{args.streams} live streams open:    n={len(live):5d}  p50 {l50:7.2f} ms  "
          f"p99 {l99:7.2f} ms")  # fmt: skip
    for events, lo, hi in delivered:
        print(f"  a phase wrote {events} events; each stream got {lo}..{hi} of them, none twice")
    print(f"ratio p50 {l50 / b50:.2f}x  p99 {l99 / b99:.2f}x  (goal: p99 ratio <= 1.5)")


if __name__ == "__main__":
    main()
