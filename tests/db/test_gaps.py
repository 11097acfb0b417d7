"""Time you can trust (docs/design.md §13; issue 25 rows 5 and 6): a stall of the Mediator or a
forward jump of the database's clock is given back to adverts and leases like an outage, once
across processes; while a node able to serve a run expired only inside such a gap, the run
queues (202) rather than being refused.

Two clocks, both driven by the test: the database's time of record is the virtual
``ManualClock`` (``mediator_now(at)``), and the Mediator's steady clock is :class:`Steady`, handed
to a :class:`~mediator.flows.gaps.Timekeeper` that ticks only when the test says so. A jump is the
first running ahead of the second; a stall is both running on while the ticker does not tick.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from mediator import Config, Mediator, Outcome
from mediator.flows.gaps import EXPIRED_IN_GAP, TICK_S, Timekeeper
from mediator.store.tx import _GAPS_LOCK as GAPS_LOCK
from tests.db.conftest import ManualClock, advert, contract

pytestmark = pytest.mark.db


class Steady:
    """The Mediator process's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def keep_time(med: Mediator, steady: Steady) -> Timekeeper:
    """A Timekeeper on ``steady`` with no ticker thread (the test ticks)."""
    tk = Timekeeper(med.ctx, steady, ticker=False)
    med.ctx.timekeeper = tk
    return tk


def live_for(seconds: float, clock: ManualClock, steady: Steady, *tks: Timekeeper) -> None:
    """Real time passes normally: both clocks move together and every ticker ticks on time."""
    steps = round(seconds / TICK_S)
    for _ in range(steps):
        clock.advance(TICK_S)
        steady.t += TICK_S
        for tk in tks:
            tk.tick()


def expiry(med: Mediator, node_id: str) -> Any:
    rows = med.query("SELECT expires_at FROM nodes WHERE node_id = %s", (node_id,))
    return rows[0]["expires_at"]


def live(med: Mediator) -> list[str]:
    return sorted(n.node_id for n in med.list_nodes().nodes)


@pytest.fixture
def steady() -> Steady:
    return Steady()


@pytest.fixture
def tk(med: Mediator, steady: Steady) -> Timekeeper:
    return keep_time(med, steady)


@pytest.fixture
def other(dsn: str, clock: ManualClock, config: Config, tmp_path: Any) -> Iterator[Mediator]:
    """A second Mediator process on the same database (a worker of the same server)."""
    m = Mediator.connect(dsn, config=config, clock=clock, records_root=str(tmp_path / "records"))
    yield m
    m.close()


# ---- jumps of the database's clock (issue 25 row 6) --------------------------------------------
def test_a_jump_of_the_database_clock_is_given_back_before_the_reaper_reaps(med, clock, steady, tk):
    """The database host's clock jumps +120 s within 10 s of real time. Without the give-back,
    Y's lease (60 s) is 70 s past its end at the reaper's next pass: run 'held' FAILED/lost, and
    the fleet empty. With it, the reaper's reading of the clock shows the jump first."""
    advert(med, "X")
    advert(med, "Y", board="y")
    assert med.submit(contract("held", dut={"board": "y"})).outcome == Outcome.STARTED
    med.reap()  # the reaper's pass before the jump: its reading of the clock
    live_for(10, clock, steady, tk)
    clock.advance(120)  # 10 s of real time; the database's clock says 130

    report = med.reap()

    assert (report.lost, report.released) == ([], [])
    assert med.get_run("held").state == "RUNNING"
    assert live(med) == ["X", "Y"]
    assert [(g.kind, round(g.given)) for g in tk.noticed] == [("jump", 120)]
    assert med.submit(contract("after", dut={"board": "x"})).outcome == Outcome.STARTED


