"""WakeQueued and promote (docs/design.md §6; seed 000 R6–R13, R16, R17; I1, I3, I5, I7).

Each test builds its queue through the real flows. Where a queue must exist beside free nodes
without a wake having run (so the sweep under test is the one that moves it), nodes are made
available by a direct SQL update that no flow performs — clearing a drain flag without an advert.
"""

from __future__ import annotations

import threading

import pytest

import mediator.flows.sweep as sweep_flow
from mediator import Config, ConfigError, Mediator, Outcome
from mediator.store.tx import SweepHead, Tx
from tests.db.conftest import advert, contract


def sql(med, statement, *params):
    with med.store.autocommit() as tx:
        cur = tx.conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def undrain_quietly(med, *nodes):
    """Make nodes available without an advert, so no wake runs (the sweep under test will)."""
    sql(med, "UPDATE nodes SET drain = '' WHERE node_id = ANY(%s)", list(nodes))


def finish(med, run_id, node_id, outcome="pass"):
    step = next(s for s in med.work(node_id) if s.run_id == run_id)
    claimed = med.claim(run_id, step.seq, node_id)
    return med.report(run_id, step.seq, node_id, claimed.attempt, outcome)


def states(med, *run_ids):
    return [med.get_run(r).state for r in run_ids]


# ---- docs/design.md §7, internal/store/queue_test.go ----


def test_wake_on_an_empty_queue_does_nothing(med):
    """docs/design.md §7: WakeQueued on an empty queue does nothing (and costs one query, R13)."""
    advert(med, "X")
    report = med.wake_queued()
    assert report.promoted == [] and report.classes == 0


def test_wake_moves_a_matching_run_to_running_with_lease_steps_and_assigned(med):
    """docs/design.md §7: lease, steps.node_id and assigned are all set by one promotion (R12)."""
    advert(med, "X", drain="graceful")
    assert med.submit(contract("q", steps=2)).outcome == Outcome.QUEUED
    undrain_quietly(med, "X")
    assert med.wake_queued().promoted == ["q"]
    run = med.get_run("q")
    assert run.state == "RUNNING" and run.assigned == {"dut": "X"}
    assert [s.node_id for s in run.steps] == ["X", "X"]
    assert all(s.chosen["node"] == "X" for s in run.steps)
    with med.store.autocommit() as tx:
        assert tx.run_leases("q")[0].node_id == "X"


def test_wake_keeps_arrival_order_between_runs_competing_for_one_node(med, clock):
    """docs/design.md §7 / I7: of two runs wanting the same node, the earlier goes first."""
    advert(med, "X", drain="graceful")
    med.submit(contract("z-first"))
    clock.advance(1)
    med.submit(contract("a-second"))  # later, although its run_id sorts first
    undrain_quietly(med, "X")
    assert med.wake_queued().promoted == ["z-first"]
    assert states(med, "z-first", "a-second") == ["RUNNING", "QUEUED"]


def test_wake_sends_a_later_run_when_the_head_cannot_go(med, clock):
    """R6 / docs/design.md §7: the head waits for a busy board; a later run wanting something else
    goes. Never stop at the head."""
    advert(med, "B", board="rare")
    advert(med, "S", drain="graceful", scope=True)
    med.submit(contract("holder", dut={"board": "rare"}))
    clock.advance(1)
    med.submit(contract("head", dut={"board": "rare"}))
    clock.advance(1)
    med.submit(contract("later", bench={"scope": True}))
    undrain_quietly(med, "S")
    assert med.wake_queued().promoted == ["later"]
    assert states(med, "head", "later") == ["QUEUED", "RUNNING"]


def test_wake_twice_is_the_same_as_once(med):
    """R9 / docs/design.md §7: reentrant — a second sweep finds nothing more to do."""
    for n in ("X", "Y"):
        advert(med, n, drain="graceful")
    for r in ("a", "b", "c"):
        med.submit(contract(r))
    undrain_quietly(med, "X", "Y")
    assert med.wake_queued().promoted == ["a", "b"]
    assert med.wake_queued().promoted == []
    assert states(med, "a", "b", "c") == ["RUNNING", "RUNNING", "QUEUED"]


def test_wake_never_sends_to_a_draining_node(med):
    """docs/design.md §7 / FR-11: a draining node is unavailable to the sweep."""
    advert(med, "X", drain="graceful")
    med.submit(contract("q"))
    assert med.wake_queued().promoted == []
    assert med.get_run("q").state == "QUEUED"


