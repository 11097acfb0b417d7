"""The real Mediator as a broker: the simulator's fleet drives it against a real PostgreSQL in
virtual time (design.md §20, issue 14 §1).

Every call goes through the Mediator's public Python interface (``submit``, ``advert``, ``work``,
``claim``, ``report``, ``answer``, ``reap``) on a connection whose clock is the virtual clock, so
every ``mediator_now()`` in SQL reads virtual time. The fleet that makes those calls — heartbeats,
fleet events, arrivals, claims, results, answers, the reaper timer, the stop rule — is
``sim.platform.driver``'s, the same loop that drives the reference model (``sim.brokers.model``);
this module only translates its calls (runs, nodes, steps by position) to the Mediator's (ids),
watches sweeps, and checks I1–I7 by SQL during and after the run. Measurements are read back from
the database afterwards, read-only (``Mediator.query``, ``sim.brokers.readback``).

Virtual time starts at ``EPOCH``, years away from the wall clock: a statement that read the wall
clock would put its timestamp in the wrong year, and the analysis would show it.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from mediator import Conflict, Mediator, Outcome
from mediator.core.match import Advert, Assignment, match
from mediator.databases import create_database
from mediator.pg import EmbeddedPostgres
from sim.affinity import claim_cpu
from sim.inputs.scenarios import Scenario
from sim.inputs.workload import Plan, materialize
from sim.platform.core import to_us
from sim.platform.driver import Driver
from sim.platform.fleet import Daemon

EPOCH = datetime(2031, 1, 1, tzinfo=UTC)
CHECK_EVERY = 2000  # events between two checks of I1–I7 (and progress updates)
WATCH_EVERY = 250  # events between two calls of a watch (``simulate``); CHECK_EVERY is a multiple


class VirtualClock:
    """The engine's clock, in integer microseconds since ``EPOCH``; the Mediator reads it."""

    def __init__(self) -> None:
        self.now_us = 0
        self._at: tuple[int, datetime] = (0, EPOCH)  # the last instant asked for, built once

    def __call__(self) -> datetime:
        # Every statement carries the clock's instant, several per simulated event: build the
        # datetime once per instant (issue 13).
        us, at = self._at
        if us != self.now_us:
            us = self.now_us
            at = EPOCH + timedelta(microseconds=us)
            self._at = (us, at)
        return at


@dataclass
class EngineOutput:
    """What the engine observed itself; the rest is read from the database."""

    end_us: int
    stuck_rows: list[tuple[str, int, int, bool]]
    violations: list[str]
    counts: dict[str, int]
    wall_s: float
    mediator_s: float
    stopped: bool = False  # a watch stopped the run before the plan's end (``simulate``)


