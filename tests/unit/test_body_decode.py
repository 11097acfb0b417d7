"""Request bodies read on the exact path (``mediator.api.limits.decode``, docs/performance.md
"JSON"): a body holding a ``\\u0000`` escape is walked value by value, and what the walk builds
must be what Python's own JSON reader builds — arrays inside arrays and numbers among strings
included — except where a text must be refused."""

from __future__ import annotations

import json

import pytest

from mediator.api.limits import BadRequest, decode

# An escaped field (stored escaped by the flows) holds a NUL, which sends the body down the
# exact path; the rest nests arrays and objects inside arrays, with numbers, booleans and null.
EXACT = (
    b'{"roles": [[1, 2.5, [true, null]], {"a": ["x", 3]}, 7, "y"], "log": "a\\u0000b",'
    b' "n": {"deep": [[[]]]}}'
)


def test_the_exact_path_builds_what_the_standard_reader_builds() -> None:
    assert decode(EXACT, escaped={"log"}) == json.loads(EXACT)


def test_a_nul_outside_an_escaped_field_is_refused_naming_where_it_is() -> None:
    raw = b'{"roles": [[1], 2, "ok", "bad\\u0000"]}'
    with pytest.raises(BadRequest) as e:
        decode(raw)
    assert e.value.field == "roles[3]"


def test_a_body_that_is_one_text_is_read_the_same_way() -> None:
    """A paired surrogate escape is a real character (the exact path keeps it); a NUL is not."""
    emoji = b'"\\ud83d\\ude00"'
    assert decode(emoji) == json.loads(emoji) == "\U0001f600"
    with pytest.raises(BadRequest):
        decode(b'"\\u0000"')
