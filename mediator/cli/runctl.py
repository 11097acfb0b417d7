"""``runctl``: the Mediator's client command line (docs/design.md §19).

A person or a script submits contracts, reads runs and the fleet, cancels, and answers asks through
the HTTP API only (``mediator.client``). The output is made for both: the first line says what
happened in words a checkpoint can compare (``201 · RUNNING``, ``QUEUED``), the lines after it give
details, ``--json`` prints the body as the server sent it, and the exit status says what happened
(``EXIT_STATUS`` below, printed by ``runctl --help``): 0 for 200/201/202, 3 for 422 ("no node can
serve this contract"), 2 for usage errors, 1 for anything else — with distinct statuses for an
unknown run, a wait that timed out and a server that cannot be reached (issue 15 §4), each a
single line on stderr, never a traceback. A closed pipe (``runctl list | head``) ends the command
quietly with 141, as a Unix tool killed by SIGPIPE does (issue 12 §7).

``submit --wait`` and ``watch`` poll ``GET /v1/runs/{id}`` every ``--interval`` seconds until the
run is terminal or ``--timeout`` passes; they then exit 0 if the run PASSED and 1 if it FAILED, so
``runctl submit --wait a.json && next`` does what a shell user expects.

``list`` reads like ``squeue``: a short id, the state, the queue position and reason of a queued
run, its age, its nodes and what it does now — including "waiting for an answer" for a run held up
by an ask. Positions and reasons come with the list itself (``GET /v1/runs``), so a listing costs
two requests however many runs wait.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from mediator.argtypes import SuggestingParser, positive_float, positive_int
from mediator.client import (
    DEFAULT_URL,
    ApiError,
    Client,
    Reply,
    Unreachable,
    printable,
    printable_json,
    read_token_file,
)

EXIT_OK = 0
EXIT_ERROR = 1  # also: the run watched ended FAILED
EXIT_USAGE = 2
EXIT_REJECTED = 3
EXIT_UNKNOWN_RUN = 4
EXIT_TIMEOUT = 5
EXIT_UNREACHABLE = 6
EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what `yes | head` leaves in $PIPESTATUS
EXIT_STATUS = f"""\
exit status:
  {EXIT_OK}    success (200/201/202); watch and submit --wait: the run PASSED
  {EXIT_ERROR}    watch and submit --wait: the run FAILED; any other error the server answered
  {EXIT_USAGE}    usage error (a bad option, an unreadable contract file)
  {EXIT_REJECTED}    422: no node can serve this contract (the run is FAILED, or no node offers a
       step's action: unknown_action, nothing written); submit --dry-run:
       the contract would be refused so (NO_CANDIDATE)
  {EXIT_UNKNOWN_RUN}    no such run (status, watch, cancel)
  {EXIT_TIMEOUT}    watch and submit --wait: --timeout passed before the run ended
  {EXIT_UNREACHABLE}    the server cannot be reached
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); a watched run is not cancelled
  {EXIT_BROKEN_PIPE}  the output was closed (e.g. piped into head)"""
STATES = ("QUEUED", "RUNNING", "PASSED", "FAILED")
OUTPUTS = ("table", "wide", "json")
TERMINAL = frozenset({"PASSED", "FAILED"})
DEFAULT_INTERVAL = 1.0
DEFAULT_TIMEOUT = 3600.0
SEP = " · "


class UsageError(Exception):
    """A mistake in what the user typed or pointed at (exit 2), found after argparse."""


class WaitTimeout(Exception):
    """``--wait``/``watch`` gave up before the run ended (exit 1)."""


def build_parser() -> argparse.ArgumentParser:
    """The parser; ``--url``, ``--token`` and ``--json`` work before or after the command.

    No parser accepts abbreviations (issue 15 §2): ``--j`` is not ``--json`` today and cannot
    become ambiguous tomorrow. Every option says what it does and its default.
    """
    # SUPPRESS as the default lets the same options sit on the main parser and on every
    # subparser without the subparser's default overwriting a value given before the command.
    common = SuggestingParser(add_help=False, allow_abbrev=False)
    common.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help=f"Mediator base URL (default: $MEDIATOR_URL or {DEFAULT_URL})",
    )
    common.add_argument(
        "--token-file",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="file holding the bearer token, mode 0600 (default: $MEDIATOR_TOKEN_FILE, else "
        "$MEDIATOR_TOKEN, else none: a --dev server)",
    )
    common.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        help="bearer token; visible to every local user in the process list, prefer "
        "--token-file (default: none)",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the response body as JSON instead of text (default: text)",
    )
    parser = SuggestingParser(
        prog="runctl",
        parents=[common],
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Submit and follow runs on a Mediator over its HTTP API.",
        epilog=EXIT_STATUS,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            parents=[common],
            help=help,
            description=help[0].upper() + help[1:] + ".",
            allow_abbrev=False,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=EXIT_STATUS,
        )

    p = command("submit", "submit a contract (JSON or TOML file)")
    p.add_argument("file", metavar="FILE", help="contract file (.json or .toml; - for stdin JSON)")
    p.add_argument(
        "--dry-run", action="store_true", help="match only; create nothing (default: off)"
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="poll until the run is PASSED or FAILED (default: off: print and return)",
    )
    _add_polling(p)

    p = command("status", "show one run")
    p.add_argument("run_id", metavar="RUN_ID", help="the run's id")

    p = command("logs", "print a step's log (every step's, each under a header, without STEP)")
    p.add_argument("run_id", metavar="RUN_ID", help="the run's id")
    p.add_argument("step", metavar="STEP", nargs="?", help="a step's name or seq (default: all)")

    p = command("list", "list runs, newest first, with queue position and reason")
    p.add_argument(
        "--state",
        type=str.upper,
        choices=STATES,
        metavar="STATE",
        help="only runs in this state: queued, running, passed or failed, any case (default: all)",
    )
    p.add_argument(
        "--work", dest="work_id", metavar="W", help="only runs of this work_id (default: all)"
    )
    p.add_argument(
        "--limit",
        type=positive_int,
        help="at most this many runs, 1 to 1000 (default: the server's, 100)",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="table",
        help="table: the short columns; wide: every column, full ids and reasons; "
        "json: the body as --json (default: table)",
    )

    p = command("cancel", "cancel a run")
    p.add_argument("run_id", metavar="RUN_ID", help="the run's id")

    command("nodes", "list live nodes")
    command("asks", "list open asks")

    p = command("answer", "answer an ask")
    p.add_argument("ask_id", metavar="ASK_ID", help="the ask's id (runctl asks)")
    p.add_argument("text", metavar="TEXT", help="the answer, kept in the run's record")
    p.add_argument("--no", action="store_true", help="answer no: the ask step FAILS (default: yes)")

    p = command("watch", "follow a run until it ends")
    p.add_argument("run_id", metavar="RUN_ID", help="the run's id")
    _add_polling(p)
    return parser


def _add_polling(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--interval",
        type=positive_float,
        default=DEFAULT_INTERVAL,
        help=f"seconds between polls (default: {DEFAULT_INTERVAL:g})",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT,
        help=f"give up after this many seconds, exit {EXIT_TIMEOUT} (default: {DEFAULT_TIMEOUT:g})",
    )


def main(
    argv: list[str] | None = None,
    *,
    client: Client | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run one ``runctl`` command.

    Args:
        argv: Arguments without the program name; ``None`` reads ``sys.argv``.
        client: A client to use instead of one built from ``--url``/``--token`` (tests).
        stdout: Where results go (default ``sys.stdout``).
        stderr: Where errors go (default ``sys.stderr``).
        sleep: How ``--wait``/``watch`` wait between polls.
        clock: Monotonic seconds, for ``--timeout``.

    Returns:
        The exit status (see the module docstring).
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    try:
        code = _main(argv, client, out, err, sleep, clock)
        out.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return code
    except BrokenPipeError:
        # issue 12 §7: `runctl list | head` — the reader has gone; stop quietly, like any Unix
        # tool. Point stdout at /dev/null so the interpreter's final flush cannot complain.
        if out is sys.stdout:
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def resolve_token(args: argparse.Namespace, err: TextIO) -> str | None:
    """The bearer token, as ``enode`` finds its own (docs/security.md "Tokens on the command
    line"): ``--token-file`` (0600, one line), else ``--token`` (with a warning: a command line
    is readable by every local user), else the file in ``$MEDIATOR_TOKEN_FILE``, else
    ``$MEDIATOR_TOKEN``, else none (a ``--dev`` server).

    Raises:
        ValueError: Both flags given, or a bad token file.
    """
    token_file = getattr(args, "token_file", None)
    token = getattr(args, "token", None)
    if token_file and token:
        raise ValueError("give --token-file or --token, not both")
    if token_file:
        return read_token_file(token_file)
    if token:
        print(
            "runctl: warning: --token is readable by every local user in the process list; "
            "use --token-file FILE (mode 0600) instead",
            file=err,
        )
        return str(token)
    if os.environ.get("MEDIATOR_TOKEN_FILE"):
        return read_token_file(os.environ["MEDIATOR_TOKEN_FILE"])
    return os.environ.get("MEDIATOR_TOKEN") or None


def _main(
    argv: list[str] | None,
    client: Client | None,
    out: TextIO,
    err: TextIO,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage; main() returns, never exits
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    as_json = getattr(args, "json", False)
    url = getattr(args, "url", None) or os.environ.get("MEDIATOR_URL") or DEFAULT_URL
    try:
        token = resolve_token(args, err)
    except ValueError as exc:
        print(f"runctl: {printable(str(exc))}", file=err)
        return EXIT_USAGE
    cli = Command(client or Client(url, token), out=out, as_json=as_json, sleep=sleep, clock=clock)
    try:
        return cli.dispatch(args)
    except UsageError as exc:
        print(f"runctl: {printable(str(exc))}", file=err)
        return EXIT_USAGE
    except WaitTimeout as exc:
        print(f"runctl: {printable(str(exc))}", file=err)
        return EXIT_TIMEOUT
    except Unreachable as exc:
        print(f"runctl: {printable(str(exc))}", file=err)
        return EXIT_UNREACHABLE
    except ApiError as exc:
        if as_json and exc.body is not None:
            cli.dump(exc.body)
        print(f"runctl: {printable(str(exc))}", file=err)
        if exc.status == 422:  # no node can serve the contract (unknown_action): as a 422 run
            return EXIT_REJECTED
        return EXIT_UNKNOWN_RUN if exc.code == "unknown_run" else EXIT_ERROR
    except (KeyError, TypeError, AttributeError) as exc:
        # A field of an answer that is not what a Mediator sends, met while printing it
        # (issue 25 §9): one line, never a traceback.
        shown = printable(f"{type(exc).__name__}: {exc}")[:200]
        print(f"runctl: the server's answer is not one a Mediator gives ({shown})", file=err)
        return EXIT_ERROR
    except KeyboardInterrupt:  # Ctrl-C during watch/--wait: the run goes on; say so, no traceback
        print("runctl: interrupted (the run is not cancelled)", file=err)
        return EXIT_INTERRUPTED
    finally:
        if client is None:
            cli.client.close()


class Command:
    """The commands, each a method that prints its result and returns the exit status."""

    def __init__(
        self,
        client: Client,
        *,
        out: TextIO,
        as_json: bool,
        sleep: Callable[[float], None],
        clock: Callable[[], float],
    ) -> None:
        self.client = client
        self.out = out
        self.as_json = as_json
        self.sleep = sleep
        self.clock = clock

    def dispatch(self, args: argparse.Namespace) -> int:
        handler: Callable[[argparse.Namespace], int] = getattr(self, f"cmd_{args.command}")
        return handler(args)

    def say(self, *lines: str) -> None:
        """Print lines of text; whatever came from the server is escaped (issue 25 §8)."""
        for line in lines:
            print(printable(line), file=self.out)

    def dump(self, body: Any, indent: int | None = 2) -> None:
        """Print a body as JSON, with the characters a terminal would obey escaped."""
        print(printable_json(json.dumps(body, indent=indent, ensure_ascii=False)), file=self.out)

    # ---- commands ------------------------------------------------------------------------------

    def cmd_submit(self, args: argparse.Namespace) -> int:
        reply = self.client.submit(read_contract(args.file), dry_run=args.dry_run)
        body = reply.body if isinstance(reply.body, dict) else {}
        if args.wait and not args.dry_run and reply.status != 422:
            if not self.as_json:
                self.say(*submit_lines(reply))
            return self._follow(body.get("run_id", ""), args, quiet=not self.as_json, seen=body)
        if self.as_json:
            self.dump(reply.body)
        else:
            self.say(*submit_lines(reply))
        # A dry run answers 200 even for a contract no node can serve (NO_CANDIDATE, which submit
        # refuses: 422): exit 3 all the same, so a script can gate on `submit --dry-run` (issue
        # 29). ALL_BUSY would queue, and TOO_WIDE may (R10): those stay 0, as their submit's 202.
        reject = body.get("reject") if args.dry_run else None
        refused = reply.status == 422 or (
            isinstance(reject, dict) and reject.get("code") == "NO_CANDIDATE"
        )
        return EXIT_REJECTED if refused else EXIT_OK

    def full_id(self, given: str) -> str | None:
        """The one run among the latest 1000 whose id ends with ``given`` (the short ids of
        ``list``, with or without their ``…``), or ``None``."""
        tail = given.removeprefix("…")
        if len(tail) < 4:
            return None
        runs = self.client.list_runs(limit=1000).get("runs") or []
        found = {str(r.get("run_id")) for r in runs if str(r.get("run_id", "")).endswith(tail)}
        return found.pop() if len(found) == 1 else None

    def get_run(self, given: str) -> dict[str, Any]:
        """``GET /v1/runs/{id}``, also for an id as ``list`` shortens it."""
        try:
            return self.client.get_run(given)
        except ApiError as exc:
            full = self.full_id(given) if exc.code == "unknown_run" else None
            if full is None:
                raise
            return self.client.get_run(full)

    def cmd_status(self, args: argparse.Namespace) -> int:
        run = self.get_run(args.run_id)
        if self.as_json:
            self.dump(run)
        else:
            self.say(*run_lines(run, self.reasons(run)))
        return EXIT_OK

    def step_logs(self, run: dict[str, Any]) -> dict[int, str]:
        """``{seq: record file}`` of the run's step logs; empty until the record has them (the
        logs are written when the run ends, docs/design.md §7.7)."""
        try:
            manifest = self.client.record(str(run.get("run_id", "")))
        except ApiError as exc:
            if exc.status == 404:
                return {}
            raise
        names = manifest.get("sha256") if manifest.get("sealed") else manifest.get("files")
        found: dict[int, str] = {}
        for name in names or ():
            head, _, rest = str(name).removeprefix("steps/").partition("-")
            if str(name).startswith("steps/") and rest.endswith(".log") and head.isdigit():
                found[int(head)] = str(name)
        return found

    def reasons(self, run: dict[str, Any]) -> dict[int, str]:
        """Why each FAILED or SKIPPED step ended so (issue 29): a failure's last log lines."""
        steps = run.get("steps") or []
        ended = [s for s in steps if s.get("state") in ("FAILED", "SKIPPED")]
        if not ended:
            return {}
        logs = self.step_logs(run) if any(s.get("state") == "FAILED" for s in ended) else {}
        out: dict[int, str] = {}
        for s in ended:
            seq = int(s.get("seq", -1))
            if s.get("state") == "SKIPPED":
                out[seq] = "skipped: a step it waits for did not pass"
                continue
            text = self.client.record_text(str(run["run_id"]), logs[seq]) if seq in logs else ""
            tail = [line for line in text.split("\n") if line.strip()][-REASON_LINES:]
            out[seq] = " | ".join(printable(line) for line in tail) or "no log yet (runctl logs)"
        return out

    def cmd_logs(self, args: argparse.Namespace) -> int:
        run = self.get_run(args.run_id)
        steps = run.get("steps") or []
        if args.step is not None:
            steps = [s for s in steps if args.step in (s.get("name"), str(s.get("seq")))]
            if not steps:
                raise ApiError(404, "unknown_step", f"Run has no step {printable(args.step)}.")
        logs = self.step_logs(run)
        for s in steps:
            seq = int(s.get("seq", -1))
            if args.step is None:
                self.say(f"==> {seq} {printable(str(s.get('name', '')))} {s.get('state', '')} <==")
            if seq in logs:
                text = self.client.record_text(str(run["run_id"]), logs[seq])
                self.out.write(printable(text, keep="\n\t"))
                if text and not text.endswith("\n"):
                    self.say("")
            else:
                self.say("(no log yet: the logs enter the run's record when the run ends)")
        return EXIT_OK

    def cmd_list(self, args: argparse.Namespace) -> int:
        body = self.client.list_runs(state=args.state, work_id=args.work_id, limit=args.limit)
        if self.as_json or args.output == "json":
            self.dump(body)
            return EXIT_OK
        runs = body.get("runs") or []
        # An ask holds a RUNNING run (and its nodes) until a person answers: one more request,
        # and only when some listed run could be waiting for one (issue 15 §4).
        asks = self.client.asks() if any(r.get("state") == "RUNNING" for r in runs) else []
        self.say(*list_lines(body, asks, wide=args.output == "wide"))
        return EXIT_OK

    def cmd_cancel(self, args: argparse.Namespace) -> int:
        try:
            run = self.client.cancel(args.run_id)
        except ApiError as exc:
            full = self.full_id(args.run_id) if exc.code == "unknown_run" else None
            if full is None:
                raise
            run = self.client.cancel(full)
        if self.as_json:
            self.dump(run)
        else:
            self.say(f"200{SEP}{run.get('state', '')}", str(run.get("run_id", "")))
            if run.get("verdict"):
                self.say(f"verdict   {run['verdict']}")
        return EXIT_OK

    def cmd_nodes(self, args: argparse.Namespace) -> int:
        body = self.client.nodes()
        if self.as_json:
            self.dump(body)
            return EXIT_OK
        rows = [
            [
                n.get("node_id", ""),
                n.get("label") or "",
                n.get("drain") or "-",
                (n.get("lease") or {}).get("run_id") or "-",
                n.get("expires_at") or "",
                json.dumps(n.get("capabilities", {}), sort_keys=True, separators=(",", ":")),
                ",".join(map(str, n.get("actions") or [])) or "-",
            ]
            for n in body.get("nodes", [])
        ]
        head = ["NODE", "LABEL", "DRAIN", "LEASE", "EXPIRES", "CAPABILITIES", "ACTIONS"]
        self.say(*table(head, rows))
        return EXIT_OK

    def cmd_asks(self, args: argparse.Namespace) -> int:
        asks = self.client.asks()
        if self.as_json:
            self.dump({"asks": asks})
            return EXIT_OK
        rows = [
            [str(a.get("ask_id", "")), a.get("run_id", ""), str(a.get("seq", "")), a["question"]]
            for a in asks
        ]
        self.say(*table(["ASK", "RUN", "SEQ", "QUESTION"], rows))
        return EXIT_OK

    def cmd_answer(self, args: argparse.Namespace) -> int:
        result = self.client.answer(args.ask_id, args.text, ok=not args.no)
        if self.as_json:
            self.dump(result)
            return EXIT_OK
        self.say(f"200{SEP}{result.get('step_state', '')}")
        if result.get("settled"):
            self.say(f"run settled {result['settled']}")
        return EXIT_OK

    def cmd_watch(self, args: argparse.Namespace) -> int:
        first = self.get_run(args.run_id)
        return self._follow(first["run_id"], args, quiet=False, seen=None)

    # ---- polling -------------------------------------------------------------------------------

    def _follow(
        self, run_id: str, args: argparse.Namespace, *, quiet: bool, seen: dict[str, Any] | None
    ) -> int:
        """Poll a run until it is terminal, printing each change; PASSED → 0, else 1.

        ``quiet`` (``submit --wait`` in text mode) prints only the final state, since the submit
        lines already said where the run started. With ``--json``, ``watch`` prints each changed
        run as one JSON line and ``submit --wait`` prints only the final run.
        """
        deadline = self.clock() + args.timeout
        last = seen
        while True:
            run = self.client.get_run(run_id)
            if self.as_json and args.command == "watch" and run != last:
                self.dump(run, indent=None)
            elif not self.as_json and not quiet:
                self.say(*changes(last, run))
            last = run
            state = run.get("state", "")
            if state in TERMINAL:
                if self.as_json and args.command == "submit":
                    self.dump(run)
                elif quiet:
                    self.say(
                        state, *([f"verdict   {run['verdict']}"] if run.get("verdict") else [])
                    )
                return EXIT_OK if state == "PASSED" else EXIT_ERROR
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise WaitTimeout(f"run {run_id} is still {state} after {args.timeout:g} s")
            self.sleep(min(args.interval, remaining))


