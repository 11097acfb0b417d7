"""The CP2 checkpoint of design.md §19 with real processes: ``mediator serve``, ``enode``,
``runctl``.

    runctl submit a.json                 -> 201 · RUNNING
    runctl submit b.json                 -> 202 · QUEUED      (needs the node a holds)
    runctl status <b>                    -> QUEUED
    (a's last result POST has returned)
    runctl status <b>                    -> RUNNING    (the wake is synchronous: no sleep, no retry)
    runctl submit c.json (no such capability) -> 422 · FAILED

Then the HTTP-level tests of docs/design.md §7 against the same kind of real server over real HTTP.
Steps wait on a file the test creates, so "a finishes" happens exactly when the test says so; the
node's log line ``run a settled PASSED`` is written after its result POST returned.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.e2e.servers import READY, Process, Server

pytestmark = [pytest.mark.e2e, pytest.mark.db]


def runctl(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mediator.cli.runctl", "--url", server.url, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def waiting_contract(run_id: str, gate: Path, board: str = "x") -> dict:
    return {
        "run_id": run_id,
        "roles": {"dut": {"board": board}},
        "steps": [
            {
                "name": "flash",
                "role": "dut",
                "uses": "shell",
                "with": {"cmd": f"while [ ! -e {gate} ]; do sleep 0.02; done; echo flashed"},
            }
        ],
    }


@pytest.fixture
def server(tmp_path):
    """``mediator serve --data DIR`` exactly as design.md §19 writes it (issue 15 §2): the options
    after the subcommand, and no --database-url, so the server runs its own persistent embedded
    PostgreSQL in DIR. DIR is outside pytest's root-only tmp_path so the unprivileged server user
    can enter it; tmpfs when there is one, to keep initdb quick."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    data = tempfile.mkdtemp(prefix="mediator-cp2-", dir=shm)
    argv = [
        sys.executable,
        "-m",
        "mediator.cli.main",
        "serve",
        "--data",
        data,
        "--records",
        str(tmp_path / "records"),
        "--dev",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]
    process = Process.start(argv)
    try:
        url = process.wait_for(READY, timeout=60).group(1)
        yield Server(url, process, tmp_path / "records")
    finally:
        process.stop()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def enode(server, tmp_path):
    started: list[Process] = []

    def start(node_id: str, caps: dict) -> Process:
        caps_file = tmp_path / f"{node_id}.json"
        caps_file.write_text(json.dumps(caps))
        p = Process.start(
            [sys.executable, "-m", "mediator.enode.main", "--url", server.url,
             "--node-id", node_id, "--caps", str(caps_file), "--poll", "0.1"]
        )  # fmt: skip
        p.wait_for(re.compile(rf"advertised node {node_id}\b"))
        started.append(p)
        return p

    yield start
    for p in started:  # nodes before the server, so none keeps retrying a gone server
        p.stop()


def test_cp2_checkpoint_with_real_processes(server, enode, tmp_path):
    node = enode("X", {"board": "x"})
    a_gate, b_gate = tmp_path / "a.go", tmp_path / "b.go"
    for name, doc in {
        "a.json": waiting_contract("run-a", a_gate),
        "b.json": waiting_contract("run-b", b_gate),
        "c.json": waiting_contract("run-c", b_gate, board="no-such-board"),
    }.items():
        (tmp_path / name).write_text(json.dumps(doc))

    a = runctl(server, "submit", str(tmp_path / "a.json"))
    assert (a.returncode, a.stdout.splitlines()[:2]) == (0, ["201 · RUNNING", "run-a"])
    b = runctl(server, "submit", str(tmp_path / "b.json"))
    assert (b.returncode, b.stdout.splitlines()[:2]) == (0, ["202 · QUEUED", "run-b"])
    status = runctl(server, "status", "run-b")
    assert status.stdout.splitlines()[0] == "QUEUED"

    a_gate.touch()  # a's only step finishes; the node reports it
    node.wait_for(re.compile(r"run run-a settled PASSED"))
    status = runctl(server, "status", "run-b")  # no sleep, no retry: the wake was synchronous
    assert status.stdout.splitlines()[0] == "RUNNING"

    c = runctl(server, "submit", str(tmp_path / "c.json"))
    assert c.returncode == 3
    assert c.stdout.splitlines()[:2] == ["422 · FAILED", "run-c"]
    assert "NO_CANDIDATE" in c.stdout

    b_gate.touch()
    node.wait_for(re.compile(r"run run-b settled PASSED"))
    listing = runctl(server, "--json", "list")
    states = {r["run_id"]: r["state"] for r in json.loads(listing.stdout)["runs"]}
    assert states == {"run-a": "PASSED", "run-b": "PASSED", "run-c": "FAILED"}


# ---- docs/design.md §7 over real HTTP, against a real server process ---------------------------


def advert(http: httpx.Client, node_id: str, drain: str = "") -> None:
    body = {"node_id": node_id, "capabilities": {"board": "x"}, "instance": "i1",
            "policy": {"drain": drain}}  # fmt: skip
    http.post("/v1/nodes", json=body).raise_for_status()


def finish(http: httpx.Client, run_id: str, node_id: str = "X") -> None:
    steps = http.get(f"/v1/nodes/{node_id}/work").json()["steps"]
    step = next(s for s in steps if s["run_id"] == run_id)
    base = f"/v1/runs/{run_id}/steps/{step['seq']}"
    claimed = http.post(f"{base}/claim", json={"node_id": node_id}).json()
    body = {"node_id": node_id, "attempt": claimed["attempt"], "outcome": "pass"}
    r = http.post(f"{base}/result", json=body)
    r.raise_for_status()


def simple(run_id: str, board: str = "x") -> dict:
    return {"run_id": run_id, "roles": {"dut": {"board": board}},
            "steps": [{"name": "s", "role": "dut", "with": {"cmd": "true"}}]}  # fmt: skip


def test_seed_000_http_list_against_a_real_server(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        advert(http, "X")
        assert http.post("/v1/runs", json=simple("a")).status_code == 201
        # 409 situation → 202, QUEUED, no assigned, no reject
        b = http.post("/v1/runs", json=simple("b"))
        assert b.status_code == 202
        assert b.json()["state"] == "QUEUED" and not {"assigned", "reject"} & set(b.json())
        # 422 stays 422 · FAILED
        c = http.post("/v1/runs", json=simple("c", board="none"))
        assert (c.status_code, http.get("/v1/runs/c").json()["state"]) == (422, "FAILED")
        # resubmitting the QUEUED run → 200 + the existing run
        again = http.post("/v1/runs", json=simple("b"))
        assert (again.status_code, again.json()["state"]) == (200, "QUEUED")
        # dry run unchanged with a draining node
        before = http.post("/v1/runs?dry_run=true", json=simple("d")).json()
        advert(http, "X", drain="graceful")
        assert http.post("/v1/runs?dry_run=true", json=simple("d")).json() == before
        advert(http, "X", drain="")  # wake 6: nothing to promote, X still holds a
        # GET /v1/runs?state=QUEUED lists the row
        queued = http.get("/v1/runs", params={"state": "QUEUED"}).json()["runs"]
        assert [r["run_id"] for r in queued] == ["b"]
        # postResult → the waiting run is RUNNING
        finish(http, "a")
        assert http.get("/v1/runs/b").json()["state"] == "RUNNING"
        # postCancel → the waiting run is RUNNING
        assert http.post("/v1/runs", json=simple("e")).status_code == 202
        assert http.post("/v1/runs/b/cancel").json()["verdict"] == "cancelled"
        assert http.get("/v1/runs/e").json()["state"] == "RUNNING"
