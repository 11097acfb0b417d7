"""The fleet simulator: scenarios, pre-sampled workloads, traces, statistics, the reference model.

`sim` explores queueing behaviour of the Mediator in virtual time (design.md §20). This package's
database-free foundation:

- `sim.scenarios` — what to simulate (fleet + workload + settings), the built-in scenarios;
- `sim.workload` — `materialize(scenario)`: the fully pre-sampled plan every engine consumes;
- `sim.core` — virtual time, the event heap, the same-instant order;
- `sim.fleet` / `sim.driver` — the node daemons and the one loop that drives a broker;
- `sim.model` — the in-memory reference model of the scheduling policy, a broker (no `mediator`
  import); `sim.engine` is the other broker, the real Mediator;
- `sim.measure` — the result tables (`ModelResult`) and the differential comparison;
- `sim.traces` — SWF/CSV trace readers and the FIFO multi-server recursion;
- `sim.analysis` — Erlang C, confidence intervals, replications, Little's law;
- `sim.plan(...)` — capacity planning over fleet sizes (`CapacityPlan`, module `sim/plan.py`).
"""

from __future__ import annotations

from sim.analysis import (
    erlang_c,
    littles_law,
    mean_ci,
    mmc_p_wait_gt,
    mmc_wait_quantile,
    mmc_wq,
    quantile_ci,
)
from sim.core import EventQueue, to_us
from sim.measure import ModelResult, promotions_diff
from sim.model import replicate, run_model
from sim.plan import CapacityPlan, plan  # the function shadows its module sim/plan.py, on purpose
from sim.scenarios import SCENARIOS, Scenario
from sim.traces import fifo_waits, read_csv_trace, read_swf
from sim.workload import Answer, Arrival, Attempt, Plan, materialize


def __getattr__(name: str) -> object:
    # The real-Mediator engine is imported on first use: the model, scenarios and analysis stay
    # usable (and fast to import) without the database stack.
    if name in ("run", "SimResult"):
        from sim import result

        return getattr(result, name)
    raise AttributeError(f"module 'sim' has no attribute {name!r}")


__all__ = [
    "SCENARIOS",
    "Answer",
    "Arrival",
    "Attempt",
    "CapacityPlan",
    "EventQueue",
    "ModelResult",
    "Plan",
    "Scenario",
    "erlang_c",
    "fifo_waits",
    "littles_law",
    "materialize",
    "mean_ci",
    "mmc_p_wait_gt",
    "mmc_wait_quantile",
    "mmc_wq",
    "plan",
    "promotions_diff",
    "quantile_ci",
    "read_csv_trace",
    "read_swf",
    "replicate",
    "run_model",
    "to_us",
]
