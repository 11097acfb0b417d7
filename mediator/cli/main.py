"""``mediator``: run the server (``serve``) and check sealed records (``records verify``).

``mediator serve`` starts (or connects to) PostgreSQL, wakes the queue once (wake 5), seals what a
crash left unsealed, runs the reaper every ``renew_seconds`` and serves the HTTP API with uvicorn
until SIGINT/SIGTERM, then shuts down gracefully. ``--workers N`` (default: the CPU count) serves
from N spawned processes on one socket this process binds (:class:`Workers`); the database, the
startup wake and the reaper stay here, once. Invalid configuration exits with status 2 before
anything listens (docs/design.md §16).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import ipaddress
import logging
import multiprocessing
import os
import queue
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from mediator import tmpdirs
from mediator.argtypes import SuggestingParser
from mediator.config import Config
from mediator.core.errors import ConfigError, MediatorError
from mediator.records import Records

if TYPE_CHECKING:
    # Not imported at run time before `serve` has chosen the metrics mode: importing mediator.api
    # imports prometheus_client, which fixes its mode from the environment once, at import.
    from mediator.api.auth import Tokens
    from mediator.flows import Mediator

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
    """The reaper timer: ``med.reap()`` every ``renew_seconds`` (docs/design.md §10).

    With several workers it runs once, in the parent process, not per worker. Concurrent reaps
    and sweeps would be safe (R9: every promotion and release is guarded inside its statement,
    so two reapers racing settle each lease once), but N reapers would only repeat the same
    queries N times; the parent lives exactly as long as the server, so one timer there is
    enough. The parent also does the startup wake (wake 5) and the seal of what a crash left
    unsealed, once, before any worker starts.
    """

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


@dataclass(frozen=True)
class Serving:
    """What a process needs to serve the API: picklable, so a spawned worker gets it whole."""

    config: Config
    tokens: Tokens
    dev: bool
    database_url: str
    records_root: str

    def banner(self, port: int) -> str:
        mode = " (development mode: no tokens)" if self.dev else ""
        return f"mediator: serving on http://{self.config.host}:{port}{mode}"


def serve(args: argparse.Namespace) -> int:
    try:
        config = Config.load(
            args.config,
            database_url=args.database_url,
            host=args.host,
            port=args.port,
            tokens_file=args.tokens,
            records_root=args.records,
            workers=args.workers,
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
    except ConfigError as exc:
        print(f"mediator: {exc.message}", file=sys.stderr)
        return 2
    with _metrics_mode(config.workers) as own_figures:
        return _serve(args, config, own_figures)


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # mediator/api/metrics.py; prometheus_client's switch


_METRICS_PREFIX = "mediator-metrics-"  # then the serving parent's pid (mediator/tmpdirs.py)


def _remove_orphaned_metrics() -> None:
    """Remove the metrics directories of servers that died without their cleanup (SIGKILL, a
    power cut): ours by name and owner, a real directory (not a symlink), and their parent's
    pid no longer alive. A live server's directory, another account's, or anything that does
    not look like ours stays."""
    tmpdirs.remove_orphans(_METRICS_PREFIX)


@contextlib.contextmanager
def _metrics_mode(workers: int) -> Iterator[bool]:
    """Choose prometheus_client's mode for this server before anything imports it (it reads the
    environment once, at import; mediator/api/metrics.py says why the mode matters).

    One worker: in-process figures, whatever the environment says. Several: a directory that
    belongs to this server alone — a fresh name made with mode 0700 (``mkdtemp``), handed to the
    workers through the environment they inherit, removed when the server stops — so /metrics
    sums every worker's figures and two servers on one machine never mix theirs. Yields whether
    this process's own figures (the reaper's sweeps and failures) reach that directory: not if
    prometheus_client was imported before we could choose (``main`` called from Python).
    """
    if workers == 1:
        os.environ.pop(MULTIPROC_ENV, None)
        yield False
        return
    fresh = "prometheus_client" not in sys.modules
    _remove_orphaned_metrics()
    path = tmpdirs.make(_METRICS_PREFIX)
    os.environ[MULTIPROC_ENV] = path
    try:
        yield fresh
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


def _serve(args: argparse.Namespace, config: Config, own_figures: bool) -> int:
    from mediator.api.auth import Tokens

    try:
        tokens = Tokens(None) if args.dev else Tokens.load(config.tokens_file)
    except ConfigError as exc:
        print(f"mediator: {exc.message}", file=sys.stderr)
        return 2
    # The port first (issue 29 §5): a port in use is said in one line before a cluster is made.
    # The socket bound here is the one served, in this process or by every worker.
    try:
        sock = _bind(config.host, config.port)
    except OSError as exc:
        print(f"mediator: {_cannot_listen(config.host, config.port, exc)}", file=sys.stderr)
        return 1
    try:
        return _serve_on(sock, args, config, tokens, own_figures)
    finally:
        sock.close()


def _cannot_listen(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is in use (another server?); choose another with --port, "
            "or --port 0 for any free one"
        )
    return f"cannot listen on {host} port {port}: {exc.strerror or exc}"


def _serve_on(
    sock: socket.socket,
    args: argparse.Namespace,
    config: Config,
    tokens: Tokens,
    own_figures: bool,
) -> int:
    from mediator.flows import Mediator

    data = Path(args.data).resolve()
    records_root = config.records_root or str(data.parent / "records")
    try:
        # This process starts the embedded PostgreSQL (once), seals, wakes (wake 5) and reaps;
        # with several workers each opens its own pool to the same database.
        med = Mediator.connect(
            config=config,
            records_root=records_root,
            data_dir=None if config.database_url else str(data),
            pool_size=16 if config.workers == 1 else 2,
        )
    except MediatorError as exc:
        print(f"mediator: {exc.message}", file=sys.stderr)
        return 1
    swept = med.records.sweep_staging()  # what seals killed half way left (issue 25 §10)
    if swept:
        print(f"mediator: removed {swept} staged record files that failed seals left", flush=True)
    if own_figures:
        from mediator.api.metrics import Instruments

        Instruments(None).watch(med)  # the reaper's sweeps and failures count for the server
    if med.embedded is not None:
        # The embedded cluster's address is stable for a --data directory (unix socket, fixed
        # port); only this account can reach it (docs/security.md "The embedded database").
        # Which kind it is — durable here, always (docs/design.md §19) — is said, not assumed.
        print(f"mediator: embedded PostgreSQL, {med.embedded.kind}", flush=True)
        print(f"mediator: database {med.database_url}", flush=True)
    reaper = Reaper(med, config.renew_seconds)
    reaper.start()
    serving = Serving(config, tokens, args.dev, med.database_url, records_root)
    try:
        if config.workers == 1:
            return _serve_here(med, serving, sock)
        return Workers(serving).run(sock)
    finally:
        reaper.stop()
        med.close()
        print("mediator: stopped", flush=True)


def _server(
    med: Mediator, serving: Serving, on_ready: Callable[[int], None]
) -> tuple[Any, Callable[[], None]]:
    """A uvicorn server for the API around ``med`` that ends open event streams on SIGINT or
    SIGTERM and calls ``on_ready(port)`` once it listens; and a function that stops it so."""
    import uvicorn

    from mediator.api import create_app
    from mediator.api.guard import accept_backlog, bounded_h11, connection_cap, quiet_loop_errors

    app = create_app(med, serving.tokens)
    cap = connection_cap()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=serving.config.host,
            port=serving.config.port,
            log_level="warning",
            access_log=False,
            # a cap on connections and a deadline on request heads (docs/security.md
            # "Connections", issue 25 §4)
            http=bounded_h11(cap, serving.config.request_head_timeout_seconds),
            backlog=accept_backlog(cap),
            timeout_keep_alive=5,
        )
    )
    original_startup = server.startup

    async def startup(sockets: object = None) -> None:
        quiet_loop_errors(asyncio.get_running_loop())  # no traceback per failed accept
        await original_startup(sockets=sockets)  # type: ignore[arg-type]
        port = serving.config.port
        if server.servers and server.servers[0].sockets:
            port = server.servers[0].sockets[0].getsockname()[1]
        if not server.should_exit:
            on_ready(port)

    server.startup = startup  # type: ignore[method-assign]

    @contextlib.contextmanager
    def capture_signals() -> Iterator[None]:
        # uvicorn re-raises the signal after its shutdown, which would kill this process before
        # the reaper stops and the embedded PostgreSQL shuts down cleanly; handle it ourselves.
        def handle_exit(sig: int, frame: FrameType | None) -> None:
            app.state.feed.stop()  # end open event streams, or shutdown would wait for them
            server.handle_exit(sig, frame)
            wake()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handle_exit)
        signal.signal(signal.SIGHUP, lambda sig, frame: reload_tokens(serving.tokens))
        yield

    server.capture_signals = capture_signals  # type: ignore[method-assign]
    wake = _quiet_main_loop(server)

    def stop() -> None:
        app.state.feed.stop()
        server.should_exit = True
        wake()

    return server, stop


def reload_tokens(tokens: Tokens) -> None:
    """SIGHUP: read the tokens file again (docs/security.md "Tokens"); a bad file is logged and
    the tokens in use stay."""
    problem = tokens.reload()
    if problem is not None:
        log.error("the tokens file was not reloaded, the old tokens stay: %s", problem)
    elif tokens.path is not None:
        log.warning("reloaded the tokens file %s", tokens.path)


IDLE_TICK_S = 1.0  # the Date header's resolution: the only reason an idle server wakes


def _quiet_main_loop(server: Any) -> Callable[[], None]:
    """Give ``server`` (a ``uvicorn.Server``) a main loop that sleeps while nothing happens, and
    return the function that wakes it to exit (safe from a signal handler or another thread).

    uvicorn's own loop wakes every 0.1 s to check ``should_exit``: ten wake-ups a second in every
    worker with no request in sight (docs/performance.md "Idle CPU"). This one waits for the wake
    and otherwise wakes once a second, to refresh the Date header (``on_tick`` does that when its
    counter is a multiple of 10, so every wake-up passes one).
    """
    stopping: list[Callable[[], object]] = []

    async def main_loop() -> None:
        loop = asyncio.get_running_loop()
        wake_event = asyncio.Event()
        stopping.append(lambda: loop.call_soon_threadsafe(wake_event.set))
        counter = 0
        while not await server.on_tick(counter):
            counter = (counter + 10) % 864_000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake_event.wait(), IDLE_TICK_S)

    def wake() -> None:
        for set_event in stopping:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to wake
                set_event()

    server.main_loop = main_loop
    return wake


def _serve_here(med: Mediator, serving: Serving, sock: socket.socket) -> int:
    """``--workers 1``: the API in this very process, on ``sock``."""
    server, _ = _server(med, serving, lambda port: print(serving.banner(port), flush=True))
    server.run(sockets=[sock])
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """The one listening socket every worker accepts on, bound here so port 0 names one port.

    Made with ``IPPROTO_TCP`` spelt out, as uvicorn's own sockets are: asyncio turns Nagle off
    (TCP_NODELAY) only on connections whose socket says it is TCP, and an accepted connection
    inherits the listener's ``proto``. With ``proto`` 0 every response waited out the client's
    delayed ACK: 44 ms per request instead of 1 (measured, docs/performance.md P1).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


