"""Issue 25 §4: ~20,000 slow or half-open connections were never closed; at the descriptor limit
the API stopped answering and asyncio logged a traceback per failed accept (docs/security.md
"Connections").

A real ``mediator serve --dev --workers 1`` runs under a descriptor limit of 256 (``prlimit``),
so its connection cap is 128. Two thousand connections are opened against it — half of them
send nothing, half send a request head that never ends — and then a well-behaved client asks
for ``/healthz`` and the run list: it is answered every time, the slow connections are closed
by the server within the head deadline, and the server's log stays short and traceback-free.
The deadline is the setting ``request_head_timeout_seconds``, here 1 s (10 s by default).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.servers import READY, Process, Server

pytestmark = [pytest.mark.e2e]

FD_LIMIT = 256
SLOW = 2000
HEAD_S = 1.0  # request_head_timeout_seconds for the server under test


@pytest.fixture
def server(dsn: str, tmp_path: Path) -> Iterator[Server]:
    argv = [
        "prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}", "--",
        sys.executable, "-m", "mediator.cli.main", "--records", str(tmp_path / "records"),
        "serve", "--dev", "--workers", "1", "--host", "127.0.0.1", "--port", "0",
        "--database-url", dsn,
    ]  # fmt: skip
    p = Process.start(argv, env={"MEDIATOR_REQUEST_HEAD_TIMEOUT_SECONDS": str(HEAD_S)})
    url = p.wait_for(READY).group(1)
    yield Server(url, p, tmp_path / "records")
    p.stop()


def slow_connections(port: int, n: int, *, wait: bool) -> list[socket.socket]:
    """``n`` connections, every other one sending a head that never ends (slowloris), the
    others nothing at all. ``wait``: each connected before the next; else fired off (the
    kernel keeps trying those the server's listen queue has no room for yet)."""
    held = []
    for i in range(n):
        s = socket.socket()
        held.append(s)
        if wait:
            s.settimeout(10.0)
            s.connect(("127.0.0.1", port))
        else:
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
        with contextlib.suppress(OSError):  # not connected yet: then it is a half-open one
            if i % 2:
                s.send(b"GET /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        s.setblocking(False)
    return held


def closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True  # reset: not held by the server either


def test_slow_connections_are_closed_at_the_head_deadline(server: Server) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    opened = time.monotonic()
    held = slow_connections(port, 50, wait=True)
    try:
        deadline = time.monotonic() + 3 * HEAD_S
        open_ = list(held)
        with selectors.DefaultSelector() as sel:
            for s in open_:
                sel.register(s, selectors.EVENT_READ)
            while open_ and time.monotonic() < deadline:
                for key, _ in sel.select(timeout=1.0):
                    if closed_by_peer(key.fileobj):  # type: ignore[arg-type]
                        sel.unregister(key.fileobj)
                        open_.remove(key.fileobj)  # type: ignore[arg-type]
        assert open_ == [], f"{len(open_)} slow connections still held"
        # ... and not before the deadline the setting gives: a head may take that long
        assert time.monotonic() - opened >= HEAD_S
    finally:
        for s in held:
            s.close()


def test_slow_connections_do_not_keep_other_clients_out(server: Server) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    held = slow_connections(port, SLOW, wait=False)
    try:
        for _ in range(10):  # a fresh connection each time: it has to get in past the flood
            with httpx.Client(base_url=server.url, timeout=30) as http:
                assert http.get("/healthz").status_code == 200
                assert http.get("/v1/runs").status_code == 200
    finally:
        for s in held:
            s.close()
    assert server.process.proc.poll() is None  # still serving
    output = "".join(server.process.output)
    complaints = [line for line in server.process.output if " INFO " not in line]
    assert "Traceback" not in output and len(complaints) < 20, output[-3000:]
