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

from mediator.tickets.files import (
    BAD_NAME,
    InvalidFile,
    NotATicketFile,
    check_hash,
    check_text,
    content_problem,
    is_hash,
    link_problem,
    open_regular,
    read_fd,
    read_regular,
)
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
        """Where ``ticket_hash`` lives while in ``lane``: always a plain name inside ``root``.

        Raises:
            BadName: When ``ticket_hash`` is not a ticket hash (``..``, a path, ...; issue 12 §8).
        """
        return self.root / self.suffixes.file_name(check_hash(ticket_hash), lane)


@dataclass(frozen=True)
class Snapshot:
    """Every ticket (one row per hash), answer file and invalid file in the folder at one listing.

    ``invalid`` lists the files whose names say "ticket" or "answer" but which the queue refuses
    (symlinks, non-regular, empty, binary, unterminated frontmatter, ...; see ``files``): they are
    shown with their reason and never reach the rules, so no worker is ever given one.
    """

    tickets: tuple[Ticket, ...]
    answers: tuple[Answer, ...]
    invalid: tuple[InvalidFile, ...] = ()

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
    exist; the later lane wins, since that is where the ticket is going. No symlink is followed
    and no file is read past ``MAX_TICKET_BYTES`` (issue 12 §8; docs/security.md).
    """
    tickets: dict[str, Ticket] = {}
    answers: list[Answer] = []
    invalid: list[InvalidFile] = []
    with os.scandir(queue.root) as entries:
        names = [entry.name for entry in entries]
    for name in sorted(names):
        parsed = parse_name(name, queue.suffixes)
        if parsed is None:
            continue
        if not is_hash(parsed.ticket_hash):
            invalid.append(InvalidFile(name, None, BAD_NAME))
            continue
        try:
            data, status = read_regular(queue.root / name)
        except NotATicketFile as error:
            invalid.append(InvalidFile(name, parsed.ticket_hash, error.reason))
            continue
        except FileNotFoundError:
            continue
        problem = content_problem(data)
        if problem is None and parsed.lane is Lane.QUEUED and not parsed.is_answer:
            problem = _foreign_link(queue, parsed.ticket_hash, status)
        if problem is not None:
            invalid.append(InvalidFile(name, parsed.ticket_hash, problem))
            continue
        doc = Document.parse(decode(data))
        if parsed.is_answer or doc.get_str("kind") == KIND_ANSWER:
            # tickets.md §5: pickers never treat answer files as tickets.
            number = parsed.answer_number or 0
            answers.append(Answer.from_document(number, name, doc, parsed.ticket_hash))
            continue
        assert parsed.lane is not None
        ticket = Ticket.from_document(parsed.ticket_hash, parsed.lane, name, doc, status.st_mtime)
        known = tickets.get(ticket.hash)
        if known is None or _LANE_RANK[ticket.lane] > _LANE_RANK[known.lane]:
            tickets[ticket.hash] = ticket
    return Snapshot(tuple(tickets.values()), tuple(answers), tuple(invalid))


def _foreign_link(queue: QueueDir, ticket_hash: str, status: os.stat_result) -> str | None:
    """A second hard link on an open ticket: a claim in flight, or a planted link to elsewhere.

    A claim links ``<hash>.md`` to ``<hash>.wip.md`` before removing the original, so for an
    instant the open file has two names – the in-progress one, which is no problem.
    """
    problem = link_problem(status)
    if problem is None:
        return None
    try:
        wip = os.lstat(queue.path(ticket_hash, Lane.IN_PROGRESS))
    except FileNotFoundError:
        return problem
    return None if (wip.st_dev, wip.st_ino) == (status.st_dev, status.st_ino) else problem


def read_ticket_bytes(queue: QueueDir, file_name: str) -> bytes:
    """The content of one file in the queue, read without following a symlink.

    Raises:
        NotATicketFile: When the name is (now) a symlink, not a regular file, or malformed.
        FileNotFoundError: When it is gone.
    """
    data, _ = read_regular(queue.root / file_name)
    problem = content_problem(data)
    if problem is not None:
        raise NotATicketFile(problem)
    return data


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
    for dep in deps:
        check_hash(dep, "--dep")
    check_text(title, "--title")
    check_text(body, "--body")
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
    check_hash(ticket_hash)
    check_text(text, "text")
    check_text(by, "by")
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
        BadName: When ``ticket_hash`` is not a ticket hash.
        Refused: When no such ticket exists, or its file is invalid (the reason says why).
    """
    check_hash(ticket_hash)
    for verdict in snapshot.judge():
        if verdict.ticket.hash == ticket_hash:
            return verdict
    for bad in snapshot.invalid:
        if bad.hash == ticket_hash:
            raise Refused(f"{bad.file_name} is not a valid ticket: {bad.reason}")
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
            os.link(temporary, target, follow_symlinks=False)
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
    # O_EXCL never follows a symlink: a planted link at ``path`` makes this fail with EEXIST.
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
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
        fd = open_regular(path)
    except FileNotFoundError:
        raise Refused(f"no open ticket {ticket_hash}") from None
    except NotATicketFile as error:
        what = "a symbolic link; not followed" if "symbolic" in error.reason else error.reason
        raise Refused(f"{path.name} is {what}") from None
    try:
        before = os.fstat(fd)
        data = read_fd(fd)
    finally:
        os.close(fd)
    problem = content_problem(data) or link_problem(before)
    if problem is not None:
        raise Refused(f"{path.name} is not a valid ticket: {problem}")
    doc = Document.parse(decode(data))
    if doc.get(needed) is None:
        raise Refused(f"ticket {ticket_hash} has no {needed}")
    temporary = queue.root / private_name(ticket_hash, "edit")
    write_exclusive(temporary, encode(edit(doc).render()))
    try:
        now = os.lstat(path)
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
    # Replaces the name itself: a symlink put there meanwhile is replaced, never written through.
    os.replace(temporary, path)