@dataclass
class Backoff:
    """When to start a worker again after one ended: a pure policy (no clock, no process).

    The wait doubles from ``first_s`` up to ``cap_s`` with every end, so a worker that cannot
    start is not restarted twice a second forever; it starts from ``first_s`` again once a
    worker has served ``stable_s`` (that one ended for a reason of its own, not a start that
    cannot succeed). ``failed`` counts the ends in a row that came before the worker listened.
    """

    first_s: float = 0.5
    cap_s: float = 30.0
    stable_s: float = 30.0
    delay_s: float = field(init=False)  # the next wait
    failed: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.delay_s = self.first_s

    def after_exit(self, served_s: float | None) -> float:
        """The wait before the next start; ``served_s`` is how long the worker that ended
        listened, None if it never did (a failed start)."""
        if served_s is None:
            self.failed += 1
        else:
            self.failed = 0
            if served_s >= self.stable_s:
                self.delay_s = self.first_s
        wait = self.delay_s
        self.delay_s = min(self.delay_s * 2, self.cap_s)
        return wait


@dataclass
class _Slot:
    """One worker place: its current process, its backoff, and where it is in its life."""

    proc: Any
    backoff: Backoff = field(default_factory=Backoff)
    ready_at: float | None = None  # when it reported listening (monotonic)
    restart_at: float | None = None  # it ended: start another at this instant


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


