"""The committed sim-baseline/ is what this tree records (issue 29 §6): the README says that
re-recording an unchanged tree changes no byte, but five summary.json files were from before the
intervals gained their method (batch means of 5 batches): `python -m sim baseline` rewrote them.
The decisions are what the gate compares; the summaries are what drift mode reads, so a stale one
measures drift against numbers this code never produced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sim.outputs import gate

pytestmark = [
    pytest.mark.db,
    pytest.mark.slow,
]  # scripts/test --fast leaves it out: simulations on the real Mediator

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("case", ["burst"])  # one with intervals, and quick (about 3 s)
def test_re_recording_a_committed_case_changes_no_byte_of_its_decisions_or_summary(
    case: str, cluster: Any, tmp_path: Path
) -> None:
    [written] = gate.record(tmp_path, [case], database_url=str(cluster.url("postgres")))
    committed = ROOT / "sim-baseline" / written.relative_to(tmp_path)
    for name in (gate.DECISIONS, gate.SUMMARY):  # the manifest names this machine's versions
        assert (written / name).read_text() == (committed / name).read_text(), name