class MediatorBroker:
    """The real Mediator as a `sim.platform.driver.Broker`: every call is the Mediator's public
    Python interface on a connection whose clock is the virtual clock; runs, nodes and steps are
    named by position for the loop and translated to the Mediator's ids here."""

    def __init__(self, plan: Plan, med: Mediator, clock: VirtualClock) -> None:
        self.plan, self.med, self.clock = plan, med, clock
        self.max_width = plan.scenario.settings.max_width
        self.ids = [n.node_id for n in plan.nodes]
        self.labels = [n.label for n in plan.nodes]
        self.pos = {node_id: i for i, node_id in enumerate(self.ids)}
        self.index = {a.run_id: i for i, a in enumerate(plan.arrivals)}
        self.touched: list[int] = []
        self.assigned: dict[int, list[int]] = {}  # run → its nodes, in node order
        self.queued: dict[str, dict[str, Any]] = {}  # run_id → needs, as far as we know
        self.expires = [-1] * len(self.ids)  # when each node's last advert expires
        self.swept = False  # a sweep ran during this event
        self.quiet = False  # this event was a steady heartbeat
        self.violations: list[str] = []
        self.counts = dict.fromkeys(
            (
                "submit",
                "advert",
                "claim",
                "report",
                "answer",
                "reap",
                "cancel",
                "work",
                "wake",
                "checks",
            ),
            0,
        )
        self.med_s = 0.0
        med.sweep_observers.append(self._on_sweep)

    # ---- plumbing ----
    @property
    def now(self) -> int:
        return self.clock.now_us

    @now.setter
    def now(self, t: int) -> None:
        self.clock.now_us = t  # every mediator_now() in SQL reads it
        self.swept = self.quiet = False  # a new event

    @property
    def dirty(self) -> bool:
        """Queued runs, and neither a sweep (which leaves nothing promotable) nor a steady
        heartbeat (which changes no capacity) in this event: worth a stuck check."""
        return bool(self.queued) and not self.swept and not self.quiet

    @contextmanager
    def _call(self, kind: str) -> Iterator[None]:
        self.counts[kind] += 1
        t = time.perf_counter()
        try:
            yield
        finally:
            self.med_s += time.perf_counter() - t

    def _on_sweep(self, seconds: float, report: Any) -> None:
        self.counts["wake"] += 1
        self.swept = True
        for run_id in report.promoted:
            self.queued.pop(run_id, None)
            self._started(run_id, report.assigned.get(run_id, {}))

    def _started(self, run_id: str, assigned: dict[str, str]) -> None:
        run = self.index[run_id]
        self.assigned[run] = sorted({self.pos[n] for n in assigned.values()})
        self.touched.append(run)

    # ---- the calls ----
    def submit(self, i: int) -> None:
        arrival = self.plan.arrivals[i]
        with self._call("submit"):
            sub = self.med.submit(arrival.contract, principal="sim")
        run = sub.run
        if sub.outcome is Outcome.STARTED and run is not None:
            self._started(run.run_id, dict(run.assigned or {}))
        elif (
            sub.outcome is Outcome.QUEUED
            and run is not None
            and self.index[run.run_id] not in self.assigned
        ):
            # (R17's guard may have promoted it already: then the observer saw it)
            self.queued[run.run_id] = arrival.contract["roles"]

    def advert(self, node: int, daemon: Daemon, heartbeat: bool) -> int:
        now = self.clock.now_us
        with self._call("advert"):
            ttl = self.med.advert(self.ids[node], daemon.daemon_caps, daemon.instance,
                                  label=self.labels[node], drain=daemon.daemon_drain,
                                  principal="")  # fmt: skip
        expires = now + to_us(ttl)
        # A steady heartbeat (live, same policy) changes no capacity: no stuck check needed.
        self.quiet = heartbeat and self.expires[node] > now
        self.expires[node] = expires
        return expires

    def nodes_of(self, run: int) -> Iterable[int]:
        return self.assigned.get(run, ())

    def work(self, node: int, instance: str) -> Any:
        with self._call("work"):
            work = self.med.work(self.ids[node])
        if not work:
            return None
        return min(work, key=lambda s: s.seq)  # one lease per node (I1): one run's steps

    def claim(self, node: int, instance: str, step: Any) -> tuple[int, int, int]:
        with self._call("claim"):
            claimed = self.med.claim(step.run_id, step.seq, self.ids[node], instance)
        return self.index[claimed.run_id], claimed.seq, claimed.attempt

    def report(
        self, node: int, instance: str, run: int, step: int, attempt: int, outcome: str
    ) -> None:
        run_id = self.plan.arrivals[run].run_id
        try:
            with self._call("report"):
                res = self.med.report(run_id, step, self.ids[node], attempt, outcome,
                                      instance=instance)  # fmt: skip
        except Conflict as exc:
            if exc.code != "run_ended":
                self.violations.append(
                    f"result refused at {self.clock()}: {exc.code} {run_id}/{step}"
                )
            return  # the run had ended: nothing of it left to claim or answer
        if res.settled:
            # The run ended with this result, its leases released: its nodes' next poll could
            # only come back empty (a node a sweep leased again was touched by that sweep), so
            # they make none — as the reference model, whose ended runs touch nothing.
            self.assigned.pop(run, None)
            return
        self.touched.append(run)

    def asked(self, run: int) -> Iterable[int]:
        with self._call("work"):
            steps = self.med.get_run(self.plan.arrivals[run].run_id).steps
        return [s.seq for s in steps if s.state == "ASKED"]

    def answer(self, run: int, step: int, ok: bool) -> None:
        run_id = self.plan.arrivals[run].run_id
        with self._call("work"):
            open_asks = [a for a in self.med.asks() if a.run_id == run_id and a.seq == step]
        if not open_asks:
            return  # the ask was closed when the run ended
        with self._call("answer"):
            self.med.answer(open_asks[0].ask_id, "ok" if ok else "not ok", ok=ok, principal="sim")
        self.touched.append(run)

    def reap(self) -> None:
        with self._call("reap"):
            self.med.reap()

    def cancel(self, node: int) -> None:
        rows = self.med.query(
            "SELECT l.run_id FROM leases l JOIN runs r USING (run_id) "
            "WHERE l.node_id = %s AND r.state = 'RUNNING'",
            (self.ids[node],),
        )
        if not rows:
            return  # nothing to cancel: the operator finds the bench idle
        run_id = str(rows[0]["run_id"])
        with self._call("cancel"):
            self.med.cancel(run_id)  # in-process, trusted (an admin at the bench); wake 2
        # The run ended: nothing of it is left to claim (a step in flight reports run_ended).
        self.assigned.pop(self.index[run_id], None)

    def holds_lease(self, nodes: list[int]) -> bool:
        ids = [self.ids[i] for i in nodes]
        return bool(self.med.query("SELECT 1 FROM leases WHERE node_id = ANY(%s) LIMIT 1", (ids,)))

    def drain_pending(self, nodes: list[int]) -> bool:
        rows = self.med.query(
            "SELECT 1 FROM leases l JOIN runs r USING (run_id) "
            "WHERE r.state = 'RUNNING' AND l.node_id = ANY(%s) LIMIT 1",
            ([self.ids[i] for i in nodes],),
        )
        return bool(rows)

    def note_fleet(self, node: int, kind: str, applied: bool) -> None:
        return None  # the Mediator sees only the adverts

    # ---- stuck and invariants ----
    def promotable(self) -> Iterable[int]:
        """A QUEUED run is stuck while the live, free fleet could serve it (docs/design.md §20)."""
        self.counts["checks"] += 1
        promotable: list[int] = []
        if self.queued:
            fleet = self.med.list_nodes().nodes
            free = [n for n in fleet if n.lease is None and not n.drain]
            if free:
                adverts = [Advert(n.node_id, n.capabilities) for n in fleet]
                unavailable = {n.node_id for n in fleet if n.lease is not None or n.drain}
                verdicts: dict[str, bool] = {}
                for run_id, needs in self.queued.items():
                    key = json.dumps(needs, sort_keys=True)
                    if key not in verdicts:
                        res = match(needs, adverts, unavailable, self.max_width)
                        verdicts[key] = isinstance(res, Assignment)
                    if verdicts[key]:
                        promotable.append(self.index[run_id])
        return promotable

    def check_invariants(self, final: bool = False) -> None:
        """I1–I7 by SQL against the live database (read-only)."""
        for name, sql in INVARIANT_SQL.items():
            for row in self.med.query(sql):
                self.violations.append(f"{name} at {self.clock()}: {row}")
        if final:
            for row in self.med.query(FINAL_SQL):
                self.violations.append(f"I6 at end: terminal run not sealed: {row}")


