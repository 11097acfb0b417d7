"""P2 and P3 (docs/performance.md): the cost of one promotion sweep against the queue's length.

P2: Q = 100 / 1,000 / 10,000 queued runs in 50 needs classes, every class waiting for its own busy
    node, and one free live node that none of them can use. Target: flat (Q=10,000 within 3× of
    Q=100) and ≤ 20 ms.
P3: 10,000 queued runs and one freed node: one sweep promotes one run. Target ≤ 50 ms.

The queue is bulk-loaded by SQL in exactly the shape submit's queue path writes (a run QUEUED, its
steps PENDING with node_id '', its needs class): this measures the sweep, not 10,000 submits. The
sweep itself runs through the real ``Mediator.wake_queued``. Figures are medians over repeated
sweeps, printed with their ratio to a ``SELECT 1`` round trip on the same server in the same run.

Run: ``.venv/bin/python bench/bench_sweep.py`` (starts its own embedded PostgreSQL).
"""

from __future__ import annotations

import argparse
import statistics
import time

from mediator import Config, Mediator
from mediator.core.contract import needs_key
from mediator.pg import EmbeddedPostgres

CLASSES = 50


def select1_us(med: Mediator, n: int = 2000) -> float:
    with med.store.pool.connection() as conn:
        for _ in range(200):
            conn.execute("SELECT 1")
        t = time.perf_counter()
        for _ in range(n):
            conn.execute("SELECT 1")
        return (time.perf_counter() - t) / n * 1e6


def load(med: Mediator, queued: int) -> None:
    """50 busy nodes b0..b49 (each leased by a blocker run), one free node that serves nobody,
    and `queued` runs round-robin over the 50 classes, in FIFO order."""
    with med.store.pool.connection() as conn, conn.transaction():
        conn.execute("TRUNCATE events, asks, leases, steps, runs, needs_classes, nodes CASCADE")
        conn.execute(
            """INSERT INTO nodes (node_id, label, capabilities, instance, seen_at, expires_at)
               SELECT 'b' || k, 'b' || k, jsonb_build_object('board', 'b' || k), 'i',
                      now(), now() + interval '1 day' FROM generate_series(0, %s) k
               UNION ALL SELECT 'free', 'free', '{"board": "other"}', 'i', now(),
                      now() + interval '1 day'""",
            (CLASSES - 1,),
        )
        for k in range(CLASSES):
            needs = {"dut": {"board": f"b{k}"}}
            conn.execute(
                "INSERT INTO needs_classes VALUES (%s, %s::jsonb)",
                (needs_key(needs), _json(needs)),
            )
        keys = [needs_key({"dut": {"board": f"b{k}"}}) for k in range(CLASSES)]
        conn.execute(
            """INSERT INTO runs (run_id, state, contract, needs_key, created_at, started_at)
               SELECT 'blk' || k, 'RUNNING', '{}', (%s::text[])[k + 1], now(), now()
               FROM generate_series(0, %s) k""",
            (keys, CLASSES - 1),
        )
        conn.execute(
            """INSERT INTO leases (node_id, run_id, instance, granted_at, not_after)
               SELECT 'b' || k, 'blk' || k, 'i', now(), now() + interval '1 day'
               FROM generate_series(0, %s) k""",
            (CLASSES - 1,),
        )
        conn.execute(
            """INSERT INTO runs (run_id, state, contract, needs_key, created_at)
               SELECT format('q%%06s', i), 'QUEUED',
                      jsonb_build_object('roles', jsonb_build_object('dut',
                          jsonb_build_object('board', 'b' || (i %% %s)))),
                      (%s::text[])[(i %% %s) + 1],
                      timestamptz '2030-01-01' + i * interval '1 ms'
               FROM generate_series(0, %s - 1) i""",
            (CLASSES, keys, CLASSES, queued),
        )
        conn.execute(
            """INSERT INTO steps (run_id, seq, name, kind, role, uses, state)
               SELECT run_id, 0, 'test', 'exec', 'dut', 'shell', 'PENDING'
               FROM runs WHERE state = 'QUEUED'"""
        )
        conn.execute("ANALYZE")


def _json(obj: object) -> str:
    import json

    return json.dumps(obj)


def time_sweep(med: Mediator, reps: int) -> tuple[float, list[str]]:
    med.wake_queued()  # warm the statement cache
    samples, promoted = [], []
    for _ in range(reps):
        t = time.perf_counter()
        report = med.wake_queued()
        samples.append((time.perf_counter() - t) * 1e3)
        promoted += report.promoted
    return statistics.median(samples), promoted


def time_freed_node(med: Mediator, reps: int) -> tuple[float, int]:
    samples, promoted = [], 0
    for i in range(reps):
        k = (i * 7) % CLASSES
        with med.store.pool.connection() as conn:  # free one node quietly: no wake runs
            run = conn.execute("DELETE FROM leases WHERE node_id = %s RETURNING run_id", (f"b{k}",))
            (old,) = run.fetchone()
            conn.execute("UPDATE runs SET state='PASSED', verdict='pass' WHERE run_id=%s", (old,))
        t = time.perf_counter()
        report = med.wake_queued()
        samples.append((time.perf_counter() - t) * 1e3)
        promoted += len(report.promoted)
    return statistics.median(samples), promoted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    with EmbeddedPostgres() as pg:
        med = Mediator.connect(pg.dsn(), Config(), startup_wake=False)
        try:
            base = select1_us(med)
            print(f"baseline SELECT 1 round trip: {base:.0f} µs")
            p2 = {}
            for q in (100, 1_000, 10_000):
                load(med, q)
                ms, promoted = time_sweep(med, args.reps)
                assert promoted == [], "P2's free node must serve no queued run"
                p2[q] = ms
                print(f"P2 sweep, Q={q:>6,}: {ms:6.2f} ms  ({ms * 1e3 / base:5.1f} × SELECT 1)")
            print(f"P2 flatness Q=10,000 / Q=100: {p2[10_000] / p2[100]:.2f} (target ≤ 3)")
            load(med, 10_000)
            ms, n = time_freed_node(med, args.reps)
            assert n == args.reps, "each freed node must promote exactly one run"
            print(f"P3 sweep, Q=10,000, one freed node: {ms:6.2f} ms per promotion "
                  f"({ms * 1e3 / base:5.1f} × SELECT 1)")  # fmt: skip
        finally:
            med.close()


if __name__ == "__main__":
    main()
