"""``tickets worker`` as real processes: sessions, heartbeats, questions, failures, dead sessions
and the four reasons an open ticket is not dispatched (seed 001; tickets.md §4–5).

Each test runs the installed code as ``python -m mediator.tickets worker ... -- CMD {path}`` with a
small Python script as the session's command. Waits are bounded: subprocess timeouts, and
``wait_for`` on a file-system condition for the two tests that must act while a session runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import mediator.tickets
from mediator.tickets.frontmatter import Document
from mediator.tickets.names import Lane
from mediator.tickets.store import QueueDir, create_ticket

pytestmark = pytest.mark.e2e

REPO = Path(mediator.tickets.__file__).resolve().parents[2]
TIMEOUT = 30.0


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


TICKETS = [sys.executable, "-m", "mediator.tickets"]


def tickets(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs the ``tickets`` command to completion (bounded)."""
    command = [*TICKETS, *args]
    done = subprocess.run(command, env=env(), capture_output=True, text=True, timeout=TIMEOUT)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def script(folder: Path, name: str, body: str) -> str:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def doc(path: Path) -> Document:
    return Document.parse(path.read_text())


def edit(path: Path, **keys: str | int) -> None:
    updated = doc(path)
    for key, value in keys.items():
        updated = updated.set(key, value)
    path.write_text(updated.render())