def test_a_jump_is_noticed_at_the_first_heartbeat_and_the_fleet_never_looks_empty(
    med, clock, steady, tk
):
    """Any reading of the database's clock notices a jump: a heartbeat's new expiry, and the
    fleet listing's observed_at, which lists the nodes again once the jump is given back."""
    advert(med, "X")
    advert(med, "Y", board="y")
    live_for(2, clock, steady, tk)
    clock.advance(120)
    assert live(med) == ["X", "Y"]  # the listing's own reading: given back, then listed
    assert [(g.kind, round(g.given)) for g in tk.noticed] == [("jump", 120)]

    live_for(2, clock, steady, tk)
    clock.advance(120)
    advert(med, "X")  # the heartbeat's reading gives Y the jump back too
    assert live(med) == ["X", "Y"]
    assert [round(g.given) for g in tk.noticed] == [120, 120]


def test_a_normal_period_gives_nothing_back(med, clock, steady, tk):
    """Clocks that move together (within the drift allowance) are no gap: nothing is given back
    and nothing recorded — and a backward jump only makes nodes live longer."""
    advert(med, "X")
    before = expiry(med, "X")
    for real, ahead in ((10, 0), (10, 0.5), (600, 0.5), (10, -50)):
        live_for(real, clock, steady, tk)
        clock.advance(ahead)
        med.reap()
    assert list(tk.noticed) == []
    assert expiry(med, "X") == before
    assert med.query("SELECT count(*) AS n FROM gaps") == [{"n": 0}]


def test_a_jump_seen_by_two_processes_is_given_back_once(med, other, clock, steady, tk):
    """Two Mediator processes on one database (the workers of one server, the reaper), each
    with its own readings, both notice the same jump: the first gives it back, the second finds
    it recorded over an overlapping interval and gives nothing. X got 120 s, not 240 s (and
    not the cap of one TTL from now)."""
    other_tk = keep_time(other, steady)  # another process on the same host: the same clock
    advert(med, "X")
    med.reap()
    live_for(5, clock, steady, tk, other_tk)
    other.reap()  # the second process's reading: 5 s later than the first's
    before = expiry(med, "X")

    live_for(3, clock, steady, tk, other_tk)
    clock.advance(120)
    med.reap()
    other.reap()

    assert expiry(med, "X") == before + timedelta(seconds=120)
    assert [(g.kind, round(g.given)) for g in tk.noticed] == [("jump", 120)]
    assert [(g.kind, round(g.seconds), g.given) for g in other_tk.noticed] == [("jump", 120, 0.0)]
    rows = med.query("SELECT kind, round(seconds) AS s FROM gaps")
    assert rows == [{"kind": "jump", "s": 120}]


def test_a_jump_during_an_outage_and_the_outage_are_both_given_back(med, clock, steady, tk):
    """The database host reboots: 10 s out of reach, and its clock comes back 120 s ahead. The
    reconnect reads the clock first (the jump, measured in the clock as it was), then gives the
    outage back: X gets 130 s. Given the other way round, the outage's "live when it began"
    would be judged on the jumped clock and X would get only the jump."""
    advert(med, "X")
    med.reap()
    before = expiry(med, "X")
    live_for(10, clock, steady, tk)  # the outage: real time passes, nothing lands
    clock.advance(120)
    med._on_reconnect(10.0)
    assert expiry(med, "X") == before + timedelta(seconds=130)
    rows = med.query("SELECT kind, round(seconds) AS s FROM gaps ORDER BY id")
    assert rows == [{"kind": "jump", "s": 120}, {"kind": "outage", "s": 10}]


def test_an_outage_seen_by_two_processes_is_given_back_once(med, other, clock, steady, tk):
    """Both workers lose the database for the same 10 s and reconnect: X gets 10 s, not 20."""
    keep_time(other, steady)
    advert(med, "X")
    before = expiry(med, "X")
    live_for(10, clock, steady, tk)
    med._on_reconnect(10.0)
    other._on_reconnect(10.0)
    assert expiry(med, "X") == before + timedelta(seconds=10)


