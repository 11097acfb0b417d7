"""``enode`` command line: start one node daemon against a Mediator (docs/design.md §19).

::

    enode --url http://127.0.0.1:8640 --node-id bench-1 --caps caps.toml [--label L]
          [--token-file FILE]
          [--drain graceful|at-boundary] [--drain-file PATH] [--poll SECONDS]
          [--long-poll SECONDS] [--keep-dir DIR] [--stop-grace SECONDS]

``--caps`` is a JSON or TOML file holding one object of capabilities (TOML when the name ends in
``.toml``). ``--url`` defaults to ``$MEDIATOR_URL``. The bearer token comes from
``--token-file`` (default ``$MEDIATOR_TOKEN_FILE``), a file only this account may read (mode
0600), or from ``$MEDIATOR_TOKEN``; ``--token T`` still works but warns, since a command line is
readable by every local user in ``/proc/PID/cmdline`` (issue 25 §3). The daemon removes
``MEDIATOR_TOKEN`` from its own environment once read, and a step's processes never get any
``MEDIATOR_*`` variable but the step's own (docs/security.md "enode").

Signals: SIGTERM or SIGINT drains gracefully — the current step and run finish, no new run starts —
then the program exits 0; a second one exits after the current step. While the Mediator does not
answer, a stopping node gives up after ``--stop-grace`` seconds. A result the Mediator refuses for
good (4xx) or never takes is kept in ``--keep-dir`` and the step reported failed with the reason.
SIGUSR1 sets the drain policy to ``graceful`` and SIGUSR2 clears it, without stopping.
``--drain-file``: while the file exists its content (``graceful``, ``at-boundary`` or empty) is
the policy; each change applies within a second (a held work poll is given up for it), and
removing the file brings back the ``--drain`` policy.

Idle, the daemon long-polls: its work poll asks the Mediator to hold the answer up to
``--long-poll`` seconds (default 25, ended before the next advert is due) and is answered as soon
as the node may have a step; against a Mediator that holds nothing it polls every ``--poll``
seconds (docs/design.md §19).

Exit status: 0 after a stop, 1 if the Mediator refuses the node (bad token, another owner's
``node_id``, invalid capabilities), 2 for usage errors (arguments, an unreadable caps file).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mediator.argtypes import non_negative_float, positive_float
from mediator.client import DEFAULT_URL, Client, read_token_file
from mediator.enode.daemon import DEFAULT_LONG_POLL, DEFAULT_POLL, DEFAULT_STOP_GRACE, Daemon

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="enode",
        description="Serve a Mediator as one node: advertise, claim steps, run them, report.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("MEDIATOR_URL") or DEFAULT_URL,
        help=f"Mediator base URL (default: $MEDIATOR_URL or {DEFAULT_URL})",
    )
    parser.add_argument("--node-id", required=True, help="this node's id (required, no default)")
    parser.add_argument(
        "--caps",
        required=True,
        metavar="FILE",
        help="capabilities: a JSON or TOML object (required, no default)",
    )
    parser.add_argument("--label", default="", help="a label for people (default: none)")
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        default=os.environ.get("MEDIATOR_TOKEN_FILE") or None,
        help="file holding the bearer token, mode 0600 (default: $MEDIATOR_TOKEN_FILE, else "
        "$MEDIATOR_TOKEN)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="bearer token; visible to every local user in the process list, prefer "
        "--token-file (default: none)",
    )
    parser.add_argument(
        "--drain",
        choices=("graceful", "at-boundary"),
        default="",
        help="start with this drain policy (default: none, the node takes new runs)",
    )
    parser.add_argument(
        "--drain-file",
        metavar="PATH",
        help="a file whose content is the drain policy while it exists (default: none)",
    )
    parser.add_argument(
        "--poll",
        type=positive_float,
        default=DEFAULT_POLL,
        metavar="SECONDS",
        help=f"seconds between work polls when idle (default: {DEFAULT_POLL:g})",
    )
    parser.add_argument(
        "--long-poll",
        type=non_negative_float,
        default=DEFAULT_LONG_POLL,
        metavar="SECONDS",
        help="how long the Mediator may hold an idle node's work poll, answering as soon as "
        "there is work (ended early for each advert; the server caps it; 0: poll every --poll "
        f"seconds instead; default: {DEFAULT_LONG_POLL:g})",
    )
    parser.add_argument(
        "--keep-dir",
        metavar="DIR",
        default=None,
        help="where results the Mediator refused or never took are kept, one file per step "
        "(default: $XDG_STATE_HOME/mediator-enode/NODE_ID, i.e. "
        "~/.local/state/mediator-enode/NODE_ID)",
    )
    parser.add_argument(
        "--stop-grace",
        type=positive_float,
        default=DEFAULT_STOP_GRACE,
        metavar="SECONDS",
        help="after SIGTERM/SIGINT, how long to keep trying a Mediator that does not answer "
        f"before exiting (default: {DEFAULT_STOP_GRACE:g})",
    )
    return parser


def default_keep_dir(node_id: str) -> Path:
    """``$XDG_STATE_HOME/mediator-enode/<node_id>`` (``~/.local/state`` when unset)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in node_id).lstrip(".") or "_"
    return Path(state) / "mediator-enode" / safe


