"""Lanes from file names: the only place that knows how a file name encodes a ticket's state.

Seed 001 ("티켓이 지나는 상태"): the three lanes are exactly three file names, and whatever strings
``TICKET_INPROGRESS`` / ``TICKET_DONE`` hold, the test is the same – does the name end with that
string. Answer files (tickets.md §5) are ``<hash>.answer.<n>.md``; private names used while
claiming, releasing or reclaiming never end in ``.md``, so nothing that lists the queue ever sees
them."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

MD = ".md"
DEFAULT_IN_PROGRESS = ".wip"
DEFAULT_DONE = ".done"
_ANSWER = re.compile(r"^(?P<hash>.+)\.answer\.(?P<n>[0-9]+)$")


class Lane(StrEnum):
    """The three lanes of the board, one per file-name suffix (seed 001, first paragraph)."""

    QUEUED = "queued"
    IN_PROGRESS = "in progress"
    DONE = "done"


class SuffixError(ValueError):
    """The suffix settings cannot tell the lanes apart (tickets.md §1, last bullet)."""


@dataclass(frozen=True)
class Suffixes:
    """The in-progress and done suffixes, checked so that every name maps to one lane.

    Attributes:
        in_progress: Appended to the hash while a session holds the ticket (``TICKET_INPROGRESS``).
        done: Appended to the hash once the session finished it (``TICKET_DONE``).
    """

    in_progress: str = DEFAULT_IN_PROGRESS
    done: str = DEFAULT_DONE

    def __post_init__(self) -> None:
        for label, value in (("TICKET_INPROGRESS", self.in_progress), ("TICKET_DONE", self.done)):
            if not value:
                raise SuffixError(f"{label} is empty: every file would count as that lane")
            if "/" in value or "\0" in value:
                raise SuffixError(f"{label}={value!r} is not a file-name suffix")
        # tickets.md §1: if one suffix ends with the other, a done file would also "end with" the
        # in-progress suffix and the lane of a name would depend on the order of the checks.
        if self.in_progress.endswith(self.done) or self.done.endswith(self.in_progress):
            raise SuffixError(
                f"TICKET_INPROGRESS={self.in_progress!r} and TICKET_DONE={self.done!r}: one is a "
                "suffix of the other, so a file name could not say which lane it is in"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Suffixes:
        """Reads ``TICKET_INPROGRESS`` and ``TICKET_DONE``; unset means the defaults.

        Raises:
            SuffixError: When the two cannot be told apart.
        """
        return cls(
            environ.get("TICKET_INPROGRESS", DEFAULT_IN_PROGRESS),
            environ.get("TICKET_DONE", DEFAULT_DONE),
        )

    def file_name(self, ticket_hash: str, lane: Lane) -> str:
        """The file name of ``ticket_hash`` in ``lane``."""
        suffix = {Lane.QUEUED: "", Lane.IN_PROGRESS: self.in_progress, Lane.DONE: self.done}[lane]
        return f"{ticket_hash}{suffix}{MD}"


@dataclass(frozen=True)
class ParsedName:
    """What a file name says: a ticket in a lane, or the ``n``-th answer to a ticket."""

    ticket_hash: str
    lane: Lane | None
    answer_number: int | None = None

    @property
    def is_answer(self) -> bool:
        return self.answer_number is not None


def parse_name(name: str, suffixes: Suffixes) -> ParsedName | None:
    """Reads a file name; ``None`` for anything that is not part of the queue.

    Examples:
        >>> parse_name("3f2a.wip.md", Suffixes())
        ParsedName(ticket_hash='3f2a', lane=<Lane.IN_PROGRESS: 'in progress'>, answer_number=None)
        >>> parse_name(".3f2a.reclaim-1c.tmp", Suffixes()) is None
        True
    """
    if not name.endswith(MD) or name.startswith("."):
        return None
    stem = name[: -len(MD)]
    answer = _ANSWER.match(stem)
    if answer:
        return ParsedName(answer["hash"], None, int(answer["n"]))
    # Seed 001: the whole test is "does the name end with that string".
    for suffix, lane in ((suffixes.done, Lane.DONE), (suffixes.in_progress, Lane.IN_PROGRESS)):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            return ParsedName(stem, lane) if stem else None
    return ParsedName(stem, Lane.QUEUED) if stem else None


def answer_name(ticket_hash: str, number: int) -> str:
    """The file name of the ``number``-th answer to a ticket (tickets.md §5)."""
    return f"{ticket_hash}.answer.{number}{MD}"


def private_name(ticket_hash: str, purpose: str) -> str:
    """A name nobody lists: starts with a dot and does not end in ``.md`` (tickets.md §5)."""
    return f".{ticket_hash}.{purpose}-{secrets.token_hex(4)}.tmp"


def new_hash(title: str, created: str) -> str:
    """A fresh 12-hex-digit ticket hash; the random part keeps two equal titles apart."""
    seed = f"{created}\0{title}\0{secrets.token_hex(8)}".encode()
    return hashlib.sha256(seed).hexdigest()[:12]
