"""The worker loop in-process, with tiny shell commands as sessions (tickets.md §5).

The same flows as real processes, with heartbeats, kills and signals, are in
tests/e2e/test_tickets_workers.py; here each outcome is one short, exact example.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from mediator.tickets.frontmatter import Document
from mediator.tickets.names import Lane
from mediator.tickets.store import QueueDir, create_ticket
from mediator.tickets.worker import Outcome, Worker, WorkerConfig


def run(queue: QueueDir, script: str, **options: Any) -> list[tuple[str, Outcome, int]]:
    """Runs a worker until idle; the session is ``sh -c SCRIPT`` with the ticket's path as $1."""
    command = ("sh", "-c", script, "session", "{path}")
    worker = Worker(replace(WorkerConfig(queue, command, exit_when_idle=True), **options))
    return [(r.hash, r.outcome, r.exit_code) for r in worker.run()]


def doc(queue: QueueDir, h: str, lane: Lane) -> Document:
    return Document.parse(queue.path(h, lane).read_text())


def test_sessions_run_best_first_and_exit_0_finishes(tmp_path: Path) -> None:
    queue = QueueDir(tmp_path)
    low = create_ticket(queue, "low", priority=2)
    high = create_ticket(queue, "high", priority=5)
    assert run(queue, 'echo "ran $TICKET_HASH" >> "$1"') == [
        (high, Outcome.DONE, 0),
        (low, Outcome.DONE, 0),
    ]
    assert f"ran {high}\n" in doc(queue, high, Lane.DONE).body


def test_the_asked_code_releases_the_ticket_with_its_question(tmp_path: Path) -> None:
    queue = QueueDir(tmp_path)
    h = create_ticket(queue, "asks")
    script = 'printf "Which colour?" > "$TICKET_QUESTION_FILE"; exit 42'
    assert run(queue, script, asked_exit=42) == [(h, Outcome.ASKED, 42)]
    asked = doc(queue, h, Lane.QUEUED)
    assert asked.get("question") == "Which colour?" and asked.get("session_id") is None
    assert run(queue, "exit 0") == []  # locked until an answer file exists


def test_failures_count_up_to_the_limit_then_the_ticket_rests(tmp_path: Path) -> None:
    queue = QueueDir(tmp_path)
    h = create_ticket(queue, "flaky")
    assert run(queue, "echo 'no space left' >&2; exit 7", max_failures=2) == [
        (h, Outcome.FAILED, 7),
        (h, Outcome.FAILED, 7),
    ]
    failed = doc(queue, h, Lane.QUEUED)
    assert (failed.get("failures"), failed.get("last_error")) == ("2", "exit 7: no space left")


def test_a_command_that_cannot_start_is_a_failure(tmp_path: Path) -> None:
    queue = QueueDir(tmp_path)
    h = create_ticket(queue, "typo in the command")
    worker = Worker(WorkerConfig(queue, ("/no/such/runner",), exit_when_idle=True, max_tickets=1))
    [result] = worker.run()
    assert (result.hash, result.outcome, result.exit_code) == (h, Outcome.FAILED, 127)
    assert "cannot start '/no/such/runner'" in (
        doc(queue, h, Lane.QUEUED).get_str("last_error") or ""
    )


def test_a_ticket_taken_away_during_the_session_is_lost_not_finished(tmp_path: Path) -> None:
    """Finishing checks the inode (tickets.md §1): a replaced .wip is not ours to finish."""
    queue = QueueDir(tmp_path)
    h = create_ticket(queue, "replaced")
    assert run(queue, 'cp "$1" "$1.copy"; mv "$1.copy" "$1"') == [(h, Outcome.LOST, 0)]
    assert os.listdir(tmp_path) == [f"{h}.wip.md"]


def test_a_stopped_worker_claims_nothing(tmp_path: Path) -> None:
    queue = QueueDir(tmp_path)
    create_ticket(queue, "waits")
    worker = Worker(WorkerConfig(queue, ("true",)))
    worker.request_stop()
    assert worker.run() == []
