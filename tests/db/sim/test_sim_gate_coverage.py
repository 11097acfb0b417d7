"""The gate covers the rules it guards (issue 24, item 2): a rule broken on purpose — a *plant* of
``sim.outputs.coverage`` — changes the decisions of a committed baseline case, and the gate says
where.

Before the ``rules`` case was recorded, the matcher's folding choice for a multi-role contract,
one attempt fewer for a retried step and the drain kinds (swapped, or at-boundary acting
gracefully) passed ``python -m sim check --baseline sim-baseline`` as unchanged (exit 0): no case
exercised them (partial release was caught, by ``mixed``). Each test here fails on a tree whose
``sim-baseline/`` lacks that case. The expected first divergences are read from the committed
``decisions.csv`` (the baseline's decision for that run), so they document what each rule
decides in the case.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sim.outputs import coverage, gate

pytestmark = [
    pytest.mark.db,
    pytest.mark.slow,
]  # scripts/test --fast leaves it out: simulations on the real Mediator

ROOT = Path(__file__).resolve().parents[3]
BASELINE = ROOT / "sim-baseline"
RULES = BASELINE / "rules" / "seed-1"


@pytest.fixture(scope="module")
def server_url(cluster: Any) -> str:
    return str(cluster.url("postgres"))


def job(server_url: str, case: Path = RULES) -> Any:
    return gate.Job(gate.load_case(case), [], None, server_url)


# plant → (the run of the first divergence, the instant in seconds)
NAMED = {
    # §4 step 4: dut needs a board, host a host; b000 serves both and a000 only dut. Counting
    # the later roles a candidate serves folds the run onto one b node; ignoring the count takes
    # a000 (the lower id) for dut and makes the run two nodes wide.
    "match-ignores-folding": ("r0000008", "523.935296"),
    # §9: the retried `test` step of a fold run ends FAILED one attempt early, freeing its node.
    "attempts-minus-one": ("r0000111", "4751.699390"),
    # R15: a pair run's l000 is free once `prep` passed; without partial release a solo run
    # waits for the pair's `soak` on r000 to end.
    "no-partial-release": ("r0000012", "638.051905"),
    # §10: b000 drains at-boundary at 2,900 s for 60 s; the fold run on it ends at its step
    # boundary, so b000 is free at the undrain (2,960 s) and a queued run starts there. Acting
    # gracefully instead, the run goes on and b000 is still busy at 2,960 s. (The plant that
    # swaps both kinds is caught too, but by a crash: the node, told graceful, claims a step
    # the Mediator refuses as draining at the boundary.)
    "drain-at-boundary-graceful": ("r0000059", "2960.000000"),
    # wake 4: b001's daemon restarts at 4,230 s mid-run; the lost run frees it at that advert
    # and a queued fold run starts there at once.
    "wake-4-off": ("r0000096", "4230.000000"),
}


def test_the_rules_case_passes_unplanted(server_url: str) -> None:
    """The control: with no plant the case is unchanged (else every plant below proves nothing)."""
    o = gate.check_case(job(server_url))
    assert o.status == "pass", o.text()


@pytest.mark.parametrize("plant_id", sorted(NAMED))
def test_each_named_rule_broken_makes_check_fail_with_the_first_divergence_named(
    plant_id: str, server_url: str
) -> None:
    """Issue 24: matcher choice for a multi-role contract, retry attempts, partial release and
    drain kinds each change the ``rules`` case's decisions; the gate names where."""
    run_id, at = NAMED[plant_id]
    o = coverage.check_planted(plant_id, job(server_url))
    assert o.status == "fail"
    d = o.divergence
    assert d is not None, o.text()
    assert (d.run_id, gate.seconds(d.at_us)) == (run_id, at), o.text()
    assert f"first divergence at {at} s, run {run_id}" in o.headline()
    # the baseline's own record says what the unbroken rule decided for that run
    assert d.run_baseline is not None and d.run_baseline.run_id == run_id


def test_a_plant_that_breaks_nothing_is_listed_as_not_exercised(server_url: str) -> None:
    """The coverage table says "not exercised" for a plant no case notices (exit 1), and a
    documented exception (``--allow``) turns that into exit 0 while still listing it."""
    report = coverage.coverage(BASELINE, ["nothing"], names=["capabilities"],
                               database_url=server_url)  # fmt: skip
    assert report.exit_code == 1, report.text()
    [(_rule, plant_id, _what, verdict)] = report.rows()
    assert plant_id == "nothing" and verdict.startswith("NOT EXERCISED"), verdict
    assert "NOT EXERCISED: nothing (exit 1)" in report.text()
    allowed = coverage.coverage(BASELINE, ["nothing"], names=["capabilities"], allow=["nothing"],
                                database_url=server_url)  # fmt: skip
    assert allowed.exit_code == 0 and "NOT EXERCISED (allowed)" in allowed.text()


def test_the_table_names_the_case_that_caught_a_plant(server_url: str) -> None:
    """Wake 9 off (docs/design.md, wake points) is caught by the capabilities case at 100 s;
    the table says so, and the run stops at the first case that caught it."""
    report = coverage.coverage(BASELINE, ["wake-9-off"], names=["capabilities"],
                               database_url=server_url)  # fmt: skip
    assert report.exit_code == 0, report.text()
    [(_rule, _id, _what, verdict)] = report.rows()
    assert verdict == "capabilities[seed=0]: first divergence at 100.000000 s, run r0000001"


def test_the_command_allows_the_documented_exceptions_unless_strict(server_url: str) -> None:
    """``python -m sim coverage``: wake 2 (cancel) cannot happen in a simulation, so the command
    allows it by name and says why (exit 0); ``--strict`` counts it as not exercised (exit 1)."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "sim", "coverage", "capabilities", "--baseline", str(BASELINE),
            "--plant", "wake-2-off", "--database-url", server_url]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NOT EXERCISED (allowed: the simulator never cancels a run)" in done.stdout
    strict = subprocess.run([*argv, "--strict"], capture_output=True, text=True, cwd=ROOT)
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "NOT EXERCISED: wake-2-off (exit 1)" in strict.stdout
