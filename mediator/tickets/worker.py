"""``tickets worker``: claim the best candidate, run a command on it, record what happened.

tickets.md §5 (ours, filling what seed 001 leaves to "the worker" page): the command gets the
``.wip`` path in place of ``{path}``. While it runs, a thread writes ``heartbeat_at`` through the
held descriptor every ``heartbeat`` seconds. Exit 0 finishes the ticket (``.wip`` → ``.done``); the
declared "asked" exit code records the question, sets ``awaiting_answer_since`` and releases the
ticket to the queue, where it stays locked until an answer file exists; any other exit releases it
with the error appended to the progress log and ``failures`` counted, so after ``max_failures`` it
stops being dispatched and shows in the bell instead of burning sessions in a silent loop.

The command learns the rest from its environment: ``TICKET_PATH``, ``TICKET_HASH``,
``TICKET_SESSION_ID``, ``TICKET_QUESTION_FILE`` (write the question there before exiting with the
asked code) and, when the ticket has one, ``TICKET_ANSWER_FILE`` (the latest answer). The command
may append to the ticket file but must not replace it: finishing checks the inode (tickets.md §1).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from mediator.tickets.claim import Held, claim, finish, heartbeat, read, release, start_session
from mediator.tickets.files import MAX_TEXT_CHARS, NotATicketFile, open_regular, read_fd
from mediator.tickets.model import format_epoch, parse_count, with_log_line
from mediator.tickets.reclaim import DEFAULT_TTL, reclaim_stale
from mediator.tickets.rules import DEFAULT_MAX_FAILURES, candidates
from mediator.tickets.store import QueueDir, Snapshot, read_snapshot

log = logging.getLogger(__name__)

DEFAULT_ASKED_EXIT = 3
DEFAULT_HEARTBEAT = 60.0
_ERROR_TAIL = 400


def _read_question(path: Path) -> str:
    """The session's question: a regular file (never followed), at most ``MAX_TEXT_CHARS``."""
    try:
        fd = open_regular(path)
    except (FileNotFoundError, NotATicketFile):
        return ""
    try:
        data = read_fd(fd, MAX_TEXT_CHARS)
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace").strip()
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS] + " …(cut)"


class Outcome(StrEnum):
    """How one session ended."""

    DONE = "done"
    ASKED = "asked"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"  # the ticket was reclaimed while the session ran; its result is not recorded


@dataclass(frozen=True)
class WorkerConfig:
    """Settings of one worker process.

    Attributes:
        queue: The queue folder.
        command: The command; ``{path}`` and ``{hash}`` in any argument are replaced.
        asked_exit: The exit code that means "the session asked a person a question".
        heartbeat: Seconds between heartbeats (tickets.md §5: every minute).
        ttl: Seconds of silence after which the reclaimer frees a ``.wip`` (default 10 minutes).
        max_failures: Failed sessions after which a ticket is no longer dispatched.
        poll: Seconds to wait before looking again when there is nothing to do.
        exit_when_idle: Exit instead of waiting when no ticket is a candidate.
        max_tickets: Exit after this many sessions.
    """

    queue: QueueDir
    command: tuple[str, ...]
    asked_exit: int = DEFAULT_ASKED_EXIT
    heartbeat: float = DEFAULT_HEARTBEAT
    ttl: float = DEFAULT_TTL
    max_failures: int = DEFAULT_MAX_FAILURES
    poll: float = 2.0
    exit_when_idle: bool = False
    max_tickets: int | None = None


@dataclass(frozen=True)
class SessionResult:
    """One session: which ticket, which session id, how it ended and the command's exit code."""

    hash: str
    session_id: str
    outcome: Outcome
    exit_code: int


