"""The simulator against the real Mediator and PostgreSQL (docs/design.md §20–7, issue 5).

Each simulation gets its own fresh database on the session's cluster. The reference model runs
on the same plan; the differential test (design.md §20) asks for the same promotions at the same
instants and prints the first diverging event on a mismatch.
"""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import pytest

import sim
from sim.analysis import erlang_c, littles_law, mean_ci, mmc_wq
from sim.brokers import mediator as engine
from sim.inputs import scenarios as S
from sim.inputs.traces import fifo_waits

pytestmark = [
    pytest.mark.db,
    pytest.mark.slow,
]  # scripts/test --fast leaves it out: simulations on the real Mediator

SMALL = {"trace": {"runs": 300}}


@pytest.fixture
def server_url(cluster):
    return cluster.url("postgres")


def small(name: str):
    fn = S.SCENARIOS[name]
    kw = SMALL.get(name) or ({"runs": 150} if "runs" in inspect.signature(fn).parameters else {})
    return fn(**kw)


@pytest.mark.parametrize("name", sorted(S.SCENARIOS))
def test_differential_the_mediator_and_the_model_promote_identically(name, server_url):
    """design.md §20: same plan → the same runs promoted onto the same nodes at the same instants;
    and no invariant I1–I7 broken along the way."""
    plan = sim.materialize(small(name))
    result = sim.run(plan, database_url=server_url, progress=False)
    model = sim.run_model(plan)
    assert len(result.promotions) > 0
    diff = sim.promotions_diff(model.promotions, result.promotions, tol_s=1e-6)
    assert diff is None, f"first diverging event: {diff}"
    assert result.violations == []
    pd.testing.assert_series_equal(
        result.runs["state"], model.runs["state"], check_names=False, check_dtype=False
    )


def test_differential_under_random_vanish_and_return(server_url):
    """The churn variant of the vanished-node scenario (wake_on_return off): the same promotions
    and the same total stuck time as the model."""
    plan = sim.materialize(S.vanished_node(False, churn=True, runs=150, seed=1))
    result = sim.run(plan, database_url=server_url, progress=False)
    model = sim.run_model(plan)
    assert sim.promotions_diff(model.promotions, result.promotions, tol_s=1e-6) is None
    assert result.stuck["duration_s"].sum() == pytest.approx(model.stuck["duration_s"].sum())


def test_same_scenario_and_seed_give_identical_tables(server_url):
    """docs/design.md §20: deterministic — row for row."""
    sc = S.mixed(runs=120, seed=7)
    a = sim.run(sc, database_url=server_url, progress=False)
    b = sim.run(sc, database_url=server_url, progress=False)
    pd.testing.assert_frame_equal(a.runs, b.runs)
    pd.testing.assert_frame_equal(a.promotions, b.promotions)
    pd.testing.assert_frame_equal(a.queue, b.queue)
    c = sim.run(S.mixed(runs=120, seed=8), database_url=server_url, progress=False)
    assert not a.runs["created_at"].equals(c.runs["created_at"])


@pytest.mark.parametrize("wake_on_return", [False, True])
def test_vanished_node_window(wake_on_return, server_url):
    """docs/design.md §8 on the real Mediator: b is queued behind a on X; X vanishes, a is reaped
    (lost); X returns at 300. Off: b waits for c's unrelated result at 700 (stuck 400 s). On
    (wake 7): b goes at 300, stuck 0."""
    result = sim.run(S.vanished_node(wake_on_return), database_url=server_url, progress=False)
    runs = result.runs.set_index("run_id")
    assert runs.loc["r0000000", "verdict"] == "lost"
    b_start = runs.loc["r0000001", "started_at"]
    stuck = result.stuck["duration_s"].sum()
    if wake_on_return:
        assert (b_start, stuck) == (pytest.approx(300.0), 0.0)
    else:
        assert b_start == pytest.approx(700.0)
        assert stuck == pytest.approx(400.0)
        [row] = result.stuck.itertuples()
        assert (row.run_id, row.start_s, row.end_s) == ("r0000001", 300.0, 700.0)


def test_trace_replay_equals_the_fifo_multiserver_recursion(server_url):
    """design.md §20: on identical nodes the Mediator is a FIFO G/G/c queue; the NASA trace's waits
    equal the Kiefer–Wolfowitz recursion exactly (integer microseconds)."""
    plan = sim.materialize(S.trace(runs=400, nodes=2))
    result = sim.run(plan, database_url=server_url, progress=False)
    arrivals = np.array([a.at_s for a in plan.arrivals])
    durations = np.array([a.step_outcomes[0][0].duration_s for a in plan.arrivals])
    expected = fifo_waits(arrivals, durations, 2)
    got = result.runs["wait_s"].to_numpy(dtype=float)
    assert np.max(np.abs(got - expected)) < 1e-6
    assert (got > 0).sum() > 10  # the window has real queueing to compare


