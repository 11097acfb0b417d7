"""Submit (docs/design.md §5; seed 000 R1–R5, NFR-I6, NFR-I7) on the real database."""

from __future__ import annotations

import threading

import pytest

from mediator import ContractError, Mediator, NotFound, Outcome
from tests.db.conftest import advert, contract


def count(med, table):
    with med.store.autocommit() as tx:
        return tx.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_r1_all_busy_is_202_queued_and_no_candidate_is_422_failed(med):
    """R1: only 'candidates exist but all busy' waits; a need no node has fails at once."""
    advert(med, "X")
    assert med.submit(contract("a")).outcome == Outcome.STARTED
    b = med.submit(contract("b"))
    assert (b.outcome, b.run.state, b.run.verdict) == (Outcome.QUEUED, "QUEUED", None)
    c = med.submit(contract("c", dut={"board": "no-such-board"}))
    assert (c.outcome, c.run.state, c.run.verdict) == (Outcome.REJECTED, "FAILED", "rejected")
    assert c.run.reject["code"] == "NO_CANDIDATE" and c.run.reject["role"] == "dut"
    assert med.get_run("c").state == "FAILED"  # 422 stays FAILED


def test_r1_width_cap_at_submit_is_422(dsn, clock, tmp_path):
    """R1: a run wider than max_width at t=0 is refused (422), not queued."""
    from mediator import Config

    with Mediator.connect(dsn, Config(max_width=1), clock, records_root=str(tmp_path)) as med:
        advert(med, "N1", board="x")
        advert(med, "N2", scope=True)
        sub = med.submit(contract("wide", dut={"board": "x"}, bench={"scope": True}))
        assert (sub.outcome, sub.run.reject["code"], sub.run.reject["width"]) == (
            Outcome.REJECTED,
            "TOO_WIDE",
            2,
        )


def test_202_body_has_neither_assigned_nor_reject(med):
    """docs/design.md §7: the 202 body is the run as committed: QUEUED, no assigned, no reject."""
    advert(med, "X")
    med.submit(contract("a"))
    body = med.submit(contract("b")).body()
    assert body["state"] == "QUEUED"
    assert "assigned" not in body and "reject" not in body


def test_r2_node_taken_at_create_takes_the_queue_path(dsn, med, clock, tmp_path):
    """R2: ErrNodeTaken (a lease conflict in CreateRun) is treated like ALL_BUSY → 202 QUEUED.

    The interleaving is forced: between this submit's fleet read and its insert, another
    Mediator process (its own connection) takes the node.
    """
    advert(med, "X")
    other = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path / "o"))
    try:
        med._after_fleet_read = lambda run_id: other.submit(contract("thief"))
        sub = med.submit(contract("victim"))
    finally:
        other.close()
    assert (sub.outcome, sub.run.state) == (Outcome.QUEUED, "QUEUED")
    with med.store.autocommit() as tx:
        assert tx.busy_nodes() == {"X"}
        assert [r.node_id for r in tx.run_leases("thief")] == ["X"]
        assert tx.run_leases("victim") == []  # I5: the rolled-back CreateRun left nothing


def test_r3_resubmitting_a_queued_run_is_200_with_the_stored_run(med):
    """R3, NFR-I7: GetRun heads submit; 202 happens once, when the row comes to exist."""
    advert(med, "X")
    med.submit(contract("a"))
    first = med.submit(contract("b"))
    again = med.submit(contract("b", dut={"board": "changed"}))  # not even re-validated
    assert (first.outcome, again.outcome) == (Outcome.QUEUED, Outcome.EXISTING)
    assert again.run.state == "QUEUED" and again.run.run_id == "b"
    assert count(med, "runs") == 2


def test_r3_an_existing_run_is_answered_even_when_the_contract_sent_again_does_not_parse(med):
    """R3, NFR-I7: the lookup rides on the submit's one read (issue 13), after the parse; a
    resubmission that would be a 400 on its own is still the existing run, 200, and writes
    nothing — a dry run too. An unknown run_id with the same contract is the 400 it always was."""
    advert(med, "X")
    assert med.submit(contract("a")).outcome == Outcome.STARTED
    broken = {"run_id": "a", "roles": "not an object", "steps": []}
    again = med.submit(broken)
    assert (
        again.outcome == Outcome.EXISTING
        and again.run.run_id == "a"
        and again.run.state == "RUNNING"
    )
    dry = med.submit(broken, dry_run=True)
    assert dry.outcome == Outcome.EXISTING and dry.run.run_id == "a"
    with pytest.raises(ContractError):
        med.submit({**broken, "run_id": "unknown"})
    assert count(med, "runs") == 1