def test_wake_with_lease_ttl_0_errors_before_anything(dsn, clock, tmp_path):
    """R11 / docs/design.md §7 'WakeQueued errors with LeaseTTL 0': no silent endless leases."""
    cfg = Config.unchecked(lease_ttl_seconds=0)
    med = Mediator.connect(dsn, cfg, clock, records_root=str(tmp_path), startup_wake=False)
    try:
        advert(med, "X", drain="graceful")
        med.submit(contract("q"))
        undrain_quietly(med, "X")
        with pytest.raises(ConfigError) as e:
            med.wake_queued()
        assert e.value.field == "lease_ttl_seconds"
        assert e.value.message == (
            "lease_ttl_seconds must be greater than 0 to promote queued runs (R11).")  # fmt: skip
        assert med.get_run("q").state == "QUEUED"
    finally:
        med.close()


@pytest.mark.parametrize("ttl", [1, 0.5])
def test_any_lease_ttl_above_0_promotes(dsn, clock, tmp_path, ttl):
    """R11 refuses only a TTL that never expires a lease (≤ 0); a short one is a user's choice."""
    med = Mediator.connect(dsn, Config(lease_ttl_seconds=ttl), clock, records_root=str(tmp_path))
    try:
        advert(med, "X", drain="graceful")
        med.submit(contract("q"))
        undrain_quietly(med, "X")
        assert med.wake_queued().promoted == ["q"]
    finally:
        med.close()


def test_a_run_left_queued_as_too_wide_says_so_in_the_log(dsn, clock, tmp_path, caplog):
    """R10: a run the sweep leaves QUEUED because it is too wide with the nodes free now is
    logged with its id and the matcher's reason (an operator's answer to "why does it wait?")."""
    med = Mediator.connect(dsn, Config(max_width=1), clock, records_root=str(tmp_path))
    try:
        med.advert("N1", {"a": True, "b": True}, "i")
        med.advert("N2", {"a": True}, "i")
        med.advert("N3", {"b": True}, "i")
        med.submit(contract("hold", r1={"a": True, "b": True}))
        med.submit(contract("q", r1={"a": True}, r2={"b": True}))
        with caplog.at_level("INFO", logger="mediator"):
            assert med.wake_queued().too_wide == ["q"]
        assert "run q stays queued: No choice of nodes fills the run's roles with at most 1 " in (
            caplog.text)  # fmt: skip
    finally:
        med.close()


def test_config_refuses_a_lease_ttl_of_0_for_users():
    with pytest.raises(ConfigError) as e:
        Config(lease_ttl_seconds=0)
    assert e.value.field == "lease_ttl_seconds"


def test_r6_a_sweep_walks_a_queue_of_several_pages_once_each_in_order(dsn, clock, tmp_path):
    """R6 over pages (docs/design.md §6): past its head (HEAD_PAGE runs, read with the classes) a
    sweep reads the queue in pages from where the last one ended, in (created_at, run_id) order —
    runs queued at the same instant included. 140 runs that stay QUEUED (TOO_WIDE at promotion:
    the node that serves both roles is busy) are each examined exactly once, in arrival order."""
    med = Mediator.connect(dsn, Config(max_width=1), clock, records_root=str(tmp_path))
    try:
        med.advert("N1", {"a": True, "b": True}, "i")
        med.advert("N2", {"a": True}, "i")
        med.advert("N3", {"b": True}, "i")
        assert med.submit(contract("hold", r1={"a": True, "b": True})).outcome == Outcome.STARTED
        wide = {"r1": {"a": True}, "r2": {"b": True}}
        ids = [f"q{i:03}" for i in range(2 * sweep_flow.HEAD_PAGE + 12)]  # three pages and more
        for run_id in ids:  # the same instant: the queue's order is the run_id's
            assert med.submit(contract(run_id, **wide)).outcome == Outcome.QUEUED
        report = med.wake_queued()
        assert (report.too_wide, report.examined, report.promoted) == (ids, len(ids), [])
    finally:
        med.close()


def test_promotion_leaves_a_too_wide_run_queued(dsn, clock, tmp_path):
    """R10 / docs/design.md §7: width over the cap at promotion is not permanent — it depends on
    which nodes are free — so the run stays QUEUED, and goes once folding makes it narrow."""
    med = Mediator.connect(dsn, Config(max_width=1), clock, records_root=str(tmp_path))
    try:
        # N1 serves both roles; N2 only r1; N3 only r2. Folding onto N1 gives width 1.
        med.advert("N1", {"a": True, "b": True}, "i")
        med.advert("N2", {"a": True}, "i")
        med.advert("N3", {"b": True}, "i")
        wide = {"r1": {"a": True}, "r2": {"b": True}}
        h1 = med.submit(contract("h1", r1={"a": True}, r2={"b": True}))
        assert h1.outcome == Outcome.STARTED  # on N1
        assert med.submit(contract("h2", r1={"a": True})).outcome == Outcome.STARTED  # on N2
        q = med.submit(contract("q", **wide))
        # r1: N1, N2 both busy → ALL_BUSY
        assert (q.outcome, q.run.state) == (Outcome.QUEUED, "QUEUED")
        assert med.submit(contract("q2", **wide)).outcome == Outcome.QUEUED  # the same class
        finish(med, "h2", "N2")  # N2 frees: r1 → N2, r2 → N3: width 2 > 1 → TOO_WIDE
        assert med.get_run("q").state == "QUEUED"
        report = med.wake_queued()
        assert report.too_wide == ["q", "q2"]
        # §6: one class, decided once per sweep while nothing changed (q2 reuses q's answer)
        assert report.matched <= 1
        for seq_node in ("N1", "N1"):
            finish(med, "h1", seq_node)  # N1 frees: both roles fold onto N1, width 1
        run = med.get_run("q")
        assert run.state == "RUNNING" and run.assigned == {"r1": "N1", "r2": "N1"}
        assert med.get_run("q2").state == "QUEUED"  # N1 is q's now; N2 + N3 are too wide
    finally:
        med.close()


