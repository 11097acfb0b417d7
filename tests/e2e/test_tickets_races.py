"""Races between real processes over one queue folder (docs/performance.md, tickets line).

Six processes released together by one barrier walk the same listing of a few thousand tickets and
try to claim each one – with hard links and with the ``O_CREAT|O_EXCL`` fallback forced – and every
ticket must be won exactly once (seed 001: "동시에 같은 티켓을 본 워커 여섯 중 ... 하나만 이기고").
The reclaimer race has five reclaimers fight over stale ``.wip`` files while their stalled holder
keeps writing late heartbeats: no open ticket may end up carrying a ``session_id``. The trap race
(issue 12 §8) has eight workers dispatch five hundred tickets among planted symlinks and garbage.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from mediator.tickets.frontmatter import Document
from mediator.tickets.names import Lane, parse_name
from mediator.tickets.races import make_tickets, plant_traps, race, reclaim_race, trap_race
from mediator.tickets.store import QueueDir

pytestmark = pytest.mark.e2e

LINK_MODES = [pytest.param(True, id="hard links"), pytest.param(False, id="O_EXCL fallback")]


def lanes(root: Path) -> Counter[Lane | str]:
    """How many files of each kind the folder holds; anything unexpected counts by its name."""
    counts: Counter[Lane | str] = Counter()
    for name in os.listdir(root):
        parsed = parse_name(name, QueueDir(root).suffixes)
        counts[parsed.lane if parsed and parsed.lane else name] += 1
    return counts


@pytest.mark.parametrize("hard_links", LINK_MODES)
def test_six_processes_claim_each_of_two_thousand_tickets_exactly_once(
    tmp_path: Path, hard_links: bool
) -> None:
    """Each win is finished at once, so late racers also meet tickets that are already done."""
    hashes = make_tickets(tmp_path, 2000)
    result = race(tmp_path, workers=6, hard_links=hard_links, finish_each=True)
    assert result.wins == Counter({h: 1 for h in hashes})
    assert lanes(tmp_path) == Counter({Lane.DONE: 2000})
    assert len(result.reports) == 6


def test_six_processes_meet_held_tickets_and_back_off(tmp_path: Path) -> None:
    """Without finishing, every ticket stays .wip: late racers meet EEXIST on every name."""
    hashes = make_tickets(tmp_path, 2500)
    result = race(tmp_path, workers=6, hard_links=True, finish_each=False)
    assert result.wins == Counter({h: 1 for h in hashes})
    assert lanes(tmp_path) == Counter({Lane.IN_PROGRESS: 2500})


@pytest.mark.parametrize("hard_links", LINK_MODES)
def test_racing_reclaimers_never_create_an_assigned_ticket(
    tmp_path: Path, hard_links: bool
) -> None:
    hashes = make_tickets(tmp_path, 300)
    result = reclaim_race(tmp_path, reclaimers=5, hard_links=hard_links)
    assert result.holder_passes >= 1  # late heartbeats really were written during the race
    assert result.wins == Counter({h: 1 for h in hashes})  # each reclaimed by exactly one
    assert lanes(tmp_path) == Counter({Lane.QUEUED: 300})  # and no private files left behind
    for h in hashes:
        doc = Document.parse((tmp_path / f"{h}.md").read_text())
        assert [doc.get(k) for k in ("session_id", "claimed_at", "heartbeat_at")] == [None] * 3
        assert doc.get("failures") == "1"


@pytest.mark.parametrize("hard_links", LINK_MODES)
def test_eight_processes_dispatch_each_valid_ticket_once_among_traps(
    tmp_path: Path, hard_links: bool
) -> None:
    """Issue 12 §8: 500 tickets, a hundred traps among them, eight workers racing.

    Each valid ticket is dispatched exactly once; no trap is ever claimed; every canary outside
    the queue keeps its content and mtime, and nothing new appears beside them.
    """
    queue_root, outside = tmp_path / "queue", tmp_path / "outside"
    queue_root.mkdir()
    outside.mkdir()
    traps = plant_traps(queue_root, outside, 500)
    trap_stats = {name: os.lstat(queue_root / name) for name in traps.planted}
    assert len(traps.planted) == 100 and len(set(traps.planted.values())) == 8

    result = trap_race(queue_root, workers=8, hard_links=hard_links)

    assert len(result.reports) == 8
    assert result.wins == Counter({h: 1 for h in traps.valid})  # no trap among the wins
    for path, (content, mtime_ns) in traps.canaries.items():
        assert (Path(path).read_bytes(), Path(path).stat().st_mtime_ns) == (content, mtime_ns)
    assert sorted(os.listdir(outside)) == sorted(Path(p).name for p in traps.canaries)
    for name, before in trap_stats.items():  # every trap is still exactly what was planted
        after = os.lstat(queue_root / name)
        assert (after.st_ino, after.st_mode, after.st_size, after.st_mtime_ns) == (
            before.st_ino,
            before.st_mode,
            before.st_size,
            before.st_mtime_ns,
        ), name
    expected: Counter[Lane | str] = Counter({Lane.DONE: 500})  # and no private file left
    for name, kind in traps.planted.items():
        lane = {"answer symlink": name, "wip symlink": Lane.IN_PROGRESS}.get(kind, Lane.QUEUED)
        expected[lane] += 1
    assert lanes(queue_root) == expected