def test_r3_resubmitting_is_200_whatever_the_state(med):
    advert(med, "X")
    assert med.submit(contract("a")).outcome == Outcome.STARTED
    assert med.submit(contract("a")).outcome == Outcome.EXISTING
    assert med.submit(contract("r", dut={"board": "none"})).outcome == Outcome.REJECTED
    assert med.submit(contract("r", dut={"board": "none"})).outcome == Outcome.EXISTING


def test_r3_the_same_run_submitted_twice_at_once_is_one_row_and_one_200(dsn, clock, tmp_path):
    """R3: an insert that hits the run_id primary key re-reads and answers 200."""
    meds = [Mediator.connect(dsn, clock=clock, records_root=str(tmp_path)) for _ in range(4)]
    try:
        advert(meds[0], "X")
        advert(meds[0], "Y", board="y")
        meds[0].submit(contract("blocker"))  # X busy: the duplicates go the queue path
        barrier = threading.Barrier(len(meds))
        statuses = []

        def go(m):
            barrier.wait(timeout=10)
            statuses.append(m.submit(contract("dup")).outcome)

        threads = [threading.Thread(target=go, args=(m,)) for m in meds]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sorted(statuses) == [Outcome.EXISTING] * 3 + [Outcome.QUEUED]
        assert count(meds[0], "runs WHERE run_id = 'dup'") == 1
        assert count(meds[0], "steps WHERE run_id = 'dup'") == 1
    finally:
        for m in meds:
            m.close()


def test_r4_r5_a_queued_run_holds_nothing_and_has_its_steps(med):
    """R4/I3: no lease, every step PENDING with node_id '', no ask, no chosen. R5: steps exist."""
    advert(med, "X")
    med.submit(contract("a"))
    doc = contract("b", steps=2)
    doc["steps"].append({"name": "ok?", "kind": "ask", "ask": "Is the probe on?"})
    run = med.submit(doc).run
    assert run.state == "QUEUED"
    assert [(s.state, s.node_id, s.chosen) for s in run.steps] == [("PENDING", "", None)] * 3
    with med.store.autocommit() as tx:
        assert tx.run_leases("b") == []
    assert med.asks() == []  # raiseAsks deferred to promotion (R4)


def test_r5_malformed_contract_is_contract_error_naming_the_field_and_writes_nothing(med):
    """R5: structure is checked synchronously at submit; nothing is written."""
    advert(med, "X")
    bad = contract("bad")
    bad["steps"][0]["after"] = ["nope"]
    with pytest.raises(ContractError) as e:
        med.submit(bad)
    assert e.value.field == "steps[0].after"
    with pytest.raises(ContractError) as e:
        med.submit({"run_id": "../etc", "roles": {}, "steps": []})
    assert e.value.field == "run_id"
    assert count(med, "runs") == 0 and count(med, "events") == 0


def test_dry_run_creates_nothing_and_ignores_drain(med):
    """NFR-I6: a dry run matches with unavailable = busy only, so draining does not change it."""
    med.advert("X", {"board": "x"}, "i1")
    before = med.submit(contract("d"), dry_run=True)
    med.advert("X", {"board": "x"}, "i1", drain="graceful")
    after = med.submit(contract("d"), dry_run=True)
    assert before.outcome == after.outcome == Outcome.DRY_RUN
    assert before.body() == after.body() == {"dry_run": True, "assigned": {"dut": "X"}, "width": 1}
    assert count(med, "runs") == 0
    refused = med.submit(contract("z", dut={"board": "q"}), dry_run=True).body()
    assert (refused["dry_run"], refused["reject"]["code"]) == (True, "NO_CANDIDATE")


def test_generated_run_ids_are_time_ordered_from_the_mediators_clock(med, clock):
    advert(med, "X")
    doc = contract()
    first = med.submit(doc).run.run_id
    clock.advance(1)
    second = med.submit(doc).run.run_id
    assert first.startswith("20310301T120000") and first < second


def test_unknown_run_is_not_found_plainly(med):
    with pytest.raises(NotFound) as e:
        med.get_run("nope")
    assert e.value.code == "unknown_run" and "nope" in e.value.message


def test_rejected_run_record_is_opened_and_sealed(med):
    """design.md §7: 422 → FAILED; its record is opened and sealed at once (design.md §5)."""
    sub = med.submit(contract("r", dut={"board": "none"}))
    assert sub.outcome == Outcome.REJECTED
    check = med.records.verify("r")
    assert check.ok and check.sealed
    assert med.get_run("r").steps[0].state == "SKIPPED"


