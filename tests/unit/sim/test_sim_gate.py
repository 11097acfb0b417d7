"""The scheduler gate's pure parts (issue 16): the decisions file, the first divergence, drift
bands, baseline validation and the CI outputs — worked examples on hand-made decision lists.
The runs on the real Mediator are in tests/db/sim/test_sim_gate.py."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.inputs.scenarios import Scenario
from sim.outputs import gate
from sim.outputs.gate import BaselineError, Decision, GateReport, Outcome, first_divergence
from tests.conftest import examples

ROOT = Path(__file__).resolve().parents[3]

# The vanished-node window of seed 000 §5 with wake 7 on (the baseline) and off (now): b
# (r0000001) goes at 300 s when x000 returns — or only at 700 s, when c's result wakes the queue.
WAKE_ON = [
    Decision(1_000_000, "r0000000", "created", "node=x000", 0),
    Decision(300_000_000, "r0000001", "promoted", "node=x000", 1),
    Decision(600_000_000, "r0000002", "created", "node=y000", 0),
]
WAKE_OFF = [
    WAKE_ON[0],
    WAKE_ON[2],
    Decision(700_000_000, "r0000001", "promoted", "node=x000", 1),
]


def test_seconds_are_written_and_read_exactly_to_the_microsecond() -> None:
    assert gate.seconds(300_000_001) == "300.000001"
    assert gate.seconds(2_982_737) == "2.982737"
    rows = [Decision(2_982_737, "r0", "created", "node=n0", 0), *WAKE_ON]
    assert gate.parse_decisions(gate.decisions_csv(rows)) == rows


def test_identical_decisions_have_no_divergence() -> None:
    assert first_divergence(WAKE_ON, list(WAKE_ON)) is None


def test_the_queue_length_is_informative_not_compared() -> None:
    now = [d._replace(queued=d.queued + 1) for d in WAKE_ON]
    assert first_divergence(WAKE_ON, now) is None


def test_wake_7_off_diverges_at_300_s_on_run_b() -> None:
    d = first_divergence(WAKE_ON, WAKE_OFF)
    assert d is not None
    assert (d.index, d.at_us, d.run_id) == (1, 300_000_000, "r0000001")
    assert d.baseline == WAKE_ON[1] and d.now == WAKE_OFF[1]
    assert d.run_now == WAKE_OFF[2]  # where b went now: 700 s
    assert d.differ == 1  # only b's decision differs; c is the same decision, one place earlier
    text = d.text()
    assert "t = 300.000000 s, run r0000001" in text
    assert "baseline: r0000001 promoted at 300.000000 s on node=x000" in text
    assert "now:      nothing decided at 300.000000 s; next: r0000002 created" in text
    assert "r0000001 promoted at 700.000000 s" in text


def test_another_node_at_the_same_instant_is_a_divergence_of_that_run() -> None:
    now = [WAKE_ON[0]._replace(roles="node=y000"), *WAKE_ON[1:]]
    d = first_divergence(WAKE_ON, now)
    assert d is not None and (d.index, d.at_us, d.run_id, d.differ) == (0, 1_000_000, "r0000000", 1)
    text = d.text()
    assert "now:      r0000000 created at 1.000000 s on node=y000" in text
    assert "later, now" not in text  # said once is enough


def test_a_decision_missing_at_the_end_is_a_divergence() -> None:
    d = first_divergence(WAKE_ON, WAKE_ON[:2])
    assert d is not None and (d.index, d.run_id, d.now, d.run_now) == (2, "r0000002", None, None)
    assert "never started" in d.text()


def test_drift_bands_are_the_intervals_widened_by_the_tolerance() -> None:
    base = {
        "wait_mean_s": 10.0,
        "wait_mean_ci": {"estimate": 10.0, "low": 9.0, "high": 11.0, "n": 20, "conf": 0.95},
        "wait_p95_s": 40.0,
        "utilization": 0.5,
        "stuck_s": 0.0,
    }
    now = {"wait_mean_s": 11.5, "wait_p95_s": 41.0, "utilization": 0.5, "stuck_s": 0.0}
    rows = {m.label: m for m in gate.drift(base, now, tolerance=0.1)}
    assert (rows["mean wait (s)"].low, rows["mean wait (s)"].high) == (8.0, 12.0)
    assert not rows["mean wait (s)"].moved  # 11.5 is within [9 − 1, 11 + 1]
    assert not rows["p95 wait (s)"].moved  # no interval recorded: 40 ± 4
    assert [m.label for m in gate.drift(base, now, tolerance=0.0) if m.moved] == [
        "mean wait (s)",
        "p95 wait (s)",
    ]
    assert "MOVED" in gate.metrics_table(gate.drift(base, now, 0.0))


def _write_case(root: Path, rows: list[Decision], **manifest: object) -> Path:
    d = gate.case_dir(root, "vanished_node_on", 0)
    d.mkdir(parents=True)
    text = gate.decisions_csv(rows)
    (d / gate.DECISIONS).write_text(text)
    (d / gate.SUMMARY).write_text("{}\n")
    m = {
        "format": gate.FORMAT,
        "case": "vanished_node_on",
        "seed": 0,
        "project_version": gate.project_version(),
        "decisions_sha256": gate.digest(text),
        "workload_sha256": "x",
        "scenario": {},
        **manifest,
    }
    (d / gate.MANIFEST).write_text(json.dumps(m))
    return d


def test_a_sound_baseline_reads_back(tmp_path: Path) -> None:
    base = gate.load_case(_write_case(tmp_path, WAKE_ON))
    assert base.decisions == WAKE_ON and (base.case, base.seed) == ("vanished_node_on", 0)


def test_an_edited_decisions_file_is_refused(tmp_path: Path) -> None:
    d = _write_case(tmp_path, WAKE_ON)
    text = (d / gate.DECISIONS).read_text().replace("300.000000", "301.000000")
    (d / gate.DECISIONS).write_text(text)
    with pytest.raises(BaselineError, match="does not match its digest"):
        gate.load_case(d)


def test_a_baseline_of_another_version_is_refused_with_the_way_out(tmp_path: Path) -> None:
    d = _write_case(tmp_path, WAKE_ON, project_version="0.0.9")
    with pytest.raises(BaselineError) as err:
        gate.load_case(d)
    message = str(err.value)
    assert "version mismatch" in message and "0.0.9" in message
    assert gate.project_version() in message and "python -m sim baseline" in message
    assert gate.load_case(d, ignore_version=True).decisions == WAKE_ON


def test_a_baseline_of_another_format_or_without_files_is_refused(tmp_path: Path) -> None:
    d = _write_case(tmp_path, WAKE_ON, format=99)
    with pytest.raises(BaselineError, match="format 99"):
        gate.load_case(d)
    (d / gate.SUMMARY).unlink()
    with pytest.raises(BaselineError, match=r"summary\.json is missing"):
        gate.load_case(d)
    with pytest.raises(BaselineError, match="no baseline directory"):
        gate.find_cases(tmp_path / "nowhere")


def _report(tmp_path: Path) -> GateReport:
    changed = Outcome("vanished_node_on", 0, "fail", decisions=3,
                      divergence=first_divergence(WAKE_ON, WAKE_OFF),
                      now_decisions=WAKE_OFF, baseline_decisions=WAKE_ON)  # fmt: skip
    same = Outcome("steady", 1, "pass", decisions=300, digest="ab" * 32)
    broken = Outcome("drain", 1, "error", error="bad baseline x: decisions.csv is missing")
    return GateReport(tmp_path / "baseline", "exact", [same, changed, broken], wall_s=12.5)


def test_the_junit_file_has_one_test_case_per_scenario(tmp_path: Path) -> None:
    report = _report(tmp_path)
    assert report.exit_code == 2  # could not run outranks changed
    path = report.write_junit(tmp_path / "gate.xml")
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == ["steady[seed=1]", "vanished_node_on[seed=0]", "drain[seed=1]"]
    failure = cases["vanished_node_on[seed=0]"].find("failure")
    assert failure is not None and "300.000000 s, run r0000001" in failure.get("message", "")
    assert cases["drain[seed=1]"].find("error") is not None
    assert cases["steady[seed=1]"].find("failure") is None


def test_the_markdown_comment_shows_the_first_divergence_and_links_its_chart(
    tmp_path: Path,
) -> None:
    path = _report(tmp_path).write_markdown(tmp_path / "comment.md")
    text = path.read_text()
    assert text.startswith(gate.MARKER + "\n## Scheduler gate: 1 of 3 case(s) changed, 1 could not")
    assert "first divergence at decision #1, t = 300.000000 s, run r0000001" in text
    chart = tmp_path / "comment-vanished_node_on-seed0.png"
    assert f"]({chart.name})" in text and chart.stat().st_size > 1000


def test_with_a_charts_url_the_comment_links_its_charts_instead_of_showing_them(
    tmp_path: Path,
) -> None:
    """A CI job summary or a pull-request comment cannot show an image stored beside the file
    (a relative image link renders broken there): with ``charts_url`` the chart is named and
    linked to the run's page, where the artifact keeps it."""
    url = "https://ci.example/org/repo/actions/runs/42"
    text = _report(tmp_path).write_markdown(tmp_path / "c.md", charts_url=url).read_text()
    chart = "c-vanished_node_on-seed0.png"
    assert "![" not in text
    assert f"[`{chart}`]({url})" in text and (tmp_path / chart).stat().st_size > 1000


