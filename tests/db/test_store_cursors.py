"""The store keeps one cursor per connection and statement (issue 13, docs/performance.md).

A cursor keeps psycopg's adaptation state only while it runs the same query again, so the store
keeps one per statement — and must then hold nothing a client sent once its rows are read
(docs/security.md: every resource a client can make the Mediator hold is bounded), give the same
rows a fresh cursor gives, survive a statement that failed, and go with its connection.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import psycopg
import pytest
from psycopg.rows import class_row, dict_row

from mediator import Conflict, Mediator, Outcome
from mediator.core.errors import MediatorError
from mediator.core.rows import Step
from mediator.store import connector
from mediator.store.queries import QUERIES
from tests.db.conftest import advert, contract


def kept_cursors() -> dict[str, psycopg.Cursor[Any]]:
    """Every kept cursor of every pool connection alive in this process, by statement."""
    return {
        name: cur
        for conn in gc.get_objects()
        if isinstance(conn, connector._Connection)
        for (name, _shape), cur in conn.statement_cursors.items()
    }


def kept_results() -> list[str]:
    """The statements whose kept cursor still holds a result."""
    return [
        name
        for name, cur in kept_cursors().items()
        if cur.pgresult is not None and cur.pgresult.pgresult_ptr is not None
    ]


def test_a_statement_reuses_its_cursor_on_a_connection(med):
    advert(med, "X")
    with med.store.autocommit() as tx:
        first = tx._cursor("work", Step)
        tx.work("X")
        tx.work("X")
        assert tx._cursor("work", Step) is first
        assert tx._cursor("work", dict) is not first  # another shape, another cursor


def test_no_kept_cursor_holds_a_result_after_its_rows_are_read(med):
    # A run near the contract limit (1 MiB) through submit, claim (which returns the whole run),
    # a refused claim (which reads why), the result's own read and write: none of it stays
    # behind in a cursor once its rows are read.
    advert(med, "X")
    doc = contract("big")
    doc["steps"][0]["uses"] = "blob"  # a plugin: only a built-in's `with` is checked
    doc["steps"][0]["with"] = {"blob": ["x" * 9_000] * 100}
    assert med.submit(doc).outcome == Outcome.STARTED
    (step,) = med.work("X")
    claimed = med.claim("big", step.seq, "X", "i1")
    assert kept_results() == []
    with pytest.raises(Conflict):
        med.claim("big", step.seq, "X", "i1")
    assert kept_results() == []
    med.report("big", step.seq, "X", claimed.attempt, "pass", instance="i1")
    assert med.get_run("big").state == "PASSED"
    assert kept_results() == []
    assert {"fleet_for", "create_run", "claim_step", "apply_result"} <= set(kept_cursors())


def test_rows_are_the_ones_psycopg_s_own_row_factories_give(med):
    advert(med, "X")
    med.submit(contract("same", steps=3))
    with med.store.autocommit() as tx:
        ours_dicts = tx._rows("run_steps", {"run_id": "same"})
        ours_steps = tx._rows("run_steps", {"run_id": "same"}, row=Step)
        ours_tuples = tx._rows("run_steps", {"run_id": "same"}, row=tuple)
        params = {"run_id": "same", "now": tx.now}
        with tx.conn.cursor(row_factory=dict_row) as cur:
            dicts = cur.execute(QUERIES["run_steps"], params).fetchall()
        with tx.conn.cursor(row_factory=class_row(Step)) as cur:
            steps = cur.execute(QUERIES["run_steps"], params).fetchall()
        with tx.conn.cursor() as cur:
            tuples = cur.execute(QUERIES["run_steps"], params).fetchall()
    assert len(dicts) == 3
    assert (ours_dicts, ours_steps, ours_tuples) == (dicts, steps, tuples)


def test_a_statement_that_failed_leaves_its_cursor_usable(med):
    bad = {"run_id": "r", "node_id": "X", "kind": "no-such-kind", "data": {}}
    with pytest.raises(MediatorError), med.store.tx() as tx:
        tx.insert_events([bad])  # the CHECK on events.kind refuses it; the tx rolls back
    with med.store.tx() as tx:
        tx.insert_events([{**bad, "kind": "submitted"}])  # the same statement's cursor again
    with med.store.autocommit() as tx:
        n = tx.conn.execute("SELECT count(*) FROM events WHERE run_id = 'r'").fetchone()
    assert n == (1,)


def test_kept_cursors_go_with_their_connection(dsn, clock, config, tmp_path):
    med = Mediator.connect(dsn, config=config, clock=clock, records_root=str(tmp_path / "r"))
    try:
        advert(med, "X")
        with med.store.autocommit() as tx:
            tx.work("X")
            conn = weakref.ref(tx.conn)
            cursor = weakref.ref(tx._cursor("work", Step))
            assert tx._cursor("work", Step) is cursor()
        del tx  # (the test's own reference)
    finally:
        med.close()
    gc.collect()
    assert conn() is None and cursor() is None
