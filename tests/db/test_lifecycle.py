"""The run lifecycle on the real database (docs/design.md §8–7.7; seed 000 R13–R16, §5; I2, I4, I6).

Wake points are observed by counting the sweeps the Mediator under test reports to its sweep
observers (every wake point's ``AfterCommit`` sweeps once and tells them).
"""

from __future__ import annotations

import os
import stat
from datetime import timedelta

import psycopg
import pytest

from mediator import Config, Conflict, ContractError, Forbidden, Mediator, NotFound, Outcome
from mediator.core.errors import StoreUnavailable
from mediator.core.rows import Applied
from mediator.flows.steps import MAX_LOG, locked
from mediator.store.tx import Tx
from tests.db.conftest import EPOCH, advert, contract


@pytest.fixture
def wakes(med):
    calls = []
    med.sweep_observers.append(lambda seconds, report: calls.append(1))
    return calls


def sql(med, statement, *params):
    with med.store.autocommit() as tx:
        cur = tx.conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def chain(run_id, *names, role="dut", needs=None):
    """A run whose steps run one after another on one role."""
    steps, prev = [], None
    for n in names:
        steps.append(
            {
                "name": n,
                "role": role,
                "with": {"cmd": "true"},
                **({"after": [prev]} if prev else {}),
            }
        )
        prev = n
    return {"run_id": run_id, "roles": {role: needs or {"board": "x"}}, "steps": steps}


def claim_next(med, node, run_id=None):
    step = next(s for s in med.work(node) if run_id is None or s.run_id == run_id)
    return med.claim(step.run_id, step.seq, node)


# ---- steps: work, claim, report ----


def test_work_lists_only_pending_steps_of_this_node_whose_after_passed(med):
    advert(med, "X")
    med.submit(chain("a", "build", "flash", "test"))
    assert [s.name for s in med.work("X")] == ["build"]
    assert med.work("Y") == []
    s = claim_next(med, "X")
    assert med.work("X") == []  # CLAIMED is not claimable
    med.report("a", s.seq, "X", s.attempt, "pass")
    assert [s.name for s in med.work("X")] == ["flash"]


def test_claim_refusals_each_have_their_own_code(med):
    advert(med, "X")
    advert(med, "Y", board="y")
    med.submit(chain("a", "one", "two"))
    with pytest.raises(Forbidden) as e:
        med.claim("a", 0, "Y")
    assert e.value.code == "not_your_step"
    with pytest.raises(Conflict) as e:
        med.claim("a", 1, "X")  # `after` not passed yet
    assert e.value.code == "not_claimable"
    with pytest.raises(Conflict) as e:
        med.claim("a", 0, "X", instance="old-daemon")
    assert e.value.code == "stale_instance"
    med.claim("a", 0, "X")
    with pytest.raises(Conflict) as e:
        med.claim("a", 0, "X")
    assert e.value.code == "already_claimed"


def test_claim_carries_attempt_instance_and_started_at(med, clock):
    med.advert("X", {"board": "x"}, "inst-1")
    med.submit(chain("a", "one"))
    clock.advance(5)
    s = med.claim("a", 0, "X")
    assert (s.state, s.attempt, s.instance, s.started_at) == ("CLAIMED", 1, "inst-1", clock.now)


def test_result_refusals_stale_attempt_stale_instance_other_node(med):
    advert(med, "X")
    advert(med, "Y", board="y")
    med.submit(chain("a", "one"))
    s = med.claim("a", 0, "X")
    with pytest.raises(Conflict) as e:
        med.report("a", 0, "X", s.attempt + 1, "pass")
    assert e.value.code == "stale_attempt"
    with pytest.raises(Conflict) as e:
        med.report("a", 0, "X", s.attempt, "pass", instance="someone-else")
    assert e.value.code == "stale_instance"
    with pytest.raises(Forbidden):
        med.report("a", 0, "Y", s.attempt, "pass")
    assert med.report("a", 0, "X", s.attempt, "pass").settled == "PASSED"


def test_a_failed_step_skips_every_step_that_depends_on_it(med):
    advert(med, "X")
    doc = chain("a", "build", "flash", "test")
    doc["steps"].append(
        {"name": "lint", "role": "dut", "with": {"cmd": "true"}}
    )  # independent: still runs
    med.submit(doc)
    s = claim_next(med, "X")
    assert med.report("a", s.seq, "X", s.attempt, "fail", log="boom").settled == ""
    assert [st.state for st in med.get_run("a").steps] == [
        "FAILED",
        "SKIPPED",
        "SKIPPED",
        "PENDING",
    ]
    s = claim_next(med, "X")
    assert med.report("a", s.seq, "X", s.attempt, "pass").settled == "FAILED"
    assert med.get_run("a").verdict == "fail"


def test_r15_retry_rolls_back_without_release_or_wake(med, wakes):
    """R15: a retry is a rollback — back to PENDING, attempt kept, lease kept, no wake."""
    advert(med, "X")
    med.submit(chain("a", "flaky"))
    med.submit(chain("b", "next"))
    s = med.claim("a", 0, "X")
    wakes.clear()
    r = med.report("a", 0, "X", s.attempt, "retry", log="try again\n")
    assert (r.rolled, r.released) == (True, ())
    assert r.to_dict() == {"settled": "", "rolled": True, "released": [], "step_state": "PENDING"}
    assert wakes == []
    step = med.get_run("a").steps[0]
    assert (step.state, step.attempt) == ("PENDING", 1)
    assert [n.lease.run_id for n in med.list_nodes().nodes] == ["a"]
    assert med.get_run("b").state == "QUEUED"


def test_the_max_attempts_th_retry_fails_the_step_and_wakes(dsn, clock, tmp_path):
    med = Mediator.connect(dsn, Config(max_attempts=2), clock, records_root=str(tmp_path))
    try:
        advert(med, "X")
        med.submit(chain("a", "flaky"))
        med.submit(chain("b", "next"))
        for attempt in (1, 2):
            s = med.claim("a", 0, "X")
            assert s.attempt == attempt
            r = med.report("a", 0, "X", attempt, "retry")
        assert (r.rolled, r.settled) == (False, "FAILED")
        assert med.get_run("b").state == "RUNNING"  # wake 1
    finally:
        med.close()


