"""Statistics for simulation output: queueing theory to compare against, and honest intervals.

design.md §20: a simulator is only trusted once it reproduces theory where theory applies — Erlang C
for M/M/c — with independent replications, a warm-up cut and confidence intervals, "not one lucky
seed"; and Little's law (L = λW) is checked on every run. This module holds those tools. It knows
nothing of how a result was produced: the reference model and the real-Mediator engine feed it the
same `runs` / `queue` tables, and it imports no part of the simulator (the replications that run
the model, `replicate`, live beside `run_model` in `sim.brokers.model`), so the model can use it
freely.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd  # type: ignore[import-untyped, unused-ignore]

# ---------------------------------------------------------------------------------------------
# M/M/c (Erlang C), exactly as docs/design.md §20 states it
# ---------------------------------------------------------------------------------------------


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in M/M/c with offered load `a` = λ/μ Erlangs.

    C(c, a) = B_c / (1 − ρ(1 − B_c)), ρ = a/c, with the Erlang B recursion
    B_0 = 1, B_k = a·B_{k−1} / (k + a·B_{k−1}) (stable for large c).

    Args:
        c: servers (>= 1).
        a: offered load in Erlangs (>= 0).

    Returns:
        C(c, a); 1.0 when a >= c (the queue is unstable: everyone waits).
    """
    if c < 1 or a < 0:
        raise ValueError("need c >= 1 and a >= 0")
    if a >= c:
        return 1.0
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    rho = a / c
    return b / (1.0 - rho * (1.0 - b))


def _theta(lam: float, mu: float, c: int) -> float:
    theta = c * mu - lam
    if theta <= 0:
        raise ValueError(f"unstable queue: lambda={lam} >= c*mu={c * mu}")
    return theta


def mmc_wq(lam: float, mu: float, c: int) -> float:
    """Mean wait in queue, Wq = C/θ with θ = cμ − λ."""
    return erlang_c(c, lam / mu) / _theta(lam, mu, c)


def mmc_p_wait_gt(lam: float, mu: float, c: int, t: float) -> float:
    """P(Wq > t) = C·e^{−θt} (t >= 0)."""
    return erlang_c(c, lam / mu) * math.exp(-_theta(lam, mu, c) * t)


def mmc_wait_quantile(lam: float, mu: float, c: int, q: float) -> float:
    """The q-quantile of the wait, t_q = max(0, ln(C/(1−q))/θ)."""
    if not 0 < q < 1:
        raise ValueError("q must be in (0, 1)")
    cw = erlang_c(c, lam / mu)
    if cw <= 0:
        return 0.0
    return max(0.0, math.log(cw / (1.0 - q)) / _theta(lam, mu, c))


# ---------------------------------------------------------------------------------------------
# Intervals
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """An estimate with a confidence interval."""

    estimate: float
    low: float
    high: float
    n: int
    conf: float
    method: str = ""

    @property
    def half_width(self) -> float:
        """Half the interval's width (± this around a symmetric estimate)."""
        return (self.high - self.low) / 2

    def contains(self, x: float) -> bool:
        """Whether `x` lies within [low, high]."""
        return self.low <= x <= self.high

    def __str__(self) -> str:
        how = f", {self.method}" if self.method else ""
        return (
            f"{self.estimate:.4g} [{self.low:.4g}, {self.high:.4g}] "
            f"({self.conf:.0%}, n={self.n}{how})"
        )


#: Batches for one run's intervals. Few long batches: with a fixed number of runs, long batches
#: keep the batch statistics nearly independent when waits are strongly correlated (high load);
#: the t quantile with 4 degrees of freedom pays for the small count honestly. Measured coverage
#: of Erlang C's mean and p95 on M/M/3 (tests/unit/sim/test_sim_coverage.py): 20 batches covered the
#: p95 in 84 % of seeds at rho = 2/3 and 35 % at 0.9; 5 batches 95 % and 71 % (4,000 runs).
BATCHES = 5


