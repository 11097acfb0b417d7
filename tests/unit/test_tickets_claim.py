"""Claim, heartbeat, finish, release and reclaim of one ticket, step by step (tickets.md §1, §5).

Real files in a temporary folder, one process: every interleaving here is written out in order.
The same operations raced by many processes are in tests/e2e/test_tickets_races.py.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from mediator.tickets import claim as claiming
from mediator.tickets.claim import (
    claim,
    finish,
    heartbeat,
    read,
    release,
    start_session,
    still_held,
    write,
)
from mediator.tickets.frontmatter import Document
from mediator.tickets.names import Lane
from mediator.tickets.reclaim import is_stale, reclaim_stale
from mediator.tickets.store import QueueDir, create_ticket, read_snapshot

HOUR = 3600.0


@pytest.fixture(params=[True, False], ids=["hard links", "O_EXCL fallback"])
def queue(request: pytest.FixtureRequest, tmp_path: Path) -> QueueDir:
    return QueueDir(tmp_path, hard_links=request.param)


def names(queue: QueueDir) -> list[str]:
    return sorted(os.listdir(queue.root))


def test_a_claim_renames_the_ticket_and_a_second_claim_loses(queue: QueueDir) -> None:
    h = create_ticket(queue, "Fix it", body="Details.\n")
    text = (queue.root / f"{h}.md").read_text()
    held = claim(queue, h)
    assert held is not None
    assert names(queue) == [f"{h}.wip.md"]
    assert held.path.read_text() == text  # the claim moves the ticket, it does not change it
    assert claim(queue, h) is None  # EEXIST: someone holds it – move on to the next candidate
    assert finish(held)
    assert names(queue) == [f"{h}.done.md"]
    assert claim(queue, h) is None  # nothing open any more


def test_the_fallback_does_not_reclaim_a_ticket_someone_already_finished(tmp_path: Path) -> None:
    """tickets.md §1 (ours): after the exclusive create, the original must still exist.

    The winner finished and renamed its .wip away, so our O_EXCL create of the .wip name succeeds;
    only the re-check stops us from running a finished ticket a second time.
    """
    queue = QueueDir(tmp_path, hard_links=False)
    h = create_ticket(queue, "Once only")
    winner = claim(queue, h)
    assert winner is not None and finish(winner)
    assert claim(queue, h) is None
    assert names(queue) == [f"{h}.done.md"]  # and our copy was removed again


def test_a_link_to_a_finished_inode_is_not_a_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by our races: link() looks the source up, then creates the target, not atomically.

    A worker that looked up <hash>.md just before the winner removed it can create <hash>.wip.md
    after the winner has finished. We replay that interleaving: our link lands on the finished
    inode. The claim must notice that <hash>.md is gone and let go.
    """
    queue = QueueDir(tmp_path)
    h = create_ticket(queue, "Race")
    winner = claim(queue, h)
    assert winner is not None
    looked_up = tmp_path / "looked-up"
    os.link(winner.path, looked_up)  # what our lookup found: the inode of the open ticket
    assert finish(winner)

    real_link = os.link
    # Our pre-link check (a plain file, one name) ran before the winner removed <hash>.md.
    monkeypatch.setattr(claiming, "_plain_file", lambda _path: True)
    monkeypatch.setattr(claiming.os, "link", lambda _src, dst, **_: real_link(looked_up, dst))
    assert claim(queue, h) is None
    os.unlink(looked_up)
    assert names(queue) == [f"{h}.done.md"]


def test_without_hard_links_the_claim_falls_back_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")  # as on FUSE and SMB mounts

    queue = QueueDir(tmp_path)
    h = create_ticket(queue, "On a mount")
    monkeypatch.setattr(claiming.os, "link", refuse)
    monkeypatch.setattr("mediator.tickets.store.os.link", refuse)
    held = claim(queue, h)
    assert held is not None and names(queue) == [f"{h}.wip.md"]
    assert release(held, read(held))
    assert names(queue) == [f"{h}.md"]


def test_the_fallback_is_forced_by_the_environment(tmp_path: Path) -> None:
    assert QueueDir.from_env(tmp_path, {"TICKET_NO_HARDLINKS": "1"}).hard_links is False
    assert QueueDir.from_env(tmp_path, {"TICKET_NO_HARDLINKS": "0"}).hard_links is True


def test_a_session_writes_its_keys_and_heartbeats_only_move_the_timestamp(queue: QueueDir) -> None:
    h = create_ticket(queue, "Long job")
    held = claim(queue, h)
    assert held is not None
    start_session(held, "w1-1", now=1_700_000_000.0)
    with open(held.path, "a") as log:  # the session's command appends to its progress log
        log.write("step 1 done\n")
    heartbeat(held, now=1_700_000_060.0)
    doc = Document.parse(held.path.read_text())
    assert doc.get("session_id") == "w1-1"
    assert doc.get("claimed_at") == "2023-11-14T22:13:20.000000Z"
    assert doc.get("heartbeat_at") == "2023-11-14T22:14:20.000000Z"
    assert doc.body == "step 1 done\n"
    assert finish(held, log="done", now=1_700_000_120.0)
    assert (
        queue.path(h, Lane.DONE)
        .read_text()
        .endswith("step 1 done\n\n## Progress log\n\n- 2023-11-14T22:15:20.000000Z done\n")
    )


