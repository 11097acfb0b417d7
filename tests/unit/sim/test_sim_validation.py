"""The reference model against Erlang C (docs/design.md §20, issue 5 item 5).

Independent replications, a warm-up cut, and 99 % confidence intervals over replication means —
not one lucky seed. ρ = 0.9 is checked on the model (the real Mediator is checked at ρ ≤ 0.7 and
tied to the model by the differential test). Sizes keep this file at a few seconds; the model is
fast enough to run the same check with 10⁶ runs per point for the performance notes.
"""

from __future__ import annotations

from functools import partial

import pytest

from sim.analysis import erlang_c, littles_law, mean_ci, mmc_wq, warmup_cut
from sim.brokers.model import replicate, run_model
from sim.inputs import scenarios as S
from tests.untraced import traced_once

# scripts/test --fast leaves it out: long model runs against Erlang C
pytestmark = pytest.mark.slow

POINTS = [
    # (c, rho, runs per replication, replications)
    (3, 0.9, 20_000, 10),
    (1, 0.5, 5_000, 8),
    (8, 0.7, 8_000, 8),
]


@pytest.mark.parametrize(("c", "rho", "runs", "reps"), POINTS)
def test_steady_agrees_with_erlang_c(c: int, rho: float, runs: int, reps: int) -> None:
    mu = 0.1
    lam = rho * c * mu
    scenario = S.steady(nodes=c, arrival_rate=lam, service_rate=mu, runs=runs, seed=11)
    # the replications repeat the same code: traced once, the rest untraced (tests/untraced.py)
    results = replicate(scenario, reps, traced_once(partial(run_model, record_events=False)))
    waits = [warmup_cut(r.runs)["wait_s"].to_numpy() for r in results]
    wq = mean_ci([w.mean() for w in waits], conf=0.99)
    p_wait = mean_ci([(w > 0).mean() for w in waits], conf=0.99)
    assert wq.contains(mmc_wq(lam, mu, c)), (wq, mmc_wq(lam, mu, c))
    assert p_wait.contains(erlang_c(c, lam / mu)), (p_wait, erlang_c(c, lam / mu))
    # A loose sanity bound on top: the interval must be informative, not just wide.
    assert wq.half_width < 0.25 * mmc_wq(lam, mu, c)
    for r in results:  # Little's law on every run
        assert littles_law(r.runs, r.queue).rel_err < 1e-9
