"""Commit, then 500 (issue 11 §5) over the real HTTP app: with the records folder refusing
every write, submit (RUNNING, QUEUED and FAILED outcomes), cancel and result answer what the
database committed; the record work that failed is visible in /healthz and /metrics and done by
a later reaper pass once the folder is usable again."""

from __future__ import annotations

import shutil

import httpx

from mediator import Outcome
from tests.db.conftest import contract


def test_records_folder_refusing_writes_never_turns_a_committed_answer_into_a_500(med, serve):
    # The records root becomes a file: every mkdir and open under it fails (as root too,
    # which a chmod would not stop).
    root = med.records.root
    shutil.rmtree(root)
    root.write_text("not a folder")
    url = serve()
    with httpx.Client(base_url=url, timeout=30) as http:
        node = {"node_id": "X", "capabilities": {"board": "x"}, "instance": "i1"}
        assert http.post("/v1/nodes", json=node).status_code == 200

        running = http.post("/v1/runs", json=contract("running"))
        queued = http.post("/v1/runs", json=contract("queued"))
        failed = http.post("/v1/runs", json=contract("failed", dut={"board": "none"}))
        assert [running.status_code, queued.status_code, failed.status_code] == [201, 202, 422]
        assert [running.json()["state"], queued.json()["state"], failed.json()["state"]] == [
            "RUNNING", "QUEUED", "FAILED"]  # fmt: skip

        cancel = http.post("/v1/runs/queued/cancel")
        assert (cancel.status_code, cancel.json()["verdict"]) == (200, "cancelled")

        [step] = http.get("/v1/nodes/X/work").json()["steps"]
        claim = http.post(f"/v1/runs/running/steps/{step['seq']}/claim", json={"node_id": "X"})
        assert claim.status_code == 200
        result = http.post(
            f"/v1/runs/running/steps/{step['seq']}/result",
            json={"node_id": "X", "attempt": claim.json()["attempt"], "outcome": "pass"},
        )
        assert (result.status_code, result.json()["settled"]) == (200, "PASSED")

        # What the database committed is what every answer said.
        states = {r: http.get(f"/v1/runs/{r}").json()["verdict"] for r in
                  ("running", "queued", "failed")}  # fmt: skip
        assert states == {"running": "pass", "queued": "cancelled", "failed": "rejected"}

        # The record work waiting for a retry is visible, and counted.
        health = http.get("/healthz").json()
        assert (health["status"], health["unsealed"], health["unopened"]) == ("ok", 3, 3)
        metrics = http.get("/metrics").text
        assert "mediator_records_unsealed 3.0" in metrics
        assert 'mediator_record_failures_total{op="seal"} 3.0' in metrics
        assert 'mediator_record_failures_total{op="open"} 3.0' in metrics

        # The folder works again: the next reaper pass does the work; nothing is lost.
        root.unlink()
        root.mkdir()
        med.reap()
        health = http.get("/healthz").json()
        assert (health["unsealed"], health["unopened"]) == (0, 0)
        for run_id in ("running", "queued", "failed"):
            assert med.records.verify(run_id).ok


def test_a_record_left_unopened_by_an_earlier_process_is_opened_at_startup(dsn, clock, tmp_path):
    """issue 11 §5 'retried later (startup, …)': the process that committed a QUEUED run could
    not write its contract.json and then stopped; the next process opens it at startup."""
    from mediator import Mediator
    from tests.db.conftest import advert

    root = tmp_path / "records"
    first = Mediator.connect(dsn, clock=clock, records_root=str(root))
    advert(first, "X")
    first.submit(contract("a"))
    (root / "q").write_text("in the way")  # q's record cannot be opened
    assert first.submit(contract("q")).outcome == Outcome.QUEUED
    assert first.record_backlog()["unopened"] == 1
    first.close()
    (root / "q").unlink()
    second = Mediator.connect(dsn, clock=clock, records_root=str(root))
    try:
        assert second.records.manifest("q")["files"] == ["contract.json"]
        assert second.record_backlog() == {"unsealed": 0, "unopened": 0}
    finally:
        second.close()
