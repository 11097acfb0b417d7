"""Fair under floods (docs/security.md "Fair under floods", docs/performance.md): one principal
queueing runs each in its own needs class must not make everyone else's calls slow.

Worked examples over HTTP on the real database: the per-principal caps on QUEUED runs and on
their distinct needs classes answer 429 with Retry-After, count only that principal's QUEUED
runs, and leave other principals alone.
"""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient

from mediator import Config
from mediator.api import create_app
from mediator.api.auth import Tokens
from tests.db.conftest import advert, contract
from tests.db.test_api import bearer, finish, node

TN1, TC1, TC2 = "tn1-0123456789abcdef", "tc1-0123456789abcdef", "tc2-0123456789abcdef"
ALICE, BOB = bearer(TC1), bearer(TC2)


@pytest.fixture
def config() -> Config:
    return Config(max_queued_runs_per_principal=3, max_queued_classes_per_principal=2)


@pytest.fixture
def capped(med, clock, tmp_path):
    p = tmp_path / "tokens.toml"
    p.write_text(
        "\n".join(
            f'[[token]]\ntoken = "{t}"\nprincipal = "{who}"\nrole = "{r}"\n'
            for t, who, r in [
                (TN1, "lab", "node"),
                (TC1, "alice", "client"),
                (TC2, "bob", "client"),
            ]
        )
    )
    p.chmod(0o600)  # a tokens file must be private (docs/security.md)
    with TestClient(create_app(med, Tokens.load(str(p))), base_url="http://127.0.0.1") as c:
        c.clock = clock  # type: ignore[attr-defined]
        yield c


def queue(client, headers, board="x"):
    client.clock.advance(1)  # FIFO (R6) is by arrival: one second apart, never a tie
    return client.post("/v1/runs", json=contract(dut={"board": board}), headers=headers)


def test_a_principal_past_its_queued_runs_cap_is_429_with_retry_after_others_unaffected(capped):
    """Cap on QUEUED runs: the 4th queued run of alice is refused; bob still queues; a run that
    starts at once is never refused (the cap counts queued runs only); nothing was written."""
    headers = bearer(TN1)
    assert node(capped, "X", headers=headers, board="x").status_code == 200
    started = queue(capped, ALICE)
    assert started.status_code == 201  # X is leased now; alice's next runs of board x queue
    assert [queue(capped, ALICE).status_code for _ in range(3)] == [202, 202, 202]
    refused = queue(capped, ALICE)
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "10"
    error = refused.json()["error"]
    assert error["code"] == "too_many_queued"
    assert "max_queued_runs_per_principal" in error["message"]
    assert queue(capped, BOB).status_code == 202  # another principal is not affected
    listed = capped.get("/v1/runs?state=QUEUED", headers=ALICE).json()["runs"]
    assert len(listed) == 4  # alice's three and bob's one: the refused run was never written
    # The cap counts QUEUED runs only: when alice's running run ends, one of her queued runs
    # is promoted and she may queue one more.
    assert finish(capped, started.json()["run_id"], "X", headers=headers).status_code == 200
    assert queue(capped, ALICE).status_code == 202
    assert queue(capped, ALICE).status_code == 429


def test_a_principal_past_its_needs_classes_cap_is_429_yet_may_queue_in_its_classes(capped):
    """Cap on distinct needs classes: alice queues in two classes; a third is refused with 429
    naming the roles, a run of a class she already queues is not, and bob may open his own."""
    # No node at all serves boards a/b/c: with no live node the runs would be rejected, so one
    # busy node serves each board.
    headers = bearer(TN1)
    for board in "abc":
        assert node(capped, f"N{board}", headers=headers, board=board).status_code == 200
        assert queue(capped, BOB, board).status_code == 201  # bob keeps every node busy
    assert queue(capped, ALICE, "a").status_code == 202
    assert queue(capped, ALICE, "b").status_code == 202
    third = queue(capped, ALICE, "c")
    assert third.status_code == 429 and third.headers["Retry-After"] == "10"
    assert third.json()["error"]["field"] == "roles"
    assert third.json()["error"]["message"] == (
        "Your QUEUED runs already span 2 distinct needs classes, the most one principal may "
        "queue (max_queued_classes_per_principal 2); queue runs whose roles need the same as a "
        "queued run, or retry when some have started."
    )
    assert queue(capped, ALICE, "a").status_code == 202  # a class she already queues
    assert queue(capped, BOB, "c").status_code == 202  # bob's own classes are his


