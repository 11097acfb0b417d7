"""The fleet simulator: scenarios, pre-sampled workloads, traces, statistics, the reference model.

`sim` explores queueing behaviour of the Mediator in virtual time (design.md §20). This package's
database-free foundation:

- `sim.scenarios` — what to simulate (fleet + workload + settings), the built-in scenarios;
- `sim.workload` — `materialize(scenario)`: the fully pre-sampled plan every engine consumes;
- `sim.model` — the in-memory reference model of the scheduling policy (no `mediator` import);
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
    replicate,
)
from sim.model import EventQueue, ModelResult, promotions_diff, run_model, to_us
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
