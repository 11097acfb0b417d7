"""ClassIndex (docs/design.md §6 "Sweeps remember"): the waiting classes a changed node can serve,
found through one anchor per distinct need, are exactly those a check of every class with
``satisfies`` finds — while classes are filed, filed again with other needs and forgotten, with
JSON types kept apart (``true``, ``1``, ``1.0``, ``"1"``), list capabilities, needs of ``true``
only (the truthiness anchor), empty needs (every advert) and a need that cannot be hashed (such a
class is touched by every change). ``tests/unit/test_sweep_memo.py`` checks the same on the
sweep's own fleets; here the needs range over every anchor kind."""

from __future__ import annotations

from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from mediator.core import match as match_mod
from mediator.core.capabilities import satisfies
from mediator.core.match import ClassIndex
from tests.conftest import examples

KEYS = ["k", "m", "n"]
scalars = st.sampled_from([True, False, 0, 1, 1.0, 2, "", "1", "a"])
caps = st.dictionaries(st.sampled_from(KEYS), st.one_of(scalars, st.lists(scalars, max_size=3)))
need = st.dictionaries(st.sampled_from(KEYS), scalars, max_size=3)
unhashable = st.dictionaries(st.sampled_from(KEYS), st.lists(scalars, max_size=2), min_size=1)
roles = st.dictionaries(
    st.sampled_from(["r1", "r2", "r3"]), st.one_of(need, need, need, unhashable), max_size=3
)
# a step: file class k with these roles, or forget class k (None)
steps = st.lists(st.tuples(st.integers(0, 5), st.one_of(st.none(), roles)), max_size=12)


def hashable(needs: dict[str, Any]) -> bool:
    return not any(isinstance(v, list) for v in needs.values())


def kind(value: Any) -> str:
    """A JSON value's type as the matcher compares it: booleans apart from numbers (§4)."""
    if type(value) is bool:
        return "boolean"
    return "number" if type(value) in (int, float) else "string"


def equal(want: Any, have: Any) -> bool:
    return kind(want) == kind(have) and want == have


def anchor_hit(need: dict[str, Any], caps: dict[str, Any]) -> bool:
    """Whether a changed node hits the one entry ``need`` is filed under (docs/design.md §6): the
    equality of its first valued key in name order, else the truthiness of its first key, else
    every advert."""
    valued = sorted(k for k, want in need.items() if want is not True)
    if valued:
        have = caps.get(valued[0], [])
        items = have if isinstance(have, list) else [have]
        return any(equal(need[valued[0]], item) for item in items)
    return bool(caps.get(min(need))) if need else True


@settings(max_examples=examples(400), deadline=None)
@given(steps, st.lists(caps, min_size=1, max_size=2))
def test_touched_equals_a_check_of_every_class(history: Any, changed: list[Any]) -> None:
    index, filed = ClassIndex(), {}
    for k, roles_of in history:
        key = f"c{k}"
        if roles_of is None:
            index.remove(key)
            filed.pop(key, None)
        else:
            index.add(key, roles_of)
            filed[key] = roles_of
        assert len(index) == len(filed)
        expected = {
            key
            for key, roles_of in filed.items()
            if any(not hashable(n) for n in roles_of.values())
            or any(satisfies(n, c) for n in roles_of.values() for c in changed)
        }
        assert index.touched(changed) == expected
    for key in filed:
        index.remove(key)
    assert len(index) == 0 and index.touched(changed) == set()


def test_one_need_asked_by_two_classes_stays_filed_until_both_leave() -> None:
    index = ClassIndex()
    index.add("a", {"r": {"board": "x", "usb": True}})
    index.add("b", {"r": {"usb": True, "board": "x"}, "s": {"usb": True}})
    node = {"board": "x", "usb": 1}
    assert index.touched([node]) == {"a", "b"}
    index.remove("a")
    assert index.touched([node]) == {"b"}
    index.add("b", {"r": {"board": "y"}})  # filed again: the old needs go
    assert index.touched([node]) == set() and index.touched([{"board": "y"}]) == {"b"}
    index.remove("b")
    index.remove("b")  # unknown: nothing
    assert len(index) == 0 and index.touched([{"board": "y"}]) == set()


def test_a_class_with_an_unhashable_need_is_touched_by_any_change_until_removed() -> None:
    index = ClassIndex()
    index.add("odd", {"r": {"board": ["x", "y"]}})
    assert len(index) == 1 and index.touched([{}]) == {"odd"}
    index.add("odd", {"r": {"board": "x"}})  # filed again with hashable needs: loose no more
    assert len(index) == 1 and index.touched([{}]) == set()
    index.add("odd", {"r": {"board": ["x"]}})
    index.remove("odd")
    assert len(index) == 0 and index.touched([{"board": "x"}]) == set()


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["r1", "r2"]), need), max_size=6), st.lists(caps))
def test_satisfies_runs_only_for_needs_whose_anchor_a_changed_node_hits(
    classes: list[Any], changed: list[Any]
) -> None:
    """The index's cost as a count: ``touched`` checks with ``satisfies`` each distinct need
    whose anchor a changed node hits, once per node until one satisfies it — no other need."""
    index = ClassIndex()
    for k, roles_of in enumerate(classes):
        index.add(f"c{k}", roles_of)
    distinct = {
        frozenset((key, kind(want), want) for key, want in n.items()): n
        for roles_of in classes
        for n in roles_of.values()
    }
    expected, hit = 0, set()
    for c in changed:
        found = {sig for sig, n in distinct.items() if anchor_hit(n, c)} - hit
        expected += len(found)
        hit |= {sig for sig in found if satisfies(distinct[sig], c)}
    with mock.patch.object(match_mod, "satisfies", wraps=satisfies) as checks:
        index.touched(changed)
    assert checks.call_count == expected


def test_a_need_of_true_only_is_not_checked_against_a_node_without_that_key() -> None:
    index = ClassIndex()
    index.add("usb", {"r": {"usb": True}})
    with mock.patch.object(match_mod, "satisfies", wraps=satisfies) as checks:
        assert index.touched([{"board": "x"}]) == set()
    assert checks.call_count == 0
