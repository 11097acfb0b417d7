"""Held work polls with real processes (docs/design.md §19 "The wake of a waiting node").

``mediator serve`` holds an idle node's work poll up to 25 s; neither side may wait that out when
it is told to stop. SIGTERM to the server answers held polls at once (as it ends event streams),
and SIGTERM to an ``enode`` gives its held poll up at once (the server counts it ``gone``, not
``waited``), after which the node stops as it always did. A run submitted meanwhile starts on the
idle node through the wake (the server counts the poll ``woken``).
"""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.servers import Process, Server, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.db]


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def until(check: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)  # polling a condition with a deadline


def enode(server: Server, tmp_path: Path, node_id: str) -> Process:
    caps = tmp_path / f"{node_id}.json"
    caps.write_text(json.dumps({"board": node_id}))
    p = Process.start([sys.executable, "-m", "mediator.enode.main", "--url", server.url,
                       "--node-id", node_id, "--caps", str(caps),
                       "--keep-dir", str(tmp_path / "keep")])  # fmt: skip
    p.wait_for(re.compile(rf"advertised node {node_id}\b"))
    return p


def test_sigterm_answers_a_held_work_poll_and_the_server_exits_0(dsn, tmp_path):
    server = start_server(dsn, tmp_path)
    host, port = server.url.removeprefix("http://").split(":")
    advert = {"node_id": "X", "label": "", "capabilities": {"board": "x"}, "instance": "i1",
              "policy": {"drain": ""}}  # fmt: skip
    assert httpx.post(f"{server.url}/v1/nodes", json=advert, timeout=10).status_code == 200
    sock = socket.create_connection((host, int(port)), timeout=60)
    try:
        sock.sendall(b"GET /v1/nodes/X/work?wait=25 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        until(lambda: metric(server.url, "mediator_work_polls_held") == 1, "the poll was not held")
        assert server.process.stop(timeout=15) == 0  # killed (-9) had it waited out the poll
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200")
        assert data.endswith(b'{"steps":[]}')
    finally:
        sock.close()
        server.process.stop()


def test_an_idle_enode_starts_a_run_through_the_wake_and_sigterm_gives_its_poll_up(dsn, tmp_path):
    server = start_server(dsn, tmp_path)
    node = enode(server, tmp_path, "n1")
    try:
        url = server.url
        until(lambda: metric(url, "mediator_work_polls_held") == 1, "the enode did not long-poll")
        run = {"run_id": "woke", "roles": {"dut": {"board": "n1"}},
               "steps": [{"name": "s", "role": "dut", "with": {"cmd": "true"}}]}  # fmt: skip
        assert httpx.post(f"{url}/v1/runs", json=run, timeout=10).status_code == 201
        until(lambda: httpx.get(f"{url}/v1/runs/woke", timeout=10).json()["state"] == "PASSED",
              "the run did not pass")  # fmt: skip
        # Through the wake — or, should its held poll have ended for an advert at that very
        # moment, through the next poll's first read (tests/db/test_work_wait.py pins the wake).
        answers = ("woken", "ready")
        assert sum(metric(url, f'mediator_work_polls_total{{answer="{a}"}}') for a in answers) == 1
        until(lambda: metric(url, "mediator_work_polls_held") == 1, "idle again, not held")
        assert node.stop(timeout=60) == 0
        assert metric(url, 'mediator_work_polls_total{answer="gone"}') == 1  # given up, not waited
        assert "stopped" in "".join(node.output)
    finally:
        node.stop()
        assert server.process.stop() == 0