def test_partial_release_frees_a_node_before_the_run_ends_and_wakes(med, wakes):
    """applyRelease + R15: SettleIfDone returns "" (still running), the node whose steps are all
    terminal is released at once, and the result's wake promotes a run waiting for it."""
    advert(med, "N1", board="x")
    advert(med, "N2", scope=True)
    med.submit(contract("wide", dut={"board": "x"}, bench={"scope": True}))
    med.submit(contract("waits", dut={"board": "x"}))
    s = claim_next(med, "N1")
    wakes.clear()
    r = med.report("wide", s.seq, "N1", s.attempt, "pass")
    assert (r.settled, r.released) == ("", ("N1",))
    assert wakes == [1]
    assert med.get_run("wide").state == "RUNNING"
    assert med.get_run("waits").state == "RUNNING"
    released = sql(med, "SELECT node_id, data FROM events WHERE run_id = 'wide' "
                        "AND kind = 'lease_released'")  # fmt: skip
    assert released == [("N1", {"reason": "partial"})]


def test_settle_if_done_releases_everything_and_seals(med):
    advert(med, "X")
    med.submit(chain("a", "one", "two"))
    for _ in range(2):
        s = claim_next(med, "X")
        r = med.report("a", s.seq, "X", s.attempt, "pass", log=f"log of {s.name}\n")
    assert r.settled == "PASSED"
    assert sql(med, "SELECT count(*) FROM leases") == [(0,)]
    record = med.records.dir("a")
    assert sorted(p.name for p in record.rglob("*") if p.is_file()) == [
        "0000-one.log", "0001-two.log", "contract.json", "events.jsonl", "seal.json",
    ]  # fmt: skip
    assert (record / "steps" / "0001-two.log").read_text() == "log of two\n"


# ---- cancel (wake 2) ----


def test_cancel_keeps_the_lease_of_a_node_still_running_a_claimed_step(med):
    """I2's exception (ours): X is mid-step, so it keeps its lease until its result, which is
    answered run_ended and then frees X and promotes the next run."""
    advert(med, "X")
    advert(med, "Y", scope=True)
    med.submit(contract("a", dut={"board": "x"}, bench={"scope": True}))
    med.submit(contract("next", dut={"board": "x"}))
    s = claim_next(med, "X")
    run = med.cancel("a")
    assert (run.state, run.verdict) == ("FAILED", "cancelled")
    assert [st.state for st in run.steps] == ["CLAIMED", "SKIPPED"]
    assert {n.node_id: n.lease and n.lease.run_id for n in med.list_nodes().nodes} == {
        "X": "a",
        "Y": None,
    }
    assert med.get_run("next").state == "QUEUED"  # X is still busy
    with pytest.raises(Conflict) as e:
        med.report("a", s.seq, "X", s.attempt, "pass")
    assert e.value.code == "run_ended"
    assert med.get_run("next").state == "RUNNING"
    assert med.records.verify("a").ok  # sealed at cancel; the late result did not touch it


def test_cancel_of_a_terminal_run_is_a_no_op_and_strangers_are_refused(med):
    advert(med, "X")
    med.submit(contract("a"), principal="alice")
    with pytest.raises(Forbidden):
        med.cancel("a", principal="mallory")
    assert med.cancel("a", principal="alice").verdict == "cancelled"
    events = sql(med, "SELECT count(*) FROM events WHERE run_id = 'a'")
    assert med.cancel("a", principal="admin-bob", admin=True).verdict == "cancelled"
    assert sql(med, "SELECT count(*) FROM events WHERE run_id = 'a'") == events


# ---- reaper (wake 3), renewal, restart detection (wake 4) ----


def test_reaper_fails_runs_whose_lease_expired_and_wakes(med, clock, wakes):
    advert(med, "X")
    med.submit(chain("a", "one"))
    claim_next(med, "X")
    clock.advance(61)  # past lease_ttl (60 s); X sent no advert
    wakes.clear()
    report = med.reap()
    assert (report.lost, report.released, wakes) == (["a"], ["X"], [1])
    run = med.get_run("a")
    assert (run.state, run.verdict, run.steps[0].state) == ("FAILED", "lost", "SKIPPED")
    assert med.records.verify("a").ok


def test_no_lease_is_reaped_while_an_outage_is_not_given_back_yet(med, clock, monkeypatch):
    """Wake 5, "outages don't count against nodes": between the database answering again and
    the outage being given back to adverts and leases (the store's reconnect watcher runs the
    give-back), a reaper pass would see every lease the outage expired. It reaps nothing while
    the store is reconnecting; the pass after reaps what is really gone. (Seen end to end: a
    held run LOST once in eight 12-s outages, tests/e2e/test_db_restart.py.)"""
    advert(med, "X")
    med.submit(chain("a", "one"))
    claim_next(med, "X")
    clock.advance(61)  # past lease_ttl: expired, as an outage longer than the TTL leaves it
    monkeypatch.setattr(med.store, "reconnecting", lambda: True)
    assert (med.reap().released, med.get_run("a").state) == ([], "RUNNING")
    monkeypatch.setattr(med.store, "reconnecting", lambda: False)
    assert (med.reap().released, med.get_run("a").state) == (["X"], "FAILED")


def test_r14_a_reap_that_releases_nothing_does_not_wake(med, clock, wakes):
    advert(med, "X")
    med.submit(chain("a", "one"))
    clock.advance(30)
    advert(med, "X")  # renews the lease: not_after = now + 60
    clock.advance(45)
    wakes.clear()
    assert med.reap().released == []
    assert wakes == []
    assert med.get_run("a").state == "RUNNING"


def test_r14_a_steady_heartbeat_never_sweeps(med, clock, wakes):
    advert(med, "X")
    wakes.clear()
    for _ in range(5):
        clock.advance(10)
        advert(med, "X")
    assert wakes == []


def test_restart_after_a_step_ran_loses_the_run_and_wakes(med, wakes):
    """Restart detection: a step CLAIMED under the old instance → FAILED/lost, wake 4; claims and
    results from the old instance → 409."""
    med.advert("X", {"board": "x"}, "old")
    med.submit(chain("a", "one", "two"))
    med.submit(chain("b", "one"))
    s = med.claim("a", 0, "X")
    wakes.clear()
    med.advert("X", {"board": "x"}, "new")
    assert med.get_run("a").verdict == "lost"
    assert med.records.verify("a").ok  # lost, so sealed after the commit (I6)
    assert wakes == [1]
    # the restart's decision is on record: a settled, then its lease released, in one commit
    kinds = [k for (k,) in sql(med, "SELECT kind FROM events WHERE run_id = 'a' ORDER BY id")]
    assert kinds[-2:] == ["settled", "lease_released"], kinds
    settled = sql(med, "SELECT node_id FROM events WHERE run_id = 'a' AND kind = 'settled'")
    assert settled == [("",)]  # a run's own event names no node
    assert med.get_run("b").state == "RUNNING"
    with pytest.raises(Conflict):
        med.report("a", 0, "X", s.attempt, "pass", instance="old")


