"""The queue folder: reading it into a snapshot, and the few writes a person's tools make.

Everything here goes through the file system only (seed 001: the app reads files and draws them,
it never keeps state of its own). Writes that make a name appear use an exclusive create or a hard
link from a private temporary file, so a reader never mistakes a half-written file for a ticket
where hard links exist, and two writers can never both create the same name.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mediator.tickets.frontmatter import Document
from mediator.tickets.model import KIND_ANSWER, KIND_TICKET, Answer, Ticket, format_epoch
from mediator.tickets.names import (
    Lane,
    Suffixes,
    answer_name,
    new_hash,
    parse_name,
    private_name,
)
from mediator.tickets.rules import DEFAULT_MAX_FAILURES, Reason, Verdict, judge

# tickets.md §1: where the file system refuses hard links (FUSE/SMB mounts) these are the errors.
LINK_UNSUPPORTED = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})
NO_HARDLINKS_ENV = "TICKET_NO_HARDLINKS"
_LANE_RANK = {Lane.QUEUED: 0, Lane.IN_PROGRESS: 1, Lane.DONE: 2}


class Refused(Exception):
    """A person's request that the files do not allow (unknown ticket, nothing to answer, ...)."""


@dataclass(frozen=True)
class QueueDir:
    """A queue folder and how to read and claim in it.

    Attributes:
        root: The folder holding the ticket files.
        suffixes: The in-progress and done suffixes.
        hard_links: False forces the ``O_CREAT|O_EXCL`` fallback (``TICKET_NO_HARDLINKS=1``), as on
            a file system without hard links; True still falls back when ``os.link`` is refused.
    """

    root: Path
    suffixes: Suffixes = field(default_factory=Suffixes)
    hard_links: bool = True

    @classmethod
    def from_env(cls, root: str | Path, environ: Mapping[str, str] = os.environ) -> QueueDir:
        """The queue at ``root`` with suffixes and link mode from the environment.

        Raises:
            SuffixError: When ``TICKET_INPROGRESS`` / ``TICKET_DONE`` cannot be told apart.
        """
        forced = environ.get(NO_HARDLINKS_ENV, "").strip() not in ("", "0")
        return cls(Path(root), Suffixes.from_env(environ), hard_links=not forced)

    def path(self, ticket_hash: str, lane: Lane) -> Path:
        """Where ``ticket_hash`` lives while in ``lane``."""
        return self.root / self.suffixes.file_name(ticket_hash, lane)


@dataclass(frozen=True)
class Snapshot:
    """Every ticket (one row per hash) and answer file in the folder at one listing."""

    tickets: tuple[Ticket, ...]
    answers: tuple[Answer, ...]

    def judge(self, max_failures: int = DEFAULT_MAX_FAILURES) -> tuple[Verdict, ...]:
        """The rules' verdict on every ticket (see ``rules.judge``)."""
        return judge(self.tickets, self.answers, max_failures=max_failures)


def decode(data: bytes) -> str:
    """File bytes as text; undecodable bytes survive a decode/encode round trip unchanged."""
    return data.decode("utf-8", "surrogateescape")


def encode(text: str) -> bytes:
    """The inverse of ``decode``."""
    return text.encode("utf-8", "surrogateescape")


def read_snapshot(queue: QueueDir) -> Snapshot:
    """Lists and reads the folder; files that vanish mid-listing are simply not in the snapshot.

    While a claim or a release is between its two steps both ``<hash>.md`` and ``<hash>.wip.md``
    exist; the later lane wins, since that is where the ticket is going.
    """
    tickets: dict[str, Ticket] = {}
    answers: list[Answer] = []
    with os.scandir(queue.root) as entries:
        names = [entry.name for entry in entries]
    for name in names:
        parsed = parse_name(name, queue.suffixes)
        if parsed is None:
            continue
        try:
            with open(queue.root / name, "rb") as handle:
                data = handle.read()
                mtime = os.fstat(handle.fileno()).st_mtime
        except (FileNotFoundError, IsADirectoryError):
            continue
        doc = Document.parse(data.decode("utf-8", "replace"))
        if parsed.is_answer or doc.get_str("kind") == KIND_ANSWER:
            # tickets.md §5: pickers never treat answer files as tickets.
            number = parsed.answer_number or 0
            answers.append(Answer.from_document(number, name, doc, parsed.ticket_hash))
            continue
        assert parsed.lane is not None
        ticket = Ticket.from_document(parsed.ticket_hash, parsed.lane, name, doc, mtime)
        known = tickets.get(ticket.hash)
        if known is None or _LANE_RANK[ticket.lane] > _LANE_RANK[known.lane]:
            tickets[ticket.hash] = ticket
    return Snapshot(tuple(tickets.values()), tuple(answers))


