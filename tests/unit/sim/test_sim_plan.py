"""``sim.plan`` on the reference model (design.md §20): common random numbers, intervals, Erlang C,
the smallest fleet meeting the target, and the same numbers on any executor — a thread pool, the
default process pool, a Dask cluster's executor. The confirmation on the real Mediator is tested
in tests/db/sim/test_sim_plan.py."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest

import sim
from sim.analysis import mmc_wait_quantile, mmc_wq, replication_seeds
from sim.inputs import scenarios as S
from sim.studies.plan import Replication, sized
from tests.plan_checks import assert_same_plan

# scripts/test --fast leaves it out: every plan runs many simulations
pytestmark = pytest.mark.slow

TARGET = {"quantile": 0.95, "wait_s": 10.0}


@pytest.fixture(scope="module")
def threads() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as pool:
        yield pool


def numbers(p: sim.CapacityPlan) -> pd.DataFrame:
    """The plan's table without wall-clock columns (they differ from run to run)."""
    return p.to_frame().drop(columns=["wall_s"])


def steady_plan(executor, **kw):  # type: ignore[no-untyped-def]
    return sim.plan(S.steady(runs=600, seed=5), TARGET, [3, 4, 5], replications=3,
                    executor=executor, confirm_replications=0, **kw)  # fmt: skip


def test_a_dask_cluster_gives_the_default_pools_numbers() -> None:
    """docs/design.md §20: replications on any Executor — the default (a spawned process pool) and a
    Dask LocalCluster's executor compute the very same table."""
    from distributed import Client, LocalCluster

    default = steady_plan(None)
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        dask = steady_plan(client.get_executor())
    pd.testing.assert_frame_equal(numbers(default), numbers(dask))
    assert default.recommended == dask.recommended == 4


def test_common_random_numbers_no_run_waits_longer_on_a_bigger_fleet(threads) -> None:
    """Replication k has the same seed at every size, so the sizes see the same runs: on
    identical nodes (FIFO G/G/c) every run's wait can only shrink as nodes are added."""
    p = steady_plan(threads)
    seeds = replication_seeds(5, 3)
    for k, seed in enumerate(seeds):
        reps = [r for r in p.replications if r.rep == k]
        assert [r.size for r in reps] == [3, 4, 5]
        assert {r.seed for r in reps} == {seed}
        for small, big in itertools.pairwise(reps):
            assert small.waits.shape == big.waits.shape
            assert np.all(big.waits <= small.waits + 1e-9)
        assert reps[0].waits.sum() > reps[-1].waits.sum()


def test_the_table_beside_erlang_c(threads) -> None:
    """M/M/c: Erlang C's mean and quantiles stand beside every size; intervals come from the
    replications and bracket their estimates; the recommendation is the smallest size whose
    p95 (upper bound included) is within the target."""
    p = steady_plan(threads)
    g = p.grid
    assert list(g["size"]) == [3, 4, 5]
    assert list(g["replications"]) == [3, 3, 3]
    assert list(g["runs"]) == [3 * 540] * 3  # 600 runs, 10 % warm-up
    for row in g.itertuples():
        assert row.erlang_wait_mean_s == pytest.approx(mmc_wq(0.2, 0.1, row.size))
        assert row.erlang_p95_s == pytest.approx(mmc_wait_quantile(0.2, 0.1, row.size, 0.95))
        assert 0 <= row.wait_p95_low <= row.wait_p95_high
        assert row.wait_mean_low <= row.wait_mean_s <= row.wait_mean_high
        assert 0 < row.utilization < 1
    assert list(g["meets_target"]) == [False, True, True]
    assert p.recommended == 4
    assert g["utilization"].is_monotonic_decreasing
    assert p.confirmation.empty


def test_an_unstable_size_is_infinite_in_theory(threads, tmp_path) -> None:
    """λ/μ = 2 Erlangs on two nodes: the queue never settles — Erlang C says inf, P(wait) 1.
    Saved and loaded back, the infinities and the grid are the same."""
    p = sim.plan(S.steady(runs=300, seed=1), TARGET, [2, 3], replications=2,
                 executor=threads, confirm_replications=0)  # fmt: skip
    row = p.row(2)
    assert math.isinf(row["erlang_wait_mean_s"]) and math.isinf(row["erlang_p95_s"])
    assert row["erlang_p_wait"] == 1.0
    assert not row["meets_target"]
    assert_same_plan(sim.CapacityPlan.load(p.save(tmp_path / "plan")), p)


