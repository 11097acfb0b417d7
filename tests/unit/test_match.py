"""Worked examples and properties of the matcher (docs/design.md §4).

Same input, same output (ADR-014 decision 3); the three refusals and when each applies (R1, R10);
folding; the candidate order; and the monotonicity the promotion sweep's cache relies on.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mediator.core import capabilities, match
from mediator.core.match import ALL_BUSY, NO_CANDIDATE, TOO_WIDE, Advert, Assignment, Reject
from tests.conftest import examples


def fleet(**caps: dict[str, Any]) -> list[Advert]:
    return [Advert(node_id, c) for node_id, c in caps.items()]


def flags(*names: str) -> dict[str, bool]:
    """Capabilities (or needs) made of boolean flags, for examples about shape, not values."""
    return {name: True for name in names}


# --- assignments ----------------------------------------------------------------------------------


def test_one_role_takes_the_lowest_node_id_among_equals() -> None:
    """ADR-014 decision 3: ties are broken by node_id, never by advert order."""
    adverts = fleet(n2={"board": "stm32f4"}, n1={"board": "stm32f4"}, n3={"board": "esp32"})
    result = match.match({"dut": {"board": "stm32f4"}}, adverts, set(), max_width=4)
    assert result == Assignment(roles={"dut": "n1"}, width=1)


def test_folding_one_node_fills_two_roles() -> None:
    """A node serving both roles is used for both: width 1 (R10's `seen`)."""
    adverts = fleet(x={"board": "stm32f4", "scope": True}, y={"scope": True})
    result = match.match(
        {"dut": {"board": "stm32f4"}, "bench": {"scope": True}}, adverts, set(), max_width=1
    )
    assert result == Assignment(roles={"bench": "x", "dut": "x"}, width=1)
    assert isinstance(result, Assignment)
    assert result.nodes() == ("x",)


def test_folding_reuses_the_earliest_chosen_node() -> None:
    """Step 3: of the chosen nodes serving role c, the one chosen first wins, not the lowest id."""
    adverts = fleet(**{"node-z": flags("a", "c"), "node-b": flags("b", "c")})
    needs = {"a": flags("a"), "b": flags("b"), "c": flags("c")}
    result = match.match(needs, adverts, set(), max_width=4)
    assert result == Assignment(roles={"a": "node-z", "b": "node-b", "c": "node-z"}, width=2)


def test_candidate_serving_more_remaining_roles_goes_first() -> None:
    """Step 4: q serves dut and bench, p only dut; q is taken although p sorts first."""
    adverts = fleet(p=flags("dut"), q=flags("dut", "bench"), r=flags("bench"))
    needs = {"dut": flags("dut"), "bench": flags("bench")}
    # Name order: bench first. q serves bench and dut (2), r serves bench only (1).
    result = match.match(needs, adverts, set(), max_width=4)
    assert result == Assignment(roles={"bench": "q", "dut": "q"}, width=1)


def test_ranking_counts_only_roles_from_the_current_one_onward() -> None:
    """Step 4: for role b, p's service to the earlier role a does not count; q (b and c) wins."""
    adverts = fleet(n0=flags("a", "d"), p=flags("a", "b"), q=flags("b", "c"))
    needs = {"a": flags("a"), "b": flags("b"), "c": flags("c"), "d": flags("d")}
    result = match.match(needs, adverts, set(), max_width=4)
    # a: n0 and p both serve two roles from a onward; n0 sorts first.
    # b: p serves {b}, q serves {b, c} from b onward -> q. c folds onto q, d onto n0.
    assert result == Assignment(roles={"a": "n0", "b": "q", "c": "q", "d": "n0"}, width=2)


def test_roles_are_taken_in_name_order_not_dict_order() -> None:
    """Step 1: alpha is matched before zeta, whatever order the contract lists them in."""
    adverts = fleet(n1=flags("z"), n2=flags("z", "a"))
    needs = {"zeta": flags("z"), "alpha": flags("a")}
    # alpha first -> n2; zeta folds onto n2. Taking zeta first would pick n1 (a tie on 1, then
    # node_id) and end with width 2.
    result = match.match(needs, adverts, set(), max_width=4)
    assert result == Assignment(roles={"alpha": "n2", "zeta": "n2"}, width=1)


def test_unavailable_nodes_are_never_chosen() -> None:
    """FR-11: busy ∪ draining, passed by the caller, keeps a node out; the next candidate goes."""
    adverts = fleet(n1={"board": "stm32f4"}, n2={"board": "stm32f4"}, n3={"board": "stm32f4"})
    result = match.match({"dut": {"board": "stm32f4"}}, adverts, ["n1", "n2"], max_width=4)
    assert result == Assignment(roles={"dut": "n3"}, width=1)


def test_unavailable_best_ranked_node_yields_to_a_narrower_choice() -> None:
    adverts = fleet(wide=flags("a", "b"), na=flags("a"), nb=flags("b"))
    needs = {"a": flags("a"), "b": flags("b")}
    assert match.match(needs, adverts, set(), 4) == Assignment({"a": "wide", "b": "wide"}, 1)
    assert match.match(needs, adverts, {"wide"}, 4) == Assignment({"a": "na", "b": "nb"}, 2)


def test_zero_roles_is_an_empty_assignment() -> None:
    """A contract of ask steps only needs no node: width 0, whatever the fleet or cap."""
    assert match.match({}, [], set(), max_width=0) == Assignment(roles={}, width=0)


def test_role_with_no_needs_takes_any_node() -> None:
    adverts = fleet(b={}, a={"x": 1})
    assert match.match({"any": {}}, adverts, set(), 1) == Assignment({"any": "a"}, 1)


def test_assignment_nodes_are_distinct_and_sorted() -> None:
    """Leases are inserted ordered by node_id (§7), so nodes() gives that order."""
    assert Assignment(roles={"a": "n9", "b": "n1", "c": "n9"}, width=2).nodes() == ("n1", "n9")


# --- refusals -------------------------------------------------------------------------------------


def test_no_candidate_when_no_live_node_satisfies_a_role() -> None:
    """R1: nothing in the fleet can serve the role: permanent, 422 at submit."""
    adverts = fleet(n1={"board": "esp32"})
    result = match.match({"dut": {"board": "stm32f4"}}, adverts, set(), max_width=4)
    assert isinstance(result, Reject)
    assert (result.code, result.role, result.candidates, result.width) == (
        NO_CANDIDATE,
        "dut",
        (),
        None,
    )
    assert result.as_dict() == {"code": "NO_CANDIDATE", "role": "dut", "message": result.message}
    assert '"dut"' in result.message
    assert "stm32f4" in result.message


def test_no_candidate_wins_over_a_busy_earlier_role() -> None:
    """R1: a role no fleet node can serve is reported even when an earlier role is only busy.

    Otherwise the run would be queued (202) and wait forever for a node that does not exist.
    """
    adverts = fleet(n1=flags("a"))
    needs = {"a": flags("a"), "b": flags("b")}
    result = match.match(needs, adverts, {"n1"}, max_width=4)
    assert isinstance(result, Reject)
    assert (result.code, result.role) == (NO_CANDIDATE, "b")


def test_all_busy_when_every_candidate_is_unavailable() -> None:
    """R1: candidates exist but all are busy or draining: temporary, 202 QUEUED at submit."""
    adverts = fleet(n3=flags("a"), n1=flags("a"), n2=flags("b"))
    result = match.match({"dut": flags("a")}, adverts, {"n1", "n3"}, max_width=4)
    assert isinstance(result, Reject)
    assert (result.code, result.role, result.candidates, result.width) == (
        ALL_BUSY,
        "dut",
        ("n1", "n3"),
        None,
    )
    assert result.as_dict() == {
        "code": "ALL_BUSY",
        "role": "dut",
        "candidates": ["n1", "n3"],
        "message": result.message,
    }
    assert "n1, n3" in result.message


def test_all_busy_message_names_a_few_candidates_and_counts_the_rest() -> None:
    adverts = [Advert(f"n{i:02}", flags("a")) for i in range(8)]
    result = match.match({"dut": flags("a")}, adverts, {a.node_id for a in adverts}, 4)
    assert isinstance(result, Reject)
    assert len(result.candidates) == 8
    assert "n00, n01, n02, n03, n04 and 3 more" in result.message


def test_all_busy_for_a_later_role_after_earlier_roles_matched() -> None:
    adverts = fleet(n1=flags("a"), n2=flags("b"))
    result = match.match({"a": flags("a"), "b": flags("b")}, adverts, {"n2"}, max_width=4)
    assert isinstance(result, Reject)
    assert (result.code, result.role, result.candidates) == (ALL_BUSY, "b", ("n2",))


def test_too_wide_when_distinct_nodes_exceed_max_width() -> None:
    """R1/R10: three roles that cannot fold need three nodes; the cap is two."""
    adverts = fleet(n1=flags("a"), n2=flags("b"), n3=flags("c"))
    needs = {"a": flags("a"), "b": flags("b"), "c": flags("c")}
    result = match.match(needs, adverts, set(), max_width=2)
    assert isinstance(result, Reject)
    assert (result.code, result.role, result.candidates, result.width) == (TOO_WIDE, None, (), 3)
    assert result.as_dict() == {"code": "TOO_WIDE", "width": 3, "message": result.message}
    assert "3" in result.message
    assert "2" in result.message
    assert match.match(needs, adverts, set(), max_width=3) == Assignment(
        {"a": "n1", "b": "n2", "c": "n3"}, 3
    )


def test_too_wide_depends_on_which_nodes_are_free() -> None:
    """R10: at promotion the width depends on the free nodes — a busy folding node widens the run.

    This is why TOO_WIDE is never cached per needs_key in a sweep (§6).
    """
    adverts = fleet(wide=flags("a", "b"), na=flags("a"), nb=flags("b"))
    needs = {"a": flags("a"), "b": flags("b")}
    assert match.match(needs, adverts, set(), 1) == Assignment({"a": "wide", "b": "wide"}, 1)
    narrow = match.match(needs, adverts, {"wide"}, 1)
    assert isinstance(narrow, Reject)
    assert (narrow.code, narrow.width) == (TOO_WIDE, 2)


# --- determinism and cost -------------------------------------------------------------------------


def test_same_input_in_any_advert_order_gives_the_same_output() -> None:
    """ADR-014 decision 3: shuffling the adverts (as a database may) never changes the answer."""
    rng = random.Random(3)
    adverts = [
        Advert(f"n{i}", {"board": ["stm32f4", "esp32"][i % 2], "scope": i % 3 == 0, "ram": i % 4})
        for i in range(30)
    ]
    needs: dict[str, dict[str, Any]] = {
        "dut": {"board": "stm32f4"},
        "bench": {"scope": True},
        "big": {"ram": 3},
    }
    unavailable = {"n0", "n6", "n3"}
    expected = match.match(needs, adverts, unavailable, 4)
    assert isinstance(expected, Assignment)
    for _ in range(20):
        rng.shuffle(adverts)
        assert match.match(needs, adverts, sorted(unavailable, reverse=True), 4) == expected


def test_duplicate_node_ids_are_refused() -> None:
    """Two adverts for one node would make the answer depend on their order."""
    with pytest.raises(ValueError, match="n1"):
        match.match({"r": {}}, fleet(n1={}) + fleet(n1={"x": 1}), set(), 4)


def test_each_advert_is_checked_once_per_role(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep calls match for many runs: a fleet of 100 and 10 roles cost 1,000 checks; now
    the advert index answers every role with set lookups, whoever calls (issue 25: a 64-role
    submit on 5,000 nodes), so no ``satisfies`` call is left — at most one per role and advert."""
    calls = 0
    real = capabilities.satisfies

    def counting(needs: Any, caps: Any) -> bool:
        nonlocal calls
        calls += 1
        return real(needs, caps)

    monkeypatch.setattr(match, "satisfies", counting)
    adverts = [Advert(f"n{i:03}", {"k": i % 10}) for i in range(100)]
    needs = {f"r{j}": {"k": j} for j in range(10)}
    result = match.match(needs, adverts, {f"n{i:03}" for i in range(0, 100, 3)}, 10)
    assert isinstance(result, Assignment)
    assert calls == 0


def test_candidates_lists_satisfying_nodes_sorted() -> None:
    adverts = fleet(n3={"b": "x"}, n1={"b": ["x", "y"]}, n2={"b": "y"}, n0={"b": True})
    assert match.candidates({"b": "x"}, adverts) == ["n1", "n3"]
    assert match.candidates({"b": True}, adverts) == ["n0", "n1", "n2", "n3"]
    assert match.candidates({"c": True}, adverts) == []


# --- properties -----------------------------------------------------------------------------------

NODE_IDS = [f"n{i}" for i in range(6)]
ROLES = ["r0", "r1", "r2", "r3"]
KEYS = ["k1", "k2", "k3"]
values = st.sampled_from([True, False, 0, 1, 1.0, "x", "y"])
cap_value = st.one_of(values, st.lists(values, max_size=3))
Problem = tuple[dict[str, dict[str, Any]], list[Advert], set[str], int]


@st.composite
def typed_problems(draw: st.DrawFn) -> Problem:
    """Needs and capabilities of mixed JSON types: exercises the type rules inside matching."""
    ids = draw(st.lists(st.sampled_from(NODE_IDS), unique=True, min_size=1))
    caps = st.dictionaries(st.sampled_from(KEYS), cap_value, min_size=1, max_size=3)
    adverts = [Advert(node_id, draw(caps)) for node_id in ids]
    # Mostly `true` needs, so that roles have candidates often enough to reach every rule.
    need = st.dictionaries(st.sampled_from(KEYS), st.sampled_from([True, True, 1, "x"]), max_size=2)
    roles = draw(st.lists(st.sampled_from(ROLES), unique=True, min_size=1))
    return (
        {role: draw(need) for role in roles},
        adverts,
        draw(st.sets(st.sampled_from(NODE_IDS), max_size=3)),
        draw(st.integers(1, 4)),
    )


@st.composite
def shaped_problems(draw: st.DrawFn) -> Problem:
    """Each node serves a random subset of the roles: exercises folding, ranking and width."""
    ids = draw(st.lists(st.sampled_from(NODE_IDS), unique=True, min_size=1))
    served = st.sets(st.sampled_from(ROLES), min_size=1, max_size=2)
    adverts = [Advert(node_id, flags(*draw(served))) for node_id in ids]
    roles = draw(st.lists(st.sampled_from(ROLES), unique=True, min_size=2))
    return (
        {role: flags(role) for role in roles},
        adverts,
        draw(st.sets(st.sampled_from(NODE_IDS), max_size=3)),
        draw(st.integers(1, 4)),
    )


# Zero roles has its own worked example; these always have at least one, to exercise the rules.
problems = st.one_of(typed_problems(), shaped_problems())


@settings(max_examples=examples(300))
@given(problems)
def test_assignment_uses_only_available_satisfying_nodes_within_the_cap(problem: Any) -> None:
    needs, adverts, unavailable, max_width = problem
    result = match.match(needs, adverts, unavailable, max_width)
    if isinstance(result, Assignment):
        caps = {a.node_id: a.capabilities for a in adverts}
        assert set(result.roles) == set(needs)
        for role, node in result.roles.items():
            assert node not in unavailable
            assert capabilities.satisfies(needs[role], caps[node])
        assert result.width == len(set(result.roles.values())) == len(result.nodes())
        assert result.width <= max_width


@settings(max_examples=examples(300))
@given(problems, st.randoms(use_true_random=False))
def test_output_is_independent_of_advert_order(problem: Any, rng: random.Random) -> None:
    """ADR-014 decision 3."""
    needs, adverts, unavailable, max_width = problem
    shuffled = list(adverts)
    rng.shuffle(shuffled)
    assert match.match(needs, shuffled, list(unavailable), max_width) == match.match(
        needs, adverts, unavailable, max_width
    )


@settings(max_examples=examples(300))
@given(problems)
def test_reject_code_follows_the_rules_of_section_6(problem: Any) -> None:
    """R1: NO_CANDIDATE iff a role has no satisfying node; ALL_BUSY iff a role has only
    unavailable ones; otherwise an assignment, TOO_WIDE exactly when it exceeds the cap."""
    needs, adverts, unavailable, max_width = problem
    result = match.match(needs, adverts, unavailable, max_width)
    roles = sorted(needs)
    able = {r: match.candidates(needs[r], adverts) for r in roles}
    empty = [r for r in roles if not able[r]]
    busy = [r for r in roles if all(n in unavailable for n in able[r])]
    if empty:
        assert isinstance(result, Reject)
        assert (result.code, result.role) == (NO_CANDIDATE, empty[0])
    elif busy:
        assert isinstance(result, Reject)
        assert (result.code, result.role) == (ALL_BUSY, busy[0])
        assert list(result.candidates) == able[busy[0]]
    else:
        # Width, exactly (§4): the greedy choice when it fits; else TOO_WIDE only if no
        # assignment of available nodes fits (tests/unit/test_match_width.py checks which).
        uncapped = match.match(needs, adverts, unavailable, max_width=len(NODE_IDS))
        assert isinstance(uncapped, Assignment)
        if uncapped.width <= max_width:
            assert result == uncapped
        elif isinstance(result, Reject):
            assert (result.code, result.width) == (TOO_WIDE, uncapped.width)
        else:
            assert result.width <= max_width < uncapped.width


@settings(max_examples=examples(300))
@given(problems, st.sets(st.sampled_from(NODE_IDS)))
def test_all_busy_and_no_candidate_stay_true_as_unavailable_grows(
    problem: Any, more: set[str]
) -> None:
    """§6: within a sweep `unavailable` only grows, so these two may be cached per needs_key."""
    needs, adverts, unavailable, max_width = problem
    result = match.match(needs, adverts, unavailable, max_width)
    if isinstance(result, Reject) and result.code in (ALL_BUSY, NO_CANDIDATE):
        later = match.match(needs, adverts, unavailable | more, max_width)
        assert isinstance(later, Reject)
        assert later.code in (ALL_BUSY, NO_CANDIDATE)