def test_restart_of_a_node_kept_for_a_cancelled_runs_claimed_step_frees_it(med, wakes):
    """docs/design.md §10, I2's exception then restart detection: a cancel keeps X for the step
    it had claimed (its daemon may still be running it); when X's daemon comes back as a new
    instance that step will never report, so it is skipped, X's lease is released with reason
    ``restart`` and the run waiting for X starts (wake 4)."""
    med.advert("X", {"board": "x"}, "old")
    med.submit(chain("a", "one"))
    med.claim("a", 0, "X")
    med.cancel("a")
    assert med.submit(chain("b", "one")).outcome == Outcome.QUEUED  # X is still a's
    wakes.clear()
    med.advert("X", {"board": "x"}, "new")
    assert [s.state for s in med.get_run("a").steps] == ["SKIPPED"]
    assert med.get_run("b").state == "RUNNING" and wakes == [1]
    released = sql(med, "SELECT node_id, data FROM events WHERE run_id = 'a' "
                        "AND kind = 'lease_released'")  # fmt: skip
    assert released == [("X", {"reason": "restart"})]
    cancelled = sql(med, "SELECT node_id FROM events WHERE run_id = 'a' AND kind = 'cancelled'")
    assert cancelled == [("",)]  # the run's own event names no node


def test_an_advert_label_is_kept_to_200_characters_and_refused_past_them_naming_it(med):
    """An advert's ``label`` (what the panel shows beside the id): none given is empty, 200
    characters are kept as sent, 201 are refused (400) naming ``label``, the node unchanged."""
    med.advert("X", {"board": "x"}, "i1")
    assert [n.label for n in med.list_nodes().nodes] == [""]
    med.advert("X", {"board": "x"}, "i1", label="l" * 200)
    with pytest.raises(ContractError) as e:
        med.advert("X", {"board": "x"}, "i1", label="m" * 201)
    assert (e.value.field, e.value.message) == (
        "label", "label must be a string of at most 200 characters.")  # fmt: skip
    assert [n.label for n in med.list_nodes().nodes] == ["l" * 200]


def test_a_result_from_the_old_instance_is_refused_before_restart_detection_ends_the_run(
    med, monkeypatch
):
    """docs/design.md §9: a result must come from the instance that claimed the step *and* be
    the node's current one. Between a restart's advert and the detection that ends the run (two
    transactions), the old daemon's result is already stale: 409 ``stale_instance``."""
    import mediator.flows.advert as advert_flow

    med.advert("X", {"board": "x"}, "old")
    med.submit(chain("a", "one"))
    s = med.claim("a", 0, "X", instance="old")
    monkeypatch.setattr(advert_flow, "advert_effects", lambda *_a: False)  # detection not yet
    med.advert("X", {"board": "x"}, "new")
    assert med.get_run("a").state == "RUNNING"
    with pytest.raises(Conflict) as e:
        med.report("a", 0, "X", s.attempt, "pass", instance="old")
    assert e.value.code == "stale_instance"
    assert e.value.message == "This result comes from a stale daemon instance."


def test_a_refused_claim_and_a_refused_result_say_why(med):
    """docs/design.md §9 and §19: each refusal carries its code (and a bad field its name and a
    message), which the daemon and the API act on."""
    med.advert("X", {"board": "x"}, "i1")
    med.submit(chain("a", "one"))
    with pytest.raises(NotFound) as nf:
        med.claim("nope", 0, "X")
    assert nf.value.code == "unknown_run"
    with pytest.raises(NotFound) as nf:
        med.claim("a", 7, "X")
    assert nf.value.code == "unknown_step"
    bad = [({"outcome": "maybe"}, "outcome", "outcome must be 'pass', 'fail' or 'retry'."),
           ({"attempt": 0}, "attempt", "attempt must be a whole number ≥ 1."),
           ({"log": "x" * (MAX_LOG + 1)}, "log",
            f"log must be text of at most {MAX_LOG} ")]  # fmt: skip
    for change, field, message in bad:
        args = {"attempt": 1, "outcome": "pass", "log": "", **change}
        with pytest.raises(ContractError) as ce:
            med.report("a", 0, "X", args["attempt"], args["outcome"], log=args["log"])
        assert (ce.value.field, ce.value.message.startswith(message)) == (field, True)
    med.cancel("a")
    with pytest.raises(Conflict) as c:
        med.claim("a", 0, "X")
    assert c.value.code == "run_ended"


def test_an_advert_instance_and_drain_are_checked_naming_the_field(med):
    """An advert's ``instance`` is a non-empty string of at most 128 characters and its drain
    one of the three policies: anything else is refused (400) naming the field, nothing kept."""
    med.advert("X", {"board": "x"}, "i" * 128)
    for instance in ("", "i" * 129):
        with pytest.raises(ContractError) as e:
            med.advert("X", {"board": "x"}, instance)
        assert (e.value.field, e.value.message) == (
            "instance",
            "instance must be a non-empty string of at most 128 characters.",
        )
    with pytest.raises(ContractError) as e:
        med.advert("X", {"board": "x"}, "i1", drain="soon")
    assert (e.value.field, e.value.message) == (
        "policy.drain",
        "drain must be '', 'graceful' or 'at-boundary'.",
    )
    assert [(n.node_id, n.drain) for n in med.list_nodes().nodes] == [("X", "")]


def test_a_pass_result_wakes_the_queue_even_when_it_frees_no_node(med, wakes):
    """docs/design.md §9: after every result's commit the queue is swept (wake 1) — a pass in
    the middle of a run too, which ends its step (PASSED) and frees nothing yet."""
    med.advert("X", {"board": "x"}, "i1")
    med.submit(chain("a", "one", "two"))
    s = med.claim("a", 0, "X")
    wakes.clear()
    r = med.report("a", 0, "X", s.attempt, "pass")
    assert (r.step_state, r.released, r.settled) == ("PASSED", (), "")
    assert wakes == [1]
    s = med.claim("a", 1, "X")
    assert med.report("a", 1, "X", s.attempt, "fail").step_state == "FAILED"


