"""The record's JSON is json.dumps's, byte for byte (issue 13, docs/performance.md "Records").

A record's files are compared byte for byte (a sealed record against one sealed again from the
database, tests/db/test_result_race.py), and records written before issue 13 must verify after it.
The seal stopped calling ``json.dumps`` — its ``indent=2`` runs the pure-Python encoder, and each
call builds a new encoder — so these examples and generated documents pin the spelled-out
encoders to ``json.dumps`` itself.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mediator.core.states import RunState
from mediator.records import _dumps, _jsonl


def reference(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()


def reference_lines(items: list[Any]) -> bytes:
    return b"".join((json.dumps(i, sort_keys=True, default=str) + "\n").encode() for i in items)


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
)
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(), inner, max_size=4)
    ),
    max_leaves=30,
)


@given(documents)
def test_a_document_is_spelled_as_json_dumps_spells_it(doc: Any) -> None:
    assert _dumps(doc) == reference(doc)


@given(st.lists(documents, max_size=6))
def test_events_are_spelled_one_per_line_as_json_dumps_spells_them(items: list[Any]) -> None:
    assert _jsonl(items) == reference_lines(items)


@pytest.mark.parametrize(
    "doc",
    [
        {},
        [],
        {"a": {}, "b": [], "c": [[]], "d": [{}]},
        {"é": "ünï", "emoji": "\U0001f600", "ctl": '\x00\n\t"\\'},
        {"state": RunState.PASSED, "when": dt.datetime(2026, 12, 1, tzinfo=dt.UTC)},
        {"a": {1: "int key"}, "b": {2.5: "float key"}, "c": {True: "bool"}, "d": {None: "null"}},
        {3: "c", 1: "a", 2: "b"},
        {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "big": 10**30},
        {"z": 1, "a": {"y": 2, "b": 3}},
        ("a", "tuple"),
        "just a string",
        RunState.FAILED,
    ],
    ids=repr,
)
def test_what_a_record_holds_is_spelled_as_json_dumps_spells_it(doc: Any) -> None:
    """Worked examples: enums and datetimes (default=str), non-string keys, non-finite floats,
    escapes, empty containers."""
    assert _dumps(doc) == reference(doc)
    assert _jsonl([doc, doc]) == reference_lines([doc, doc])


@pytest.mark.parametrize("doc", [{(1, 2): "x"}, {1: "a", "b": 2}], ids=["tuple key", "mixed keys"])
def test_keys_json_cannot_spell_or_sort_are_refused_like_json_dumps_refuses_them(doc: Any) -> None:
    with pytest.raises(TypeError):
        reference(doc)
    with pytest.raises(TypeError):
        _dumps(doc)