def test_create_queued_run_makes_no_lease_and_inserts_every_step_pending_unassigned(med):
    """docs/design.md §7 / R4 / I3: CreateQueuedRun holds nothing and has every step from submit."""
    advert(med, "X")
    med.submit(contract("a"))
    run = med.submit(contract("q", steps=3)).run
    assert [(s.state, s.node_id) for s in run.steps] == [("PENDING", "")] * 3
    assert sql(med, "SELECT count(*) FROM leases WHERE run_id = 'q'") == [(0,)]
    assert sql(med, "SELECT count(*) FROM asks WHERE run_id = 'q'") == [(0,)]


def test_cancel_after_create_queued_run_fails_it_and_seals(med):
    """design.md §7: cancel while QUEUED → FAILED/cancelled, and the record reaches its seal."""
    advert(med, "X")
    med.submit(contract("a"))
    med.submit(contract("q"))
    run = med.cancel("q")
    assert (run.state, run.verdict) == ("FAILED", "cancelled")
    assert [s.state for s in run.steps] == ["SKIPPED"]
    assert med.records.verify("q").ok


# ---- wake points that live in this issue ----


def test_r13_a_result_promotes_a_waiting_run_synchronously(med):
    """R13 / docs/design.md §7 'postResult 뒤에 대기 Run 이 RUNNING': no sleep, no retry."""
    advert(med, "X")
    med.submit(contract("a"))
    med.submit(contract("b"))
    finish(med, "a", "X")
    assert med.get_run("b").state == "RUNNING"


def test_a_cancel_promotes_a_waiting_run(med):
    """docs/design.md §7 'postCancel 뒤에 대기 Run 이 RUNNING' (wake 2)."""
    advert(med, "X")
    med.submit(contract("a"))
    med.submit(contract("b"))
    med.cancel("a")
    assert med.get_run("b").state == "RUNNING"


def test_startup_wakes_the_queue_once(dsn, clock, tmp_path, monkeypatch):
    """docs/design.md §7 cmd/mediator: the startup path calls WakeQueued once (wake 5)."""
    med = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path))
    advert(med, "X", drain="graceful")
    med.submit(contract("q"))
    undrain_quietly(med, "X")
    med.close()
    calls = []
    original = sweep_flow.wake_queued

    def counting(ctx, first=None, guard=None):
        calls.append(1)
        return original(ctx, first, guard)

    monkeypatch.setattr(sweep_flow, "wake_queued", counting)
    med = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path))
    monkeypatch.undo()
    try:
        assert len(calls) == 1
        assert med.get_run("q").state == "RUNNING"
    finally:
        med.close()


def test_r16_a_failing_wake_changes_neither_status_nor_body(med, monkeypatch, caplog):
    """R16: the sweep fails; submit and the result still answer as if it had not run."""
    advert(med, "X")
    med.submit(contract("a"))

    def broken(ctx, first=None, guard=None):
        raise RuntimeError("sweep exploded")

    monkeypatch.setattr(sweep_flow, "sweep", broken)
    sub = med.submit(contract("b"))  # R17's guard wake fails here
    assert (sub.outcome, sub.run.state) == (Outcome.QUEUED, "QUEUED")
    result = finish(med, "a", "X")  # wake 1 fails here
    assert result.settled == "PASSED"
    assert med.get_run("b").state == "QUEUED"
    assert "sweep" in caplog.text or "failed" in caplog.text


def test_r16_a_failing_startup_wake_does_not_stop_startup(dsn, clock, tmp_path, monkeypatch):
    def broken(ctx, first=None, guard=None):
        raise RuntimeError("no promotions today")

    monkeypatch.setattr(sweep_flow, "sweep", broken)
    med = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path))
    try:
        advert(med, "X")
        assert med.submit(contract("a")).outcome == Outcome.STARTED  # submit and reads still work
    finally:
        med.close()


# ---- R17: the missed-wake race, as a deterministic interleaving ----