class Worker:
    """Runs sessions one after another until stopped, idle (if asked to) or at ``max_tickets``."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.stop = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None

    def run(self) -> list[SessionResult]:
        """The worker loop; returns the sessions it ran."""
        results: list[SessionResult] = []
        while not self.stop.is_set():
            result = self.step()
            if result is None:
                if self.config.exit_when_idle:
                    break
                self.stop.wait(self.config.poll)
                continue
            results.append(result)
            if self.config.max_tickets is not None and len(results) >= self.config.max_tickets:
                break
        return results

    def request_stop(self) -> None:
        """Stops after the current session, interrupting its command (signal-handler safe)."""
        self.stop.set()
        child = self._child
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGTERM)

    def step(self) -> SessionResult | None:
        """Reclaims dead sessions, then claims and runs the best candidate; None if none."""
        queue = self.config.queue
        reclaim_stale(queue, ttl=self.config.ttl)
        snapshot = read_snapshot(queue)
        for ticket in candidates(snapshot.judge(self.config.max_failures)):
            if self.stop.is_set():
                return None
            held = claim(queue, ticket.hash)
            if held is None:
                continue  # tickets.md §1: another worker won this one; try the next candidate
            if read(held).get_str("session_id"):
                # Someone typed a session_id after our listing: hand it back exactly as it is.
                release(held, read(held), keep_session=True)
                continue
            return self._session(held, snapshot)
        return None

    def _session(self, held: Held, snapshot: Snapshot) -> SessionResult:
        session_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        start_session(held, session_id, time.time())
        log.info("claimed %s as session %s", held.hash, session_id)
        with tempfile.TemporaryDirectory(prefix="ticket-session-") as scratch:
            question_file = Path(scratch) / "question"
            code, stderr = self._run_command(held, session_id, question_file, snapshot)
            question = _read_question(question_file)
        now = time.time()
        stamp = format_epoch(now)
        if code == 0:
            kept = finish(held, now=now, log=f"session {session_id} done")
            return self._result(held, session_id, Outcome.DONE if kept else Outcome.LOST, code)
        doc = read(held)
        if self.stop.is_set():
            doc = with_log_line(doc, stamp, f"session {session_id} interrupted: worker stopped")
            outcome = Outcome.STOPPED
        elif code == self.config.asked_exit:
            question = (
                question or "(the session asked but wrote no question to TICKET_QUESTION_FILE)"
            )
            doc = doc.set("awaiting_answer_since", stamp).set("question", question)
            doc = with_log_line(doc, stamp, f"session {session_id} asked: {question}")
            outcome = Outcome.ASKED
        else:
            error = f"exit {code}: {' '.join(stderr.split())[-_ERROR_TAIL:]}".rstrip(": ")
            doc = doc.set("failures", parse_count(doc.get_str("failures")) + 1)
            doc = doc.set("last_error", error)
            doc = with_log_line(doc, stamp, f"session {session_id} failed: {error}")
            outcome = Outcome.FAILED
        kept = release(held, doc)
        return self._result(held, session_id, outcome if kept else Outcome.LOST, code)

    def _run_command(
        self, held: Held, session_id: str, question_file: Path, snapshot: Snapshot
    ) -> tuple[int, str]:
        env = dict(os.environ)
        env.update(
            TICKET_PATH=str(held.path),
            TICKET_HASH=held.hash,
            TICKET_SESSION_ID=session_id,
            TICKET_QUESTION_FILE=str(question_file),
        )
        answers = sorted(
            (a for a in snapshot.answers if a.ticket == held.hash),
            key=lambda a: (a.answered_at is not None, a.answered_at, a.number),
        )
        if answers:
            env["TICKET_ANSWER_FILE"] = str(self.config.queue.root / answers[-1].file_name)
        argv = [
            arg.replace("{path}", str(held.path)).replace("{hash}", held.hash)
            for arg in self.config.command
        ]
        beating = threading.Event()
        beats = threading.Thread(target=self._beat, args=(held, beating), daemon=True)
        with tempfile.TemporaryFile() as errors:
            try:
                # A process group of its own, so stopping the worker stops the whole session.
                self._child = subprocess.Popen(argv, env=env, stderr=errors, start_new_session=True)
            except OSError as error:
                return 127, f"cannot start {argv[0]!r}: {error}"
            if self.stop.is_set():
                self.request_stop()
            beats.start()
            try:
                code = self._child.wait()
            finally:
                beating.set()
                beats.join()
                self._child = None
            errors.seek(0)
            stderr = errors.read().decode("utf-8", "replace")
        sys.stderr.write(stderr)
        return code, stderr

    def _beat(self, held: Held, done: threading.Event) -> None:
        while not done.wait(self.config.heartbeat):
            heartbeat(held, time.time())

    def _result(self, held: Held, session_id: str, outcome: Outcome, code: int) -> SessionResult:
        if outcome is Outcome.LOST:
            log.warning(
                "%s was reclaimed while session %s ran; result dropped", held.hash, session_id
            )
        else:
            log.info("%s: session %s %s (exit %s)", held.hash, session_id, outcome, code)
        return SessionResult(held.hash, session_id, outcome, code)
