"""``python -m sim twin export`` over N runs of history: time and peak memory (docs/performance.md).

On one embedded server, N PASSED runs of three one-attempt steps each (runs, steps and their
claimed/result events inserted by SQL over 50 nodes), then `sim.twin.export` of the whole window,
pseudonymized, in this process. Peak RSS should not grow with N: the export streams through
server-side cursors and keeps no per-run state.

Run: ``.venv/bin/python bench/bench_twin_export.py [--sizes 20000 200000]``.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time

import psycopg

import sim
from mediator.databases import create_database
from mediator.pg import EmbeddedPostgres
from mediator.store.connector import load_schema

FILL = [
    """INSERT INTO needs_classes VALUES ('k', '{"dut": {"board": "x"}}')""",
    """INSERT INTO runs (run_id, state, verdict, contract, needs_key, created_at, started_at,
                         ended_at)
       SELECT 'run-' || g, 'PASSED', 'pass', '{}', 'k',
              timestamptz '2031-01-01' + g * interval '10 s',
              timestamptz '2031-01-01' + g * interval '10 s' + interval '1 s',
              timestamptz '2031-01-01' + g * interval '10 s' + interval '9 s'
       FROM generate_series(1, %(n)s) g""",
    """INSERT INTO steps (run_id, seq, name, kind, role, state, node_id, attempt)
       SELECT 'run-' || g, s, 'step' || s, 'exec', 'dut', 'PASSED', 'node-' || (g %% 50), 1
       FROM generate_series(1, %(n)s) g, generate_series(0, 2) s""",
    """INSERT INTO events (at, run_id, node_id, kind, data)
       SELECT timestamptz '2031-01-01' + g * interval '10 s' + (2 + s * 2 + k) * interval '1 s',
              'run-' || g, 'node-' || (g %% 50),
              CASE k WHEN 0 THEN 'claimed' ELSE 'result' END,
              jsonb_build_object('seq', s, 'attempt', 1, 'outcome', 'pass')
       FROM generate_series(1, %(n)s) g, generate_series(0, 2) s, generate_series(0, 1) k""",
    "ANALYZE",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000])
    args = ap.parse_args()
    pg = EmbeddedPostgres(database="postgres")
    try:
        for n in args.sizes:
            name = f"lab{n}"
            create_database(pg.dsn("postgres"), name)
            dsn = pg.dsn(name)
            load_schema(dsn)
            with psycopg.connect(dsn, autocommit=True) as conn:
                for sql in FILL:
                    conn.execute(sql, {"n": n} if "%(n)s" in sql else None)
            t = time.perf_counter()
            done = sim.twin.export(
                dsn, "2030-12-31T00:00Z", "2031-12-31T00:00Z", tempfile.mkdtemp(),
                pseudonymize=True, key=b"bench", progress=False,
            )  # fmt: skip
            secs = time.perf_counter() - t
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            rows = sum(done.rows.values())
            print(f"{n:>8} runs  {rows:>8} rows  {secs:6.1f} s  peak RSS {peak:.0f} MB")
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
