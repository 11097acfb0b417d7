"""Scenarios as data: TOML round trips, overrides, hashes, validation (docs/design.md §20)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sim.brokers.model import run_model
from sim.inputs import scenarios as S
from sim.inputs.scenarios import SCENARIOS, FleetEvent, Scenario, Settings
from sim.inputs.workload import materialize

EXAMPLES = sorted((Path(S.__file__).parent / "scenarios").glob("*.toml"))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_builtin_round_trips_through_toml_and_dict(name: str) -> None:
    scenario = SCENARIOS[name]()
    assert Scenario.from_toml(scenario.to_toml()) == scenario
    assert Scenario.from_dict(scenario.to_dict()) == scenario
    assert Scenario.from_toml(scenario.to_toml()).scenario_hash() == scenario.scenario_hash()


def test_the_eight_scenarios_of_sim_md_section_5_ship() -> None:
    assert set(SCENARIOS) == {
        "steady", "mixed", "vanished_node", "drain", "restart", "burst", "asks", "trace",
        "capabilities",
    }  # fmt: skip


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_files_load_and_run(path: Path) -> None:
    scenario = Scenario.from_toml(path)
    if scenario.horizon_runs and scenario.horizon_runs > 500:
        scenario = dataclasses.replace(scenario, horizon_runs=500, warmup_runs=0)
    assert len(run_model(scenario, record_events=False).runs) > 0


def test_generated_examples_match_their_builtins() -> None:
    folder = Path(S.__file__).parent / "scenarios"
    assert Scenario.from_toml(folder / "steady.toml") == S.steady()
    assert Scenario.from_toml(folder / "vanished_node.toml") == S.vanished_node()


def test_overrides_by_dotted_path() -> None:
    base = S.steady()
    changed = base.with_overrides(
        {"settings.wake_on_return": False, "fleet.groups.0.count": 5, "seed": 3}
    )
    assert changed.settings.wake_on_return is False
    assert changed.fleet.groups[0].count == 5 and changed.seed == 3
    assert changed.scenario_hash() != base.scenario_hash()
    assert dataclasses.replace(base, seed=3).seed == 3  # frozen, but replace() works


def test_scenario_hash_is_stable() -> None:
    assert S.steady().scenario_hash() == S.steady().scenario_hash()
    assert S.steady(seed=1).scenario_hash() != S.steady().scenario_hash()
    assert len(S.steady().scenario_hash()) == 16


@pytest.mark.slow  # scripts/test --fast leaves it out
def test_heartbeats_stay_a_small_share_where_nothing_vanishes() -> None:
    """design.md §20: coarse adverts by default, fine ones only where vanishing is the subject."""
    for name in ("steady", "mixed", "burst", "asks", "restart"):
        result = run_model(SCENARIOS[name](), record_events=False)
        assert result.advert_share() < 0.05, name
    result = run_model(S.trace(runs=3000), record_events=False)
    assert result.advert_share() < 0.05


def test_node_ids_sort_in_numeric_order() -> None:
    group = S.NodeGroup(1200, {"pool": "lab"})
    ids = group.node_ids()
    assert ids[:2] == ["n0000", "n0001"] and ids == sorted(ids)


def test_validation_names_the_problem() -> None:
    with pytest.raises(ValueError, match="advert_interval_s"):
        dataclasses.replace(S.steady(), settings=Settings(advert_ttl_seconds=30.0))
    with pytest.raises(ValueError, match="unknown node"):
        fleet = dataclasses.replace(S.steady().fleet, events=(FleetEvent(1.0, "nope", "vanish"),))
        dataclasses.replace(S.steady(), fleet=fleet)
    with pytest.raises(ValueError, match="kind"):
        FleetEvent(1.0, "n000", "explode")
    with pytest.raises(ValueError, match="horizon"):
        dataclasses.replace(S.steady(), horizon_runs=None)


def test_trace_defaults_to_the_shipped_file() -> None:
    plan = materialize(S.trace(runs=10))
    assert len(plan.arrivals) == 10 and plan.arrivals[1].at_s == 1460.0


def test_command_line_sets_are_read_as_toml_values() -> None:
    """`python -m sim run SCENARIO --set key=value` (docs/design.md §20)."""
    assert S.parse_set("settings.max_width=2") == ("settings.max_width", 2)
    assert S.parse_set("settings.wake_on_return = false") == ("settings.wake_on_return", False)
    assert S.parse_set("description=a quiet fleet") == ("description", "a quiet fleet")
    changed = S.steady().with_sets(["fleet.groups.0.count=5", "workload.arrivals.rate=0.25"])
    assert changed.fleet.groups[0].count == 5
    assert changed.workload.arrivals == S.Poisson(0.25)
    with pytest.raises(ValueError, match="key=value"):
        S.parse_set("no equals sign")


# -- issue 14 §3: say what you mean, get told when it is wrong ------------------------------------


def test_steady_takes_a_service_distribution_and_describes_it() -> None:
    lognormal = S.steady(service="lognormal", cv=2.0)
    duration = lognormal.workload.templates[0].steps[0].duration
    assert isinstance(duration, S.Lognormal) and duration.cv == pytest.approx(2.0)
    assert duration.mean == pytest.approx(10.0)
    assert lognormal.description == "M/G/3 (lognormal, cv 2): lambda=0.2/s, mu=0.1/s"
    assert S.steady(service="constant").description.startswith("M/D/3")
    with pytest.raises(ValueError, match="cv 2 does not fit service 'exponential'"):
        S.steady(cv=2)


def test_the_default_run_count_fits_the_load() -> None:
    """issue 14 §2: one run long enough for its intervals (about 60 relaxation times)."""
    assert S.steady().horizon_runs == 10_000
    assert S.steady(arrival_rate=0.27).horizon_runs == 21_000  # rho = 0.9


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: S.steady(arrival_rate=-0.2), "arrival_rate -0.2 must be > 0"),
        (lambda: S.steady(nodes=0), "nodes 0 must be a whole number >= 1"),
        (lambda: S.steady().with_overrides({"workload.arrivals.rate": -1}),
         "arrival rate -1 must be > 0"),
        (lambda: S.steady().with_overrides({"fleet.groups.0.count": 0}),
         "count 0 must be a whole number >= 1"),
        (lambda: S.steady().with_overrides({"settings.wake_on_retrn": False}),
         "unknown setting 'settings.wake_on_retrn'; did you mean 'settings.wake_on_return'?"),
        (lambda: S.steady(runs=100, warmup_runs=100), "warmup_runs \\(100\\) must be below"),
    ],
)  # fmt: skip
def test_a_wrong_scenario_is_one_line_at_construction(make, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(S.ScenarioError, match=message) as err:
        make()
    assert "\n" not in str(err.value)


def test_derived_fields_follow_their_inputs() -> None:
    """Changing the runs keeps the warm-up at 10 %; the description follows the service."""
    changed = S.steady().with_overrides({"horizon_runs": 1000})
    assert changed.warmup_runs == 100
    short = S.steady().with_sets(["runs=2000", "arrival_rate=0.25"])
    assert (short.horizon_runs, short.warmup_runs) == (2000, 200)
    assert short.description == "M/M/3: lambda=0.25/s, mu=0.1/s"
    const = S.steady().with_overrides(
        {"workload.templates.0.steps.0.duration": {"dist": "constant", "value": 10.0}}
    )
    assert const.description == "M/D/3: lambda=0.2/s, mu=0.1/s"
    mine = dataclasses.replace(S.steady(), description="my study")
    assert mine.with_overrides({"runs": 500}).description == "my study"


def test_the_cli_takes_the_python_names_and_says_what_is_wrong_in_one_line(capsys) -> None:
    from sim.outputs.cli import main

    assert main(["run", "steady", "--engine", "model", "--set", "runs=300",
                 "--set", "arrival_rate=0.1", "--set", "service=\"constant\""]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "300 runs" in out and "wait_p95_ci" in out and "batch quantiles, 5 batches" in out
    assert main(["run", "steady", "--engine", "model", "--set", "settings.max_widht=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "python -m sim run: error: unknown setting 'settings.max_widht'; "
        "did you mean 'settings.max_width'?"
    )


def test_show_prints_every_key_with_its_value_and_meaning(capsys) -> None:
    from sim.outputs.cli import main

    assert main(["show", "steady", "--set", "runs=500"]) == 0
    out = capsys.readouterr().out
    for path, _value, _ in S.explain(S.steady(runs=500)):
        assert path in out
    assert "horizon_runs" in out and "500" in out
    assert "wake the queue when a vanished node returns (wake 7)" in out
    assert all(meaning for _, _, meaning in S.explain(S.mixed()))


def test_the_parser_refuses_abbreviations_and_shows_defaults(capsys) -> None:
    """issue 15 §2: `--rep 3` must not silently mean `--replications 3`."""
    from sim.outputs.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["plan", "steady", "--sizes", "3", "--wait", "1", "--rep", "3"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["plan", "--help"])
    text = capsys.readouterr().out
    assert "(default: 0.95)" in text and "--confirm-runs" in text
