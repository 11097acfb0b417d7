"""The report's formatting for people and its generic reading of intervals (issue 15 §6)."""

from __future__ import annotations

import html
import math

import pytest

from sim.analysis import Interval
from sim.outputs.report import confirmation_text, duration, interval, share


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0 s"),
        (0.423, "0.42 s"),
        (12.34, "12.3 s"),
        (400.0, "6.67 min"),
        (11_600.0, "3.22 h"),
        (379_591.9, "4.39 days"),
        (math.nan, "–"),
        (None, "–"),
    ],
)
def test_durations_read_like_a_person_would_say_them(seconds, text):
    """No 1.16e+04: seconds become s, min, h or days with three significant figures at most."""
    assert duration(seconds) == text


def test_an_interval_shares_the_estimates_unit_and_never_goes_below_zero():
    """The estimate keeps its own unit, the upper bound takes a larger one only when it needs it;
    a wait is never negative, so a symmetric interval around a small mean is shown from 0."""
    assert duration(6.0, -3.7, 15.7) == "6 s [0–15.7]"
    assert duration(270.0, 200.0, 350.0) == "4.5 min [3.33–5.83]"
    assert duration(17.1, 0.0, 333.6) == "17.1 s [0 s–5.56 min]"


def test_shares_are_percentages():
    assert share(0.667) == "67 %"
    assert share(0.003) == "0.3 %"
    assert share(0.0) == "0 %"
    assert share(None) == "–"


def test_intervals_are_read_from_objects_and_from_json():
    """summary() holds Interval objects; summary.json holds their dict form. Both read alike."""
    live = {"wait_p95_ci": Interval(21.0, 18.0, 25.0, 20, 0.95)}
    saved = {"wait_p95_ci": {"estimate": 21.0, "low": 18.0, "high": 25.0, "n": 20, "conf": 0.95}}
    for summary in (live, saved):
        ci = interval(summary, "wait_p95")
        assert ci is not None and (ci.low, ci.high, ci.conf) == (18.0, 25.0, 0.95)
        assert ci.method is None
    assert interval(live, "wait_mean") is None


def test_the_interval_method_is_taken_from_the_interval_or_the_summary():
    """A summary that says how its intervals were made gets them labelled with that method."""
    own = {"wait_mean_ci": {"estimate": 4.4, "low": 4.0, "high": 4.9, "method": "batch means"}}
    assert interval(own, "wait_mean").method == "batch means"  # type: ignore[union-attr]
    shared = {"wait_mean_ci": {"low": 4.0, "high": 4.9}, "interval_method": "replications"}
    ci = interval(shared, "wait_mean")
    assert ci is not None and ci.method == "replications" and math.isnan(ci.estimate)


# ---- the front page's confirmation line (issue 28 §2) and its plain words (issue 29 §9) --------


def _capacity_with_confirmation(bump_s: float, job: int, jobs: int | None = None):  # type: ignore[no-untyped-def]
    """A Capacity whose plan's confirmation was "run" here: the model's waits for sizes 3–5 from
    independent `sim.run` calls, and the "real Mediator's" the same with `bump_s` added to one
    job at 4 nodes. Returns it and the brute-force reference difference."""
    import dataclasses
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import pandas as pd

    import sim
    from sim.inputs import scenarios as S
    from sim.outputs.report import Capacity
    from sim.studies.plan import Replication, sized

    wl = S.steady(runs=600, seed=5)
    with ThreadPoolExecutor(2) as threads:
        p = sim.plan(wl, {"quantile": 0.95, "wait_s": 10.0}, [3, 4, 5], replications=1,
                     executor=threads, confirm_replications=0)  # fmt: skip
    reps, reference = [], 0.0
    for s in (3, 4, 5):
        r = sim.run(sized(wl, s), "model")
        model = r.runs.loc[~r.runs["warmup"], "wait_s"].to_numpy(dtype=float)
        med = model.copy()
        if s == 4:
            med[job] += bump_s
        reference = max(reference, float(np.max(np.abs(med - model))))
        reps += [Replication(s, 0, 5, "mediator", med, 0, 0.5, 0.0, stage="confirm"),
                 Replication(s, 0, 5, "model", model, 0, 0.5, 0.0, stage="confirm")]  # fmt: skip
    p = dataclasses.replace(p, replications=[*p.replications, *reps])
    growth = pd.DataFrame([{"growth": 1.0, "offered": 2.0, "nodes": 4, "p95_s": 5.0,
                            "utilization": 0.5}])  # fmt: skip
    return Capacity(p, growth, jobs or 540, 1.0, 2.0, 3.5), reference


@pytest.mark.parametrize(("bump_s", "job"), [(0.0, 0), (250.0, 17), (3.25, 400)])
def test_the_front_page_gives_the_largest_per_job_difference_of_both_runs(bump_s, job):
    """The answer's second line: every job covered, and the largest |Mediator − model| wait
    over both simulations of every confirmed size — the brute-force reference, whatever it is."""
    from sim.outputs import report

    cap, reference = _capacity_with_confirmation(bump_s, job)
    assert reference == bump_s
    line = report.confirmation_text(cap)
    assert line.startswith("Confirmed on the real Mediator and PostgreSQL: all 540 jobs replayed "
                           "at 3, 4 and 5 nodes; ")  # fmt: skip
    assert f"and on the reference model is {duration(reference)}" in line
    if reference:
        assert f"(job {job + 1:,} at 4 nodes)" in line
    page = "".join(report._answer(cap))
    assert f"<p id='confirmed'>{html.escape(line, quote=True)}</p>" in page
    # It is the first thing after the headline.
    assert page.index("id='headline'") < page.index("id='confirmed'") < page.index("class='facts'")


def test_the_front_page_says_when_fewer_jobs_than_the_workload_were_confirmed():
    cap, _ = _capacity_with_confirmation(0.0, 0, jobs=18_239)
    assert "the first 540 of the 18,239 jobs replayed" in confirmation_text(cap)


def test_the_growth_table_says_why_its_waits_jump(monkeypatch):
    """issue 29 §9: each row is the smallest fleet meeting the target, and bursts size it."""
    from sim.outputs import report

    cap, _ = _capacity_with_confirmation(0.0, 0)
    table = "".join(report._growth_table(cap))
    note = report.growth_note(cap)
    assert f"id='growth-why'>{html.escape(note, quote=True)}" in table
    assert "Bursts size the fleet, not the average" in note
    assert "the busiest day keeps 3.5 nodes busy" in note


def test_two_nasa_figures_on_one_page_are_explained():
    """issue 29 §9: the scenario row replays the first jobs, the capacity plan all of them."""
    from sim.inputs import scenarios as S
    from sim.outputs import report

    cap, _ = _capacity_with_confirmation(0.0, 0, jobs=18_239)
    cap.days = 92.0
    note = "".join(report._nasa_note(cap, S.trace(runs=3000), {"end_s": 1_900_000.0}))
    assert "Two figures for the NASA jobs on 4 nodes" in note
    assert "only the first 3,000 jobs (about 22 days of the log)" in note
    assert "all 18,239 jobs over 92 days" in note
