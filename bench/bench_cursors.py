"""What a statement costs the client beyond the server: the store's kept cursors against a fresh
cursor per statement, on the same connection in the same run (docs/performance.md, "Kept
cursors").

A psycopg cursor keeps its adaptation state (a loader per column, the converted query) only while
it runs the same query again; until round 2 session 7 the store made a fresh cursor, with
psycopg's ``dict_row``, for every statement. The baseline here is that path, rebuilt verbatim;
the figure is the store's ``Tx._rows`` of today. Both run the Mediator's own named statements on
an embedded cluster, the client and its server process pinned to one CPU (as the simulator runs,
sim/affinity.py), alternating in rounds so that the host's drift hits both alike. Client CPU per
call is what the change is about; the wall time per call includes the server's work (the same on
both sides).

Statements: ``result_source`` (what a result decides from: 31 columns, one row per step, jsonb),
``work`` (a node's claimable steps, as a row class) and ``fleet_for`` (a submit's read, as tuples).

Run: ``.venv/bin/python bench/bench_cursors.py [--calls 3000] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from psycopg.rows import class_row, dict_row, tuple_row
from psycopg.types.json import Jsonb

from mediator import Mediator, Outcome
from mediator.core.rows import Step
from mediator.pg import EmbeddedPostgres
from mediator.store.connector import check_edges
from mediator.store.queries import QUERIES
from mediator.store.tx import Tx


def fresh_cursor(tx: Tx, name: str, params: dict[str, Any], row: Any) -> list[Any]:
    """The store's ``_rows`` before session 7: a new cursor for every statement."""
    check_edges(params)
    with tx.conn.cursor(row_factory=row) as cur:
        cur.execute(QUERIES[name], {**params, "now": tx.now}, prepare=True)
        res = cur.pgresult
        return cur.fetchall() if res is not None and res.nfields else []


def time_calls(calls: int, fn: Callable[..., Any], *fn_args: Any) -> tuple[float, float]:
    """(client CPU µs, wall µs) per call of ``fn(*fn_args)``."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        fn(*fn_args)
    return (
        (time.process_time() - cpu) / calls * 1e6,
        (time.perf_counter() - wall) / calls * 1e6,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description="kept cursors against a fresh cursor per statement")
    ap.add_argument("--calls", type=int, default=3000, help="calls per statement per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    cpu = sorted(os.sched_getaffinity(0))[-1]
    os.sched_setaffinity(0, {cpu})
    with tempfile.TemporaryDirectory() as tmp, EmbeddedPostgres(database="bench") as pg:
        med = Mediator.connect(
            pg.dsn("bench"),
            records_root=os.path.join(tmp, "records"),
            on_backend=lambda pid: os.sched_setaffinity(pid, {cpu}),
        )
        try:
            med.advert("X", {"board": "x"}, "i1")
            steps = [{"name": f"s{i}", "role": "dut", "uses": "shell", "with": {"cmd": f"echo {i}"}}
                     for i in range(3)]  # fmt: skip
            contract = {"run_id": "bench", "roles": {"dut": {"board": "x"}}, "steps": steps}
            assert med.submit(contract).outcome == Outcome.STARTED
            roles = Jsonb({"dut": {"board": "x"}})
            cases = [
                ("result_source", {"run_id": "bench", "node_id": "X"}, dict, dict_row),
                ("work", {"node_id": "X"}, Step, class_row(Step)),
                ("fleet_for", {"roles": roles, "run_id": None}, tuple, tuple_row),
            ]
            with med.store.autocommit() as tx:
                for name, params, shape, row in cases:
                    kept = tx._rows(name, params, shape)
                    assert kept == fresh_cursor(tx, name, params, row), name
                    assert kept, f"{name} returned no row: nothing would be measured"
                print(f"{args.rounds} rounds × {args.calls:,} calls per statement, one CPU")
                print(f"{'statement':<15} {'fresh cursor: CPU, wall µs':>28} "
                      f"{'kept cursor: CPU, wall µs':>27} {'CPU saved':>10}")  # fmt: skip
                for name, params, shape, row in cases:
                    base: list[tuple[float, float]] = []
                    ours: list[tuple[float, float]] = []
                    for _ in range(args.rounds):
                        base.append(time_calls(args.calls, fresh_cursor, tx, name, params, row))
                        ours.append(time_calls(args.calls, tx._rows, name, params, shape))
                    b_cpu = statistics.median(c for c, _ in base)
                    b_wall = statistics.median(w for _, w in base)
                    o_cpu = statistics.median(c for c, _ in ours)
                    o_wall = statistics.median(w for _, w in ours)
                    print(f"{name:<15} {b_cpu:>18.1f}, {b_wall:>7.1f} {o_cpu:>18.1f}, "
                          f"{o_wall:>6.1f} {1 - o_cpu / b_cpu:>10.0%}")  # fmt: skip
        finally:
            med.close()


if __name__ == "__main__":
    main()
