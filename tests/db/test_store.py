"""The store floor of seed 003 (U-floor), on the real database.

UpsertAdvert returning the previous values from the locked row, ListNodes and ListRuns with
observed_at read first, DrainingNodes, UnavailableNodes, ListQueued, Steps with chosen.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mediator import Forbidden
from tests.conftest import examples
from tests.db.conftest import advert, contract


def upsert(med, node_id="X", drain="", instance="i1", principal="", ttl=30.0):
    with med.store.autocommit() as tx:
        return tx.upsert_advert(node_id, node_id, principal, {"board": "x"}, instance, drain, ttl)


def test_upsert_advert_returns_previous_policy_in_one_statement(med):
    """seed 003 §2.1: '' → graceful → at-boundary → '' shows each previous value in turn."""
    seen = [upsert(med, drain=d).prev_drain for d in ("", "graceful", "at-boundary", "")]
    assert seen == ["", "", "graceful", "at-boundary"]
    with med.store.autocommit() as tx:
        assert tx.draining_nodes() == set()


def test_upsert_advert_reports_whether_the_node_was_live(med, clock):
    """The value wake 7 needs (docs/design.md §8 suggests it): live before this advert or not."""
    first = upsert(med)
    assert (first.inserted, first.prev_live) == (True, False)
    clock.advance(10)
    assert upsert(med).prev_live is True
    clock.advance(31)  # past advert_ttl: expired
    again = upsert(med, instance="i2")
    assert (again.inserted, again.prev_live, again.prev_instance) == (False, False, "i1")


def test_upsert_advert_binds_a_node_to_its_first_principal(med):
    """docs/design.md §14: another principal's advert for the same node_id gets no row → 403."""
    med.advert("X", {"board": "x"}, "i1", principal="alice")
    with pytest.raises(Forbidden):
        med.advert("X", {"board": "y"}, "i1", principal="mallory")
    [node] = med.list_nodes().nodes
    assert node.capabilities == {"board": "x"}


def test_list_nodes_reads_observed_at_first_and_leaves_expired_nodes_out(med, clock):
    """seed 003 §3.2: every expires_at in the answer is after observed_at (no negative timer)."""
    advert(med, "A")
    clock.advance(20)
    advert(med, "B")
    clock.advance(15)  # A expired (30 s ttl), B live
    fleet = med.list_nodes()
    assert [n.node_id for n in fleet.nodes] == ["B"]
    assert all(n.expires_at > fleet.observed_at for n in fleet.nodes)
    assert fleet.observed_at == clock.now


def test_list_nodes_shows_lease_and_drain_but_never_principal_or_nonce(med):
    """seed 003 §3.1: principal and nonce are not selected, which is how they stay out."""
    med.advert("X", {"board": "x"}, "i1", principal="secret-owner", drain="")
    med.advert("Y", {"board": "y"}, "i1", principal="secret-owner", drain="graceful")
    med.submit(contract("a"))
    fleet = med.list_nodes()
    by_id = {n.node_id: n for n in fleet.nodes}
    assert by_id["X"].lease.run_id == "a" and by_id["Y"].lease is None
    assert by_id["Y"].drain == "graceful"
    text = str(fleet.to_dict())
    assert "secret-owner" not in text and "nonce" not in text


def test_list_runs_current_lists_claimed_steps_in_seq_order(med):
    """seed 003 §4.1: a width-2 run shows its two CLAIMED steps, each on its node."""
    advert(med, "N1", board="x")
    advert(med, "N2", scope=True)
    med.submit(contract("w2", dut={"board": "x"}, bench={"scope": True}))
    for node in ("N1", "N2"):
        [s] = med.work(node)
        med.claim("w2", s.seq, node)
    [row] = med.list_runs().runs
    assert [(c["node"], c["step"]) for c in row.current] == [("N1", "dut-0"), ("N2", "bench-0")]
    advert(med, "N3", board="z")
    med.submit(contract("idle", dut={"board": "z"}))
    rows = {r.run_id: r for r in med.list_runs().runs}
    assert rows["idle"].current == []