def test_a_trace_has_one_distinct_replication_and_intervals_from_batches(threads) -> None:
    """A trace replay has no randomness: two replications are the same run, so the interval
    comes from ten consecutive batches of it — the same table as one replication. No Erlang C
    (not M/M/c). The interval is centred on the whole run's p95 (sectioning, issue 14 §2), so
    the estimate lies inside it; the half-width is the batches' t-interval's."""
    wl = S.trace(runs=2000)
    one = sim.plan(wl, {"quantile": 0.95, "wait_s": 600}, [3, 5, 7], replications=1,
                   executor=threads, confirm_replications=0)  # fmt: skip
    two = sim.plan(wl, {"quantile": 0.95, "wait_s": 600}, [3, 5, 7], replications=2,
                   executor=threads, confirm_replications=0)  # fmt: skip
    cols = ["wait_p95_s", "wait_p95_low", "wait_p95_high", "wait_mean_low", "wait_mean_high"]
    pd.testing.assert_frame_equal(one.grid[cols], two.grid[cols])
    assert one.grid["erlang_p95_s"].isna().all()
    waits = one.replications[0].waits
    batches = [float(np.quantile(b, 0.95)) for b in np.array_split(waits, 10)]
    assert one.grid.loc[0, "wait_p95_s"] == pytest.approx(float(np.quantile(waits, 0.95)))
    ci = sim.mean_ci(batches)
    p95 = one.grid.loc[0, "wait_p95_s"]
    assert one.grid.loc[0, "wait_p95_high"] == pytest.approx(p95 + ci.half_width)
    assert one.grid.loc[0, "wait_p95_low"] <= p95 <= one.grid.loc[0, "wait_p95_high"]
    assert one.grid.loc[0, "interval_method"] == "batches of one run, 10"


def test_no_size_meets_the_target(threads, tmp_path) -> None:
    p = sim.plan(S.steady(runs=300, seed=1), {"quantile": 0.99, "wait_s": 0.0}, [3, 4],
                 replications=2, executor=threads)  # fmt: skip
    assert p.recommended is None
    assert p.confirmation.empty  # nothing to confirm: no embedded cluster was needed
    assert p.headline().startswith("No fleet size in 3–4 keeps the p99 wait within 0 s")
    assert_same_plan(sim.CapacityPlan.load(p.save(tmp_path / "plan")), p)


def test_a_saved_plan_writes_numpy_figures_as_plain_numbers(threads, tmp_path) -> None:
    """A replication's figures may be numpy scalars (a size from an array, say): saved, they
    are plain JSON numbers and load back equal; anything else is refused, not pickled."""
    p = sim.plan(S.steady(runs=300, seed=1), TARGET, [3], replications=1, executor=threads,
                 confirm_replications=0)  # fmt: skip
    p.replications[0] = dataclasses.replace(p.replications[0], size=np.int64(3))
    q = sim.CapacityPlan.load(p.save(tmp_path / "plan"))
    assert q.replications[0].size == 3 and type(q.replications[0].size) is int
    p.replications[0] = dataclasses.replace(p.replications[0], engine=object())
    with pytest.raises(TypeError, match="object is not JSON"):
        p.save(tmp_path / "other")


def test_a_folder_without_a_saved_plan_is_refused_by_name(tmp_path) -> None:
    """``CapacityPlan.load`` reads only what ``save`` wrote, in its format: an empty folder, a
    stray file and a plan of another format are refused with the folder named."""
    with pytest.raises(ValueError, match=f"{tmp_path}: no saved capacity plan"):
        sim.CapacityPlan.load(tmp_path)
    (tmp_path / "plan.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a capacity plan of format 1"):
        sim.CapacityPlan.load(tmp_path)
    (tmp_path / "plan.json").write_text('{"format": 2}')
    with pytest.raises(ValueError, match="not a capacity plan of format 1"):
        sim.CapacityPlan.load(tmp_path)
    (tmp_path / "plan.json").write_text('{"format": 1, "replications": [{"size": 3}]}')
    with pytest.raises(ValueError, match=f"{tmp_path}: an incomplete capacity plan"):
        sim.CapacityPlan.load(tmp_path)  # no waits.npz, no tables, no target: named, not a trace


