"""docs/design.md §18: the fleet's history — one ``fleet_history`` row per change of a node, written
by the statement that made the change (the advert upsert, the reaper's first read), never one per
steady heartbeat. Each test is a small worked example: what the node did, the rows that follow.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from mediator import Mediator
from mediator.core.errors import Forbidden
from tests.db.conftest import EPOCH, ManualClock, advert


def history(dsn: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return list(conn.execute("SELECT at, node_id, kind, data FROM fleet_history ORDER BY id"))


def kinds(dsn: str) -> list[tuple[str, str]]:
    return [(h["node_id"], h["kind"]) for h in history(dsn)]


def test_first_advert_is_appeared_with_the_nodes_state(med: Mediator, dsn: str) -> None:
    advert(med, "n1", instance="a", board="stm32")
    [row] = history(dsn)
    assert row["kind"] == "appeared" and row["at"] == EPOCH
    assert row["data"] == {
        "instance": "a",
        "drain": "",
        "capabilities": {"board": "stm32"},
        "label": "n1",
    }


def test_steady_heartbeats_write_nothing(med: Mediator, dsn: str, clock: ManualClock) -> None:
    advert(med, "n1")
    for _ in range(5):
        clock.advance(10)
        advert(med, "n1")
    assert kinds(dsn) == [("n1", "appeared")]


def test_restart_is_one_row_naming_the_old_instance(
    med: Mediator, dsn: str, clock: ManualClock
) -> None:
    advert(med, "n1", instance="a")
    clock.advance(5)
    advert(med, "n1", instance="b")
    rows = history(dsn)
    assert [r["kind"] for r in rows] == ["appeared", "restarted"]
    assert rows[1]["data"]["prev_instance"] == "a" and rows[1]["data"]["instance"] == "b"


def test_drain_set_changed_and_lifted(med: Mediator, dsn: str, clock: ManualClock) -> None:
    advert(med, "n1")
    clock.advance(1)
    advert(med, "n1", drain="graceful")
    clock.advance(1)
    advert(med, "n1", drain="graceful")  # steady while draining: nothing
    clock.advance(1)
    advert(med, "n1", drain="at-boundary")  # a different policy is set anew
    clock.advance(1)
    advert(med, "n1")
    rows = history(dsn)
    assert [r["kind"] for r in rows] == ["appeared", "drain_set", "drain_set", "drain_lifted"]
    assert [r["data"]["prev_drain"] for r in rows[1:]] == ["", "graceful", "at-boundary"]
    assert [r["data"]["drain"] for r in rows[1:]] == ["graceful", "at-boundary", ""]


def test_capabilities_changed_but_not_on_an_equal_document(
    med: Mediator, dsn: str, clock: ManualClock
) -> None:
    med.advert("n1", {"board": "x", "ram": 1}, "i1", label="n1")
    clock.advance(1)
    med.advert("n1", {"ram": 1.0, "board": "x"}, "i1", label="n1")  # jsonb-equal: no change
    clock.advance(1)
    med.advert("n1", {"board": "y"}, "i1", label="n1")
    rows = history(dsn)
    assert [r["kind"] for r in rows] == ["appeared", "capabilities_changed"]
    assert rows[1]["data"]["capabilities"] == {"board": "y"}


def test_expiry_noticed_by_the_reaper_once_then_return(
    med: Mediator, dsn: str, clock: ManualClock
) -> None:
    ttl = med.advert("n1", {"board": "x"}, "i1", label="n1")
    clock.advance(ttl - 1)
    med.reap()  # still live: nothing
    assert kinds(dsn) == [("n1", "appeared")]
    clock.advance(5)
    med.reap()
    med.reap()  # a second pass notices nothing new
    rows = history(dsn)
    assert [r["kind"] for r in rows] == ["appeared", "expired"]
    # `at` is the instant the node went (its expires_at), not when a pass noticed it.
    assert (rows[1]["at"] - EPOCH).total_seconds() == ttl
    clock.advance(100)
    med.advert("n1", {"board": "x"}, "i1", label="n1")
    rows = history(dsn)
    assert [r["kind"] for r in rows] == ["appeared", "expired", "returned"]
    assert datetime.fromisoformat(rows[2]["data"]["gone_at"]) == rows[1]["at"]
    # A second expiry is a second row (the unique index is per expiry, not per node).
    clock.advance(ttl + 1)
    med.reap()
    assert [k for _, k in kinds(dsn)] == ["appeared", "expired", "returned", "expired"]


def test_return_unnoticed_by_any_reaper_still_says_when_the_node_went(
    med: Mediator, dsn: str, clock: ManualClock
) -> None:
    ttl = advert(med, "n1", instance="a")
    clock.advance(ttl + 50)
    advert(med, "n1", instance="b")  # came back restarted, no reaper pass in between
    rows = history(dsn)
    assert [r["kind"] for r in rows] == ["appeared", "returned", "restarted"]
    assert datetime.fromisoformat(rows[1]["data"]["gone_at"]) == EPOCH + timedelta(seconds=ttl)


def test_another_principals_advert_writes_no_history(med: Mediator, dsn: str) -> None:
    med.advert("n1", {"board": "x"}, "i1", label="n1", principal="alice")
    with pytest.raises(Forbidden):
        med.advert("n1", {"board": "y"}, "i2", label="n1", principal="mallory")
    assert kinds(dsn) == [("n1", "appeared")]