class Workers:
    """``--workers N``: N spawned processes serving one socket this process bound.

    Each worker has its own Mediator (its own pool on the one database) and its own event feed;
    the event-stream caps are divided among them (docs/security.md "Event streams"), so the server
    as a whole never holds more than the caps. This process prints the one "serving on" line
    once every worker listens, starts another worker when one ends — after a growing wait
    (:class:`Backoff`), and it stops the server with status 1 once every worker has failed to
    start ``GIVE_UP`` times in a row, naming the workers' own reason — and on SIGINT or SIGTERM
    stops them all (each ends its open streams first) before the caller stops the reaper and the
    database. Workers are spawned, not forked: this process already runs the pool's and the
    reaper's threads, which a fork would copy in whatever state they were.
    """

    START_S = 60.0  # a worker that does not listen within this is a failed start
    STOP_S = 15.0  # then it is killed
    GIVE_UP = 3  # failed starts in a row, of every worker, before the server stops
    POLL_S = 0.2  # how often ended workers are looked for

    def __init__(self, serving: Serving) -> None:
        n = serving.config.workers
        share = serving.config.replace(
            events_max_streams=max(1, serving.config.events_max_streams // n),
            events_max_streams_per_principal=max(
                1, serving.config.events_max_streams_per_principal // n
            ),
            # held work polls likewise (docs/security.md "Held work polls")
            work_max_waits=max(1, serving.config.work_max_waits // n),
            work_max_waits_per_principal=max(1, serving.config.work_max_waits_per_principal // n),
        )
        self.serving = Serving(
            share, serving.tokens, serving.dev, serving.database_url, serving.records_root
        )
        self.n = n
        self._ctx = multiprocessing.get_context("spawn")
        self._ready: Any = self._ctx.Queue()  # ("ready", pid) or ("failed", pid, reason)
        self._stopping = threading.Event()
        self._slots: list[_Slot] = []
        self._reasons: dict[int, str] = {}  # a worker's own word on why it could not start

    def _spawn(self, sock: socket.socket) -> Any:
        proc = self._ctx.Process(
            target=_worker,
            args=(self.serving, sock, self._ready, os.getpid()),
            name="mediator-worker",
            daemon=False,
        )
        proc.start()
        return proc

    def run(self, sock: socket.socket) -> int:
        """Serve ``sock`` (bound by the caller, :func:`_bind`) until SIGINT or SIGTERM."""

        def handle_exit(sig: int, frame: FrameType | None) -> None:
            self._stopping.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handle_exit)
        signal.signal(signal.SIGHUP, lambda sig, frame: self._reload())
        try:
            self._slots = [_Slot(self._spawn(sock)) for _ in range(self.n)]
            if not self._await_ready():
                return 1
            print(self.serving.banner(sock.getsockname()[1]), flush=True)
            return self._supervise(sock)
        finally:
            self._stop_all()

    def _reload(self) -> None:
        """SIGHUP: reload the tokens here (for workers started later) and in every worker."""
        reload_tokens(self.serving.tokens)
        for slot in self._slots:
            if slot.proc.is_alive() and slot.proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.proc.pid, signal.SIGHUP)

    def _heard(self, timeout: float) -> None:
        """Take the workers' messages: who listens now, and why one could not start."""
        try:
            message = self._ready.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            kind, pid, *rest = message
            if kind == "ready":
                for slot in self._slots:
                    if slot.proc.pid == pid:
                        slot.ready_at = time.monotonic()
            else:
                self._reasons[pid] = rest[0]
            try:
                message = self._ready.get_nowait()
            except queue.Empty:
                return

    def _reason(self, proc: Any) -> str:
        if proc.pid not in self._reasons:
            proc.join(1.0)  # its message may still be on its way; the queue flushes at exit
            self._heard(0.0)
        return self._reasons.pop(proc.pid, "it gave no reason; see its log above")

    def _await_ready(self) -> bool:
        """Wait until every worker listens; False if one died first, or the deadline passed."""
        deadline = time.monotonic() + self.START_S
        while not all(slot.ready_at is not None for slot in self._slots):
            if self._stopping.is_set():
                return False
            for slot in self._slots:
                if not slot.proc.is_alive():
                    proc = slot.proc
                    print(
                        f"mediator: worker {proc.pid} failed to start "
                        f"({_exit_text(proc.exitcode)}): {self._reason(proc)}",
                        file=sys.stderr,
                    )
                    return False
            if time.monotonic() > deadline:
                print("mediator: the workers did not start in time", file=sys.stderr)
                return False
            self._heard(self.POLL_S)
        return True

    def _supervise(self, sock: socket.socket) -> int:
        """Serve until told to stop: start another worker for each that ends (backoff), and
        give up (status 1) when every worker keeps failing at start."""
        while not self._stopping.is_set():
            self._heard(self.POLL_S)
            now = time.monotonic()
            for slot in self._slots:
                proc = slot.proc
                if slot.restart_at is None and not proc.is_alive():
                    _buried(proc.pid)
                    served = None if slot.ready_at is None else now - slot.ready_at
                    wait = slot.backoff.after_exit(served)
                    slot.restart_at = now + wait
                    if served is None:
                        reason = self._reason(proc)
                        log.error(
                            "worker %d failed at start (%s): %s; starting another in %.1f s",
                            proc.pid, _exit_text(proc.exitcode), reason, wait,
                        )  # fmt: skip
                        if all(s.backoff.failed >= self.GIVE_UP for s in self._slots):
                            print(
                                f"mediator: every worker failed to start {self.GIVE_UP} times "
                                f"in a row; the last ({_exit_text(proc.exitcode)}): {reason}; "
                                "stopping",
                                file=sys.stderr,
                                flush=True,
                            )
                            return 1
                    else:
                        log.error(
                            "worker %d exited (%s) after serving %.1f s; starting another "
                            "in %.1f s",
                            proc.pid, _exit_text(proc.exitcode), served, wait,
                        )  # fmt: skip
                elif slot.restart_at is not None and now >= slot.restart_at:
                    slot.proc = self._spawn(sock)
                    slot.ready_at = slot.restart_at = None
        return 0

    def _stop_all(self) -> None:
        procs = [slot.proc for slot in self._slots]
        for proc in procs:
            if proc.is_alive() and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.STOP_S
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.error("worker %d did not stop in %.0fs; killing it", proc.pid, self.STOP_S)
                proc.kill()
                proc.join(5)
            _buried(proc.pid)
        self._ready.close()
        self._ready.join_thread()


def _buried(pid: int) -> None:
    """A worker ended: its live gauges (open streams) leave /metrics; its counters stay, folded
    into the directory's archive files (mediator/api/metrics.py)."""
    path = os.environ.get(MULTIPROC_ENV)
    if path:
        from mediator.api.metrics import fold_dead

        try:
            fold_dead(pid, path)
        except OSError:
            log.exception("folding the metrics of worker %d failed; its files stay", pid)


def _worker(serving: Serving, sock: socket.socket, ready: Any, parent: int) -> None:
    """One spawned worker: its own Mediator on the shared database, serving ``sock``. Tells
    the parent when it listens, or why it could not start (then exits with status 1)."""
    from mediator.flows import Mediator

    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
        stream=sys.stderr,
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until uvicorn handles it: the parent decides
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until we serve: we read the file anew below
    serving.tokens.reload()  # a reload the parent asked for while we started is not lost
    try:
        med = Mediator.connect(
            serving.database_url,
            config=serving.config,
            records_root=serving.records_root,
            pool_size=16,
            startup_wake=False,  # the parent woke once (wake 5) and sealed before spawning us
        )
    except Exception as exc:
        reason = exc.message if isinstance(exc, MediatorError) else f"{type(exc).__name__}: {exc}"
        log.error("worker cannot start: %s", reason)
        ready.put(("failed", os.getpid(), reason))
        sys.exit(1)
    try:
        server, stop = _server(med, serving, lambda port: ready.put(("ready", os.getpid())))

        def orphaned() -> None:
            # The parent was killed outright (SIGKILL): stop rather than serve on alone.
            while not server.should_exit:
                if os.getppid() != parent:
                    stop()
                    return
                time.sleep(1.0)

        threading.Thread(target=orphaned, name="mediator-orphan", daemon=True).start()
        server.run(sockets=[sock])
    finally:
        med.close()


def records_verify(args: argparse.Namespace) -> int:
    try:
        config = Config.load(args.config, records_root=args.records)
    except ConfigError as exc:
        print(f"mediator: {exc.message}", file=sys.stderr)
        return 2
    root = config.records_root or str(Path(args.data).resolve().parent / "records")
    run_id = _full_run_id(root, args.run_id)
    if run_id is None:
        print(f"{args.run_id}: no such record under {root}, nor one run id ending so")
        return 1
    check = Records(root).verify(run_id)
    if not check.sealed:
        print(f"{run_id}: not sealed (no seal.json under {root})")
        return 1
    if check.ok:
        print(f"{run_id}: ok — every file matches seal.json")
        return 0
    for name in check.changed:
        print(f"{run_id}: CHANGED {name}")
    for name in check.missing:
        print(f"{run_id}: MISSING {name}")
    for name in check.extra:
        print(f"{run_id}: NOT SEALED {name}")
    return 1


def _full_run_id(root: str, given: str) -> str | None:
    """``given`` if the root has that record, else the one record whose run id ends with it —
    ``runctl list``'s short ids, with or without their ``…`` (issue 29) — else None (none, or
    several)."""
    if os.path.isdir(os.path.join(root, given)):
        return given
    tail = given.removeprefix("…")
    if len(tail) < 4:
        return None
    try:
        with os.scandir(root) as entries:
            found = [e.name for e in entries if e.name.endswith(tail) and e.is_dir()]
    except OSError:
        return None
    return found[0] if len(found) == 1 else None


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
    ap = SuggestingParser(
        prog="mediator", description="The Mediator job broker.", allow_abbrev=False
    )
    _shared_options(ap, top=True)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "serve",
        help="run the HTTP API",
        description="Serve the Mediator's HTTP API (and the panel at /). Without --database-url "
        "it runs an embedded PostgreSQL whose data lives in --data and survives restarts and "
        "crashes (fsync on); one server at a time may use a --data directory. The database is "
        "reachable only by this account, over a unix socket (docs/security.md). Prints the URL "
        "it serves on, and the embedded database's kind and address.",
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
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="worker processes serving one socket, each with its own database pool (default: "
        "the CPU count, or the configuration's workers); 1 serves in this process",
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