def test_a_target_quantile_of_its_own_gets_columns(threads) -> None:
    p = sim.plan(S.steady(runs=300, seed=1), {"quantile": 0.9, "wait_s": 60}, [3, 4],
                 replications=3, executor=threads, confirm_replications=0)  # fmt: skip
    assert p.column == "wait_p90_s"
    for col in ("wait_p90_s", "wait_p90_low", "wait_p90_high", "erlang_p90_s", "wait_p99_s"):
        assert col in p.grid
    assert p.recommended == 3


def test_how_the_fleet_is_sized() -> None:
    """A Scenario: group 0 (or the group with that id_prefix) gets the size, others stay; a
    callable: whatever it returns."""
    mixed = S.mixed()
    by_index = sized(mixed, 9, 1)
    by_prefix = sized(mixed, 9, "arm")
    assert by_index == by_prefix
    assert [g.count for g in by_index.fleet.groups] == [4, 9, 1, 1]
    assert sized(lambda n: S.steady(nodes=n, seed=2), 7).fleet.groups[0].count == 7


def test_a_callable_workload(threads) -> None:
    p = sim.plan(lambda n: S.steady(nodes=n, runs=300, seed=5), TARGET, [4, 3], replications=2,
                 executor=threads, confirm_replications=0)  # fmt: skip
    assert p.sizes == [3, 4]
    assert p.scenario_name == "steady"


def test_plot_and_html(threads, tmp_path, monkeypatch, capsys) -> None:
    import matplotlib.pyplot as plt

    p = steady_plan(threads)
    monkeypatch.chdir(tmp_path)
    fig = p.plot()
    assert len(fig.axes) == 2
    plt.close(fig)
    # issue 29: in a plain script there is no display (the Agg backend, as here), so plt.show()
    # would show nothing: plot() writes the chart to the working directory and says where.
    written = tmp_path / "capacity-plan.png"
    assert written.read_bytes().startswith(b"\x89PNG")
    assert f"capacity plan chart written to {written}" in capsys.readouterr().out
    chosen = tmp_path / "mine.png"
    plt.close(p.plot(path=chosen))
    assert chosen.is_file()
    out = tmp_path / "plan.html"
    doc = p.to_html(out)
    assert out.read_text().strip() == doc.strip()
    assert p.headline() in doc.replace("&#x27;", "'")
    assert "data:image/png;base64," in doc
    assert "wait_p95_s" in doc
    assert p.headline() in p._repr_html_()


def test_in_a_notebook_kernel_the_chart_is_shown_not_written(threads, tmp_path, monkeypatch):
    """issue 29's counterpart: inside a running kernel (an IPython shell with a kernel) the
    inline backend shows every figure, so ``plot()`` writes no file even where matplotlib's own
    backend is a non-interactive one; imported IPython without a kernel changes nothing."""
    import types

    import IPython
    import matplotlib.pyplot as plt

    p = steady_plan(threads)
    monkeypatch.chdir(tmp_path)
    shell = types.SimpleNamespace(kernel=None)
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    plt.close(p.plot())  # a shell, no kernel: a script that imported IPython
    assert (tmp_path / "capacity-plan.png").is_file()
    (tmp_path / "capacity-plan.png").unlink()
    shell.kernel = object()
    plt.close(p.plot())
    assert not (tmp_path / "capacity-plan.png").exists()


@pytest.mark.parametrize(
    ("target", "sizes", "reps", "engine"),
    [
        ({"quantile": 1.0, "wait_s": 1}, [3], 1, "model"),
        ({"quantile": 0.5, "wait_s": -1}, [3], 1, "model"),
        (TARGET, [], 1, "model"),
        (TARGET, [0, 3], 1, "model"),
        (TARGET, [3], 0, "model"),
        (TARGET, [3], 1, "simpy"),
    ],
)
def test_refusals(target, sizes, reps, engine) -> None:
    with pytest.raises(ValueError):
        sim.plan(S.steady(runs=100), target, sizes, reps, engine=engine)


