"""``python -m sim`` (design.md §20): list, run with --set and --out, plan, and the report: its
shape and a front page that answers the capacity question (issue 15 §6)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser

import pandas as pd
import pytest

from sim.inputs import scenarios as S
from sim.outputs import cli, report
from sim.studies.plan import plan

# scripts/test --fast leaves it out: simulations on the real Mediator
pytestmark = [
    pytest.mark.db,
    pytest.mark.xdist_group("sim_cli"),
    pytest.mark.slow,
]  # one worker: its module fixtures once


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


# The report at its smallest: two scenarios and the capacity question on the first 1,000 jobs of
# the NASA trace. Run once for the tests below (a minute or two on two cores).
TINY_CASES = {
    "steady": (lambda: S.steady(runs=40, seed=1), lambda: S.steady(runs=40, seed=1)),
    "vanished_node_off": (lambda: S.vanished_node(False), lambda: S.vanished_node(False)),
}
TINY_CAPACITY = {"runs": 1000, "sizes": range(2, 7), "growth": (1.0, 1.5),
                 "growth_span": 4}  # fmt: skip


@pytest.fixture(scope="module")
def report_dir(cluster, tmp_path_factory):
    out = tmp_path_factory.mktemp("rep")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(report, "CASES", TINY_CASES)
        mp.setitem(report.CAPACITY, "ci", TINY_CAPACITY)
        mp.setattr(report, "_render_notebooks", lambda out, scale, url, saved: SAVED.append(saved))
        code = report.main_job(out, scale="ci", database_url=cluster.url("postgres"))
    assert code == 0
    return out


SAVED: list = []  # what the report handed its notebooks: the future of its saved plan


def test_the_report_hands_its_notebooks_its_own_plan_saved(report_dir) -> None:
    """docs/notebooks.md: the capacity notebook shows the report's plan rather than planning the
    same workload again. The folder the notebooks get (once the confirmation is done) holds
    that plan — loaded back, it is the table on the capacity page — and its growth table."""
    import pandas as pd

    import sim

    assert len(SAVED) == 1 and SAVED[0].result(timeout=0) == report_dir / "capacity"
    plan = sim.CapacityPlan.load(report_dir / "capacity" / "plan")
    pd.testing.assert_frame_equal(
        plan.to_frame(), pd.read_csv(report_dir / "capacity" / "plan.csv")
    )
    assert plan.confirmation_check() is not None and plan.confirmation_check().jobs == 1000
    growth = pd.read_csv(report_dir / "capacity" / "growth.csv")
    assert list(growth["growth"]) == [1.0, 1.5]


class Page(HTMLParser):
    """The parts of a report page the tests read: text by element id, table headers and cells,
    links with the images inside them."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.by_id: dict[str, list[str]] = {}
        self.open_ids: list[tuple[str, str]] = []  # (tag, id) of elements with an id, open now
        self.tables: dict[str, dict[str, list]] = {}
        self.table: str | None = None
        self.cell: list[str] | None = None
        self.links: list[dict[str, object]] = []
        self.link: dict[str, object] | None = None
        self.images: list[str] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.open_ids.append((tag, a["id"]))
            self.by_id.setdefault(a["id"], [])
        if tag == "table":
            self.table = a.get("id", "")
            self.tables[self.table] = {"th": [], "rows": []}
        elif tag == "tr" and self.table is not None:
            self.tables[self.table]["rows"].append([])
        elif tag in ("th", "td"):
            self.cell = []
        elif tag == "a":
            self.link = {"href": a.get("href"), "imgs": [], "in": [i for _, i in self.open_ids]}
        elif tag == "img":
            self.images.append(a.get("src"))
            if self.link is not None:
                self.link["imgs"].append(a.get("src"))

    def handle_endtag(self, tag):
        if self.open_ids and self.open_ids[-1][0] == tag:
            self.open_ids.pop()
        if tag in ("th", "td") and self.cell is not None and self.table is not None:
            text = " ".join("".join(self.cell).split())
            if tag == "th" and len(self.tables[self.table]["rows"]) <= 1:
                self.tables[self.table]["th"].append(text)
            self.tables[self.table]["rows"][-1].append(text)
            self.cell = None
        elif tag == "table":
            self.table = None
        elif tag == "a" and self.link is not None:
            self.links.append(self.link)
            self.link = None

    def handle_data(self, data):
        self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)
        for _, i in self.open_ids:
            self.by_id[i].append(data)

    def says(self, element_id: str) -> str:
        return " ".join("".join(self.by_id.get(element_id, [])).split())


def test_report_runs_the_cases_and_writes_an_index(report_dir):
    """The main job's shape at the smallest scale: two cases, a table, theory, an index."""
    table = pd.read_csv(report_dir / "summary.csv")
    assert list(table["scenario"]) == ["steady", "vanished_node_off"]
    assert table["model_agrees"].all() and (table["violations"] == 0).all()
    assert table.set_index("scenario").loc["vanished_node_off", "stuck_s"] == pytest.approx(400)
    index = (report_dir / "index.html").read_text()
    assert "steady/thumb.png" in index and "Erlang C" in index