# ---- formatting (pure: tests compare whole outputs) ---------------------------------------------


def read_contract(path: str) -> Any:
    """Read a contract from a JSON or TOML file (``-``: JSON on stdin).

    Raises:
        UsageError: The file cannot be read or is neither valid JSON nor valid TOML.
    """
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text("utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text") from None
    if path.endswith(".toml"):
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path} is not valid TOML: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not valid JSON: {exc}") from None


def submit_lines(reply: Reply) -> list[str]:
    """What ``submit`` prints: ``201 · RUNNING`` then the run id (422: then the reject reason)."""
    body = reply.body if isinstance(reply.body, dict) else {}
    if body.get("dry_run"):
        lines = [f"{reply.status}{SEP}DRY RUN"]
        if body.get("reject"):
            lines.append(f"reject    {reject_text(body['reject'])}")
        else:
            lines.append(f"assigned  {assigned_text(body.get('assigned'))}")
            lines.append(f"width     {body.get('width')}")
        return lines
    lines = [f"{reply.status}{SEP}{body.get('state', '')}", str(body.get("run_id", ""))]
    if body.get("reject"):
        lines.append(reject_text(body["reject"]))
    return lines


REASON_LINES = 3  # a FAILED step's last log lines that ``status`` shows


def run_lines(run: dict[str, Any], reasons: dict[int, str] | None = None) -> list[str]:
    """What ``status`` prints; the first line is the state alone (``QUEUED``, ``RUNNING``…).

    ``reasons`` (``{seq: text}``) are printed under the steps table, one line per FAILED or
    SKIPPED step, so the cause is on screen, not in a file (issue 29)."""
    lines = [str(run.get("state", "")), f"run       {run.get('run_id', '')}"]
    if run.get("verdict"):
        lines.append(f"verdict   {run['verdict']}")
    if run.get("work_id"):
        lines.append(f"work      {run['work_id']}")
    if run.get("queue_position") is not None:
        lines.append(f"position  {run['queue_position']}")
    if run.get("wait_reason"):
        lines.append(f"waiting   {reject_text(run['wait_reason'])}")
    if run.get("assigned"):
        lines.append(f"assigned  {assigned_text(run['assigned'])}")
    if run.get("reject"):
        lines.append(f"reject    {reject_text(run['reject'])}")
    for key in ("created_at", "started_at", "ended_at"):
        if run.get(key):
            lines.append(f"{key.removesuffix('_at'):<9} {run[key]}")
    steps = run.get("steps") or []
    if steps:
        lines.append("steps")
        lines += [
            "  " + line
            for line in table(
                ["SEQ", "NAME", "STATE", "NODE", "ATTEMPT"],
                [
                    [
                        str(s.get("seq", "")),
                        s.get("name", ""),
                        s.get("state", ""),
                        s.get("node_id") or "-",
                        str(s.get("attempt", 0)),
                    ]
                    for s in steps
                ],
            )
        ]
        names = {int(s.get("seq", -1)): str(s.get("name", "")) for s in steps}
        for seq, why in sorted((reasons or {}).items()):
            lines.append(f"  why {seq} {printable(names.get(seq, ''))}: {why}")
    return lines


