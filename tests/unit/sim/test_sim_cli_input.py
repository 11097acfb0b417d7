"""``python -m sim`` on input a new user gives it (issue 29 §8): a setting of the wrong kind is
one line naming it, not a traceback; an overloaded scenario says that its queue never drains."""

from __future__ import annotations

import pytest

from sim import scenarios as S
from sim.outputs import cli


@pytest.mark.parametrize(
    ("assignment", "said"),
    [
        ("settings.wake_on_return=maybe", "settings.wake_on_return is true or false, not 'maybe'"),
        ("wake_on_return=1", "settings.wake_on_return is true or false, not 1"),
        ("settings.max_width=wide", "settings.max_width is a number, not 'wide'"),
        ("lease_ttl_seconds=true", "settings.lease_ttl_seconds is a number, not True"),
    ],
)
def test_a_setting_of_the_wrong_kind_is_one_line_naming_it(assignment, said, capsys):
    assert cli.main(["show", "steady", "--set", assignment]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"python -m sim show: error: {said}"]


def test_settings_of_the_right_kind_still_pass():
    sc = S.steady().with_overrides({"settings.wake_on_return": False, "max_width": 2})
    assert sc.settings.wake_on_return is False and sc.settings.max_width == 2


def test_the_offered_load_is_lambda_times_the_mean_service_over_the_nodes():
    """M/M/3 at λ = 0.2, μ = 0.1 (design.md §20): ρ = 0.2 × 10 / 3 = 2/3."""
    assert cli.offered_load(S.steady()) == pytest.approx(2 / 3)
    assert cli.offered_load(S.steady(arrival_rate=0.3)) == pytest.approx(1.0)
    assert cli.offered_load(S.mixed()) is None  # several kinds of node: no single ρ to state


@pytest.mark.parametrize(("rate", "warned"), [(0.2, False), (0.3, True), (0.45, True)])
def test_an_overloaded_scenario_warns_that_the_queue_never_drains(rate, warned, capsys):
    """ρ ≥ 1 used to show only "run too short for its load", which reads as "run longer";
    no length helps a queue that grows without bound."""
    assert cli.main(["show", "steady", "--set", f"arrival_rate={rate}"]) == 0
    err = capsys.readouterr().err
    assert ("offered load ≥ 1: the queue never drains" in err) is warned


def test_run_warns_before_it_simulates(capsys):
    code = cli.main(["run", "steady", "--engine", "model", "--set", "arrival_rate=0.4",
                     "--set", "runs=50"])  # fmt: skip
    assert code == 0
    assert "warning: offered load ≥ 1: the queue never drains (ρ = 1.33)" in capsys.readouterr().err


def _subparsers(parser):  # type: ignore[no-untyped-def]
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_every_option_says_its_default_once():
    """issue 29: `run --help` said "(default: an embedded one) (default: None)"."""
    for name, sub in _subparsers(cli.build_parser()):
        formatter = sub._get_formatter()
        for action in sub._actions:
            said = formatter._get_help_string(action) or ""
            assert said.count("(default:") <= 1, (name, action.option_strings, said)


def test_numpy_scalars_are_settings_of_their_kind():
    """A notebook may compute a setting: numpy's integers, floats and booleans are accepted."""
    import numpy as np

    sc = S.steady().with_overrides(
        {
            "max_width": np.int64(2),
            "lease_ttl_seconds": np.float64(9000.0),
            "wake_on_return": np.bool_(False),
        }
    )
    assert (sc.settings.max_width, sc.settings.lease_ttl_seconds) == (2, 9000.0)
    assert not sc.settings.wake_on_return