def _missed_wake(dsn, clock, tmp_path, guard):
    """a holds X. b's submit reads the fleet (X busy → ALL_BUSY); exactly then, on another
    connection, a's result commits, releases X and sweeps an empty queue; then b is inserted."""
    med = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path / "m"))
    other = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path / "m"))
    try:
        advert(med, "X")
        med.submit(contract("a"))
        [step] = med.work("X")
        claimed = med.claim("a", step.seq, "X")
        released = []

        def release_in_between(run_id):
            if run_id == "b":
                released.append(other.report("a", step.seq, "X", claimed.attempt, "pass"))

        med._after_fleet_read = release_in_between
        med._missed_wake_guard = guard
        sub = med.submit(contract("b"))
        assert released and released[0].released == ("X",)  # the release did commit in between
        return sub, med.get_run("b").state, med.list_nodes()
    finally:
        med.close()
        other.close()


def test_r17_missed_wake_guard_promotes_a_run_queued_beside_a_released_node(dsn, clock, tmp_path):
    """R17 (ours): after committing a QUEUED run, submit sweeps once more."""
    sub, state_after, _ = _missed_wake(dsn, clock, tmp_path, guard=True)
    assert (sub.outcome, sub.run.state) == (
        Outcome.QUEUED,
        "QUEUED",
    )  # the answer shows the run as committed
    assert state_after == "RUNNING"  # what the guard did shows on the next read


def test_r17_without_the_guard_the_run_waits_beside_a_free_node(dsn, clock, tmp_path):
    """The same interleaving with the guard off: proof that the race is real, so the test above
    can fail."""
    sub, state_after, fleet = _missed_wake(dsn, clock, tmp_path, guard=False)
    assert sub.outcome == Outcome.QUEUED and state_after == "QUEUED"
    [x] = fleet.nodes
    assert x.lease is None  # X is free and live, and b waits anyway


# ---- R17: the guard's first read (docs/design.md R17 "The guard's first read") ----


def test_r17_the_guard_of_a_run_whose_candidates_are_all_busy_reads_nothing_but_the_mark(med):
    """R17: a and c hold X and Y, the only nodes with board x; Z (board z) is free. b waits for
    x, the only class waiting. Its guard's first read finds that class with no free candidate:
    the sweep stops there — no class learned or matched, no run examined, nothing promoted —
    where it used to read the fleet and the queue's head and match b's class. A queued submit
    beside a busy class therefore costs no matching, whatever the queue holds."""
    advert(med, "X")
    advert(med, "Y")
    advert(med, "Z", board="z")  # free, but not a candidate: the class stays blocked
    assert [med.submit(contract(r)).outcome for r in ("a", "c")] == [Outcome.STARTED] * 2
    reports = []
    med.sweep_observers.append(lambda seconds, report: reports.append(report))
    assert med.submit(contract("b")).outcome == Outcome.QUEUED
    [guard] = reports
    assert guard.blocked and guard.promoted == []
    assert (guard.classes, guard.matched, guard.examined) == (0, 0, 0)
    assert states(med, "b") == ["QUEUED"]
    # Any other wake still reads everything: the memo learns b's class then.
    report = med.wake_queued()
    assert not report.blocked and report.classes == 1


def test_r17_another_class_that_could_start_keeps_the_guard_sweeping_in_full(med):
    """R17: the guard stops early only if no waiting class could start — not merely its own.
    q waits for Y (board y), whose drain is lifted by SQL, so no wake ran and q waits beside a
    free node (as after a node returns with wake 7 off). b is then queued for the busy X: its
    own class is blocked, q's is not, so the guard sweeps in full and promotes q, as the
    guard's sweep always did (the simulator's gate holds this decision)."""
    advert(med, "X")
    advert(med, "Y", board="y", drain="graceful")
    med.submit(contract("a"))  # X busy
    assert med.submit(contract("q", dut={"board": "y"})).outcome == Outcome.QUEUED
    undrain_quietly(med, "Y")
    reports = []
    med.sweep_observers.append(lambda seconds, report: reports.append(report))
    assert med.submit(contract("b")).outcome == Outcome.QUEUED
    [guard] = reports
    assert not guard.blocked and guard.promoted == ["q"]
    assert states(med, "q", "b") == ["RUNNING", "QUEUED"]


def test_r17_past_64_waiting_classes_the_guard_sweeps_in_full(med):
    """R17: the guard's test probes at most 65 waiting classes (one index probe each); with
    more waiting it does not decide and the guard sweeps as every other wake does."""
    keys = {f"k{i:02d}": True for i in range(66)}
    med.advert("X", {"board": "x", **keys}, "i1")
    med.submit(contract("a"))  # X busy
    reports = []
    med.sweep_observers.append(lambda seconds, report: reports.append(report))
    for i in range(66):
        sub = med.submit(contract(f"q{i:02d}", dut={"board": "x", f"k{i:02d}": True}))
        assert sub.outcome == Outcome.QUEUED
    assert [r.blocked for r in reports] == [True] * 64 + [False] * 2  # 65 and 66 classes wait
    assert all(r.promoted == [] for r in reports)


