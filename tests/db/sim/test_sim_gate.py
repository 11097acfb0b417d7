"""The scheduler gate on the real Mediator (issue 16): record a baseline, re-run it, and catch a
deliberate policy change with its first divergence named — from the command line (exit codes,
JUnit, Markdown), in-process, and through the pytest fixture a team's own suite would use.

Two deliberate changes, made without editing the source:
- wake 7 off (``--set settings.wake_on_return=false``, R-wake 7 of docs/design.md): in the
  vanished-node window run b (r0000001) is promoted when x000 returns at 300 s with wake 7 on, and
  only at 700 s without it;
- the matcher's tie-break flipped (a monkeypatch of ``match`` in ``mediator.flows.submit`` and
  ``mediator.flows.sweep``, in-process): among equally able free nodes the highest id is taken
  instead of the lowest (ADR-014 decision 3), so the very first run goes to n002 instead of n000.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import mediator.core.progress as progress_mod
from mediator.core.match import AdvertIndex, Assignment
from mediator.core.states import RunState, Verdict
from mediator.flows import submit as submit_flow
from mediator.flows import sweep as sweep_flow
from sim.inputs import scenarios as S
from sim.inputs.workload import materialize
from sim.outputs import gate

# scripts/test --fast leaves it out: simulations on the real Mediator
pytestmark = [
    pytest.mark.db,
    pytest.mark.xdist_group("sim_gate"),
    pytest.mark.slow,
]  # one worker: its module fixtures once

ROOT = Path(__file__).resolve().parents[3]
SMALL = S.steady(runs=60, seed=1)  # M/M/3, the gate's own small case: steady_small


@pytest.fixture(scope="module")
def server_url(cluster: Any) -> str:
    return str(cluster.url("postgres"))


@pytest.fixture(scope="session")
def sim_database_url(cluster: Any) -> str:
    """The plugin's runs go to the suite's own PostgreSQL (overrides
    sim.outputs.pytest_plugin's)."""
    return str(cluster.url("postgres"))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory, server_url: str) -> Path:
    """A baseline of the scripted vanished-node window (wake 7 on) and a small M/M/3."""
    work = tmp_path_factory.mktemp("gate")
    toml = work / "steady_small.toml"
    toml.write_text(SMALL.to_toml())
    root = work / "baseline"
    gate.record(root, ["vanished_node_on", str(toml)], database_url=server_url)
    return root


def sim(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m sim …`` in a child process, as CI runs it."""
    return subprocess.run([sys.executable, "-m", "sim", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd or ROOT, check=False)  # fmt: skip


def highest_id_first(real: Callable[..., Any]) -> Callable[..., Any]:
    """The matcher with its tie-break flipped: a one-role run takes the highest-id free node."""

    def match(needs_by_role: Mapping[str, Any], adverts: Any, unavailable: Any, width: int) -> Any:
        res = real(needs_by_role, adverts, unavailable, width)
        if isinstance(res, Assignment) and len(needs_by_role) == 1:
            ((role, needs),) = needs_by_role.items()
            index = adverts if isinstance(adverts, AdvertIndex) else AdvertIndex(adverts)
            free = sorted(index.serving(needs) - set(unavailable))
            return Assignment({role: free[-1]}, 1)
        return res

    return match


def flip_tie_break(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flip the matcher's tie-break wherever a flow decides: at submit and in the sweep."""
    for flow in (submit_flow, sweep_flow):
        monkeypatch.setattr(flow, "match", highest_id_first(flow.match))


# ---- exact mode: unchanged, changed ----------------------------------------------------------


def test_an_unchanged_tree_passes_and_the_junit_file_parses(
    baseline: Path, server_url: str, tmp_path: Path
) -> None:
    """issue 16 §2, §3: exit 0, one JUnit test case per scenario, a Markdown summary."""
    junit, md = tmp_path / "gate.xml", tmp_path / "gate.md"
    done = sim("check", "--baseline", str(baseline), "--junit", str(junit), "--markdown", str(md),
               "--jobs", "2", "--database-url", server_url)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "steady_small[seed=1]: 60 decisions identical" in done.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "0", "0")
    names = sorted(str(c.get("name")) for c in suite.iter("testcase"))
    assert names == ["steady_small[seed=1]", "vanished_node_on[seed=0]"]
    assert md.read_text().splitlines()[1] == (
        "## Scheduler gate: the scheduler's decisions are unchanged"
    )


