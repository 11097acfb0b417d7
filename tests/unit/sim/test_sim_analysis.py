"""Queueing theory and interval tools (docs/design.md §20) on their reference points."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.analysis import (
    Interval,
    batch_means,
    erlang_c,
    littles_law,
    mean_ci,
    mmc_p_wait_gt,
    mmc_wait_quantile,
    mmc_wq,
    quantile_ci,
    replication_seeds,
    t_quantile,
    warmup_cut,
)
from sim.brokers.model import replicate, run_model
from sim.inputs import scenarios as S


def test_erlang_c_reference_points_of_sim_md_section_7() -> None:
    assert mmc_wq(3, 5, 1) == pytest.approx(0.3)  # M/M/1: ρ/(μ−λ)
    assert erlang_c(3, 0.2 / 0.1) == pytest.approx(0.4444, abs=5e-5)
    assert mmc_wq(0.2, 0.1, 3) == pytest.approx(4.444, abs=5e-4)
    assert mmc_wait_quantile(0.2, 0.1, 3, 0.95) == pytest.approx(21.85, abs=5e-3)


def test_erlang_c_edges_and_consistency() -> None:
    assert erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: P(wait) = ρ
    assert erlang_c(4, 4.0) == 1.0  # unstable: everyone waits
    assert erlang_c(2, 0.0) == 0.0
    lam, mu, c = 0.2, 0.1, 3
    t95 = mmc_wait_quantile(lam, mu, c, 0.95)
    assert mmc_p_wait_gt(lam, mu, c, t95) == pytest.approx(0.05)
    assert mmc_wait_quantile(lam, mu, c, 0.5) == 0.0  # C < 0.5: the median wait is zero
    # large c stays finite (the B recursion never forms a^c / c!)
    assert 0 < erlang_c(500, 490.0) < 1
    with pytest.raises(ValueError, match="unstable"):
        mmc_wq(0.4, 0.1, 3)


def test_t_quantile_is_scipy_stats_t_ppf() -> None:
    """`t_quantile` calls scipy.special so that `import sim` needs no scipy.stats; scipy.stats is
    the reference it must equal, bit for bit (the levels intervals use, 1 to 100,000 degrees of
    freedom)."""
    from scipy import stats

    for p in [0.005, 0.025, 0.05, 0.1, 0.5, 0.9, 0.95, 0.975, 0.995]:
        for df in [1, 2, 3, 4, 9, 19, 29, 99, 1_000, 100_000]:
            assert t_quantile(p, df) == float(stats.t.ppf(p, df)), (p, df)


def test_importing_sim_imports_no_scipy_stats() -> None:
    """Every pool worker and every `python -m sim` imports `sim`; scipy.stats would cost each
    most of a second (sim/analysis.py)."""
    import subprocess
    import sys

    code = "import sys, sim, sim.analysis; print('scipy.stats' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_mean_ci_is_a_student_t_interval() -> None:
    ci = mean_ci([1.0, 2.0, 3.0, 4.0], conf=0.95)
    half = 3.182446305284263 * np.std([1, 2, 3, 4], ddof=1) / 2  # t(0.975, 3)·s/√n
    assert (ci.estimate, ci.half_width) == (pytest.approx(2.5), pytest.approx(half))
    assert ci.contains(2.5) and not ci.contains(10.0)
    assert isinstance(ci, Interval) and ci.n == 4


def test_quantile_ci_order_statistics_cover_the_true_quantile() -> None:
    rng = np.random.default_rng(3)
    x = rng.exponential(1.0, 20_000)
    ci = quantile_ci(x, 0.95)
    assert ci.contains(math.log(20))  # the Exp(1) 95th percentile
    assert ci.low <= ci.estimate <= ci.high


def test_quantile_ci_over_replications_uses_one_value_per_replication() -> None:
    rng = np.random.default_rng(4)
    reps = [rng.exponential(1.0, 5_000) for _ in range(8)]
    ci = quantile_ci(reps, 0.95)
    assert ci.n == 8 and ci.contains(math.log(20))


def test_batch_means_of_a_long_series() -> None:
    x = np.random.default_rng(5).normal(3.0, 1.0, 100_000)
    ci = batch_means(x, n_batches=20)
    assert ci.contains(3.0) and ci.half_width < 0.05


def test_replications_use_distinct_reproducible_seeds() -> None:
    assert replication_seeds(1, 3) == replication_seeds(1, 3)
    assert len(set(replication_seeds(1, 50))) == 50
    results = replicate(S.steady(runs=200), 3)
    assert len({r.runs["created_at"].iloc[0] for r in results}) == 3


def test_warmup_cut_drops_flagged_and_early_runs() -> None:
    result = run_model(S.steady(runs=1000))  # warm-up: the first 100 runs
    runs = warmup_cut(result.runs)
    assert len(runs) == 900 and runs["run_id"].iloc[0] == "r0000100"
    assert len(warmup_cut(result.runs, n=100)) == 800
    assert (warmup_cut(result.runs, before_s=1000.0)["created_at"] >= 1000.0).all()


def test_littles_law_holds_exactly_over_a_run_that_drains() -> None:
    """L·T = Σ waits when the window starts and ends with an empty queue; L from the model's
    queue-length series, W from its runs — two separate bookkeepings that must agree."""
    result = run_model(S.steady(runs=3000, arrival_rate=0.27))
    check = littles_law(result.runs, result.queue)
    assert check.arrivals == 3000
    assert check.rel_err < 1e-9
    from_runs = littles_law(result.runs)  # L from the runs' queued intervals instead
    assert abs(check.L - from_runs.L) <= 1e-12 * check.L


def test_littles_law_over_a_window_inside_the_run() -> None:
    result = run_model(S.steady(runs=20_000, arrival_rate=0.25))
    check = littles_law(result.runs, result.queue, start_s=10_000.0, end_s=70_000.0)
    assert check.rel_err < 0.02


def test_batch_intervals_are_centred_on_their_estimate_and_say_how() -> None:
    """issue 14 §2: a quantile's interval from batches is centred on the pooled quantile, so the
    estimate never falls outside it (a t-interval around the batch quantiles' mean did)."""
    from sim.analysis import batch_means, batch_quantile, quantile_ci

    rng = np.random.default_rng(1)
    x = rng.lognormal(0, 2, 5000)  # heavy tail: small batches' p99 is biased low
    q = batch_quantile(x, 0.99)
    assert q.contains(q.estimate) and q.estimate == np.quantile(x, 0.99)
    assert q.method == "batch quantiles, 5 batches" and "batch quantiles" in str(q)
    assert batch_means(x).method == "batch means, 5 batches"
    reps = quantile_ci([x[:100], x[100:200], x[200:300]], 0.99)
    assert reps.contains(reps.estimate) and reps.method == "replications, 3"


def test_a_run_too_short_for_its_load_says_so() -> None:
    """issue 14 §2: M/M/2 at rho = 0.95 with 2,000 runs starts empty and ends long before the
    queue forgets it; the summary warns (seed chosen where the batch means show it), while
    `steady()`'s default run count for that load (89,000) gives no warning."""
    short = run_model(S.steady(nodes=2, arrival_rate=0.19, runs=2000, seed=3)).summary()
    assert any("too short for its load" in w for w in short["warnings"])
    assert S.steady(nodes=2, arrival_rate=0.19).horizon_runs == 89_000
    fine = run_model(S.steady(runs=4000, seed=3)).summary()
    assert "warnings" not in fine
