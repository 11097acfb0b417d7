"""``python -m sim`` (sim.md §10): list, run with --set and --out, and the report's shape."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sim import cli, report
from sim import scenarios as S

pytestmark = pytest.mark.db


@pytest.fixture
def server_url(cluster):
    return cluster.url("postgres")


def test_list_names_every_builtin_scenario(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == list(S.SCENARIOS)


def test_run_with_overrides_writes_tables_and_charts(server_url, tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["run", "steady", "--set", "horizon_runs=40", "--set", "seed=5", "--quiet",
                     "--out", str(out), "--database-url", server_url])  # fmt: skip
    assert code == 0
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 40
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 5
    assert "violations" in capsys.readouterr().out


def test_run_on_the_model_engine(tmp_path, capsys):
    code = cli.main(["run", "burst", "--engine", "model", "--set", "horizon_runs=30",
                     "--out", str(tmp_path / "m")])  # fmt: skip
    assert code == 0 and (tmp_path / "m" / "waits.png").exists()


def test_report_runs_the_cases_and_writes_an_index(server_url, tmp_path, monkeypatch):
    """The main job's shape at the smallest scale: two cases, a table, theory, an index."""
    tiny = {
        "steady": (lambda: S.steady(runs=40, seed=1), lambda: S.steady(runs=40, seed=1)),
        "vanished_node_off": (lambda: S.vanished_node(False), lambda: S.vanished_node(False)),
    }
    monkeypatch.setattr(report, "CASES", tiny)
    monkeypatch.setattr(report, "_render_notebooks", lambda out, scale, url=None: [])
    assert report.main_job(tmp_path / "rep", scale="ci", database_url=server_url) == 0
    table = pd.read_csv(tmp_path / "rep" / "summary.csv")
    assert list(table["scenario"]) == ["steady", "vanished_node_off"]
    assert table["model_agrees"].all() and (table["violations"] == 0).all()
    assert table.set_index("scenario").loc["vanished_node_off", "stuck_s"] == pytest.approx(400)
    index = (tmp_path / "rep" / "index.html").read_text()
    assert "steady/waits.png" in index and "Erlang C" in index


def test_plan_finds_the_smallest_fleet_meeting_a_target(server_url, tmp_path, capsys):
    """python -m sim plan: the grid on the model, a table, the recommendation, a chart."""
    out = tmp_path / "plan"
    code = cli.main(["plan", "steady", "--sizes", "3,4,6", "--wait", "5", "--replications", "2",
                     "--set", "horizon_runs=500", "--out", str(out),
                     "--database-url", server_url])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "3" in text and (out / "plan.html").exists() and (out / "plan.png").exists()
