"""Claiming, heartbeating, finishing and releasing one ticket file.

The file name is the lock (seed 001, "파일명이 곧 락인 이유"): a claim is ``os.link(<hash>.md,
<hash>.wip.md)`` and the kernel answers ``EEXIST`` when another worker got there first – the check
and the acquisition are one system call, as in Maildir. Where hard links are refused (FUSE/SMB
mounts) the claim is an ``O_CREAT|O_EXCL`` create of the ``.wip`` name, also atomic and exclusive.
Both guarantees hold within one mount; a cloud-synced folder shared by several hosts is not atomic
across hosts.

A ``Held`` keeps the claimed file open. Heartbeats go through that descriptor, and finishing first
checks that the ``.wip`` path still names the same inode (tickets.md §1): if the dead-session
reclaimer took the ticket away and another worker claimed it again, the stalled worker's finish and
heartbeats land on the orphaned inode, never on the new claim or on an open ticket.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from mediator.tickets.files import (
    NotATicketFile,
    content_problem,
    open_regular,
    read_fd,
)
from mediator.tickets.frontmatter import Document
from mediator.tickets.model import SESSION_KEYS, format_epoch, with_log_line
from mediator.tickets.names import Lane
from mediator.tickets.store import (
    LINK_UNSUPPORTED,
    QueueDir,
    decode,
    encode,
    publish,
    write_all,
)


@dataclass(frozen=True)
class Held:
    """A claimed ticket: its ``.wip`` path and an open descriptor on the inode we claimed.

    Attributes:
        queue: The queue it was claimed in.
        hash: The ticket's hash.
        path: The ``.wip`` path.
        fd: Read/write descriptor on the claimed inode; closed by ``finish``/``release``/``close``.
        inode: ``(st_dev, st_ino)`` of the claimed file.
    """

    queue: QueueDir
    hash: str
    path: Path
    fd: int
    inode: tuple[int, int]


def claim(queue: QueueDir, ticket_hash: str) -> Held | None:
    """Claims one open ticket; None when another worker won it (or it is no longer open).

    Args:
        queue: The queue folder.
        ticket_hash: The ticket to claim.

    Returns:
        The held ticket, or None: the caller moves on to its next candidate (tickets.md §1). Also
        None for a name that is a symlink, not a regular file, a second hard link to some other
        file, or malformed (issue 12 §8): such a file is skipped, never held, read or written.
    """
    source = queue.path(ticket_hash, Lane.QUEUED)
    if not _plain_file(source):
        return None
    if queue.hard_links:
        target = queue.path(ticket_hash, Lane.IN_PROGRESS)
        try:
            # follow_symlinks=False: were the name swapped for a symlink since the check above, we
            # link the symlink itself (and refuse it below), never the file it points at.
            os.link(source, target, follow_symlinks=False)
        except (FileExistsError, FileNotFoundError):
            # EEXIST: another worker's link came first. ENOENT: it claimed and removed the original.
            return None
        except OSError as error:
            if error.errno not in LINK_UNSUPPORTED:
                raise
        else:
            return _confirm_link(queue, ticket_hash, source, target)
    return _claim_exclusive(queue, ticket_hash)


def _plain_file(path: Path) -> bool:
    """The check before linking: a regular file with one name (``lstat``, never followed)."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(status.st_mode) and status.st_nlink == 1


def _open_valid(path: Path, names: int) -> int | None:
    """A read/write descriptor on ``path`` if it is a regular, well-formed ticket with exactly
    ``names`` hard links (a third name would be a file outside the queue); else None."""
    try:
        fd = open_regular(path, os.O_RDWR)
    except (NotATicketFile, FileNotFoundError):
        return None
    if os.fstat(fd).st_nlink != names or content_problem(read_fd(fd)) is not None:
        os.close(fd)
        return None
    return fd


def _confirm_link(queue: QueueDir, ticket_hash: str, source: Path, target: Path) -> Held | None:
    """Makes sure our new ``.wip`` link is a real claim before removing the original.

    ``link`` looks the source up before it creates the target, and the two are not one atomic step
    with respect to *other names*: a worker that looked ``<hash>.md`` up just before the winner
    removed it can still create ``<hash>.wip.md`` once the winner has finished and renamed its
    ``.wip`` away – and would then hold a finished (or since released) ticket. Our races caught
    this. So the claim stands only if ``<hash>.md`` still names the inode we linked; while our
    ``.wip`` exists nobody else can claim that name, so the check cannot go stale before the unlink.
    """
    fd = _open_valid(target, names=2)  # exactly <hash>.md and ours
    if fd is None:
        os.unlink(target)  # a symlink or a malformed file swapped in after our check: skip it
        return None
    ours = os.fstat(fd)
    try:
        current = os.lstat(source)
    except FileNotFoundError:
        current = None
    if current is None or (current.st_dev, current.st_ino) != (ours.st_dev, ours.st_ino):
        os.unlink(target)  # a link to someone else's finished or released inode: not a claim
        os.close(fd)
        return None
    os.unlink(source)
    return _held(queue, ticket_hash, target, fd)


