"""Charts that show the window (issue 14 §6): the vanished-node churn with wake 7 off (runs stuck
behind a returned node) and on (none) must not look identical; thousands of leases become a
utilisation strip; counts tick at integers; long axes read in hours or days."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest

from sim import plots
from sim.brokers.model import run_model
from sim.inputs import scenarios as S


def labels(ax: Any) -> list[str]:
    return ax.get_legend_handles_labels()[1]


@pytest.fixture(scope="module")
def churn() -> dict[str, Any]:
    return {k: run_model(S.vanished_node(w, churn=True, runs=300, seed=1))
            for k, w in (("off", False), ("on", True))}  # fmt: skip


def test_stuck_intervals_and_dark_periods_are_shaded(churn: dict[str, Any]) -> None:
    off, on = churn["off"], churn["on"]
    assert off.stuck["duration_s"].sum() > 0 and on.stuck["duration_s"].sum() == 0
    for draw in (plots.queue, plots.gantt):
        fig, (a, b) = plt.subplots(2, 1)
        draw(off, a)
        draw(on, b)
        assert "a queued run stuck" in labels(a) and "a queued run stuck" not in labels(b)
        assert "node dark" in labels(a) and "node dark" in labels(b)
        plt.close(fig)
    windows = plots.fleet_windows(off)
    assert set(windows["kind"]) == {"dark"} and (windows["end_s"] > windows["start_s"]).all()


def test_the_scripted_window_reads_from_the_scenario_when_there_is_no_event_log() -> None:
    sc = S.vanished_node(False)
    result = run_model(sc, record_events=False)
    result.scenario = sc  # as a SimResult carries it
    w = plots.fleet_windows(result)
    assert list(w.itertuples(index=False, name=None)) == [("x000", "dark", 100.0, 300.0)]


def test_many_leases_become_a_utilisation_strip_and_counts_tick_at_integers() -> None:
    result = run_model(S.steady(runs=2000))
    assert len(result.leases) > plots.STRIP_ABOVE
    fig, (a, b) = plt.subplots(2, 1)
    plots.gantt(result, a)
    assert len(a.images) == 1 and a.get_title().startswith("Utilisation per node")
    plots.queue(result, b)
    ticks = [t for t in b.get_yticks() if b.get_ylim()[0] <= t <= b.get_ylim()[1]]
    assert all(float(t).is_integer() for t in ticks)
    assert b.get_xlabel() == "virtual time (min)"  # 2,000 runs at 0.2/s: under 3 h
    plt.close(fig)


def test_long_axes_read_in_days() -> None:
    result = run_model(S.trace(runs=3000))  # 17 days of the NASA log
    fig, ax = plt.subplots()
    plots.gantt(result, ax)
    assert ax.get_xlabel() == "virtual time (days)"
    assert np.isclose(ax.get_xlim()[1], result.end_s / 86400)
    plt.close(fig)
    assert plots.time_unit(100.0) == (1.0, "s") and plots.time_unit(7200.0) == (60.0, "min")
