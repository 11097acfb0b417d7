"""The model's matcher against `mediator.core.match` on random fleets (docs/design.md §4).

`sim.brokers.model` re-implements the matcher instead of importing it (docs/design.md §20: an
independent implementation is what makes the differential test evidence). This test is where the two
meet directly: for random capabilities, needs, liveness, leases and drains, both must return the
same assignment or the same refusal code. (Tests may import both; the model itself may not.)
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mediator.core.match import Advert, Assignment, match
from sim.brokers.model import ALL_BUSY, OK, Model
from sim.inputs.scenarios import (
    Fleet,
    NodeGroup,
    Scenario,
    Scripted,
    Settings,
    StepSpec,
    Template,
    Workload,
)
from sim.inputs.workload import materialize
from tests.conftest import examples

VALUES = st.sampled_from([True, False, 0, 1, 1.0, 2, "a", "b"])
CAPS = st.dictionaries(
    st.sampled_from(["x", "y", "z"]), st.one_of(VALUES, st.lists(VALUES, max_size=3)), max_size=3
)
NEEDS = st.dictionaries(st.sampled_from(["x", "y", "z"]), VALUES, max_size=2)


def _model(caps: list[dict[str, Any]]) -> Model:
    tpl = Template("t", {"r": {}}, (StepSpec("s", "r"),))
    sc = Scenario(
        name="m",
        fleet=Fleet(tuple(NodeGroup(1, c, id_prefix=f"n{i}") for i, c in enumerate(caps))),
        workload=Workload(Scripted(((0.0, "t"),)), (tpl,)),
        settings=Settings(),
        horizon_s=1.0,
    )
    return Model(materialize(sc))


@settings(max_examples=examples(300), deadline=None, database=None)
@given(
    fleet=st.lists(
        st.tuples(CAPS, st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=5
    ),
    needs=st.dictionaries(st.sampled_from(["a", "b", "c"]), NEEDS, min_size=1, max_size=3),
    max_width=st.integers(1, 3),
)
def test_model_matcher_agrees_with_mediator_match(
    fleet: list[tuple[dict[str, Any], bool, bool, bool]], needs: dict[str, Any], max_width: int
) -> None:
    model = _model([caps for caps, *_ in fleet])
    model.max_width = max_width
    model.now = 100
    adverts, unavailable = [], set()
    for node, (_caps, live, busy, draining) in zip(model.nodes, fleet, strict=True):
        node.expires_at = 200 if live else 50
        node.drain = "graceful" if draining else ""
        node.lease = object() if busy else None  # type: ignore[assignment]
        if live:
            adverts.append(Advert(node.node_id, node.caps))
            if busy or draining:
                unavailable.add(node.node_id)
    code, chosen = model._match(model._needs_of({"roles": needs}))
    expected = match(needs, adverts, unavailable, max_width)
    if isinstance(expected, Assignment):
        assert code == OK
        assert chosen is not None
        roles = sorted(needs)
        assert {r: n.node_id for r, n in zip(roles, chosen, strict=True)} == dict(expected.roles)
    else:
        assert code == expected.code
        assert code != OK and (code != ALL_BUSY or expected.candidates)


ROLE_FLAGS = ["p", "q", "r", "s", "t"]


@settings(max_examples=examples(300), deadline=None, database=None)
@given(
    fleet=st.lists(
        st.tuples(
            st.sets(st.sampled_from(ROLE_FLAGS), min_size=1, max_size=3),
            st.booleans(),
            st.booleans(),
        ),
        min_size=2,
        max_size=6,
    ),
    roles=st.sets(st.sampled_from(ROLE_FLAGS), min_size=3, max_size=5),
    max_width=st.integers(1, 3),
)
def test_model_matcher_agrees_on_width_when_greedy_is_too_wide(
    fleet: list[tuple[set[str], bool, bool]], roles: set[str], max_width: int
) -> None:
    """docs/design.md §4 "Width, exactly": nodes serving several roles each, so the greedy
    choice is often too wide and the exact search decides — the model's own search and the
    Mediator's must pick the same nodes (issue 24's G/H/J counterexample among them)."""
    model = _model([{f: True for f in flags} for flags, *_ in fleet])
    model.max_width = max_width
    model.now = 100
    adverts, unavailable = [], set()
    for node, (_flags, busy, draining) in zip(model.nodes, fleet, strict=True):
        node.expires_at = 200
        node.drain = "graceful" if draining else ""
        node.lease = object() if busy else None  # type: ignore[assignment]
        adverts.append(Advert(node.node_id, node.caps))
        if busy or draining:
            unavailable.add(node.node_id)
    needs = {r: {r: True} for r in roles}
    info = model._needs_of({"roles": needs})
    code, chosen = model._match(info)
    expected = match(needs, adverts, unavailable, max_width)
    if isinstance(expected, Assignment):
        assert code == OK and chosen is not None
        assert {r: n.node_id for r, n in zip(sorted(needs), chosen, strict=True)} == dict(
            expected.roles
        )
    else:
        assert code == expected.code
    # Submit's question, every live node counted: refused exactly when the Mediator refuses.
    able = match(needs, adverts, set(), max_width)
    assert model._too_wide_free(info) == (
        not isinstance(able, Assignment) and able.code == "TOO_WIDE"
    )