def test_a_wrong_target_key_names_the_keys_expected() -> None:
    """issue 14 §4: `plan(..., {"wait": 10})` was a KeyError 'wait_s' from deep inside."""
    with pytest.raises(ValueError, match=r"unknown key 'wait'; expected \{'quantile': 0.95, "):
        sim.plan(S.steady(runs=100), {"wait": 10}, [3])


def test_a_trace_defaults_to_one_replication_and_a_bounded_confirmation() -> None:
    """issue 14 §4: five identical replications of a deterministic trace were the default."""
    from sim.studies.plan import CONFIRM_RUNS, is_deterministic

    assert is_deterministic(S.trace(runs=100)) and not is_deterministic(S.steady(runs=100))
    p = sim.plan(S.trace(runs=400), {"quantile": 0.95, "wait_s": 600}, [3, 4],
                 confirm_replications=0, progress=False)  # fmt: skip
    assert set(p.grid["replications"]) == {1}
    assert CONFIRM_RUNS == 1500  # what `plan` confirms on the Mediator unless told otherwise


def test_every_plan_option_has_a_command_line_flag() -> None:
    """issue 14 §4: the CLI passes every plan option (executor aside: --scheduler stands in)."""
    import inspect

    from sim.outputs.cli import build_parser

    plan_parser = build_parser()._subparsers._group_actions[0].choices["plan"]  # type: ignore[union-attr]
    dests = {a.dest for a in plan_parser._actions}
    names = set(inspect.signature(sim.plan).parameters) - {"workload", "target", "executor"}
    flags = {"fleet_sizes": "sizes", "progress": "quiet", "engine": "broker"}  # (old name)
    missing = {n for n in names if flags.get(n, n) not in dests}
    assert not missing
    assert all(a.help for a in plan_parser._actions)  # issue 15 §2: every option says what


SCRIPT = """\
import sim
from sim.inputs import scenarios as S

# No `if __name__ == "__main__":` guard, as a script pasted from the README would be.
p = sim.plan(S.steady(runs=300, seed=1), {"quantile": 0.95, "wait_s": 10.0}, [3, 4, 5],
             replications=2, confirm_replications=0, progress=False)
print("recommended", p.recommended)
"""


def test_plan_runs_from_a_plain_script_without_a_main_guard(tmp_path) -> None:
    """issue 14 §4: pasted into a script, `sim.plan` crashed with BrokenProcessPool — the
    spawned workers re-ran the unguarded script. It now picks a start method that cannot."""
    import subprocess
    import sys

    script = tmp_path / "capacity.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("recommended ")
    assert "BrokenProcessPool" not in done.stderr


def two_classes(big: int = 4, small: int = 2, runs: int = 3000) -> S.Scenario:
    """Two node kinds, each an M/M/c queue of its own: `x` runs on x nodes (rho 0.6 at 4 nodes),
    `y` runs on y nodes (rho 0.5 at 2), and `xy` runs needing one of each (multi-role)."""
    groups = (S.NodeGroup(big, {"kind": "x"}, id_prefix="x"),
              S.NodeGroup(small, {"kind": "y"}, id_prefix="y"))  # fmt: skip
    one = S._one_step  # the builders' own helper
    templates = (one("x", {"kind": "x"}, S.Exponential(60.0), weight=0.6),
                 one("y", {"kind": "y"}, S.Exponential(60.0), weight=0.4))  # fmt: skip
    base = S.steady(runs=runs)
    return dataclasses.replace(
        base, name="two_classes",
        fleet=dataclasses.replace(base.fleet, groups=groups),
        workload=S.Workload(S.Poisson(1 / 15), templates),
    )  # fmt: skip


