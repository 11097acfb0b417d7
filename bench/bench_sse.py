"""Idle SSE streams must not slow the API (issue 11 §2; docs/security.md "Event streams").

One ``mediator serve`` process (a real uvicorn, one worker) on an embedded PostgreSQL holding
``--runs`` runs. In the same run, two phases of the same load — ``--clients`` threads each sending
``GET /v1/runs`` back to back for ``--seconds`` — measure the latency of every request:

* baseline — no event stream open;
* figure — with ``--streams`` idle ``GET /v1/events`` streams open (raw sockets that read nothing
  but their ``: connected`` line), each sending ``: keepalive`` every ``--keepalive`` seconds.

Prints p50/p99 of both phases and the ratios; the target is p99 with streams ≤ about 10× the idle
p99. Before the fix, 45 idle streams made ``/v1/runs`` time out (20 s).

Run: ``.venv/bin/python bench/bench_sse.py [--streams 200] [--seconds 10] [--clients 4]``.
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _common import start_server as _start
from _common import stop_server

from mediator import Config, Mediator
from mediator.pg import EmbeddedPostgres


def start_server(dsn: str, workdir: str, streams: int, keepalive: float) -> tuple[Any, str]:
    """One worker: the stream caps and the gauge are then this one process's."""
    env = {
        "MEDIATOR_EVENTS_MAX_STREAMS": str(streams + 10),
        "MEDIATOR_EVENTS_MAX_STREAMS_PER_PRINCIPAL": str(streams + 10),
        "MEDIATOR_EVENTS_KEEPALIVE_SECONDS": str(keepalive),
    }
    return _start(dsn, workdir, workers=1, env=env)


def load(url: str, seconds: float, clients: int) -> list[float]:
    """Latencies (seconds) of GET /v1/runs from ``clients`` threads for ``seconds``."""
    out: list[float] = []
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client() -> None:
        mine: list[float] = []
        with httpx.Client(base_url=url, timeout=60) as http:
            while time.monotonic() < end:
                t0 = time.perf_counter()
                r = http.get("/v1/runs")
                mine.append(time.perf_counter() - t0)
                r.raise_for_status()
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def open_streams(url: str, n: int) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)), timeout=30)
        s.sendall(b"GET /v1/events HTTP/1.1\r\nHost: b\r\nAccept: text/event-stream\r\n\r\n")
        socks.append(s)
    for s in socks:
        data = b""
        while b": connected" not in data:
            chunk = s.recv(4096)
            if not chunk:
                raise RuntimeError(f"stream refused: {data!r}")
            data += chunk
    return socks


def quantiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=100, method="inclusive")
    return q[49] * 1e3, q[98] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--streams", type=int, default=200, help="idle streams (default: 200)")
    ap.add_argument("--seconds", type=float, default=10.0, help="per phase (default: 10)")
    ap.add_argument("--clients", type=int, default=4, help="load threads (default: 4)")
    ap.add_argument("--runs", type=int, default=100, help="runs in the list (default: 100)")
    ap.add_argument("--keepalive", type=float, default=15.0, help="keepalive seconds (default: 15)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as work, EmbeddedPostgres() as pg:
        med = Mediator.connect(pg.dsn(), config=Config(), records_root=f"{work}/records")
        med.advert("n1", {"board": "x"}, "i1")
        for i in range(args.runs):
            med.submit({"roles": {"dut": {"board": "x"}},
                        "steps": [{"name": f"s{i}", "role": "dut", "uses": "fail"}]})  # fmt: skip
        med.close()
        proc, url = start_server(pg.dsn(), work, args.streams, args.keepalive)
        try:
            load(url, 1.0, args.clients)  # warm-up
            idle = load(url, args.seconds, args.clients)
            socks = open_streams(url, args.streams)
            busy = load(url, args.seconds, args.clients)
            open_now = re.search(
                r"^mediator_event_streams (\S+)$", httpx.get(f"{url}/metrics").text, re.M
            )
            for s in socks:
                s.close()
        finally:
            stop_server(proc)
    (i50, i99), (b50, b99) = quantiles(idle), quantiles(busy)
    print(f"GET /v1/runs, {args.clients} clients, {args.runs} runs, {args.seconds:g} s per phase")
    print(f"baseline (no streams):      n={len(idle):6d}  p50 {i50:7.2f} ms  p99 {i99:7.2f} ms")
    print(
        f"{args.streams} idle streams open:  n={len(busy):6d}  p50 {b50:7.2f} ms  "
        f"p99 {b99:7.2f} ms  (gauge: {open_now.group(1) if open_now else '?'})"
    )
    print(f"ratio p50 {b50 / i50:.2f}x  p99 {b99 / i99:.2f}x  (target: p99 ratio <= about 10)")


if __name__ == "__main__":
    main()