def test_list_runs_limit_counts_runs_not_steps_and_breaks_ties_by_run_id(med):
    """seed 003 §4.2–4.3: LIMIT counts runs; same created_at → run_id DESC, every time."""
    advert(med, "X")
    for rid in ("r1", "r3", "r2"):
        med.submit(contract(rid, steps=3))  # same virtual instant: created_at ties
    runs = med.list_runs(limit=2).runs
    assert [r.run_id for r in runs] == ["r3", "r2"]
    assert [r.run_id for r in med.list_runs().runs] == ["r3", "r2", "r1"]


def test_list_runs_filters_by_state_work_id_and_since(med, clock):
    advert(med, "X")
    med.submit({**contract("a"), "work_id": "T-1"})
    clock.advance(1)
    med.submit({**contract("b"), "work_id": "T-2"})
    since = clock.now - timedelta(seconds=0.5)
    assert [r.run_id for r in med.list_runs(state="QUEUED").runs] == ["b"]
    assert [r.run_id for r in med.list_runs(work_id="T-1").runs] == ["a"]
    assert [r.run_id for r in med.list_runs(since=since).runs] == ["b"]
    assert med.list_runs().observed_at == clock.now


def test_draining_nodes_leaves_expired_ones_out(med, clock):
    """seed 003 §5: draining but expired is not listed; the same criterion as LiveAdverts."""
    advert(med, "old", drain="graceful")
    clock.advance(20)
    advert(med, "new", drain="at-boundary")
    clock.advance(15)
    with med.store.autocommit() as tx:
        assert tx.draining_nodes() == {"new"}
        assert [a.node_id for a in tx.live_adverts()] == ["new"]


def test_unavailable_nodes_is_the_union_of_busy_and_draining(med):
    """design.md §7 'UnavailableNodes 가 busy 와 draining 의 합집합이다' (FR-11 central side)."""
    advert(med, "busy")
    advert(med, "draining", drain="graceful")
    advert(med, "free")
    med.submit(contract("a"))  # takes "busy" (first by node_id among free candidates)
    with med.store.autocommit() as tx:
        assert tx.busy_nodes() == {"busy"}
        assert tx.draining_nodes() == {"draining"}
        assert tx.unavailable_nodes() == {"busy", "draining"}


def test_list_queued_is_fifo_with_run_id_breaking_ties(med, clock):
    """R6: ORDER BY created_at, run_id — same instant, run_id decides, every time."""
    advert(med, "X")
    med.submit(contract("head"))
    for rid in ("q-b", "q-a"):
        med.submit(contract(rid))
    clock.advance(1)
    med.submit(contract("q-0"))
    with med.store.autocommit() as tx:
        assert [q.run_id for q in tx.list_queued()] == ["q-a", "q-b", "q-0"]
        assert tx.live_contract("q-a")["run_id"] == "q-a"


def test_steps_carry_chosen_what_hardware_ran_them(med):
    """seed 003 §7, FR-3: chosen = node, instance and the capability values that matched."""
    med.advert("X", {"board": "stm32f4", "rev": 3, "extra": "ignored"}, "inst-7")
    run = med.submit(contract("a", dut={"board": "stm32f4", "rev": 3})).run
    [step] = run.steps
    assert step.node_id == "X"
    assert step.chosen == {
        "node": "X",
        "instance": "inst-7",
        "matched": {"board": "stm32f4", "rev": 3},
    }


def test_analytics_queries_are_read_only(med):
    """architecture.md: the simulator reads the database for analytics and can never write it."""
    from mediator import MediatorError

    advert(med, "X")
    med.submit(contract("a"))
    assert med.query("SELECT run_id, state FROM runs") == [{"run_id": "a", "state": "RUNNING"}]
    with pytest.raises(MediatorError):
        med.query("DELETE FROM runs")
    assert med.query("SELECT count(*) AS n FROM runs") == [{"n": 1}]


_scalars = st.one_of(
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from([0.0, 1.0, 2.5]),
    st.sampled_from(["", "a", "1"]),
)
_caps = st.dictionaries(
    st.sampled_from(["k", "m"]), st.one_of(_scalars, st.lists(_scalars, max_size=3)), max_size=2
)
_needs = st.dictionaries(st.sampled_from(["k", "m"]), _scalars, max_size=2)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(fleet=st.lists(_caps, min_size=1, max_size=5), roles=st.dictionaries(
    st.sampled_from(["r1", "r2"]), _needs, max_size=2))  # fmt: skip
