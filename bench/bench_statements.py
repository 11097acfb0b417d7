"""Issue 13's yardstick: what PostgreSQL itself receives per flow, through the public Python API.

The bench starts its own embedded cluster with ``pg_stat_statements`` preloaded and
``track_utility = on``, so BEGIN, COMMIT and SET count like any other statement. Each flow runs
once to warm up (psycopg prepares its statements on first use), then once measured: the counters
are reset, the flow is called on :class:`mediator.Mediator`, and every top-level statement the
server executed in the Mediator's database is summed. Round trips are counted on the client side
from libpq's protocol trace of the Mediator's one pooled connection: each ``Sync`` or simple
``Query`` the client sends waits for one ``ReadyForQuery``, so that is one round trip.

Flows (a one-step run on a free node, then the queue paths):

* submit (free node) → 201; work; claim; result of the last step (settle, seal, wake 1);
  their sum is the one-step run;
* a steady heartbeat (same instance, capabilities and drain);
* submit while the node is busy → 202; a sweep with that run queued and nothing free; a sweep
  that promotes it once its node was freed (by SQL, outside the count); a result that frees a
  node and promotes the queued run in its wake.

Each flow is measured twice: on the wall clock (``clock=None``, as ``mediator serve`` runs) and on
a virtual clock that moves before every call (as the simulator runs), where the clock's
``set_config`` is one more statement whenever the instant changed.

Then, on the same server in the same run:

* the simulator on the real Mediator beside the reference model on the same ``steady`` plan
  (runs/s of each and their ratio), with statements per simulated run;
* P1: submits over HTTP (``mediator serve``) ÷ pgbench TPS, with statements per HTTP submit.

Run: ``.venv/bin/python bench/bench_statements.py [--runs 1000] [--show] [--skip-sim] [--skip-p1]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pg8000.native

from mediator import Config, Mediator, Outcome
from mediator.pg import EmbeddedPostgres


def socket_path(pg: EmbeddedPostgres) -> str:
    """The cluster's unix socket file (it listens on no TCP address)."""
    return os.path.join(pg.socket_dir, f".s.PGSQL.{pg.port}")


PGSS = (
    "shared_preload_libraries=pg_stat_statements",
    "pg_stat_statements.track_utility=on",
    "pg_stat_statements.track=top",
    "pg_stat_statements.max=10000",
)


