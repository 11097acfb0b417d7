"""issue 13: a result is one unlocked read and one guarded write — and still exact under races.

A result used to lock its run (FOR UPDATE) for a whole transaction, which serialised two steps of
one run reporting at the same moment. Now each reads the run without a lock, decides in Python
(mediator.core.progress) and writes in one statement guarded by the run's version: when both decided
from the same read, exactly one write matches, the other matches nothing, reads again and decides
from what the first left. So the run settles exactly once — never twice, never not at all.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from mediator import Conflict, Mediator, Outcome
from mediator.core.progress import decide_result
from mediator.core.rows import ResultSource
from tests.db.conftest import advert, contract


def two_role_run(med: Mediator, run_id: str) -> dict[str, int]:
    """A run with one step on X and one on Y, both CLAIMED: {node: attempt}."""
    sub = med.submit(contract(run_id, dut={"board": "x"}, aux={"board": "y"}))
    assert sub.outcome == Outcome.STARTED, sub
    attempts = {}
    for node in ("X", "Y"):
        (s,) = [w for w in med.work(node) if w.run_id == run_id]
        attempts[node] = med.claim(run_id, s.seq, node, "i1").attempt
    return attempts


def seq_of(src: ResultSource, node: str) -> int:
    return next(s.seq for s in src.steps if s.node_id == node)


def facts(med: Mediator, run_id: str) -> tuple[str, int, int]:
    with med.store.autocommit() as tx:
        row = tx.conn.execute(
            "SELECT (SELECT state FROM runs WHERE run_id = %s),"
            " (SELECT count(*) FROM events WHERE run_id = %s AND kind = 'settled'),"
            " (SELECT count(*) FROM leases WHERE run_id = %s)",
            (run_id, run_id, run_id),
        ).fetchone()
    return row[0], int(row[1]), int(row[2])


def test_two_results_decided_from_one_read_apply_once_and_the_other_decides_again(med):
    # issue 13 §result: the guard, shown on the store alone. Both results read the run while
    # the other step is still CLAIMED, so each alone would decide "not settled"; both writes
    # start together; exactly one matches. The other reads again, sees its sibling PASSED,
    # and settles the run.
    advert(med, "X", board="x")
    advert(med, "Y", board="y")
    two_role_run(med, "r")
    with med.store.autocommit() as tx:
        src = tx.result_source("r", "X")
    assert src is not None
    decisions = {
        node: decide_result(src.run.state, src.steps, src.leases,
                            next(s for s in src.steps if s.node_id == node), node, 1, "pass",
                            max_attempts=3, instance_matches=True)
        for node in ("X", "Y")
    }  # fmt: skip
    assert all(d.run_to is None for d in decisions.values())  # neither alone settles
    barrier = threading.Barrier(2)
    applied: dict[str, Any] = {}

    def write(node: str) -> None:
        barrier.wait()
        with med.store.autocommit() as tx:
            applied[node] = tx.apply_result(src, node, decisions[node])

    threads = [threading.Thread(target=write, args=(n,)) for n in ("X", "Y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a.matched for a in applied.values()) == [False, True]
    (loser,) = [n for n, a in applied.items() if not a.matched]
    assert facts(med, "r") == ("RUNNING", 0, 1)  # the loser wrote nothing: its node still held

    with med.store.autocommit() as tx:
        again = tx.result_source("r", loser)
    assert again is not None and again.version > src.version
    step = next(s for s in again.steps if s.node_id == loser)
    d = decide_result(again.run.state, again.steps, again.leases, step, loser, 1, "pass",
                      max_attempts=3, instance_matches=True)  # fmt: skip
    assert d.settled == "PASSED"
    with med.store.autocommit() as tx:
        assert tx.apply_result(again, loser, d).matched
    assert facts(med, "r") == ("PASSED", 1, 0)


def report_together(meds: list[Mediator], run_id: str, attempts: dict[str, int]) -> dict:
    """X's result through meds[0] and Y's through meds[1], released by one barrier."""
    seqs = {s.node_id: s.seq for s in meds[0].get_run(run_id).steps}
    barrier = threading.Barrier(2)
    out: dict[str, Any] = {}

    def report(med: Mediator, node: str) -> None:
        barrier.wait()
        out[node] = med.report(run_id, seqs[node], node, attempts[node], "pass", instance="i1")

    threads = [
        threading.Thread(target=report, args=(m, n)) for m, n in zip(meds, "XY", strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_two_steps_of_one_run_reporting_at_the_same_moment_settle_it_exactly_once(
    dsn, clock, tmp_path
):
    # issue 13: the race the FOR UPDATE used to serialise, through the public interface, on two
    # Mediators (two connections, as two HTTP workers would be). For every run, exactly one of
    # the two results answers `settled`, one `settled` event is written, no lease is left, and
    # the record is sealed.
    meds = [
        Mediator.connect(dsn, clock=clock, records_root=str(tmp_path / "records")) for _ in range(2)
    ]
    try:
        advert(meds[0], "X", board="x")
        advert(meds[0], "Y", board="y")
        for i in range(12):
            run_id = f"race{i}"
            out = report_together(meds, run_id, two_role_run(meds[0], run_id))
            assert sorted(r.settled for r in out.values()) == ["", "PASSED"], (run_id, out)
            assert facts(meds[0], run_id) == ("PASSED", 1, 0)
            assert meds[0].get_run(run_id).sealed
    finally:
        for m in meds:
            m.close()


def test_a_cancel_between_a_result_s_read_and_its_write_makes_it_decide_again(med):
    # issue 13: every locked writer bumps the run's version (here cancel, docs/design.md §10),
    # so a result decided before it matches nothing and, read again, is a late result.
    advert(med, "X", board="x")
    advert(med, "Y", board="y")
    two_role_run(med, "c")
    with med.store.autocommit() as tx:
        src = tx.result_source("c", "X")
    assert src is not None
    step = next(s for s in src.steps if s.node_id == "X")
    d = decide_result(src.run.state, src.steps, src.leases, step, "X", 1, "pass",
                      max_attempts=3, instance_matches=True)  # fmt: skip
    med.cancel("c")
    with med.store.autocommit() as tx:
        assert not tx.apply_result(src, "X", d).matched
        again = tx.result_source("c", "X")
    assert again is not None and again.run.state == "FAILED"
    late = decide_result(again.run.state, again.steps, again.leases, step, "X", 1, "pass",
                         max_attempts=3, instance_matches=True)  # fmt: skip
    with med.store.autocommit() as tx:
        applied = tx.apply_result(again, "X", late)
    assert applied.matched and applied.released == ("X",)  # I2's exception ends here


def test_a_drain_advert_between_a_result_s_read_and_its_write_makes_it_decide_again(med):
    # The guard covers the node rows too: Y starts draining at the boundary after the read
    # (an advert writes the node, not the run), so the write must not match — decided again,
    # the result ends the run drained, as it would have with the drain seen first.
    advert(med, "X", board="x")
    advert(med, "Y", board="y")
    sub = med.submit(contract("d", dut={"board": "x"}, aux={"board": "y"}))
    assert sub.outcome == Outcome.STARTED
    (sx,) = med.work("X")
    med.claim("d", sx.seq, "X", "i1")
    with med.store.autocommit() as tx:
        src = tx.result_source("d", "X")
    assert src is not None
    step = next(s for s in src.steps if s.node_id == "X")
    d = decide_result(src.run.state, src.steps, src.leases, step, "X", 1, "pass",
                      max_attempts=3, instance_matches=True)  # fmt: skip
    assert d.run_to is None
    with med.store.autocommit() as tx:  # the drain's advert upsert alone, without its effects
        tx.upsert_advert("Y", "Y", "", {"board": "y"}, "i1", "at-boundary", 60.0, 60.0)
        assert not tx.apply_result(src, "X", d).matched
        again = tx.result_source("d", "X")
    assert again is not None
    d2 = decide_result(again.run.state, again.steps, again.leases, step, "X", 1, "pass",
                       max_attempts=3, instance_matches=True)  # fmt: skip
    assert (d2.settled, d2.verdict) == ("FAILED", "drained")


def test_a_result_that_keeps_losing_races_takes_the_run_lock_and_completes(med, monkeypatch):
    # issue 13: optimistic tries are bounded. Here every unlocked read is followed at once by a
    # real write to the run from another connection (as a claim of another step would), so the
    # first three writes match nothing; the fourth try takes the run row first (docs/design.md
    # §9), reads under that lock and cannot lose. The result is recorded exactly once.
    from mediator.store.tx import Tx

    advert(med, "X", board="x")
    advert(med, "Y", board="y")
    attempts = two_role_run(med, "busy")
    seq_x = next(s.seq for s in med.get_run("busy").steps if s.node_id == "X")
    reads = []
    original = Tx.result_source

    def read_then_lose_the_race(self, run_id, node_id):
        src = original(self, run_id, node_id)
        reads.append(self.conn.info.transaction_status.name)
        if len(reads) <= 3:  # another writer bumps the run's version between read and write
            with med.store.pool.connection() as other:
                other.execute("UPDATE runs SET version = version + 1 WHERE run_id = 'busy'")
        return src

    monkeypatch.setattr(Tx, "result_source", read_then_lose_the_race)
    result = med.report("busy", seq_x, "X", attempts["X"], "pass", instance="i1")
    assert reads == ["IDLE", "IDLE", "IDLE", "INTRANS"]  # three unlocked reads, one under lock
    assert (result.settled, result.released) == ("", ("X",))  # Y still runs: partial release
    assert facts(med, "busy") == ("RUNNING", 0, 1)
    with med.store.autocommit() as tx:
        kinds = [k for (k,) in tx.conn.execute(
            "SELECT kind FROM events WHERE run_id = 'busy' AND kind = 'result'")]  # fmt: skip
    assert kinds == ["result"]


def test_the_record_sealed_from_the_result_s_own_write_is_the_one_a_read_would_give(med, tmp_path):
    # issue 13: the result that settles a run returns its record's source from the same
    # statement (events before and just written, logs as left), so the seal reads nothing. The
    # files must be byte for byte those a seal from seal_source after the commit writes.
    from mediator.records import Records

    advert(med, "X", board="x")
    doc = contract("rec", steps=3, dut={"board": "x"})
    doc["steps"][1]["after"] = [doc["steps"][0]["name"]]
    med.submit(doc)
    first = med.claim("rec", 0, "X", "i1")
    med.report("rec", 0, "X", first.attempt, "retry", log="flaky\n", instance="i1")
    again = med.claim("rec", 0, "X", "i1")
    med.report("rec", 0, "X", again.attempt, "fail", log="broke\x00\n", instance="i1")  # skips 1
    last = med.claim("rec", 2, "X", "i1")
    result = med.report("rec", 2, "X", last.attempt, "pass", log="ok\n", instance="i1")
    assert result.settled == "FAILED" and med.get_run("rec").sealed

    other = Records(tmp_path / "from-a-read")
    with med.store.autocommit() as tx:
        src = tx.seal_source("rec")
    assert src is not None
    assert other.seal("rec", contract=src.contract, state=src.state, verdict=src.verdict,
                      ended_at=src.ended_at.isoformat() if src.ended_at else None,
                      events=src.events, step_logs=[tuple(x) for x in src.logs])  # fmt: skip

    def files(root):
        return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    sealed = files(med.records.dir("rec"))
    assert sealed == files(other.dir("rec"))
    assert len(sealed) == 6  # contract, events, seal and three step logs


# ---- the claim's snapshot (mediator/flows/claimed.py) -----------------------------------------


def statements(med: Mediator, monkeypatch: Any) -> list[str]:
    """The named statements the Mediator sends from now on, in order."""
    from mediator.store.tx import Tx

    sent: list[str] = []
    rows = Tx._rows

    def counting(tx: Tx, name: str, params: Any = None, row: Any = None) -> list[Any]:
        sent.append(name)
        return rows(tx, name, params, row)

    monkeypatch.setattr(Tx, "_rows", counting)
    return sent


def test_a_result_decides_from_its_claims_snapshot_without_a_read(med, monkeypatch):
    # issue 13: the claim returns the run as it left it; the result that follows in the same
    # process writes from it straight away — no result_source — and the record is the same.
    advert(med, "X")
    med.submit(contract("snap"))
    (step,) = med.work("X")
    claimed = med.claim("snap", step.seq, "X", "i1")
    assert len(med.ctx.claimed) == 1
    sent = statements(med, monkeypatch)
    out = med.report("snap", step.seq, "X", claimed.attempt, "pass", instance="i1")
    assert out.settled == "PASSED"
    assert sent == ["apply_result", "sweep_head"]  # the seal's mark carries the wake's read
    assert len(med.ctx.claimed) == 0
    assert facts(med, "snap") == ("PASSED", 1, 0)


def test_a_snapshot_that_went_stale_loses_its_write_and_the_result_reads_again(med, monkeypatch):
    # Between X's claim and its result, Y's step is claimed (the run's version moves): the
    # snapshot still shows Y PENDING. Its write matches nothing; the result reads, decides
    # again, and the run settles only when Y's result comes — exactly as without a snapshot.
    advert(med, "X", board="x")
    advert(med, "Y", board="y")
    med.submit(contract("stale", dut={"board": "x"}, aux={"board": "y"}))
    (sx,) = med.work("X")
    cx = med.claim("stale", sx.seq, "X", "i1")
    (sy,) = med.work("Y")
    cy = med.claim("stale", sy.seq, "Y", "i1")
    med.ctx.claimed.take("stale", sy.seq, "Y", cy.attempt)  # Y's result will read (its own case)
    sent = statements(med, monkeypatch)
    first = med.report("stale", sx.seq, "X", cx.attempt, "pass", instance="i1")
    assert sent[:3] == ["apply_result", "result_source", "apply_result"]
    assert first.settled == "" and facts(med, "stale") == ("RUNNING", 0, 1)  # X released
    second = med.report("stale", sy.seq, "Y", cy.attempt, "pass", instance="i1")
    assert second.settled == "PASSED" and facts(med, "stale") == ("PASSED", 1, 0)


def test_a_snapshot_never_answers_for_a_daemon_that_restarted_since(med):
    # The node re-advertised with a new daemon instance after the claim: the snapshot knows
    # only the old one, so its write must not match. The answer and what is left must be the
    # ones a result that reads gets (restart detection, docs/design.md §9): shown side by side.
    outcomes = []
    for run_id, keep in (("with-snapshot", True), ("without", False)):
        advert(med, "X", instance="i1")
        med.submit(contract(run_id))
        (step,) = med.work("X")
        claimed = med.claim(run_id, step.seq, "X", "i1")
        if not keep:
            assert med.ctx.claimed.take(run_id, step.seq, "X", claimed.attempt) is not None
        advert(med, "X", instance="i2")
        with pytest.raises(Conflict) as err:
            med.report(run_id, step.seq, "X", claimed.attempt, "pass", instance="i1")
        run = med.get_run(run_id)
        outcomes.append((err.value.code, run.state, run.verdict, run.steps[0].state))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] in ("run_ended", "stale_instance") and outcomes[0][3] != "PASSED"


def test_a_cancel_after_the_claim_makes_the_snapshots_result_a_late_one(med):
    advert(med, "X")
    med.submit(contract("gone"))
    (step,) = med.work("X")
    claimed = med.claim("gone", step.seq, "X", "i1")
    med.cancel("gone")
    with pytest.raises(Conflict) as err:
        med.report("gone", step.seq, "X", claimed.attempt, "pass", instance="i1")
    assert err.value.code == "run_ended"
    assert facts(med, "gone")[0] == "FAILED" and facts(med, "gone")[2] == 0


def test_snapshots_are_bounded_even_when_daemons_claim_and_never_report(med):
    # docs/security.md: a daemon that dies after claiming leaves its snapshot; at ten times the
    # limit the process still holds at most the limit, the newest ones.
    from mediator.flows.claimed import ClaimedRuns

    med.ctx.claimed = ClaimedRuns(limit=3)
    for i in range(30):
        advert(med, f"N{i}", board=f"b{i}")
        med.submit(contract(f"c{i}", dut={"board": f"b{i}"}))
        (step,) = med.work(f"N{i}")
        med.claim(f"c{i}", step.seq, f"N{i}", "i1")
    assert len(med.ctx.claimed) == 3
    assert med.ctx.claimed.take("c29", 0, "N29", 1) is not None
    assert med.ctx.claimed.take("c0", 0, "N0", 1) is None


def test_a_run_with_a_large_contract_is_not_kept_and_its_result_reads(med, monkeypatch):
    # docs/security.md: what the snapshots can hold is bounded in bytes too — a contract over
    # the cap (a submitter may send 1 MiB) is not kept; its result reads, and is the same.
    from mediator.flows.claimed import MAX_BYTES

    advert(med, "X")
    doc = contract("large")
    doc["steps"][0]["uses"] = "blob"  # a plugin: only a built-in's `with` is checked
    doc["steps"][0]["with"] = {"blob": "x" * (MAX_BYTES + 1)}
    med.submit(doc)
    (step,) = med.work("X")
    claimed = med.claim("large", step.seq, "X", "i1")
    assert len(med.ctx.claimed) == 0
    sent = statements(med, monkeypatch)
    out = med.report("large", step.seq, "X", claimed.attempt, "pass", instance="i1")
    assert out.settled == "PASSED" and sent[:2] == ["result_source", "apply_result"]


def _claims_snapshot_and_a_fresh_read(med: Mediator, run_id: str, node: str) -> ResultSource:
    """Claim ``node``'s lowest claimable step of ``run_id``; its snapshot must be exactly the
    ``result_source`` read taken right after it. The two statements list the run's, steps' and
    node's columns separately (queries.sql ``claim_step`` and ``result_source``): a column added
    to one and not the other would make results decide from a different run than a read gives."""
    step = min((w for w in med.work(node) if w.run_id == run_id), key=lambda w: w.seq)
    claimed = med.claim(run_id, step.seq, node, "i1")
    kept = med.ctx.claimed.take(run_id, step.seq, node, claimed.attempt)
    assert kept is not None, "a small run's claim keeps its snapshot"
    with med.store.autocommit() as tx:
        read = tx.result_source(run_id, node)
    assert kept == read
    return kept


def test_a_claims_snapshot_is_exactly_what_a_fresh_read_returns(med):
    # issue 13 (the claim's snapshot): every shape a result decides from — several steps with
    # `after`, a step already PASSED, a parameterised `with`, two roles with an at-boundary
    # drained node among the leases, and an ask step waiting.
    advert(med, "X", board="x")
    advert(med, "Y", board="y")
    doc = contract("shapes", steps=2, dut={"board": "x"}, aux={"board": "y"})
    doc["steps"][1]["after"] = ["dut-0"]
    doc["steps"][1]["uses"] = "blob"  # a plugin: only a built-in's `with` is checked
    doc["steps"][1]["with"] = {"cmd": "make", "args": ["-j", 2**70], "env": {"K": None}}
    doc["steps"].append({"name": "check", "kind": "ask", "ask": "Looks right?", "after": ["dut-1"]})
    assert med.submit(doc).outcome == Outcome.STARTED
    _claims_snapshot_and_a_fresh_read(med, "shapes", "X")  # dut-0; dut-1 waits on it
    med.report("shapes", 0, "X", 1, "pass", instance="i1")
    _claims_snapshot_and_a_fresh_read(med, "shapes", "Y")  # aux-0
    advert(med, "Y", drain="at-boundary", board="y")  # Y keeps its lease while aux-0 runs
    last = _claims_snapshot_and_a_fresh_read(med, "shapes", "X")  # dut-1: after a PASSED step
    assert [(x.node_id, x.drain) for x in last.leases] == [("X", ""), ("Y", "at-boundary")]
    assert [s.state for s in last.steps] == ["PASSED", "CLAIMED", "CLAIMED", "PENDING", "PENDING"]
    assert last.steps[1].with_["args"] == ["-j", 2**70] and last.node is not None