def test_a_claim_out_of_turn_or_from_a_stale_daemon_is_refused_saying_why(med):
    """docs/design.md §9: a step is claimable only PENDING with its ``after`` passed, and only by
    the node's current daemon instance. Each refusal has its code and message."""
    med.advert("X", {"board": "x"}, "i1")
    med.submit(chain("a", "one", "two", "three"))
    with pytest.raises(Conflict) as e:
        med.claim("a", 1, "X")  # "two" waits for "one"
    assert e.value.code == "not_claimable"
    s = med.claim("a", 0, "X")
    med.report("a", 0, "X", s.attempt, "pass")
    with pytest.raises(Conflict) as e:
        med.claim("a", 0, "X")  # PASSED: never claimed again
    assert e.value.code == "not_claimable"
    with pytest.raises(NotFound) as nf:
        med.report("a", 7, "X", 1, "pass")
    assert (nf.value.code, nf.value.message) == ("unknown_step", "Run a has no step 7.")
    med.advert("X", {"board": "x"}, "i2")  # a restart: a is lost, b starts on X under i2
    med.submit(chain("b", "one"))
    with pytest.raises(Conflict) as e:
        med.claim("b", 0, "X", instance="i1")
    assert (e.value.code, e.value.message) == (
        "stale_instance",
        "This daemon instance is stale; advertise again first.",
    )


def test_restart_before_anything_ran_rebinds_the_lease(med):
    """Ours: a run promoted onto a node whose daemon just restarted has lost nothing."""
    med.advert("X", {"board": "x"}, "old")
    med.submit(chain("a", "one"))
    med.advert("X", {"board": "x"}, "new")
    run = med.get_run("a")
    assert run.state == "RUNNING"
    assert run.steps[0].chosen["instance"] == "new"
    assert sql(med, "SELECT instance FROM leases") == [("new",)]
    with pytest.raises(Conflict) as e:
        med.claim("a", 0, "X", instance="old")
    assert e.value.code == "stale_instance"
    assert med.claim("a", 0, "X", instance="new").state == "CLAIMED"


def test_adverts_renew_the_lease(med, clock):
    advert(med, "X")
    med.submit(chain("a", "one"))
    clock.advance(50)
    advert(med, "X")
    [(not_after,)] = sql(med, "SELECT not_after FROM leases")
    assert not_after == clock.now + timedelta(seconds=60)


# ---- drain (wakes 4 and 6) and the vanished node (wake 7) ----


def test_graceful_drain_lets_the_run_finish_and_undrain_wakes(med, wakes):
    advert(med, "X")
    med.submit(chain("a", "one"))
    advert(med, "X", drain="graceful")
    med.submit(chain("b", "one"))
    s = claim_next(med, "X")
    med.report("a", s.seq, "X", s.attempt, "pass")
    assert med.get_run("b").state == "QUEUED"  # X is draining: no new runs
    wakes.clear()
    advert(med, "X", drain="")  # wake 6: drain released
    assert wakes == [1]
    assert med.get_run("b").state == "RUNNING"


def test_at_boundary_drain_refuses_claims_and_ends_the_run_at_the_step_boundary(med, wakes):
    advert(med, "X")
    advert(med, "Y", board="y")
    med.submit(chain("a", "one", "two"))
    s = claim_next(med, "X")
    advert(med, "X", drain="at-boundary")  # a step is CLAIMED: the run goes on for now
    assert med.get_run("a").state == "RUNNING"
    wakes.clear()
    r = med.report("a", s.seq, "X", s.attempt, "pass")  # the boundary: remaining steps skipped
    assert r.settled == "FAILED"
    run = med.get_run("a")
    assert (run.verdict, [st.state for st in run.steps]) == ("drained", ["PASSED", "SKIPPED"])
    assert wakes == [1]


def test_at_boundary_drain_with_nothing_claimed_ends_the_run_at_once(med, wakes):
    advert(med, "X")
    med.submit(chain("a", "one"))
    wakes.clear()
    advert(med, "X", drain="at-boundary")
    assert med.get_run("a").verdict == "drained"
    assert wakes == [1]  # wake 4
    assert med.records.verify("a").ok  # settled, so sealed after the commit (I6)
    med.submit(chain("b", "one"))
    assert med.get_run("b").state == "QUEUED"  # a draining node takes no new run


def test_at_boundary_drain_refuses_claims(med):
    advert(med, "X")
    med.submit(contract("a", steps=2))  # two independent steps on X
    claim_next(med, "X")
    advert(med, "X", drain="at-boundary")
    with pytest.raises(Conflict) as e:
        med.claim("a", 1, "X")
    assert e.value.code == "draining"


@pytest.mark.parametrize("wake_on_return", [True, False])
def test_vanished_node_window_seed_000_section_5(dsn, clock, tmp_path, wake_on_return):
    """docs/design.md §8: b queues behind a on X; X vanishes, a is reaped (lost) — the reap's wake
    finds no candidate; X returns. With wake 7 (ours, default) b goes at once; with it off
    (the seed's behaviour) b waits beside the free X until some unrelated event."""
    cfg = Config(wake_on_return=wake_on_return)
    med = Mediator.connect(dsn, cfg, clock, records_root=str(tmp_path))
    try:
        advert(med, "X")
        med.submit(chain("a", "one"))
        med.submit(chain("b", "one"))
        clock.advance(61)  # X's advert (30 s) and a's lease (60 s) have expired
        assert med.reap().lost == ["a"]
        assert med.get_run("b").state == "QUEUED"  # no candidate while X is gone
        advert(med, "X", instance="i2")  # X returns
        expected = "RUNNING" if wake_on_return else "QUEUED"
        assert med.get_run("b").state == expected
        if not wake_on_return:
            assert med.list_nodes().nodes[0].lease is None  # the window: free X, waiting b
    finally:
        med.close()


# ---- asks ----


def test_asks_are_raised_when_due_and_an_answer_moves_the_run_on(med):
    advert(med, "X")
    doc = chain("a", "flash", "verify")
    doc["steps"].insert(
        1, {"name": "probe", "kind": "ask", "ask": "Clip the probe", "after": ["flash"]}
    )
    doc["steps"][2]["after"] = ["probe"]
    med.submit(doc)
    assert med.asks() == []
    s = claim_next(med, "X")
    med.report("a", s.seq, "X", s.attempt, "pass")
    [ask] = med.asks()
    assert (ask.run_id, ask.seq, ask.question) == ("a", 1, "Clip the probe")
    assert med.work("X") == []  # verify waits for the person
    med.answer(ask.ask_id, "done", ok=True)
    assert med.asks() == []
    assert [s.name for s in med.work("X")] == ["verify"]
    with pytest.raises(Conflict):
        med.answer(ask.ask_id, "again")


