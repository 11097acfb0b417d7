"""Configuration (docs/design.md §16): working defaults, precedence, refusals naming the setting."""

from __future__ import annotations

import pytest

from mediator import Config, ConfigError


def test_defaults_work_on_one_machine():
    c = Config()
    assert (c.lease_ttl_seconds, c.renew_seconds, c.advert_ttl_seconds) == (60, 10, 30)
    assert (c.max_width, c.max_attempts, c.wake_on_return, c.port) == (4, 3, True, 8640)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("lease_ttl_seconds", 0),
        ("lease_ttl_seconds", -5),
        ("renew_seconds", 0),
        ("advert_ttl_seconds", "30"),
        ("max_width", 0),
        ("max_width", 1.5),
        ("max_attempts", 0),
        ("wake_on_return", "yes"),
        ("port", 70000),
        ("host", ""),
    ],
)
def test_values_that_cannot_work_are_refused_naming_the_setting(setting, value):
    with pytest.raises(ConfigError) as e:
        Config(**{setting: value})
    assert e.value.field == setting and setting in e.value.message


def test_file_then_environment_then_explicit(tmp_path):
    f = tmp_path / "mediator.toml"
    f.write_text('[mediator]\nmax_width = 2\nport = 9000\nrecords_root = "/srv/records"\n')
    env = {"MEDIATOR_MAX_WIDTH": "3", "MEDIATOR_WAKE_ON_RETURN": "false"}
    c = Config.load(f, env=env, port=9100)
    assert (c.max_width, c.port, c.wake_on_return, c.records_root) == (
        3,
        9100,
        False,
        "/srv/records",
    )


def test_a_bad_file_or_environment_value_names_it(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("max_widht = 2\n")
    with pytest.raises(ConfigError) as e:
        Config.load(f, env={})
    assert e.value.field == "max_widht"
    with pytest.raises(ConfigError) as e:
        Config.load(None, env={"MEDIATOR_RENEW_SECONDS": "soon"})
    assert e.value.field == "renew_seconds"
    with pytest.raises(ConfigError) as e:
        Config.load(tmp_path / "missing.toml", env={})
    assert e.value.field == "config"


def test_unchecked_exists_only_for_the_codes_own_guards():
    """R11: tests build a lease_ttl of 0 to show the promotion code refuses it itself."""
    assert Config.unchecked(lease_ttl_seconds=0).lease_ttl_seconds == 0


# ---- issue 11 §9: finite values in sane ranges, checked in one place ---------------------------
@pytest.mark.parametrize("setting", ["lease_ttl_seconds", "renew_seconds", "advert_ttl_seconds"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e-9, -1.0, 1e12])
def test_seconds_must_be_finite_and_in_range(setting, value):
    with pytest.raises(ConfigError) as e:
        Config(**{setting: value})
    assert e.value.field == setting and setting in e.value.message


@pytest.mark.parametrize("raw", ["nan", "inf", "1e-9", "NaN", "-0"])
def test_the_environment_is_checked_by_the_same_rule(raw):
    with pytest.raises(ConfigError) as e:
        Config.load(None, env={"MEDIATOR_LEASE_TTL_SECONDS": raw})
    assert e.value.field == "lease_ttl_seconds"


@pytest.mark.parametrize(("setting", "value"), [("max_width", 10_001), ("max_attempts", 10**9)])
def test_counts_have_an_upper_bound(setting, value):
    with pytest.raises(ConfigError) as e:
        Config(**{setting: value})
    assert e.value.field == setting


def test_the_ranges_are_the_documented_ones():
    from pathlib import Path

    from mediator.config import RANGES

    doc = (Path(__file__).parents[2] / "docs" / "security.md").read_text("utf-8")
    for name, (low, high) in RANGES.items():
        assert f"`{name}`" in doc and f"{low:g}" in doc and f"{high:,g}" in doc, name


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e999", "0", "-1", "soon"])
def test_command_line_seconds_must_be_finite_and_positive(text):
    """Issue 11 §9 for runctl and enode flags: a usage error (exit 2), never a timeout of inf."""
    import argparse

    from mediator.argtypes import positive_float

    with pytest.raises(argparse.ArgumentTypeError):
        positive_float(text)
    assert positive_float("0.5") == 0.5
