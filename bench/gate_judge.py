"""The scheduler gate as one pytest test, for ``bench/bench_mutation.py --gate``: mutmut judges
a mutant of the policy code by running it, so the gate's mutation score is what ``python -m sim
check --baseline sim-baseline`` notices. Not part of the suite (``testpaths`` is ``tests``)."""

from __future__ import annotations

from pathlib import Path

from sim.outputs import gate

ROOT = Path(__file__).resolve().parents[1]


def test_the_gate_finds_every_case_unchanged() -> None:
    report = gate.check(ROOT / "sim-baseline")
    assert report.exit_code == 0, report.text()