def test_a_negative_answer_fails_the_step_and_settles(med):
    advert(med, "X")
    doc = {"run_id": "a", "roles": {"dut": {"board": "x"}}, "steps": [
        {"name": "ok?", "kind": "ask", "ask": "Go?"},
        {"name": "run", "role": "dut", "after": ["ok?"], "with": {"cmd": "true"}},
    ]}  # fmt: skip
    med.submit(doc)
    [ask] = med.asks()
    r = med.answer(ask.ask_id, "no", ok=False)
    assert r.settled == "FAILED"
    assert [s.state for s in med.get_run("a").steps] == ["FAILED", "SKIPPED"]


# ---- records (I6) and events ----


def test_i6_sealed_once_read_only_and_verify_detects_a_changed_byte(med):
    advert(med, "X")
    med.submit(chain("a", "one"))
    s = claim_next(med, "X")
    med.report("a", s.seq, "X", s.attempt, "pass", log="hello\n")
    assert med.seal("a") is False  # sealing twice is a no-op
    log = med.records.dir("a") / "steps" / "0000-one.log"
    assert not os.stat(log).st_mode & stat.S_IWUSR
    assert med.records.verify("a").ok
    os.chmod(log, 0o644)
    log.write_text("hellO\n")
    check = med.records.verify("a")
    assert (check.ok, check.changed) == (False, ("steps/0000-one.log",))


def test_terminal_runs_left_unsealed_are_sealed_at_startup(dsn, clock, tmp_path):
    med = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path))
    advert(med, "X")
    med.submit(chain("a", "one"))
    sql(med, "UPDATE runs SET state='FAILED', verdict='lost', ended_at=mediator_now()")  # a crash
    med.close()
    again = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path))
    try:
        assert again.records.verify("a").ok
        assert sql(again, "SELECT sealed FROM runs") == [(True,)]
    finally:
        again.close()


def test_events_one_row_per_transition_in_order(med):
    advert(med, "X")
    med.submit(chain("a", "one"))
    s = claim_next(med, "X")
    med.report("a", s.seq, "X", s.attempt, "pass")
    kinds = [k for (k,) in sql(med, "SELECT kind FROM events WHERE run_id='a' ORDER BY id")]
    assert kinds == ["submitted", "lease_granted", "claimed", "result", "settled", "lease_released"]


# ---- invariants I2, I4 and the time-leak test ----


def test_i2_i4_hold_through_a_lifecycle(med):
    """I2: only RUNNING runs hold leases (except a CLAIMED step of an ended run). I4: a
    RUNNING run's exec steps carry the node of their role, agreeing with assigned."""
    advert(med, "N1", board="x")
    advert(med, "N2", scope=True)
    med.submit(contract("w", dut={"board": "x"}, bench={"scope": True}))
    run = med.get_run("w")
    assert all(s.node_id == run.assigned[s.role] for s in run.steps)  # I4
    bad = sql(
        med,
        """SELECT l.node_id FROM leases l JOIN runs r USING (run_id)
           WHERE r.state <> 'RUNNING' AND NOT EXISTS (
             SELECT 1 FROM steps s WHERE s.run_id = l.run_id AND s.node_id = l.node_id
             AND s.state = 'CLAIMED')""",
    )
    assert bad == []


def test_time_leak_every_timestamp_comes_from_the_virtual_clock(med, clock):
    """docs/design.md §13: with the clock set years from the wall clock, every timestamp and expiry
    is virtual — a statement reading now() would land in the wrong year."""
    assert EPOCH.year == 2031
    advert(med, "X")
    clock.advance(7)
    med.submit(chain("a", "one"))
    clock.advance(3)
    s = claim_next(med, "X")
    clock.advance(2)
    med.report("a", s.seq, "X", s.attempt, "pass")
    run = med.get_run("a")
    assert run.created_at == EPOCH + timedelta(seconds=7) == run.started_at
    assert run.ended_at == EPOCH + timedelta(seconds=12)
    assert run.steps[0].started_at == EPOCH + timedelta(seconds=10)
    [node] = med.list_nodes().nodes
    assert node.expires_at == EPOCH + timedelta(seconds=30)
    years = {y for (y,) in sql(med, "SELECT DISTINCT extract(year FROM at)::int FROM events")}
    assert years == {2031}


def test_an_answer_wakes_the_queue(med, wakes):
    """Wake 1 for answers: a negative answer fails the gate, skips the step after it, settles the
    run and so releases its node, and the answer's wake promotes the run waiting for it."""
    advert(med, "X")
    doc = {"run_id": "a", "roles": {"dut": {"board": "x"}}, "steps": [
        {"name": "go?", "kind": "ask", "ask": "Power on the bench?"},
        {"name": "run", "role": "dut", "after": ["go?"], "with": {"cmd": "true"}},
    ]}  # fmt: skip
    med.submit(doc)
    med.submit(chain("b", "one"))
    assert med.get_run("b").state == "QUEUED"  # X is held by a while the person thinks
    [ask] = med.asks()
    wakes.clear()
    assert med.answer(ask.ask_id, "no", ok=False).settled == "FAILED"
    assert wakes == [1]
    assert med.get_run("b").state == "RUNNING"


# ---- issue 12 §5: at-boundary drain does not depend on commit order (amended rule) ----


@pytest.mark.parametrize("order", ["drain advert first", "last result first"])
def test_at_boundary_drain_of_a_node_the_run_no_longer_needs_releases_it_either_order(med, order):
    """issue 12 §5: roles on A (a1) and B (b1, b2). A's last step a1 finishes and A drains
    at-boundary. Whether A's drain advert or a1's result commits first, the outcome is the
    same: A is released (the run no longer needs it), the run goes on and passes."""
    advert(med, "A", board="a")
    advert(med, "B", board="b")
    med.submit({"run_id": "r", "roles": {"ra": {"board": "a"}, "rb": {"board": "b"}},
                "steps": [{"name": "a1", "role": "ra", "with": {"cmd": "true"}},
                          {"name": "b1", "role": "rb", "with": {"cmd": "true"}},
                          {"name": "b2", "role": "rb", "after": ["b1"],
                           "with": {"cmd": "true"}}]})  # fmt: skip
    a1 = claim_next(med, "A")
    b1 = claim_next(med, "B")
    if order == "drain advert first":
        advert(med, "A", board="a", drain="at-boundary")  # a1 is CLAIMED: nothing yet
        med.report("r", a1.seq, "A", a1.attempt, "pass")
    else:
        med.report("r", a1.seq, "A", a1.attempt, "pass")
        advert(med, "A", board="a", drain="at-boundary")
    run = med.get_run("r")
    assert (run.state, [s.state for s in run.steps]) == ("RUNNING", ["PASSED", "CLAIMED",
                                                                       "PENDING"])  # fmt: skip
    assert sql(med, "SELECT node_id FROM leases WHERE run_id = 'r'") == [("B",)]
    med.report("r", b1.seq, "B", b1.attempt, "pass")
    b2 = claim_next(med, "B")
    med.report("r", b2.seq, "B", b2.attempt, "pass")
    assert (med.get_run("r").state, med.get_run("r").verdict) == ("PASSED", "pass")