def test_a_plan_per_capability_class_sizes_each_kind_with_erlang_beside_it() -> None:
    """issue 14 §5: for a fleet of several kinds, the smallest count of each kind meeting the
    target for the runs that use it, simulated together; where a kind is an M/M/c queue of its
    own, Erlang C's figures stand beside the simulated ones and agree with the recommendation."""
    target = {"quantile": 0.95, "wait_s": 60.0}
    p = sim.plan(two_classes(), target, range(1, 7), replications=3, per_class=True)
    frame = p.to_frame().set_index("group")
    assert p.counts == {"x": frame.loc["x", "nodes"], "y": frame.loc["y", "nodes"]}
    assert frame.loc["x", "templates"] == "x" and frame.loc["y", "templates"] == "y"
    for g, share in (("x", 0.6), ("y", 0.4)):
        lam, mu, c = share / 15, 1 / 60, int(frame.loc[g, "nodes"])
        assert frame.loc[g, "erlang_p95_s"] == pytest.approx(mmc_wait_quantile(lam, mu, c, 0.95))
        assert frame.loc[g, "erlang_wait_mean_s"] == pytest.approx(mmc_wq(lam, mu, c))
        # Erlang C agrees: the recommended count meets the target in theory, one fewer not.
        assert mmc_wait_quantile(lam, mu, c, 0.95) <= 60.0
        assert c == 1 or lam >= (c - 1) * mu or mmc_wait_quantile(lam, mu, c - 1, 0.95) > 45.0
        assert frame.loc[g, "wait_p95_low"] <= frame.loc[g, "wait_p95_s"] <= 60.0
    assert "per capability class" in p.headline().lower()


def test_a_multi_role_run_ties_the_classes_together() -> None:
    """The interaction is simulated: adding runs that hold an x and a y node at once can only
    raise the counts the classes need."""
    target = {"quantile": 0.95, "wait_s": 60.0}
    alone = sim.plan(two_classes(), target, range(1, 7), replications=2, per_class=True)
    sc = two_classes()
    steps = (S.StepSpec("a", role="a", duration=S.Exponential(30.0)),
             S.StepSpec("b", role="b", duration=S.Exponential(30.0)))  # fmt: skip
    xy = S.Template("xy", {"a": {"kind": "x"}, "b": {"kind": "y"}}, steps, weight=0.2)
    tied = dataclasses.replace(
        sc, workload=S.Workload(S.Poisson(1.2 / 15), (*sc.workload.templates, xy))
    )
    both = sim.plan(tied, target, range(1, 7), replications=2, per_class=True)
    assert both.to_frame().set_index("group").loc["x", "templates"] == "x, xy"
    assert both.to_frame()["erlang_p95_s"].isna().all()  # no longer M/M/c on their own
    assert all(both.counts[g] >= alone.counts[g] for g in ("x", "y"))


# ---- the confirmation's per-job difference (issue 28 §2) and the chart's axis (issue 29 §9) -----


def _confirmed_by_hand(p: sim.CapacityPlan, bump: dict[tuple[int, int], float]) -> sim.CapacityPlan:
    """`p` with a confirmation built here: the model's waits for the recommended size and its
    neighbours from independent `sim.run` calls, and "real Mediator" waits that are the same
    runs with `bump[(size, job)]` seconds added — so the test knows the difference to expect."""
    rec = p.recommended
    reps = []
    for s in (rec - 1, rec, rec + 1):
        model = sim.run(sized(S.steady(runs=600, seed=5), s), "model")
        waits = model.runs.loc[~model.runs["warmup"], "wait_s"].to_numpy(dtype=float)
        mediator = waits.copy()
        for (size, job), extra in bump.items():
            if size == s:
                mediator[job] += extra
        for engine, w in (("model", waits), ("mediator", mediator)):
            reps.append(Replication(s, 0, 5, engine, w, 0, 0.5, 0.0, stage="confirm"))
    return dataclasses.replace(p, replications=[*p.replications, *reps])