def read_capabilities(path: str) -> dict[str, Any]:
    """Read a capabilities object from a JSON or TOML file.

    Raises:
        ValueError: The file cannot be read or does not hold one object.
    """
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        caps = tomllib.loads(text) if path.endswith(".toml") else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        kind = "TOML" if path.endswith(".toml") else "JSON"
        raise ValueError(f"{path} is not valid {kind}: {exc}") from None
    if not isinstance(caps, dict):
        raise ValueError(f"{path} must hold one object of capabilities, not {type(caps).__name__}")
    return caps


def resolve_token(args: argparse.Namespace) -> str | None:
    """The bearer token from ``--token-file``, ``--token`` or ``$MEDIATOR_TOKEN`` (see the
    module docstring); ``$MEDIATOR_TOKEN`` leaves this process's environment here, so nothing
    this process starts inherits it.

    Raises:
        ValueError: Both flags given, or a bad token file.
    """
    from_env = os.environ.pop("MEDIATOR_TOKEN", None) or None
    if args.token_file and args.token:
        raise ValueError("give --token-file or --token, not both")
    if args.token_file:
        return read_token_file(args.token_file)
    if args.token:
        print(
            "enode: warning: --token is readable by every local user in the process list; "
            "use --token-file FILE (mode 0600) instead",
            file=sys.stderr,
        )
        return str(args.token)
    return from_env


def main(argv: list[str] | None = None) -> int:
    """Run the daemon until it is stopped.

    Args:
        argv: Arguments without the program name; ``None`` reads ``sys.argv``.

    Returns:
        The exit status (see the module docstring).
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse printed the usage
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        caps = read_capabilities(args.caps)
        token = resolve_token(args)
    except ValueError as exc:
        print(f"enode: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with _logging(args.node_id), Client(args.url, token) as client:
        daemon = Daemon(
            client,
            args.node_id,
            caps,
            label=args.label,
            drain=args.drain,
            poll_seconds=args.poll,
            long_poll=args.long_poll,
            drain_file=args.drain_file,
            keep_dir=args.keep_dir or default_keep_dir(args.node_id),
            stop_grace=args.stop_grace,
        )
        with _signals(daemon):
            return daemon.run()


@contextmanager
def _logging(node_id: str) -> Iterator[None]:
    logger = logging.getLogger("mediator.enode")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s enode[{node_id}] %(levelname)s %(message)s")
    )
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


@contextmanager
def _signals(daemon: Daemon) -> Iterator[None]:
    """Wire the signals of the module docstring to the daemon, and restore the old handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread (in-process tests)
        return
    wanted = {
        signal.SIGTERM: lambda *_: daemon.stop(),
        signal.SIGINT: lambda *_: daemon.stop(),
        signal.SIGUSR1: lambda *_: daemon.set_drain("graceful"),
        signal.SIGUSR2: lambda *_: daemon.set_drain(""),
    }
    old = {sig: signal.signal(sig, handler) for sig, handler in wanted.items()}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
