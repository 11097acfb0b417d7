"""``sim.plan`` on the real Mediator (docs/design.md §20): the recommended size and its neighbours
confirmed on PostgreSQL beside the model, and a grid run on the Mediator itself — each
simulation on its own fresh database, from the default process pool's workers."""

from __future__ import annotations

import pandas as pd
import pytest

import sim
from sim.inputs import scenarios as S
from tests.plan_checks import assert_same_plan

pytestmark = [
    pytest.mark.db,
    pytest.mark.slow,
]  # scripts/test --fast leaves it out: simulations on the real Mediator

SAME = ["size", "replications", "runs", "wait_mean_s", "wait_p50_s", "wait_p95_s", "wait_p99_s",
        "wait_p95_low", "wait_p95_high", "utilization", "p_wait", "meets_target"]  # fmt: skip


def test_the_recommendation_and_its_neighbours_are_confirmed_on_the_mediator(
    cluster, tmp_path
) -> None:
    """The grid on the model; sizes 3, 4, 5 around the recommendation 4 again on the real
    Mediator with the grid's seeds and a capped workload, and on the model for the same runs:
    every run waits exactly as long on both, and no invariant breaks. Saved and loaded back
    (what the report hands its capacity notebook), the plan is the same plan."""
    p = sim.plan(S.steady(runs=600, seed=5), {"quantile": 0.95, "wait_s": 10.0}, [2, 3, 4, 5, 6],
                 replications=3, confirm_replications=2, confirm_runs=200,
                 database_url=cluster.url("postgres"))  # fmt: skip
    assert p.recommended == 4
    c = p.confirmation
    assert list(zip(c["size"], c["engine"], strict=True)) == [
        (s, e) for s in (3, 4, 5) for e in ("mediator", "model")
    ]
    assert (c["stage"] == "confirm").all()
    assert list(c["replications"]) == [2] * 6
    assert list(c["runs"]) == [2 * 140] * 6  # 200 runs less the scenario's 60 warm-up runs
    assert (c["max_abs_diff_s"] == 0).all()
    assert (c["violations"] == 0).all()
    med = c[c["engine"] == "mediator"].reset_index(drop=True)
    mod = c[c["engine"] == "model"].reset_index(drop=True)
    pd.testing.assert_frame_equal(med[SAME], mod[SAME])
    seeds = {r.seed for r in p.replications if r.engine == "mediator"}
    assert seeds == {r.seed for r in p.replications if r.engine == "model" and r.rep < 2}
    frame = p.to_frame()
    assert len(frame) == 5 + 6
    assert p.row(4, "mediator", "confirm")["max_abs_diff_s"] == 0
    assert_same_plan(sim.CapacityPlan.load(p.save(tmp_path / "plan")), p)


def test_a_grid_on_the_mediator_equals_the_grid_on_the_model(cluster) -> None:
    """engine="mediator": every figure from the database; the same as the model's, and no
    confirmation (it already is the real thing)."""
    kw = {"replications": 2, "confirm_replications": 0}
    wl = S.steady(runs=120, seed=3)
    target = {"quantile": 0.95, "wait_s": 30.0}
    on_db = sim.plan(wl, target, [3, 4], engine="mediator", database_url=cluster.url("postgres"),
                     **kw)  # fmt: skip
    on_model = sim.plan(wl, target, [3, 4], **kw)
    assert (on_db.grid["engine"] == "mediator").all()
    assert (on_db.grid["violations"] == 0).all()
    pd.testing.assert_frame_equal(on_db.grid[SAME], on_model.grid[SAME])
    assert on_db.confirmation.empty


def test_a_plan_on_a_dask_cluster_gives_each_task_its_own_databases(cluster, dsn) -> None:
    """issue 14 §8: past one machine. The simulations run on a Dask cluster given by address
    (here a LocalCluster's), each on a PostgreSQL server given by URL (the suite's): every task
    creates a template database of its own, its simulation's database from it, and drops both.
    The figures are the model's, run for run, and the server keeps no database of the plan."""
    from distributed import LocalCluster

    from mediator import Mediator

    med = Mediator.connect(dsn)  # only to list the server's databases
    before = {r["datname"] for r in med.query("SELECT datname FROM pg_database")}
    wl = S.steady(runs=120, seed=3)
    target = {"quantile": 0.95, "wait_s": 30.0}
    kw = {"replications": 2, "confirm_replications": 0, "progress": False}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as dask:  # fmt: skip
        on_dask = sim.plan(wl, target, [3, 4], engine="mediator", scheduler=dask.scheduler_address,
                           database_url=cluster.url("postgres"), **kw)  # fmt: skip
    on_model = sim.plan(wl, target, [3, 4], **kw)
    after = {r["datname"] for r in med.query("SELECT datname FROM pg_database")}
    med.close()
    assert (on_dask.grid["violations"] == 0).all()
    pd.testing.assert_frame_equal(on_dask.grid[SAME], on_model.grid[SAME])
    assert after == before


def test_the_confirmation_replays_every_job_when_not_capped(cluster, tmp_path) -> None:
    """issue 28 §2: ``confirm_runs=None`` (what the report passes) replays every job of the
    workload on the real Mediator — the count checked against the materialized workload, not
    a number typed here — and the largest per-job difference is the brute-force one between
    the Mediator's waits and an independent model run's, job by job."""
    import numpy as np

    from sim.studies.plan import PlanTask, simulate_one, sized, start_confirmation

    workload = S.trace(runs=400)
    jobs = len(sim.materialize(workload).arrivals)
    url = cluster.url("postgres")
    grid = sim.plan(workload, {"quantile": 0.95, "wait_s": 600.0}, range(2, 8), replications=1,
                    confirm_replications=0, progress=False)  # fmt: skip
    pending = start_confirmation(grid, workload, None, url, progress=False)
    assert pending is not None and pending.jobs == jobs and "all 400 runs" in pending.note
    p = pending.result(progress=False)
    check = p.confirmation_check()
    assert check is not None and check.jobs == jobs and check.violations == 0
    med = {r.size: r for r in p.replications if r.engine == "mediator"}
    assert sorted(med) == check.sizes and len(check.sizes) == 3
    assert all(r.waits.size + r.unstarted == jobs for r in med.values())
    reference = 0.0
    for size, r in med.items():
        model = sim.run(sized(workload, size), "model")
        reference = max(reference, float(np.max(np.abs(r.waits - model.runs["wait_s"]))))
    assert check.max_abs_diff_s == reference == 0.0
    assert (p.confirmation["runs"] == jobs).all()
    # The bar's source: a Mediator task writes its submitted runs to its progress file.
    path = tmp_path / "progress"
    task = PlanTask(sized(S.trace(runs=150), 4), 4, 0, "mediator", url, str(path))
    assert simulate_one(task).waits.size == 150 and path.read_text() == "150"
