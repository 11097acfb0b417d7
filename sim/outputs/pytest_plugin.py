"""The scheduler gate as a pytest fixture (issue 16 §4): a team's own suite can write

    def test_scheduler_unchanged(sim_check):
        sim_check("steady", seed=1)

and the test fails, naming the first divergence, when the real Mediator no longer makes the
decisions recorded in the baseline (``sim.outputs.gate``).

Turn it on with ``pytest_plugins = ["sim.outputs.pytest_plugin"]`` in the root ``conftest.py`` (or
``-p sim.outputs.pytest_plugin``). It is not a ``pytest11`` entry point on purpose: those load
before pytest-cov starts, so every module of ``sim`` would count as unmeasured in a suite with
coverage.

Where the baseline lives: ``--sim-baseline DIR``, else the ini key ``sim_baseline``, else
``sim-baseline/`` — relative to pytest's rootdir. ``pytest --sim-update-baseline`` records the
cases the tests ask for instead of checking them (the way to refresh on purpose; commit the diff).
Runs go to the PostgreSQL server of ``--sim-database-url`` / ini ``sim_database_url``, else to an
embedded one; a suite that has its own server overrides the ``sim_database_url`` fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

DEFAULT_BASELINE = "sim-baseline"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sim", "the scheduler gate (sim.outputs.gate)")
    group.addoption("--sim-baseline", metavar="DIR", help="the gate's baseline directory")
    group.addoption(
        "--sim-update-baseline",
        action="store_true",
        help="record the baseline cases the tests ask for instead of checking them",
    )
    group.addoption("--sim-database-url", metavar="URL", help="PostgreSQL server for sim runs")
    parser.addini("sim_baseline", "the gate's baseline directory", default=DEFAULT_BASELINE)
    parser.addini("sim_database_url", "PostgreSQL server for sim runs", default="")


@pytest.fixture(scope="session")
def sim_baseline_dir(pytestconfig: pytest.Config) -> Path:
    """The baseline directory (option, ini key, default — relative to the rootdir)."""
    given = pytestconfig.getoption("sim_baseline") or pytestconfig.getini("sim_baseline")
    path = Path(str(given or DEFAULT_BASELINE))
    return path if path.is_absolute() else Path(pytestconfig.rootpath) / path


@pytest.fixture(scope="session")
def sim_database_url(pytestconfig: pytest.Config) -> str | None:
    """The PostgreSQL server the gate's runs create their databases on (None: embedded)."""
    url = pytestconfig.getoption("sim_database_url") or pytestconfig.getini("sim_database_url")
    return str(url) if url else None


@pytest.fixture
def sim_check(
    pytestconfig: pytest.Config, sim_baseline_dir: Path, sim_database_url: str | None
) -> Callable[..., Any]:
    """``sim_check(scenario, seed=None, *, tolerance=None, scale="ci")``: re-run the recorded case
    on the real Mediator and fail the test unless its decisions are identical (``tolerance``:
    drift mode — unless no metric left its interval). Returns the ``sim.outputs.gate.Outcome``."""
    # Every test session loads this plugin; the simulator (pandas, the database stack) is
    # imported only by a test that uses the fixture.
    from sim.outputs import gate

    update = bool(pytestconfig.getoption("sim_update_baseline"))

    def check(
        scenario: str, seed: int | None = None, *, tolerance: float | None = None, scale: str = "ci"
    ) -> Any:
        seeds = [] if seed is None else [seed]
        if update:
            gate.record(sim_baseline_dir, [scenario], scale=scale, seeds=seeds,
                        database_url=sim_database_url)  # fmt: skip
        report = gate.check(sim_baseline_dir, [scenario], seeds=seeds, tolerance=tolerance,
                            database_url=sim_database_url)  # fmt: skip
        if report.exit_code != 0:
            hint = (
                f"\n(refresh on purpose: pytest --sim-update-baseline, or python -m sim baseline "
                f"--out {sim_baseline_dir} {scenario}" + (f" --seed {seed}" if seed is not None
                                                          else "") + ")"
            )  # fmt: skip
            pytest.fail(report.text() + hint, pytrace=False)
        return report.outcomes[0]

    return check
