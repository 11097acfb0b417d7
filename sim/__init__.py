"""The fleet simulator: scenarios, pre-sampled workloads, one fleet loop, brokers plugged into it.

`sim` explores queueing behaviour of the Mediator in virtual time (design.md §20). It is built in
layers, each a folder that imports only from its own layer or below (docs/architecture.md; a
boundary test checks):

0. ground — `sim.analysis` (Erlang C, confidence intervals, Little's law), `sim.plots` (charts),
   `sim.parallel` (the one local process pool), `sim.affinity` (CPU claims);
1. `sim.inputs` — what to simulate: `scenarios` (schema, text forms, the built-in catalog),
   `workload` (`materialize(scenario)`: the fully pre-sampled plan every broker consumes),
   `traces` (SWF/CSV readers, the FIFO multi-server recursion), `theory` (M/M/c parameters);
2. `sim.platform` — `core` (virtual time, the event queue and its loop, the same-instant order),
   `fleet` and `driver` (the node daemons and the one loop that drives a broker through the
   `Broker` protocol: the daemons' calls and the loop's questions), `measure` (the one `Result`
   type and the differential comparison);
3. `sim.brokers` — `model` (the in-memory reference policy, no `mediator` import), `mediator`
   (the real Mediator on PostgreSQL), `readback` (its tables, read from the database), `twin`
   (a lab's own Mediator database exported as tables: `sim.twin.export`; `sim.twin.load` makes
   the export a scenario, from `sim.inputs.twin`), and `entry.run`: the one way in;
4. `sim.studies` — capacity plans (`plan`), per capability class (`classplan`);
5. `sim.outputs` — the report, the scheduling-decision gate, a twin's replay and audit, notebook
   plumbing, the pytest plugin, the command line (`python -m sim`).

`sim.run(scenario, broker="mediator" | "model")` returns a `Result` either way; `sim.run_model`
is the model's entry under its old name, kept for one release (use `sim.run(..., "model")`).
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
from sim.brokers import twin  # the lab's own twin: sim.twin.export(...)
from sim.brokers.entry import run
from sim.brokers.model import replicate, run_model
from sim.inputs import scenarios  # the built-in catalog: sim.scenarios.steady(...)
from sim.inputs.scenarios import SCENARIOS, Scenario
from sim.inputs.theory import mmc_params
from sim.inputs.traces import fifo_waits, read_csv_trace, read_swf
from sim.inputs.workload import Answer, Arrival, Attempt, Plan, materialize
from sim.platform.core import EventQueue, to_us
from sim.platform.driver import Broker, DaemonCalls, Oracle
from sim.platform.measure import ModelResult, Result, SimResult, promotions_diff
from sim.studies.plan import CapacityPlan, plan

__all__ = [
    "SCENARIOS",
    "Answer",
    "Arrival",
    "Attempt",
    "Broker",
    "CapacityPlan",
    "DaemonCalls",
    "EventQueue",
    "ModelResult",
    "Oracle",
    "Plan",
    "Result",
    "Scenario",
    "SimResult",
    "erlang_c",
    "fifo_waits",
    "littles_law",
    "materialize",
    "mean_ci",
    "mmc_p_wait_gt",
    "mmc_params",
    "mmc_wait_quantile",
    "mmc_wq",
    "plan",
    "promotions_diff",
    "quantile_ci",
    "read_csv_trace",
    "read_swf",
    "replicate",
    "run",
    "run_model",
    "scenarios",
    "to_us",
    "twin",
]
