"""The named-query loader (style.md: procrastinate's queries.sql pattern)."""

from __future__ import annotations

import pytest

from mediator.store.queries import QUERIES, parse


def test_blocks_are_split_by_name_and_comments_dropped():
    text = "-- preamble\n-- first --\n-- why\nSELECT 1\n\n-- second --\nSELECT 2 -- inline kept\n"
    assert parse(text) == {"first": "SELECT 1", "second": "SELECT 2 -- inline kept"}


def test_a_name_defined_twice_is_an_error():
    with pytest.raises(ValueError, match="twice"):
        parse("-- a --\nSELECT 1\n-- a --\nSELECT 2\n")


def test_an_empty_block_is_an_error():
    with pytest.raises(ValueError, match="no SQL"):
        parse("-- a --\n-- only a comment\n-- b --\nSELECT 1\n")


def test_a_fragment_is_written_once_and_placed_in_each_query_that_uses_it():
    text = (
        "-- fragment fits --\n-- why\ncoalesce(n.x = q.v,\n    false)\n"
        "-- a --\nSELECT 1 FROM n WHERE NOT {{fits}}\n"
        "-- b --\nSELECT 2 FROM n\n  WHERE {{fits}} AND {{fits}}\n"
    )
    assert parse(text) == {
        "a": "SELECT 1 FROM n WHERE NOT coalesce(n.x = q.v,\nfalse)",
        "b": "SELECT 2 FROM n\nWHERE coalesce(n.x = q.v,\nfalse) AND coalesce(n.x = q.v,\nfalse)",
    }


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("-- a --\nSELECT {{nope}}\n", "unknown fragment 'nope'"),
        ("-- fragment f --\nx\n-- a --\nSELECT 1\n", "fragment 'f' is used by no query"),
        ("-- fragment f --\n{{g}}\n-- fragment g --\nx\n-- a --\nSELECT {{f}}\n",
         "fragment 'f' uses another"),
        ("-- fragment f --\n-- only a comment\n-- a --\nSELECT {{f}}\n", "'f' has no SQL"),
        ("-- fragment a --\nx\n-- a --\nSELECT 1\n", "'a' is defined twice"),
    ],
)  # fmt: skip
def test_a_fragment_unknown_unused_nested_empty_or_named_twice_is_an_error(
    text: str, error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        parse(text)


def test_the_capability_predicate_is_written_once_for_submit_and_the_sweep():
    """docs/design.md §4: the predicate that says a node might serve a role's need is the same
    in submit's fleet read and in the sweep's stuck-class guard; it is one fragment of
    queries.sql, placed in both, and no query is left with a placeholder."""
    from importlib import resources

    text = resources.files("mediator.store").joinpath("queries.sql").read_text("utf-8")
    assert text.count("jsonb_build_array(q.v)") == 1
    assert text.count("{{capability_fits}}") == 2
    for name in ("fleet_for", "sweep_head"):
        assert "n.capabilities -> q.k @> jsonb_build_array(q.v)" in QUERIES[name], name
    assert not [name for name, sql in QUERIES.items() if "{{" in sql]


def test_every_shipped_query_reads_time_through_mediator_now():
    """docs/design.md §13: no statement reads the wall clock (the time-leak rule). The clock's
    instant is a parameter of each statement (issue 13), so the bare ``mediator_now()`` — which
    reads a session setting nobody sets any more — would leak the wall clock too."""
    assert "upsert_advert" in QUERIES and "sweep_head" in QUERIES
    for name, sql in QUERIES.items():
        lowered = sql.lower().replace("mediator_now(%(now)s)", "")
        assert "mediator_now()" not in lowered, f"{name} reads time without the clock's instant"
        for clock in ("now()", "current_timestamp", "clock_timestamp", "statement_timestamp"):
            assert clock not in lowered, f"{name} reads the wall clock"


def test_indentation_and_blank_lines_are_dropped_but_a_literal_keeps_its_spaces():
    text = "-- q --\n  SELECT 'a  b',\n    '  two\n      lines  ' AS x\n\n  FROM t\n"
    assert parse(text) == {"q": "SELECT 'a  b',\n'  two\n      lines  ' AS x\nFROM t"}


def test_every_shipped_query_fits_psycopgs_conversion_cache():
    """Issue 13 (docs/performance.md): psycopg converts a query's text in Python on every
    execution unless it is at most 4,096 bytes with at most 50 parameters; the result's write
    (``apply_result``) was 4,724 bytes with its indentation, and paid that on every result."""
    import re

    from psycopg import _queries

    for name, sql in QUERIES.items():
        assert len(sql.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH, name
        params = set(re.findall(r"%\((\w+)\)s", sql)) | set(re.findall(r"%s", sql))
        assert len(params) <= _queries.MAX_CACHED_STATEMENT_PARAMS, name
