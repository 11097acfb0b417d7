"""Scenarios as data: TOML round trips, overrides, hashes, validation (sim.md §3)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sim import scenarios as S
from sim.model import run_model
from sim.scenarios import SCENARIOS, FleetEvent, Scenario, Settings
from sim.workload import materialize

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


def test_heartbeats_stay_a_small_share_where_nothing_vanishes() -> None:
    """sim.md §2: coarse adverts by default, fine ones only where vanishing is the subject."""
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
        dataclasses.replace(S.steady(), settings=Settings(advert_ttl_s=30.0))
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
    """`python -m sim run SCENARIO --set key=value` (sim.md §10)."""
    assert S.parse_set("settings.max_width=2") == ("settings.max_width", 2)
    assert S.parse_set("settings.wake_on_return = false") == ("settings.wake_on_return", False)
    assert S.parse_set("description=a quiet fleet") == ("description", "a quiet fleet")
    changed = S.steady().with_sets(["fleet.groups.0.count=5", "workload.arrivals.rate=0.25"])
    assert changed.fleet.groups[0].count == 5
    assert changed.workload.arrivals == S.Poisson(0.25)
    with pytest.raises(ValueError, match="key=value"):
        S.parse_set("no equals sign")
