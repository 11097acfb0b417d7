"""The ``enode`` program (docs/design.md §19): its arguments and capability files, and — with a real
``enode`` process against the real app — SIGTERM: drain gracefully, finish the current step and
run, exit 0; and an idle node leaves at once, not at its next poll.

The process tests wait on the daemon's own log lines (bounded, line by line from a pipe), never on
a sleep; the step that must outlast the signal waits for a file the test creates.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from mediator import Config, Mediator
from mediator.api import create_app
from mediator.enode import main as enode_main

# ---- arguments and files ----------------------------------------------------------------------


def test_capabilities_come_from_json_or_toml(tmp_path):
    (tmp_path / "c.toml").write_text('board = "x"\nram_gb = 8\nusb = true\n')
    (tmp_path / "c.json").write_text('{"board": "x", "ram_gb": 8, "usb": true}')
    want = {"board": "x", "ram_gb": 8, "usb": True}
    assert enode_main.read_capabilities(str(tmp_path / "c.toml")) == want
    assert enode_main.read_capabilities(str(tmp_path / "c.json")) == want


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("none.json", None, "enode: cannot read {path}: No such file or directory\n"),
        ("list.json", "[1, 2]", "enode: {path} must hold one object of capabilities, not list\n"),
        ("bad.toml", "board =", "enode: {path} is not valid TOML: Invalid value (at end of "
                                "document)\n"),
    ],
)  # fmt: skip
def test_a_caps_file_that_is_not_an_object_is_a_usage_error(tmp_path, capsys, name, text, message):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    assert enode_main.main(["--node-id", "n1", "--caps", str(path)]) == 2
    assert capsys.readouterr().err == message.format(path=path)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--caps", "c.json"],
        ["--node-id", "n1"],
        ["--node-id", "n1", "--caps", "c.json", "--drain", "sideways"],
        ["--node-id", "n1", "--caps", "c.json", "--poll", "0"],
    ],
)
def test_usage_errors_exit_2(argv, capsys):
    assert enode_main.main(argv) == 2
    assert "usage: enode" in capsys.readouterr().err


# ---- a real process ---------------------------------------------------------------------------

ADVERT_TTL = 120.0  # adverts every 40 s: an idle node that leaves promptly was not just adverting


@pytest.fixture
def med(dsn: str, tmp_path: Any) -> Iterator[Mediator]:
    config = Config(advert_ttl_seconds=ADVERT_TTL, lease_ttl_seconds=300.0)
    m = Mediator.connect(dsn, config=config, records_root=str(tmp_path / "records"))
    yield m
    m.close()


@pytest.fixture
def url(med: Mediator) -> Iterator[str]:
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(med), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


class Enode:
    """An ``enode`` child process whose log lines arrive on a queue."""

    def __init__(self, url: str, caps: str, *extra: str) -> None:
        argv = [sys.executable, "-m", "mediator.enode.main", "--url", url, "--node-id", "n1",
                "--caps", caps, *extra]  # fmt: skip
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.output: list[str] = []
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.output.append(line)
            self._lines.put(line)
        self._lines.put("")

    def wait_for(self, pattern: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line == "":
                raise AssertionError(f"enode exited: {''.join(self.output)}")
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(self.output)}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def caps(tmp_path: Any) -> str:
    path = tmp_path / "caps.json"
    path.write_text(json.dumps({"board": "x"}))
    return str(path)


@pytest.mark.db
@pytest.mark.e2e
def test_sigterm_finishes_the_current_step_and_run_then_exits_0(url, caps, med, tmp_path):
    go = tmp_path / "go"
    node = Enode(url, caps, "--poll", "0.2")
    try:
        node.wait_for(r"advertised node n1 \(drain '', advert ttl 120 s\)")
        wait_for_go = f'while [ ! -e "{go}" ]; do sleep 0.05; done; echo went'
        run_id = med.submit(
            {
                "roles": {"dut": {"board": "x"}},
                "steps": [
                    {"name": "hold", "role": "dut", "with": {"cmd": wait_for_go}},
                    {"name": "after", "role": "dut", "after": ["hold"], "with": {"cmd": "true"}},
                ],
            }
        ).run.run_id
        node.wait_for(rf"run {run_id} step 0 \(hold\) attempt 1: shell")
        node.proc.send_signal(signal.SIGTERM)
        node.wait_for(r"advertised node n1 \(drain 'graceful'")  # the heartbeat, mid-step
        assert med.list_nodes().nodes[0].drain == "graceful"
        assert med.get_run(run_id).steps[0].state == "CLAIMED"
        go.touch()
        assert node.proc.wait(timeout=20) == 0
    finally:
        node.close()
    run = med.get_run(run_id)
    assert (run.state, [s.state for s in run.steps]) == ("PASSED", ["PASSED", "PASSED"])
    assert "node n1 stopped" in node.output[-1]


@pytest.mark.db
@pytest.mark.e2e
def test_an_idle_node_leaves_at_once_on_sigterm(url, caps):
    node = Enode(url, caps, "--poll", "60")
    try:
        node.wait_for(r"advertised node n1")
        node.proc.send_signal(signal.SIGTERM)
        assert node.proc.wait(timeout=10) == 0
    finally:
        node.close()
    assert "node n1 stopped" in node.output[-1]


def test_the_module_runs_as_a_script():
    env = {**os.environ, "MEDIATOR_URL": "http://127.0.0.1:9"}
    done = subprocess.run(
        [sys.executable, "-m", "mediator.enode.main", "--help"],
        capture_output=True, text=True, env=env, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0
    assert "--drain-file PATH" in done.stdout


# ---- issue 15 §2: no abbreviations, every option says its default ------------------------------


def test_no_option_may_be_abbreviated_and_every_option_says_its_default(tmp_path, capsys):
    caps = tmp_path / "c.json"
    caps.write_text("{}")
    assert enode_main.main(["--node", "n1", "--caps", str(caps)]) == 2
    assert "the following arguments are required: --node-id" in capsys.readouterr().err
    parser = enode_main.build_parser()
    assert parser.allow_abbrev is False
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and "default" in action.help, action.dest
