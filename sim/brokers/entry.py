"""One way in: `sim.run(scenario, broker=...)` → one `Result`, whichever broker schedules.

Why one entry: the platform (`sim.platform`) is one fleet loop with brokers plugged in; which
broker answers is an argument, not a choice between two functions in two modules that callers
pick with a string of their own. Every caller — the command line, capacity plans, the report,
the gate, notebooks — comes through here.

Brokers:

- ``"mediator"`` — the real Mediator against a fresh PostgreSQL database in virtual time
  (`sim.brokers.mediator`, read back by `sim.brokers.readback`). Its modules are imported on
  first use: the model, the scenarios and the statistics stay usable, and fast to import,
  without the database stack.
- ``"model"`` — the in-memory reference model of the policy (`sim.brokers.model`).
- a callable ``plan -> Result`` — any other simulator of a `Plan`, e.g.
  ``functools.partial(run_model, exhaustive_stuck=True)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from sim.brokers.model import run_model
from sim.inputs.scenarios import Scenario
from sim.inputs.workload import Plan, materialize
from sim.platform.measure import Result

BROKERS = ("mediator", "model")
BrokerChoice: TypeAlias = str | Callable[[Plan], Result]  # "mediator", "model" or a simulator


def run(
    scenario: Scenario | Plan,
    broker: BrokerChoice = "mediator",
    *,
    database_url: str | None = None,
    progress: bool | Callable[[int], None] = True,
    template: str | None = None,
    drop: bool = False,
    record_events: bool = True,
    exhaustive_stuck: bool = False,
    until: Callable[[list[tuple[int, str, str, str]], int], bool] | None = None,
) -> Result:
    """Simulate ``scenario`` with ``broker`` scheduling; the one entry of the simulator.

    Args:
        scenario: a ``Scenario`` (materialized with its seed) or a ready ``Plan``.
        broker: ``"mediator"`` (the real Mediator), ``"model"`` (the reference model) or a
            callable simulating a ``Plan`` (see the module docstring).
        database_url: (mediator) a PostgreSQL server to create the run's database on (its user
            may create databases); ``None`` starts an embedded cluster once per process.
        progress: (mediator) a progress bar (tqdm; the notebook flavour inside Jupyter), or a
            callback called every few thousand events with the runs submitted so far.
        template: (mediator) create the run's database as a copy of this schema-loaded database
            on the same server (``database_url``), instead of an empty one.
        drop: (mediator) drop the run's database once the result is read (a sweep on a shared
            server).
        record_events: (model) keep the ``events`` table; off for the fastest sweeps.
        exhaustive_stuck: (model) re-check stuck runs after every event (slow; for tests).
        until: (mediator) called every few hundred events with the decisions made since its
            last call — ``(at µs, run_id, how, roles)``, in the order of ``decisions()`` — and
            the virtual instant in µs; a true answer stops the run there, and the result covers
            the run so far (its ``manifest`` says ``stopped_at_s``). ``sim coverage`` stops a
            planted run at its first divergence with it.

    Returns:
        The ``Result``; a real Mediator's ``violations`` must be empty.
    """
    if until is not None and broker != "mediator":
        raise ValueError("until is the real Mediator's (broker='mediator')")
    if broker == "model":
        return run_model(scenario, record_events=record_events, exhaustive_stuck=exhaustive_stuck)
    if broker == "mediator":
        # the database stack, imported on first use (see the module docstring)
        from sim.brokers.readback import run_mediator

        return run_mediator(
            scenario, database_url, progress, template=template, drop=drop, until=until
        )
    if callable(broker):
        plan = scenario if isinstance(scenario, Plan) else materialize(scenario)
        return broker(plan)
    raise ValueError(f"broker {broker!r} not in {BROKERS} nor a callable")
