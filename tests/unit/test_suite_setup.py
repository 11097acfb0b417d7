"""The suite's own machinery (tests/conftest.py, docs/performance.md "The test suite"): the
hypothesis profiles keep CI's example counts, and the session-wide summaries that xdist workers
collect reach the controller whole."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from hypothesis import settings

from tests import conftest

ROOT = Path(__file__).resolve().parents[2]


def test_the_ci_profile_keeps_every_tests_own_example_count() -> None:
    """scripts/test runs the ci profile: hypothesis' default of 100 and each test's own count,
    exactly as written in the test."""
    assert settings.get_profile("ci").max_examples == 100
    previous = settings.get_current_profile_name()
    try:
        settings.load_profile("ci")
        assert [conftest.examples(n) for n in (25, 40, 300, 500)] == [25, 40, 300, 500]
        settings.load_profile("dev")
        assert [conftest.examples(n) for n in (25, 40, 300, 500)] == [5, 8, 60, 100]
    finally:
        settings.load_profile(previous)


def test_the_profile_is_chosen_by_hypothesis_profile() -> None:
    """ci when nothing is said (scripts/test), dev when HYPOTHESIS_PROFILE says so (--fast)."""
    code = "import tests.conftest; from hypothesis import settings; print(settings().max_examples)"
    seen = {}
    for profile in ("", "ci", "dev"):
        env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_PROFILE"}
        if profile:
            env["HYPOTHESIS_PROFILE"] = profile
        probe = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
            check=True,
        )  # fmt: skip
        seen[profile] = int(probe.stdout)
    assert seen == {"": 100, "ci": 100, "dev": 20}


def test_the_workers_summaries_add_up_on_the_controller(monkeypatch) -> None:
    """Two workers' shares: boundary lines from both, attack figures summed per class."""
    monkeypatch.setattr(conftest, "BOUNDARIES", [])
    monkeypatch.setattr(conftest, "FIGURES", {})
    one = {"boundaries": ["3 checked · 0 skipped  rule a"], "figures": {"paths": {"tried": 2}}}
    two = {
        "boundaries": ["1 checked · 1 skipped  rule b"],
        "figures": {"paths": {"tried": 3, "clean": 3}, "text": {"tried": 1, "clean": 1}},
    }
    conftest.merge_summaries(one)
    conftest.merge_summaries(two)
    assert conftest.BOUNDARIES == ["3 checked · 0 skipped  rule a", "1 checked · 1 skipped  rule b"]
    assert {
        "paths": Counter({"tried": 5, "clean": 3}),
        "text": Counter({"tried": 1, "clean": 1}),
    } == conftest.FIGURES


def test_a_group_of_tests_runs_on_one_worker(tmp_path: Path) -> None:
    """``scripts/test`` runs ``--dist loadgroup``: a module marked ``xdist_group`` shares its
    module fixtures (a report, a simulated lab day) only if all its tests reach one worker.
    pytest 9.2 moved the node id xdist 3.8 rewrites for that, and the groups then spread over
    every worker without a word, each worker building the fixtures again (pyproject.toml pins
    pytest below 9.2 for that; this checks the pair in use)."""
    grouped = "\n".join(
        [
            "import os, pytest",
            'pytestmark = pytest.mark.xdist_group("g")',
            "@pytest.mark.parametrize('i', range(8))",
            "def test_grouped(i):",
            "    with open('workers.txt', 'a') as f:",
            "        f.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')",
        ]
    )
    (tmp_path / "test_grouped.py").write_text(grouped + "\n")
    (tmp_path / "test_free.py").write_text(
        "import pytest\n@pytest.mark.parametrize('i', range(16))\ndef test_free(i): pass\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COV", "PYTEST_"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:cov",
         "-n", "2", "--dist", "loadgroup", "-c", "pytest.ini", "test_grouped.py", "test_free.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    workers = (tmp_path / "workers.txt").read_text().split()
    assert len(workers) == 8
    assert len(set(workers)) == 1, Counter(workers)
