"""Statistics for simulation output: queueing theory to compare against, and honest intervals.

design.md §20: a simulator is only trusted once it reproduces theory where theory applies — Erlang C
for M/M/c — with independent replications, a warm-up cut and confidence intervals, "not one lucky
seed"; and Little's law (L = λW) is checked on every run. This module holds those tools. It knows
nothing of how a result was produced: the reference model and the real-Mediator engine feed it the
same `runs` / `queue` tables.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import pandas as pd  # type: ignore[import-untyped, unused-ignore]
from scipy import stats  # type: ignore[import-untyped, unused-ignore]

T = TypeVar("T")

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

    @property
    def half_width(self) -> float:
        """Half the interval's width (± this around a symmetric estimate)."""
        return (self.high - self.low) / 2

    def contains(self, x: float) -> bool:
        """Whether `x` lies within [low, high]."""
        return self.low <= x <= self.high

    def __str__(self) -> str:
        return (
            f"{self.estimate:.4g} [{self.low:.4g}, {self.high:.4g}] ({self.conf:.0%}, n={self.n})"
        )


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
    half = float(stats.t.ppf(0.5 + conf / 2, n - 1)) * float(x.std(ddof=1)) / math.sqrt(n)
    return Interval(m, m - half, m + half, n, conf)


def batch_means(x: npt.ArrayLike, n_batches: int = 20, conf: float = 0.95) -> Interval:
    """Mean of one long, autocorrelated series with a batch-means interval.

    The series is cut into `n_batches` contiguous batches whose means are nearly independent when
    batches are much longer than the correlation time; the t-interval is over the batch means.
    """
    a = np.asarray(x, dtype=float)
    size = a.size // n_batches
    if size < 1:
        raise ValueError("fewer samples than batches")
    means = a[: size * n_batches].reshape(n_batches, size).mean(axis=1)
    ci = mean_ci(means, conf)
    return Interval(float(a.mean()), ci.low, ci.high, n_batches, conf)


def quantile_ci(
    samples: npt.ArrayLike | Sequence[npt.ArrayLike], q: float, conf: float = 0.95
) -> Interval:
    """Interval for a quantile.

    Args:
        samples: either a list of per-replication sample arrays — then the q-quantile of each
            replication is one independent value and the interval is a t-interval over them (the
            honest choice for waits, which are correlated within a run) — or one 1-d array of
            i.i.d. values, for which the distribution-free order-statistic interval is used.
        q: the quantile, in (0, 1).
        conf: confidence level.

    Returns:
        The quantile estimate with its interval.
    """
    if not 0 < q < 1:
        raise ValueError("q must be in (0, 1)")
    if isinstance(samples, list | tuple) and samples and np.ndim(samples[0]) == 1:
        per_rep = [float(np.quantile(np.asarray(s, dtype=float), q)) for s in samples]
        ci = mean_ci(per_rep, conf)
        pooled = float(np.quantile(np.concatenate([np.asarray(s, float) for s in samples]), q))
        return Interval(pooled, ci.low, ci.high, len(per_rep), conf)
    x = np.sort(np.asarray(samples, dtype=float))
    n = x.size
    if n < 2:
        raise ValueError("need at least two samples")
    # Order statistics X_(j) ≤ ξ_q ≤ X_(k): the count below ξ_q is Binomial(n, q).
    lo = int(stats.binom.ppf((1 - conf) / 2, n, q))
    hi = int(stats.binom.ppf((1 + conf) / 2, n, q)) + 1
    lo, hi = max(lo, 1), min(hi, n)
    return Interval(float(np.quantile(x, q)), float(x[lo - 1]), float(x[hi - 1]), n, conf)


# ---------------------------------------------------------------------------------------------
# Replications and warm-up
# ---------------------------------------------------------------------------------------------


def replication_seeds(seed: int, n: int) -> list[int]:
    """`n` independent seeds derived from `seed` (SeedSequence), the same for the same inputs."""
    return [int(s) for s in np.random.SeedSequence(seed).generate_state(n)]


def replicate(
    scenario: Any,
    n: int,
    fn: Callable[[Any], T] | None = None,
    executor: Executor | None = None,
) -> list[T]:
    """Run `fn` on `n` copies of a scenario that differ only in their seed.

    Args:
        scenario: a `sim.scenarios.Scenario`.
        n: number of replications.
        fn: what to run on each copy; default `sim.model.run_model`. Must be picklable for a
            process pool.
        executor: any `concurrent.futures.Executor` (a process pool, a Dask client's executor);
            None runs them here, one after the other.

    Returns:
        One result per replication, in seed order.
    """
    if fn is None:
        from sim.model import run_model

        fn = run_model  # type: ignore[assignment]
    assert fn is not None
    copies = [replace(scenario, seed=s) for s in replication_seeds(scenario.seed, n)]
    if executor is None:
        return [fn(c) for c in copies]
    return list(executor.map(fn, copies))


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
