"""``GET /metrics``: Prometheus text (docs/design.md §19 route 16), for the whole server.

Two kinds of figures, kept apart because they add up differently:

- **Fleet figures** (queue depth, runs by state, the queue-wait histogram, unsealed records) are
  read from the database at scrape time, once, by whichever process answers: every process
  would read the same truth, so they are never summed.
- **Process figures** (:class:`Instruments`: requests and their latency, sweep durations, the
  failures counted by ``ctx.count``, open event streams) happen in one process each. Under
  ``mediator serve --workers N`` (N > 1) they are kept with prometheus_client's multiprocess
  mode: every process writes its counters to memory-mapped files in a directory private to that
  one server (``PROMETHEUS_MULTIPROC_DIR``, made by the serving parent before anything imports
  prometheus_client, mode 0700, removed at exit), and a scrape merges them all with
  :class:`~prometheus_client.multiprocess.MultiProcessCollector`. Counters and histograms are
  summed over every process the server ever ran — a restarted worker's files stay, so nothing
  goes backwards — and the open-streams gauge (``livesum``) over the live ones: the parent calls
  ``mark_process_dead`` for each worker that ends. Why this library mode and not our own: see
  docs/design.md §19 "Metrics of a server with workers".
- **Dead workers' files are folded** (:func:`fold_dead`): the parent adds a dead worker's counter
  and histogram values into one ``*_archive.db`` pair and deletes its files, so a server whose
  workers restart a thousand times holds files for its live workers plus two, and a scrape reads
  that many — not one pair per worker it ever ran. A scrape reads the files under a shared
  ``flock`` of ``.lock`` in the directory and the fold takes it exclusively, so no scrape sees a
  value both in the archive and in the dead worker's file, or in neither: the sums never move
  backwards.

Without that variable (``--workers 1``, ``create_app`` in tests and the simulator) the same
instruments live in the app's own registry, as plain in-memory values.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

if TYPE_CHECKING:
    from mediator.flows import Mediator

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own switch (read at its import)
WAIT_BUCKETS = (0.0, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
STATES = ("QUEUED", "RUNNING", "PASSED", "FAILED")
# Request labels come from a fixed set (the method, the route's template, the status code), never
# from the raw path: a client must not be able to grow the metrics without bound.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def multiproc_dir() -> str | None:
    """The private metrics directory of this server's processes, or None (in-process mode)."""
    return os.environ.get(MULTIPROC_ENV) or None


_LOCK = ".lock"  # not *.db: the collector never reads it
_FOLDED = ("counter", "histogram")  # summed over every process; gauges here are live* (dropped)