def test_r17_the_guard_counts_only_live_undrained_unleased_nodes_as_free(med):
    """R17's blocked test counts as free only what the matcher does (unavailable = busy ∪
    draining, live adverts only): X is busy, D free but draining, E free but its advert expired
    (no wake: set by SQL) — b's guard is blocked. D's drain is then lifted, without an advert,
    between c's fleet read and its insert: c queues (it read D draining), its guard's read sees
    D free, is not blocked, and sweeps in full — promoting b, the older run (R6, I7)."""
    advert(med, "X")
    med.submit(contract("a"))  # X busy
    advert(med, "D", drain="graceful")
    advert(med, "E")
    sql(med, "UPDATE nodes SET expires_at = expires_at - interval '1 day' WHERE node_id = 'E'")
    reports = []
    med.sweep_observers.append(lambda seconds, report: reports.append(report))
    assert med.submit(contract("b")).outcome == Outcome.QUEUED
    assert reports[-1].blocked
    med._after_fleet_read = lambda run_id: undrain_quietly(med, "D")
    assert med.submit(contract("c")).outcome == Outcome.QUEUED
    assert not reports[-1].blocked and reports[-1].promoted == ["b"]
    assert states(med, "b", "c") == ["RUNNING", "QUEUED"]


@pytest.mark.parametrize(
    "moment",
    ["before the fleet read", "between the read and the insert", "between the insert and the "
     "guard's read", "after the guard's read"],
)  # fmt: skip
def test_r17_a_release_at_any_moment_of_a_queued_submit_never_strands_the_run(
    dsn, clock, tmp_path, monkeypatch, moment
):
    """R17, the lost-wakeup case, as deterministic interleavings on two connections: a holds X,
    b is submitted, and a's result — releasing X and sweeping, on another Mediator — commits
    at each moment of b's submit. Whichever it is, b ends RUNNING on X once both calls have
    returned: when the release commits before the guard's read, that read sees X free and the
    guard sweeps in full; after it, the guard may stop at its read (X busy there) and the
    release's own sweep, reading after its commit, finds b (docs/design.md R17)."""
    med = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path / "m"))
    other = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path / "m"))
    try:
        advert(med, "X")
        med.submit(contract("a"))
        [step] = med.work("X")
        claimed = med.claim("a", step.seq, "X")
        released = []

        def release():
            if not released:
                released.append(other.report("a", step.seq, "X", claimed.attempt, "pass"))

        reports = []
        med.sweep_observers.append(lambda seconds, report: reports.append(report))
        if moment == "before the fleet read":
            release()
        elif moment == "between the read and the insert":
            med._after_fleet_read = lambda run_id: release()
        else:
            real = Tx.sweep_head

            def head(self, *args, guard=False, **kw):
                if guard and moment == "between the insert and the guard's read":
                    release()
                out = real(self, *args, guard=guard, **kw)
                if guard and moment == "after the guard's read":
                    release()
                return out

            monkeypatch.setattr(Tx, "sweep_head", head)
        sub = med.submit(contract("b"))
        assert released and released[0].released == ("X",)
        run = med.get_run("b")
        assert (run.state, run.assigned) == ("RUNNING", {"dut": "X"})
        if moment == "before the fleet read":
            assert sub.outcome == Outcome.STARTED and reports == []
        else:
            assert sub.outcome == Outcome.QUEUED
            [guard] = reports  # the release's sweep ran in `other`
            # The guard stops at its read only when X was still busy in that read's snapshot.
            assert guard.blocked == (moment == "after the guard's read")
            assert guard.promoted == ([] if guard.blocked or moment.startswith("between the i")
                                      else ["b"])  # fmt: skip
    finally:
        med.close()
        other.close()


# ---- R8/R9 under real concurrency ----


