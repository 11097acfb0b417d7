"""The store's ``on_backend`` hook and the simulator's CPU pinning against a real PostgreSQL
(sim/affinity.py; docs/performance.md P4)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest

import sim
from mediator.store.db import Store
from sim.affinity import CpuClaim, claim_cpu
from sim.brokers import mediator as engine
from sim.inputs import scenarios as S

# scripts/test --fast leaves it out: simulations on the real Mediator
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def private_tmp(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("MEDIATOR_SIM_PIN", raising=False)


def test_on_backend_gets_each_local_connections_server_pid(dsn: str) -> None:
    pids: list[int] = []
    store = Store(dsn, None, max_size=1, on_backend=pids.append)
    try:
        with store.autocommit() as tx:
            (row,) = tx.conn.execute("SELECT pg_backend_pid()").fetchall()
        assert pids == [row[0]]  # the tests' cluster listens on a unix socket only
    finally:
        store.close()


def test_a_failing_on_backend_hook_does_not_cost_the_connection(dsn: str) -> None:
    def broken(_pid: int) -> None:
        raise RuntimeError("hook failed")

    store = Store(dsn, None, max_size=1, on_backend=broken)
    try:
        with store.autocommit() as tx:
            assert tx.conn.execute("SELECT 1").fetchall() == [(1,)]  # configured and in use
    finally:
        store.close()


def test_a_claim_pins_a_postgres_server_process(dsn: str) -> None:
    claim = claim_cpu(min_cpus=1)  # (claims on a one-CPU machine too)
    assert claim is not None
    try:
        store = Store(dsn, None, max_size=1, on_backend=claim.pin)
        try:
            with store.autocommit() as tx:
                (row,) = tx.conn.execute("SELECT pg_backend_pid()").fetchall()
                assert claim.pinned == [row[0]]
                assert os.sched_getaffinity(row[0]) == {claim.cpu}
        finally:
            store.close()
    finally:
        claim.release()


def test_a_simulation_runs_on_one_cpu_with_its_server_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sim.run claims a CPU for its loop and pins the Mediator's connections' server processes
    to it; the claim is given back at the end (the thread may run anywhere again), and the
    simulation's answers are the model's either way."""
    claims: list[CpuClaim] = []
    during: list[set[int]] = []

    def recording_claim() -> CpuClaim | None:
        c = claim_cpu(min_cpus=1)  # (claims on a one-CPU machine too)
        if c is not None:
            claims.append(c)
        return c

    monkeypatch.setattr(engine, "claim_cpu", recording_claim)
    before = os.sched_getaffinity(0)
    scenario = S.steady(runs=60, seed=4)
    med_report = engine.MediatorBroker.report

    def report(self: Any, *args: Any, **kwargs: Any) -> None:
        during.append(os.sched_getaffinity(0))
        med_report(self, *args, **kwargs)

    monkeypatch.setattr(engine.MediatorBroker, "report", report)
    result = sim.run(scenario)
    assert claims and claims[0].pinned  # at least the pool's first connection
    assert all(cpus == {claims[0].cpu} for cpus in during)
    assert os.sched_getaffinity(0) == before  # released
    model = sim.run_model(sim.materialize(scenario))
    assert sim.promotions_diff(model.promotions, result.promotions, tol_s=1e-6) is None


def test_results_that_end_a_run_send_its_nodes_no_empty_poll() -> None:
    """A result that ends the run releases its nodes: their next poll could only come back
    empty (a node a sweep leases again is touched by that sweep), so the engine makes none —
    as the reference model. On one-step runs every poll is then followed by a claim, but for
    at most one first poll per node."""
    scenario = S.steady(runs=200, seed=5)
    result = sim.run(scenario)
    nodes = len(sim.materialize(scenario).nodes)
    assert result.counts["claim"] == 200
    assert result.counts["claim"] <= result.counts["work"] <= result.counts["claim"] + nodes
