"""Why an open ticket is or is not dispatched, and in which order: pure functions over a snapshot.

This is the dispatch table of tickets.md §4–5 written once. Both the worker (which picks) and the
board (which draws) ask ``judge`` so they can never disagree about a ticket. No I/O, no clock: the
caller passes ``now``.

An open ticket is a candidate unless one of these holds (seed 001, "디스패치되지 않는 티켓"):

1. ``DEPS_WAITING`` – a dependency is not done yet (normal; clears itself).
2. ``ANSWER_WAITING`` – the session asked a person; locked until an answer file exists (normal).
3. ``PRIORITY_GATE`` – effective priority 1 while any ticket is in progress (normal, no badge).
4. ``ASSIGNED`` – an open file with a ``session_id``: an accident; listed in the bell.

and two of ours (tickets.md §5), listed in the bell for the same reason as 4 – nothing may die
silently: ``FAILED`` (the session failed ``max_failures`` times) and ``DEPS_IMPOSSIBLE`` (an unknown
dependency hash, or a dependency cycle).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from mediator.tickets.model import Answer, Ticket
from mediator.tickets.names import Lane

DEFAULT_MAX_FAILURES = 3


class Status(StrEnum):
    """The engine states: the six choices of the board's status filter (tickets.md §3)."""

    QUEUED = "queued"
    IN_PROGRESS = "in progress"
    DONE = "done"
    DEPS_WAITING = "deps waiting"
    ANSWER_WAITING = "answer waiting"
    ASSIGNED = "assigned"


class Reason(StrEnum):
    """Why an open ticket is not dispatched (tickets.md §4, and two of ours from §5)."""

    DEPS_WAITING = "deps waiting"
    ANSWER_WAITING = "answer waiting"
    PRIORITY_GATE = "priority 1 gate"
    ASSIGNED = "assigned"
    FAILED = "failed"
    DEPS_IMPOSSIBLE = "deps ?"


# Reasons that never clear by themselves: the bell lists tickets that have one (tickets.md §4–5).
STUCK = (Reason.ASSIGNED, Reason.FAILED, Reason.DEPS_IMPOSSIBLE)


@dataclass(frozen=True)
class Verdict:
    """What the rules say about one ticket.

    Attributes:
        ticket: The row.
        status: Its engine state (the filter's choice that matches it).
        lane: Where the board draws it; None for an assigned ticket, which sits in no lane.
        effective_priority: Its own priority or the highest inherited through ``deps``.
        inherited_from: The dependent ticket it inherits ``effective_priority`` from, if any.
        unmet_deps: Dependencies not done yet (the orange ``deps`` tag), in the ticket's order.
        impossible_deps: Those that can never be done: unknown, in a cycle, or blocked by such.
        answer_waiting_since: When the session asked, while no answer exists.
        reasons: Why it is not dispatched; empty for a candidate and for in-progress/done tickets.
    """

    ticket: Ticket
    status: Status
    lane: Lane | None
    effective_priority: int
    inherited_from: str | None
    unmet_deps: tuple[str, ...]
    impossible_deps: tuple[str, ...]
    answer_waiting_since: datetime | None
    reasons: tuple[Reason, ...]

    @property
    def is_candidate(self) -> bool:
        """An open ticket with nothing holding it back."""
        return self.ticket.lane is Lane.QUEUED and not self.reasons

    @property
    def is_stuck(self) -> bool:
        """Never dispatched until a person acts: the bell's "nobody picks up" list."""
        return any(reason in STUCK for reason in self.reasons)


def dispatch_key(verdict: Verdict) -> tuple[int, bool, str, str]:
    """Candidate order (tickets.md §5): effective priority high first, then created, then hash."""
    created = verdict.ticket.created
    return (-verdict.effective_priority, created is None, created or "", verdict.ticket.hash)


