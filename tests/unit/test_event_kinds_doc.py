"""docs/design.md §12 lists the event kinds the schema's CHECK accepts — no more, no fewer.

The doc listed a `queued` kind the database refuses (a queued submit is `submitted` with
`data.state` QUEUED; issue 12 §7, issue 24). This reads both texts, so the next kind added to one
and not the other fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from mediator.core.rows import EVENT_KINDS, FLEET_HISTORY_KINDS

ROOT = Path(__file__).resolve().parents[2]


def schema_kinds() -> list[str]:
    sql = (ROOT / "mediator/store/schema.sql").read_text()
    events = sql[sql.index("CREATE TABLE events") :]
    m = re.search(r"kind\s+text NOT NULL CHECK \(kind IN \((.*?)\)\)", events, re.S)
    assert m, "no CHECK (kind IN (...)) on events.kind in schema.sql"
    return re.findall(r"'([a-z_]+)'", m.group(1))


def documented_kinds() -> list[str]:
    doc = (ROOT / "docs/design.md").read_text()
    m = re.search(r"The `events` table gets one row per transition[^(]*\((.*?)\)\.", doc, re.S)
    assert m, "docs/design.md §12 no longer lists the event kinds where this test looks"
    listed = m.group(1).split(" — ")[0]  # what follows the dash explains, it does not list
    return re.findall(r"`([a-z_]+)`", listed)


def test_the_design_doc_lists_exactly_the_kinds_the_schema_accepts() -> None:
    assert documented_kinds() == schema_kinds()


def test_the_schema_accepts_exactly_the_kinds_the_code_writes() -> None:
    assert schema_kinds() == list(EVENT_KINDS)


def fleet_schema_kinds() -> list[str]:
    sql = (ROOT / "mediator/store/schema.sql").read_text()
    table = sql[sql.index("CREATE TABLE fleet_history") :]
    m = re.search(r"kind\s+text NOT NULL CHECK \(kind IN \((.*?)\)\)", table, re.S)
    assert m, "no CHECK (kind IN (...)) on fleet_history.kind in schema.sql"
    return re.findall(r"'([a-z_]+)'", m.group(1))


def fleet_documented_kinds() -> list[str]:
    doc = (ROOT / "docs/design.md").read_text()
    m = re.search(r"The `fleet_history` table gets one row per change[^(]*\((.*?)\)\.", doc, re.S)
    assert m, "docs/design.md §12 no longer lists the fleet history kinds where this test looks"
    return re.findall(r"`([a-z_]+)`", m.group(1).split(" — ")[0])


def test_the_design_doc_lists_exactly_the_fleet_history_kinds_the_schema_accepts() -> None:
    """docs/design.md §12: the fleet's history kinds, doc = schema = code."""
    assert fleet_documented_kinds() == fleet_schema_kinds() == list(FLEET_HISTORY_KINDS)
