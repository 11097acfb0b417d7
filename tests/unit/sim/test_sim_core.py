"""The shared simulation core (issue 14 §1): one event heap, one same-instant rule, one key.

Both engines — the real Mediator's and the reference model's — take these from `sim.platform.core`;
the differential test (tests/db/sim/test_sim.py) is exact only while they agree, so they are defined
once.
"""

from __future__ import annotations

import ast
from pathlib import Path

from sim.platform import core
from sim.platform.core import (
    ADVERT,
    ARRIVAL,
    CLAIM,
    FLEET,
    MARK,
    REAPER,
    RESULT,
    EventQueue,
    step_key,
)

ROOT = Path(__file__).resolve().parents[3]


def test_at_one_instant_results_come_first_and_arrivals_see_everything() -> None:
    q = EventQueue()
    order: list[str] = []
    # pushed in the reverse of the order they must run in, all at t = 5 µs
    for cls, name in reversed(
        [(RESULT, "result"), (CLAIM, "claim"), (FLEET, "fleet"), (ADVERT, "advert"),
         (REAPER, "reaper"), (ARRIVAL, "arrival"), (MARK, "mark")]
    ):  # fmt: skip
        q.push(5, cls, 0, order.append, name)
    q.push(4, MARK, 0, order.append, "earlier")
    while q:
        *_, action, arg = q.pop()
        action(arg)
    assert order == ["earlier", "result", "claim", "fleet", "advert", "reaper", "arrival", "mark"]


def test_within_a_class_the_key_decides_then_insertion() -> None:
    q = EventQueue()
    order: list[str] = []
    q.push(0, RESULT, step_key(2, 0), order.append, "run 2 step 0")
    q.push(0, RESULT, step_key(1, 3), order.append, "run 1 step 3 (first)")
    q.push(0, RESULT, step_key(1, 1), order.append, "run 1 step 1")
    q.push(0, RESULT, step_key(1, 3), order.append, "run 1 step 3 (second)")
    while q:
        *_, action, arg = q.pop()
        action(arg)
    assert order == ["run 1 step 1", "run 1 step 3 (first)", "run 1 step 3 (second)",
                     "run 2 step 0"]  # fmt: skip


def test_a_runs_last_step_sorts_before_the_next_runs_first() -> None:
    # A contract has at most 1,000 steps, so the packed key never lets steps of two runs interleave.
    assert step_key(7, 999) < step_key(8, 0)
    assert core.to_us(0.1) == 100_000 and core.to_us(1e-7) == 0


def test_the_step_key_packing_is_defined_only_in_the_core() -> None:
    # issue 14 §1: `_STEP_KEY` used to be defined in both sim/engine.py and sim/model.py.
    for name in (
        "brokers/mediator.py",
        "brokers/model.py",
        "platform/driver.py",
        "platform/measure.py",
    ):
        tree = ast.parse((ROOT / "sim" / name).read_text("utf-8"))
        assigned = {
            t.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign | ast.AnnAssign)
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Name)
        }
        assert not assigned & {"_STEP_KEY", "STEP_KEY", "US"}, name
        assert "4096" not in (ROOT / "sim" / name).read_text("utf-8"), name


def test_the_event_queue_owns_its_heap() -> None:
    """Issue 26: the loop is the core's (`EventQueue.events`); nothing outside sim/platform/core.py
    reads the heap or its sequence counter (the driver used to push tuples it built itself)."""
    found = []
    for path in sorted((ROOT / "sim").rglob("*.py")):
        if path == ROOT / "sim" / "platform" / "core.py":
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("_heap", "_seq"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert found == []


def test_the_loop_pops_in_order_and_stops_after_the_end() -> None:
    q = core.EventQueue()
    seen: list[tuple[int, int, int]] = []
    for t, cls, key in [(5, core.ARRIVAL, 0), (5, core.RESULT, 1), (9, core.ADVERT, 0)]:
        q.push(t, cls, key, seen.append, (t, cls, key))
    q.push(12, core.MARK, 0, seen.append, "after the end")
    for _t, _cls, _key, _seq, action, arg in q.events(end=10):
        action(arg)
        if arg == (5, core.RESULT, 1):  # an action may push while the loop runs
            q.push(7, core.FLEET, 0, seen.append, (7, core.FLEET, 0))
    assert seen == [
        (5, core.RESULT, 1),
        (5, core.ARRIVAL, 0),
        (7, core.FLEET, 0),
        (9, core.ADVERT, 0),
    ]
    assert [ev[0] for ev in q.queued()] == [12] and len(q) == 1  # after the end: left queued
    assert [ev[0] for ev in q.events()] == [12] and len(q) == 0  # no end: until none is left
