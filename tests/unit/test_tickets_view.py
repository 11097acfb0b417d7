"""What the board draws: totals, the bell, badges and lanes (seed 001; tickets.md §3–4)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from mediator.tickets import view
from mediator.tickets.model import FIELDS, Ticket
from mediator.tickets.names import Lane
from mediator.tickets.rules import judge

NOW = datetime(2025, 3, 4, 13, 0, tzinfo=UTC).timestamp()


def ticket(hash: str, lane: Lane = Lane.QUEUED, **fields: Any) -> Ticket:
    return Ticket(hash=hash, lane=lane, file_name=f"{hash}.md", title=f"title {hash}", **fields)


def test_assigned_tickets_make_the_total_exceed_the_lane_sum() -> None:
    """Seed 001: "(N undispatched, see the bell)" next to a total larger than the lanes' sum."""
    queue = [
        ticket("a"),
        ticket("b", Lane.IN_PROGRESS),
        ticket("c", Lane.DONE),
        ticket("d", session_id="copied"),
    ]
    board = view.board(judge(queue), now=NOW)
    assert [lane["total"] for lane in board["lanes"]] == [1, 1, 1]
    assert board["totals"] == {
        "tickets": 4,
        "in_lanes": 3,
        "undispatched": 1,
        "invalid": 0,
        "text": "4 tickets (1 undispatched, see the bell)",
    }
    assert [c["hash"] for c in board["unlaned"]] == ["d"]
    assert view.totals(judge(queue[:3]))["text"] == "3 tickets"


def test_the_bell_lists_every_stuck_ticket_with_its_button() -> None:
    """Never truncated: forty assigned tickets are forty rows, each with an unassign button."""
    queue = [ticket(f"t{n:02d}", session_id=f"s{n}") for n in range(40)]
    queue.append(ticket("flaky", failures=3, last_error="exit 2: boom"))
    queue.append(ticket("typo", deps=("nosuch",)))
    bell = view.bell(judge(queue), now=NOW)
    assert bell["count"] == 42
    hashes = [item["hash"] for item in bell["stuck"]]
    assert hashes == ["flaky", *(f"t{n:02d}" for n in range(40)), "typo"]  # dispatch order
    rows = {item["hash"]: item for item in bell["stuck"]}
    assert rows["t07"] == {
        "hash": "t07",
        "title": "title t07",
        "details": ["assigned to session s7 on an open file"],
        "actions": ["unassign"],
    }
    assert rows["flaky"]["details"] == ["failed 3×: exit 2: boom"]
    assert rows["flaky"]["actions"] == ["retry"]
    assert rows["typo"]["details"] == ["deps ? nosuch"] and rows["typo"]["actions"] == []


def test_the_answer_badge_counts_whole_days_and_the_bell_offers_an_answer() -> None:
    asked = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)  # 3 days and 1 hour before NOW
    queue = [ticket("q", awaiting_answer_since=asked, question="Which colour?")]
    card = view.board(judge(queue), now=NOW)["lanes"][0]["cards"][0]
    assert card["answer"] == {
        "since": "2025-03-01T12:00:00.000000Z",
        "days": 3,
        "question": "Which colour?",
    }
    assert view.bell(judge(queue), now=NOW)["answers"] == [
        {"hash": "q", "title": "title q", "question": "Which colour?", "days": 3}
    ]


def test_an_old_question_never_expires_it_only_shows_its_age() -> None:
    """Seed 001: no automatic expiry or cancel; an old badge is a signal for a person."""
    asked = datetime(2024, 1, 30, 13, 0, tzinfo=UTC)
    queue = [ticket("old", awaiting_answer_since=asked, question="Still there?")]
    card = view.board(judge(queue), now=NOW)["lanes"][0]["cards"][0]
    assert (card["status"], card["answer"]["days"]) == ("answer waiting", 399)


def test_cards_carry_the_deps_tag_and_the_priority_meter() -> None:
    queue = [ticket("x", priority=1), ticket("y", priority=4, deps=("x", "gone"))]
    cards = {c["hash"]: c for c in view.board(judge(queue), now=NOW)["lanes"][0]["cards"]}
    assert (cards["y"]["deps_unmet"], cards["y"]["deps_impossible"]) == (["x", "gone"], ["gone"])
    assert (cards["x"]["priority"], cards["x"]["effective_priority"]) == (1, 4)
    assert cards["x"]["inherited_from"] == "y"


def test_the_done_lane_shows_the_newest_first_and_says_how_many() -> None:
    queue = [ticket(f"d{n}", Lane.DONE, mtime=float(n)) for n in range(5)]
    lane = view.board(judge(queue), now=NOW, done_limit=2)["lanes"][2]
    assert (lane["total"], [c["hash"] for c in lane["cards"]]) == (5, ["d4", "d3"])


def test_the_help_shows_the_frontmatter_table() -> None:
    rows = view.help_table()
    assert {key for row in rows for key in row["keys"]} == {key for f in FIELDS for key in f.keys}
    assert {
        key: row["writer"] for row in rows for key in row["keys"] if key in ("session_id", "title")
    } == {"session_id": "the worker (engine)", "title": "a person (tickets new)"}