def test_release_puts_the_ticket_back_without_engine_keys(queue: QueueDir) -> None:
    h = create_ticket(queue, "Asks")
    held = claim(queue, h)
    assert held is not None
    doc = start_session(held, "w1-2", now=time.time()).set("question", "Which colour?")
    assert release(held, doc)
    assert names(queue) == [f"{h}.md"]
    reopened = Document.parse(queue.path(h, Lane.QUEUED).read_text())
    assert reopened.get("question") == "Which colour?"
    assert [k for k in ("session_id", "claimed_at", "heartbeat_at") if reopened.get(k)] == []


def test_staleness_uses_the_heartbeat_or_the_ctime_whichever_is_later() -> None:
    assert not is_stale(None, changed_at=1000.0, now=1500.0, ttl=600.0)
    assert is_stale(None, changed_at=1000.0, now=1601.0, ttl=600.0)
    assert not is_stale(1500.0, changed_at=1000.0, now=1601.0, ttl=600.0)


def test_a_fresh_claim_is_not_reclaimed_although_its_mtime_is_old(queue: QueueDir) -> None:
    """tickets.md §5: a hard link keeps the original's mtime; only ctime tells the claim is new."""
    h = create_ticket(queue, "Old file")
    an_hour_ago = time.time() - HOUR
    os.utime(queue.path(h, Lane.QUEUED), (an_hour_ago, an_hour_ago))
    held = claim(queue, h)
    assert held is not None
    assert reclaim_stale(queue, ttl=600.0) == []
    assert names(queue) == [f"{h}.wip.md"]
    write(held, read(held))  # keep the test honest: the claim is alive and untouched


def test_a_stalled_worker_cannot_finish_or_heartbeat_a_reclaimed_ticket(queue: QueueDir) -> None:
    """tickets.md §1 and §5, replayed in order: stall, reclaim, re-claim, wake up."""
    h = create_ticket(queue, "Stalls")
    stalled = claim(queue, h)
    assert stalled is not None
    start_session(stalled, "old-session", now=time.time())

    [reclaimed] = reclaim_stale(queue, ttl=600.0, now=time.time() + HOUR)
    assert (reclaimed.hash, reclaimed.session_id) == (h, "old-session")
    reopened = Document.parse(queue.path(h, Lane.QUEUED).read_text())
    assert reopened.get("session_id") is None and reopened.get("failures") == "1"

    # Late heartbeats land on the orphaned inode, never on the open ticket (reason 4 of §4).
    heartbeat(stalled, now=time.time())
    write(stalled, read(stalled).set("session_id", "old-session"))
    assert Document.parse(queue.path(h, Lane.QUEUED).read_text()).get("session_id") is None

    fresh = claim(queue, h)
    assert fresh is not None
    start_session(fresh, "new-session", now=time.time())
    assert not finish(stalled)  # the .wip is another inode now: the old worker must not finish it
    assert names(queue) == [f"{h}.wip.md"]
    assert finish(fresh)
    assert names(queue) == [f"{h}.done.md"]


def test_the_reclaimer_only_looks_at_wip_files(queue: QueueDir) -> None:
    """Seed 001: an "assigned" open ticket is not reclaimed – which is why the bell lists it."""
    h = create_ticket(queue, "Copied")
    path = queue.path(h, Lane.QUEUED)
    path.write_text(
        path.read_text().replace("kind: ticket", "kind: ticket\nsession_id: typed-by-hand")
    )
    before = path.read_bytes()
    assert reclaim_stale(queue, ttl=0.0, now=time.time() + HOUR) == []
    assert path.read_bytes() == before


def test_the_snapshot_prefers_the_later_lane_while_a_claim_is_half_done(tmp_path: Path) -> None:
    queue = QueueDir(tmp_path)
    h = create_ticket(queue, "Half")
    os.link(queue.path(h, Lane.QUEUED), queue.path(h, Lane.IN_PROGRESS))  # link made, no unlink yet
    [ticket] = read_snapshot(queue).tickets
    assert ticket.lane is Lane.IN_PROGRESS


def test_a_wip_written_to_after_it_was_judged_stale_is_put_back(tmp_path: Path) -> None:
    """The reclaimer judges again once it holds the file: a live holder's write moves mtime."""
    queue = QueueDir(tmp_path)
    h = create_ticket(queue, "Alive after all")
    held = claim(queue, h)
    assert held is not None
    later = time.time() + 3 * HOUR  # the write our re-check sees
    os.utime(held.path, (later, later))
    inode = os.stat(held.path).st_ino
    assert reclaim_stale(queue, ttl=600.0, now=time.time() + HOUR) == []
    assert names(queue) == [f"{h}.wip.md"] and os.stat(held.path).st_ino == inode
    assert finish(held)


def test_the_reclaimer_leaves_a_conflict_as_it_found_it(tmp_path: Path) -> None:
    """Someone re-created the open file while the .wip was held: nothing is overwritten."""
    queue = QueueDir(tmp_path)
    h = create_ticket(queue, "Twice")
    held = claim(queue, h)
    assert held is not None
    queue.path(h, Lane.QUEUED).write_text("---\ntitle: re-created by hand\n---\n")
    assert reclaim_stale(queue, ttl=600.0, now=time.time() + HOUR) == []
    assert names(queue) == [f"{h}.md", f"{h}.wip.md"]
    assert still_held(held)
    finish(held)
