"""ClassIndex (docs/design.md §6 "Sweeps remember"): the waiting classes a changed node can serve,
found through one anchor per distinct need, are exactly those a check of every class with
``satisfies`` finds — while classes are filed, filed again with other needs and forgotten, with
JSON types kept apart (``true``, ``1``, ``1.0``, ``"1"``), list capabilities, needs of ``true``
only (the truthiness anchor), empty needs (every advert) and a need that cannot be hashed (such a
class is touched by every change). ``tests/unit/test_sweep_memo.py`` checks the same on the
sweep's own fleets; here the needs range over every anchor kind."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

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