def create_ticket(
    queue: QueueDir,
    title: str,
    *,
    priority: int = 3,
    deps: tuple[str, ...] = (),
    body: str = "",
    created: str | None = None,
) -> str:
    """Writes a new open ticket (``tickets new``) and returns its hash.

    Raises:
        Refused: When ``priority`` is outside 1–5.
    """
    if not 1 <= priority <= 5:
        raise Refused(f"priority must be 1–5 (5 most urgent), not {priority}")
    created = created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    while True:
        ticket_hash = new_hash(title, created)
        doc = (
            Document.parse("---\n---\n")
            .set("title", title)
            .set("priority", priority)
            .set("deps", list(deps))
            .set("created", created)
            .set("kind", KIND_TICKET)
            .with_body(body if not body or body.endswith("\n") else body + "\n")
        )
        if publish(queue, queue.path(ticket_hash, Lane.QUEUED), encode(doc.render())):
            return ticket_hash


def answer(queue: QueueDir, ticket_hash: str, text: str, by: str, *, now: float) -> Path:
    """Writes one ``kind: answer`` file for a ticket that waits for an answer; returns its path.

    Any of the board's three places and ``tickets answer`` call this; the file's existence is what
    unlocks the ticket (seed 001, "그 파일이 태어나는 순간 잠금이 풀리고").

    Raises:
        Refused: When the ticket is unknown, not open, not waiting, or ``text`` is blank.
    """
    if not text.strip():
        raise Refused("an answer needs some text")
    snapshot = read_snapshot(queue)
    if Reason.ANSWER_WAITING not in find(snapshot, ticket_hash).reasons:
        raise Refused(f"ticket {ticket_hash} is not waiting for an answer")
    doc = (
        Document.parse("---\n---\n")
        .set("kind", KIND_ANSWER)
        .set("ticket", ticket_hash)
        .set("answered_at", format_epoch(now))
        .set("answered_by", by or "someone")
        .with_body(text.rstrip("\n") + "\n")
    )
    existing = [a.number for a in snapshot.answers if a.ticket == ticket_hash]
    number = max(existing, default=0) + 1
    while not publish(queue, queue.root / answer_name(ticket_hash, number), encode(doc.render())):
        number += 1  # another answer took this number a moment ago; the next one is ours
    return queue.root / answer_name(ticket_hash, number)


def unassign(queue: QueueDir, ticket_hash: str) -> None:
    """Removes ``session_id`` – and nothing else – from an open ticket (tickets.md §4.4).

    Raises:
        Refused: When the ticket is not open or carries no ``session_id``.
    """
    _edit_open(queue, ticket_hash, "session_id", lambda doc: doc.remove("session_id"))


def clear_failures(queue: QueueDir, ticket_hash: str) -> None:
    """Removes ``failures`` and ``last_error`` so a failed-out ticket is dispatched again (ours).

    Raises:
        Refused: When the ticket is not open or has no failures recorded.
    """
    _edit_open(queue, ticket_hash, "failures", lambda doc: doc.remove("failures", "last_error"))


def find(snapshot: Snapshot, ticket_hash: str) -> Verdict:
    """The verdict on one ticket.

    Raises:
        Refused: When no such ticket exists.
    """
    for verdict in snapshot.judge():
        if verdict.ticket.hash == ticket_hash:
            return verdict
    raise Refused(f"no ticket {ticket_hash}")


def publish(queue: QueueDir, target: Path, data: bytes) -> bool:
    """Makes ``target`` appear holding ``data``; False when the name already exists.

    With hard links the content is written to a private file first and linked into place, so the
    name never shows a half-written file; without them, an exclusive create then the write.
    """
    if queue.hard_links:
        temporary = queue.root / private_name(target.name, "publish")
        write_exclusive(temporary, data)
        try:
            os.link(temporary, target)
            return True
        except FileExistsError:
            return False
        except OSError as error:
            if error.errno not in LINK_UNSUPPORTED:
                raise
        finally:
            os.unlink(temporary)
    try:
        write_exclusive(target, data)
    except FileExistsError:
        return False
    return True


def write_exclusive(path: Path, data: bytes) -> None:
    """Creates ``path`` with ``O_CREAT|O_EXCL`` and writes and fsyncs ``data``.

    Raises:
        FileExistsError: When ``path`` exists.
    """
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)


def write_all(fd: int, data: bytes, offset: int = 0) -> None:
    """``pwrite`` until every byte is written."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _edit_open(
    queue: QueueDir, ticket_hash: str, needed: str, edit: Callable[[Document], Document]
) -> None:
    path = queue.path(ticket_hash, Lane.QUEUED)
    try:
        before = os.stat(path)
        doc = Document.parse(decode(path.read_bytes()))
    except FileNotFoundError:
        raise Refused(f"no open ticket {ticket_hash}") from None
    if doc.get(needed) is None:
        raise Refused(f"ticket {ticket_hash} has no {needed}")
    temporary = queue.root / private_name(ticket_hash, "edit")
    write_exclusive(temporary, encode(edit(doc).render()))
    try:
        now = os.stat(path)
    except FileNotFoundError:
        os.unlink(temporary)
        raise Refused(f"ticket {ticket_hash} changed while it was edited; try again") from None
    if (now.st_dev, now.st_ino, now.st_mtime_ns) != (
        before.st_dev,
        before.st_ino,
        before.st_mtime_ns,
    ):
        os.unlink(temporary)
        raise Refused(f"ticket {ticket_hash} changed while it was edited; try again")
    os.replace(temporary, path)
