"""Each statement of a run's life reads as many rows with a long history as with a short one
(issue 13, docs/performance.md).

The simulator and a long-lived lab keep every ended run, its steps and its events. A statement that
reaches its rows through a join instead of its own parameters can let PostgreSQL's generic plan
(the one a prepared statement settles on after five executions) walk a whole index: the result's
write (``apply_result``) found its step by ``seq`` alone and filtered on the run, so every result
read every kept run's step — 0.23 ms per result with 1,500 runs kept, 0.44 ms with 3,000 — and the
simulator slowed down as it ran.

Measured with what does not drift with the machine: the rows each statement's scans return or
throw away (auto_explain with ANALYZE, its plan sent to the Mediator's own connections as a
notice), for the same two-run life — one run, one queued behind it and promoted — early and late
in a history of a few hundred lives.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

import psycopg
import pytest

from mediator import Mediator, Outcome
from mediator.store import db
from mediator.store.queries import QUERIES
from tests.db.conftest import ManualClock, contract

TABLES = {"runs", "steps", "leases", "events", "asks", "nodes", "needs_classes"}


def _shape(sql: str) -> str:
    """A statement with its parameters blanked: ``%(x)s`` as written, ``$1`` as sent."""
    return re.sub(r"%\(\w+\)s|\$\d+", "?", sql.replace("%%", "%")).strip()


NAMES = {_shape(sql): name for name, sql in QUERIES.items()}


def rows_touched(node: dict[str, Any]) -> int:
    """Rows the plan's scans of the Mediator's tables returned or removed by a filter."""
    own = 0
    if node.get("Relation Name") in TABLES and "Scan" in node["Node Type"]:
        own = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
        own += node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
    own += node.get("Rows Removed by Join Filter", 0)
    return own + sum(rows_touched(child) for child in node.get("Plans", []))


@pytest.fixture
def explained(dsn: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A Mediator whose every statement's plan, with its actual rows, reaches ``plans``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        name = conn.info.dbname
        for setting in (
            "session_preload_libraries = 'auto_explain'",
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_analyze = on",
            "auto_explain.log_timing = off",
            "auto_explain.log_format = 'json'",
            "client_min_messages = 'log'",
        ):
            conn.execute(f'ALTER DATABASE "{name}" SET {setting}')
    plans: list[tuple[str, int]] = []

    def notice(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if text.startswith("duration:") and "plan:" in text:
            doc = json.loads(text.split("plan:", 1)[1])
            name = NAMES.get(_shape(doc.get("Query Text", "")))
            if name is not None:
                plans.append((name, rows_touched(doc["Plan"])))

    configure = db.Store._configure

    def configured(store: db.Store, conn: psycopg.Connection[Any]) -> None:
        configure(store, conn)
        conn.add_notice_handler(notice)

    monkeypatch.setattr(db.Store, "_configure", configured)
    clock = ManualClock()
    med = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path / "records"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        # The plans must not depend on when autovacuum happens to analyze a table (under load it
        # comes at other moments, and on tables this small a full scan is the planner's right
        # choice): the statistics are the empty schema's, as when a lab or a simulation starts,
        # and the plans chosen then must stay good as the history grows.
        for table in sorted(TABLES):
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    yield med, clock, plans
    med.close()


def life(med: Mediator, clock: ManualClock, tag: str) -> None:
    """Two runs on one node: the first runs, the second queues behind it and is promoted when
    the first's result frees the node; both pass. The first result decides from its claim's
    snapshot, the second reads (issue 13)."""
    med.advert("X", {"board": "x"}, "i1", label="X")
    assert med.submit(contract(f"{tag}-a")).outcome == Outcome.STARTED
    assert med.submit(contract(f"{tag}-b")).outcome == Outcome.QUEUED
    for run_id in (f"{tag}-a", f"{tag}-b"):
        clock.advance(1)
        (step,) = med.work("X")
        claimed = med.claim(run_id, step.seq, "X", "i1")
        if run_id.endswith("-b"):  # as if the result reached another worker: it reads first
            assert med.ctx.claimed.take(run_id, step.seq, "X", claimed.attempt) is not None
        med.report(run_id, step.seq, "X", claimed.attempt, "pass", instance="i1")
    assert med.get_run(f"{tag}-b").state == "PASSED"


@pytest.mark.slow  # scripts/test --fast leaves it out
def test_every_statement_of_a_runs_life_reads_as_many_rows_late_as_early(explained):
    """Issue 13: the result's write read every kept run's step; no statement of a life may read
    more rows after 300 lives (600 runs kept) than after 10."""
    med, clock, plans = explained
    rows: dict[int, dict[str, int]] = {}
    for i in range(300):
        plans.clear()
        life(med, clock, f"r{i}")
        if i in (10, 299):
            per: dict[str, int] = defaultdict(int)
            for name, n in plans:
                per[name] += n
            rows[i] = dict(per)
    early, late = rows[10], rows[299]
    assert {"create_run", "claim_step", "result_source", "apply_result", "promote"} <= set(late)
    assert {"sweep_head", "work"} <= set(late)
    grew = {name: (early.get(name), n) for name, n in late.items() if n > early.get(name, 0)}
    assert not grew, f"rows read per life, after 10 lives → after 300: {grew}"