def test_the_confirmation_difference_is_computed_job_by_job_from_both_runs(threads) -> None:
    """The largest |wait on the real Mediator − wait on the model| over every job of every
    confirmed size, against a brute-force reference from the same arrays; and where it is."""
    p = steady_plan(threads)
    assert p.recommended == 4 and p.confirmation_check() is None  # nothing confirmed yet
    rng = np.random.default_rng(7)
    bump = {(3, int(rng.integers(0, 500))): float(rng.uniform(1, 9)) for _ in range(3)}
    bump[(5, 123)] = 37.25
    confirmed = _confirmed_by_hand(p, bump)
    check = confirmed.confirmation_check()
    med = {r.size: r.waits for r in confirmed.replications if r.engine == "mediator"}
    mod = {r.size: r.waits for r in confirmed.replications
           if r.engine == "model" and r.stage == "confirm"}  # fmt: skip
    reference = max(float(np.max(np.abs(med[s] - mod[s]))) for s in med)
    assert check is not None and check.max_abs_diff_s == reference == 37.25
    assert (check.worst_size, check.worst_job) == (5, 123)
    assert check.sizes == [3, 4, 5] and check.jobs == 540  # 600 runs less 60 warm-up
    # Agreeing runs give 0; a run started on one engine only gives inf, never a number.
    assert _confirmed_by_hand(p, {}).confirmation_check().max_abs_diff_s == 0.0
    short = [dataclasses.replace(r, waits=r.waits[:-1], unstarted=1)
             if r.engine == "mediator" and r.size == 4 else r
             for r in confirmed.replications]  # fmt: skip
    assert (
        dataclasses.replace(p, replications=short).confirmation_check().max_abs_diff_s == math.inf
    )


def test_the_chart_reads_in_the_targets_unit_with_waits_above_it_written_out(threads) -> None:
    """issue 29 §9: not seconds on a log axis up to 10⁶ — a 10-minute target reads in minutes on
    a linear axis up to three times the target; a size waiting longer is marked at the edge with
    its wait in words."""
    import matplotlib.pyplot as plt

    p = sim.plan(S.trace(runs=2000), {"quantile": 0.95, "wait_s": 600}, [2, 3, 6],
                 replications=1, executor=threads, confirm_replications=0)  # fmt: skip
    fig = p.plot(ax=plt.subplots(2, 1)[1])
    wait_ax = fig.axes[0]
    assert wait_ax.get_yscale() == "linear"
    assert wait_ax.get_ylabel() == "95th-percentile queue wait (min)"
    assert wait_ax.get_ylim()[1] == pytest.approx(30 * 1.04)
    over = p.grid[p.grid["wait_p95_s"] > 1800]
    assert len(over)  # 2 nodes wait far longer than 30 min on these jobs
    labels = [t.get_text() for t in wait_ax.texts]
    assert len(labels) == len(over) and all(
        lab.split()[-1] in ("min", "h", "days") for lab in labels
    )
    plt.close(fig)


def test_sim_plan_confirms_a_bounded_prefix_unless_told_and_says_how_to_skip(capsys) -> None:
    """issue 29 §7: `python -m sim plan` passed no bound, so the confirmation replayed the whole
    workload on the real Mediator (98 % of the command's time). It now replays CONFIRM_RUNS runs
    unless told `--confirm-runs all`; the help and the printed note say how to shorten or skip."""
    from sim.outputs import cli
    from sim.studies.plan import CONFIRM_RUNS

    parser = cli.build_parser()
    assert (
        parser.parse_args(["plan", "steady", "--sizes", "3", "--wait", "5"]).confirm_runs
        == CONFIRM_RUNS
        == 1500
    )
    assert (
        parser.parse_args(
            ["plan", "steady", "--sizes", "3", "--wait", "5", "--confirm-runs", "all"]
        ).confirm_runs
        is None
    )
    assert (
        parser.parse_args(
            ["plan", "steady", "--sizes", "3", "--wait", "5", "--confirm-runs", "200"]
        ).confirm_runs
        == 200
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["plan", "steady", "--sizes", "3", "--wait", "5", "--confirm-runs", "0"])
    assert "expected at least 1 run, got 0" in capsys.readouterr().err
    from sim.studies.plan import _confirm_note

    note = _confirm_note([3, 4, 5], 2, 1500, True)
    assert "the first 1,500 runs" in note
    assert "--confirm-runs N" in note and "--confirm-replications 0" in note
