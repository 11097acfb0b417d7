"""The width search's budget (docs/design.md §4 "Width, exactly"; docs/security.md "Fair under
floods"): a contract is refused before any match only when its distinct role needs ``d`` exceed
both ``max_width`` (the search could run) and ``MAX_SEARCH_NEEDS`` (it could take too long).

Checked against a reference that counts distinct needs by comparing them pairwise, over random
contracts around both limits."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mediator.core.limits import MAX_SEARCH_NEEDS
from mediator.core.match import search_budget
from tests.conftest import examples


def distinct_needs(needs_by_role: dict[str, dict[str, Any]]) -> int:
    """Needs compared as mappings (key order does not matter), each counted once."""
    seen: list[dict[str, Any]] = []
    for need in needs_by_role.values():
        if need not in seen:
            seen.append(need)
    return len(seen)


def contract(kinds: list[int]) -> dict[str, dict[str, Any]]:
    """A role per entry; equal entries give equal needs, written in different key orders."""
    out: dict[str, dict[str, Any]] = {}
    for i, kind in enumerate(kinds):
        need = {"board": f"b{kind}", "lab": "x"}
        out[f"r{i:02d}"] = need if i % 2 else dict(reversed(need.items()))
    return out


@settings(max_examples=examples(200))
@given(
    st.lists(st.integers(0, MAX_SEARCH_NEEDS + 2), max_size=2 * MAX_SEARCH_NEEDS),
    st.integers(1, MAX_SEARCH_NEEDS + 3),
)
def test_refused_exactly_when_distinct_needs_exceed_both_limits(kinds: list[int], width: int):
    needs = contract(kinds)
    d = distinct_needs(needs)
    refusal = search_budget(needs, width)
    if d > width and d > MAX_SEARCH_NEEDS:
        assert refusal is not None and f"{d} distinct needs" in refusal
    else:
        assert refusal is None


def test_at_each_limit_and_one_past_it() -> None:
    at_cap = contract(list(range(MAX_SEARCH_NEEDS)))
    past = contract(list(range(MAX_SEARCH_NEEDS + 1)))
    assert search_budget(at_cap, 1) is None  # d = MAX_SEARCH_NEEDS: the search stays cheap
    assert search_budget(past, MAX_SEARCH_NEEDS + 1) is None  # d = max_width: never searched
    assert search_budget(past, MAX_SEARCH_NEEDS) == (
        f"The roles have {MAX_SEARCH_NEEDS + 1} distinct needs, more than max_width "
        f"({MAX_SEARCH_NEEDS}): finding whether they fit max_width could take too long past "
        f"{MAX_SEARCH_NEEDS} distinct needs (MAX_SEARCH_NEEDS). Give roles that can share a node "
        "the same needs, or use fewer roles."
    )


def test_equal_needs_in_another_key_order_count_once() -> None:
    needs = contract([k for k in range(MAX_SEARCH_NEEDS) for _ in "ab"])  # each kind twice
    assert len(needs) == 2 * MAX_SEARCH_NEEDS and distinct_needs(needs) == MAX_SEARCH_NEEDS
    assert search_budget(needs, 1) is None
