"""The rows of the ticket queue and the frontmatter field table.

A ``Ticket`` or ``Answer`` is what one file says, read once into a frozen dataclass so the pure
rules (``rules``, ``view``) work on plain data (style: rows are frozen dataclasses). ``FIELDS`` is
the table of tickets.md §2 – who writes each key – and is what the board's help shows, so the docs
and the app cannot drift apart."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from mediator.tickets.frontmatter import Document
from mediator.tickets.names import Lane

DEFAULT_PRIORITY = 3
KIND_TICKET = "ticket"
KIND_ANSWER = "answer"
# tickets.md §2: the keys only the worker (engine) writes; a claim adds them, a release strips them.
SESSION_KEYS = ("session_id", "claimed_at", "heartbeat_at")
LOG_HEADING = "## Progress log"


@dataclass(frozen=True)
class Field:
    """One row of the frontmatter table (tickets.md §2)."""

    keys: tuple[str, ...]
    writer: str
    meaning: str


FIELDS: tuple[Field, ...] = (
    Field(
        ("title", "priority", "deps", "created"),
        "a person (tickets new)",
        "the request; priority 1–5, 5 most urgent; deps lists the hashes that must be done first",
    ),
    Field(("kind",), "app", "ticket or answer"),
    Field(SESSION_KEYS, "the worker (engine)", "which session holds the ticket"),
    Field(
        ("awaiting_answer_since", "question"),
        "the worker",
        "the session asked a person and let go; no worker takes the ticket until an answer exists",
    ),
    Field(
        ("failures", "last_error"),
        "the worker and the reclaimer (ours)",
        "failed sessions so far; at the limit (default 3) the ticket is listed in the bell",
    ),
    Field(
        ("ticket", "answered_at", "answered_by"),
        "app, on kind: answer files",
        "the answer to a ticket's question",
    ),
)
PERSON_KEYS = FIELDS[0].keys


@dataclass(frozen=True)
class Ticket:
    """One ticket file as the pure rules see it.

    Attributes:
        hash: The ticket's name without suffixes; runs for it carry it as ``work_id``.
        lane: From the file-name suffix (seed 001: the app reads state, never makes it).
        file_name: The file it was read from.
        title: The request's title (the first body line when there is no ``title``).
        priority: 1–5, 5 most urgent; missing or invalid reads as 3.
        deps: Hashes that must be done before this ticket is a candidate.
        created: As written (ISO 8601); orders tickets of equal priority.
        session_id: Engine key; on an open file it is the "assigned" accident (tickets.md §4.4).
        heartbeat_at: Last heartbeat of the holding session.
        awaiting_answer_since: The session asked a person at this time and let go.
        question: What it asked.
        failures: Failed sessions so far (ours, tickets.md §5).
        last_error: The last failure's message.
        mtime: File modification time (orders the done lane, newest first).
    """

    hash: str
    lane: Lane
    file_name: str
    title: str = ""
    priority: int = DEFAULT_PRIORITY
    deps: tuple[str, ...] = ()
    created: str | None = None
    session_id: str | None = None
    heartbeat_at: datetime | None = None
    awaiting_answer_since: datetime | None = None
    question: str | None = None
    failures: int = 0
    last_error: str | None = None
    mtime: float = 0.0

    @classmethod
    def from_document(
        cls, ticket_hash: str, lane: Lane, file_name: str, doc: Document, mtime: float = 0.0
    ) -> Ticket:
        """Reads the keys of tickets.md §2 from a parsed file, tolerating whatever people type."""
        title = doc.get_str("title") or _first_line(doc.body) or ticket_hash
        return cls(
            hash=ticket_hash,
            lane=lane,
            file_name=file_name,
            title=title,
            priority=_priority(doc.get_str("priority")),
            deps=tuple(dict.fromkeys(d for d in doc.get_list("deps") if d)),
            created=doc.get_str("created"),
            session_id=doc.get_str("session_id"),
            heartbeat_at=parse_time(doc.get_str("heartbeat_at")),
            awaiting_answer_since=parse_time(doc.get_str("awaiting_answer_since")),
            question=doc.get_str("question"),
            failures=parse_count(doc.get_str("failures")),
            last_error=doc.get_str("last_error"),
            mtime=mtime,
        )


@dataclass(frozen=True)
class Answer:
    """A ``kind: answer`` file: a person's answer to a ticket's question (tickets.md §3, §5)."""

    ticket: str
    number: int
    file_name: str
    answered_at: datetime | None
    answered_by: str | None
    text: str

    @classmethod
    def from_document(cls, number: int, file_name: str, doc: Document, ticket: str) -> Answer:
        """Reads an answer file; ``ticket`` comes from the name when the key is missing."""
        return cls(
            ticket=doc.get_str("ticket") or ticket,
            number=number,
            file_name=file_name,
            answered_at=parse_time(doc.get_str("answered_at")),
            answered_by=doc.get_str("answered_by"),
            text=doc.body.strip(),
        )


def format_time(moment: datetime) -> str:
    """Engine timestamps: UTC, microseconds, fixed width, so a heartbeat rewrites few bytes."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def format_epoch(seconds: float) -> str:
    """``format_time`` of a ``time.time()`` value."""
    return format_time(datetime.fromtimestamp(seconds, UTC))


def parse_time(text: str | None) -> datetime | None:
    """An ISO 8601 timestamp as an aware datetime (naive means UTC); None when unreadable."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def with_log_line(doc: Document, when: str, line: str) -> Document:
    """Appends ``- <when> <line>`` to the body's progress log, creating the heading if needed.

    The progress log is the body section the ticket detail shows (seed 001, "진행 기록 상자");
    the worker appends failures there (tickets.md §5).
    """
    body = doc.body
    if LOG_HEADING not in body:
        body = body.rstrip("\n") + ("\n\n" if body.strip() else "") + LOG_HEADING + "\n\n"
    elif not body.endswith("\n"):
        body += "\n"
    flat = " ".join(line.split())
    return doc.with_body(f"{body}- {when} {flat}\n")


def _first_line(body: str) -> str:
    for line in body.splitlines():
        if line.strip():
            return line.strip().lstrip("#").strip()
    return ""


def _priority(text: str | None) -> int:
    try:
        value = int(text) if text is not None else DEFAULT_PRIORITY
    except ValueError:
        return DEFAULT_PRIORITY
    return value if 1 <= value <= 5 else DEFAULT_PRIORITY


def parse_count(text: str | None) -> int:
    """A non-negative count as written in the file; anything unreadable counts as 0."""
    try:
        return max(0, int(text)) if text is not None else 0
    except ValueError:
        return 0


def elapsed_days(since: datetime, now: float) -> int:
    """Whole days from ``since`` to ``now`` (epoch seconds), never negative."""
    return max(0, math.floor((now - since.timestamp()) / 86400))
