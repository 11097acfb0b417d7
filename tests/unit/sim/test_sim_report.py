"""The report's formatting for people and its generic reading of intervals (issue 15 §6)."""

from __future__ import annotations

import math

import pytest

from sim.analysis import Interval
from sim.outputs.report import duration, interval, share


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