def test_r8_r9_concurrent_sweeps_never_double_lease_and_keep_fifo(dsn, clock, tmp_path):
    """R8, R9, I1, I5, I7: six Mediators (own connections) sweep at once, repeatedly. No node
    is leased twice, every RUNNING run holds exactly its leases, and the promoted runs are the
    head of the queue in FIFO order."""
    n_nodes, n_runs, n_sweepers = 5, 40, 6
    meds = [
        Mediator.connect(dsn, clock=clock, records_root=str(tmp_path), startup_wake=False)
        for _ in range(n_sweepers)
    ]
    try:
        m0 = meds[0]
        nodes = [f"n{i}" for i in range(n_nodes)]
        for n in nodes:
            advert(m0, n, drain="graceful")
        for i in range(n_runs):
            clock.advance(0.001)
            assert m0.submit(contract(f"r{i:03d}")).outcome == Outcome.QUEUED
        fifo = [f"r{i:03d}" for i in range(n_runs)]
        for rnd in range(3):
            undrain_quietly(m0, *nodes)
            barrier = threading.Barrier(n_sweepers)
            errors = []

            def sweep(m, barrier=barrier, errors=errors):
                try:
                    barrier.wait(timeout=10)
                    m.wake_queued()
                except Exception as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=sweep, args=(m,)) for m in meds]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert errors == []
            running = [
                r
                for (r,) in sql(m0, "SELECT run_id FROM runs WHERE state='RUNNING' ORDER BY run_id")
            ]
            assert running == fifo[rnd * n_nodes : (rnd + 1) * n_nodes]  # I7: the head, in order
            leases = sql(m0, "SELECT node_id, run_id FROM leases ORDER BY node_id")
            assert sorted(n for n, _ in leases) == nodes  # I1: each node once
            assert sorted(r for _, r in leases) == running  # I5: one lease per 1-role run
            # Free the nodes again without waking: end the runs by SQL, drain the nodes.
            sql(m0, "UPDATE nodes SET drain = 'graceful'")
            sql(m0, "DELETE FROM leases")
            sql(m0, "UPDATE runs SET state = 'PASSED', verdict = 'pass' WHERE state = 'RUNNING'")
    finally:
        for m in meds:
            m.close()


def sweep_after(med, monkeypatch, act):
    """``med``'s sweep, with ``act(run_id)`` — another process's move — just before each of its
    promotions (between the sweep's read and its conditional update)."""
    original = sweep_flow.promote

    def promote(ctx, run_id, res, needs, by_id):
        if ctx is med.ctx:
            act(run_id)
        return original(ctx, run_id, res, needs, by_id)

    monkeypatch.setattr(sweep_flow, "promote", promote)
    return med.wake_queued()


def test_i5_a_run_gets_all_its_leases_or_none(dsn, med, clock, tmp_path, monkeypatch):
    """I5: a two-node promotion that loses one node to another process rolls back whole."""
    advert(med, "N1", board="x")
    advert(med, "N2", scope=True, drain="graceful")
    med.submit(contract("w", dut={"board": "x"}, bench={"scope": True}))  # N2 draining → queued
    assert med.get_run("w").state == "QUEUED"
    other = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path / "o"))
    try:
        undrain_quietly(med, "N2")
        # Another process takes N2 through its own submit just before our promotion's insert.
        report = sweep_after(
            med, monkeypatch, lambda _run: other.submit(contract("thief", bench={"scope": True}))
        )
    finally:
        other.close()
    assert report.promoted == []
    assert med.get_run("w").state == "QUEUED"
    assert sql(med, "SELECT node_id FROM leases WHERE run_id = 'w'") == []  # not even N1
    assert [s.node_id for s in med.get_run("w").steps] == ["", ""]


def test_r9_a_node_lost_to_another_process_is_the_only_one_the_retry_leaves_out(
    dsn, med, clock, tmp_path, monkeypatch
):
    """R9: the sweep's promotion loses N1 to another process's submit between its read and its
    insert. Only the node now busy in the database joins the unavailable ones — not the rest of
    the assignment — so the same run is matched again at once and starts on N2 and N3, in the
    same sweep, having been examined once."""
    advert(med, "N1", board="x")
    advert(med, "N2", board="x")
    advert(med, "N3", scope=True, drain="graceful")
    med.submit(contract("w", dut={"board": "x"}, bench={"scope": True}))  # N3 draining → queued
    other = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path / "o"))
    thefts = []

    def steal(_run):
        if not thefts:
            thefts.append(other.submit(contract("thief", dut={"board": "x"})).run.assigned)

    try:
        undrain_quietly(med, "N3")
        report = sweep_after(med, monkeypatch, steal)
    finally:
        other.close()
    assert thefts == [{"dut": "N1"}]  # the node the sweep had chosen for dut
    assert (report.promoted, report.examined) == (["w"], 1)
    assert med.get_run("w").assigned == {"dut": "N2", "bench": "N3"}


def test_r8_a_run_cancelled_just_before_its_promotion_is_not_reported_promoted(
    dsn, med, clock, tmp_path, monkeypatch
):
    """R8: another process cancels the run between the sweep's read and its promotion; the
    conditional update matches nothing, so the sweep reports nothing promoted and the run keeps
    no lease."""
    advert(med, "X", drain="graceful")
    med.submit(contract("w"))
    other = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path / "o"))
    try:
        undrain_quietly(med, "X")
        report = sweep_after(med, monkeypatch, other.cancel)
    finally:
        other.close()
    assert report.promoted == []
    assert med.get_run("w").state == "FAILED"
    assert sql(med, "SELECT node_id FROM leases WHERE run_id = 'w'") == []


