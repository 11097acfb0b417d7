"""``mediator``: run the server (``serve``) and check sealed records (``records verify``).

``mediator serve`` starts (or connects to) PostgreSQL, wakes the queue once (wake 5), seals what a
crash left unsealed, runs the reaper every ``renew_seconds`` and serves the HTTP API with uvicorn
until SIGINT/SIGTERM, then shuts down gracefully. Invalid configuration exits with status 2 before
anything listens (docs/design.md §16).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from mediator.config import Config
from mediator.errors import ConfigError, MediatorError
from mediator.records import Records

log = logging.getLogger("mediator")

DEFAULT_DATA = "./var/pg"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Reaper:
    """The reaper timer: ``med.reap()`` every ``renew_seconds`` (docs/design.md §10)."""

    def __init__(self, med: object, every_s: float) -> None:
        self.med = med
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mediator-reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.med.reap()  # type: ignore[attr-defined]
            except Exception:
                log.exception("reaper pass failed; trying again in %.0fs", self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from mediator.api import create_app
    from mediator.api.auth import Tokens
    from mediator.flows import Mediator

    try:
        config = Config.load(
            args.config,
            database_url=args.database_url,
            host=args.host,
            port=args.port,
            tokens_file=args.tokens,
            records_root=args.records,
        )
        if args.dev and not _is_loopback(config.host):
            raise ConfigError(
                "--dev accepts requests without tokens, so it only listens on loopback "
                "(127.0.0.1, ::1 or localhost).",
                field="host",
            )
        if not args.dev and not config.tokens_file:
            raise ConfigError(
                "Give a tokens file (--tokens or tokens_file) or run with --dev on loopback.",
                field="tokens_file",
            )
        tokens = Tokens(None) if args.dev else Tokens.load(config.tokens_file)
    except ConfigError as exc:
        print(f"mediator: {exc.message}", file=sys.stderr)
        return 2

    data = Path(args.data).resolve()
    records_root = config.records_root or str(data.parent / "records")
    try:
        med = Mediator.connect(
            config=config,
            records_root=records_root,
            data_dir=None if config.database_url else str(data),
            pool_size=16,
        )
    except MediatorError as exc:
        print(f"mediator: {exc.message}", file=sys.stderr)
        return 1
    if not config.database_url:
        # The embedded cluster's address is stable for a --data directory (unix socket, fixed
        # port); only this account can reach it (docs/security.md "The embedded database").
        print(f"mediator: database {med.database_url}", flush=True)
    reaper = Reaper(med, config.renew_seconds)
    reaper.start()
    app = create_app(med, tokens)
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=config.host, port=config.port, log_level="warning", access_log=False
        )
    )
    original_startup = server.startup

    async def startup(sockets: object = None) -> None:
        await original_startup(sockets=sockets)  # type: ignore[arg-type]
        port = config.port
        if server.servers and server.servers[0].sockets:
            port = server.servers[0].sockets[0].getsockname()[1]
        mode = " (development mode: no tokens)" if args.dev else ""
        print(f"mediator: serving on http://{config.host}:{port}{mode}", flush=True)

    server.startup = startup  # type: ignore[method-assign]

    @contextlib.contextmanager
    def capture_signals() -> Iterator[None]:
        # uvicorn re-raises the signal after its shutdown, which would kill this process before
        # the reaper stops and the embedded PostgreSQL shuts down cleanly; handle it ourselves.
        def handle_exit(sig: int, frame: FrameType | None) -> None:
            app.state.feed.stop()  # end open event streams, or shutdown would wait for them
            server.handle_exit(sig, frame)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handle_exit)
        yield

    server.capture_signals = capture_signals  # type: ignore[method-assign]
    try:
        server.run()
    finally:
        reaper.stop()
        med.close()
        print("mediator: stopped", flush=True)
    return 0


def records_verify(args: argparse.Namespace) -> int:
    try:
        config = Config.load(args.config, records_root=args.records)
    except ConfigError as exc:
        print(f"mediator: {exc.message}", file=sys.stderr)
        return 2
    root = config.records_root or str(Path(args.data).resolve().parent / "records")
    check = Records(root).verify(args.run_id)
    if not check.sealed:
        print(f"{args.run_id}: not sealed (no seal.json under {root})")
        return 1
    if check.ok:
        print(f"{args.run_id}: ok — every file matches seal.json")
        return 0
    for name in check.changed:
        print(f"{args.run_id}: CHANGED {name}")
    for name in check.missing:
        print(f"{args.run_id}: MISSING {name}")
    for name in check.extra:
        print(f"{args.run_id}: NOT SEALED {name}")
    return 1


def _shared_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``--config``, ``--data`` and ``--records``: accepted before the subcommand and after it
    (design.md §19 writes ``mediator serve --data DIR``). After it they default to SUPPRESS, so a
    value given before the subcommand is not overwritten by the subcommand's default."""

    def default(value: str | None) -> str | None:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "--config",
        metavar="FILE",
        default=default(None),
        help="configuration file (TOML); default: none, settings come from the environment "
        "(MEDIATOR_*) and the built-in defaults",
    )
    parser.add_argument(
        "--data",
        metavar="DIR",
        default=default(DEFAULT_DATA),
        help="the embedded PostgreSQL's data directory, kept across restarts "
        f"(default: {DEFAULT_DATA})",
    )
    parser.add_argument(
        "--records",
        metavar="DIR",
        default=default(None),
        help="records root (default: records/ beside --data)",
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="mediator", description="The Mediator job broker.", allow_abbrev=False
    )
    _shared_options(ap, top=True)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "serve",
        help="run the HTTP API",
        description="Serve the Mediator's HTTP API (and the panel at /). Without --database-url "
        "it runs an embedded PostgreSQL whose data lives in --data and survives restarts; the "
        "server is reachable only by this account, over a unix socket (docs/security.md). "
        "Prints the URL it serves on, and the embedded database's address.",
        allow_abbrev=False,
    )
    _shared_options(s, top=False)
    s.add_argument(
        "--host",
        default=None,
        help=f"address to listen on (default: {Config.host}, or the configuration's host)",
    )
    s.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"port to listen on, 0 for any free one (default: {Config.port})",
    )
    s.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help="use this PostgreSQL instead of an embedded one (default: none, embedded)",
    )
    s.add_argument(
        "--tokens",
        default=None,
        metavar="FILE",
        help="tokens file (TOML); required unless --dev (default: none)",
    )
    s.add_argument(
        "--dev",
        action="store_true",
        help="accept requests without tokens; loopback only (default: off)",
    )
    s.set_defaults(func=serve)
    r = sub.add_parser(
        "records",
        help="sealed run records",
        description="Sealed run records.",
        allow_abbrev=False,
    )
    rs = r.add_subparsers(dest="records_command", required=True)
    v = rs.add_parser(
        "verify",
        help="re-hash a sealed record and report any changed byte",
        description="Re-hash a sealed record and report any changed, missing or unsealed file. "
        "Exit 0 if every file matches seal.json, 1 otherwise.",
        allow_abbrev=False,
    )
    _shared_options(v, top=False)
    v.add_argument("run_id", help="the run whose record to verify")
    v.set_defaults(func=records_verify)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