def test_fleet_for_is_a_superset_of_the_matchers_candidates(med, fleet, roles):
    """submit reads only the nodes that might serve a role; every real candidate must be among
    them (design.md §4 semantics: JSON types kept, list membership, `true` = present+truthy)."""
    from mediator.core.capabilities import satisfies

    with med.store.autocommit() as tx:
        tx.conn.execute("DELETE FROM nodes")
    for i, caps in enumerate(fleet):
        med.advert(f"n{i}", caps, "i")
    with med.store.autocommit() as tx:
        got = {n.node_id for n in tx.fleet_for(roles)}
    exact = {
        f"n{i}" for i, caps in enumerate(fleet) for need in roles.values() if satisfies(need, caps)
    }
    assert exact <= got
    non_true = all(v is not True for need in roles.values() for v in need.values())
    if non_true:  # without `true` needs the SQL test is exact, not just a superset
        assert got == exact


# ---- outages (issue 11 §8, wake 5) ----


@pytest.mark.slow  # scripts/test --fast leaves it out
def test_a_saturated_pool_is_not_an_outage(dsn, clock):
    """A request that waits in vain for a pooled connection gets 503, but the database itself
    answers: no outage is declared (no reconnect, no expiries moved, /healthz stays 200)."""
    import threading
    import time

    from mediator import StoreUnavailable
    from mediator.store.db import Store

    store = Store(dsn, clock, max_size=1)
    held, release = threading.Event(), threading.Event()

    def hold_the_only_connection():
        with store.autocommit():
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_only_connection)
    holder.start()
    try:
        assert held.wait(10)
        with pytest.raises(StoreUnavailable), store.autocommit() as tx:
            tx.ping()  # waits the pool's 5 s, in vain
        deadline = time.monotonic() + 10
        while store._probing and time.monotonic() < deadline:  # the background probe decides
            time.sleep(0.01)
        assert not store._probing and not store.down and not store.reconnecting()
    finally:
        release.set()
        holder.join(10)
        store.close()


def test_an_outage_is_open_from_the_pool_swap_until_its_give_back_is_done(dsn, clock):
    """docs/design.md §13: between the database answering again and the reconnect callbacks
    (the give-back) finishing, statements run but expiries are not given back yet;
    ``open_outage_s`` says since when the outage ran, then and only then."""
    import threading

    from mediator.store.db import Store

    store = Store(dsn, clock)
    seen: list[float | None] = []
    done = threading.Event()

    def give_back(outage_s: float) -> None:
        with store.autocommit() as tx:
            tx.ping()  # the database answers while the outage is still open
        seen.append(store.open_outage_s())
        seen.append(outage_s)
        done.set()

    store.on_reconnect.append(give_back)
    try:
        assert store.open_outage_s() is None
        store.watch()  # a sweep's database error asks for this; the database is reachable
        assert done.wait(30)
        watcher = store._watcher
        if watcher is not None:
            watcher.join(30)
        assert not store.reconnecting()
        assert seen[0] is not None and seen[0] >= seen[1] >= 0
        assert store.open_outage_s() is None
    finally:
        store.close()


def test_jsonb_round_trips_exactly_through_the_fast_json_path(med):
    """Issue 13: jsonb is read and written with orjson, which rounds integers beyond 64 bits
    to floats; jsonb keeps them exact and so must the Mediator — a contract's ``with`` and a
    node's capabilities come back as they were sent, numbers of every size included."""
    odd = {
        "big": 2**70, "neg": -(2**64) - 1, "i64": 2**63 - 1, "huge": 10**30, "tenth": 0.1,
        "text": "é\u2028 digits 12345678901234567890 in a string",
        "nested": [{"k": [1, 2.5, None, True]}], "keys": {"b": 1, "a": 2},
    }  # fmt: skip
    med.advert("X", {"board": "x", "serial": 2**65}, "i1")
    doc = contract("exact")
    doc["steps"][0]["uses"] = "blob"  # a plugin: only a built-in's `with` is checked
    doc["steps"][0]["with"] = odd
    med.submit(doc)
    (step,) = med.get_run("exact").steps
    assert step.with_ == odd
    assert all(type(step.with_[k]) is type(v) for k, v in odd.items())
    (node,) = med.list_nodes().nodes
    assert node.capabilities["serial"] == 2**65 and type(node.capabilities["serial"]) is int
