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

from mediator.config import Config
from mediator.errors import ConfigError, MediatorError
from mediator.records import Records

log = logging.getLogger("mediator")


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
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, server.handle_exit)
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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mediator", description="The Mediator job broker.")
    ap.add_argument("--config", help="configuration file (TOML)")
    ap.add_argument(
        "--data", default="./var/pg", help="embedded PostgreSQL data directory (default ./var/pg)"
    )
    ap.add_argument("--records", help="records root (default: records/ beside --data)")
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the HTTP API")
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=None)
    s.add_argument(
        "--database-url", default=None, help="use this PostgreSQL instead of an embedded one"
    )
    s.add_argument("--tokens", default=None, help="tokens file (TOML)")
    s.add_argument("--dev", action="store_true", help="no tokens; loopback only")
    s.set_defaults(func=serve)
    r = sub.add_parser("records", help="sealed run records")
    rs = r.add_subparsers(dest="records_command", required=True)
    v = rs.add_parser("verify", help="re-hash a sealed record and report any changed byte")
    v.add_argument("run_id")
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
