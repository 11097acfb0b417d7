"""The engine that drives the real Mediator against a real PostgreSQL in virtual time
(design.md §20).

Every call goes through the Mediator's public Python interface (``submit``, ``advert``, ``work``,
``claim``, ``report``, ``answer``, ``reap``) on a connection whose clock is this engine's virtual
clock, so every ``mediator_now()`` in SQL reads virtual time. Measurements are read back from the
database afterwards, read-only (``Mediator.query``).

Why not SimPy's scheduler: the differential test (design.md §20) needs this engine and the
reference model to order simultaneous events identically — by (time, class, key), defined once in
``sim.core`` — while SimPy orders equal-time events by insertion. So both engines share the small
``EventQueue`` heap of ``sim.core`` (style.md: SimPy's own core is such a heap), and the node
daemons here behave exactly as the model's contract says (adverts at t0 + k·interval, one step at a
time, the lowest-positioned claimable step; vanish/return/restart/drain/caps are ``sim.fleet``'s,
shared with the model).

Virtual time starts at ``EPOCH``, years away from the wall clock: a statement that read the wall
clock would put its timestamp in the wrong year, and the analysis would show it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from mediator import Config, Conflict, Mediator
from mediator.match import Advert, Assignment, match
from sim import fleet
from sim.core import (
    ADVERT,
    ARRIVAL,
    CLAIM,
    FLEET,
    MARK,
    REAPER,
    RESULT,
    EventQueue,
    step_key,
    to_us,
)
from sim.fleet import Daemon
from sim.scenarios import Scenario
from sim.workload import Plan, materialize

EPOCH = datetime(2031, 1, 1, tzinfo=UTC)


class VirtualClock:
    """The engine's clock, in integer microseconds since ``EPOCH``; the Mediator reads it."""

    def __init__(self) -> None:
        self.now_us = 0

    def __call__(self) -> datetime:
        return EPOCH + timedelta(microseconds=self.now_us)


class _Node(Daemon):
    """A node's daemon (`sim.fleet.Daemon`) with what this engine needs to drive it."""

    __slots__ = ("expires_us", "label")

    def __init__(self, node_id: str, label: str, caps: dict[str, Any]) -> None:
        super().__init__(node_id, caps)
        self.label = label
        self.expires_us = -1  # when its last advert expires (the TTL the Mediator returned)


@dataclass
class EngineOutput:
    """What the engine observed itself; the rest is read from the database."""

    end_us: int
    stuck_rows: list[tuple[str, int, int, bool]]
    violations: list[str]
    counts: dict[str, int]
    wall_s: float
    mediator_s: float