# ---- stalls of the Mediator (issue 25 row 5) ---------------------------------------------------
def test_a_stall_of_the_mediator_is_given_back_before_a_submit_reads_the_fleet(
    med, clock, steady, tk
):
    """The process stands still 40 s (SIGSTOP) while the database's clock runs on, so X's advert
    (30 s) is past its end when the first request after the stall — a submit — runs before X's
    waiting heartbeat. The ticker has not ticked for 40 s: the submit gives the stall back
    first and starts the run on X (it used to be 422 NO_CANDIDATE, FAILED for good)."""
    advert(med, "X")
    advert(med, "Y", board="y")
    assert med.submit(contract("held", dut={"board": "y"})).outcome == Outcome.STARTED
    live_for(20, clock, steady, tk)
    steady.t += 40
    clock.advance(40)  # the stall: no tick

    sub = med.submit(contract("a", dut={"board": "x"}))

    assert (sub.outcome, sub.body().get("assigned")) == (Outcome.STARTED, {"dut": "X"})
    assert [(g.kind, round(g.given)) for g in tk.noticed] == [("stall", 40)]
    assert med.reap().lost == []  # Y's lease got the stall back as well
    tk.tick()
    tk.settle()
    assert len(tk.noticed) == 1  # given back once


def test_the_reaper_after_a_stall_reaps_nothing_the_stall_expired(med, clock, steady, tk):
    """The reaper's timer fires at once after a stall (its deadline passed meanwhile): it gives
    the stall back before it looks for expired leases."""
    advert(med, "Y", board="y")
    assert med.submit(contract("held", dut={"board": "y"})).outcome == Outcome.STARTED
    steady.t += 70
    clock.advance(70)  # longer than the lease (60 s)
    report = med.reap()
    assert report.lost == []
    assert med.get_run("held").state == "RUNNING"


# ---- queue, don't refuse, while an able node expired inside a gap -------------------------------
def test_a_run_queues_while_an_able_node_expired_only_inside_a_recent_gap(med, clock, steady, tk):
    """X was live when a 10 s stall began and got it back (its advert now ends at t+40), but its
    heartbeats are still late when a submit for it comes at t+41: queued (202, wait reason
    EXPIRED_IN_GAP), not refused; X's next advert promotes it. One advert TTL after the gap,
    the ordinary rule holds again: X, silent since, is gone — 422 NO_CANDIDATE."""
    advert(med, "X")
    live_for(25, clock, steady, tk)
    steady.t += 10
    clock.advance(10)  # a stall of 10 s: X's advert ends at t+30 inside it
    assert tk.settle() == pytest.approx(10)
    live_for(6, clock, steady, tk)  # t+41: X's advert (given back to t+40) has ended

    sub = med.submit(contract("a", dut={"board": "x"}))

    assert sub.outcome == Outcome.QUEUED, sub.body()
    reason = sub.body()["wait_reason"]
    assert (reason["code"], reason["candidates"]) == (EXPIRED_IN_GAP, ["X"])
    live_for(30, clock, steady, tk)  # past the grace: one advert TTL after the gap ended
    late = med.submit(contract("b", dut={"board": "x"}))
    assert (late.outcome, late.body()["reject"]["code"]) == (Outcome.REJECTED, "NO_CANDIDATE")
    advert(med, "X")  # X is back (wake 7): the queued run starts
    assert med.get_run("a").state == "RUNNING"


def test_a_submit_while_an_outage_is_being_given_back_queues_for_a_node_it_expired(
    med, clock, monkeypatch
):
    """Wake 5 with §13: the database answers again, but the reconnect watcher has not given the
    outage back yet, so X — live when the outage began 40 s ago — looks expired. A run X could
    serve queues (EXPIRED_IN_GAP) instead of being refused; a run no node could ever serve is
    refused as always; and an outage that began after X was gone brings X nothing."""
    advert(med, "X")
    clock.advance(45)  # X's advert (30 s) ended 15 s ago, inside the outage
    monkeypatch.setattr(med.store, "open_outage_s", lambda: 40.0)

    sub = med.submit(contract("a", dut={"board": "x"}))
    never = med.submit(contract("b", dut={"board": "z"}))

    assert sub.outcome == Outcome.QUEUED, sub.body()
    reason = sub.body()["wait_reason"]
    assert (reason["code"], reason["candidates"]) == (EXPIRED_IN_GAP, ["X"])
    assert (never.outcome, never.body()["reject"]["code"]) == (Outcome.REJECTED, "NO_CANDIDATE")
    monkeypatch.setattr(med.store, "open_outage_s", lambda: 10.0)  # began after X expired
    late = med.submit(contract("c", dut={"board": "x"}))
    assert (late.outcome, late.body()["reject"]["code"]) == (Outcome.REJECTED, "NO_CANDIDATE")
    monkeypatch.setattr(med.store, "open_outage_s", lambda: None)  # given back, no gap row
    after = med.submit(contract("d", dut={"board": "x"}))
    assert after.outcome == Outcome.REJECTED