def test_a_promotion_records_its_assignment_and_a_lease_granted_per_node(med):
    """docs/design.md §13: a promotion's events are ``promoted`` with the roles' nodes, then one
    ``lease_granted`` per node, naming it (what /v1/events streams and the panel shows)."""
    advert(med, "N1", board="x", drain="graceful")
    advert(med, "N2", scope=True, drain="graceful")
    med.submit(contract("w", dut={"board": "x"}, bench={"scope": True}))
    undrain_quietly(med, "N1", "N2")
    assert med.wake_queued().promoted == ["w"]
    rows = sql(med, "SELECT kind, node_id, data FROM events WHERE run_id = 'w' ORDER BY id")
    assert [r[0] for r in rows] == ["submitted", "promoted", "lease_granted", "lease_granted"]
    assert rows[1][1:] == ("", {"assigned": {"bench": "N2", "dut": "N1"}})
    assert sorted(r[1:] for r in rows[2:]) == [("N1", {}), ("N2", {})]


def test_r13_a_sweep_with_no_free_node_builds_no_index_and_matches_nothing(med, monkeypatch):
    """R13's cost argument (docs/design.md §6): with every node busy a sweep reads the queue and
    the fleet once and stops — no candidate index is built, no class matched."""
    advert(med, "X")
    assert med.submit(contract("holder")).outcome == Outcome.STARTED
    assert med.submit(contract("q")).outcome == Outcome.QUEUED
    built = []
    real = sweep_flow.AdvertIndex

    def counting(adverts):
        built.append(1)
        return real(adverts)

    monkeypatch.setattr(sweep_flow, "AdvertIndex", counting)
    report = med.wake_queued()
    assert (report.promoted, report.matched, built) == ([], 0, [])
    assert med.get_run("q").state == "QUEUED"


def test_i3_queued_runs_never_hold_anything_after_a_busy_day(med, clock):
    """I3, checked by SQL after a mixed sequence of submits, results, cancels and sweeps."""
    advert(med, "X")
    advert(med, "Y", board="y")
    for i in range(6):
        med.submit(contract(f"x{i}"))
        med.submit(contract(f"y{i}", dut={"board": "y"}))
        clock.advance(1)
    finish(med, "x0", "X")
    med.cancel("y0")
    med.cancel("x3")
    holders = sql(
        med,
        """SELECT r.run_id FROM runs r WHERE r.state = 'QUEUED' AND (
             EXISTS (SELECT 1 FROM leases l WHERE l.run_id = r.run_id)
          OR EXISTS (SELECT 1 FROM asks a WHERE a.run_id = r.run_id)
          OR EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.run_id
                     AND (s.state <> 'PENDING' OR s.node_id <> '' OR s.chosen IS NOT NULL)))""",
    )
    assert holders == []
    # x0, y0 ran; x1, y1 promoted by the result and the cancel; x3 cancelled: 7 wait.
    assert len(sql(med, "SELECT 1 FROM runs WHERE state = 'QUEUED'")) == 7


def test_r12_asks_are_raised_at_promotion_and_pushed_after_commit(dsn, med, clock, tmp_path):
    """R12: steps.node_id → runAcquires → raiseAsks → commit → PushAsks. The pushed ask is
    already visible to another connection (it was committed first)."""
    advert(med, "X")
    med.submit(contract("a"))
    doc = contract("q")
    doc["steps"].insert(0, {"name": "ready?", "kind": "ask", "ask": "Board plugged in?"})
    med.submit(doc)
    assert med.asks() == []  # R4: not while QUEUED
    observer = Mediator.connect(
        dsn, clock=clock, records_root=str(tmp_path / "o"), startup_wake=False
    )
    pushed = []
    try:
        med.after.push_asks = lambda asks: pushed.append(
            [(a.run_id, [x.run_id for x in observer.asks()]) for a in asks]
        )
        finish(med, "a", "X")
    finally:
        observer.close()
    assert pushed == [[("q", ["q"])]]
    run = med.get_run("q")
    assert [s.state for s in run.steps] == ["ASKED", "PENDING"]
    assert run.steps[1].chosen["node"] == "X"


# ---- issue 12 §4: R7 — any failure of one run's promotion, logged, counted, the sweep goes on ----


def test_r7_a_foreign_exception_in_one_promotion_is_logged_counted_and_the_sweep_goes_on(
    med, caplog, monkeypatch
):
    """issue 12 §4: the sweep used to catch only MediatorError; a KeyError in one run's
    promotion aborted every sweep, leaving later runs QUEUED beside free nodes."""
    from mediator.api.metrics import Metrics

    advert(med, "X", drain="graceful")
    advert(med, "Y", board="y", drain="graceful")
    med.submit(contract("bad"))
    med.submit(contract("good", dut={"board": "y"}))
    undrain_quietly(med, "X", "Y")
    original = sweep_flow.promote

    def promote(ctx, run_id, res, needs, by_id):
        if run_id == "bad":
            raise KeyError("injected")
        return original(ctx, run_id, res, needs, by_id)

    monkeypatch.setattr(sweep_flow, "promote", promote)
    metrics = Metrics(med)
    report = med.wake_queued()
    assert report.promoted == ["good"] and report.errors == 1
    assert states(med, "bad", "good") == ["QUEUED", "RUNNING"]
    assert "promoting run bad failed" in caplog.text
    assert b"mediator_sweep_run_errors_total 1.0" in metrics.render()[0]


