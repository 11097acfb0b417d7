"""The ``tickets`` command: ``new | list | answer | unassign | retry | reclaim | worker | board``.

A thin shell over the library (style: one orchestration layer; the CLI only parses arguments and
prints). Exit codes: 0 done, 1 refused by the files (unknown ticket, nothing to answer, ...),
2 a usage or configuration error such as suffix settings that cannot tell the lanes apart.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

from mediator.tickets import store, view
from mediator.tickets.files import BadInput
from mediator.tickets.names import SuffixError
from mediator.tickets.reclaim import DEFAULT_TTL, reclaim_stale
from mediator.tickets.rules import DEFAULT_MAX_FAILURES, Status
from mediator.tickets.store import QueueDir, Refused
from mediator.tickets.worker import (
    DEFAULT_ASKED_EXIT,
    DEFAULT_HEARTBEAT,
    Worker,
    WorkerConfig,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one ``tickets`` subcommand; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in args:
        split = args.index("--")
        args, command = args[:split], args[split + 1 :]
    parsed = _parser().parse_args(args)
    if not parsed.queue:
        print("tickets: no queue folder: pass --queue DIR or set TICKET_QUEUE", file=sys.stderr)
        return 2
    try:
        queue = QueueDir.from_env(parsed.queue)
        if not queue.root.is_dir():
            print(f"tickets: {queue.root} is not a folder", file=sys.stderr)
            return 2
        handler = _HANDLERS[parsed.command]
        return handler(queue, parsed, command)
    except (SuffixError, BadInput) as error:
        print(f"tickets: {error}", file=sys.stderr)
        return 2
    except Refused as error:
        print(f"tickets: {error}", file=sys.stderr)
        return 1


WORKER_USAGE = "tickets worker [options] -- CMD {path}"
WORKER_DESCRIPTION = (
    "Claim the best open ticket, run CMD (with any arguments) on it, record the outcome, repeat. "
    "In CMD's arguments {path} becomes the claimed .wip file and {hash} the ticket's hash, e.g. "
    "`tickets worker --queue Q -- my-runner {path}`. Exit 0 finishes the ticket; --asked-exit "
    "records a question; anything else counts a failure."
)


def _parser() -> argparse.ArgumentParser:
    """The ``tickets`` parser. ``allow_abbrev=False`` everywhere (issue 15 §2): a prefix such as
    ``--js`` is an error, never silently another option; every option's help shows its default."""
    queue_default = os.environ.get("TICKET_QUEUE")
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument(
        "--queue",
        default=queue_default,
        metavar="DIR",
        help=f"the queue folder (default: $TICKET_QUEUE, now {queue_default or 'unset'})",
    )
    parser = argparse.ArgumentParser(
        prog="tickets",
        description="A queue of Markdown tickets whose file names are their state (seed 001).",
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, text: str, usage: str | None = None, description: str | None = None
    ) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            parents=[common],
            help=text,
            usage=usage,
            description=description or text,
            allow_abbrev=False,
        )

    new = command("new", "write a new open ticket; prints its hash")
    new.add_argument("--title", required=True, help="what is asked (required)")
    new.add_argument(
        "--priority", type=int, default=3, help="1–5, 5 most urgent (default: %(default)s)"
    )
    new.add_argument(
        "--dep",
        action="append",
        default=[],
        metavar="HASH",
        help="a ticket that must be done first; repeat for more (default: none)",
    )
    new.add_argument("--body", default="", help="the ticket's text (default: empty)")

    listing = command("list", "show tickets, totals, the bell and invalid files")
    listing.add_argument(
        "--status",
        choices=[str(s) for s in Status],
        help="show only tickets in this engine state (default: all)",
    )
    listing.add_argument(
        "--json", action="store_true", help="print the board's data as JSON (default: a table)"
    )

    answer = command("answer", "answer a ticket's question")
    answer.add_argument("hash", help="the ticket waiting for an answer")
    answer.add_argument("text", help="the answer")
    answer.add_argument("--by", default=_user(), help="who answers (default: %(default)s)")

    for name, text in (
        ("unassign", "remove session_id – and nothing else – from an open ticket"),
        ("retry", "forget a ticket's failures so it is dispatched again"),
    ):
        command(name, text).add_argument("hash", help="the open ticket")

    reclaim = command("reclaim", "free dead sessions' tickets")
    reclaim.add_argument(
        "--ttl",
        type=float,
        default=DEFAULT_TTL,
        help="seconds without a heartbeat after which a session is dead (default: %(default)s)",
    )

    worker = command(
        "worker",
        "run sessions: tickets worker --queue DIR -- CMD {path}",
        usage=WORKER_USAGE,
        description=WORKER_DESCRIPTION,
    )
    worker.add_argument(
        "--asked-exit",
        type=int,
        default=DEFAULT_ASKED_EXIT,
        help="CMD's exit code for 'asked a person a question' (default: %(default)s)",
    )
    worker.add_argument(
        "--heartbeat",
        type=float,
        default=DEFAULT_HEARTBEAT,
        help="seconds between heartbeats while CMD runs (default: %(default)s)",
    )
    worker.add_argument(
        "--ttl",
        type=float,
        default=DEFAULT_TTL,
        help="seconds without a heartbeat after which a session is dead (default: %(default)s)",
    )
    worker.add_argument(
        "--max-failures",
        type=int,
        default=DEFAULT_MAX_FAILURES,
        help="failed sessions after which a ticket rests in the bell (default: %(default)s)",
    )
    worker.add_argument(
        "--poll",
        type=float,
        default=2.0,
        help="seconds to wait when nothing is to be done (default: %(default)s)",
    )
    worker.add_argument(
        "--exit-when-idle",
        action="store_true",
        help="exit when no ticket is a candidate (default: keep waiting)",
    )
    worker.add_argument(
        "--max-tickets",
        type=int,
        metavar="N",
        help="exit after N sessions (default: no limit)",
    )

    board = command("board", "serve the board page")
    board.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    board.add_argument(
        "--port", type=int, default=8765, help="0 picks a free port (default: %(default)s)"
    )
    board.add_argument(
        "--refresh-seconds",
        type=float,
        default=5.0,
        help="how often the page re-reads the queue (default: %(default)s)",
    )
    board.add_argument(
        "--max-failures",
        type=int,
        default=DEFAULT_MAX_FAILURES,
        help="failed sessions after which the bell lists a ticket (default: %(default)s)",
    )
    return parser


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "someone"


