"""The matcher's refusals, word for word (docs/design.md §4: a refusal is stored and returned as
``{code, role, candidates | width, message}``): the message is what a submitter reads in the 422
or the wait reason, so each is pinned whole, including where a long candidate list is cut."""

from __future__ import annotations

from mediator.core.match import _NAMED_IN_MESSAGE, Advert, Reject, match


def test_no_candidate_names_the_role_and_its_needs_in_key_order() -> None:
    needs = {"dut": {"board": "stm32", "arch": "arm"}}
    res = match(needs, [Advert("n1", {"board": "esp"})], set(), 2)
    assert isinstance(res, Reject)
    assert res.message == (
        'No live node can serve role "dut" (needs {"arch": "arm", "board": "stm32"}); change the '
        "contract or bring such a node online."
    )


def test_all_busy_names_the_candidates_up_to_the_limit_and_counts_the_rest() -> None:
    n = _NAMED_IN_MESSAGE
    exactly = [Advert(f"n{i:02d}", {"pool": True}) for i in range(n)]
    res = match({"r": {"pool": True}}, exactly, {a.node_id for a in exactly}, 2)
    assert isinstance(res, Reject)
    named = ", ".join(a.node_id for a in exactly)
    assert res.message == (
        f'Every node that can serve role "r" is busy or draining ({named}); the run waits '
        "until one is released."
    )
    more = [*exactly, Advert(f"n{n:02d}", {"pool": True})]
    res = match({"r": {"pool": True}}, more, {a.node_id for a in more}, 2)
    assert isinstance(res, Reject)
    assert f"({named} and 1 more)" in res.message


def test_too_wide_says_the_width_needed_and_the_cap() -> None:
    fleet = [Advert("a", {"x": True}), Advert("b", {"y": True})]
    res = match({"p": {"x": True}, "q": {"y": True}}, fleet, set(), 1)
    assert isinstance(res, Reject)
    assert res.message == (
        "No choice of nodes fills the run's roles with at most 1 distinct nodes (max_width; the "
        "matcher's choice needed 2); use fewer roles or ask the operator to raise max_width."
    )
