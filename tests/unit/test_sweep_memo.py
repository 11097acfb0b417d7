"""docs/design.md §6 "Sweeps remember", against references: the answers the memo keeps for a new
fleet are the answers the matcher computes from scratch on that fleet; the classes a changed node
can serve, found through the index, are those a check of every class finds; and the classes held
follow the reads — an older read never takes a waiting class away.

Random fleets change between two sweeps the ways the wake points change them — a node released
or taken (wakes 1–4), its drain lifted or set (6), a node back or gone (5, 7, 3), new
capabilities (9) — while classes arrive and leave, and the kept answers are compared with fresh
matches, class by class.
"""

from __future__ import annotations

import dataclasses
import random

from mediator.core.capabilities import satisfies
from mediator.core.match import ALL_BUSY, NO_CANDIDATE, AdvertIndex, ClassIndex, match
from mediator.core.rows import FleetNode
from mediator.flows.fleet import view
from mediator.flows.sweep import SweepMemo, snapshot
from mediator.store.tx import SweepHead

BOARDS = ["a", "b", "c", "d"]


def answers(fleet, needs, max_width):
    adverts, busy, draining = view(fleet)
    index = AdvertIndex(adverts)
    return {k: match(n, index, busy | draining, max_width) for k, n in needs.items()}


def caps(rng):
    out: dict = {"board": rng.choice([*BOARDS, BOARDS[:2]])}  # a list capability: any member
    if rng.random() < 0.5:
        out["usb"] = rng.choice([True, 1, 1.0, "yes", False, 0])  # JSON types kept apart (§4)
    return out


def role_needs(rng):
    need = {"board": rng.choice(BOARDS)} if rng.random() < 0.9 else {}
    if rng.random() < 0.3:
        need["usb"] = rng.choice([True, 1, "yes", False])
    return need


def classes(rng, n, start=0):
    return {
        f"c{k}": {f"r{j}": role_needs(rng) for j in range(rng.randint(1, 3))}
        for k in range(start, start + n)
    }


def changed(rng, fleet):
    nodes = {n.node_id: n for n in fleet}
    for _ in range(rng.randint(0, 3)):
        kind = rng.choice(["busy", "drain", "caps", "gone", "back"])
        if kind == "back" or not nodes:
            i = f"n{rng.randint(0, 15)}"
            nodes[i] = FleetNode(i, caps(rng), "i1", "", rng.random() < 0.5)
            continue
        n = nodes[rng.choice(sorted(nodes))]
        if kind == "busy":
            nodes[n.node_id] = dataclasses.replace(n, busy=not n.busy)
        elif kind == "drain":
            nodes[n.node_id] = dataclasses.replace(n, drain="" if n.drain else "soon")
        elif kind == "caps":
            nodes[n.node_id] = dataclasses.replace(n, capabilities=caps(rng))
        else:
            del nodes[n.node_id]
    return sorted(nodes.values(), key=lambda n: n.node_id)


def plan(memo, first, max_width):
    adverts, busy, draining = view(first.fleet)
    return memo.plan(first, snapshot(first.fleet), AdvertIndex(adverts), busy | draining, max_width)


def read(fleet, rows, mark, since=None, full=False):
    """A sweep_head read as the store returns it: ``rows`` (key, needs or None)."""
    return SweepHead(list(rows), fleet, [], since, mark, full, True)


def test_kept_answers_equal_fresh_matches_after_every_kind_of_fleet_and_queue_change():
    rng = random.Random(25)
    kept_total = 0
    for _ in range(400):
        fleet = [FleetNode(f"n{i}", caps(rng), "i1", "", rng.random() < 0.6) for i in range(10)]
        waiting = classes(rng, 12)
        max_width = rng.randint(1, 3)
        memo = SweepMemo()
        first = plan(memo, read(fleet, waiting.items(), mark=10, full=True), max_width)
        assert first.matched == len(waiting) and first.remembered == 0
        # Between the sweeps: the fleet changes, some classes leave, some arrive.
        after_fleet = changed(rng, fleet)
        gone = rng.sample(sorted(waiting), rng.randint(0, 3))
        new = classes(rng, rng.randint(0, 3), start=100)
        delta = [(k, None) for k in gone] + list(new.items())
        for k in gone:
            del waiting[k]
        waiting.update(new)
        second = plan(memo, read(after_fleet, delta, mark=11, since=10), max_width)
        fresh = answers(after_fleet, waiting, max_width)
        for key in waiting:  # every class holds the answer the matcher gives from scratch
            assert memo.answer(key) == fresh[key], (key, waiting[key])
        for key in gone:
            assert memo.answer(key) is None
        # A long-lived process sees many classes come and go: what it holds is only what waits
        # (its class index included), so its memory follows the queue, not the history.
        assert len(memo._index) == len(memo._needs) == len(waiting)
        # The classes worth walking for: exactly those not refused for the whole sweep.
        assert second.needs.keys() == {
            k for k, r in fresh.items() if getattr(r, "code", None) not in (ALL_BUSY, NO_CANDIDATE)
        }
        assert second.classes == len(waiting)
        assert second.matched + second.remembered == len(waiting)
        kept_total += second.remembered
        # Nothing changed: nothing is matched again.
        again = plan(memo, read(after_fleet, [], mark=12, since=11), max_width)
        assert (again.matched, again.remembered) == (0, len(waiting))
        # Another max_width: everything is matched again.
        other = plan(memo, read(after_fleet, [], mark=13, since=12), max_width + 1)
        assert other.matched == len(waiting)
    assert kept_total > 2_000  # the memo was put to work, not just emptied