def changes(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """``watch`` lines: the run's state when it changes, then each step that changed."""
    lines = []
    if before is None or before.get("state") != after.get("state"):
        extra = f"{SEP}{after['verdict']}" if after.get("verdict") else ""
        if after.get("state") == "QUEUED" and after.get("queue_position") is not None:
            extra += f"{SEP}position {after['queue_position']}"
        lines.append(f"{after.get('state', '')}{extra}")
    old = {s.get("seq"): s for s in (before or {}).get("steps") or []}
    for s in after.get("steps") or []:
        key = (s.get("state"), s.get("node_id"), s.get("attempt"))
        prev = old.get(s.get("seq"))
        if (
            prev is not None
            and (prev.get("state"), prev.get("node_id"), prev.get("attempt")) == key
        ):
            continue
        if before is None and s.get("state") == "PENDING":
            continue  # a new watch lists the steps that have started, not the whole plan
        where = f" on {s['node_id']}" if s.get("node_id") else ""
        attempt = f" attempt {s['attempt']}" if s.get("attempt") else ""
        lines.append(f"  step {s.get('seq')} {s.get('name', '')}: {s.get('state')}{where}{attempt}")
    return lines


def _step_key(step: dict[str, Any]) -> tuple[Any, ...]:
    return (step.get("state"), step.get("node_id"), step.get("attempt"))


def reject_text(reject: dict[str, Any]) -> str:
    """``ALL_BUSY: Every node that can serve role "dut" is busy…``."""
    code = reject.get("code", "")
    message = reject.get("message", "")
    return f"{code}: {message}" if message else str(code)


def assigned_text(assigned: dict[str, str] | None) -> str:
    """``dut=node-a, host=node-b`` in role order."""
    return ", ".join(f"{role}={node}" for role, node in sorted((assigned or {}).items())) or "-"


def short_ids(ids: Sequence[str], least: int = 8) -> dict[str, str]:
    """Each id cut to its shortest tail (``least`` characters or more) that no other id on the
    list ends with, ``…`` marking the cut; ids no longer than that stay whole.

    Generated ids start with their submit time (``20261201T010203123456-9f3a6b21``), so the
    random tail is what tells them apart — ``git``'s shortest unique prefix would keep the
    timestamp and little else. ``status``, ``watch`` and ``cancel`` take the tail as well.
    """
    unique = list(dict.fromkeys(ids))
    shown: dict[str, str] = {}
    pending, n = unique, least
    # One pass per tail length, each counting every id's tail of that length: linear in the
    # number of ids (comparing each id with every other took minutes for 60,000, issue 25 §9).
    while pending:
        tails = Counter(r[-n:] for r in unique)
        rest = []
        for run_id in pending:
            if n < len(run_id) and tails[run_id[-n:]] > 1:
                rest.append(run_id)
            else:
                shown[run_id] = run_id if n + 1 >= len(run_id) else "…" + run_id[-n:]
        pending, n = rest, n + 1
    return shown


def age_text(seconds: float) -> str:
    """squeue's TIME format: ``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``."""
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{s:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{s:02d}"
    return f"{minutes}:{s:02d}"


def _seconds_between(start: str | None, end: str | None) -> float | None:
    try:
        return (
            datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))
        ).total_seconds()
    except ValueError:
        return None