def _claim_exclusive(queue: QueueDir, ticket_hash: str) -> Held | None:
    """The ``O_CREAT|O_EXCL`` claim for file systems without hard links (tickets.md §1)."""
    source, target = queue.path(ticket_hash, Lane.QUEUED), queue.path(ticket_hash, Lane.IN_PROGRESS)
    try:
        flags = os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(target, flags, 0o644)
    except FileExistsError:
        return None
    try:
        # The re-check (ours): the original must still exist *after* our exclusive create. If the
        # previous holder already finished (renamed its .wip to .done), our create succeeded only
        # because the name was free again – claiming now would run a finished ticket twice. Reading
        # the content only now also means we copy the latest version, not one read before.
        original = _open_valid(source, names=1)
        if original is None:  # gone, or a symlink or malformed file: not ours to copy
            os.unlink(target)
            os.close(fd)
            return None
        try:
            data = read_fd(original)
        finally:
            os.close(original)
        write_all(fd, data)
        os.fsync(fd)  # the content is safe in the .wip before the original goes
        os.unlink(source)
    except BaseException:
        os.close(fd)
        os.unlink(target)
        raise
    return _held(queue, ticket_hash, target, fd)


def _held(queue: QueueDir, ticket_hash: str, path: Path, fd: int) -> Held:
    stat = os.fstat(fd)
    return Held(queue, ticket_hash, path, fd, (stat.st_dev, stat.st_ino))


def still_held(held: Held) -> bool:
    """Whether the ``.wip`` path still names the inode we claimed (tickets.md §1, finishing)."""
    try:
        status = os.lstat(held.path)  # a symlink put in its place is not our inode
    except FileNotFoundError:
        return False
    return (status.st_dev, status.st_ino) == held.inode


def read(held: Held) -> Document:
    """The held file's current content, read through our descriptor."""
    size = os.fstat(held.fd).st_size
    chunks, offset = [], 0
    while offset < size:
        chunk = os.pread(held.fd, size - offset, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return Document.parse(decode(b"".join(chunks)))


def write(held: Held, doc: Document) -> None:
    """Rewrites the held file in place (same inode) with ``doc``."""
    data = encode(doc.render())
    write_all(held.fd, data)
    os.ftruncate(held.fd, len(data))


def start_session(held: Held, session_id: str, now: float) -> Document:
    """Writes the engine keys of tickets.md §2 into the claimed file; returns the new content."""
    stamp = format_epoch(now)
    doc = read(held).set("session_id", session_id).set("claimed_at", stamp)
    doc = doc.set("heartbeat_at", stamp)
    write(held, doc)
    return doc


def heartbeat(held: Held, now: float) -> None:
    """Moves ``heartbeat_at`` through the held descriptor (tickets.md §5).

    Only the bytes that changed are written: timestamps have a fixed width, so a heartbeat never
    rewrites the body, where the session's command may be appending to its progress log.
    """
    size = os.fstat(held.fd).st_size
    old = os.pread(held.fd, size, 0)
    new = encode(Document.parse(decode(old)).set("heartbeat_at", format_epoch(now)).render())
    if len(new) != len(old):
        write_all(held.fd, new)
        os.ftruncate(held.fd, len(new))
        return
    changed = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
    if changed:
        write_all(held.fd, new[changed[0] : changed[-1] + 1], changed[0])


def finish(held: Held, *, log: str | None = None, now: float | None = None) -> bool:
    """Renames ``.wip`` to ``.done`` if we still hold it; False (and nothing touched) otherwise.

    Args:
        held: The claimed ticket.
        log: A line for the progress log, written first.
        now: Time of the progress-log line (default: the wall clock).
    """
    try:
        if not still_held(held):
            return False
        if log:
            stamp = format_epoch(time.time() if now is None else now)
            write(held, with_log_line(read(held), stamp, log))
        os.rename(held.path, held.queue.path(held.hash, Lane.DONE))
        return True
    finally:
        close(held)


def release(held: Held, doc: Document, *, keep_session: bool = False) -> bool:
    """Puts a held ticket back in the queue as ``doc``; False if we no longer held it.

    The open file is published as a new inode (hard link from a private file, or an exclusive
    create) *before* the ``.wip`` goes, so the ticket is never missing from the folder, and our
    descriptor – and any late write through it – stays on the old inode (tickets.md §5).

    Args:
        held: The claimed ticket.
        doc: The content to publish, normally the held content with the outcome recorded.
        keep_session: Keep the engine keys (used only to hand back an "assigned" ticket unchanged).
    """
    try:
        if not still_held(held):
            return False
        content = doc if keep_session else doc.remove(*SESSION_KEYS)
        if not publish(
            held.queue, held.queue.path(held.hash, Lane.QUEUED), encode(content.render())
        ):
            return False  # someone made an open file with this hash meanwhile: keep ours as .wip
        if still_held(held):
            os.unlink(held.path)
        return True
    finally:
        close(held)


def close(held: Held) -> None:
    """Closes the descriptor; ``finish`` and ``release`` already do, so call it only instead."""
    os.close(held.fd)
