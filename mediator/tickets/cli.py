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
from mediator.tickets.files import BadName
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
    except (SuffixError, BadName) as error:
        print(f"tickets: {error}", file=sys.stderr)
        return 2
    except Refused as error:
        print(f"tickets: {error}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--queue",
        default=os.environ.get("TICKET_QUEUE"),
        help="the queue folder (default: $TICKET_QUEUE)",
    )
    parser = argparse.ArgumentParser(
        prog="tickets",
        description="A queue of Markdown tickets whose file names are their state (seed 001).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    new = sub.add_parser("new", parents=[common], help="write a new open ticket; prints its hash")
    new.add_argument("--title", required=True)
    new.add_argument("--priority", type=int, default=3, help="1–5, 5 most urgent (default 3)")
    new.add_argument("--dep", action="append", default=[], help="a hash that must be done first")
    new.add_argument("--body", default="", help="the ticket's text")

    listing = sub.add_parser("list", parents=[common], help="show tickets and the bell")
    listing.add_argument("--status", choices=[str(s) for s in Status])
    listing.add_argument("--json", action="store_true", help="print the board's data as JSON")

    answer = sub.add_parser("answer", parents=[common], help="answer a ticket's question")
    answer.add_argument("hash")
    answer.add_argument("text")
    answer.add_argument("--by", default=_user(), help="who answers (default: your user name)")

    for name, text in (
        ("unassign", "remove session_id – and nothing else – from an open ticket"),
        ("retry", "forget a ticket's failures so it is dispatched again"),
    ):
        sub.add_parser(name, parents=[common], help=text).add_argument("hash")

    reclaim = sub.add_parser("reclaim", parents=[common], help="free dead sessions' tickets")
    reclaim.add_argument("--ttl", type=float, default=DEFAULT_TTL)

    worker = sub.add_parser(
        "worker", parents=[common], help="run sessions: tickets worker --queue DIR -- CMD {path}"
    )
    worker.add_argument("--asked-exit", type=int, default=DEFAULT_ASKED_EXIT)
    worker.add_argument("--heartbeat", type=float, default=DEFAULT_HEARTBEAT)
    worker.add_argument("--ttl", type=float, default=DEFAULT_TTL)
    worker.add_argument("--max-failures", type=int, default=DEFAULT_MAX_FAILURES)
    worker.add_argument("--poll", type=float, default=2.0)
    worker.add_argument("--exit-when-idle", action="store_true")
    worker.add_argument("--max-tickets", type=int)

    board = sub.add_parser("board", parents=[common], help="serve the board page")
    board.add_argument("--host", default="127.0.0.1")
    board.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    board.add_argument("--refresh-seconds", type=float, default=5.0)
    board.add_argument("--max-failures", type=int, default=DEFAULT_MAX_FAILURES)
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
        print("tickets worker: give the command after --, e.g. -- CMD {path}", file=sys.stderr)
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
