"""``GET /v1/runs``' lab-wide counts read only the live runs (issue 13, docs/performance.md P1).

The panel polls the run list every 5 s, and each list carries the QUEUED and RUNNING counts of the
whole lab. Counting with ``GROUP BY state`` read every run ever kept; with a history of 1,000
ended runs and two live ones, the counts must read the two live ones only (from partial indexes),
whatever the history. Measured with EXPLAIN ANALYZE: rows the scans of ``runs`` produced plus rows
they read and threw away.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

from mediator.store.queries import QUERIES
from tests.db.conftest import contract


def rows_read(plan: dict[str, Any]) -> int:
    """Rows the plan's scans of ``runs`` touched (returned or removed by a filter)."""
    own = 0
    if plan.get("Relation Name") == "runs":
        own = plan["Actual Rows"] * plan.get("Actual Loops", 1) + plan.get(
            "Rows Removed by Filter", 0
        )
    return own + sum(rows_read(p) for p in plan.get("Plans", []))


def test_the_run_list_counts_read_the_live_runs_not_the_history(med):
    med.advert("X", {"board": "x"}, "i1")
    med.submit(contract("live"))  # RUNNING on X
    med.submit(contract("waits"))  # QUEUED behind it
    with psycopg.connect(med.database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, state, verdict, contract, needs_key, created_at, ended_at) "
            "SELECT 'old' || i, 'PASSED', 'pass', contract, needs_key, created_at, created_at "
            "FROM runs, generate_series(1, 1000) AS i WHERE run_id = 'live'"
        )
        conn.execute("ANALYZE runs")
        plan = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + QUERIES["run_counts"].replace("%%", "%")
        ).fetchone()
    assert plan is not None
    assert (
        rows_read(
            json.loads(plan[0])[0]["Plan"] if isinstance(plan[0], str) else plan[0][0]["Plan"]
        )
        <= 2
    )
    counts = med.list_runs().counts
    assert counts == {"queued": 1, "running": 1}
