"""AdvertIndex (the sweep's per-snapshot candidate index) agrees with ``satisfies`` exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mediator.core.capabilities import satisfies
from mediator.core.match import Advert, AdvertIndex, match
from tests.conftest import examples

scalars = st.one_of(
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from([0.0, 1.0, 2.5]),
    st.sampled_from(["", "a", "1"]),
)
caps = st.dictionaries(
    st.sampled_from(["k", "m", "n"]), st.one_of(scalars, st.lists(scalars, max_size=3))
)
needs = st.dictionaries(st.sampled_from(["k", "m", "n"]), scalars, max_size=2)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(caps, max_size=6), needs)
def test_index_serving_equals_a_scan_with_satisfies(fleet, want):
    adverts = [Advert(f"n{i}", c) for i, c in enumerate(fleet)]
    expected = {a.node_id for a in adverts if satisfies(want, a.capabilities)}
    assert AdvertIndex(adverts).serving(want) == expected


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(caps, max_size=6),
    st.dictionaries(st.sampled_from(["r1", "r2"]), needs, max_size=2),
    st.sets(st.sampled_from([f"n{i}" for i in range(6)])),
    st.integers(1, 2),
)
def test_match_gives_the_same_answer_with_or_without_the_index(fleet, roles, unavailable, width):
    adverts = [Advert(f"n{i}", c) for i, c in enumerate(fleet)]
    assert match(roles, AdvertIndex(adverts), unavailable, width) == match(
        roles, adverts, unavailable, width
    )


def test_true_and_1_stay_apart():
    adverts = [Advert("a", {"k": True}), Advert("b", {"k": 1}), Advert("c", {"k": [1.0, "x"]})]
    index = AdvertIndex(adverts)
    assert index.serving({"k": 1}) == {"b", "c"}
    assert index.serving({"k": True}) == {"a", "b", "c"}
    assert index.serving({"k": "x"}) == {"c"}
    assert index.serving({}) == {"a", "b", "c"}


def test_equal_needs_in_any_key_order_share_one_computed_answer():
    """The index computes a need's candidates once per snapshot (docs/design.md §6): asked again,
    in another key order, it hands back the very answer it computed — counted here as object
    identity, which no recomputation can fake."""
    index = AdvertIndex([Advert("a", {"k": 1, "m": "x"}), Advert("b", {"k": 1})])
    first = index.serving({"k": 1, "m": "x"})
    assert first == {"a"}
    assert index.serving({"m": "x", "k": 1}) is first
    everyone = index.serving({})
    assert everyone == {"a", "b"} and index.serving({}) is everyone
