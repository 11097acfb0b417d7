"""A real ``enode`` process against a real server when a result cannot be delivered (issue 11 §3).

Once, a step printing a NUL byte made every result POST answer 500; ``enode`` kept the result and
retried forever while its adverts renewed the lease, so the run stayed RUNNING and the queue behind
it QUEUED; and it ignored SIGTERM and SIGINT. Now:

* the log is escaped before it is sent (NUL → ``\\x00``), so such output reaches the record;
* a 4xx answer to a result is final: the log is kept in a file on the node and the step is
  reported ``fail`` with a reason the server can take;
* a stop is always honoured: after ``--stop-grace`` seconds of a server that does not answer, or
  at once on a second signal, with the undelivered result kept on the node.

The server is the real app in uvicorn on a loopback port (a small body limit stands in for a
server that refuses a result); the node is ``python -m mediator.enode.main``. Tests wait on the
node's log lines and on the database's state, polled with a deadline — never a sleep.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from mediator import Config, Mediator
from mediator.api import create_app
from tests.unit.test_enode_main import Enode

pytestmark = [pytest.mark.db, pytest.mark.e2e]


@pytest.fixture
def med(dsn: str, tmp_path: Any) -> Iterator[Mediator]:
    # Adverts every 40 s: nothing in these tests depends on a heartbeat landing.
    config = Config(advert_ttl_seconds=120.0, lease_ttl_seconds=300.0)
    m = Mediator.connect(dsn, config=config, records_root=str(tmp_path / "records"))
    yield m
    m.close()


class App:
    """The real app in a uvicorn thread; :meth:`stop` takes it away under a running node."""

    def __init__(self, med: Mediator, max_body: int) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        app = create_app(med, max_body=max_body)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture
def serve(med: Mediator) -> Iterator[Callable[..., App]]:
    apps: list[App] = []

    def start(max_body: int = 1 << 20) -> App:
        apps.append(App(med, max_body))
        return apps[-1]

    yield start
    for app in apps:
        if app.thread.is_alive():
            app.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Callable[..., Enode]]:
    caps = tmp_path / "caps.json"
    caps.write_text(json.dumps({"board": "x"}))
    started: list[Enode] = []

    def start(url: str, *extra: str) -> Enode:
        n = Enode(url, str(caps), "--poll", "0.1", "--keep-dir", str(tmp_path / "kept"), *extra)
        started.append(n)
        n.wait_for(r"advertised node n1")
        return n

    yield start
    for n in started:
        n.close()


def one_step(cmd: str) -> dict[str, Any]:
    return {"roles": {"dut": {"board": "x"}},
            "steps": [{"name": "out", "role": "dut", "with": {"cmd": cmd}}]}  # fmt: skip


def eventually(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.05)
    return value


def ended(med: Mediator, run_id: str) -> Callable[[], str | None]:
    def check() -> str | None:
        state = med.get_run(run_id).state
        return state if state in ("PASSED", "FAILED") else None

    return check


def test_a_step_printing_nul_passes_with_its_output_escaped(serve, node, med):
    app = serve()
    n = node(app.url)
    run_id = med.submit(one_step(r"printf 'a\000b'")).run.run_id
    assert eventually(ended(med, run_id)) == "PASSED"
    n.wait_for(rf"run {run_id} settled PASSED")
    log = eventually(lambda: med.records.read_file(run_id, "steps/0000-out.log"))
    assert log == rb"a\x00b"


def test_a_result_refused_for_good_fails_the_step_with_a_reason_and_keeps_the_log(
    serve, node, med, tmp_path
):
    # 2 KB bodies: the step's 100 KB output is refused (413) even cut to its last 4 KB.
    app = serve(max_body=2048)
    n = node(app.url)
    run_id = med.submit(one_step("head -c 100000 /dev/zero | tr '\\0' x; echo END")).run.run_id
    n.wait_for(rf"result of {run_id}/0 kept at ")
    assert eventually(ended(med, run_id)) == "FAILED"
    kept = tmp_path / "kept" / f"{run_id}-0-1.log"
    text = kept.read_text()
    assert text.startswith(f"# run {run_id} step 0 attempt 1: pass; the Mediator refused it")
    assert text.endswith("xxxxEND\n")
    assert kept.stat().st_mode & 0o077 == 0  # the node's own, like its other files
    log = eventually(lambda: med.records.read_file(run_id, "steps/0000-out.log")).decode()
    assert log.startswith("enode: the Mediator refused this step's result (413 body_too_large)")
    assert f"kept on node n1 at {kept}" in log


def test_sigterm_is_honoured_while_a_result_cannot_be_delivered(serve, node, med, tmp_path):
    go = tmp_path / "go"
    app = serve()
    n = node(app.url, "--stop-grace", "0.5")
    run_id = med.submit(one_step(f'while [ ! -e "{go}" ]; do sleep 0.02; done; echo done')).run
    n.wait_for(rf"run {run_id.run_id} step 0 \(out\) attempt 1: shell")
    app.stop()  # the Mediator goes away mid-step
    go.touch()
    n.wait_for(r"result failed: .* \(retrying\)")
    n.proc.send_signal(signal.SIGTERM)
    assert n.proc.wait(timeout=30) == 0
    kept = tmp_path / "kept" / f"{run_id.run_id}-0-1.log"
    assert kept.read_text().endswith("done\n")
    assert "node n1 stopped" in n.output[-1]


def test_a_second_signal_exits_at_once_even_while_retrying(serve, node, med, tmp_path):
    go = tmp_path / "go"
    app = serve()
    n = node(app.url)  # the default grace, 30 s: only the second signal ends it here
    run = med.submit(one_step(f'while [ ! -e "{go}" ]; do sleep 0.02; done; echo done')).run
    n.wait_for(rf"run {run.run_id} step 0 \(out\) attempt 1: shell")
    app.stop()
    go.touch()
    n.wait_for(r"result failed: .* \(retrying\)")
    n.proc.send_signal(signal.SIGTERM)
    n.wait_for(r"stopping: drain graceful")
    n.proc.send_signal(signal.SIGINT)
    n.wait_for(rf"result of {run.run_id}/0 kept at .*the node stopped before the Mediator took it")
    assert n.proc.wait(timeout=20) == 0