def test_turning_wake_7_off_is_caught_with_the_first_divergence_named(
    baseline: Path, server_url: str, tmp_path: Path
) -> None:
    """issue 16 tests: the policy change is caught at 300 s on run b, from the command line."""
    junit, md = tmp_path / "gate.xml", tmp_path / "gate.md"
    done = sim("check", "--baseline", str(baseline), "vanished_node_on",
               "--set", "settings.wake_on_return=false", "--junit", str(junit),
               "--markdown", str(md), "--database-url", server_url)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "first divergence at decision #1, t = 300.000000 s, run r0000001" in out
    assert "baseline: r0000001 promoted at 300.000000 s on node=x000" in out
    assert "now:      nothing decided at 300.000000 s; next: r0000002 created at 600" in out
    assert "r0000001 promoted at 700.000000 s on node=x000" in out
    assert "queue at 300.000000 s, now: 1 run(s) (baseline: 1): r0000001" in out
    failure = ET.parse(junit).getroot().find("testsuite/testcase/failure")
    assert failure is not None and failure.get("type") == "SchedulingChanged"
    assert "first divergence at 300.000000 s, run r0000001" in str(failure.get("message"))
    assert (tmp_path / "gate-vanished_node_on-seed0.png").is_file()
    assert "](gate-vanished_node_on-seed0.png)" in md.read_text()