def test_the_example_ci_workflow_runs_the_gate_on_the_committed_baseline() -> None:
    """issue 16 §5: examples/scheduler-gate.yml is valid YAML, runs `python -m sim check` with
    JUnit and Markdown output, against a baseline directory that exists in the repository."""
    import yaml

    root = Path(__file__).resolve().parents[3]
    flow = yaml.safe_load((root / "examples" / "scheduler-gate.yml").read_text())
    steps = flow["jobs"]["gate"]["steps"]
    runs = " ".join(str(s.get("run", "")) for s in steps)
    assert "python -m sim check --baseline sim-baseline" in runs
    assert "--junit gate/junit.xml" in runs and "--markdown gate/summary.md" in runs
    assert '--charts-url "$RUN_URL"' in runs  # a summary or a comment cannot show files beside it
    assert gate.find_cases(root / "sim-baseline")  # every case it would run is there


@pytest.mark.slow  # scripts/test --fast leaves it out
def test_the_example_ci_workflow_passes_the_workflow_linters() -> None:
    """The workflow is checked by tools made for GitHub's workflow files: zizmor (from PyPI; a
    linter for permissions, credentials, pinning and injection, offline and pedantic) and the
    workflow JSON schema (check-jsonschema's vendored copy). Earlier findings they or a reading
    of the platform's documentation caught: a JUnit action that needed ``checks: write`` the job
    did not grant, a new comment per failing push, a comment step that fails on a fork's read-only
    token, and checkout credentials left in the workspace."""
    import shutil
    import subprocess
    import sys

    import yaml

    root = Path(__file__).resolve().parents[3]
    workflow = root / "examples" / "scheduler-gate.yml"
    bindir = Path(sys.executable).parent
    zizmor = shutil.which("zizmor", path=str(bindir)) or "zizmor"
    lint = subprocess.run(
        [zizmor, "--offline", "--persona", "pedantic", "--no-progress",
         "--config", str(root / "examples" / "zizmor.yml"), str(workflow)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr
    schema = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
         str(workflow)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert schema.returncode == 0, schema.stdout + schema.stderr
    flow = yaml.safe_load(workflow.read_text())
    job = flow["jobs"]["gate"]
    assert flow["permissions"] == {} and job["permissions"] == {
        "contents": "read", "pull-requests": "write"
    }  # fmt: skip
    comment = next(s for s in job["steps"] if "Comment" in s.get("name", ""))
    assert "head.repo.full_name == github.repository" in comment["if"]  # not on forks
    assert "PATCH" in comment["run"] and gate.MARKER in comment["run"]  # edits its one comment


def test_a_field_added_to_fleet_events_later_leaves_the_workload_digest_alone() -> None:
    """The `capabilities` field (wake 9's `caps` events) came after the baselines of the other
    kinds were recorded: those baselines must stay valid (found by merging main)."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from sim.inputs.scenarios import FleetEvent

    @dataclass(frozen=True)
    class OldFleetEvent:  # FleetEvent before `capabilities` existed
        at_s: float
        node_id: str
        kind: str
        policy: str = "graceful"

    def plan(*events: object) -> object:
        return SimpleNamespace(nodes=(), arrivals=(), fleet_events=events)

    assert gate.workload_digest(plan(FleetEvent(100.0, "x000", "vanish"))) == (
        gate.workload_digest(plan(OldFleetEvent(100.0, "x000", "vanish")))
    )
    caps = FleetEvent(5.0, "x000", "caps", capabilities={"board": "y"})
    assert gate.workload_digest(plan(caps)) != gate.workload_digest(
        plan(FleetEvent(5.0, "x000", "vanish"))
    )


COMMITTED = sorted(p.relative_to(ROOT / "sim-baseline").as_posix()
                   for p in (ROOT / "sim-baseline").glob("*/seed-*"))  # fmt: skip


@pytest.mark.parametrize("case", COMMITTED)
def test_the_committed_summaries_are_what_summary_says_today(case: str) -> None:
    """Re-recording the committed baseline changes no byte (README, "The scheduler gate"): its
    ``summary.json`` files are what ``summary()`` gives now. Five of them (burst, drain, restart,
    steady, trace) were written before the summary's intervals named their method and came from
    batches, so every re-recording rewrote them. Checked on the reference model, which schedules
    exactly as the Mediator does (the differential test) and needs no database."""
    d = ROOT / "sim-baseline" / case
    scenario = Scenario.from_dict(json.loads((d / gate.MANIFEST).read_text())["scenario"])
    assert gate.summary_json(sim.run(scenario, "model")) == (d / gate.SUMMARY).read_text()


# ---- a planted run stops at its first divergence (sim coverage) ---------------------------------


def _decisions(draw: st.DrawFn, n: int) -> list[Decision]:
    """``n`` decisions in time order, several often at one instant (as a sweep makes them)."""
    at, rows = 0, []
    for k in range(n):
        at += draw(st.sampled_from([0, 0, 1_000_000, 2_500_000]))
        how = draw(st.sampled_from(["created", "promoted"]))
        rows.append(Decision(at, f"r{k:07d}", how, f"node={draw(st.sampled_from('ab'))}000", 0))
    return rows


@st.composite
def _a_run_and_its_feed(draw: st.DrawFn) -> tuple[list[Decision], list[Decision], list[Any]]:
    """A baseline, a run that may differ from it (a decision changed, dropped, added, or two
    swapped), and how a running simulation shows that run to the watch: the decisions in
    chunks, each with the virtual instant of the call — at or after the chunk's last decision
    and at or before the next one (a call comes between events; later decisions are later)."""
    base = _decisions(draw, draw(st.integers(0, 12)))
    now = list(base)
    change = draw(st.sampled_from(["none", "roles", "drop", "add", "swap", "later"]))
    k = draw(st.integers(0, max(0, len(now) - 1)))
    if change == "roles" and now:
        now[k] = now[k]._replace(roles="node=z000")
    elif change == "drop" and now:
        del now[k]
    elif change == "add":
        at = now[k - 1].at_us if k and now else 0
        now.insert(k, Decision(at, "rextra", "created", "node=a000", 0))
    elif change == "swap" and k + 1 < len(now) and now[k].at_us == now[k + 1].at_us:
        now[k], now[k + 1] = now[k + 1], now[k]
    elif change == "later" and now:
        now[k] = now[k]._replace(at_us=now[k].at_us + 500_000)
        now.sort(key=lambda d: d.at_us)
    feed, i = [], 0
    while i < len(now):
        j = draw(st.integers(i, len(now)))  # an empty chunk: a call that saw no decision
        last = now[j - 1].at_us if j else 0
        nxt = now[j].at_us if j < len(now) else last + 10_000_000
        feed.append(([d.key for d in now[i:j]], draw(st.integers(last, nxt))))
        i = j
    # a last call past every decision of either side (a run that ends before one comes is
    # simply whole: it never needed stopping)
    feed.append(([], max(d.at_us for d in [*base, *now, Decision(0, "", "", "", 0)]) + 1))
    return base, now, feed


@settings(max_examples=examples(500), deadline=None, database=None)
@given(_a_run_and_its_feed())
def test_a_run_stopped_when_its_divergence_is_settled_has_the_whole_runs_first_divergence(
    case: tuple[list[Decision], list[Decision], list[Any]],
) -> None:
    """``check_case(stop_at_divergence=True)`` (``sim coverage``'s planted runs) stops a run
    once ``Settled`` says so. The reference is the whole run: its first divergence, compared
    with the first divergence of the decisions made up to the stop, must be the same decision —
    index, instant, run, and the baseline's side — a run equal to its baseline never stops, and
    one that differs stops by the time the clock has passed every decision."""
    base, now, feed = case
    watch, made = gate.Settled(base), 0
    stopped = False
    for keys, now_us in feed:
        made += len(keys)
        if watch(keys, now_us):
            stopped = True
            break
    whole = first_divergence(base, now)
    assert stopped == (whole is not None)
    if whole is not None:
        cut = first_divergence(base, now[:made])
        assert cut is not None
        assert (cut.index, cut.at_us, cut.run_id, cut.baseline, cut.run_baseline) == (
            whole.index, whole.at_us, whole.run_id, whole.baseline, whole.run_baseline
        )  # fmt: skip


def test_only_the_real_mediator_can_be_stopped_by_a_watch() -> None:
    """``until`` reads the decisions from the Mediator's database as they are made; the model
    has no such feed, so it refuses the argument rather than ignore it."""
    from sim.inputs.scenarios import steady

    sc = steady(nodes=1, arrival_rate=0.05, service_rate=0.1, seed=1, runs=5)
    with pytest.raises(ValueError, match="until is the real Mediator's"):
        sim.run(sc, "model", until=lambda made, now_us: True)