def judge(
    tickets: Iterable[Ticket],
    answers: Iterable[Answer] = (),
    *,
    max_failures: int = DEFAULT_MAX_FAILURES,
) -> tuple[Verdict, ...]:
    """Judges every ticket; open tickets come first in dispatch order, then in-progress, then done.

    Args:
        tickets: One row per ticket hash (a snapshot resolves duplicates beforehand).
        answers: The answer files in the queue.
        max_failures: Failed sessions after which a ticket stops being dispatched.
    """
    rows = {ticket.hash: ticket for ticket in tickets}
    done = {h for h, t in rows.items() if t.lane is Lane.DONE}
    in_progress = sum(1 for t in rows.values() if t.lane is Lane.IN_PROGRESS)
    priorities = _effective_priorities(rows, done)
    doomed = _doomed(rows, done)
    latest_answer = _latest_answers(answers)

    verdicts = []
    for ticket in rows.values():
        priority, source = priorities[ticket.hash]
        if ticket.lane is not Lane.QUEUED:
            status = Status.DONE if ticket.lane is Lane.DONE else Status.IN_PROGRESS
            verdicts.append(
                Verdict(ticket, status, ticket.lane, priority, source, (), (), None, ())
            )
            continue
        unmet = tuple(dep for dep in ticket.deps if dep not in done)
        impossible = tuple(dep for dep in unmet if dep not in rows or dep in doomed)
        waiting = _answer_waiting(ticket, latest_answer.get(ticket.hash))
        reasons = []
        if ticket.session_id is not None:
            reasons.append(Reason.ASSIGNED)
        if unmet:
            reasons.append(Reason.DEPS_WAITING)
        if impossible:
            reasons.append(Reason.DEPS_IMPOSSIBLE)
        if waiting is not None:
            reasons.append(Reason.ANSWER_WAITING)
        if ticket.failures >= max_failures:
            reasons.append(Reason.FAILED)
        # Rule 3: only an *effective* priority of 1 is gated; an inherited higher value is not.
        if priority == 1 and in_progress > 0:
            reasons.append(Reason.PRIORITY_GATE)
        verdicts.append(
            Verdict(
                ticket=ticket,
                status=_open_status(reasons),
                lane=None if Reason.ASSIGNED in reasons else Lane.QUEUED,
                effective_priority=priority,
                inherited_from=source,
                unmet_deps=unmet,
                impossible_deps=impossible,
                answer_waiting_since=waiting,
                reasons=tuple(reasons),
            )
        )
    lane_order = {Lane.QUEUED: 0, Lane.IN_PROGRESS: 1, Lane.DONE: 2}
    return tuple(sorted(verdicts, key=lambda v: (lane_order[v.ticket.lane], dispatch_key(v))))


def candidates(verdicts: Iterable[Verdict]) -> tuple[Ticket, ...]:
    """The tickets a worker may claim, best first."""
    return tuple(v.ticket for v in sorted(verdicts, key=dispatch_key) if v.is_candidate)


def answer_exists(since: datetime, answer: Answer | None) -> bool:
    """tickets.md §5: an answer counts when it was written at or after the question."""
    return answer is not None and answer.answered_at is not None and answer.answered_at >= since


def _answer_waiting(ticket: Ticket, latest: Answer | None) -> datetime | None:
    since = ticket.awaiting_answer_since
    return None if since is None or answer_exists(since, latest) else since


def _open_status(reasons: list[Reason]) -> Status:
    # One filter state per ticket: the accident first, then the person-facing lock, then deps.
    if Reason.ASSIGNED in reasons:
        return Status.ASSIGNED
    if Reason.ANSWER_WAITING in reasons:
        return Status.ANSWER_WAITING
    if Reason.DEPS_WAITING in reasons:
        return Status.DEPS_WAITING
    return Status.QUEUED


def _latest_answers(answers: Iterable[Answer]) -> dict[str, Answer]:
    latest: dict[str, Answer] = {}
    for answer in answers:
        best = latest.get(answer.ticket)
        if answer.answered_at is not None and (
            best is None or best.answered_at is None or answer.answered_at > best.answered_at
        ):
            latest[answer.ticket] = answer
    return latest


def _effective_priorities(
    rows: Mapping[str, Ticket], done: set[str]
) -> dict[str, tuple[int, str | None]]:
    """Each ticket's priority raised to that of any unfinished ticket that (transitively) needs it.

    Seed 001 ("더 높은 값을 물려받은 1은 그 값으로 떠서"): a low-priority prerequisite of an urgent
    ticket is ranked as urgent, otherwise the urgent ticket would wait behind unrelated work.
    """
    result: dict[str, tuple[int, str | None]] = {h: (t.priority, None) for h, t in rows.items()}
    for source, ticket in rows.items():
        if source in done:
            continue
        stack, seen = list(ticket.deps), {source}
        while stack:
            dep = stack.pop()
            if dep in seen or dep not in rows or dep in done:
                continue
            seen.add(dep)
            if ticket.priority > result[dep][0]:
                result[dep] = (ticket.priority, source)
            stack.extend(rows[dep].deps)
    return result


def _doomed(rows: Mapping[str, Ticket], done: set[str]) -> set[str]:
    """Unfinished tickets that can never become candidates: in a cycle, or needing one that is.

    Found as the complement of what can finish: repeatedly mark tickets whose deps are all done or
    finishable. Whatever is left depends on an unknown hash or on a cycle (tickets.md §5, ours).
    """
    # A ticket in progress will finish (or be reclaimed and retried): it never dooms a dependent.
    finishable = set(done) | {h for h, t in rows.items() if t.lane is Lane.IN_PROGRESS}
    open_rows = {h: t for h, t in rows.items() if h not in finishable}
    changed = True
    while changed:
        changed = False
        for h, ticket in open_rows.items():
            if h not in finishable and all(dep in finishable for dep in ticket.deps):
                finishable.add(h)
                changed = True
    return set(open_rows) - finishable
