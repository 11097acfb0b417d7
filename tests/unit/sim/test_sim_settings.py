"""A scenario's settings are the Mediator's own (docs/design.md §20, §16): one set of names with
``mediator.Config``, its defaults, its ranges and its one-line message; the claim latency is the
fleet's. The names of the earlier release are read for one release, each with one warning line
naming the new one."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mediator import Config, ConfigError
from mediator.config import RANGES
from sim.brokers.model import run_model
from sim.inputs import scenarios as S
from sim.inputs.scenarios import (
    RENAMED,
    RENAMED_SHORT,
    Fleet,
    RenamedSetting,
    Scenario,
    ScenarioError,
    Settings,
)
from sim.inputs.workload import materialize
from sim.outputs import cli, gate

ROOT = Path(__file__).resolve().parents[3]
CONFIG_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
SETTINGS_FIELDS = [f.name for f in dataclasses.fields(Settings)]
#: Fields of a scenario that describe the fleet, not the Mediator: none of them is in Settings.
FLEET_ONLY = ("claim_latency_s", "advert_interval_s")


def server_message(**values: Any) -> str:
    """What ``mediator serve`` says of these values (its one check, ``Config.validate``)."""
    with pytest.raises(ConfigError) as caught:
        Config(**values)
    return caught.value.message


# ---- one set of names, defaults and ranges ---------------------------------------------------


@pytest.mark.parametrize("name", SETTINGS_FIELDS)
def test_every_setting_is_a_config_field_with_the_same_default(name: str) -> None:
    assert name in CONFIG_FIELDS, f"settings.{name} is no field of mediator.Config"
    assert getattr(Settings(), name) == CONFIG_FIELDS[name].default
    assert type(getattr(Settings(), name)) is type(CONFIG_FIELDS[name].default)


def test_the_fleets_fields_are_not_settings() -> None:
    assert not set(FLEET_ONLY) & set(SETTINGS_FIELDS)
    assert {f.name for f in dataclasses.fields(Fleet)} >= set(FLEET_ONLY)


def test_the_engines_config_is_built_from_the_settings_by_name() -> None:
    st = Settings(lease_ttl_seconds=120.0, renew_seconds=5.0, advert_ttl_seconds=45.0,
                  max_width=2, max_attempts=7, wake_on_return=False)  # fmt: skip
    config = st.config()
    assert isinstance(config, Config)
    assert {n: getattr(config, n) for n in SETTINGS_FIELDS} == dataclasses.asdict(st)
    assert st.config(database_url="postgresql:///x").database_url == "postgresql:///x"


def _edges(name: str) -> list[tuple[Any, bool]]:
    """(value, accepted) at and just beyond both ends of the Mediator's range for ``name``."""
    low, high = RANGES[name]
    if isinstance(CONFIG_FIELDS[name].default, bool | int):
        return [(int(low), True), (int(high), True), (int(low) - 1, False), (int(high) + 1, False)]
    return [(low, True), (high, True), (low / 2, False), (high * 2, False), (math.nan, False),
            (math.inf, False)]  # fmt: skip


@pytest.mark.parametrize("name", [n for n in SETTINGS_FIELDS if n in RANGES])
def test_the_ranges_and_messages_are_the_mediators(name: str) -> None:
    """Each end of Config's range is a setting the simulator takes; one step beyond is refused
    with exactly the message the server gives."""
    for value, accepted in _edges(name):
        if accepted:
            assert getattr(Settings(**{name: value}), name) == value
        else:
            with pytest.raises(ScenarioError) as caught:
                Settings(**{name: value})
            assert str(caught.value) == server_message(**{name: value})


def test_every_ranged_setting_is_checked() -> None:
    """A setting of Config with a range and a Settings field of that name: none is left out."""
    assert {n for n in SETTINGS_FIELDS if n in RANGES} == {
        "lease_ttl_seconds", "renew_seconds", "advert_ttl_seconds", "max_width", "max_attempts"
    }  # fmt: skip


def test_set_max_width_0_is_refused_with_the_servers_one_line(capsys) -> None:
    """`--set settings.max_width=0` once said "renew_s > 0, max_width >= 1, max_attempts >= 1";
    now it says what `mediator serve` says of MEDIATOR_MAX_WIDTH=0."""
    assert cli.main(["run", "steady", "--engine", "model", "--set", "settings.max_width=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    with pytest.raises(ConfigError) as served:
        Config.load(env={"MEDIATOR_MAX_WIDTH": "0"})
    assert err == [f"python -m sim run: error: {served.value.message}"]
    assert served.value.message == "max_width must be a whole number from 1 to 10,000, not 0."


def test_numpy_settings_reach_the_mediator_as_its_own_numbers() -> None:
    st = Settings(max_width=np.int64(2), lease_ttl_seconds=np.float64(90.0),
                  wake_on_return=np.bool_(False))  # fmt: skip
    assert (type(st.max_width), type(st.wake_on_return)) == (int, bool)
    assert st.config().max_width == 2


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf, True, "2"])
def test_a_claim_latency_that_cannot_be_is_refused_naming_the_fleet(value: Any) -> None:
    with pytest.raises(ScenarioError, match=r"^fleet\.claim_latency_s "):
        dataclasses.replace(S.steady().fleet, claim_latency_s=value)