# ---- issue 12 §1: wake 5 on reconnect ----


def terminate_other_backends(med):
    """Kill every connection to this database but the one asking (pg_terminate_backend)."""
    import psycopg

    with psycopg.connect(med.database_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def wait_until(predicate, timeout=20.0):
    """Poll a condition with a deadline (no sleep as synchronisation). A read that meets one of
    the terminated connections is answered 503 (StoreUnavailable) and counts as 'not yet'."""
    import time

    from mediator import StoreUnavailable

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except StoreUnavailable:
            pass
        time.sleep(0.02)
    return False


def test_wake_5_a_wake_lost_to_a_broken_connection_runs_once_the_database_answers(med, monkeypatch):
    """issue 12 §1, wake 5: a runs on X, b waits for X. The connection is terminated right
    after a's result commits and before its wake: the wake fails (logged), the result still
    answers PASSED. Steady heartbeats never sweep (R14), so nothing else would move b — the
    reconnect must: b is promoted once the database answers, with no other event."""
    advert(med, "X")
    med.submit(contract("a"))
    assert med.submit(contract("b")).outcome == Outcome.QUEUED
    original, broken = sweep_flow.wake_queued, []

    def wake_after_the_connection_broke(ctx, first=None, guard=None):
        if not broken:  # once: between a's commit and its wake
            broken.append(terminate_other_backends(med))
        return original(ctx, first, guard)

    monkeypatch.setattr(sweep_flow, "wake_queued", wake_after_the_connection_broke)
    result = finish(med, "a", "X")
    assert broken and result.settled == "PASSED"
    assert wait_until(lambda: med.get_run("b").state == "RUNNING")
    assert med.get_run("b").assigned == {"dut": "X"}


# ---- issue 12 §2: wake 9 — capabilities changed ----


def test_wake_9_a_node_that_gains_a_capability_wakes_the_queue(med, monkeypatch):
    """issue 12 §2: X is idle and live; b needs `scope`, which only the busy S has, so b
    waits. X's next advert adds `scope`: that advert sweeps, and b goes onto X."""
    advert(med, "S", scope=True)
    advert(med, "X")
    med.submit(contract("a", bench={"scope": True}))  # S busy
    assert med.submit(contract("b", bench={"scope": True})).outcome == Outcome.QUEUED
    assert med.get_run("b").wait_reason["code"] == "ALL_BUSY"
    advert(med, "X", board="x", scope=True)
    assert med.get_run("b").assigned == {"bench": "X"}


def test_r14_wake_9_steady_heartbeats_with_unchanged_capabilities_never_sweep(med):
    """R14 with wake 9: the same capabilities, in another key order, are not a change."""
    calls = []
    med.sweep_observers.append(lambda seconds, report: calls.append(1))
    med.advert("X", {"board": "x", "scope": True, "n": 1}, "i1")
    calls.clear()
    for _ in range(3):
        med.advert("X", {"n": 1.0, "scope": True, "board": "x"}, "i1")
    assert calls == []
    med.advert("X", {"board": "x"}, "i1")  # a capability dropped: a change, one sweep
    assert calls == [1]


# ---- issue 26 §3: data flows one way — the after-commit object hands its read down ----


def test_a_results_wake_sweeps_from_the_head_its_seal_read(med, monkeypatch):
    """Issue 13's saving, passed down instead of read back: a's result settles the run, the
    seal's last round trip reads the sweep's head (b waiting), and ``AfterCommit`` calls the
    sweep with that read as an argument — no facade lambda, thread-local or promote callable in
    between (issue 26). The sweep reads nothing more to begin, and b goes onto X."""
    advert(med, "X")
    med.submit(contract("a"))
    assert med.submit(contract("b")).outcome == Outcome.QUEUED
    handed, original = [], sweep_flow.wake_queued

    def recording(ctx, first=None, guard=None):
        handed.append(first)
        return original(ctx, first, guard)

    monkeypatch.setattr(sweep_flow, "wake_queued", recording)
    assert finish(med, "a", "X").settled == "PASSED"
    [first] = handed
    assert isinstance(first, SweepHead)
    assert [q.run_id for q in first.head] == ["b"] and [n.node_id for n in first.fleet] == ["X"]
    assert states(med, "b") == ["RUNNING"]
