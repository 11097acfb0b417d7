"""The dead-session reclaimer: puts ``.wip`` tickets whose session stopped heartbeating back in
the queue, without ever creating an "assigned" ticket.

tickets.md §5: a ``.wip`` is stale when ``max(heartbeat_at, file ctime)`` is older than the TTL
(ctime, because a fresh hard link keeps the original's mtime – mtime alone would free a ticket
claimed a second ago). The stale file is first *renamed* to a private name that does not end in
``.md`` – one rename, so of several reclaimers exactly one gets it – then the engine keys are
stripped into a *new* file that is linked into place as the open ticket. A stalled worker that wakes
up still writes through its descriptor to the old inode, which is no longer in the queue, so its
late heartbeat can never put ``session_id`` back on an open ticket (that would be reason 4 of
tickets.md §4, made by the engine itself). The reclaimer only looks at ``.wip`` files (seed 001)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from mediator.tickets.files import NotATicketFile, content_problem, read_regular
from mediator.tickets.frontmatter import Document
from mediator.tickets.model import (
    SESSION_KEYS,
    format_epoch,
    parse_count,
    parse_time,
    with_log_line,
)
from mediator.tickets.names import Lane, parse_name, private_name
from mediator.tickets.store import LINK_UNSUPPORTED, QueueDir, decode, encode, publish

DEFAULT_TTL = 600.0


@dataclass(frozen=True)
class Reclaimed:
    """A ticket the reclaimer put back in the queue, and the session that had gone silent."""

    hash: str
    session_id: str | None


def is_stale(heartbeat_at: float | None, changed_at: float, *, now: float, ttl: float) -> bool:
    """Whether a session's last sign of life is older than ``ttl`` seconds (tickets.md §5)."""
    return now - max(heartbeat_at or 0.0, changed_at) > ttl


def reclaim_stale(
    queue: QueueDir, *, ttl: float = DEFAULT_TTL, now: float | None = None
) -> list[Reclaimed]:
    """Reclaims every stale ``.wip`` in the queue; safe to run in many processes at once.

    Args:
        queue: The queue folder.
        ttl: Seconds without a sign of life after which a session counts as dead.
        now: The current time (epoch seconds); defaults to the wall clock.
    """
    now = time.time() if now is None else now
    reclaimed = []
    for name in sorted(os.listdir(queue.root)):
        parsed = parse_name(name, queue.suffixes)
        if parsed is None or parsed.lane is not Lane.IN_PROGRESS:
            continue
        result = reclaim_one(queue, parsed.ticket_hash, ttl=ttl, now=now)
        if result is not None:
            reclaimed.append(result)
    return reclaimed


def reclaim_one(queue: QueueDir, ticket_hash: str, *, ttl: float, now: float) -> Reclaimed | None:
    """Reclaims one ticket if its ``.wip`` is stale; None when it is alive, gone or taken."""
    path = queue.path(ticket_hash, Lane.IN_PROGRESS)
    try:
        data, before = read_regular(path)
    except (FileNotFoundError, NotATicketFile):
        return None  # gone, or a symlink or non-regular file: never followed (issue 12 §8)
    if content_problem(data) is not None:
        return None  # listed as invalid; a person decides what it is
    doc = Document.parse(decode(data))
    if not is_stale(_heartbeat(doc), before.st_ctime, now=now, ttl=ttl):
        return None
    private = queue.root / private_name(ticket_hash, "reclaim")
    try:
        os.rename(path, private)
    except FileNotFoundError:
        return None  # another reclaimer got it, or its worker finished it just now
    try:
        data, after = read_regular(private)
    except NotATicketFile:
        _put_back(private, path)  # swapped for a symlink between our read and our rename
        return None
    doc = Document.parse(decode(data))
    # Judge again on the file we now hold alone: it must be the inode we judged, and still silent.
    # Our rename moved its ctime, so mtime stands in: any write by a live holder moves mtime.
    same = (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    if not same or not is_stale(_heartbeat(doc), after.st_mtime, now=now, ttl=ttl):
        _put_back(private, path)
        return None
    session = doc.get_str("session_id")
    stamp = format_epoch(now)
    message = f"session {session or '?'} stopped heartbeating; reclaimed at {stamp}"
    failures = parse_count(doc.get_str("failures")) + 1
    fresh = doc.remove(*SESSION_KEYS).set("failures", failures).set("last_error", message)
    fresh = with_log_line(fresh, stamp, message)
    if not publish(queue, queue.path(ticket_hash, Lane.QUEUED), encode(fresh.render())):
        _put_back(private, path)  # an open file with this hash appeared; leave the claim as it was
        return None
    os.unlink(private)
    return Reclaimed(ticket_hash, session)


def _heartbeat(doc: Document) -> float | None:
    moment = parse_time(doc.get_str("heartbeat_at"))
    return moment.timestamp() if moment else None


def _put_back(private: Path, path: Path) -> None:
    """Returns a file we took by mistake to its ``.wip`` name, keeping its inode."""
    try:
        os.link(private, path, follow_symlinks=False)
    except FileExistsError:
        return  # a new claim holds the name; the old inode stays private and harmless
    except OSError as error:
        if error.errno not in LINK_UNSUPPORTED:
            raise
        if not path.exists():
            os.rename(private, path)
        return
    os.unlink(private)
