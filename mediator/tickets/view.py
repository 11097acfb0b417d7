"""What the board and ``tickets list`` show: the rules' verdicts turned into plain JSON-able data.

Pure (no I/O, ``now`` passed in), so the drawing rules are unit-tested without a browser and the
browser tests only check that the page draws what this module says. The drawing rules come from
seed 001 and tickets.md §3–4:

* three lanes, one per file-name suffix; an open ticket keeps its place in the queued lane even when
  blocked (pushing it down would make the cards above it falsely look "next");
* an "assigned" ticket sits in no lane, so the total can exceed the lane sum and says
  "(N undispatched, see the bell)";
* the bell lists every ticket nobody picks up – assigned, failed out, impossible deps – and every
  question waiting for an answer, never filtered, never truncated, with no dismiss;
* a file the queue refuses (a symlink, empty, binary, an unclosed frontmatter; issue 12 §8) is in
  the "invalid" state: in no lane, listed with its reason on the board and in the bell, and never
  dispatched – nothing may die silently.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mediator.tickets.files import InvalidFile
from mediator.tickets.model import FIELDS, elapsed_days, format_time
from mediator.tickets.names import Lane
from mediator.tickets.rules import Reason, Status, Verdict

DONE_LANE_LIMIT = 200

Json = dict[str, Any]


def card(verdict: Verdict, *, now: float) -> Json:
    """One ticket as the board draws it (card, dialog, detail and bell all use this)."""
    ticket = verdict.ticket
    since = verdict.answer_waiting_since
    return {
        "hash": ticket.hash,
        "title": ticket.title,
        "file": ticket.file_name,
        "status": str(verdict.status),
        "lane": str(verdict.lane) if verdict.lane else None,
        "priority": ticket.priority,
        "effective_priority": verdict.effective_priority,
        "inherited_from": verdict.inherited_from,
        "deps": list(ticket.deps),
        "deps_unmet": list(verdict.unmet_deps),
        "deps_impossible": list(verdict.impossible_deps),
        "answer": None
        if since is None
        else {
            "since": format_time(since),
            "days": elapsed_days(since, now),
            "question": ticket.question or "",
        },
        "failures": ticket.failures,
        "last_error": ticket.last_error,
        "failed_out": Reason.FAILED in verdict.reasons,
        "gated": Reason.PRIORITY_GATE in verdict.reasons,
        "session_id": ticket.session_id,
        "reasons": [str(reason) for reason in verdict.reasons],
    }


def invalid_files(invalid: Iterable[InvalidFile]) -> list[Json]:
    """The invalid files, by name: the file, the hash its name carries, and the reason."""
    return [
        {"file": bad.file_name, "hash": bad.hash, "reason": bad.reason}
        for bad in sorted(invalid, key=lambda bad: bad.file_name)
    ]


def bell(verdicts: Iterable[Verdict], *, now: float, invalid: Iterable[InvalidFile] = ()) -> Json:
    """The header bell: everything that needs a person, complete and in dispatch order."""
    stuck, answers = [], []
    for verdict in verdicts:
        ticket = verdict.ticket
        if verdict.is_stuck:
            details, actions = [], []
            if Reason.ASSIGNED in verdict.reasons:
                details.append(f"assigned to session {ticket.session_id} on an open file")
                actions.append("unassign")
            if Reason.FAILED in verdict.reasons:
                details.append(f"failed {ticket.failures}×: {ticket.last_error or 'no message'}")
                actions.append("retry")
            if Reason.DEPS_IMPOSSIBLE in verdict.reasons:
                details.append("deps ? " + " ".join(verdict.impossible_deps))
            stuck.append(
                {"hash": ticket.hash, "title": ticket.title, "details": details, "actions": actions}
            )
        if verdict.answer_waiting_since is not None:
            answers.append(
                {
                    "hash": ticket.hash,
                    "title": ticket.title,
                    "question": ticket.question or "",
                    "days": elapsed_days(verdict.answer_waiting_since, now),
                }
            )
    bad = invalid_files(invalid)
    return {
        "count": len(stuck) + len(answers) + len(bad),
        "stuck": stuck,
        "answers": answers,
        "invalid": bad,
    }


def totals(verdicts: Iterable[Verdict], invalid: int = 0) -> Json:
    """The board's total: every ticket, how many sit in no lane (seed 001), and invalid files."""
    all_verdicts = list(verdicts)
    undispatched = sum(1 for v in all_verdicts if v.lane is None)
    text = f"{len(all_verdicts)} ticket{'' if len(all_verdicts) == 1 else 's'}"
    if undispatched:
        text += f" ({undispatched} undispatched, see the bell)"
    if invalid:
        text += f" · {invalid} invalid file{'' if invalid == 1 else 's'} (see the bell)"
    return {
        "tickets": len(all_verdicts),
        "in_lanes": len(all_verdicts) - undispatched,
        "undispatched": undispatched,
        "invalid": invalid,
        "text": text,
    }


def board(
    verdicts: Iterable[Verdict],
    *,
    now: float,
    done_limit: int = DONE_LANE_LIMIT,
    invalid: Iterable[InvalidFile] = (),
) -> Json:
    """The whole board page's data.

    Args:
        verdicts: ``rules.judge`` output (open tickets already in dispatch order).
        now: Epoch seconds, for the answer badges' elapsed days.
        done_limit: The done lane shows this many, newest first, and says how many there are.
        invalid: The files the queue refuses (``Snapshot.invalid``), shown with their reasons.
    """
    all_verdicts = list(verdicts)
    bad = list(invalid)
    lanes = []
    for lane in Lane:
        members = [v for v in all_verdicts if v.lane is lane]
        if lane is Lane.DONE:
            members.sort(key=lambda v: v.ticket.mtime, reverse=True)
        lanes.append(
            {
                "lane": str(lane),
                "total": len(members),
                "cards": [
                    card(v, now=now) for v in members[: done_limit if lane is Lane.DONE else None]
                ],
            }
        )
    return {
        "lanes": lanes,
        "unlaned": [card(v, now=now) for v in all_verdicts if v.lane is None],
        "invalid": invalid_files(bad),
        "bell": bell(all_verdicts, now=now, invalid=bad),
        "totals": totals(all_verdicts, len(bad)),
        "statuses": [str(status) for status in Status],
    }


def help_table() -> list[Json]:
    """The frontmatter table of tickets.md §2, for the board's help."""
    return [{"keys": list(f.keys), "writer": f.writer, "meaning": f.meaning} for f in FIELDS]