@contextlib.contextmanager
def _files_locked(path: str, exclusive: bool) -> Iterator[None]:
    """Hold ``path``'s metrics lock: shared to read the files, exclusive to fold them."""
    fd = os.open(os.path.join(path, _LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)  # fmt: skip
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # drops the lock


def fold_dead(pid: int, path: str) -> None:
    """A worker ended: drop its live gauges (``mark_process_dead``) and add its counters and
    histograms into the directory's archive files, then delete its own — under the exclusive
    lock, so a scrape sees the values in exactly one place (module docstring)."""
    from prometheus_client.mmap_dict import MmapedDict
    from prometheus_client.multiprocess import mark_process_dead

    with _files_locked(path, exclusive=True):
        mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
        for kind in _FOLDED:
            dead = os.path.join(path, f"{kind}_{int(pid)}.db")
            try:
                values = MmapedDict.read_all_values_from_file(dead)  # type: ignore[no-untyped-call]
            except FileNotFoundError:
                continue  # it never counted anything of this kind
            archive = MmapedDict(os.path.join(path, f"{kind}_archive.db"))  # type: ignore[no-untyped-call]
            try:
                for key, value, timestamp, _pos in values:
                    before, _ = archive.read_value(key)  # type: ignore[no-untyped-call]
                    archive.write_value(key, before + value, timestamp)  # type: ignore[no-untyped-call]
            finally:
                archive.close()  # type: ignore[no-untyped-call]
            os.unlink(dead)


class _LockedFiles:
    """Every process's files, read under the shared lock (see :func:`fold_dead`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.files = MultiProcessCollector(None, path=path)  # type: ignore[no-untyped-call]

    def collect(self) -> list[Any]:
        with _files_locked(self.path, exclusive=False):
            return list(self.files.collect())  # type: ignore[no-untyped-call]


class _FleetCollector:
    def __init__(self, med: Mediator) -> None:
        self.med = med

    def collect(self) -> Iterator[Any]:
        with self.med.store.tx() as tx:
            counts = tx.run_totals()
            buckets = tx.wait_histogram(WAIT_BUCKETS)
            n, total = tx.wait_sum()
            unsealed = tx.unsealed_count()
        depth = GaugeMetricFamily("mediator_queue_depth", "Runs waiting in the queue (QUEUED).")
        depth.add_metric([], counts.get("QUEUED", 0))
        yield depth
        runs = GaugeMetricFamily("mediator_runs", "Runs by state.", labels=["state"])
        for state in STATES:
            runs.add_metric([state], counts.get(state, 0))
        yield runs
        wait = HistogramMetricFamily(
            "mediator_queue_wait_seconds", "Queue wait (started_at - created_at) of started runs."
        )
        wait.add_metric([], [(str(le), c) for le, c in buckets] + [("+Inf", n)], total)
        yield wait
        backlog = GaugeMetricFamily(
            "mediator_records_unsealed",
            "Terminal runs whose record is not sealed yet (retried by every reaper pass).",
        )
        backlog.add_metric([], unsealed)
        yield backlog


class Instruments:
    """This process's own counters, histograms and gauge, fed as things happen.

    ``registry`` is None in multiprocess mode: the values go to this process's files, and a
    scrape reads every process's files instead of any registry (registering them too would
    export them twice, prometheus_client's docs warn).
    """

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.requests = Counter(
            "mediator_http_requests",
            "HTTP requests answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "mediator_http_request_duration_seconds",
            "Time from a request's arrival to its response's start, by route template.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.sweep = Histogram(
            "mediator_sweep_duration_seconds",
            "Duration of promotion sweeps (WakeQueued).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )
        # Failures survived without changing an answer (R7, R16, issue 11 §5–6): ctx.count's keys.
        sweep_errors = Counter(
            "mediator_sweep_run_errors",
            "Promotions of one run that failed; the sweep went on (R7).",
            registry=registry,
        )
        records = Counter(
            "mediator_record_failures",
            "Record writes that failed after their commit and wait for a retry.",
            ["op"],
            registry=registry,
        )
        wakes = Counter(
            "mediator_wake_failures",
            "Sweeps that failed (R16); a database error re-sweeps.",
            registry=registry,
        )
        self.failures: dict[str, Any] = {
            "sweep_run": sweep_errors,
            "record_open": records.labels("open"),
            "record_seal": records.labels("seal"),
            "wake": wakes,
        }
        self.streams = Gauge(
            "mediator_event_streams",
            "Open /v1/events streams.",
            multiprocess_mode="livesum",  # the live workers' streams; a dead one holds none
            registry=registry,
        )
        self.held_polls = Gauge(
            "mediator_work_polls_held",
            "Work polls held open waiting for work (GET /v1/nodes/{node_id}/work?wait=).",
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.polls = Counter(
            "mediator_work_polls",
            "Work polls with a wait, by how they were answered: not_held (no place, or the "
            "server stops), ready, woken, waited, gone (the client left), stopped.",
            ["answer"],
            registry=registry,
        )
        self.out_of_order = Counter(
            "mediator_event_rows_out_of_order",
            "Event rows a /v1/events read returned out of (tx, id) order, dropped rather than "
            "sent again (issue 24); zero unless the order is broken.",
            registry=registry,
        )

    def watch(self, med: Mediator) -> None:
        """Count ``med``'s sweeps and survived failures from now on, and those it counted
        already (the startup wake runs before any app exists)."""
        for what, n in med.failures.items():
            self.failed(what, n)
        med.ctx.count_observers.append(self.failed)
        med.sweep_observers.append(lambda seconds, report: self.sweep.observe(seconds))

    def failed(self, what: str, n: int = 1) -> None:
        counter = self.failures.get(what)
        if counter is not None and n:
            counter.inc(n)


class Metrics:
    """The app's ``/metrics``: the fleet read once, plus every process's instruments."""

    def __init__(self, med: Mediator) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_FleetCollector(med))
        path = multiproc_dir()
        if path is None:
            self.instruments = Instruments(self.registry)
        else:
            self.instruments = Instruments(None)
            self.registry.register(_LockedFiles(path))
        self.instruments.watch(med)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _route(scope: dict[str, Any]) -> str:
    route = scope.get("route")
    if route is None:
        return "unmatched"
    path = getattr(route, "path", "")
    return path or "/"  # the panel's mount at "/" has the empty path


class RequestMetrics:
    """Pure ASGI: count each response and time it to its start (not its end: an event stream
    lasts for hours). Counted before the first byte leaves, so a client that has its response
    finds it counted by the next scrape."""

    def __init__(self, app: Any, instruments: Instruments) -> None:
        self.app = app
        self.instruments = instruments

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def counted(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                method = scope.get("method", "")
                route = _route(scope)
                self.instruments.requests.labels(
                    method if method in METHODS else "other", route, str(message["status"])
                ).inc()
                self.instruments.latency.labels(route).observe(time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, counted)
