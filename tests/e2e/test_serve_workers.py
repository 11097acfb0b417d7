"""``mediator serve --workers N`` (issue 13, HTTP): N processes answer on one socket that the
parent bound (port 0 names one port for all of them), and SIGTERM leaves none of them behind.

Which process answered is in ``/healthz``'s ``X-Mediator-Worker`` header. Requests are spread by
the kernel, not by us, so the test keeps several connections open at once and polls — with a
deadline — until two distinct workers have answered."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.servers import start_server

pytestmark = [pytest.mark.e2e, pytest.mark.db]


def _children(pid: int) -> set[int]:
    """Direct children of ``pid`` (from /proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_two_workers_answer_on_one_port_and_sigterm_stops_them_all(dsn, tmp_path):
    server = start_server(dsn, tmp_path, "--workers", "2")
    try:
        parent = server.process.proc.pid
        workers = _children(parent)
        assert len(workers) >= 2, workers  # two workers (and multiprocessing's own helper)
        seen: set[str] = set()
        deadline = time.monotonic() + 30
        clients = [httpx.Client(base_url=server.url, timeout=10) for _ in range(8)]
        try:
            while len(seen) < 2:
                assert time.monotonic() < deadline, f"only {seen} answered"
                for c in clients:  # separate connections: each may land on either worker
                    r = c.get("/healthz")
                    assert r.status_code == 200 and r.json()["status"] == "ok"
                    seen.add(r.headers["X-Mediator-Worker"])
                for c in clients:
                    c.close()
                clients = [httpx.Client(base_url=server.url, timeout=10) for _ in range(8)]
        finally:
            for c in clients:
                c.close()
        assert seen <= {str(p) for p in workers}  # the parent itself does not serve
        assert str(parent) not in seen
        # Both workers serve the same API on the same database: a submit on one, read on another.
        with httpx.Client(base_url=server.url, timeout=10) as http:
            assert http.post("/v1/runs", json=_contract()).status_code == 422  # no node at all
            assert http.get("/v1/runs/w1").json()["state"] == "FAILED"
        assert server.process.stop(timeout=30) == 0
        # The parent joined its workers before it exited; multiprocessing's resource tracker (a
        # child too) ends when it reads EOF from the parent, a moment later: poll, bounded.
        deadline = time.monotonic() + 10
        while [p for p in workers if _alive(p)] and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a condition with a deadline
        assert [p for p in workers if _alive(p)] == []  # no process left behind
        text = "".join(server.process.output)
        assert text.count("serving on") == 1 and "mediator: stopped" in text, text
    finally:
        server.process.stop()


def _contract() -> dict[str, object]:
    return {
        "run_id": "w1",
        "roles": {"dut": {"board": "x"}},
        "steps": [{"name": "s", "role": "dut", "uses": "shell", "with": {"cmd": "true"}}],
    }


def test_workers_out_of_range_exit_2_naming_the_setting(tmp_path):
    import subprocess
    import sys

    for value in ("0", "1025"):
        done = subprocess.run(
            [sys.executable, "-m", "mediator.cli.main", "--data", str(tmp_path / "pg"),
             "serve", "--dev", "--workers", value],
            capture_output=True, text=True, timeout=60, env={**os.environ},
        )  # fmt: skip
        assert done.returncode == 2 and "workers" in done.stderr, done.stderr


def test_the_stream_caps_hold_for_the_whole_server_not_per_worker(dsn, tmp_path):
    # docs/security.md "Event streams": with N workers each holds cap/N, so 10x the cap in
    # attempts never gets more than the cap admitted across both workers.
    import socket

    cap = 4
    server = start_server(
        dsn, tmp_path, "--workers", "2",
        env={"MEDIATOR_EVENTS_MAX_STREAMS": str(cap),
             "MEDIATOR_EVENTS_MAX_STREAMS_PER_PRINCIPAL": str(cap)},
    )  # fmt: skip
    host, port = server.url.removeprefix("http://").split(":")
    held: list[socket.socket] = []
    try:
        statuses = []
        for _ in range(10 * cap):
            s = socket.create_connection((host, int(port)), timeout=30)
            held.append(s)
            s.sendall(b"GET /v1/events HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n")
            head = b""
            while b"\r\n" not in head:
                chunk = s.recv(4096)
                assert chunk, head
                head += chunk
            statuses.append(int(head.split(b" ", 2)[1]))
        assert set(statuses) == {200, 503}
        assert 1 <= statuses.count(200) <= cap, statuses
        assert server.process.stop(timeout=30) == 0  # open streams end on SIGTERM
    finally:
        for s in held:
            s.close()
        server.process.stop()