INVARIANT_SQL = {
    "I1": "SELECT node_id FROM leases GROUP BY node_id HAVING count(*) > 1",
    "I2": """SELECT l.node_id, l.run_id, r.state FROM leases l JOIN runs r USING (run_id)
             WHERE r.state <> 'RUNNING' AND NOT EXISTS (
               SELECT 1 FROM steps s WHERE s.run_id = l.run_id AND s.node_id = l.node_id
                 AND s.state = 'CLAIMED')""",
    "I3": """SELECT r.run_id FROM runs r WHERE r.state = 'QUEUED' AND (
               EXISTS (SELECT 1 FROM leases l WHERE l.run_id = r.run_id)
            OR EXISTS (SELECT 1 FROM asks a WHERE a.run_id = r.run_id)
            OR EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.run_id
                       AND (s.state <> 'PENDING' OR s.node_id <> '' OR s.chosen IS NOT NULL)))""",
    "I4": """SELECT s.run_id, s.seq FROM steps s JOIN runs r USING (run_id)
             WHERE r.state = 'RUNNING' AND s.kind = 'exec'
               AND s.node_id IS DISTINCT FROM (r.assigned ->> s.role)""",
    "I5": """SELECT r.run_id FROM runs r WHERE r.started_at IS NOT NULL AND (
               SELECT count(DISTINCT e.node_id) FROM events e
               WHERE e.run_id = r.run_id AND e.kind = 'lease_granted' AND e.at = r.started_at)
             <> (SELECT count(DISTINCT v) FROM jsonb_each_text(r.assigned) AS a(k, v))""",
    # Among runs of one needs class that waited in the queue, starts follow FIFO order: no run
    # starts before an earlier one (a run still waiting counts as starting at infinity).
    "I7": """SELECT run_id FROM (
               SELECT r.run_id, coalesce(r.started_at, 'infinity') AS s,
                      max(coalesce(r.started_at, 'infinity')) OVER (
                        PARTITION BY r.needs_key ORDER BY r.created_at, r.run_id
                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
               FROM runs r
               WHERE EXISTS (SELECT 1 FROM events e WHERE e.run_id = r.run_id
                             AND e.kind = 'submitted' AND e.data ->> 'state' = 'QUEUED')
             ) x WHERE s < before LIMIT 5""",
}
FINAL_SQL = "SELECT run_id FROM runs WHERE state IN ('PASSED', 'FAILED') AND NOT sealed LIMIT 5"


