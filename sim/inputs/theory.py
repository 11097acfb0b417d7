"""What queueing theory says about a scenario: its M/M/c parameters when it is one.

Why here and not beside the charts: the capacity plan, the report and the charts all put the
Erlang C figures (`sim.analysis`) next to simulated ones, and which scenarios are M/M/c is a
question about the scenario, not about drawing; the charts take the parameters from the result
(`Result.mmc_params`) and import no part of the simulator.
"""

from __future__ import annotations

from sim.inputs.scenarios import Exponential, Poisson, Scenario


def mmc_params(scenario: Scenario | None) -> tuple[float, float, int] | None:
    """(λ, μ, c) when the scenario is M/M/c: Poisson arrivals, one template with one exec step of
    exponential duration, no failures, identical nodes; else None."""
    if scenario is None:
        return None
    wl = scenario.workload
    groups = scenario.fleet.groups
    if not isinstance(wl.arrivals, Poisson) or len(wl.templates) != 1 or len(groups) != 1:
        return None
    steps = wl.templates[0].steps
    if len(steps) != 1 or steps[0].kind != "exec" or not isinstance(steps[0].duration, Exponential):
        return None
    if steps[0].fail_p or steps[0].retry_p or scenario.fleet.events:
        return None
    return wl.arrivals.rate, 1.0 / steps[0].duration.mean, groups[0].count