def _new(queue: QueueDir, args: argparse.Namespace, _: list[str]) -> int:
    ticket_hash = store.create_ticket(
        queue, args.title, priority=args.priority, deps=tuple(args.dep), body=args.body
    )
    print(ticket_hash)
    return 0


def _list(queue: QueueDir, args: argparse.Namespace, _: list[str]) -> int:
    snapshot = store.read_snapshot(queue)
    verdicts = snapshot.judge()
    data = view.board(verdicts, now=time.time(), invalid=snapshot.invalid)
    if args.json:
        print(json.dumps(data, ensure_ascii=False, indent=2))
        return 0
    for verdict in verdicts:
        if args.status and str(verdict.status) != args.status:
            continue
        ticket = verdict.ticket
        marks = [str(r) for r in verdict.reasons]
        print(
            f"{ticket.hash:<14} {verdict.status!s:<15} p{verdict.effective_priority} "
            f"{ticket.title}" + (f"  [{', '.join(marks)}]" if marks else "")
        )
    print(data["totals"]["text"])
    bell = data["bell"]
    if bell["stuck"]:
        print(f"bell: {len(bell['stuck'])} tickets nobody picks up")
        for item in bell["stuck"]:
            print(f"  {item['hash']}  {item['title']}: {'; '.join(item['details'])}")
    if bell["answers"]:
        print(f"bell: {len(bell['answers'])} questions waiting for an answer")
        for item in bell["answers"]:
            print(f"  {item['hash']}  {item['title']}: {item['question']} ({item['days']}d)")
    if bell["invalid"]:
        # issue 12 §8: the "invalid" state, with its reason; never given to a worker.
        print(f"bell: {len(bell['invalid'])} invalid files nobody picks up")
        for item in bell["invalid"]:
            print(f"  {item['file']}  invalid: {item['reason']}")
    return 0


def _answer(queue: QueueDir, args: argparse.Namespace, _: list[str]) -> int:
    path = store.answer(queue, args.hash, args.text, args.by, now=time.time())
    print(path.name)
    return 0


def _unassign(queue: QueueDir, args: argparse.Namespace, _: list[str]) -> int:
    store.unassign(queue, args.hash)
    return 0


def _retry(queue: QueueDir, args: argparse.Namespace, _: list[str]) -> int:
    store.clear_failures(queue, args.hash)
    return 0


def _reclaim(queue: QueueDir, args: argparse.Namespace, _: list[str]) -> int:
    for item in reclaim_stale(queue, ttl=args.ttl):
        print(f"{item.hash} reclaimed from session {item.session_id}")
    return 0


def _worker(queue: QueueDir, args: argparse.Namespace, command: list[str]) -> int:
    if not command:
        print(f"tickets worker: give the command after --: {WORKER_USAGE}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="tickets worker: %(message)s")
    worker = Worker(
        WorkerConfig(
            queue=queue,
            command=tuple(command),
            asked_exit=args.asked_exit,
            heartbeat=args.heartbeat,
            ttl=args.ttl,
            max_failures=args.max_failures,
            poll=args.poll,
            exit_when_idle=args.exit_when_idle,
            max_tickets=args.max_tickets,
        )
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: worker.request_stop())
    worker.run()
    return 0


def _board(queue: QueueDir, args: argparse.Namespace, _: list[str]) -> int:
    from mediator.tickets.board.server import serve  # FastAPI is imported only for the board

    return serve(
        queue,
        host=args.host,
        port=args.port,
        refresh_seconds=args.refresh_seconds,
        max_failures=args.max_failures,
    )


_HANDLERS = {
    "new": _new,
    "list": _list,
    "answer": _answer,
    "unassign": _unassign,
    "retry": _retry,
    "reclaim": _reclaim,
    "worker": _worker,
    "board": _board,
}
