"""The plants of the gate's rule coverage (issue 24, ``sim.outputs.coverage``) break a rule only
while installed: every patched name is restored afterwards, so a worker that runs several plants
one after another (or the gate after them) sees the product unchanged."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import mediator.core.match as match_mod
import mediator.core.progress as progress_mod
import mediator.flows.advert as advert_flow
import mediator.flows.asks as asks_flow
import mediator.flows.ending as ending_flow
import mediator.flows.steps as steps_flow
import mediator.flows.submit as submit_flow
import mediator.flows.sweep as sweep_flow
import mediator.store.connector as connector
from mediator.core.match import Advert, Assignment, match
from mediator.flows.after import AfterCommit
from mediator.store.tx import SweepHead, Tx
from sim.outputs import coverage
from sim.outputs.gate import BaselineError
from sim.platform.core import EventQueue

WATCHED: list[tuple[Any, str]] = [
    (match_mod, "_count_serving"), (match_mod, "narrowest"), (progress_mod, "progress"),
    (steps_flow, "decide_result"), (advert_flow, "advert"), (advert_flow, "advert_effects"),
    (sweep_flow, "sweep"), (AfterCommit, "wake_safely"),
    (progress_mod, "drained_at_boundary"), (progress_mod, "settle_verdict"),
    (advert_flow, "drained_at_boundary"),
    (submit_flow, "match"), (submit_flow, "submit"), (ending_flow, "reap"), (ending_flow, "end"),
    (asks_flow, "contract_mod"), (steps_flow, "report"), (Tx, "_leasing"), (Tx, "rebind_lease"),
    (connector, "check_edges"), (EventQueue, "events"), (Tx, "queued_page"),
    (sweep_flow.SweepMemo, "_add"), (sweep_flow.SweepMemo, "_drop"),
]  # fmt: skip

FOLD_NEEDS = {"dut": {"board": True}, "host": {"host": True}}
FOLD_FLEET = [Advert("a000", {"board": True}), Advert("b000", {"board": True, "host": True}),
              Advert("b001", {"board": True, "host": True})]  # fmt: skip


def state() -> list[Any]:
    return [vars(t).get(n) for t, n in WATCHED] + [
        name in vars(match_mod) for name in ("min", "next", "sorted")
    ]


@pytest.mark.parametrize("plant", [*coverage.PLANTS, coverage.NOTHING], ids=lambda p: p.id)
def test_a_plant_is_undone_when_it_ends(plant: coverage.Plant) -> None:
    before = state()
    with plant.apply():
        pass
    assert state() == before


def test_the_matcher_plants_change_the_rules_cases_choice_and_only_while_installed() -> None:
    """§4 step 4 on the ``rules`` case's fleet: b000 serves both roles and is taken for both."""
    folded = Assignment({"dut": "b000", "host": "b000"}, 1)
    assert match(FOLD_NEEDS, FOLD_FLEET, set(), 2) == folded
    with coverage.plant("match-ignores-folding").apply():
        assert match(FOLD_NEEDS, FOLD_FLEET, set(), 2) == Assignment(
            {"dut": "a000", "host": "b000"}, 2
        )
    with coverage.plant("match-last-candidate").apply():
        assert match(FOLD_NEEDS, FOLD_FLEET, set(), 2) == Assignment(
            {"dut": "b001", "host": "b001"}, 1
        )
    assert match(FOLD_NEEDS, FOLD_FLEET, set(), 2) == folded


def test_the_folding_and_exact_order_plants_change_the_edges_cases_choice() -> None:
    """The ``edges`` case's last two contracts (sim-baseline/edges.toml). fold: fy folds onto
    yb000, chosen for fx (§4 step 3), although ya000, a lower id, serves fy too. exact
    (max_width 2): greedy takes xc000, xa000, xb000 (3 wide); the narrowest assignments
    {xc000, xd000} and {xa000, xb000} tie at 2, and step 4's order (more later roles first)
    picks the first."""
    fold_needs = {"fx": {"fx": True}, "fy": {"fy": True}}
    fold_fleet = [Advert("ya000", {"fy": True}), Advert("yb000", {"fx": True, "fy": True})]
    folded = Assignment({"fx": "yb000", "fy": "yb000"}, 1)
    exact_needs = {g: {g: True} for g in ("ga", "gb", "gc", "gd", "ge")}
    exact_fleet = [Advert(node, dict.fromkeys(caps, True)) for node, caps in (
        ("xa000", ("gb", "gc", "gd")), ("xb000", ("ga", "ge")), ("xc000", ("ga", "gc", "gd")),
        ("xd000", ("gb", "ge")))]  # fmt: skip
    narrowest = Assignment({"ga": "xc000", "gb": "xd000", "gc": "xc000", "gd": "xc000",
                            "ge": "xd000"}, 2)  # fmt: skip
    assert match(fold_needs, fold_fleet, set(), 2) == folded
    assert match(exact_needs, exact_fleet, set(), 2) == narrowest
    with coverage.plant("match-no-reuse").apply():
        assert match(fold_needs, fold_fleet, set(), 2) == Assignment(
            {"fx": "yb000", "fy": "ya000"}, 2
        )
        assert match(exact_needs, exact_fleet, set(), 2) == narrowest  # its own next() intact
    with coverage.plant("exact-order-flipped").apply():
        assert match(exact_needs, exact_fleet, set(), 2) == Assignment(
            {"ga": "xb000", "gb": "xa000", "gc": "xa000", "gd": "xa000", "ge": "xb000"}, 2
        )
        assert match(fold_needs, fold_fleet, set(), 2) == folded  # greedy's choice untouched
    assert match(fold_needs, fold_fleet, set(), 2) == folded
    assert match(exact_needs, exact_fleet, set(), 2) == narrowest