# ---- issue 12 §3: TOO_WIDE at submit is permanent only when it must be (R1, R10, amended) ----


def _f_p_q(med):
    """max_width=1. F has p and q; P has p; Q has q. Roles a{p}, b{q} fit on F alone (width 1)
    and are width 2 on P and Q."""
    med.advert("F", {"p": True, "q": True}, "i")
    med.advert("P", {"p": True}, "i")
    med.advert("Q", {"q": True}, "i")
    return contract("w", a={"p": True}, b={"q": True})


def test_too_wide_only_because_a_node_is_busy_is_queued_with_wait_reason_too_wide(
    dsn, clock, tmp_path
):
    """issue 12 §3, R1's premise ("resubmitting gives the same answer"): F is busy, so the
    match is P+Q, width 2 > 1 — but with F free the same contract runs at width 1. So it waits
    (202) with wait_reason TOO_WIDE, and F's release promotes it onto F alone."""
    from mediator import Config

    with Mediator.connect(dsn, Config(max_width=1), clock, records_root=str(tmp_path)) as med:
        wide = _f_p_q(med)
        assert (
            med.submit(contract("busy-f", a={"p": True}, b={"q": True})).outcome == Outcome.STARTED
        )
        sub = med.submit(wide)
        assert (sub.outcome, sub.run.state, sub.run.verdict) == (Outcome.QUEUED, "QUEUED", None)
        assert med.get_run("w").wait_reason["code"] == "TOO_WIDE"
        for s in med.get_run("busy-f").steps:
            c = med.claim("busy-f", s.seq, "F")
            med.report("busy-f", s.seq, "F", c.attempt, "pass")  # F frees: wake 1
        run = med.get_run("w")
        assert (run.state, run.assigned) == ("RUNNING", {"a": "F", "b": "F"})


def test_too_wide_even_with_every_node_free_is_still_422(dsn, clock, tmp_path):
    """issue 12 §3: without F no assignment can ever be narrow enough: refused at once — also
    while P is busy (ALL_BUSY now, but it could never be promoted: the same 422 as when P is
    free, so the answer does not depend on what happens to be busy)."""
    from mediator import Config

    with Mediator.connect(dsn, Config(max_width=1), clock, records_root=str(tmp_path)) as med:
        med.advert("P", {"p": True}, "i")
        med.advert("Q", {"q": True}, "i")
        busy_p = med.submit(contract("busy-p", a={"p": True}))
        assert busy_p.outcome == Outcome.STARTED  # P busy, too
        sub = med.submit(contract("w", a={"p": True}, b={"q": True}))
        assert (sub.outcome, sub.run.verdict, sub.run.reject["code"]) == (
            Outcome.REJECTED, "rejected", "TOO_WIDE",
        )  # fmt: skip


# ---- issue 12 §7: the events vocabulary and what the flows emit agree ----


def test_event_kinds_the_database_accepts_are_exactly_the_documented_vocabulary(med):
    """issue 12 §7: `queued` was in the vocabulary but never emitted (a queued submit writes
    `submitted{state: QUEUED}`). The vocabulary is now closed: the database refuses any other
    kind, and a lifecycle that touches every flow emits every listed kind and nothing else."""
    from mediator.core.errors import MediatorError
    from mediator.core.rows import EVENT_KINDS

    with pytest.raises(MediatorError), med.store.tx() as tx:
        tx.insert_events([{"run_id": "x", "kind": "queued", "data": {}}])
    advert(med, "X")
    doc = contract("a")
    doc["steps"].append({"name": "ok?", "kind": "ask", "ask": "Looks fine?", "after": ["dut-0"]})
    med.submit(doc)  # submitted, lease_granted
    q = med.submit(contract("q"))  # submitted{state: QUEUED}
    assert q.outcome == Outcome.QUEUED
    med.submit(contract("r", dut={"board": "none"}))  # rejected
    [step] = med.work("X")
    c = med.claim("a", step.seq, "X")  # claimed
    med.report("a", step.seq, "X", c.attempt, "pass")  # result, ask_raised
    [ask] = med.asks()
    med.answer(ask.ask_id, "yes")  # ask_answered, settled, lease_released, promoted (q)
    med.cancel("q")  # cancelled
    with med.store.autocommit() as tx:
        kinds = {k for (k,) in tx.conn.execute("SELECT DISTINCT kind FROM events")}
        queued = tx.conn.execute(
            "SELECT data ->> 'state' FROM events WHERE run_id = 'q' AND kind = 'submitted'"
        ).fetchone()
    assert kinds == set(EVENT_KINDS)
    assert queued == ("QUEUED",)