def test_a_dry_run_and_an_existing_run_id_are_never_capped(capped):
    """A dry run writes nothing, and R3 answers an existing run before anything counts."""
    headers = bearer(TN1)
    assert node(capped, "X", headers=headers, board="x").status_code == 200
    assert queue(capped, ALICE).status_code == 201
    for _ in range(3):
        assert queue(capped, ALICE).status_code == 202
    dry = capped.post("/v1/runs?dry_run=true", json=contract(dut={"board": "x"}), headers=ALICE)
    assert dry.status_code == 200
    queued = capped.get("/v1/runs?state=QUEUED", headers=ALICE).json()["runs"][0]["run_id"]
    again = capped.post("/v1/runs", json=contract(queued, dut={"board": "x"}), headers=ALICE)
    assert again.status_code == 200 and again.json()["state"] == "QUEUED"


# ---- docs/design.md §6 "Sweeps remember" ---------------------------------------------------------
FLOOD, BOARDS = 5_000, 10


def flood(med, clock, n=FLOOD):
    """``n`` QUEUED runs, each in its own needs class: run i needs two roles served by a node of
    board ``b{i % 10}``. Written in bulk (a submit per run would take minutes); the rows are what
    ``create_queued_run`` writes. Arrival order is i's order (R6)."""
    with med.store.autocommit() as tx:
        tx.conn.execute(
            """
            WITH c AS (
                SELECT i, format('flood-%%s', lpad(i::text, 5, '0')) AS id,
                       jsonb_build_object(
                           'dut', jsonb_build_object('board', 'b' || (i %% %s)),
                           'r' || lpad(i::text, 5, '0'),
                           jsonb_build_object('board', 'b' || (i %% %s))) AS needs
                FROM generate_series(0, %s - 1) AS i
            ), k AS (
                INSERT INTO needs_classes (needs_key, needs) SELECT id, needs FROM c
            ), r AS (
                INSERT INTO runs (run_id, state, contract, needs_key, submitter, created_at)
                SELECT id, 'QUEUED', jsonb_build_object('run_id', id, 'roles', needs), id,
                       'flooder', %s::timestamptz + i * interval '1 millisecond'
                FROM c
            )
            INSERT INTO steps (run_id, seq, name, kind, role, uses, state)
            SELECT id, 0, 'dut-0', 'exec', 'dut', 'shell', 'PENDING' FROM c
            """,
            (BOARDS, BOARDS, n, clock.now),
        )


