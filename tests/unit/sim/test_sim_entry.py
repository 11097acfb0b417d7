"""One way in (issue 26): `sim.run(scenario, broker=...)` for every broker, one `Result` type.

The model used to be run by `sim.run_model` (module `sim/model.py`) and the real Mediator by
`sim.run` (module `sim/result.py`), each with its own result class, and `sim.plan` chose between
them with a string of its own. Now every caller goes through `sim.brokers.entry.run`.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

import sim
from sim.brokers.entry import BROKERS
from sim.inputs import scenarios as S
from sim.platform.measure import ModelResult, Result, SimResult


def _same_tables(a: Result, b: Result) -> None:
    for name in ("runs", "promotions", "queue", "stuck", "leases", "events"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
    assert a.counts == b.counts and a.end_s == b.end_s


def test_the_model_through_the_one_entry_is_the_model():
    plan = sim.materialize(S.steady(runs=200, seed=3))
    via_entry = sim.run(plan, "model")
    _same_tables(via_entry, sim.run_model(plan))  # the old name, kept for one release
    assert type(via_entry) is sim.Result


def test_one_result_type_for_every_broker():
    """The model's result and the real Mediator's are the same class (the old names are aliases),
    so charts, `save`, `decisions` and the gate's reading need no second code path."""
    assert ModelResult is Result and SimResult is Result and sim.Result is Result
    result = sim.run(S.vanished_node(False), broker="model")
    assert result.violations == [] and result.scenario is not None
    assert result.mmc_params() is None  # not M/M/c
    assert sim.run(S.steady(runs=50), "model").mmc_params() == (0.2, 0.1, 3)


def test_a_callable_broker_simulates_the_materialized_plan():
    seen = []

    def simulator(plan: sim.Plan) -> Result:
        seen.append(plan)
        return sim.run_model(plan, record_events=False)

    result = sim.run(S.steady(runs=30, seed=1), simulator)
    assert isinstance(seen[0], sim.Plan) and len(result.runs) == 30
    lean = functools.partial(sim.run_model, record_events=False)
    assert len(sim.run(S.steady(runs=30, seed=1), lean).runs) == 30


def test_an_unknown_broker_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"broker 'simpy' not in \('mediator', 'model'\)"):
        sim.run(S.steady(runs=10), "simpy")
    assert BROKERS == ("mediator", "model")


def test_the_plan_takes_the_broker_by_the_same_name():
    """`sim.plan(..., broker=...)`, as `sim.run` takes it; `engine=` is the old name."""
    sc = S.steady(runs=120, seed=2)
    target = {"quantile": 0.95, "wait_s": 60}
    with ThreadPoolExecutor(1) as here:
        kw = {"replications": 2, "executor": here, "confirm_replications": 0, "progress": False}
        new = sim.plan(sc, target, [3, 4], broker="model", **kw)
        old = sim.plan(sc, target, [3, 4], engine="model", **kw)
        with pytest.raises(ValueError, match="broker 'simpy' not in"):
            sim.plan(sc, target, [3], broker="simpy", **kw)
    columns = [c for c in new.grid.columns if not c.startswith("wall")]  # (wall clock varies)
    pd.testing.assert_frame_equal(new.grid[columns], old.grid[columns])