def test_a_malformed_contract_without_a_run_id_is_refused_without_a_read(med, monkeypatch):
    """R3 first, at no cost when it cannot apply: a contract that does not parse is answered by
    the run its ``run_id`` names (read once), and one without a usable ``run_id`` is refused
    (400) without reading anything."""
    from mediator.flows import reads

    read, real = [], reads.read_run

    def counting(ctx, run_id):
        read.append(run_id)
        return real(ctx, run_id)

    monkeypatch.setattr(reads, "read_run", counting)
    for doc in ({"roles": "nope"}, {"run_id": "../x", "roles": "nope"}):
        with pytest.raises(ContractError):
            med.submit(doc)
    assert read == []
    with pytest.raises(ContractError):
        med.submit({"run_id": "r-1", "roles": "nope"})  # no such run: refused after one read
    assert read == ["r-1"]
    # Past the width search's budget, the same: no run_id, no read.
    from mediator.core.limits import MAX_SEARCH_NEEDS

    wide = {f"r{i:02d}": {f"k{i}": True} for i in range(MAX_SEARCH_NEEDS + 1)}
    with pytest.raises(ContractError) as e:
        med.submit(contract(**wide))
    assert (e.value.code, read) == ("width_search_too_large", ["r-1"])


def test_r3_a_run_id_taken_between_the_fleet_read_and_the_insert_answers_the_stored_run(
    dsn, med, clock, tmp_path
):
    """R3 under a race: another process submits the same run_id between this submit's fleet
    read and its insert. Whether this submit would have started (X free), queued (X busy) or been
    refused (no node has board z), its insert finds the run_id taken and it answers 200 EXISTING
    with the run the other stored."""
    advert(med, "X")
    advert(med, "Y", board="y")
    other = Mediator.connect(dsn, clock=clock, records_root=str(tmp_path / "o"))
    try:
        for run_id, board in (("would-start", "x"), ("would-queue", "x"), ("refused", "z")):
            if run_id == "would-queue":
                assert med.submit(contract("holder")).outcome == Outcome.STARTED  # X busy
            med._after_fleet_read = lambda rid: other.submit(contract(rid, dut={"board": "y"}))
            sub = med.submit(contract(run_id, dut={"board": board}))
            med._after_fleet_read = None
            assert (sub.outcome, sub.run.run_id) == (Outcome.EXISTING, run_id)
            assert sub.run.assigned == {"dut": "Y"}  # the run the other stored, on Y
            other.cancel(run_id)  # Y free again
    finally:
        other.close()


def test_a_submits_events_say_what_it_decided(med):
    """docs/design.md §13: a start's events carry its state and nodes (``submitted``) and name
    each leased node (``lease_granted``); a refusal's (``rejected``) carries the reason."""
    advert(med, "X")
    med.submit(contract("a"))
    med.submit(contract("r", dut={"board": "none"}))
    with med.store.autocommit() as tx:
        rows = tx.conn.execute(
            "SELECT run_id, kind, node_id, data FROM events ORDER BY id"
        ).fetchall()
    assert rows[:2] == [
        ("a", "submitted", "", {"state": "RUNNING", "assigned": {"dut": "X"}}),
        ("a", "lease_granted", "X", {}),
    ]
    [(_run, _kind, node, data)] = [r for r in rows if r[0] == "r" and r[1] == "rejected"]
    assert (node, data["reject"]["code"]) == ("", "NO_CANDIDATE")


@pytest.mark.parametrize("outcome", ["started", "queued", "rejected"])
def test_the_record_is_opened_with_the_contract_on_every_path(med, outcome):
    """I6 (docs/design.md §12): a submit that wrote a run opens its record with the contract as
    committed — started, queued or refused alike."""
    import json

    advert(med, "X")
    if outcome == "queued":
        med.submit(contract("first"))  # X is busy now
    doc = contract("a", dut={"board": "nowhere" if outcome == "rejected" else "x"})
    sub = med.submit(doc)
    assert (
        sub.run.state == {"started": "RUNNING", "queued": "QUEUED", "rejected": "FAILED"}[outcome]
    )
    opened = json.loads(med.records.read_file("a", "contract.json") or b"null")
    assert (opened["run_id"], opened["roles"], opened["steps"]) == (
        "a", doc["roles"], doc["steps"])  # fmt: skip
