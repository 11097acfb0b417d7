"""``GET /metrics``: Prometheus text (docs/design.md §19 route 16).

Queue depth, runs by state and the queue-wait histogram are read from the database at scrape time,
so every Mediator process reports the same fleet-wide truth; the sweep-duration histogram is this
process's own (each process sweeps for itself).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

if TYPE_CHECKING:
    from mediator.flows import Mediator

WAIT_BUCKETS = (0.0, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
STATES = ("QUEUED", "RUNNING", "PASSED", "FAILED")


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


class _FailureCollector:
    """Failures this process survived without changing an answer (R7, R16, issue 11 §5–6)."""

    def __init__(self, med: Mediator) -> None:
        self.med = med

    def collect(self) -> Iterator[Any]:
        f = self.med.failures
        errors = CounterMetricFamily(
            "mediator_sweep_run_errors",
            "Promotions of one run that failed; the sweep went on (R7).",
        )
        errors.add_metric([], f["sweep_run"])
        yield errors
        records = CounterMetricFamily(
            "mediator_record_failures",
            "Record writes that failed after their commit and wait for a retry.",
            labels=["op"],
        )
        for op in ("open", "seal"):
            records.add_metric([op], f[f"record_{op}"])
        yield records
        wakes = CounterMetricFamily(
            "mediator_wake_failures", "Sweeps that failed (R16); a database error re-sweeps."
        )
        wakes.add_metric([], f["wake"])
        yield wakes


class Metrics:
    def __init__(self, med: Mediator) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_FleetCollector(med))
        self.registry.register(_FailureCollector(med))
        self.sweep = Histogram(
            "mediator_sweep_duration_seconds",
            "Duration of promotion sweeps (WakeQueued) in this process.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        med.sweep_observers.append(lambda seconds, report: self.sweep.observe(seconds))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