def test_erlang_c_on_the_real_mediator_at_moderate_load(server_url):
    """design.md §20: M/M/2, λ = 0.1, μ = 0.1 (ρ = 0.5) — independent replications with a warm-up
    cut; theory must lie within the 99 % interval of the replication means; Little's law holds
    on every run."""
    lam, mu, c = 0.1, 0.1, 2
    base = S.steady(nodes=c, arrival_rate=lam, service_rate=mu, runs=400, seed=11)
    means, p_waits = [], []
    for seed in sim.analysis.replication_seeds(base.seed, 4):
        result = sim.run(base.with_overrides({"seed": seed}), database_url=server_url,
                         progress=False)  # fmt: skip
        assert result.violations == []
        measured = result.runs[~result.runs["warmup"]]
        means.append(float(measured["wait_s"].mean()))
        p_waits.append(float((measured["wait_s"] > 0).mean()))
        check = littles_law(result.runs, result.queue)
        assert check.rel_err < 0.02, check
    wq = mean_ci(means, conf=0.99)
    pw = mean_ci(p_waits, conf=0.99)
    assert wq.contains(mmc_wq(lam, mu, c)), (wq, mmc_wq(lam, mu, c))
    assert pw.contains(erlang_c(c, lam / mu)), (pw, erlang_c(c, lam / mu))


def test_time_leak_every_timestamp_is_virtual(server_url):
    """docs/design.md §13: virtual time starts in 2031; a wall-clock timestamp (2026) would show as
    a large negative time."""
    result = sim.run(S.burst(runs=100, seed=3), database_url=server_url, progress=False)
    for column in ("created_at", "started_at", "ended_at"):
        values = result.runs[column].dropna()
        assert ((values >= 0) & (values <= result.end_s)).all(), column
    assert (result.events["at_s"] >= 0).all()


def test_save_writes_tables_charts_summary_and_manifest(server_url, tmp_path):
    result = sim.run(S.steady(runs=60, seed=2), database_url=server_url, progress=False)
    out = result.save(tmp_path / "out")
    names = {p.name for p in out.iterdir()}
    assert {"runs.csv", "events.csv", "queue.csv", "waits.png", "gantt.png", "summary.json",
            "manifest.json"} <= names  # fmt: skip
    assert result.manifest["postgresql_version"].startswith("15")
    assert result.manifest["scenario_hash"] == S.steady(runs=60, seed=2).scenario_hash()


def test_the_mediator_broker_orders_same_instant_events_by_position(server_url, monkeypatch):
    """issue 14 §1: every same-instant tie-break key in the one loop is an integer position, on
    the real Mediator too (the engine used to order heartbeats, claims and arrivals by id
    strings). With the node positions reversed against their ids — position 0 is the last id —
    the churn scenario still promotes exactly as the model does on the same plan."""
    import dataclasses

    from sim.platform.driver import Driver

    keys: set[type] = set()

    class Checked(Driver):
        def _try_claim(self, *args, **kwargs):
            keys.update(type(e[2]) for e in self.q.queued())
            return super()._try_claim(*args, **kwargs)

    monkeypatch.setattr(engine, "Driver", Checked)
    plan = sim.materialize(S.vanished_node(False, churn=True, runs=100, seed=3))
    plan = dataclasses.replace(plan, nodes=tuple(reversed(plan.nodes)))
    result = sim.run(plan, database_url=server_url, progress=False)
    model = sim.run_model(plan)
    assert keys == {int}
    assert sim.promotions_diff(model.promotions, result.promotions, tol_s=1e-6) is None
    assert result.violations == []
    assert result.stuck["duration_s"].sum() == pytest.approx(model.stuck["duration_s"].sum())


def test_differential_with_claim_latency(server_url):
    """issue 14 §1: claims are the fleet's, written once. With a 2 s claim latency a node asks
    for work, and claims 2 s later only if it had something to claim then (the old engine
    scheduled a delayed claim on every idle heartbeat, which could claim a step promoted in
    between early). The Mediator and the model now start, end and stop at the same instants."""
    import dataclasses

    sc = S.steady(runs=150, seed=2)
    sc = dataclasses.replace(sc, fleet=dataclasses.replace(sc.fleet, claim_latency_s=2.0))
    plan = sim.materialize(sc)
    result = sim.run(plan, database_url=server_url, progress=False)
    model = sim.run_model(plan)
    assert sim.promotions_diff(model.promotions, result.promotions, tol_s=1e-6) is None
    assert result.violations == []
    np.testing.assert_allclose(result.runs["ended_at"], model.runs["ended_at"], atol=1e-6)
    assert result.end_s == pytest.approx(model.end_s)
    assert (result.runs["run_s"] >= 2.0).all()  # every run waited out its first claim