class Meter:
    """Reads ``pg_stat_statements`` from the ``postgres`` database, about one other database."""

    def __init__(self, pg: EmbeddedPostgres) -> None:
        self.con = pg8000.native.Connection(
            "postgres", unix_sock=socket_path(pg), database="postgres"
        )
        self.con.run("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.home = self.oid("postgres")

    def oid(self, database: str) -> int:
        return int(self.con.run("SELECT oid FROM pg_database WHERE datname = :d", d=database)[0][0])

    def reset(self) -> None:
        self.con.run("SELECT pg_stat_statements_reset()")

    def statements(self, dbid: int | None = None) -> Counter[str]:
        """Calls per normalised statement since the last reset: in ``dbid``, or in every
        database but ``postgres`` (where this meter and CREATE DATABASE run)."""
        if dbid is None:
            rows = self.con.run(
                "SELECT query, calls FROM pg_stat_statements WHERE dbid <> :h", h=self.home
            )
        else:
            rows = self.con.run(
                "SELECT query, calls FROM pg_stat_statements WHERE dbid = :d", d=dbid
            )
        out: Counter[str] = Counter()
        for query, calls in rows:
            out[" ".join(query.split())[:110]] += int(calls)
        return out

    def close(self) -> None:
        self.con.close()


class Trace:
    """Round trips of one psycopg connection, from libpq's protocol trace (client side)."""

    def __init__(self, med: Mediator) -> None:
        self.path = tempfile.mktemp(prefix="mediator-trace-")
        self.file = open(self.path, "w")  # noqa: SIM115 - libpq writes to it until close()
        with med.store.pool.connection() as conn:
            self.pgconn = conn.pgconn
        self.pgconn.trace(self.file.fileno())
        self.mark = 0

    def round_trips(self) -> int:
        """Client messages that wait for ReadyForQuery since the last call."""
        self.file.flush()
        with open(self.path) as f:
            lines = f.readlines()
        new, self.mark = lines[self.mark :], len(lines)
        return sum(1 for ln in new if "\tF\t" in ln and ("\tSync" in ln or "\tQuery\t" in ln))

    def close(self) -> None:
        self.pgconn.untrace()
        self.file.close()
        os.unlink(self.path)


@dataclass
class Figure:
    flow: str
    statements: int
    round_trips: int
    detail: Counter[str] = field(default_factory=Counter)


class StepClock:
    """Virtual time that moves one second before every measured call (the simulator's case)."""

    def __init__(self) -> None:
        self.now = datetime(2031, 3, 1, 12, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def tick(self) -> None:
        self.now += timedelta(seconds=1)


def contract(role_board: str) -> dict[str, Any]:
    return {
        "roles": {"dut": {"board": role_board}},
        "steps": [{"name": "s", "role": "dut", "uses": "shell", "with": {"cmd": "true"}}],
    }


def one_life(med: Mediator, node: str, board: str) -> tuple[str, Any]:
    med.advert(node, {"board": board}, "i1")
    run = med.submit(contract(board)).run
    assert run is not None
    step = med.work(node)[0]
    claimed = med.claim(run.run_id, step.seq, node, "i1")
    med.report(run.run_id, step.seq, node, claimed.attempt, "pass", instance="i1")
    return run.run_id, step


def measure_flows(pg: EmbeddedPostgres, meter: Meter, virtual: bool, tmp: str) -> list[Figure]:
    """Every flow of the module docstring once, measured, on a fresh database."""
    name = "flows_virtual" if virtual else "flows_wall"
    pg.ensure_database(name)
    clock = StepClock() if virtual else None
    med = Mediator.connect(
        pg.dsn(name), Config(), clock, records_root=os.path.join(tmp, name), pool_size=1
    )
    dbid = meter.oid(name)
    admin = pg8000.native.Connection("postgres", unix_sock=socket_path(pg), database=name)
    figures: list[Figure] = []
    trace = Trace(med)

    @contextmanager
    def flow(label: str) -> Iterator[None]:
        if clock is not None:
            clock.tick()
        trace.round_trips()
        meter.reset()
        yield
        stmts = meter.statements(dbid)
        figures.append(Figure(label, sum(stmts.values()), trace.round_trips(), stmts))

    try:
        # Warm-up: every path once, so psycopg's one-off PREPAREs are not counted.
        one_life(med, "warm", "w")
        med.advert("warm", {"board": "w"}, "i1")
        one_life(med, "warm2", "w2")
        for _ in range(2):
            med.advert("warm2", {"board": "w2"}, "i1")
            first = med.submit(contract("w2")).run
            queued = med.submit(contract("w2")).run
            assert first is not None and queued is not None
            med.wake_queued()
            step = med.work("warm2")[0]
            c = med.claim(first.run_id, step.seq, "warm2", "i1")
            med.report(first.run_id, step.seq, "warm2", c.attempt, "pass", instance="i1")
            step = med.work("warm2")[0]
            c = med.claim(queued.run_id, step.seq, "warm2", "i1")
            med.report(queued.run_id, step.seq, "warm2", c.attempt, "pass", instance="i1")

        # The one-step run on a free node.
        med.advert("x", {"board": "x"}, "i1")
        with flow("steady heartbeat"):
            med.advert("x", {"board": "x"}, "i1")
        with flow("submit (free node) → 201"):
            sub = med.submit(contract("x"))
        assert sub.outcome == Outcome.STARTED and sub.run is not None
        with flow("work"):
            step = med.work("x")[0]
        with flow("claim"):
            claimed = med.claim(sub.run.run_id, step.seq, "x", "i1")
        with flow("result (last step → settle → seal)"):
            med.report(sub.run.run_id, step.seq, "x", claimed.attempt, "pass", instance="i1")

        # The queue: y is busy with r1, r2 waits for it.
        med.advert("y", {"board": "y"}, "i1")
        r1 = med.submit(contract("y")).run
        assert r1 is not None
        with flow("submit (node busy) → 202"):
            q = med.submit(contract("y"))
        assert q.outcome == Outcome.QUEUED
        with flow("sweep, one run queued, nothing free"):
            med.wake_queued()
        s1 = med.work("y")[0]
        c1 = med.claim(r1.run_id, s1.seq, "y", "i1")
        with flow("result that frees the node and promotes the queued run"):
            med.report(r1.run_id, s1.seq, "y", c1.attempt, "pass", instance="i1")
        assert q.run is not None and med.get_run(q.run.run_id).state == "RUNNING"

        # A sweep that promotes: z's holder is ended by SQL, outside the count.
        med.advert("z", {"board": "z"}, "i1")
        r3 = med.submit(contract("z")).run
        r4 = med.submit(contract("z")).run
        assert r3 is not None and r4 is not None
        admin.run("DELETE FROM leases WHERE run_id = :r", r=r3.run_id)
        admin.run("UPDATE runs SET state = 'PASSED', verdict = 'pass' WHERE run_id = :r",
                  r=r3.run_id)  # fmt: skip
        with flow("sweep promoting one queued run"):
            report = med.wake_queued()
        assert report.promoted == [r4.run_id], report
    finally:
        trace.close()
        admin.close()
        med.close()
    return figures


LIFE = ("submit (free node) → 201", "work", "claim", "result (last step → settle → seal)")


def print_flows(wall: list[Figure], virt: list[Figure], show: bool) -> None:
    by_v = {f.flow: f for f in virt}
    print(f"{'flow':58} {'wall clock':>16} {'virtual clock':>16}")
    print(f"{'':58} {'stmts  trips':>16} {'stmts  trips':>16}")
    for f in wall:
        v = by_v[f.flow]
        print(f"{f.flow:58} {f.statements:>6} {f.round_trips:>6}    "
              f"{v.statements:>6} {v.round_trips:>6}")  # fmt: skip
    for figs, label in ((wall, "wall"), (virt, "virtual")):
        life = [f for f in figs if f.flow in LIFE]
        print(f"one-step run ({label} clock: submit + work + claim + result): "
              f"{sum(f.statements for f in life)} statements, "
              f"{sum(f.round_trips for f in life)} round trips (issue 13 goal: ≤ 8)")  # fmt: skip
    if show:
        for f in virt:
            print(f"\n-- {f.flow} (virtual clock): {f.statements} statements")
            for q, n in f.detail.most_common():
                print(f"   {n:>3}  {q}")


def simulator(pg: EmbeddedPostgres, meter: Meter, runs: int) -> None:
    """The real-Mediator simulator and the reference model on the same plan, same server."""
    import sim
    from sim.brokers import mediator as engine
    from sim.inputs import scenarios as S

    engine.use_cluster(pg)  # simulations create their databases on this (pgss-enabled) server
    plan = sim.materialize(S.steady(runs=runs, seed=1))
    sim.run(S.steady(runs=20, seed=2), progress=False)  # warm the interpreter's imports
    meter.reset()
    t = time.perf_counter()
    result = sim.run(plan, progress=False)
    wall = time.perf_counter() - t
    stmts = sum(meter.statements().values())
    t = time.perf_counter()
    sim.run_model(plan)
    model_wall = time.perf_counter() - t
    real, model = runs / wall, runs / model_wall
    print(f"simulator on the real Mediator, steady, {runs} one-step runs: {real:,.0f} runs/s; "
          f"{stmts / runs:.1f} statements per run (adverts, sweeps, reads included)")  # fmt: skip
    print(f"reference model, same plan: {model:,.0f} runs/s")
    print(f"ratio model / real Mediator: {model / real:,.0f}×  (issue 13: 4× better than today)")
    print(f"   sweeps: {result.counts['wake']}, adverts: {result.counts['advert']}")


def p1(pg: EmbeddedPostgres, meter: Meter, seconds: int, rounds: int, nodes: int) -> None:
    """P1 on this server: bench_submit's pgbench baseline and HTTP submit rounds."""
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_submit as B

    baseline = B.pgbench_tps(pg, seconds)
    print(f"baseline pgbench TPC-B-like -c2 -j2: {baseline:,.0f} TPS")
    pg.ensure_database("p1")
    dsn, dbid = pg.dsn("p1"), meter.oid("p1")
    cfg = Config(advert_ttl_seconds=3600, lease_ttl_seconds=3600)
    with tempfile.TemporaryDirectory() as tmp:
        med = Mediator.connect(dsn, cfg, records_root=str(Path(tmp) / "records"))
        for i in range(nodes):
            med.advert(f"n{i:05d}", {"pool": "bench", "lane": i % 4}, "i1")
        proc, url = B.start_server(dsn, Path(tmp))
        elapsed = ok = other = stmts = 0
        try:
            for _ in range(rounds):
                meter.reset()
                e, k, o = B.submit_round(url, per_client=nodes // 4)
                stmts += sum(meter.statements(dbid).values())
                elapsed, ok, other = elapsed + e, ok + k, other + o
                B.free_everything(med)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            med.close()
    tps = ok / elapsed
    print(f"P1 submit over HTTP, 4 clients, 201 RUNNING: {tps:,.0f} runs/s ({ok} runs, "
          f"{other} non-201); {stmts / max(ok, 1):.1f} statements per HTTP submit")  # fmt: skip
    print(f"P1 ratio to pgbench: {tps / baseline:.3f} (target ≥ 0.35)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1000, help="simulated runs (steady)")
    ap.add_argument("--show", action="store_true", help="list each flow's statements")
    ap.add_argument("--skip-sim", action="store_true")
    ap.add_argument("--skip-p1", action="store_true")
    ap.add_argument("--time", type=int, default=10, help="pgbench seconds")
    ap.add_argument("--rounds", type=int, default=10, help="P1 rounds")
    ap.add_argument("--nodes", type=int, default=100, help="P1 fleet size")
    args = ap.parse_args()
    with EmbeddedPostgres(server_settings=PGSS) as pg, tempfile.TemporaryDirectory() as tmp:
        meter = Meter(pg)
        try:
            wall = measure_flows(pg, meter, False, tmp)
            virt = measure_flows(pg, meter, True, tmp)
            print_flows(wall, virt, args.show)
            steps: list[Callable[[], None]] = []
            if not args.skip_sim:
                steps.append(lambda: simulator(pg, meter, args.runs))
            if not args.skip_p1:
                steps.append(lambda: p1(pg, meter, args.time, args.rounds, args.nodes))
            for step in steps:
                print()
                step()
        finally:
            meter.close()


if __name__ == "__main__":
    main()