# ---- issue 11 §6: one bad record never stops the others, nor the reaper's wake ----


def test_one_unsealable_record_stops_neither_other_seals_nor_the_reapers_wake(med, caplog):
    """issue 11 §6: a terminal run whose record cannot be written ('a-bad': its folder is a
    file) used to make seal_unsealed() raise before the reaper's wake — a queued run stayed
    beside a free live node, and every other unsealed record stayed unsealed. Now each seal is
    isolated (logged, counted, retried) and the wake after a release always runs."""
    root = med.records.root
    (root / "a-bad").write_text("not a folder")
    assert (
        med.submit(contract("a-bad", dut={"board": "none"})).outcome == Outcome.REJECTED
    )  # unsealable
    (root / "z-ok").write_text("not a folder yet")
    assert med.submit(contract("z-ok", dut={"board": "none"})).outcome == Outcome.REJECTED
    (root / "z-ok").unlink()  # this one is fixed before the pass
    advert(med, "X")
    med.submit(contract("holder"))
    assert med.submit(contract("b")).outcome == Outcome.QUEUED
    sql(med, "UPDATE leases SET not_after = mediator_now() - interval '1 second'")  # expired
    report = med.reap()
    assert report.lost == ["holder"] and report.woke
    assert med.get_run("b").state == "RUNNING"  # the wake ran despite a-bad
    assert report.sealed == ["z-ok"] and med.records.verify("holder").ok  # the others proceed
    assert sql(med, "SELECT run_id FROM runs WHERE NOT sealed AND state = 'FAILED'") == [("a-bad",)]
    assert "sealing the record of run a-bad failed" in caplog.text
    assert med.failures["record_seal"] >= 2  # at submit and at the reaper pass
    (root / "a-bad").unlink()  # the folder is fixed: the next pass seals it
    assert med.reap().sealed == ["a-bad"]
    assert med.records.verify("a-bad").ok


# ---- the run's lock, a claim's tries, a release's reason (docs/design.md §9) ----


def test_the_run_lock_names_an_unknown_run_or_step(med):
    """The locking rule's read (an answer takes it): a run or step that is not there is a 404
    with its own code, never a crash on an empty read."""
    advert(med, "X")
    med.submit(chain("a", "one"))
    cases = [("nope", 0, "unknown_run", "No run with run_id 'nope'."),
             ("a", 7, "unknown_step", "Run a has no step 7.")]  # fmt: skip
    for run_id, seq, code, message in cases:
        with med.store.tx() as tx, pytest.raises(NotFound) as nf:
            locked(tx, run_id, seq)
        assert (nf.value.code, nf.value.message) == (code, message)
    with med.store.tx() as tx:
        run, steps, step = locked(tx, "a", 0)
    assert (run.run_id, [s.name for s in steps], step.name) == ("a", ["one"], "one")


@pytest.fixture
def claim_tries(monkeypatch):
    """The claim statements a claim sends (the real ones, counted)."""
    tries: list[tuple[str, int]] = []
    real = Tx.claim_step

    def counted(self, run_id, seq, node_id, instance):
        tries.append((run_id, seq))
        return real(self, run_id, seq, node_id, instance)

    monkeypatch.setattr(Tx, "claim_step", counted)
    return tries


def test_a_claim_refused_for_a_reason_it_reads_is_not_tried_again(med, claim_tries):
    """§9: the refusal read names why the claim matched nothing; only a read that finds the step
    claimable after all (a concurrent change between the two statements) tries again. A step
    whose `after` has not passed, and one that already passed, are refused after one try."""
    advert(med, "X")
    med.submit(chain("a", "one", "two"))
    s = claim_next(med, "X")
    claim_tries.clear()
    with pytest.raises(Conflict) as c:
        med.claim("a", 1, "X")  # `after` (one) not passed yet
    assert (c.value.code, claim_tries) == ("not_claimable", [("a", 1)])
    med.report("a", s.seq, "X", s.attempt, "pass")
    claim_tries.clear()
    with pytest.raises(Conflict) as c:
        med.claim("a", 0, "X")  # PASSED already
    assert (c.value.code, claim_tries) == ("not_claimable", [("a", 0)])


def test_a_claim_that_keeps_losing_its_race_gives_up_after_three_tries(med, monkeypatch):
    """§9: a claim whose guarded statement matched nothing while its refusal read finds the step
    claimable (another writer between the two, every time) tries three times, then answers
    not_claimable (409) — a bounded loop, and the step is still the node's to claim."""
    advert(med, "X")
    med.submit(chain("a", "one"))
    tries = []
    monkeypatch.setattr(Tx, "claim_step", lambda self, *args: tries.append(args))  # lost race
    with pytest.raises(Conflict) as c:
        med.claim("a", 0, "X")
    assert (c.value.code, len(tries)) == ("not_claimable", 3)
    monkeypatch.undo()
    assert med.claim("a", 0, "X").state == "CLAIMED"


def released(med, run_id):
    rows = sql(med, "SELECT node_id, data->>'reason' FROM events WHERE run_id = %s "
                    "AND kind = 'lease_released' ORDER BY id", run_id)  # fmt: skip
    return [tuple(r) for r in rows]


def test_a_lease_freed_under_the_run_lock_says_why(med):
    """Every ``lease_released`` event carries its reason (§9, §10): a cancel's is the run's
    verdict; an answer that settles the run says ``settled``; an answer that frees a node whose
    steps are all done while the run goes on says ``partial``."""
    advert(med, "X")
    med.submit(chain("a", "one"))
    med.cancel("a")
    assert released(med, "a") == [("X", "cancelled")]
    med.submit(ask_doc("b", "go"))
    [ask] = med.asks()
    med.answer(ask.ask_id, "no", ok=False)
    assert released(med, "b") == [("X", "settled")]
    advert(med, "Y", scope=True)
    doc = {"run_id": "c", "roles": {"dut": {"board": "x"}, "bench": {"scope": True}}, "steps": [
        {"name": "look?", "kind": "ask", "ask": "Flash it?"},
        {"name": "flash", "role": "dut", "after": ["look?"], "with": {"cmd": "true"}},
        {"name": "probe", "role": "bench", "with": {"cmd": "true"}},
    ]}  # fmt: skip
    med.submit(doc)
    [ask] = med.asks()
    assert med.answer(ask.ask_id, "no", ok=False).settled == ""  # probe still to run on Y
    assert released(med, "c") == [("X", "partial")]