def test_an_outage_being_given_back_does_not_hide_an_earlier_gap(
    med, clock, steady, tk, monkeypatch
):
    """Both at once: X expired inside a recent stall, and an outage that began after X was
    already gone is being given back now. The earlier of the two beginnings counts, so the run
    X could serve still queues rather than being refused."""
    advert(med, "X")
    live_for(25, clock, steady, tk)
    steady.t += 10
    clock.advance(10)  # a stall of 10 s: X's advert ends inside it
    assert tk.settle() == pytest.approx(10)
    live_for(6, clock, steady, tk)  # X's advert, given back, has ended
    monkeypatch.setattr(med.store, "open_outage_s", lambda: 0.5)  # began after X was gone

    sub = med.submit(contract("a", dut={"board": "x"}))

    assert sub.outcome == Outcome.QUEUED, sub.body()
    assert sub.body()["wait_reason"]["candidates"] == ["X"]


def test_a_plugin_only_a_node_expired_inside_a_recent_gap_offers_is_not_refused(
    med, clock, steady, tk
):
    """docs/design.md §4 "Actions" with §13: Y (live, busy) can fill the role but offers no
    ``flash``; X, which does, was live when a 10 s stall began and is late since. The submit is
    not refused ``unknown_action`` — X may be back in a moment, as for a missing node — and the
    run queues (Y is busy)."""
    med.advert("X", {"board": "x"}, "i1", actions=["shell", "flash"])
    med.advert("Y", {"board": "x", "y": True}, "i1", actions=["shell"])
    holder = med.submit(contract("holder", dut={"board": "x", "y": True}))
    assert holder.run is not None and holder.run.assigned == {"dut": "Y"}
    live_for(25, clock, steady, tk)
    steady.t += 10
    clock.advance(10)  # a stall of 10 s: both adverts end inside it
    assert tk.settle() == pytest.approx(10)
    live_for(6, clock, steady, tk)
    med.advert("Y", {"board": "x", "y": True}, "i1", actions=["shell"])  # Y is back; X is not
    assert live(med) == ["Y"]
    doc = contract("a", dut={"board": "x"})
    doc["steps"][0].update({"uses": "flash", "with": {"image": "fw.bin"}})

    sub = med.submit(doc)

    assert sub.outcome == Outcome.QUEUED, sub.body()


def test_a_node_that_died_before_the_gap_gets_nothing_back(med, clock, steady, tk):
    """Z's advert ended before the stall began: the stall does not bring it back, and a run only
    Z could serve is refused as before (no queue for a node that was already gone)."""
    advert(med, "Z", board="z")
    live_for(35, clock, steady, tk)  # Z's advert ended at t+30
    steady.t += 10
    clock.advance(10)
    sub = med.submit(contract("z", dut={"board": "z"}))
    assert [g.kind for g in tk.noticed] == ["stall"]
    assert (sub.outcome, sub.body()["reject"]["code"]) == (Outcome.REJECTED, "NO_CANDIDATE")
    assert live(med) == []


# ---- a give-back that fails while the database answers -------------------------------------------
@pytest.fixture
def gaps_lock(dsn: str) -> Iterator[Callable[[], None]]:
    """Another Mediator process giving a gap back: it holds the gaps table's lock
    (``Tx.give_back``) until the test calls the returned release, so this process's give-back
    waits out its ``lock_timeout`` (2 s) and fails — the way a deadlock with a concurrent advert
    ends it too."""
    conn = psycopg.connect(dsn)
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (GAPS_LOCK,))
    yield conn.rollback
    conn.close()