def test_the_memo_plant_forgets_a_class_that_waits_again_and_only_while_installed() -> None:
    """§6 "Sweeps remember", as in the ``edges`` case's class n: it waits, a read since the mark
    says it no longer does (its run was promoted), and a later read says it waits again — the
    memo holds it again. With ``memo-forgets-returning-class`` installed it does not: its runs
    would never be walked."""
    needs = {"n": {"n": True}}

    def waiting(memo: sweep_flow.SweepMemo, classes: Any, since: int | None) -> int:
        head = SweepHead(classes, [], [], since=since, mark=(since or 0) + 1,
                         full=since is None, queued=True)  # fmt: skip
        return memo.plan(head, None, None, set(), 2).classes  # nothing free: the classes held

    def learnt_again() -> int:
        memo = sweep_flow.SweepMemo()
        assert waiting(memo, [("n", needs)], None) == 1
        assert waiting(memo, [("n", None)], 1) == 0
        return waiting(memo, [("n", needs)], 2)

    assert learnt_again() == 1
    with coverage.plant("memo-forgets-returning-class").apply():
        assert learnt_again() == 0
    assert learnt_again() == 1


def test_plant_ids_are_unique_and_an_unknown_one_is_refused() -> None:
    ids = [p.id for p in coverage.PLANTS]
    assert len(ids) == len(set(ids)) and coverage.NOTHING.id not in ids
    with pytest.raises(BaselineError, match="unknown plant 'nope'"):
        coverage.plant("nope")


@pytest.mark.slow  # scripts/test --fast leaves it out
def test_the_command_lists_the_plants() -> None:
    out = subprocess.run([sys.executable, "-m", "sim", "coverage", "--baseline", "x", "--list"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    for p in coverage.PLANTS:
        assert p.id in out


def test_the_documented_exceptions_are_plants() -> None:
    """Wake 5 cannot happen in a simulation (docs/design.md §20): allowed by name."""
    assert set(coverage.EXCEPTIONS) <= {p.id for p in coverage.PLANTS}


def test_every_plant_but_the_exceptions_names_the_case_that_catches_it() -> None:
    """``CAUGHT_BY`` is tried first (one case per plant in CI); every rule in the table has a
    plant or a reason why a simulation cannot exercise it (docs/design.md §20)."""
    ids = {p.id for p in coverage.PLANTS}
    assert set(coverage.CAUGHT_BY) == ids - set(coverage.EXCEPTIONS)
    rules = " ".join(p.rule for p in coverage.PLANTS) + " ".join(coverage.UNEXERCISABLE)
    for n in range(1, 18):
        assert f"R{n} " in rules or f"R{n})" in rules or f"R{n}," in rules, f"R{n}"
    for n in range(1, 10):
        assert f"wake-{n}-off" in ids


def test_the_horizon_guard_stops_an_endless_planted_run_and_is_undone() -> None:
    """A plant can make a case endless (the reaper off keeps the reaper timer going): the planted
    run's event loop stops at twice the baseline's end, and only while installed."""
    q = EventQueue()
    for t in (1_000_000, 5_000_000):
        q.push(t, 0, 0, lambda _a: None, None)
    with coverage._horizon(2.0):
        assert [ev[0] for ev in q.events()] == [1_000_000]
    assert "events" not in vars(EventQueue) or vars(EventQueue)["events"] is _EVENTS
    assert [ev[0] for ev in q.events()] == [5_000_000]


_EVENTS = vars(EventQueue)["events"]