# ---- every refusal says what it refuses; a result's lock, log and wake (docs/design.md §9) ----


def refusal(call, *args, **kwargs):
    with pytest.raises((NotFound, Forbidden, Conflict)) as e:
        call(*args, **kwargs)
    return e.value.code, e.value.message


def test_each_refusal_of_a_claim_or_a_result_names_what_it_refuses(med, clock):
    """§9/§19: the code is for the daemon, the message for the person reading the log: it names
    the run and the step (or the node) it is about, whichever path found the refusal."""
    advert(med, "X")
    advert(med, "Y", board="y")
    med.submit(chain("a", "one", "two"))
    assert refusal(med.claim, "nope", 0, "X") == ("unknown_run", "No run with run_id 'nope'.")
    assert refusal(med.claim, "a", 7, "X") == ("unknown_step", "Run a has no step 7.")
    assert refusal(med.claim, "a", 0, "Y") == (
        "not_your_step", "Step 0 of run a is not assigned to Y.")  # fmt: skip
    assert refusal(med.claim, "a", 1, "X") == (
        "not_claimable", "Step 1 of run a cannot be claimed now.")  # fmt: skip
    s = med.claim("a", 0, "X")
    assert refusal(med.claim, "a", 0, "X") == (
        "already_claimed", "Step 0 of run a is already claimed.")  # fmt: skip
    assert refusal(med.report, "nope", 0, "X", 1, "pass") == (
        "unknown_run", "No run with run_id 'nope'.")  # fmt: skip
    assert refusal(med.report, "a", 7, "X", 1, "pass") == (
        "unknown_step", "Run a has no step 7.")  # fmt: skip
    assert refusal(med.report, "a", 0, "Y", 1, "pass") == (
        "not_your_step", "Step 0 of run a is not assigned to Y.")  # fmt: skip
    assert refusal(med.report, "a", 0, "X", 2, "pass") == (
        "stale_attempt", "Attempt 2 of step 0 is not the current one.")  # fmt: skip
    med.cancel("a")
    assert refusal(med.claim, "a", 1, "X") == ("run_ended", "Run a has ended (FAILED).")
    assert refusal(med.report, "a", 0, "X", s.attempt, "pass") == (
        "run_ended", "Run a has ended; stop working on it.")  # fmt: skip
    advert(med, "Z", board="z")
    med.submit(chain("z", "one", "two", needs={"board": "z"}))
    med.claim("z", 0, "Z")
    advert(med, "Z", board="z", drain="at-boundary")
    assert refusal(med.claim, "z", 1, "Z") == (
        "draining", "Node Z is draining at the step boundary.")  # fmt: skip


@pytest.mark.parametrize("attempt", [True, "1", 0, None])
def test_a_result_attempt_that_is_not_a_whole_number_from_one_is_400_naming_it(med, attempt):
    """A bool is not a number here (JSON true), nor is text; neither reaches the database."""
    advert(med, "X")
    med.submit(chain("a", "one"))
    med.claim("a", 0, "X")
    with pytest.raises(ContractError) as e:
        med.report("a", 0, "X", attempt, "pass")
    assert (e.value.field, e.value.message) == ("attempt", "attempt must be a whole number ≥ 1.")


def test_a_log_of_exactly_the_limit_is_kept_whole(med):
    advert(med, "X")
    med.submit(chain("a", "one"))
    s = med.claim("a", 0, "X")
    med.report("a", 0, "X", s.attempt, "pass", log="x" * MAX_LOG)
    assert sql(med, "SELECT length(log) FROM steps WHERE run_id = 'a'") == [(MAX_LOG,)]


def test_a_results_log_is_kept_whichever_process_saw_its_claim(med, dsn, clock, tmp_path):
    """The result's write has two paths: from the claim's snapshot when this process made the
    claim, from a fresh read when another did (§9); both keep the log."""
    other = Mediator.connect(dsn, config=Config(), clock=clock,
                             records_root=str(tmp_path / "other"))  # fmt: skip
    try:
        advert(med, "X")
        med.submit(chain("a", "one", "two"))
        s = other.claim("a", 0, "X")  # another process claims …
        med.report("a", 0, "X", s.attempt, "pass", log="flashed\n")  # … this one reports
        s = med.claim("a", 1, "X")
        med.report("a", 1, "X", s.attempt, "pass", log="tested\n")
    finally:
        other.close()
    assert sql(med, "SELECT log FROM steps WHERE run_id = 'a' ORDER BY seq") == [
        ("flashed\n",), ("tested\n",)]  # fmt: skip


def run_locked_elsewhere(med, run_id):
    """Whether another connection finds the run row locked (FOR UPDATE NOWAIT)."""
    with med.store.autocommit() as tx:
        try:
            tx.conn.execute("SELECT 1 FROM runs WHERE run_id = %s FOR UPDATE NOWAIT", (run_id,))
        except psycopg.errors.LockNotAvailable:
            return True
    return False


def test_a_result_that_lost_three_races_is_written_under_the_run_lock(med, monkeypatch):
    """§9: a result is written optimistically — one read, one write guarded by the run's
    version. A write that matched nothing (the run changed) reads and decides again; after three
    such losses the read is taken under the run row's lock, so the result completes. Here every
    write but the last is made to lose (another writer, each time): the claim's snapshot's try,
    three optimistic ones, then one under the lock, which holds the row while it writes."""
    advert(med, "X")
    med.submit(chain("a", "one"))
    s = med.claim("a", 0, "X")
    real, locks = Tx.apply_result, []

    def losing(self, src, node_id, decision, log):
        locks.append(run_locked_elsewhere(med, "a"))
        if len(locks) < 5:
            return Applied(False)  # lost to a concurrent writer: nothing written
        return real(self, src, node_id, decision, log)

    monkeypatch.setattr(Tx, "apply_result", losing)
    assert med.report("a", 0, "X", s.attempt, "pass", log="ok").settled == "PASSED"
    assert locks == [False, False, False, False, True]
    assert sql(med, "SELECT state, log FROM steps WHERE run_id = 'a'") == [("PASSED", "ok")]


