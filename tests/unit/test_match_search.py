"""The exact width search's pruning (docs/design.md §4 "Width, exactly"; ``core/match.py:
narrowest``), held to what it may and must cut, as counts that do not drift with the machine.

The search's pruning changes its cost, never its answer, so the brute forces of
``test_match_width.py`` cannot see a bound weakened or a memo dropped. What the search may skip is
documented, though: a state whose lower bound exceeds the nodes left, a kind of candidate whose
uncovered roles an earlier one covers, a state already shown to fail. Here a second reader of that
documentation, written plainly and without the search's shortcuts in shared code, lists every
state (covered roles, nodes left) the search must work on, in order; ``narrowest`` reports the
states it works on (``asked=``), and the two lists must be equal. A weaker bound works on more, a
stronger one answers wrongly; either way the lists differ.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from mediator.core import match
from mediator.core.match import Assignment
from tests.conftest import examples

NODES = [f"n{i}" for i in range(10)]


def ones(bits: int) -> int:
    return bin(bits).count("1")


def least_cover(kinds: set[int], uncovered: int) -> int | None:
    """The fewest kinds whose union holds ``uncovered``: every combination, smallest first."""
    for k in range(len(kinds) + 1):
        for chosen in itertools.combinations(sorted(kinds), k):
            union = 0
            for m in chosen:
                union |= m
            if union & uncovered == uncovered:
                return k
    return None


def second_reader(
    serves: Sequence[set[str]], unavailable: set[str], max_width: int
) -> tuple[list[str] | None, list[tuple[int, int]]]:
    """The search as ``narrowest``'s docstring tells it: the nodes chosen (or None) and every
    state ``fits`` works on (neither all covered nor known to fail), in order."""
    n = len(serves)
    full = 2**n - 1
    bits = {
        x: sum(2**i for i, s in enumerate(serves) if x in s)
        for x in set().union(*serves) - unavailable
    }
    if any(not (s - unavailable) for s in serves):
        return None, []
    kinds = set(bits.values())

    def lower(uncovered: int) -> int:
        """The fewest kinds whose largest gains add up to the uncovered roles."""
        gains = sorted((ones(m & uncovered) for m in kinds), reverse=True)
        total = 0
        for k, gain in enumerate(gains, 1):
            total += gain
            if total >= ones(uncovered):
                return k
        raise AssertionError("every role has an available node")

    def step4(i: int) -> list[str]:
        onward = sum(2**j for j in range(i, n))
        return sorted(
            (x for x in serves[i] if x in bits), key=lambda x: (-ones(bits[x] & onward), x)
        )

    kinds_of = [sorted({bits[x] for x in step4(i)}, key=lambda m: (-ones(m), m)) for i in range(n)]
    failed: set[tuple[int, int]] = set()
    asks: list[tuple[int, int]] = []

    def dominated(gain: int, tried: list[int]) -> bool:
        return any(gain | t == t for t in tried)

    def fits(covered: int, left: int) -> bool:
        if covered == full:
            return True
        if (covered, left) in failed:
            return False
        asks.append((covered, left))
        uncovered = full - covered
        if lower(uncovered) > left:
            failed.add((covered, left))
            return False
        open_roles = [i for i in range(n) if uncovered & 2**i]
        role = min(open_roles, key=lambda i: (len(kinds_of[i]), i))
        tried: list[int] = []
        for m in kinds_of[role]:
            if dominated(m & uncovered, tried):
                continue
            tried.append(m & uncovered)
            if fits(covered | m, left - 1):
                return True
        failed.add((covered, left))
        return False

    for width in range(lower(full), max_width + 1):
        if not fits(0, width):
            continue
        covered, chosen = 0, []
        while covered != full:
            uncovered = full - covered
            first = next(i for i in range(n) if uncovered & 2**i)
            tried: list[int] = []
            for x in step4(first):
                if dominated(bits[x] & uncovered, tried):
                    continue
                tried.append(bits[x] & uncovered)
                if fits(covered | bits[x], width - len(chosen) - 1):
                    chosen.append(x)
                    covered |= bits[x]
                    break
        return chosen, asks
    return None, asks


@st.composite
def covers(draw: st.DrawFn) -> tuple[list[set[str]], set[str], int]:
    """C_r for 1–8 roles over up to 10 nodes (each serving 1–4 roles), some unavailable."""
    ids = draw(st.lists(st.sampled_from(NODES), unique=True, min_size=1))
    n = draw(st.integers(1, 8))
    serving = {x: draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=4)) for x in ids}
    serves = [{x for x in ids if i in serving[x]} for i in range(n)]
    return serves, draw(st.sets(st.sampled_from(NODES), max_size=3)), draw(st.integers(1, 5))


def problem(max_width: int, **serving: list[int]) -> tuple[list[set[str]], set[str], int]:
    n = 1 + max(max(s) for s in serving.values())
    return [{x for x, s in serving.items() if i in s} for i in range(n)], set(), max_width


def crossing() -> tuple[list[set[str]], set[str], int]:
    """Six roles; kinds that overlap so the bound, the skip and the memo all have work."""
    serving = {"A": {0, 1, 2}, "B": {3, 4, 5}, "C": {0, 3}, "D": {1, 4}, "E": {2, 5},
               "F": {0, 1}, "G": {4, 5}, "H": {2, 3}}  # fmt: skip
    serves = [{x for x, s in serving.items() if i in s} for i in range(6)]
    return serves, {"A"}, 4


# Fleets where one piece of pruning matters (found by dropping it and comparing): the memory of
# a state that failed after branching (eight roles: the same coverage reached two ways) …
REMEMBERED = problem(5, n0=[0, 4], n1=[2, 3, 7], n2=[1, 5, 6], n3=[5], n4=[0, 5, 6], n5=[1, 2],
                     n6=[4, 5, 7], n7=[2, 3, 4], n8=[3, 5], n9=[1, 5])  # fmt: skip
# … a kind covered by an earlier one in ``fits`` …
SKIPPED = problem(5, n0=[3], n1=[4], n2=[1], n3=[0, 3], n4=[2, 4], n5=[0, 2], n6=[0, 1, 4],
                  n7=[0, 2, 4])  # fmt: skip
# … a kind covered by an earlier one, with kinds still to try after it (skipped, not the end) …
MIDWAY = problem(4, n0=[0, 3], n1=[0, 1, 2], n2=[0, 4], n3=[0, 1, 3], n4=[0, 1, 4], n5=[4],
                 n6=[2, 3])  # fmt: skip
# … and a candidate covered by an earlier one in the ordered descent.
DESCENT = problem(4, n0=[3, 4], n1=[0, 2], n2=[0, 3], n3=[2, 3, 4], n4=[1], n5=[1], n6=[1, 2, 3],
                  n7=[0, 4], n8=[0, 2, 3], n9=[2, 3, 4])  # fmt: skip


def search(serves: list[set[str]], unavailable: set[str], max_width: int) -> Any:
    asked: list[tuple[int, int]] = []
    roles = [f"r{i}" for i in range(len(serves))]
    result = match.narrowest(roles, serves, frozenset(unavailable), max_width, asked=asked)
    return result, asked


@settings(max_examples=examples(600), deadline=None)
@given(covers())
@example(crossing())
@example(REMEMBERED)
@example(SKIPPED)
@example(MIDWAY)
@example(DESCENT)
def test_the_search_works_on_exactly_the_states_its_documented_pruning_leaves(problem: Any) -> None:
    serves, unavailable, max_width = problem
    result, asked = search(serves, unavailable, max_width)
    nodes, asks = second_reader(serves, unavailable, max_width)
    assert asked == asks
    if nodes is None:
        assert result is None
    else:
        roles = {f"r{i}": next(x for x in nodes if x in s) for i, s in enumerate(serves)}
        assert result == Assignment(roles, len(nodes))


def largest_gains(kinds: set[int], uncovered: int) -> int:
    """The documented lower bound: the fewest kinds whose largest gains add up to ``uncovered``."""
    total = 0
    for k, gain in enumerate(sorted((ones(m & uncovered) for m in kinds), reverse=True), 1):
        total += gain
        if total >= ones(uncovered):
            return k
    raise AssertionError("every role has an available node")


@settings(max_examples=examples(300), deadline=None)
@given(covers())
@example(crossing())
@example(REMEMBERED)
@example(SKIPPED)
@example(MIDWAY)
@example(DESCENT)
def test_a_failed_state_is_never_worked_on_again_and_the_bound_cuts_only_hopeless_ones(
    problem: Any,
) -> None:
    """The memory and the bound by what they promise, not by replaying the search: a state that
    cannot complete (brute force) is worked on at most once; after it, the next state worked on is
    one of its children (more roles covered, one node fewer left) only if the documented lower
    bound allowed it; and that bound never exceeds the true fewest nodes."""
    serves, unavailable, max_width = problem
    if any(not (s - unavailable) for s in serves):
        return
    _, asked = search(serves, unavailable, max_width)
    full = 2 ** len(serves) - 1
    free = set().union(*serves) - unavailable
    kinds = {sum(2**i for i, s in enumerate(serves) if x in s) for x in free}
    for at, (covered, left) in enumerate(asked):
        least = least_cover(kinds, full - covered)
        assert least is not None
        assert largest_gains(kinds, full - covered) <= least
        if least <= left:
            continue
        assert (covered, left) not in asked[:at]
        after = asked[at + 1] if at + 1 < len(asked) else (covered, left)
        if after[1] == left - 1 and after[0] & covered == covered != after[0]:
            assert largest_gains(kinds, full - covered) <= left


def test_a_role_no_available_node_serves_is_not_a_width_question() -> None:
    assert match.narrowest(["a", "b"], [{"x"}, {"y"}], frozenset({"y"}), 3) is None


def test_no_roles_is_the_empty_assignment() -> None:
    assert match.narrowest([], [], frozenset(), 1) == Assignment({}, 0)


def test_the_search_is_the_same_without_the_question_list() -> None:
    serves, unavailable, max_width = crossing()
    roles = [f"r{i}" for i in range(6)]
    plain = match.narrowest(roles, serves, frozenset(unavailable), max_width)
    assert (plain, search(serves, unavailable, max_width)[1]) == search(
        serves, unavailable, max_width
    )