# ---- databases ---------------------------------------------------------------------------------
_cluster: EmbeddedPostgres | None = None


def _server_dsn(database_url: str | None) -> tuple[str, Callable[[str], str]]:
    """An admin DSN and a function naming a database on the same server."""
    global _cluster
    if database_url:
        base = database_url.rsplit("/", 1)[0]
        return database_url, lambda db: f"{base}/{db}"
    if _cluster is None:
        _cluster = EmbeddedPostgres(database="postgres")
        atexit.register(_cluster.stop)
    return _cluster.dsn("postgres"), _cluster.dsn


def server_url(database_url: str | None = None) -> str:
    """A URL of the server simulations use (the process's embedded cluster when None), so that
    other processes — notebook kernels — can create their databases on it too."""
    if database_url:
        return database_url
    return str(embedded_cluster().url("postgres"))


def embedded_cluster() -> EmbeddedPostgres:
    """The process's embedded cluster that simulations create their databases on (started on
    first use, stopped at exit)."""
    _server_dsn(None)
    assert _cluster is not None
    return _cluster


def use_cluster(cluster: EmbeddedPostgres) -> None:
    """Create this process's simulation databases on `cluster` from now on (a benchmark's
    specially configured server)."""
    global _cluster
    _cluster = cluster


def fresh_database(database_url: str | None = None, template: str | None = None) -> str:
    """A new database for one simulation (design.md §20: runs can go side by side): empty, or a copy
    of `template` (a schema-loaded database on the same server, issue 14 §8)."""
    admin, name_to_dsn = _server_dsn(database_url)
    name = f"sim_{os.getpid()}_{time.time_ns()}"
    create_database(admin, name, template)
    return name_to_dsn(name)


def simulate(
    scenario: Scenario | Plan,
    database_url: str | None = None,
    progress: bool | Callable[[int], None] = False,
    keep_records: str | None = None,
    template: str | None = None,
    watch: Callable[[Mediator, int], bool] | None = None,
) -> tuple[Plan, EngineOutput, Mediator, str]:
    """Run the engine; returns the plan, its output, the (still open) Mediator and records dir.

    ``watch(med, now_us)``, when given, is called every :data:`WATCH_EVERY` events with the
    Mediator and the virtual instant; a true answer stops the run there (``EngineOutput.stopped``):
    ``sim coverage`` stops a planted run at its first divergence (``sim.outputs.gate``)."""
    plan = scenario if isinstance(scenario, Plan) else materialize(scenario)
    st = plan.scenario.settings
    config = st.config()  # the settings are Config's own fields, by name
    clock = VirtualClock()
    dsn = fresh_database(database_url, template)
    parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
    records = keep_records or tempfile.mkdtemp(prefix="sim-records-", dir=parent)
    cpu = claim_cpu()  # the loop and its server processes on one CPU (sim/affinity.py)
    try:
        med = Mediator.connect(dsn, config, clock, records_root=records, pool_size=2,
                               on_backend=cpu.pin if cpu is not None else None)  # fmt: skip
    except BaseException:
        if cpu is not None:
            cpu.release()
        raise
    bar: Any = None
    callback: Callable[[int], None] | None = progress if callable(progress) else None
    if progress is True:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(plan.arrivals), desc=plan.scenario.name, unit="run", leave=False)

        def callback(submitted: int) -> None:
            bar.update(submitted - bar.n)

    broker = MediatorBroker(plan, med, clock)

    def every(events: int) -> bool:
        if events % CHECK_EVERY == 0:
            broker.check_invariants()
            if callback is not None:
                callback(broker.counts["submit"])  # runs submitted so far (of len(plan.arrivals))
        return watch is not None and watch(med, clock.now_us)

    driver = Driver(plan, broker, every=WATCH_EVERY if watch is not None else CHECK_EVERY,
                    hook=every)  # fmt: skip
    started = time.perf_counter()
    try:
        end = driver.run()
        broker.check_invariants(final=True)
    except BaseException:
        med.close()
        raise
    finally:
        if cpu is not None:
            cpu.release()
        if callback is not None:
            callback(broker.counts["submit"])
        if bar is not None:
            bar.close()
    out = EngineOutput(end, driver.stuck_rows, broker.violations, dict(broker.counts),
                       time.perf_counter() - started, broker.med_s, driver.stopped)  # fmt: skip
    if keep_records is None:
        shutil.rmtree(records, ignore_errors=True)
    return plan, out, med, records
