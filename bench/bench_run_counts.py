"""``GET /v1/runs``' lab-wide counts at 10,000 and 100,000 runs of history (issue 13).

The panel polls the run list every 5 s per open tab, and each list carries the QUEUED and RUNNING
counts of the whole lab. On one embedded server, per history size: a fleet of 10 nodes with 10
RUNNING and 50 QUEUED runs, and N ended (PASSED) runs inserted by SQL; then, timed on the same
connection, the old count (``GROUP BY state`` over every run) beside today's ``run_counts``
(QUEUED and RUNNING from their partial indexes), and the whole ``Mediator.list_runs()`` call.

Run: ``.venv/bin/python bench/bench_run_counts.py [--sizes 10000 100000]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from collections.abc import Callable

import pg8000.native

from mediator import Config, Mediator
from mediator.pg import EmbeddedPostgres
from mediator.store.queries import QUERIES

OLD = "SELECT state, count(*) AS n FROM runs GROUP BY state"


def ms_per_call(fn: Callable[[], object], repeat: int = 50) -> float:
    fn()  # warm: plan cached, pages in memory
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - started) / repeat)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    args = ap.parse_args()
    print(f"{'ended runs':>12} {'GROUP BY state':>16} {'run_counts':>12} {'list_runs()':>12}")
    for size in args.sizes:
        with EmbeddedPostgres() as pg, tempfile.TemporaryDirectory() as tmp:
            med = Mediator.connect(pg.dsn(), Config(), records_root=f"{tmp}/records")
            for i in range(10):
                med.advert(f"n{i}", {"board": "x"}, "i1")
            for i in range(60):  # 10 RUNNING, 50 QUEUED
                med.submit({"run_id": f"live{i}", "roles": {"dut": {"board": "x"}},
                            "steps": [{"name": "s", "role": "dut", "uses": "fail"}]})  # fmt: skip
            con = pg8000.native.Connection(
                "postgres",
                unix_sock=os.path.join(pg.socket_dir, f".s.PGSQL.{pg.port}"),
                database=pg.database,
            )
            con.run(
                "INSERT INTO runs (run_id, state, verdict, contract, needs_key, created_at, "
                "ended_at, sealed) SELECT 'old' || i, 'PASSED', 'pass', contract, needs_key, "
                "created_at, created_at, true FROM runs, generate_series(1, :n) AS i "
                "WHERE run_id = 'live0'",
                n=size,
            )
            con.run("VACUUM ANALYZE runs")
            new = QUERIES["run_counts"].replace("%%", "%")
            old_ms = ms_per_call(functools.partial(con.run, OLD))
            new_ms = ms_per_call(functools.partial(con.run, new))
            list_ms = ms_per_call(med.list_runs, repeat=20)
            con.close()
            med.close()
        print(f"{size:>12,} {old_ms:>13.2f} ms {new_ms:>9.2f} ms {list_ms:>9.2f} ms")


if __name__ == "__main__":
    main()