# scipy.stats is imported only where an order-statistic interval needs it: it takes most of a
# second to import, and every process that imports `sim` paid it (each pool worker of a plan or a
# report, each `python -m sim`), most of them never drawing an interval. Student's t comes from
# scipy.special, the very function scipy.stats.t.ppf calls (tests/unit/sim/test_sim_analysis.py).


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile: ``scipy.stats.t.ppf(p, df)``, which is ``stdtrit(df, p)``."""
    from scipy.special import stdtrit  # type: ignore[import-untyped, unused-ignore]

    return float(stdtrit(df, p))


def mean_ci(samples: npt.ArrayLike, conf: float = 0.95) -> Interval:
    """Student-t interval for the mean of independent samples (e.g. one value per replication).

    Args:
        samples: at least two values, independent (within-run waits are not: use replications or
            `batch_means`).
        conf: confidence level.

    Returns:
        The mean with its interval.
    """
    x = np.asarray(samples, dtype=float)
    n = x.size
    if n < 2:
        raise ValueError("need at least two samples")
    m = float(x.mean())
    half = t_quantile(0.5 + conf / 2, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return Interval(m, m - half, m + half, n, conf, f"t over {n} independent values")


def sectioning(
    groups: Sequence[npt.ArrayLike],
    stat: Callable[[npt.NDArray[np.float64]], float],
    conf: float = 0.95,
    method: str = "sectioning",
) -> Interval:
    """Interval for any statistic from independent (or nearly independent) groups of one sample.

    The estimate is the statistic of all groups pooled; the half-width is Student's t times the
    standard error of the per-group statistics (Asmussen & Glynn's *sectioning*). Centring on the
    pooled estimate keeps the estimate inside its interval even where the statistic of a small
    group is biased (quantiles are), which a t-interval around the mean of the group statistics
    does not (issue 14 §2: notebook 04 printed p95 379,591.9 [92,331.9, 319,834.0]).

    Args:
        groups: at least two arrays: independent replications, or batches of one long run.
        stat: the statistic, e.g. `np.mean` or a quantile.
        conf: confidence level.
        method: the label the interval carries.
    """
    arrays = [np.asarray(g, dtype=float) for g in groups]
    k = len(arrays)
    if k < 2:
        raise ValueError("need at least two groups")
    per = np.array([stat(a) for a in arrays], dtype=float)
    est = float(stat(np.concatenate(arrays)))
    half = t_quantile(0.5 + conf / 2, k - 1) * float(per.std(ddof=1)) / math.sqrt(k)
    return Interval(est, est - half, est + half, k, conf, method)


def _batches(x: npt.ArrayLike, n_batches: int) -> list[npt.NDArray[np.float64]]:
    a = np.asarray(x, dtype=float)
    size = a.size // n_batches
    if size < 1 or n_batches < 2:
        raise ValueError("need at least two batches and one sample per batch")
    # The first `a.size % n_batches` samples are left out, so every batch is as long (and the
    # oldest samples, nearest the empty start, are the ones dropped).
    return list(a[a.size - size * n_batches :].reshape(n_batches, size))


def batch_means(x: npt.ArrayLike, n_batches: int = BATCHES, conf: float = 0.95) -> Interval:
    """Mean of one long, autocorrelated series with a batch-means interval.

    The series is cut into `n_batches` contiguous batches whose means are nearly independent when
    batches are much longer than the correlation time; the t-interval is over the batch means.
    """
    return sectioning(
        _batches(x, n_batches), lambda a: float(a.mean()), conf, f"batch means, {n_batches} batches"
    )


def batch_quantile(
    x: npt.ArrayLike, q: float, n_batches: int = BATCHES, conf: float = 0.95
) -> Interval:
    """A quantile of one long, autocorrelated series with a batch interval (sectioning).

    Like `batch_means` for a quantile: the order-statistic interval assumes independent waits and
    covered the Erlang C p95 in 73 of 200 seeds (issue 14 §2); batches of one run do not.
    """
    if not 0 < q < 1:
        raise ValueError("q must be in (0, 1)")
    return sectioning(
        _batches(x, n_batches),
        lambda a: float(np.quantile(a, q)),
        conf,
        f"batch quantiles, {n_batches} batches",
    )


def quantile_ci(
    samples: npt.ArrayLike | Sequence[npt.ArrayLike], q: float, conf: float = 0.95
) -> Interval:
    """Interval for a quantile.

    Args:
        samples: either a list of per-replication sample arrays — then the q-quantile of each
            replication is one independent value and the interval is sectioning over them,
            centred on the pooled quantile (the honest choice for waits, which are correlated
            within a run) — or one 1-d array of i.i.d. values, for which the distribution-free
            order-statistic interval is used (not for waits of one run: see `batch_quantile`).
        q: the quantile, in (0, 1).
        conf: confidence level.

    Returns:
        The quantile estimate with its interval.
    """
    if not 0 < q < 1:
        raise ValueError("q must be in (0, 1)")
    if isinstance(samples, list | tuple) and samples and np.ndim(samples[0]) == 1:
        return sectioning(
            samples,
            lambda a: float(np.quantile(a, q)),
            conf,
            f"replications, {len(samples)}",
        )
    x = np.sort(np.asarray(samples, dtype=float))
    n = x.size
    if n < 2:
        raise ValueError("need at least two samples")
    # Order statistics X_(j) ≤ ξ_q ≤ X_(k): the count below ξ_q is Binomial(n, q).
    from scipy import stats  # type: ignore[import-untyped, unused-ignore]  # here only: see above

    lo = int(stats.binom.ppf((1 - conf) / 2, n, q))
    hi = int(stats.binom.ppf((1 + conf) / 2, n, q)) + 1
    lo, hi = max(lo, 1), min(hi, n)
    return Interval(
        float(np.quantile(x, q)),
        float(x[lo - 1]),
        float(x[hi - 1]),
        n,
        conf,
        "order statistics, i.i.d.",
    )


def lag1_autocorrelation(x: npt.ArrayLike) -> float:
    """Lag-1 sample autocorrelation (NaN for a constant or too short series)."""
    a = np.asarray(x, dtype=float)
    if a.size < 3:
        return math.nan
    d = a - a.mean()
    den = float(np.dot(d, d))
    return float(np.dot(d[:-1], d[1:]) / den) if den > 0 else math.nan


#: Lag-1 autocorrelation of 20 batch means above which the batches are too short for the
#: correlation of the waits (about two standard errors of r1 for independent batches, 1/sqrt(20)).
SHORT_RUN_R1 = 0.45


def short_run_warning(waits: npt.ArrayLike) -> str | None:
    """Why one run's intervals are probably too narrow, or None.

    Cuts the waits into 20 batches: when their means are still clearly correlated (lag-1
    autocorrelation above `SHORT_RUN_R1`), the run is too short for its load — the empty start
    biases the estimates low and the batches are not independent (issue 14 §2: at rho = 0.95 and
    2,000 runs the mean came out 14-17 % low, the p95 33 % low).
    """
    a = np.asarray(waits, dtype=float)
    if a.size < 200:
        return None  # no intervals are reported for so few waits
    means = np.array([b.mean() for b in _batches(a, 20)])
    r1 = lag1_autocorrelation(means)
    if r1 > SHORT_RUN_R1:
        return (
            f"run too short for its load: the means of 20 consecutive batches are correlated "
            f"(lag-1 autocorrelation {r1:.2f} > {SHORT_RUN_R1}); estimates are likely biased "
            f"low and intervals too narrow — simulate more runs or use replications"
        )
    return None


def mmc_relaxation_runs(rho: float) -> float:
    """Arrivals per relaxation time of an M/M/c queue at utilisation rho, rho/(1-sqrt(rho))^2.

    The relaxation time of the queue is about 1/(c*mu*(1-sqrt(rho))^2); multiplied by the arrival
    rate c*mu*rho it is this many runs: 20 at rho = 2/3, 341 at 0.9, 1,473 at 0.95.
    """
    if not 0 <= rho < 1:
        return math.inf
    return rho / (1.0 - math.sqrt(rho)) ** 2


#: Relaxation times a single run should span (`runs_for_load`).
RELAXATIONS = 60


def runs_for_load(rho: float, floor: int = 10_000) -> int:
    """A run count long enough for one run's intervals at utilisation rho: at least `floor`,
    and `RELAXATIONS` relaxation times (`mmc_relaxation_runs`), rounded up to a thousand.
    4,000 at rho = 2/3, 21,000 at 0.9, 89,000 at 0.95."""
    need = RELAXATIONS * mmc_relaxation_runs(rho)
    if not math.isfinite(need):
        return floor
    return max(floor, math.ceil(need / 1000.0) * 1000)


def mser5(x: npt.ArrayLike) -> int:
    """MSER-5 truncation point (White 1997): how many leading samples to drop.

    Averages the series in batches of 5 and picks the cut d (within the first half) that
    minimises the variance of the remaining mean, sum((y - mean)^2) / (n - d)^2. Offered as a
    diagnostic only: on M/M/3 with strongly correlated waits it cut long excursions, not the
    transient, and biased the mean low (-4 % at rho = 2/3, -9 % at 0.9, over 100 seeds), so
    results keep their scenario's warm-up and warn when the run is too short instead.
    """
    a = np.asarray(x, dtype=float)
    n = a.size // 5
    if n < 4:
        return 0
    b = a[: n * 5].reshape(n, 5).mean(axis=1)[::-1]
    m = np.arange(1, n + 1)
    cs, cs2 = np.cumsum(b), np.cumsum(b * b)
    crit = ((cs2 - cs * cs / m) / (m * m))[::-1]  # crit[d]: batches d..n-1 kept
    return int(np.argmin(crit[: n // 2])) * 5


def _nonnegative(i: Interval) -> Interval:
    return replace(i, low=max(0.0, i.low))


def wait_statistics(waits: npt.ArrayLike) -> dict[str, Any]:
    """The wait figures of one run's summary: mean, p50/p95/p99, P(wait > 0), and — with 200
    or more waits — intervals that hold for correlated waits (batch means and batch quantiles,
    `BATCHES` batches), each labelled with its method.

    Args:
        waits: the measured waits in arrival order (warm-up already left out).

    Returns:
        The figures; `warnings` lists why they are doubtful (a run too short for its load), and
        the command line prints it. (Not a Python warning: a notebook or test summarising many
        short exploratory runs should not be interrupted.)
    """
    w = np.asarray(waits, dtype=float)
    out: dict[str, Any] = {}
    if not w.size:
        return out
    out.update(
        wait_mean_s=float(w.mean()),
        wait_p50_s=float(np.quantile(w, 0.5)),
        wait_p95_s=float(np.quantile(w, 0.95)),
        wait_p99_s=float(np.quantile(w, 0.99)),
        p_wait=float((w > 0).mean()),
    )
    if w.size >= 200:
        # Waits are never negative: a symmetric interval reaching below 0 is cut there.
        out["wait_mean_ci"] = _nonnegative(batch_means(w))
        for q in (0.5, 0.95, 0.99):
            out[f"wait_p{round(q * 100)}_ci"] = _nonnegative(batch_quantile(w, q))
        out["interval_method"] = out["wait_mean_ci"].method + " of one run (95 %)"
    problem = short_run_warning(w)
    if problem:
        out["warnings"] = [problem]
    return out


# ---------------------------------------------------------------------------------------------
# Replications and warm-up
# ---------------------------------------------------------------------------------------------


def replication_seeds(seed: int, n: int) -> list[int]:
    """`n` independent seeds derived from `seed` (SeedSequence), the same for the same inputs."""
    return [int(s) for s in np.random.SeedSequence(seed).generate_state(n)]


def warmup_cut(
    runs: pd.DataFrame, n: int | None = None, before_s: float | None = None
) -> pd.DataFrame:
    """Drop the warm-up: runs flagged `warmup`, the first `n` by creation, runs created before
    `before_s` — whichever are given."""
    out = runs
    if "warmup" in out.columns:
        out = out[~out["warmup"].astype(bool)]
    if n:
        out = out.sort_values("created_at", kind="stable").iloc[n:]
    if before_s is not None:
        out = out[out["created_at"] >= before_s]
    return out


# ---------------------------------------------------------------------------------------------
# Little's law
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LittleCheck:
    """L (time-average number in queue) against λ·W over one window."""

    start_s: float
    end_s: float
    L: float
    lam: float
    W: float
    arrivals: int

    @property
    def lam_w(self) -> float:
        """λ·W."""
        return self.lam * self.W

    @property
    def rel_err(self) -> float:
        """|L − λW| / L (0 when both are 0)."""
        if self.L == 0:
            return 0.0 if self.lam_w == 0 else math.inf
        return abs(self.L - self.lam_w) / self.L


def littles_law(
    runs: pd.DataFrame,
    queue: pd.DataFrame | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
) -> LittleCheck:
    """Check L = λW for the queue (waiting, not service) over a window.

    L comes from `queue` (at_s, length — a step function, integrated over the window) when given,
    which makes the check independent of how waits were computed; otherwise from the runs'
    queued intervals clipped to the window. λ counts runs created in the window; W is their mean
    wait (a run never started is waiting until the window's end). Over a window that starts and
    ends with an empty queue — a whole simulation that drains — L·T equals the total wait exactly;
    over a mid-run window the edges make a small difference.

    Args:
        runs: with created_at, started_at (NaN if never started) and, for rejected runs, a state.
        queue: the queue-length series.
        start_s: window start (default 0).
        end_s: window end (default: the last creation, start or end).
    """
    runs = runs[runs["state"].ne("FAILED") | runs["started_at"].notna()]  # rejected never queue
    created = runs["created_at"].to_numpy(dtype=float)
    started = runs["started_at"].to_numpy(dtype=float)
    t0 = 0.0 if start_s is None else float(start_s)
    if end_s is None:
        ended = runs["ended_at"].to_numpy(dtype=float) if "ended_at" in runs else created
        end_s = float(np.nanmax(np.concatenate([created, started, ended]))) if len(runs) else t0
    t1 = float(end_s)
    span = t1 - t0
    if span <= 0:
        raise ValueError("empty window")
    left = np.where(np.isnan(started), t1, started)
    if queue is not None:
        at = queue["at_s"].to_numpy(dtype=float)
        length = queue["length"].to_numpy(dtype=float)
        # the value set at at[i] holds until at[i+1]
        edges = np.clip(np.append(at, t1), t0, t1)
        area = float(np.sum(length * np.diff(edges)))
    else:
        area = float(np.sum(np.clip(np.minimum(left, t1) - np.maximum(created, t0), 0, None)))
    inside = (created >= t0) & (created < t1)
    waits = left[inside] - created[inside]
    n = int(inside.sum())
    return LittleCheck(t0, t1, area / span, n / span, float(waits.mean()) if n else 0.0, n)
