"""``scripts/demo``: one Ctrl-C stops everything (issue 15 §6).

The demo is started the way a person starts it — its own session, so a signal to its process
group is what a terminal's Ctrl-C is — with a throw-away ``--var`` and a free port. Once it says
it is running, every process under it (the server, its PostgreSQL and backends, three enodes) is
listed; then one SIGINT goes to the group, and all of them must be gone within a deadline, each
having stopped by itself (the supervisor reports any process it had to kill).

On the old shell script the enodes, told to drain by the same Ctrl-C that stopped the server,
kept retrying adverts and results to a server that was gone until a second Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
START_DEADLINE_S = 240.0  # initdb and three daemons on a busy two-core machine
STOP_DEADLINE_S = 90.0


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a live process, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0], int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """Every process below ``root``: pid → start time (so a reused pid is not mistaken)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            table[int(entry.name)] = st
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _state, start) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                frontier.append(pid)
    return found


def _alive(pids: dict[int, int]) -> list[int]:
    out = []
    for pid, start in pids.items():
        st = _stat(pid)
        if st is not None and st[2] == start and st[1] != "Z":
            out.append(pid)
    return out


@pytest.fixture
def var() -> Iterator[Path]:
    # Not tmp_path: the embedded PostgreSQL runs as an unprivileged user, which must be able to
    # enter the folder (pytest's tmp_path lives inside a root-only one).
    path = Path(tempfile.mkdtemp(prefix="mediator-demo-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_one_ctrl_c_stops_the_server_and_every_node(var):
    """issue 15 §6: after one SIGINT to the demo's process group, no process of it is left."""
    demo = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--port", "0", "--var", str(var)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as in a terminal
    )
    output: list[str] = []
    pump = threading.Thread(target=lambda: output.extend(demo.stdout or ()), daemon=True)
    pump.start()
    try:
        end = time.monotonic() + START_DEADLINE_S
        while not any("Ctrl-C stops" in line for line in output):
            assert demo.poll() is None and time.monotonic() < end, "".join(output)
            time.sleep(0.2)  # polling a condition with a deadline
        assert "The demo is running." in "".join(output), "".join(output)
        assert "201 · RUNNING" in "".join(output) and "202 · QUEUED" in "".join(output)

        children = _descendants(demo.pid)
        names = {Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ") for p in children}
        assert sum(b"/enode " in n for n in names) == 3, names
        assert any(b"/mediator " in n for n in names) and any(b"postgres" in n for n in names)

        os.killpg(demo.pid, signal.SIGINT)  # one Ctrl-C

        end = time.monotonic() + STOP_DEADLINE_S
        while _alive(children) and time.monotonic() < end:
            time.sleep(0.2)  # polling a condition with a deadline
        left = _alive(children)
        demo.wait(timeout=STOP_DEADLINE_S)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
        pump.join(timeout=STOP_DEADLINE_S)
        if demo.stdout is not None:
            demo.stdout.close()
    text = "".join(output)
    assert left == [], f"still running after one Ctrl-C: {left}\n{text}"
    assert demo.returncode == 0, text
    assert "demo: stopped" in text and "demo: killed" not in text, text
    logs = var / "demo"
    for node in ("dut1", "dut2", "bench"):
        assert f"node {node} stopped" in (logs / f"{node}.log").read_text()
    assert "mediator: stopped" in (logs / "mediator.log").read_text()