def test_a_result_that_loses_every_race_gives_up_saying_so(med, monkeypatch):
    """The tries are bounded (ten after the snapshot's): a run that changes under every one of
    them answers 503 store_unavailable naming the run, and nothing is written."""
    advert(med, "X")
    med.submit(chain("a", "one"))
    s = med.claim("a", 0, "X")
    tries = []
    monkeypatch.setattr(Tx, "apply_result", lambda self, *a: tries.append(1) or Applied(False))
    with pytest.raises(StoreUnavailable) as e:
        med.report("a", 0, "X", s.attempt, "pass")
    assert e.value.message == "Run a changed too often to record this result; try again."
    assert len(tries) == 11
    monkeypatch.undo()
    assert med.get_run("a").steps[0].state == "CLAIMED"


def test_a_late_result_that_frees_nothing_does_not_wake(med, wakes):
    """R14: a result wakes the queue when it moved the run, or when — late, for an ended run —
    it freed its node; a late result whose node was already free sweeps nothing."""
    advert(med, "X")
    advert(med, "Y", scope=True)
    med.submit(contract("a", dut={"board": "x"}, bench={"scope": True}))
    s = claim_next(med, "X")
    med.cancel("a")  # X keeps its lease: its claimed step is still running (I2's exception)
    wakes.clear()
    with pytest.raises(Conflict):
        med.report("a", s.seq, "X", s.attempt, "pass")  # late: frees X
    assert wakes == [1]
    wakes.clear()
    with pytest.raises(Conflict):
        med.report("a", s.seq, "X", s.attempt, "pass")  # again: nothing left to free
    assert wakes == []


def ask_doc(run_id, *names, parallel=False):
    """A run of asks (one after another, or side by side) and then one exec step."""
    steps = []
    for i, n in enumerate(names):
        after = [] if parallel or i == 0 else [names[i - 1]]
        steps.append(
            {"name": n, "kind": "ask", "ask": f"{n}?", **({"after": after} if after else {})}
        )
    steps.append({"name": "run", "role": "dut", "after": list(names), "with": {"cmd": "true"}})
    return {"run_id": run_id, "roles": {"dut": {"board": "x"}}, "steps": steps}


def test_an_answer_raises_the_next_ask_and_pushes_it_after_commit(med, caplog):
    """§11, R12: an answer that makes the next ask due raises it in the answer's transaction and
    pushes it after the commit (logged with its run and step)."""
    advert(med, "X")
    med.submit(ask_doc("a", "first", "second"))
    [ask] = med.asks()
    caplog.clear()
    with caplog.at_level("INFO", logger="mediator"):
        med.answer(ask.ask_id, "yes")
    [nxt] = med.asks()
    assert (nxt.run_id, nxt.seq, nxt.question) == ("a", 1, "second?")
    assert f"ask {nxt.ask_id} raised for run a step 1" in caplog.text


def test_a_run_that_starts_with_an_ask_pushes_it_after_the_submit_commits(med, caplog):
    """R12: a run started at submit whose first step is an ask raises it in the submit's
    transaction and pushes it after the commit."""
    advert(med, "X")
    with caplog.at_level("INFO", logger="mediator"):
        med.submit(ask_doc("a", "go"))
    [ask] = med.asks()
    assert f"ask {ask.ask_id} raised for run a step 0" in caplog.text


def test_a_result_that_makes_an_ask_due_pushes_it_after_commit(med, caplog):
    advert(med, "X")
    doc = chain("a", "flash")
    doc["steps"].append({"name": "look", "kind": "ask", "ask": "Lit?", "after": ["flash"]})
    med.submit(doc)
    s = claim_next(med, "X")
    with caplog.at_level("INFO", logger="mediator"):
        med.report("a", s.seq, "X", s.attempt, "pass")
    [ask] = med.asks()
    assert f"ask {ask.ask_id} raised for run a step 1" in caplog.text


def test_an_answer_that_settles_the_run_seals_it(med):
    """§11, I6: a negative answer fails its step and skips what depends on it; the run, settled
    by the answer, is sealed after the commit like any other."""
    advert(med, "X")
    med.submit(ask_doc("a", "go"))
    [ask] = med.asks()
    assert med.answer(ask.ask_id, "no", ok=False).settled == "FAILED"
    assert med.records.verify("a").ok


def test_a_cancel_closes_the_runs_open_asks(med):
    advert(med, "X")
    med.submit(ask_doc("a", "go"))
    [ask] = med.asks()
    med.cancel("a")
    assert med.asks() == []
    with pytest.raises(Conflict) as c:
        med.answer(ask.ask_id, "yes")
    assert c.value.code == "ask_closed"


def test_which_nodes_have_work_is_what_work_answers_node_by_node(med):
    """The held polls' one read (§19): the nodes among those asked for that `work` would answer
    a step for; none asked, none answered (and no statement)."""
    advert(med, "X")
    advert(med, "Y", board="y")
    advert(med, "Z", board="z")
    med.submit(chain("a", "one"))
    med.submit(chain("b", "one", needs={"board": "y"}))
    claim_next(med, "Y")
    asked = ["X", "Y", "Z", "W"]
    assert med.nodes_with_work(asked) == {n for n in asked if med.work(n)} == {"X"}
    assert med.nodes_with_work([]) == set()


def test_a_node_advertised_by_another_principal_is_refused_naming_it(med):
    med.advert("X", {"board": "x"}, "i1", principal="alice")
    with pytest.raises(Forbidden) as e:
        med.advert("X", {"board": "x"}, "i1", principal="mallory")
    assert (e.value.code, e.value.message) == (
        "not_your_node", "Node X belongs to another principal.")  # fmt: skip


@pytest.mark.parametrize("change", ["restart", "at-boundary drain"])
def test_an_adverts_effects_on_a_run_hold_the_run_row_first(med, monkeypatch, change):
    """The locking rule (§9): restart detection and an at-boundary drain change a run only
    under its row's lock, taken before its steps are read — seen here from another connection
    while the advert reads the steps."""
    advert(med, "X")
    med.submit(chain("a", "one", "two"))
    med.claim("a", 0, "X")
    real, locks = Tx.lock_steps, []

    def watched(self, run_id):
        locks.append(run_locked_elsewhere(med, run_id))
        return real(self, run_id)

    monkeypatch.setattr(Tx, "lock_steps", watched)
    if change == "restart":
        advert(med, "X", instance="i2")
    else:
        advert(med, "X", drain="at-boundary")
    assert locks == [True]