class Engine:
    """One simulation of a plan against one Mediator (on its own fresh database)."""

    def __init__(
        self,
        plan: Plan,
        med: Mediator,
        clock: VirtualClock,
        *,
        progress: Callable[[int], None] | None = None,
        check_every: int = 2000,
    ) -> None:
        sc = plan.scenario
        st = sc.settings
        self.plan, self.med, self.clock = plan, med, clock
        self.interval = to_us(sc.fleet.advert_interval_s)
        self.renew = to_us(st.renew_s)
        self.latency = to_us(st.claim_latency_s)
        self.max_width = st.max_width
        self.end = to_us(sc.horizon_s) if sc.horizon_s is not None else None
        self.nodes = [_Node(n.node_id, n.label, dict(n.capabilities)) for n in plan.nodes]
        self.by_id = {n.node_id: n for n in self.nodes}
        self.q = EventQueue()
        self.pending = 0  # scheduled events other than heartbeats and marks
        self.index = {a.run_id: i for i, a in enumerate(plan.arrivals)}
        self.assigned: dict[str, dict[str, str]] = {}
        self.queued: dict[str, dict[str, Any]] = {}  # run_id → needs, as far as we know
        self.touched: list[str] = []
        self.swept = False
        self.asked: set[tuple[str, int]] = set()
        self.reaper_on = False
        self.stuck_open: dict[str, int] = {}
        self.stuck_rows: list[tuple[str, int, int, bool]] = []
        self.violations: list[str] = []
        self.counts = dict.fromkeys(
            ("submit", "advert", "claim", "report", "answer", "reap", "work", "wake", "checks"), 0
        )
        self.progress = progress
        self.check_every = check_every
        self.med_s = 0.0
        med.sweep_observers.append(self._on_sweep)

    # ---- plumbing ----
    @contextmanager
    def _call(self, kind: str) -> Iterator[None]:
        self.counts[kind] += 1
        t = time.perf_counter()
        try:
            yield
        finally:
            self.med_s += time.perf_counter() - t

    def _push(self, t: int, cls: int, key: Any, action: Callable[[Any], object], arg: Any) -> None:
        if cls not in (ADVERT, MARK):
            self.pending += 1
        self.q.push(t, cls, key, action, arg)

    def _on_sweep(self, seconds: float, report: Any) -> None:
        self.counts["wake"] += 1
        self.swept = True
        for run_id in report.promoted:
            self.queued.pop(run_id, None)
            self.assigned[run_id] = report.assigned.get(run_id, {})
            self.touched.append(run_id)

    # ---- the loop ----
    def run(self) -> EngineOutput:
        started = time.perf_counter()
        for node in self.nodes:  # every daemon starts at t = 0
            self._push(0, ADVERT, node.node_id, self._on_advert, (node, node.advert_epoch))
        if self.plan.arrivals:
            self._push(to_us(self.plan.arrivals[0].at_s), ARRIVAL, self.plan.arrivals[0].run_id,
                       self._on_arrival, 0)  # fmt: skip
        if self.plan.fleet_events:
            self._push(to_us(self.plan.fleet_events[0].at_s), FLEET, 0, self._on_fleet, 0)
        steps = 0
        now = 0
        while len(self.q):
            t, cls, _key, _seq, action, arg = self.q.pop()
            if self.end is not None and t > self.end:
                break
            now = self.clock.now_us = t
            if cls not in (ADVERT, MARK):
                self.pending -= 1
            self.swept = False
            quiet = action(arg)
            self._dispatch()
            if self.stuck_open or (self.queued and not self.swept and not quiet):
                self._check_stuck()
            steps += 1
            if steps % self.check_every == 0:
                self._check_invariants()
                if self.progress is not None:
                    self.progress(steps)
            if self.end is None and self.pending == 0 and not self._drain_pending():
                break
        if self.end is not None:
            now = self.clock.now_us = max(now, self.end)
        for run_id, since in self.stuck_open.items():
            self.stuck_rows.append((run_id, since, now, True))
        self._check_invariants(final=True)
        return EngineOutput(now, self.stuck_rows, self.violations, dict(self.counts),
                            time.perf_counter() - started, self.med_s)  # fmt: skip

    # ---- arrivals ----
    def _on_arrival(self, i: int) -> None:
        arrivals = self.plan.arrivals
        if i + 1 < len(arrivals):  # one pending arrival at a time keeps the heap small
            nxt = arrivals[i + 1]
            self._push(to_us(nxt.at_s), ARRIVAL, nxt.run_id, self._on_arrival, i + 1)
        arrival = arrivals[i]
        with self._call("submit"):
            sub = self.med.submit(arrival.contract, principal="sim")
        run = sub.run
        if sub.status == 201 and run is not None:
            self.assigned[run.run_id] = dict(run.assigned or {})
            self.touched.append(run.run_id)
        elif sub.status == 202 and run is not None and run.run_id not in self.assigned:
            # (R17's guard may have promoted it already: then the observer saw it)
            self.queued[run.run_id] = arrival.contract["roles"]

    # ---- nodes: claims, results, asks ----
    def _dispatch(self) -> None:
        """Let idle daemons of touched runs claim, and schedule answers to asks raised."""
        while self.touched:
            run_id = self.touched.pop()
            for node_id in sorted(set(self.assigned.get(run_id, {}).values())):
                self._try_claim(self.by_id[node_id])
            self._schedule_answers(run_id)

    def _try_claim(self, node: _Node, now: bool = False) -> None:
        if node.busy is not None or not node.up or node.daemon_drain == "at-boundary":
            return
        if self.latency and not now:
            if not node.claim_pending:
                node.claim_pending = True
                self._push(self.clock.now_us + self.latency, CLAIM, node.node_id, self._on_claim,
                           (node, node.run_epoch))  # fmt: skip
            return
        with self._call("work"):
            work = self.med.work(node.node_id)
        if not work:
            return
        step = min(work, key=lambda s: s.seq)  # one lease per node (I1): one run's steps
        with self._call("claim"):
            claimed = self.med.claim(step.run_id, step.seq, node.node_id, node.instance)
        node.busy = (claimed.run_id, claimed.seq)
        arrival = self.plan.arrivals[self.index[claimed.run_id]]
        attempt = arrival.step_outcomes[claimed.seq][claimed.attempt - 1]
        key = step_key(self.index[claimed.run_id], claimed.seq)
        self._push(self.clock.now_us + to_us(attempt.duration_s), RESULT, key, self._on_result,
                   (node, claimed.run_id, claimed.seq, claimed.attempt, attempt.outcome,
                    node.run_epoch))  # fmt: skip

    def _on_claim(self, arg: tuple[_Node, int]) -> None:
        node, epoch = arg
        if epoch != node.run_epoch:
            return
        node.claim_pending = False
        self._try_claim(node, now=True)

    def _on_result(self, arg: tuple[_Node, str, int, int, str, int]) -> None:
        node, run_id, seq, attempt, outcome, epoch = arg
        if epoch != node.run_epoch:
            return  # the daemon died with this step: its result is never sent
        node.busy = None
        try:
            with self._call("report"):
                self.med.report(run_id, seq, node.node_id, attempt, outcome, instance=node.instance)
        except Conflict as exc:
            if exc.code != "run_ended":
                self.violations.append(
                    f"result refused at {self.clock()}: {exc.code} {run_id}/{seq}"
                )
        self.touched.append(run_id)
        self._try_claim(node)

    def _schedule_answers(self, run_id: str) -> None:
        arrival = self.plan.arrivals[self.index[run_id]]
        if not any(a is not None for a in arrival.ask_answers):
            return
        with self._call("work"):
            steps = self.med.get_run(run_id).steps
        for s in steps:
            if s.state == "ASKED" and (run_id, s.seq) not in self.asked:
                self.asked.add((run_id, s.seq))
                answer = arrival.ask_answers[s.seq]
                assert answer is not None
                key = step_key(self.index[run_id], s.seq)
                self._push(self.clock.now_us + to_us(answer.delay_s), RESULT, key,
                           self._on_answer, (run_id, s.seq, answer.ok))  # fmt: skip

    def _on_answer(self, arg: tuple[str, int, bool]) -> None:
        run_id, seq, ok = arg
        with self._call("work"):
            open_asks = [a for a in self.med.asks() if a.run_id == run_id and a.seq == seq]
        if not open_asks:
            return  # the ask was closed when the run ended
        with self._call("answer"):
            self.med.answer(open_asks[0].ask_id, "ok" if ok else "not ok", ok=ok, principal="sim")
        self.touched.append(run_id)

    # ---- fleet ----
    def _on_advert(self, arg: tuple[_Node, int]) -> bool:
        node, epoch = arg
        if epoch != node.advert_epoch:
            return True
        self._push(self.clock.now_us + self.interval, ADVERT, node.node_id, self._on_advert, arg)
        # A steady heartbeat (live, same policy) changes no capacity: no stuck check needed.
        return self._advert(node)

    def _advert(self, node: _Node) -> bool:
        now = self.clock.now_us
        steady = node.expires_us > now
        with self._call("advert"):
            ttl = self.med.advert(node.node_id, node.daemon_caps, node.instance, label=node.label,
                                  drain=node.daemon_drain, principal="")  # fmt: skip
        node.expires_us = now + to_us(ttl)
        self._try_claim(node)
        return steady

    def _on_fleet(self, i: int) -> None:
        events = self.plan.fleet_events
        if i + 1 < len(events):
            self._push(to_us(events[i + 1].at_s), FLEET, i + 1, self._on_fleet, i + 1)
        ev = events[i]
        node = self.by_id[ev.node_id]
        effect = fleet.apply(node, ev)
        if effect == fleet.VANISHED:
            self._push(node.expires_us, MARK, node.node_id, lambda _: None, None)
            self._start_reaper()
        elif effect == fleet.RETURNED:
            self._push(self.clock.now_us + self.interval, ADVERT, node.node_id, self._on_advert,
                       (node, node.advert_epoch))  # fmt: skip
            self._advert(node)
        elif effect == fleet.ADVERTISE:
            self._advert(node)

    # ---- the reaper ----
    def _start_reaper(self) -> None:
        """The reaper runs at k·renew_s. Only a dark node's lease can expire (live nodes renew
        theirs with every advert), so passes are made while some node is dark — including for a
        lease granted to a dark node that still looked live; the others would find nothing."""
        if not self.reaper_on:
            self.reaper_on = True
            tick = (self.clock.now_us // self.renew + 1) * self.renew
            self._push(tick, REAPER, 0, self._on_reap, None)

    def _on_reap(self, _: Any) -> None:
        with self._call("reap"):
            self.med.reap()
        now = self.clock.now_us
        dark = [n for n in self.nodes if not n.up]
        # Keep going while a dark node may still be given a lease (it looks live until its
        # advert expires) or still holds one; after that no lease of it can expire any more.
        more = any(n.expires_us > now for n in dark) or bool(
            dark
            and self.med.query(
                "SELECT 1 FROM leases WHERE node_id = ANY(%s) LIMIT 1", ([n.node_id for n in dark],)
            )
        )
        if more:
            self._push(now + self.renew, REAPER, 0, self._on_reap, None)
        else:
            self.reaper_on = False

    def _drain_pending(self) -> bool:
        ids = [n.node_id for n in self.nodes if n.up and n.daemon_drain == "at-boundary"]
        if not ids:
            return False
        rows = self.med.query(
            "SELECT 1 FROM leases l JOIN runs r USING (run_id) "
            "WHERE r.state = 'RUNNING' AND l.node_id = ANY(%s) LIMIT 1",
            (ids,),
        )
        return bool(rows)

    # ---- stuck and invariants ----
    def _check_stuck(self) -> None:
        """A QUEUED run is stuck while the live, free fleet could serve it (docs/design.md §20)."""
        self.counts["checks"] += 1
        now = self.clock.now_us
        promotable: set[str] = set()
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
                        promotable.add(run_id)
        for run_id in [r for r in self.stuck_open if r not in promotable]:
            since = self.stuck_open.pop(run_id)
            if now > since:
                self.stuck_rows.append((run_id, since, now, False))
        for run_id in promotable:
            self.stuck_open.setdefault(run_id, now)

    def _check_invariants(self, final: bool = False) -> None:
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
_cluster: Any = None


def _server_dsn(database_url: str | None) -> tuple[str, Callable[[str], str]]:
    """An admin DSN and a function naming a database on the same server."""
    global _cluster
    if database_url:
        base = database_url.rsplit("/", 1)[0]
        return database_url, lambda db: f"{base}/{db}"
    if _cluster is None:
        from mediator.pg import EmbeddedPostgres

        _cluster = EmbeddedPostgres(database="postgres")
        import atexit

        atexit.register(_cluster.stop)
    return _cluster.dsn("postgres"), _cluster.dsn


def server_url(database_url: str | None = None) -> str:
    """A URL of the server simulations use (the process's embedded cluster when None), so that
    other processes — notebook kernels — can create their databases on it too."""
    if database_url:
        return database_url
    _server_dsn(None)
    return str(_cluster.url("postgres"))


def fresh_database(database_url: str | None = None, template: str | None = None) -> str:
    """A new database for one simulation (design.md §20: runs can go side by side): empty, or a copy
    of `template` (a schema-loaded database on the same server, issue 14 §8)."""
    from mediator.databases import create_database

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
) -> tuple[Plan, EngineOutput, Mediator, str]:
    """Run the engine; returns the plan, its output, the (still open) Mediator and records dir."""
    plan = scenario if isinstance(scenario, Plan) else materialize(scenario)
    st = plan.scenario.settings
    config = Config(
        lease_ttl_seconds=st.lease_ttl_s,
        renew_seconds=st.renew_s,
        advert_ttl_seconds=st.advert_ttl_s,
        max_width=st.max_width,
        max_attempts=st.max_attempts,
        wake_on_return=st.wake_on_return,
    )
    clock = VirtualClock()
    dsn = fresh_database(database_url, template)
    parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
    records = keep_records or tempfile.mkdtemp(prefix="sim-records-", dir=parent)
    med = Mediator.connect(dsn, config, clock, records_root=records, pool_size=2)
    bar: Any = None
    callback: Callable[[int], None] | None = progress if callable(progress) else None
    if progress is True:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(plan.arrivals), desc=plan.scenario.name, unit="run", leave=False)

        def callback(_steps: int) -> None:
            bar.update(engine.counts["submit"] - bar.n)

    engine = Engine(plan, med, clock, progress=callback)
    try:
        out = engine.run()
    except BaseException:
        med.close()
        raise
    finally:
        if bar is not None:
            bar.update(engine.counts["submit"] - bar.n)
            bar.close()
    if keep_records is None:
        shutil.rmtree(records, ignore_errors=True)
    return plan, out, med, records