def test_the_index_finds_exactly_the_classes_a_changed_node_can_serve():
    """ClassIndex.touched against a check of every class with ``satisfies``, while classes are
    filed and forgotten (a need no class asks any more leaves the index)."""
    rng = random.Random(6)
    index, filed = ClassIndex(), {}
    for step in range(1_000):
        if filed and rng.random() < 0.4:
            key = rng.choice(sorted(filed))
            index.remove(key)
            del filed[key]
        else:
            key = f"k{step}"
            filed[key] = {f"r{j}": role_needs(rng) for j in range(rng.randint(0, 3))}
            index.add(key, filed[key])
        nodes = [caps(rng) for _ in range(rng.randint(1, 2))]
        brute = {
            k for k, roles in filed.items()
            if any(satisfies(need, c) for need in roles.values() for c in nodes)
        }  # fmt: skip
        assert index.touched(nodes) == brute
        assert len(index) == len(filed)
    for key in list(filed):
        index.remove(key)
    assert index.touched([{"board": "a", "usb": True}]) == set() and len(index) == 0


FLEET = [FleetNode("n0", {"board": "a"}, "i1", "", True)]
NEEDS = {"r": {"board": "a"}}


def test_a_read_older_than_the_mark_only_adds_classes_and_never_moves_it_back():
    """Two threads of one process sweep side by side: the read that finishes second may be the
    older one. It may add classes (they waited when it read), never take one away or move the
    mark back — else a class queued between the two reads could be missed (§6)."""
    memo = SweepMemo()
    plan(memo, read(FLEET, [("a", NEEDS), ("b", NEEDS)], mark=10, full=True), 3)
    assert memo.mark == 10
    newer = plan(memo, read(FLEET, [("a", None)], mark=14, since=10), 3)  # a left
    assert newer.classes == 1 and memo.mark == 14
    older = plan(memo, read(FLEET, [("b", None), ("c", NEEDS)], mark=12, since=10), 3)
    assert older.classes == 2 and memo.mark == 14  # c added; b kept; the mark stays
    assert memo.answer("b") is not None and memo.answer("c") is not None
    full_older = plan(memo, read(FLEET, [], mark=13, full=True), 3)  # an older whole read
    assert full_older.classes == 2 and memo.mark == 14
    emptied = plan(memo, SweepHead([], [], [], 14, 15, False, False), 3)  # nothing QUEUED
    assert emptied.classes == 0 and memo.mark == 15 and memo.answer("c") is None
    # The database's ids went back (one restored from a backup): the store read every class,
    # and that read starts the marks afresh instead of only adding forever.
    plan(memo, read(FLEET, [("d", NEEDS)], mark=15, since=15), 3)
    rewound = plan(memo, read(FLEET, [("e", NEEDS)], mark=3, since=15, full=True), 3)
    assert rewound.classes == 1 and memo.mark == 3 and memo.answer("d") is None


def test_a_class_that_came_and_went_while_no_node_was_free_is_not_matched_later():
    """§6: a class learnt while every node was busy (so not matched) and gone before a node
    came free must leave the memo whole — the next sweep with a free node matches exactly the
    classes that wait, and does not fail on one that left (a failed wake is R16's, and this one
    would fail again at every wake while the memo held the stale class)."""
    busy = [FleetNode("n0", {"board": "a"}, "i1", "", True)]
    free = [FleetNode("n0", {"board": "a"}, "i1", "", False)]
    here, gone = {"r": {"board": "a"}}, {"r": {"board": "b"}}
    memo = SweepMemo()
    first = plan(memo, read(free, [("c0", here)], mark=10, full=True), 1)
    assert first.matched == 1  # a sweep with a free node: the memo holds answers for a fleet
    came = memo.plan(read(busy, [("c1", gone)], mark=11, since=10), None, None, set(), 1)
    went = memo.plan(read(busy, [("c1", None)], mark=12, since=11), None, None, set(), 1)
    assert (came.classes, went.classes) == (2, 1)  # learnt and dropped, never matched
    later = plan(memo, read(free, [], mark=13, since=12), 1)
    assert (later.classes, set(later.needs), memo.answer("c1")) == (1, {"c0"}, None)
    assert memo.answer("c0") == answers(free, {"c0": here}, 1)["c0"]
