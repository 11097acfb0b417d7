"""Lanes from file-name suffixes (seed 001, "티켓이 지나는 상태"; tickets.md §1)."""

from __future__ import annotations

import pytest

from mediator.tickets.names import Lane, ParsedName, SuffixError, Suffixes, answer_name, parse_name
from mediator.tickets.store import QueueDir


def test_three_file_names_are_the_three_lanes() -> None:
    suffixes = Suffixes()
    assert [parse_name(name, suffixes) for name in ("3f2a.md", "3f2a.wip.md", "3f2a.done.md")] == [
        ParsedName("3f2a", Lane.QUEUED),
        ParsedName("3f2a", Lane.IN_PROGRESS),
        ParsedName("3f2a", Lane.DONE),
    ]


def test_other_suffix_strings_use_the_same_ends_with_test() -> None:
    """Seed 001: whatever the strings, the test is whether the name ends with them."""
    suffixes = Suffixes(in_progress="-doing", done="_fin")
    assert parse_name("a1-doing.md", suffixes) == ParsedName("a1", Lane.IN_PROGRESS)
    assert parse_name("a1_fin.md", suffixes) == ParsedName("a1", Lane.DONE)
    # With other settings the default suffix is just part of an open ticket's hash.
    assert parse_name("a1.wip.md", suffixes) == ParsedName("a1.wip", Lane.QUEUED)
    assert suffixes.file_name("a1", Lane.IN_PROGRESS) == "a1-doing.md"


def test_the_suffixes_come_from_the_environment() -> None:
    queue = QueueDir.from_env("/q", {"TICKET_INPROGRESS": ".taken", "TICKET_DONE": ".closed"})
    assert queue.suffixes == Suffixes(".taken", ".closed")
    assert queue.path("b2", Lane.DONE).name == "b2.closed.md"
    assert QueueDir.from_env("/q", {}).suffixes == Suffixes(".wip", ".done")


@pytest.mark.parametrize(
    ("in_progress", "done", "complaint"),
    [
        ("", ".done", "TICKET_INPROGRESS is empty"),
        (".wip", "", "TICKET_DONE is empty"),
        (".done", ".done", "one is a suffix of the other"),
        (".wip", "x.wip", "one is a suffix of the other"),
        ("really.done", ".done", "one is a suffix of the other"),
        ("a/b", ".done", "not a file-name suffix"),
    ],
)
def test_suffixes_that_cannot_tell_the_lanes_apart_are_refused(
    in_progress: str, done: str, complaint: str
) -> None:
    with pytest.raises(SuffixError, match=complaint):
        Suffixes(in_progress, done)


def test_answers_and_private_files_are_not_tickets() -> None:
    suffixes = Suffixes()
    assert parse_name(answer_name("3f2a", 2), suffixes) == ParsedName("3f2a", None, 2)
    # Names used mid-claim, mid-release and mid-reclaim never end in .md: nobody lists them.
    assert parse_name(".3f2a.reclaim-1c2d3e4f.tmp", suffixes) is None
    assert parse_name("notes.txt", suffixes) is None
    assert parse_name(".wip.md", suffixes) is None
