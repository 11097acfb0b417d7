"""docs/design.md §6 "Sweeps remember", against the reference: every answer the memo gives back
for a new fleet is the answer the matcher computes from scratch on that fleet.

Random fleets change between two sweeps the ways the wake points change them — a node released
or taken (wakes 1–4), its drain lifted or set (6), a node back or gone (5, 7, 3), new
capabilities (9) — and the kept answers are compared with fresh matches, class by class.
"""

from __future__ import annotations

import dataclasses
import random

from mediator.core.match import AdvertIndex, Reject, match
from mediator.core.rows import FleetNode
from mediator.flows.fleet import view
from mediator.flows.sweep import SweepMemo, snapshot

BOARDS = ["a", "b", "c", "d"]


def answers(fleet, needs, max_width):
    adverts, busy, draining = view(fleet)
    index = AdvertIndex(adverts)
    return {k: match(n, index, busy | draining, max_width) for k, n in needs.items()}


def caps(rng):
    out = {"board": rng.choice(BOARDS)}
    if rng.random() < 0.5:
        out["usb"] = rng.choice([True, 1, "yes"])  # JSON types kept apart (§4)
    return out


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


def test_kept_answers_equal_fresh_matches_after_every_kind_of_fleet_change():
    rng = random.Random(25)
    kept_total = 0
    for _ in range(400):
        fleet = [FleetNode(f"n{i}", caps(rng), "i1", "", rng.random() < 0.6) for i in range(10)]
        needs = {}
        for k in range(12):
            roles = {f"r{j}": {"board": rng.choice(BOARDS)} for j in range(rng.randint(1, 3))}
            if rng.random() < 0.3:
                roles["r0"]["usb"] = True
            needs[f"c{k}"] = roles
        max_width = rng.randint(1, 3)
        memo = SweepMemo()
        before = answers(fleet, needs, max_width)
        memo.keep(snapshot(fleet), {k: r for k, r in before.items() if isinstance(r, Reject)},
                  max_width)  # fmt: skip
        after_fleet = changed(rng, fleet)
        fresh = answers(after_fleet, needs, max_width)
        kept = memo.recall(snapshot(after_fleet), needs, max_width)
        for key, answer in kept.items():
            assert answer == fresh[key], (key, needs[key])
        kept_total += len(kept)
        # Nothing changed: everything kept comes back.
        assert memo.recall(snapshot(fleet), needs, max_width).keys() == {
            k for k, r in before.items() if isinstance(r, Reject)
        }
        assert memo.recall(snapshot(fleet), needs, max_width + 1) == {}  # another max_width
    assert kept_total > 500  # the memo was put to work, not just emptied