def stall_over_the_lease(med: Mediator, clock: ManualClock, steady: Steady, tk: Timekeeper) -> None:
    """Y runs "held"; X is idle; then the process stands still 70 s: both adverts (30 s) and
    the lease (60 s) end inside the stall."""
    advert(med, "X")
    advert(med, "Y", board="y")
    assert med.submit(contract("held", dut={"board": "y"})).outcome == Outcome.STARTED
    live_for(20, clock, steady, tk)
    steady.t += 70
    clock.advance(70)


def test_a_stall_whose_give_back_meets_a_lock_is_kept_and_given_back_as_a_stall(
    med, clock, steady, tk, gaps_lock
):
    """The give-back fails on a lock while the database answers: that is no outage (the store is
    not marked down, nothing is given back as an outage on a reconnect), and the stall is kept
    and given back — as a stall, all 70 s — at the next tick once the lock is gone. It used to be
    dropped, and the lock timeout, taken for an outage, recorded the time as one
    (``tests/e2e/test_time.py`` once found 0 s of ``stall``)."""
    stall_over_the_lease(med, clock, steady, tk)
    assert tk.settle() == 0.0  # waited for the lock, then failed
    assert not med.ctx.store.down
    assert tk.pending_s() == pytest.approx(70)
    gaps_lock()
    tk.tick()
    assert tk.settle() == pytest.approx(70)
    assert tk.pending_s() is None
    rows = med.query("SELECT kind, round(seconds::numeric) AS s FROM gaps ORDER BY noticed_at")
    assert [(r["kind"], int(r["s"])) for r in rows] == [("stall", 70)]
    assert med.reap().lost == []
    assert med.get_run("held").state == "RUNNING"


@pytest.mark.slow  # two more lock waits of 2 s; scripts/test runs it
def test_while_a_stall_is_not_given_back_the_reaper_waits_and_a_submit_queues(
    med, clock, steady, tk, gaps_lock
):
    """While the stall's give-back keeps failing, what the stall expired is not taken for gone:
    the reaper's pass does nothing (as while an outage is given back), and a run that only X —
    expired inside the stall — could serve is queued (EXPIRED_IN_GAP), not refused for good."""
    stall_over_the_lease(med, clock, steady, tk)
    assert med.reap().lost == []  # its settle fails on the lock: the pass waits
    assert med.get_run("held").state == "RUNNING"
    sub = med.submit(contract("a", dut={"board": "x"}))
    assert sub.outcome == Outcome.QUEUED, sub.body()
    assert sub.body()["wait_reason"]["code"] == EXPIRED_IN_GAP
    gaps_lock()
    tk.tick()
    assert tk.settle() == pytest.approx(70, abs=1)
    assert med.reap().lost == []


@pytest.mark.slow  # two lock waits of 2 s; scripts/test runs it
def test_a_stall_whose_give_back_fails_for_one_advert_ttl_is_dropped_and_the_reaper_goes_on(
    med, clock, steady, tk, gaps_lock
):
    """A give-back that keeps failing is not kept for ever: one advert TTL after the stall ended,
    every live node has advertised again (adverts renew leases), so nothing is left to protect,
    and the reaper must not wait any longer (docs/design.md §13)."""
    stall_over_the_lease(med, clock, steady, tk)
    assert tk.settle() == 0.0  # failed on the lock: kept
    assert tk.pending_s() == pytest.approx(70)
    ttl = med.ctx.config.advert_ttl_seconds
    live_for(ttl - 1, clock, steady, tk)  # not yet a TTL since the stall ended: still kept
    assert tk.settle() == 0.0
    assert tk.pending_s() == pytest.approx(70 + ttl - 1)
    live_for(1, clock, steady, tk)  # one TTL: dropped
    assert tk.settle() == 0.0
    assert tk.pending_s() is None
    gaps_lock()
    assert med.query("SELECT kind FROM gaps") == []
    # the reaper waits no more: the run whose node never advertised again is lost
    assert med.reap().lost == ["held"]