def test_the_claim_latency_is_the_fleets_and_the_loop_reads_it() -> None:
    """A 2 s claim latency on the fleet delays the step, not the promotion (sim.platform.driver)."""
    sc = S.steady(runs=5, seed=1)
    slow = dataclasses.replace(sc, fleet=dataclasses.replace(sc.fleet, claim_latency_s=2.0))
    assert slow.with_sets(["claim_latency_s=2"]) == slow
    a, b = run_model(materialize(sc)).runs, run_model(materialize(slow)).runs
    took = (b["ended_at"] - b["started_at"]) - (a["ended_at"] - a["started_at"])
    assert took.round(6).tolist() == [2.0] * len(a)


# ---- the old names, read for one release -----------------------------------------------------

#: An old scenario file's tables, as the previous release wrote them (steady's settings).
OLD_SETTINGS = {
    "settings.lease_ttl_s": ("lease_ttl_s = 9000.0", "settings.lease_ttl_seconds", 9000.0),
    "settings.renew_s": ("renew_s = 60.0", "settings.renew_seconds", 60.0),
    "settings.advert_ttl_s": ("advert_ttl_s = 4000.0", "settings.advert_ttl_seconds", 4000.0),
    "settings.claim_latency_s": ("claim_latency_s = 2.5", "fleet.claim_latency_s", 2.5),
}


def _value(sc: Scenario, path: str) -> Any:
    table, _, name = path.partition(".")
    return getattr(getattr(sc, table), name)


def test_every_old_name_has_a_test() -> None:
    assert set(OLD_SETTINGS) == set(RENAMED)


@pytest.mark.parametrize("old", sorted(OLD_SETTINGS))
def test_an_old_name_in_a_scenario_file_still_loads_under_its_new_name(old: str) -> None:
    line, new, value = OLD_SETTINGS[old]
    text = S.steady().to_toml()
    text = text.replace("[settings]\n", f"[settings]\n{line}\n")
    text = text.replace(f"\n{new.partition('.')[2]} = ", "\n# was: ", 1)  # the new key, gone
    with pytest.warns(RenamedSetting) as said:
        sc = Scenario.from_toml(text)
    assert _value(sc, new) == value
    assert [str(w.message) for w in said] == [
        f"{old} is now {new}; the old name is read until the next release"
    ]


@pytest.mark.parametrize("old", sorted(OLD_SETTINGS))
def test_an_old_name_in_set_still_applies_under_its_new_name(old: str) -> None:
    _, new, value = OLD_SETTINGS[old]
    with pytest.warns(RenamedSetting, match=rf"^{old} is now {new};"):
        sc = S.steady().with_sets([f"{old}={value}"])
    assert sc == S.steady().with_sets([f"{new}={value}"])


@pytest.mark.parametrize("old", sorted(RENAMED_SHORT))
def test_an_old_short_name_in_set_still_applies(old: str) -> None:
    new = RENAMED_SHORT[old]
    with pytest.warns(RenamedSetting, match=rf"^{old} is now {new};"):
        sc = S.steady().with_sets([f"{old}=4000"])
    assert getattr(sc.settings, new) == 4000


def test_an_old_and_a_new_name_of_one_setting_together_are_refused() -> None:
    d = S.steady().to_dict()
    d["settings"]["lease_ttl_s"] = 1.0
    with pytest.raises(ScenarioError) as caught:
        Scenario.from_dict(d)
    assert str(caught.value) == (
        "settings.lease_ttl_s and settings.lease_ttl_seconds are one setting: "
        "keep settings.lease_ttl_seconds"
    )


def test_the_old_name_is_one_line_on_stderr() -> None:
    """In a child process, as a user runs it: one line, naming the new name."""
    done = subprocess.run(
        [sys.executable, "-m", "sim", "show", "steady", "--set", "settings.claim_latency_s=2"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "scenario:0: RenamedSetting: settings.claim_latency_s is now fleet.claim_latency_s; "
        "the old name is read until the next release"
    ]
    assert "fleet.claim_latency_s" in done.stdout


# ---- a baseline recorded with the old names ---------------------------------------------------


def _as_recorded_by_the_previous_release(scenario: dict[str, Any]) -> dict[str, Any]:
    """A manifest's scenario as the previous release wrote it: the settings under their old
    names, the claim latency among them (spelled out, not derived from RENAMED)."""
    old = json.loads(json.dumps(scenario))
    st = old["settings"]
    old["settings"] = {
        "lease_ttl_s": st["lease_ttl_seconds"],
        "renew_s": st["renew_seconds"],
        "advert_ttl_s": st["advert_ttl_seconds"],
        "max_width": st["max_width"],
        "max_attempts": st["max_attempts"],
        "wake_on_return": st["wake_on_return"],
        "claim_latency_s": old["fleet"].pop("claim_latency_s"),
    }
    return old


COMMITTED = sorted(p.relative_to(ROOT / "sim-baseline").as_posix()
                   for p in (ROOT / "sim-baseline").glob("*/seed-*"))  # fmt: skip


@pytest.mark.parametrize("case", COMMITTED)
def test_a_manifest_with_the_old_names_is_the_same_scenario(case: str) -> None:
    """Every committed case, its manifest rewritten in the old names: the same scenario, hash and
    workload — so `python -m sim check` runs a baseline of the previous release unchanged."""
    manifest = json.loads((ROOT / "sim-baseline" / case / gate.MANIFEST).read_text())
    old = _as_recorded_by_the_previous_release(manifest["scenario"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RenamedSetting)
        then = Scenario.from_dict(old)
    now = Scenario.from_dict(manifest["scenario"])
    assert then == now
    assert then.scenario_hash() == manifest["scenario_hash"]
    assert then.to_dict() == manifest["scenario"]
