"""``runctl``: the Mediator's client command line (docs/design.md §19).

A person or a script submits contracts, reads runs and the fleet, cancels, and answers asks through
the HTTP API only (``mediator.client``). The output is made for both: the first line says what
happened in words a checkpoint can compare (``201 · RUNNING``, ``QUEUED``), the lines after it give
details, ``--json`` prints the body as the server sent it, and the exit status follows the HTTP
status: 0 for 200/201/202, 3 for 422 ("no node can serve this contract"), 2 for usage errors,
1 for anything else — a server that cannot be reached prints one line, never a traceback.

``submit --wait`` and ``watch`` poll ``GET /v1/runs/{id}`` every ``--interval`` seconds until the
run is terminal or ``--timeout`` passes; they then exit 0 if the run PASSED and 1 otherwise, so
``runctl submit --wait a.json && next`` does what a shell user expects.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from mediator.argtypes import positive_float, positive_int
from mediator.client import DEFAULT_URL, ApiError, Client, Reply

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_REJECTED = 3
EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT
TERMINAL = frozenset({"PASSED", "FAILED"})
DEFAULT_INTERVAL = 1.0
DEFAULT_TIMEOUT = 3600.0
SEP = " · "


class UsageError(Exception):
    """A mistake in what the user typed or pointed at (exit 2), found after argparse."""


class WaitTimeout(Exception):
    """``--wait``/``watch`` gave up before the run ended (exit 1)."""


def build_parser() -> argparse.ArgumentParser:
    """The parser; ``--url``, ``--token`` and ``--json`` work before or after the command."""
    # SUPPRESS as the default lets the same options sit on the main parser and on every
    # subparser without the subparser's default overwriting a value given before the command.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help=f"Mediator base URL (default: $MEDIATOR_URL or {DEFAULT_URL})",
    )
    common.add_argument(
        "--token", default=argparse.SUPPRESS, help="bearer token (default: $MEDIATOR_TOKEN)"
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the response body as JSON instead of text",
    )
    parser = argparse.ArgumentParser(
        prog="runctl",
        parents=[common],
        description="Submit and follow runs on a Mediator over its HTTP API.",
        epilog="Exit status: 0 for 200/201/202, 3 for 422, 2 for usage errors, 1 otherwise.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("submit", parents=[common], help="submit a contract (JSON or TOML file)")
    p.add_argument("file", metavar="FILE", help="contract file (.json or .toml; - for stdin JSON)")
    p.add_argument("--dry-run", action="store_true", help="match only; create nothing")
    p.add_argument("--wait", action="store_true", help="poll until the run is PASSED or FAILED")
    _add_polling(p)

    p = sub.add_parser("status", parents=[common], help="show one run")
    p.add_argument("run_id", metavar="RUN_ID")

    p = sub.add_parser("list", parents=[common], help="list runs, newest first")
    p.add_argument("--state", help="QUEUED, RUNNING, PASSED or FAILED")
    p.add_argument("--work", dest="work_id", metavar="W", help="only runs of this work_id")
    p.add_argument("--limit", type=positive_int, help="at most this many runs (server: 100)")

    p = sub.add_parser("cancel", parents=[common], help="cancel a run")
    p.add_argument("run_id", metavar="RUN_ID")

    sub.add_parser("nodes", parents=[common], help="list live nodes")
    sub.add_parser("asks", parents=[common], help="list open asks")

    p = sub.add_parser("answer", parents=[common], help="answer an ask")
    p.add_argument("ask_id", metavar="ASK_ID")
    p.add_argument("text", metavar="TEXT")
    p.add_argument("--no", action="store_true", help="answer no: the ask step FAILS")

    p = sub.add_parser("watch", parents=[common], help="follow a run until it ends")
    p.add_argument("run_id", metavar="RUN_ID")
    _add_polling(p)
    return parser


def _add_polling(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--interval",
        type=positive_float,
        default=DEFAULT_INTERVAL,
        help=f"seconds between polls (default {DEFAULT_INTERVAL:g})",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT,
        help=f"give up after this many seconds (default {DEFAULT_TIMEOUT:g})",
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
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage; main() returns, never exits
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    as_json = getattr(args, "json", False)
    url = getattr(args, "url", None) or os.environ.get("MEDIATOR_URL") or DEFAULT_URL
    token = getattr(args, "token", None) or os.environ.get("MEDIATOR_TOKEN") or None
    cli = Command(client or Client(url, token), out=out, as_json=as_json, sleep=sleep, clock=clock)
    try:
        return cli.dispatch(args)
    except UsageError as exc:
        print(f"runctl: {exc}", file=err)
        return EXIT_USAGE
    except WaitTimeout as exc:
        print(f"runctl: {exc}", file=err)
        return EXIT_ERROR
    except ApiError as exc:
        if as_json and exc.body is not None:
            cli.dump(exc.body)
        print(f"runctl: {exc}", file=err)
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
        for line in lines:
            print(line, file=self.out)

    def dump(self, body: Any) -> None:
        print(json.dumps(body, indent=2, ensure_ascii=False), file=self.out)

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
        return EXIT_REJECTED if reply.status == 422 else EXIT_OK

    def cmd_status(self, args: argparse.Namespace) -> int:
        run = self.client.get_run(args.run_id)
        if self.as_json:
            self.dump(run)
        else:
            self.say(*run_lines(run))
        return EXIT_OK

    def cmd_list(self, args: argparse.Namespace) -> int:
        body = self.client.list_runs(state=args.state, work_id=args.work_id, limit=args.limit)
        if self.as_json:
            self.dump(body)
            return EXIT_OK
        rows = [
            [
                r.get("run_id", ""),
                r.get("state", ""),
                r.get("verdict") or "",
                r.get("work_id") or "",
                r.get("created_at") or "",
                ", ".join(
                    f"{c.get('node')}:{c.get('step')}#{c.get('attempt')}"
                    for c in r.get("current") or []
                ),
            ]
            for r in body.get("runs", [])
        ]
        self.say(*table(["RUN", "STATE", "VERDICT", "WORK", "CREATED", "CURRENT"], rows))
        return EXIT_OK

    def cmd_cancel(self, args: argparse.Namespace) -> int:
        run = self.client.cancel(args.run_id)
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
            ]
            for n in body.get("nodes", [])
        ]
        self.say(*table(["NODE", "LABEL", "DRAIN", "LEASE", "EXPIRES", "CAPABILITIES"], rows))
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
        return self._follow(args.run_id, args, quiet=False, seen=None)

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
                print(json.dumps(run, ensure_ascii=False), file=self.out)
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


def run_lines(run: dict[str, Any]) -> list[str]:
    """What ``status`` prints; the first line is the state alone (``QUEUED``, ``RUNNING``…)."""
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


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart; the last column is not padded."""
    if not rows:
        return ["(none)"]
    cells = [list(headers), *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip()
        for r in cells
    ]


if __name__ == "__main__":
    sys.exit(main())