def test_flipping_the_matchers_tie_break_is_caught_at_the_first_run(
    baseline: Path, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 16 tests, in-process: the first run, at its arrival, goes to n002 instead of n000."""
    flip_tie_break(monkeypatch)
    report = gate.check(baseline, ["steady_small"], database_url=server_url)
    assert report.exit_code == 1
    (outcome,) = report.outcomes
    d = outcome.divergence
    assert d is not None
    first = materialize(SMALL).arrivals[0]
    assert (d.index, d.at_us, d.run_id) == (0, round(first.at_s * 1e6), first.run_id)
    assert d.baseline is not None and d.now is not None
    assert (d.baseline.roles, d.now.roles) == ("node=n000", "node=n002")
    assert d.queue == []  # an idle fleet: it went at submit
    # Drift mode, for intended changes: on identical nodes the waits do not move at all.
    drift = gate.check(baseline, ["steady_small"], tolerance=0.0, database_url=server_url)
    assert drift.exit_code == 0, drift.text()
    assert drift.outcomes[0].divergence is not None  # still reported, not failed


def test_runs_ending_another_way_fail_the_gate_though_every_start_is_the_same(
    baseline: Path, server_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """docs/design.md §20: a verdict moves no start, so SettleIfDone turned round (every passing
    run ends FAILED) leaves the decisions identical; the gate fails on the runs counted by
    verdict instead, and says how they moved."""
    real = progress_mod.settle_verdict

    def flipped(step_states: Any) -> Any:
        d = real(step_states)
        return None if d is None else (RunState.FAILED, Verdict.FAIL)

    monkeypatch.setattr(progress_mod, "settle_verdict", flipped)
    report = gate.check(baseline, ["steady_small"], database_url=server_url)
    assert report.exit_code == 1
    (outcome,) = report.outcomes
    assert outcome.divergence is None
    assert outcome.verdicts == ({"pass": 60}, {"fail": 60})
    assert "60 decisions identical" in outcome.headline()
    assert "runs by verdict pass 60 in the baseline, fail 60 now" in report.text()
    failure = ET.parse(report.write_junit(tmp_path / "g.xml")).getroot().find(
        "testsuite/testcase/failure")  # fmt: skip
    assert failure is not None and failure.get("type") == "SchedulingChanged"


def test_drift_mode_names_the_metrics_that_moved_beyond_their_intervals(
    baseline: Path, server_url: str
) -> None:
    """issue 16 §2: wake 7 off in the window: b stuck 400 s, waits far beyond ± 50 %."""
    wake_off = ["settings.wake_on_return=false"]
    report = gate.check(baseline, ["vanished_node_on"], tolerance=0.5, sets=wake_off,
                        database_url=server_url)  # fmt: skip
    assert report.exit_code == 1
    moved = {m.label: m for m in report.outcomes[0].metrics if m.moved}
    assert set(moved) >= {"mean wait (s)", "stuck time (s)"}
    assert moved["stuck time (s)"].now == pytest.approx(400.0)
    assert "utilisation" not in moved  # the same work, done later
    assert "MOVED" in report.text()


# ---- could not run: exit 2 -------------------------------------------------------------------


def _copy(baseline: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "baseline"
    shutil.copytree(baseline, dest)
    return dest


def test_a_baseline_from_another_version_is_refused_with_exit_2(
    baseline: Path, server_url: str, tmp_path: Path
) -> None:
    root = _copy(baseline, tmp_path)
    manifest = root / "vanished_node_on" / "seed-0" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["project_version"] = "0.0.9"
    manifest.write_text(json.dumps(m))
    done = sim("check", "--baseline", str(root), "vanished_node_on", "--database-url", server_url)
    assert done.returncode == 2
    assert "version mismatch" in done.stdout and "version 0.0.9 of this project" in done.stdout
    assert "--ignore-version" in done.stdout
    again = sim("check", "--baseline", str(root), "vanished_node_on", "--ignore-version",
                "--database-url", server_url)  # fmt: skip
    assert again.returncode == 0, again.stdout


def test_a_baseline_with_the_old_setting_names_still_passes(
    baseline: Path, server_url: str, tmp_path: Path
) -> None:
    """design.md §20: a baseline the previous release recorded (settings under their old names,
    the claim latency among them) is read for one release: the same decisions pass, with one
    line per old name naming the new one."""
    root = _copy(baseline, tmp_path)
    manifest = root / "vanished_node_on" / "seed-0" / "manifest.json"
    m = json.loads(manifest.read_text())
    sc = m["scenario"]
    assert sc["settings"] == {"lease_ttl_seconds": 60.0, "renew_seconds": 10.0,
                              "advert_ttl_seconds": 30.0, "max_width": 4, "max_attempts": 3,
                              "wake_on_return": True}  # fmt: skip
    del sc["fleet"]["claim_latency_s"]
    sc["settings"] = {"lease_ttl_s": 60.0, "renew_s": 10.0, "advert_ttl_s": 30.0,
                      "max_width": 4, "max_attempts": 3, "wake_on_return": True,
                      "claim_latency_s": 0.0}  # fmt: skip
    manifest.write_text(json.dumps(m))
    with pytest.warns(S.RenamedSetting) as said:
        report = gate.check(root, ["vanished_node_on"], database_url=server_url)
    assert report.exit_code == 0, report.text()
    assert sorted(str(w.message).partition(" is now ")[0] for w in said) == [
        "settings.advert_ttl_s", "settings.claim_latency_s", "settings.lease_ttl_s",
        "settings.renew_s",
    ]  # fmt: skip


def test_a_corrupted_baseline_exits_2(baseline: Path, server_url: str, tmp_path: Path) -> None:
    root = _copy(baseline, tmp_path)
    csv = root / "vanished_node_on" / "seed-0" / "decisions.csv"
    csv.write_text(csv.read_text().replace("300.000000", "299.000000"))
    done = sim("check", "--baseline", str(root), "--database-url", server_url)
    assert done.returncode == 2
    assert "decisions.csv does not match its digest" in done.stdout
    assert "PASS  steady_small[seed=1]" in done.stdout  # the sound case still ran
    (root / "steady_small" / "seed-1" / "manifest.json").write_text("{ not json")
    assert sim("check", "--baseline", str(root), "steady_small").returncode == 2
    missing = sim("check", "--baseline", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no baseline directory" in missing.stdout


def test_a_setting_that_changes_the_workload_is_not_blamed_on_the_scheduler(
    baseline: Path, server_url: str
) -> None:
    report = gate.check(baseline, ["steady_small"], sets=["seed=5"], database_url=server_url)
    assert report.exit_code == 2
    assert "changed the workload itself" in report.outcomes[0].error


# ---- the pytest fixture ----------------------------------------------------------------------


def test_scheduler_unchanged(sim_check: Callable[..., Any]) -> None:
    """issue 16 §4, as a team would write it: this tree against the committed sim-baseline/."""
    outcome = sim_check("steady", seed=1)
    assert outcome.status == "pass" and outcome.decisions == 300


def test_the_fixture_in_a_users_own_suite(baseline: Path, server_url: str, tmp_path: Path) -> None:
    """issue 16 §4: a user's suite gets sim_check from the installed plugin; a changed decision
    fails its test with the first divergence; --sim-update-baseline records on purpose."""
    (tmp_path / "test_ours.py").write_text(
        "from tests.db.sim.test_sim_gate import flip_tie_break\n\n"
        "def test_scheduler_unchanged(sim_check):\n"
        "    sim_check('vanished_node_on', seed=0)\n\n"
        "def test_scheduler_with_a_flipped_tie_break(sim_check, monkeypatch):\n"
        "    flip_tie_break(monkeypatch)\n"
        "    sim_check('steady_small', seed=1)\n"
    )
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
            "-p", "sim.outputs.pytest_plugin", "-q", "test_ours.py",
            "--sim-database-url", server_url]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the inner test imports flip_tie_break
    run = subprocess.run([*args, "--sim-baseline", str(baseline)], cwd=tmp_path, text=True,
                         capture_output=True, timeout=600, env=env, check=False)  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 1 passed" in run.stdout
    assert "first divergence at decision #0" in run.stdout and "node=n002" in run.stdout
    fresh = tmp_path / "fresh"
    update = subprocess.run([*args, "-k", "unchanged", "--sim-update-baseline",
                             "--sim-baseline", str(fresh)], cwd=tmp_path, text=True,
                            capture_output=True, timeout=600, env=env,
                            check=False)  # fmt: skip
    assert update.returncode == 0, update.stdout + update.stderr
    assert (fresh / "vanished_node_on" / "seed-0" / "decisions.csv").read_text() == (
        baseline / "vanished_node_on" / "seed-0" / "decisions.csv"
    ).read_text()