def wait_for(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    """Polls a file-system condition until it holds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def queue(tmp_path: Path) -> QueueDir:
    (tmp_path / "q").mkdir()
    return QueueDir(tmp_path / "q")


def test_exit_0_finishes_the_ticket_and_the_command_gets_the_wip_path(
    queue: QueueDir, tmp_path: Path
) -> None:
    h = create_ticket(queue, "Say hello")
    command = script(
        tmp_path,
        "hello.py",
        """
        import os, sys
        path = sys.argv[1]
        assert path == os.environ["TICKET_PATH"] and path.endswith(".wip.md"), path
        with open(path, "a") as ticket:  # a session may append to its own progress
            ticket.write(f"hello from {os.environ['TICKET_SESSION_ID']}\\n")
        """,
    )
    tickets(
        "worker",
        "--queue",
        str(queue.root),
        "--exit-when-idle",
        "--",
        sys.executable,
        command,
        "{path}",
    )
    assert os.listdir(queue.root) == [f"{h}.done.md"]
    done = doc(queue.path(h, Lane.DONE))
    session = done.get_str("session_id")
    assert session and f"hello from {session}\n" in done.body
    assert done.body.rstrip().endswith(f"session {session} done")


def test_heartbeats_move_while_the_command_runs(queue: QueueDir, tmp_path: Path) -> None:
    h = create_ticket(queue, "Long job")
    command = script(
        tmp_path,
        "wait_for_beats.py",
        """
        import sys, time
        path = sys.argv[1]
        def beat():
            for line in open(path):
                if line.startswith("heartbeat_at:"):
                    return line
        seen = {beat()}
        deadline = time.monotonic() + 20
        while len(seen) < 3:  # two heartbeats after the claim's own timestamp
            if time.monotonic() > deadline:
                sys.exit("no heartbeats")
            time.sleep(0.01)
            seen.add(beat())
        """,
    )
    tickets(
        "worker",
        "--queue",
        str(queue.root),
        "--exit-when-idle",
        "--heartbeat",
        "0.05",
        "--",
        sys.executable,
        command,
        "{path}",
    )
    done = doc(queue.path(h, Lane.DONE))
    assert (done.get_str("heartbeat_at") or "") > (done.get_str("claimed_at") or "~")


def test_the_asked_exit_code_locks_the_ticket_until_an_answer_file_exists(
    queue: QueueDir, tmp_path: Path
) -> None:
    """Seed 001, 답변 대기: no worker takes it until the answer exists, then it runs again."""
    h = create_ticket(queue, "Paint the shed")
    command = script(
        tmp_path,
        "asks.py",
        """
        import os, sys
        answer = os.environ.get("TICKET_ANSWER_FILE")
        if answer is None:
            open(os.environ["TICKET_QUESTION_FILE"], "w").write("Which colour?")
            sys.exit(3)
        with open(sys.argv[1], "a") as ticket:
            ticket.write("painted " + open(answer).read().split("---")[-1].strip() + "\\n")
        """,
    )
    worker = (
        "worker",
        "--queue",
        str(queue.root),
        "--exit-when-idle",
        "--",
        sys.executable,
        command,
        "{path}",
    )

    tickets(*worker)
    asked = doc(queue.path(h, Lane.QUEUED))
    assert asked.get("question") == "Which colour?"
    assert asked.get("awaiting_answer_since") is not None and asked.get("session_id") is None
    assert "asked: Which colour?" in asked.body
    listing = tickets("list", "--queue", str(queue.root)).stdout
    assert "answer waiting" in listing and "Paint the shed: Which colour? (0d)" in listing

    locked = queue.path(h, Lane.QUEUED).read_bytes()
    tickets(*worker)  # nothing to do: the only ticket is locked
    assert queue.path(h, Lane.QUEUED).read_bytes() == locked

    assert tickets("answer", "--queue", str(queue.root), h, "blue").stdout == f"{h}.answer.1.md\n"
    tickets(*worker)
    assert "painted blue\n" in doc(queue.path(h, Lane.DONE)).body


def test_a_failing_session_is_retried_then_listed_in_the_bell(
    queue: QueueDir, tmp_path: Path
) -> None:
    h = create_ticket(queue, "Flaky")
    boom = script(tmp_path, "boom.py", "import sys\nsys.exit('boom: disk full')\n")
    tickets(
        "worker",
        "--queue",
        str(queue.root),
        "--exit-when-idle",
        "--",
        sys.executable,
        boom,
        "{path}",
    )
    failed = doc(queue.path(h, Lane.QUEUED))
    assert (failed.get("failures"), failed.get("last_error")) == ("3", "exit 1: boom: disk full")
    assert failed.body.count("failed: exit 1: boom: disk full") == 3
    assert failed.get("session_id") is None
    listing = tickets("list", "--queue", str(queue.root)).stdout
    assert f"  {h}  Flaky: failed 3×: exit 1: boom: disk full" in listing

    tickets("retry", "--queue", str(queue.root), h)
    ok = script(tmp_path, "ok.py", "")
    tickets("worker", "--queue", str(queue.root), "--exit-when-idle", "--", sys.executable, ok)
    assert os.listdir(queue.root) == [f"{h}.done.md"]


def blocking_session(tmp_path: Path) -> tuple[str, Path]:
    """A command that records its pid, then hangs like a stuck session."""
    marker = tmp_path / "session.pid"
    command = script(
        tmp_path,
        "hang.py",
        f"""
        import os, time
        open({str(marker)!r} + ".tmp", "w").write(str(os.getpid()))
        os.rename({str(marker)!r} + ".tmp", {str(marker)!r})
        time.sleep(120)
        """,
    )
    return command, marker


def test_a_killed_worker_is_reclaimed_and_finished_by_another(
    queue: QueueDir, tmp_path: Path
) -> None:
    """tickets.md §5: the dead session's .wip goes back to the queue once its TTL has passed."""
    h = create_ticket(queue, "Survives a crash")
    command, marker = blocking_session(tmp_path)
    first = subprocess.Popen(
        [
            *TICKETS,
            "worker",
            "--queue",
            str(queue.root),
            "--heartbeat",
            "0.1",
            "--",
            sys.executable,
            command,
        ],
        env=env(),
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(marker.exists, "the first session to start")
        first.kill()  # SIGKILL: no chance to release anything
        first.wait(timeout=TIMEOUT)
    finally:
        os.kill(int(marker.read_text()), signal.SIGKILL)
    dead = doc(queue.path(h, Lane.IN_PROGRESS)).get_str("session_id")

    ok = script(tmp_path, "ok.py", "")
    tickets(
        "worker",
        "--queue",
        str(queue.root),
        "--ttl",
        "0.3",
        "--poll",
        "0.05",
        "--max-tickets",
        "1",
        "--",
        sys.executable,
        ok,
    )
    done = doc(queue.path(h, Lane.DONE))
    assert done.get_str("session_id") not in (None, dead)
    assert done.get("failures") == "1"
    assert (
        done.get(
            "last_error",
        )
        is not None
    )
    assert f"session {dead} stopped heartbeating" in done.body


def test_stopping_a_worker_releases_its_ticket_without_counting_a_failure(
    queue: QueueDir, tmp_path: Path
) -> None:
    h = create_ticket(queue, "Interrupted")
    command, marker = blocking_session(tmp_path)
    worker = subprocess.Popen(
        [*TICKETS, "worker", "--queue", str(queue.root), "--", sys.executable, command],
        env=env(),
        stderr=subprocess.DEVNULL,
    )
    wait_for(marker.exists, "the session to start")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=TIMEOUT) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(int(marker.read_text()), 0)  # the session's command was stopped too
    released = doc(queue.path(h, Lane.QUEUED))
    assert released.get("failures") is None and released.get("session_id") is None
    assert "interrupted: worker stopped" in released.body


def test_six_workers_leave_every_undispatched_ticket_alone_until_its_reason_clears(
    queue: QueueDir, tmp_path: Path
) -> None:
    """The four reasons of seed 001 (and our two), with six real workers racing over the queue."""

    def new(title: str, **fields: object) -> str:
        return create_ticket(queue, title, **fields)  # type: ignore[arg-type]

    asks = new("asks")  # 2. answer waiting
    edit(queue.path(asks, Lane.QUEUED), awaiting_answer_since="2025-03-01T12:00:00Z", question="?")
    after_asks = new("after asks", deps=(asks,))  # 1. deps waiting
    copied = new("copied")  # 4. assigned
    edit(queue.path(copied, Lane.QUEUED), session_id="typed-by-hand")
    low = new("low", priority=1)  # 3. the priority-1 gate, held by a live session elsewhere
    elsewhere = new("running elsewhere")
    os.rename(queue.path(elsewhere, Lane.QUEUED), queue.path(elsewhere, Lane.IN_PROGRESS))
    edit(
        queue.path(elsewhere, Lane.IN_PROGRESS),
        session_id="other-host-1",
        heartbeat_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    lifted = new("low but needed", priority=1)  # inherits 5: not gated
    urgent = new("urgent", priority=5, deps=(lifted,))
    flaky = new("flaky")  # ours: failed out
    edit(queue.path(flaky, Lane.QUEUED), failures=3, last_error="exit 1")
    typo = new("typo", deps=("nosuch",))  # ours: deps ?
    normal = [new(f"normal {n}") for n in range(4)]
    held_back = [asks, after_asks, copied, low, flaky, typo]
    before = {h: queue.path(h, Lane.QUEUED).read_bytes() for h in held_back}

    ran = tmp_path / "ran.log"
    record = script(
        tmp_path,
        "record.py",
        f"""
        import os
        with open({str(ran)!r}, "a") as log:
            log.write(os.environ["TICKET_HASH"] + "\\n")
        """,
    )
    worker = [
        *TICKETS,
        "worker",
        "--queue",
        str(queue.root),
        "--exit-when-idle",
        "--",
        sys.executable,
        record,
    ]
    six = [subprocess.Popen(worker, env=env(), stderr=subprocess.DEVNULL) for _ in range(6)]
    assert [w.wait(timeout=TIMEOUT) for w in six] == [0] * 6

    sessions = ran.read_text().split()
    assert sorted(sessions) == sorted([lifted, urgent, *normal])  # each ran exactly once
    assert sessions.index(lifted) < sessions.index(urgent)
    assert {h: queue.path(h, Lane.QUEUED).read_bytes() for h in held_back} == before
    assert queue.path(elsewhere, Lane.IN_PROGRESS).exists()

    # Every reason clears: answer, unassign, retry, the other session finishes; typo stays.
    tickets("answer", "--queue", str(queue.root), asks, "yes")
    tickets("unassign", "--queue", str(queue.root), copied)
    tickets("retry", "--queue", str(queue.root), flaky)
    os.rename(queue.path(elsewhere, Lane.IN_PROGRESS), queue.path(elsewhere, Lane.DONE))
    ran.unlink()
    subprocess.run(worker, env=env(), stderr=subprocess.DEVNULL, timeout=TIMEOUT, check=True)
    sessions = ran.read_text().split()
    assert sorted(sessions) == sorted([asks, after_asks, copied, low, flaky])
    assert sessions.index(asks) < sessions.index(after_asks)
    assert sessions[-1] == low  # priority 1 comes last
    assert queue.path(typo, Lane.QUEUED).read_bytes() == before[typo]