def test_a_release_of_one_node_rematches_only_the_classes_that_node_serves(med, clock, monkeypatch):
    """§6 "Sweeps remember": with 5,000 distinct classes queued behind ten busy nodes, the sweep
    that follows the release of node N3 calls the matcher only for classes N3 can serve (500 of
    them), answers the other 4,500 from the last sweep, and promotes the first b3 run in arrival
    order (R6). Before, every sweep matched all 5,000 classes."""
    for j in range(BOARDS):
        advert(med, f"N{j}", board=f"b{j}")
    advert(med, "idle", board="z")  # a free node no class wants: the sweep has work to do
    busy = {}
    for j in range(BOARDS):
        clock.advance(1)
        sub = med.submit(contract(dut={"board": f"b{j}"}))
        assert sub.outcome == "started"
        busy[j] = sub.run.run_id
    clock.advance(1)
    flood(med, clock)

    cold = med.wake_queued()  # the first sweep matches every class once
    assert (cold.matched, cold.remembered, cold.promoted) == (FLOOD, 0, [])
    again = med.wake_queued()  # nothing changed: nothing is matched again
    assert (again.matched, again.remembered, again.promoted) == (0, FLOOD, [])

    import mediator.flows.sweep as sweep_mod

    boards: list[str] = []

    def recording(needs, *args):
        boards.extend({need["board"] for need in needs.values()})
        return real(needs, *args)

    real = sweep_mod.match
    monkeypatch.setattr(sweep_mod, "match", recording)
    reports = []
    med.ctx.sweep_observers.append(lambda _s, report: reports.append(report))
    finish_in_process(med, busy[3], "N3")  # wake 1: the result releases N3

    (woke,) = reports
    assert woke.promoted == ["flood-00003"]  # the first b3 run in arrival order (R6, I7)
    assert set(boards) == {"b3"}  # only classes N3 serves were matched
    assert woke.remembered == FLOOD - FLOOD // BOARDS
    assert 0 < woke.matched <= 2 * (FLOOD // BOARDS)  # before and after its own promotion


def test_results_and_adverts_read_and_match_none_of_thousands_of_classes_they_cannot_serve(
    med, clock, monkeypatch
):
    """§6 "Sweeps remember", the read as well as the matching: with 5,000 distinct classes
    queued behind ten busy nodes, the sweep after an advert whose new capabilities serve none of
    them, and the sweep after a result that frees a node none of them wants, read no class
    (before: every sweep read all 5,000, one row each) and call the matcher for none; the
    process still knows all 5,000 are waiting. The release of N3 then reads the one class that
    left the queue and re-matches the 500 that N3 serves, as before."""
    import mediator.flows.sweep as sweep_mod
    from mediator.store.tx import Tx

    for j in range(BOARDS):
        advert(med, f"N{j}", board=f"b{j}")
    advert(med, "idle", board="z")
    advert(med, "W", board="w")
    busy = {}
    for j in range(BOARDS):
        clock.advance(1)
        busy[j] = med.submit(contract(dut={"board": f"b{j}"})).run.run_id
    clock.advance(1)
    flood(med, clock)
    assert med.wake_queued().matched == FLOOD  # the first sweep reads and matches every class

    read: list[int] = []  # classes in each sweep's first read
    real_head, real_match = Tx.sweep_head, sweep_mod.match

    def head(self, *args, **kwargs):
        first = real_head(self, *args, **kwargs)
        read.append(len(first.classes))
        return first

    matched: list[str] = []

    def counting(needs, *args):
        matched.append(next(iter(needs.values()))["board"])
        return real_match(needs, *args)

    monkeypatch.setattr(Tx, "sweep_head", head)
    monkeypatch.setattr(sweep_mod, "match", counting)
    reports = []
    med.ctx.sweep_observers.append(lambda _s, report: reports.append(report))

    for k in range(3):  # wake 9: new capabilities, none that a queued class asks for
        clock.advance(1)
        advert(med, "idle", board="z", round=k)
    assert (read, matched) == ([0, 0, 0], [])
    assert [r.classes for r in reports] == [FLOOD] * 3
    assert [r.remembered for r in reports] == [FLOOD] * 3

    read.clear()
    reports.clear()
    clock.advance(1)
    own = med.submit(contract(dut={"board": "w"})).run.run_id  # starts at once on W
    finish_in_process(med, own, "W")  # wake 1: W is released; no queued class wants it
    assert read == [1] and matched == []  # its own class, read as no longer waiting
    (woke,) = reports
    assert (woke.classes, woke.matched, woke.promoted) == (FLOOD, 0, [])

    read.clear()
    reports.clear()
    finish_in_process(med, busy[3], "N3")  # wake 1: N3 is released; 500 classes want it
    assert read == [1]  # the blocker's class, read as no longer waiting
    (woke,) = reports
    assert woke.promoted == ["flood-00003"]  # the first b3 run in arrival order (R6, I7)
    assert set(matched) == {"b3"} and woke.remembered == FLOOD - FLOOD // BOARDS


def test_classes_queued_and_cancelled_by_another_process_reach_this_ones_sweeps(
    med, dsn, clock, config, tmp_path
):
    """§6 "Sweeps remember", across processes: this process reads only what changed since its
    last read, so what another Mediator process on the same database does in between must be
    in that change. A class queued there is promoted by this process's next sweep (the run's
    queued_tx is past the mark), and a class whose only run is cancelled there is no longer held
    here after the next read (the cancel's event is past the mark)."""
    from mediator import Mediator

    advert(med, "X", board="x", usb=True)
    advert(med, "Y", board="y", n=1)
    clock.advance(1)
    first = med.submit(contract(dut={"board": "x"})).run.run_id  # X busy
    clock.advance(1)
    blocker = med.submit(contract(dut={"board": "y"})).run.run_id  # Y busy
    reports = []
    med.ctx.sweep_observers.append(lambda _s, report: reports.append(report))
    assert med.wake_queued().classes == 0  # the mark: nothing queued yet
    other = Mediator.connect(dsn, config=config, clock=clock, records_root=str(tmp_path / "o"))
    try:
        clock.advance(1)
        usb = other.submit(contract(dut={"board": "x", "usb": True}))  # a class new here
        clock.advance(1)
        gone = other.submit(contract(dut={"board": "y", "n": 1}))
        assert (usb.outcome, gone.outcome) == ("queued", "queued")
        assert med.wake_queued().classes == 2  # both read as arrived since the mark
        other.cancel(gone.run.run_id)
    finally:
        other.close()
    finish_in_process(med, first, "X")  # wake 1 here: X is free
    assert med.get_run(usb.run.run_id).state == "RUNNING"  # promoted by this process
    assert reports[-1].classes == 1  # the cancelled run's class was read as gone
    finish_in_process(med, blocker, "Y")
    assert reports[-1].classes == 0 and med.get_run(gone.run.run_id).state == "FAILED"


def finish_in_process(med, run_id, node_id):
    step = next(s for s in med.work(node_id) if s.run_id == run_id)
    claimed = med.claim(run_id, step.seq, node_id)
    return med.report(run_id, step.seq, node_id, claimed.attempt, "pass")


# ---- GET /v1/nodes, paged like the runs (docs/design.md §19) -------------------------------------
def pages(client, limit):
    """Every page of GET /v1/nodes, following ``next`` as ``after``."""
    out, after = [], ""
    while True:
        page = client.get(f"/v1/nodes?limit={limit}&after={after}")
        assert page.status_code == 200, page.text
        out.append(page.json())
        after = out[-1]["next"]
        if after is None:
            return out


def test_nodes_pages_list_every_node_exactly_once_under_concurrent_adverts(med):
    """A node live across the pages is listed exactly once, in node_id order, while adverts
    renew it and new nodes arrive between the pages; the last page says ``next: null``."""
    ids = [f"n{i:04d}" for i in range(230)]
    for i in ids:
        advert(med, i, board="x")
    stop = threading.Event()

    def advertising():
        k = 0
        while not stop.is_set():
            advert(med, ids[k % len(ids)], board="x")  # a renewal
            advert(med, f"m{k:05d}", board="y")  # a newcomer, also in the middle of the order
            k += 1

    with TestClient(create_app(med), base_url="http://127.0.0.1") as client:
        worker = threading.Thread(target=advertising)
        worker.start()
        try:
            got = pages(client, 25)
        finally:
            stop.set()
            worker.join()
        listed = [n["node_id"] for page in got for n in page["nodes"]]
        assert len(listed) == len(set(listed))  # nothing twice
        assert listed == sorted(listed)  # node_id order across pages
        assert set(ids) <= set(listed)  # every node live throughout, once
        assert all(len(page["nodes"]) == 25 for page in got[:-1])
        bad = client.get("/v1/nodes?limit=0")
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "limit"


def test_runctl_nodes_follows_the_pages_and_lists_every_node(med, serve):
    """runctl nodes (and ``Client.nodes``) list a fleet larger than one page, every node once."""
    from tests.db.test_runctl_api import Runctl

    for i in range(1_100):
        advert(med, f"n{i:04d}", board="x")
    cli = Runctl(serve())
    assert cli("nodes", "--json") == 0
    assert [n["node_id"] for n in cli.body["nodes"]] == [f"n{i:04d}" for i in range(1_100)]
    assert cli("nodes") == 0
    assert len(cli.lines) == 1 + 1_100


# ---- the exact width search's budget (docs/design.md §4, docs/security.md) -----------------------
def test_a_contract_past_the_width_search_budget_is_refused_at_submit_and_dry_run(med):
    """17 distinct role needs with max_width 4 could need the exponential search: 400 naming
    ``roles`` before any match, for a submit and a dry run alike; nothing is written. 16 distinct
    needs (the budget) and 64 roles of equal needs are matched as before, exactly."""
    from mediator import ContractError
    from mediator.core.limits import MAX_SEARCH_NEEDS
    from mediator.core.match import search_budget

    wide = {f"r{i:02d}": {f"k{i}": True} for i in range(MAX_SEARCH_NEEDS + 1)}
    for dry in (False, True):
        with pytest.raises(ContractError) as refused:
            med.submit(contract(**wide), dry_run=dry)
        assert refused.value.field == "roles" and refused.value.code == "width_search_too_large"
        budget = search_budget(contract(**wide)["roles"], med.ctx.config.max_width)
        assert refused.value.message == budget  # says why
    assert med.list_runs().runs == ()
    # within the budget: the exact answer (no node serves k0: NO_CANDIDATE, a rejected run)
    within = {f"r{i:02d}": {f"k{i}": True} for i in range(MAX_SEARCH_NEEDS)}
    assert med.submit(contract(**within)).outcome == "rejected"
    advert(med, "all", **{f"k{i}": True for i in range(MAX_SEARCH_NEEDS + 1)})
    assert med.submit(contract(**within)).outcome == "started"  # one node serves all 16 roles
    same = {f"r{i:02d}": {"board": "x"} for i in range(64)}  # one distinct need: no search
    advert(med, "x", board="x")
    assert med.submit(contract(**same), dry_run=True).dry_run["width"] == 1


def test_r3_an_existing_run_is_answered_before_the_width_search_budget(med):
    """R3 first: a run_id that exists is answered with its run (200) even when the contract sent
    again is past the width search's budget, as for a contract that does not parse."""
    from mediator.core.limits import MAX_SEARCH_NEEDS

    advert(med, "X")
    med.submit(contract("a"))
    wide = {f"r{i:02d}": {f"k{i}": True} for i in range(MAX_SEARCH_NEEDS + 1)}
    again = med.submit(contract("a", **wide))
    assert (again.outcome, again.run.run_id, again.run.state) == ("existing", "a", "RUNNING")
