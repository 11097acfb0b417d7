"""What the queue accepts as a ticket file, and the only way it opens one (issue 12 §8).

The queue folder is shared: anyone who can write to it can plant a symlink to a tokens file, a
second hard link to a file elsewhere, a FIFO, an empty or binary file, or type a name such as
``../outside/evil`` on the command line. The rules, in one place (docs/security.md, "Ticket
files"):

* A name given by a person (CLI argument, board URL, ``deps`` entry) must be a ticket hash:
  letters, digits, ``-`` and ``_``, at most 64 characters – so every path built from it is a plain
  file name inside the queue folder. Anything else is refused with ``BadName`` (exit 2, HTTP 400).
* Every open is ``O_NOFOLLOW | O_NONBLOCK`` and is checked with ``fstat``: a symlink is never
  followed, a FIFO never blocks, and only a regular file is read – at most ``MAX_TICKET_BYTES``.
* A file that passes is still invalid when it is empty, not UTF-8 text, or opens a frontmatter
  block it never closes. Invalid files are listed with their reason (board, bell, ``tickets list``)
  and never dispatched, claimed, reclaimed or edited.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from mediator.tickets.frontmatter import Document

# A ticket file holds a request and a progress log; a megabyte is far beyond any real one, and the
# limit keeps one planted file from making every listing read gigabytes.
MAX_TICKET_BYTES = 1 << 20
# What a person may write in one go (a title, a body, an answer, who answers): well under the file
# limit, so a ticket with its engine keys and a long progress log still fits.
MAX_TEXT_CHARS = 64 * 1024
MAX_HASH_CHARS = 64
_HASH = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
# Opening never follows a symlink, never blocks on a FIFO, never leaks into a session's command.
OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

SYMLINK = "a symbolic link (never followed)"
NOT_REGULAR = "not a regular file"
BAD_NAME = "the name is not a ticket hash (letters, digits, - and _)"


class BadInput(ValueError):
    """A person's input the queue refuses before touching a file; the message names the field."""


class BadName(BadInput):
    """A name given by a person that is not a ticket hash."""


def check_text(text: str, field: str) -> str:
    """Returns ``text`` if it is within ``MAX_TEXT_CHARS``.

    Raises:
        BadInput: Naming ``field`` when it is longer.
    """
    if len(text) > MAX_TEXT_CHARS:
        raise BadInput(f"{field}: longer than {MAX_TEXT_CHARS} characters ({len(text)})")
    return text


class NotATicketFile(OSError):
    """The path is a symlink or not a regular file; ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class InvalidFile:
    """A file in the queue whose name says "ticket" but which the queue refuses to treat as one.

    Attributes:
        file_name: The name in the folder.
        hash: The ticket hash the name carries, or None when the name itself is the problem.
        reason: Why it is refused, in words a person can act on.
    """

    file_name: str
    hash: str | None
    reason: str


def is_hash(text: str) -> bool:
    """Whether ``text`` is a name the queue can turn into a file name without leaving the folder."""
    return len(text) <= MAX_HASH_CHARS and _HASH.fullmatch(text) is not None


def check_hash(text: str, field: str = "hash") -> str:
    """Returns ``text`` if it is a ticket hash.

    Raises:
        BadName: Naming ``field``, for anything else (``..``, a path, an empty string, ...).
    """
    if not is_hash(text):
        shown = text if len(text) <= MAX_HASH_CHARS else text[:MAX_HASH_CHARS] + "…"
        raise BadName(
            f"{field}: {shown!r} is not a ticket hash (1–{MAX_HASH_CHARS} letters, digits, "
            "- and _; no paths)"
        )
    return text


def open_regular(path: Path, flags: int = os.O_RDONLY) -> int:
    """Opens ``path`` without following a symlink; the descriptor is on a regular file.

    Raises:
        NotATicketFile: When ``path`` is a symlink or not a regular file (the descriptor is closed).
        FileNotFoundError: When it does not exist.
    """
    try:
        fd = os.open(path, flags | OPEN_FLAGS)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise NotATicketFile(SYMLINK) from None
        if error.errno in (errno.EISDIR, errno.ENXIO):
            raise NotATicketFile(NOT_REGULAR) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotATicketFile(NOT_REGULAR)
    os.set_blocking(fd, True)
    return fd


def read_fd(fd: int, limit: int = MAX_TICKET_BYTES) -> bytes:
    """Up to ``limit + 1`` bytes from the start of ``fd`` (one more tells "too large" apart)."""
    chunks, offset = [], 0
    while offset <= limit:
        chunk = os.pread(fd, limit + 1 - offset, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def read_regular(path: Path) -> tuple[bytes, os.stat_result]:
    """The bytes (at most ``MAX_TICKET_BYTES + 1``) and ``fstat`` of a regular file.

    Raises:
        NotATicketFile: For a symlink or anything but a regular file.
        FileNotFoundError: When it does not exist.
    """
    fd = open_regular(path)
    try:
        return read_fd(fd), os.fstat(fd)
    finally:
        os.close(fd)


def content_problem(data: bytes) -> str | None:
    """Why these bytes are not a ticket file, or None when they are.

    A plain Markdown note without frontmatter is accepted (its title is its first line); a file
    that *opens* a frontmatter block and never closes it is not, since every key would silently
    become body text.
    """
    if len(data) > MAX_TICKET_BYTES:
        return f"larger than {MAX_TICKET_BYTES} bytes"
    if b"\0" in data:
        return "binary (not UTF-8 text)"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "binary (not UTF-8 text)"
    if not text.strip():
        return "empty"
    if text.split("\n", 1)[0].rstrip("\r") == "---" and not Document.parse(text).fenced:
        return "the frontmatter opens with --- but never closes"
    return None


def link_problem(status: os.stat_result) -> str | None:
    """A regular file with a second name may be a file outside the queue: never a ticket."""
    if status.st_nlink > 1:
        return f"has {status.st_nlink} hard links (a ticket file must be its only name)"
    return None
