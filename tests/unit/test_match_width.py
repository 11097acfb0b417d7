"""Width, exactly (docs/design.md §4, issue 24): ``TOO_WIDE`` means that *no* assignment of the
available nodes fits ``max_width``, not that the greedy one did not.

The greedy matcher is kept when its choice fits; when it does not, the matcher searches exactly
for the narrowest assignment of available nodes, ties broken in the order the greedy matcher tries
nodes. Checked here against two brute forces that share nothing with the search: the narrowest
width by trying every set of available nodes, smallest first, and the tie-break by walking every
choice the greedy order can make, without pruning, and taking the first of the narrowest.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from mediator.core import capabilities, match
from mediator.core.match import ALL_BUSY, NO_CANDIDATE, TOO_WIDE, Advert, Assignment, Reject
from tests.conftest import examples

NODES = [f"n{i}" for i in range(7)]
ROLES = ["a", "b", "c", "d", "e"]


def flags(*names: str) -> dict[str, bool]:
    return {name: True for name in names}


def counterexample() -> tuple[dict[str, dict[str, Any]], list[Advert]]:
    """Roles a–d need ra–rd; G serves a and b, H a and c, J b and d. {H, J} covers all four;
    greedy takes G for a (it serves as many later roles as H, and sorts first), then needs H and
    J as well: width 3."""
    needs = {r: flags(f"r{r}") for r in "abcd"}
    adverts = [
        Advert("G", flags("ra", "rb")),
        Advert("H", flags("ra", "rc")),
        Advert("J", flags("rb", "rd")),
    ]
    return needs, adverts


# ---- the counterexample of issue 24 --------------------------------------------------------------
def test_every_node_free_the_narrowest_assignment_is_taken_not_too_wide() -> None:
    needs, adverts = counterexample()
    assert match.match(needs, adverts, set(), max_width=2) == Assignment(
        {"a": "H", "b": "J", "c": "H", "d": "J"}, 2
    )


def test_with_g_busy_the_same_two_nodes_are_chosen() -> None:
    needs, adverts = counterexample()
    assert match.match(needs, adverts, {"G"}, max_width=2) == Assignment(
        {"a": "H", "b": "J", "c": "H", "d": "J"}, 2
    )


def test_the_greedy_choice_is_kept_when_it_fits() -> None:
    """Only a greedy choice wider than max_width is searched again (§4): at 3 it stands."""
    needs, adverts = counterexample()
    assert match.match(needs, adverts, set(), max_width=3) == Assignment(
        {"a": "G", "b": "G", "c": "H", "d": "J"}, 3
    )


def test_too_wide_when_no_choice_fits_says_the_greedy_width() -> None:
    needs, adverts = counterexample()
    result = match.match(needs, adverts, {"H"}, max_width=2)  # G, J and no H: c has no node
    assert isinstance(result, Reject) and result.code == ALL_BUSY
    result = match.match(needs, adverts, set(), max_width=1)
    assert isinstance(result, Reject)
    assert (result.code, result.width) == (TOO_WIDE, 3)
    assert "at most 1 distinct nodes" in result.message


# ---- brute forces ------------------------------------------------------------------------------
def able(needs: dict[str, dict[str, Any]], adverts: list[Advert]) -> dict[str, set[str]]:
    return {
        role: {a.node_id for a in adverts if capabilities.satisfies(need, a.capabilities)}
        for role, need in needs.items()
    }


def narrowest_width(serves: dict[str, set[str]], free: list[str]) -> int | None:
    """The fewest available nodes that serve every role: every set, smallest first."""
    for k in range(len(free) + 1):
        for nodes in itertools.combinations(free, k):
            if all(serves[r] & set(nodes) for r in serves):
                return k
    return None


def greedy_order_leaves(
    serves: dict[str, set[str]], unavailable: set[str]
) -> Iterator[dict[str, str]]:
    """Every assignment the greedy order can reach, in that order: roles by name; a role that a
    chosen node serves goes to the earliest; otherwise each available candidate in turn, most
    later roles served first, then node id."""
    roles = sorted(serves)

    def walk(i: int, chosen: list[str], got: dict[str, str]) -> Iterator[dict[str, str]]:
        if i == len(roles):
            yield dict(got)
            return
        role = roles[i]
        fold = [n for n in chosen if n in serves[role]]
        if fold:
            yield from walk(i + 1, chosen, {**got, role: fold[0]})
            return
        later = roles[i:]
        cands = sorted(
            (n for n in serves[role] if n not in unavailable),
            key=lambda n: (-sum(n in serves[r] for r in later), n),
        )
        for n in cands:
            yield from walk(i + 1, [*chosen, n], {**got, role: n})

    yield from walk(0, [], {})


@st.composite
def problems(draw: st.DrawFn) -> tuple[dict[str, dict[str, Any]], list[Advert], set[str], int]:
    ids = draw(st.lists(st.sampled_from(NODES), unique=True, min_size=1))
    roles = draw(st.lists(st.sampled_from(ROLES), unique=True, min_size=2))
    served = st.sets(st.sampled_from(roles), min_size=1, max_size=3)
    adverts = [Advert(n, flags(*draw(served))) for n in ids]
    return (
        {r: flags(r) for r in roles},
        adverts,
        draw(st.sets(st.sampled_from(NODES), max_size=4)),
        draw(st.integers(1, 4)),
    )


def _counter_problem() -> tuple[dict[str, dict[str, Any]], list[Advert], set[str], int]:
    needs, adverts = counterexample()
    return needs, adverts, set(), 2


@settings(max_examples=examples(500))
@given(problems())
@example(_counter_problem())
def test_the_matcher_agrees_with_brute_force(problem: Any) -> None:
    needs, adverts, unavailable, max_width = problem
    result = match.match(needs, adverts, unavailable, max_width)
    serves = able(needs, adverts)
    if any(not s for s in serves.values()):
        assert isinstance(result, Reject) and result.code == NO_CANDIDATE
        return
    if any(s <= unavailable for s in serves.values()):
        assert isinstance(result, Reject) and result.code == ALL_BUSY
        return
    free = sorted({n for s in serves.values() for n in s} - unavailable)
    least = narrowest_width(serves, free)
    assert least is not None
    leaves = list(greedy_order_leaves(serves, unavailable))
    greedy = leaves[0]
    greedy_width = len(set(greedy.values()))
    if greedy_width <= max_width:
        assert result == Assignment(greedy, greedy_width)  # the greedy choice stands
    elif least <= max_width:
        first = next(g for g in leaves if len(set(g.values())) == least)
        assert result == Assignment(first, least)
    else:
        assert isinstance(result, Reject)
        assert (result.code, result.width) == (TOO_WIDE, greedy_width)


@settings(max_examples=examples(500))
@given(problems(), st.sets(st.sampled_from(NODES)))
@example((*counterexample(), set(), 2), {"G"})
def test_freeing_nodes_never_makes_a_fitting_run_too_wide(problem: Any, more: set[str]) -> None:
    """What the queue needs (R10): a run that fits with some nodes busy still fits when fewer
    are busy. Greedy alone broke this — the counterexample fits with G busy, not with G free."""
    needs, adverts, unavailable, max_width = problem
    busier = match.match(needs, adverts, unavailable | more, max_width)
    if isinstance(busier, Assignment):
        assert isinstance(match.match(needs, adverts, unavailable, max_width), Assignment)


def test_too_wide_is_the_only_width_refusal() -> None:
    needs = {r: flags(r) for r in "abc"}
    adverts = [Advert(f"x{r}", flags(r)) for r in "abc"]
    result = match.match(needs, adverts, set(), 2)
    assert isinstance(result, Reject) and result.code == TOO_WIDE


def test_a_wide_fleet_is_searched_quickly() -> None:
    """The search's pruning: 12 roles, 60 nodes of 30 kinds, max_width 4 — the identical kinds
    are tried once, and the bound cuts hopeless branches (a plain walk visits millions)."""
    roles = [f"r{i:02d}" for i in range(12)]
    needs = {r: flags(r) for r in roles}
    adverts = []
    for k in range(30):
        served = [roles[(k + j * 5) % 12] for j in range(3)]
        adverts += [Advert(f"k{k:02d}-{c}", flags(*served)) for c in range(2)]
    result = match.match(needs, adverts, set(), 4)
    serves = able(needs, adverts)
    least = narrowest_width(serves, sorted(a.node_id for a in adverts))
    assert least is not None
    if least <= 4:
        assert isinstance(result, Assignment) and result.width == least
    else:
        assert isinstance(result, Reject) and result.code == TOO_WIDE
