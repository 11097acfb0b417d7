"""Wake 9 in the simulator (issue 12 §2): the real Mediator in virtual time, on the scenario in
which a node gains, loses and regains a capability. The differential test (test_sim.py) runs
the same scenario against the reference model; this one states what must happen."""

from __future__ import annotations

import pytest

import sim
from sim import scenarios as S

pytestmark = pytest.mark.db


def test_a_capability_gained_by_an_idle_node_promotes_the_waiting_run_at_that_advert(cluster):
    """b waits for a scope (s000 busy until 1001); x000 advertises one at 100 → b starts at 100
    on x000 (wake 9). x000 drops it at 400; c (t=500) waits; x000 regains it at 700 → c starts
    at 700. Nothing is ever stuck: no interval in which a free live node could serve a queued
    run that did not move."""
    result = sim.run(S.capabilities(), database_url=cluster.url("postgres"), progress=False)
    runs = result.runs.set_index("run_id")
    assert runs.loc["r0000001", "started_at"] == pytest.approx(100.0)
    assert runs.loc["r0000002", "started_at"] == pytest.approx(700.0)
    assert result.promotions["nodes"].tolist() == ["s000", "x000", "x000"]
    assert result.stuck["duration_s"].sum() == 0.0
    assert result.violations == []