def test_report_front_page_opens_with_the_capacity_answer(report_dir):
    """issue 15 §6: the answer first — target, recommended fleet, headroom — then the method.

    The recommended fleet is the one sim.plan finds for the same jobs and target, computed here
    independently on the reference model."""
    expected = plan(S.trace(runs=TINY_CAPACITY["runs"]), report.TARGET, TINY_CAPACITY["sizes"],
                    replications=1, confirm_replications=0,
                    executor=ThreadPoolExecutor(1)).recommended  # fmt: skip
    assert expected is not None
    page = Page((report_dir / "index.html").read_text())
    assert page.says("headline") == (
        f"{expected} nodes keep the 95th-percentile queue wait within 10 min on the NASA Ames "
        "iPSC/860 log (1993)."
    )
    answer = page.says("answer")
    assert "Target 95th-percentile wait ≤ 10 min" in answer
    assert f"Recommended fleet {expected} nodes" in answer and "Headroom" in answer
    assert "1,000 jobs" in page.says("method")
    growth = page.tables["growth"]
    assert growth["th"][:3] == ["Load", "Busy nodes on average", "Nodes needed"]
    assert growth["rows"][1][0] == "today (1993)" and growth["rows"][1][2] == str(expected)
    # The answer comes before everything else on the page.
    text = " ".join("".join(page.text).split())
    assert text.index("Recommended fleet") < text.index("Every scenario on the real Mediator")


def test_report_table_speaks_plainly(report_dir):
    """Plain headers, units and intervals; no snake_case and no 1.16e+04 anywhere on the page."""
    page = Page((report_dir / "index.html").read_text())
    table = page.tables["scenarios"]
    assert table["th"] == ["Scenario", "Fleet and load", "Runs", "Mean wait",
                           "95th-percentile wait", "Runs that waited", "Utilization",
                           "Stuck time"]  # fmt: skip
    rows = {r[0]: r for r in table["rows"][1:]}
    assert rows["A node drops out and returns (old design)"][7] == "6.67 min"  # 400 s
    assert rows["Steady load (M/M/3)"][1] == "3 identical nodes; a run every 5 s on average"
    text = " ".join("".join(page.text).split())
    assert not re.search(r"\b[a-z]+_[a-z0-9_]+\b", text), re.findall(r"\b[a-z]+_\w+", text)
    assert not re.search(r"\d[eE][+-]\d", text)
    evidence = page.says("evidence")
    assert "Invariant violations: 0" in evidence and "Model agrees: 2 of 2" in evidence
    assert "Theory agrees: yes" in evidence


def test_the_front_page_confirms_every_job_with_the_largest_per_job_difference(report_dir):
    """issue 28 §2: the confirmation replays every job of the workload on the real Mediator (the
    count is the materialized workload's, not a number typed here) at the recommendation and its
    neighbours, and the answer's second line says so with the per-job difference (0 s: the
    Mediator and the model wait alike, job for job)."""
    from sim.inputs.workload import materialize

    jobs = len(materialize(S.trace(runs=TINY_CAPACITY["runs"])).arrivals)
    page = Page((report_dir / "index.html").read_text())
    rec = int(page.says("headline").split()[0])
    assert page.says("confirmed") == (
        f"Confirmed on the real Mediator and PostgreSQL: all {jobs:,} jobs replayed at "
        f"{rec - 1}, {rec} and {rec + 1} nodes; the largest difference between any job's wait "
        "there and on the reference model is 0 s."
    )
    text = " ".join("".join(page.text).split())
    assert text.index("Confirmed on the real Mediator") < text.index("Target")
    plan_rows = pd.read_csv(report_dir / "capacity" / "plan.csv")
    confirmed = plan_rows[plan_rows["stage"] == "confirm"]
    assert sorted(set(confirmed["size"])) == [rec - 1, rec, rec + 1]
    assert (confirmed["runs"] == jobs).all() and (confirmed["max_abs_diff_s"] == 0).all()


def test_the_front_page_has_no_internal_words_and_says_why_the_growth_waits_jump(report_dir):
    """issue 29 §9: a manager reads it — no "wake 7", "trace" or "batch quantiles"; under the
    growth table, why its waits are not monotone (bursts size the fleet)."""
    page = Page((report_dir / "index.html").read_text())
    text = " ".join("".join(page.text).split())
    for word in (r"\bwake \d", r"\btraces?\b", r"\bbatch (quantiles|means)\b", r"\brecursion\b"):
        assert not re.search(word, text, re.I), (word, re.findall(rf".{{40}}{word}.{{40}}", text))
    assert "Bursts size the fleet, not the average" in page.says("growth-why")


def test_every_thumbnail_links_to_an_existing_page(report_dir):
    """Charts are thumbnails; each links to a page that exists and shows the charts full size."""
    page = Page((report_dir / "index.html").read_text())
    thumbs = [link for link in page.links if "charts" in link["in"]]
    assert len(thumbs) == 3  # the capacity plan and the two scenarios
    for link in thumbs:
        target = report_dir / link["href"]
        assert target.is_file(), link
        assert link["imgs"] and all((report_dir / src).is_file() for src in link["imgs"])
        sub = Page(target.read_text())
        assert sub.images and all((target.parent / src).is_file() for src in sub.images)
        assert any(l["href"] == "../index.html" for l in sub.links)  # noqa: E741


def test_plan_finds_the_smallest_fleet_meeting_a_target(server_url, tmp_path, capsys):
    """python -m sim plan: the grid on the model, a table, the recommendation, a chart."""
    out = tmp_path / "plan"
    code = cli.main(["plan", "steady", "--sizes", "3,4,6", "--wait", "5", "--replications", "2",
                     "--set", "horizon_runs=500", "--out", str(out),
                     "--database-url", server_url])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "3" in text and (out / "plan.html").exists() and (out / "plan.png").exists()
