"""Why an open ticket is or is not dispatched, and in what order (seed 001; tickets.md §3–5).

Each test is a small queue written out as rows, and the verdict the rules give on it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from mediator.tickets.model import Answer, Ticket
from mediator.tickets.names import Lane
from mediator.tickets.rules import Reason, Status, Verdict, candidates, judge

ASKED = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def ticket(hash: str, lane: Lane = Lane.QUEUED, **fields: Any) -> Ticket:
    fields.setdefault("created", "2025-01-01T00:00:00Z")
    return Ticket(hash=hash, lane=lane, file_name=f"{hash}.md", title=hash, **fields)


def by_hash(verdicts: tuple[Verdict, ...]) -> dict[str, Verdict]:
    return {v.ticket.hash: v for v in verdicts}


def picks(*tickets: Ticket, answers: tuple[Answer, ...] = ()) -> list[str]:
    return [t.hash for t in candidates(judge(tickets, answers))]


def test_candidates_go_by_priority_then_created_then_hash() -> None:
    assert picks(
        ticket("c", priority=3, created="2025-01-02T00:00:00Z"),
        ticket("b", priority=3, created="2025-01-01T00:00:00Z"),
        ticket("a", priority=3, created="2025-01-01T00:00:00Z"),
        ticket("z", priority=5, created="2025-06-01T00:00:00Z"),
    ) == ["z", "a", "b", "c"]


def test_deps_waiting_keeps_its_place_and_clears_by_itself() -> None:
    """Seed 001: the blocked card is not pushed down; the tag goes when the dependency is done."""
    queue = [
        ticket("urgent", priority=5, deps=("base",), created="2025-01-01T00:00:00Z"),
        ticket("base", created="2025-01-02T00:00:00Z"),
        ticket("other", created="2025-01-02T00:00:00Z"),
    ]
    verdicts = judge(queue)
    # The queued lane's order: "urgent" keeps the top even though blocked; "base" inherits its 5.
    assert [v.ticket.hash for v in verdicts] == ["urgent", "base", "other"]
    urgent = by_hash(verdicts)["urgent"]
    assert (urgent.status, urgent.unmet_deps, urgent.reasons) == (
        Status.DEPS_WAITING,
        ("base",),
        (Reason.DEPS_WAITING,),
    )
    assert picks(*queue) == ["base", "other"]

    queue[1] = ticket("base", Lane.DONE)
    assert by_hash(judge(queue))["urgent"].unmet_deps == ()
    assert picks(*queue) == ["urgent", "other"]


def test_answer_waiting_is_locked_until_an_answer_exists() -> None:
    asking = ticket("q1", awaiting_answer_since=ASKED, question="Which colour?")
    assert picks(asking) == []
    assert by_hash(judge([asking]))["q1"].status is Status.ANSWER_WAITING

    # An answer written before the question does not count (tickets.md §5): it answered another.
    older = Answer("q1", 1, "q1.answer.1.md", datetime(2025, 2, 1, tzinfo=UTC), "mina", "red")
    assert picks(asking, answers=(older,)) == []

    newer = Answer("q1", 2, "q1.answer.2.md", ASKED, "mina", "blue")
    assert picks(asking, answers=(older, newer)) == ["q1"]
    assert by_hash(judge([asking], [newer]))["q1"].status is Status.QUEUED


def test_priority_one_waits_while_anything_is_in_progress() -> None:
    """Seed 001: a 1 is a candidate only while no ticket is in progress; no badge, no tag."""
    low = ticket("low", priority=1)
    assert picks(low) == ["low"]

    running = ticket("running", Lane.IN_PROGRESS, session_id="w1")
    verdict = by_hash(judge([low, running]))["low"]
    assert picks(low, running) == []
    assert (verdict.status, verdict.reasons) == (Status.QUEUED, (Reason.PRIORITY_GATE,))
    assert verdict.effective_priority == 1  # the meter's one bar is the only sign

    assert picks(low, ticket("running", Lane.DONE)) == ["low"]


def test_a_one_that_inherits_a_higher_priority_is_ranked_there_and_not_gated() -> None:
    queue = [
        ticket("prereq", priority=1),
        ticket("needs_it", priority=4, deps=("prereq",)),
        ticket("normal", priority=3),
        ticket("running", Lane.IN_PROGRESS, session_id="w1"),
    ]
    prereq = by_hash(judge(queue))["prereq"]
    assert (prereq.effective_priority, prereq.inherited_from, prereq.reasons) == (4, "needs_it", ())
    assert picks(*queue) == ["prereq", "normal"]


def test_inheritance_goes_through_chains_of_deps() -> None:
    queue = [
        ticket("a", priority=5, deps=("b",)),
        ticket("b", priority=2, deps=("c",)),
        ticket("c", priority=1),
    ]
    assert [(v.ticket.hash, v.effective_priority) for v in judge(queue)] == [
        ("a", 5),
        ("b", 5),
        ("c", 5),
    ]


def test_an_open_file_with_a_session_id_is_assigned_and_in_no_lane() -> None:
    """Seed 001, reason 4: the picker skips it forever, so it must be shown, not hidden."""
    copied = ticket("copy", session_id="typed-by-hand")
    verdict = by_hash(judge([copied]))["copy"]
    assert (verdict.status, verdict.lane, verdict.reasons) == (
        Status.ASSIGNED,
        None,
        (Reason.ASSIGNED,),
    )
    assert verdict.is_stuck and picks(copied) == []


def test_a_ticket_that_failed_too_often_stops_being_dispatched() -> None:
    assert picks(ticket("flaky", failures=2)) == ["flaky"]
    verdict = by_hash(judge([ticket("flaky", failures=3, last_error="exit 1")]))["flaky"]
    assert verdict.reasons == (Reason.FAILED,) and verdict.is_stuck
    assert picks(ticket("flaky", failures=3)) == []
    assert [t.hash for t in candidates(judge([ticket("flaky", failures=3)], max_failures=4))] == [
        "flaky"
    ]


def test_unknown_hashes_and_cycles_can_never_be_satisfied() -> None:
    queue = [
        ticket("typo", deps=("nosuch",)),
        ticket("ping", deps=("pong",)),
        ticket("pong", deps=("ping",)),
        ticket("after", deps=("ping",)),
        ticket("fine", deps=("done",)),
        ticket("done", Lane.DONE),
    ]
    verdicts = by_hash(judge(queue))
    assert {h: v.impossible_deps for h, v in verdicts.items() if v.impossible_deps} == {
        "typo": ("nosuch",),
        "ping": ("pong",),
        "pong": ("ping",),
        "after": ("ping",),
    }
    assert all(verdicts[h].is_stuck for h in ("typo", "ping", "pong", "after"))
    assert picks(*queue) == ["fine"]


def test_a_dependency_in_progress_is_waited_for_not_impossible() -> None:
    queue = [ticket("next", deps=("busy",)), ticket("busy", Lane.IN_PROGRESS)]
    assert by_hash(judge(queue))["next"].reasons == (Reason.DEPS_WAITING,)


def test_the_filter_has_six_engine_states_for_three_lanes() -> None:
    assert [str(s) for s in Status] == [
        "queued",
        "in progress",
        "done",
        "deps waiting",
        "answer waiting",
        "assigned",
    ]
    assert [str(lane) for lane in Lane] == ["queued", "in progress", "done"]