def current_text(run: dict[str, Any], asks: Sequence[dict[str, Any]], *, wide: bool) -> str:
    """What a run does now: ``node:step`` per claimed step (``#2`` from the second attempt on),
    and ``waiting for an answer`` while an ask of the run is open."""
    parts = [
        f"{c.get('node')}:{c.get('step')}" + (f"#{c['attempt']}" if c.get("attempt", 1) > 1 else "")
        for c in run.get("current") or []
    ]
    for a in asks:
        if a.get("run_id") == run.get("run_id"):
            question = str(a.get("question", ""))
            if not wide and len(question) > 30:
                question = question[:29] + "…"
            parts.append(f"waiting for an answer (ask {a.get('ask_id')}: {question})")
    return ", ".join(parts) or "-"


def reason_text(run: dict[str, Any], *, wide: bool) -> str:
    """squeue's REASON: why a queued run waits; why a refused run was refused; else the verdict."""
    why = run.get("wait_reason") or run.get("reject")
    if why:
        if not wide:
            return str(why.get("code", ""))
        extra = [f"{k}: {', '.join(why[k])}" for k in ("busy", "draining") if why.get(k)]
        return SEP.join([reject_text(why), *extra])
    return str(run.get("verdict") or "-")


def list_lines(body: dict[str, Any], asks: Sequence[dict[str, Any]], *, wide: bool) -> list[str]:
    """What ``list`` prints (``-o wide``: full ids, the verdict, the work id, the creation time,
    which node fills each role and the whole wait reason)."""
    runs = body.get("runs") or []
    observed = body.get("observed_at")
    ids = short_ids([str(r.get("run_id", "")) for r in runs])
    rows = []
    for r in runs:
        run_id = str(r.get("run_id", ""))
        pos = r.get("queue_position")
        age = _seconds_between(r.get("created_at"), observed)
        assigned = r.get("assigned") or {}
        row = [
            run_id if wide else ids[run_id],
            str(r.get("state", "")),
            str(pos) if pos is not None else "-",
            reason_text(r, wide=wide),
            age_text(age) if age is not None else "-",
        ]
        if wide:
            nodes = ",".join(f"{role}={node}" for role, node in sorted(assigned.items()))
            row[2:2] = [str(r.get("verdict") or "-")]
            row += [nodes or "-", r.get("work_id") or "-", str(r.get("created_at") or "-")]
        else:
            row.append(",".join(sorted(set(assigned.values()))) or "-")
        row.append(current_text(r, asks, wide=wide))
        rows.append(row)
    headers = ["ID", "STATE", "POS", "REASON", "AGE", "NODES", "CURRENT"]
    if wide:
        headers = ["ID", "STATE", "VERDICT", "POS", "REASON", "AGE", "NODES", "WORK",
                   "CREATED", "CURRENT"]  # fmt: skip
    return table(headers, rows)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart; the last column is not padded."""
    if not rows:
        return ["(none)"]
    cells = [list(headers), *[[printable(str(c)) for c in r] for r in rows]]  # issue 25 §8
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip()
        for r in cells
    ]


if __name__ == "__main__":
    sys.exit(main())
