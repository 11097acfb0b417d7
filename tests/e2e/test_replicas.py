"""Replicas (docs/performance.md): three ``mediator serve`` processes on one database, concurrent
submitters and node daemons over HTTP for a bounded time, one Mediator killed with SIGKILL midway.

Afterwards, by SQL: no node was ever leased to two runs at once, every accepted run_id is there,
every terminal run's record is sealed exactly once, and nothing is stuck (no QUEUED run that a
free live node could serve). Load is paced with bounded waits (simulated step durations), never
used as synchronisation: the test waits on conditions it reads back from the database.
"""

from __future__ import annotations

import itertools
import json
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import pytest

from mediator import Mediator
from tests.e2e.servers import Server, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.db]

FAST = {
    "MEDIATOR_RENEW_SECONDS": "1",
    "MEDIATOR_ADVERT_TTL_SECONDS": "4",
    "MEDIATOR_LEASE_TTL_SECONDS": "6",
}
CLASSES = ({"board": "a"}, {"board": "b"}, {"scope": True})


class Fleet:
    """HTTP clients that fail over between live servers."""

    def __init__(self, servers: list[Server]) -> None:
        self.urls = [s.url for s in servers]
        self.dead: set[str] = set()

    def post(self, http: httpx.Client, path: str, body: dict) -> httpx.Response | None:
        return self._call(http, "POST", path, body)

    def get(self, http: httpx.Client, path: str) -> httpx.Response | None:
        return self._call(http, "GET", path, None)

    def _call(self, http: httpx.Client, method: str, path: str, body: dict | None):
        for url in random.sample(self.urls, len(self.urls)):
            if url in self.dead:
                continue
            try:
                return http.request(method, url + path, json=body, timeout=10)
            except httpx.TransportError:
                self.dead.add(url)
        return None


def node_loop(fleet: Fleet, node_id: str, caps: dict, stop: threading.Event) -> None:
    instance = f"{node_id}-1"
    rng = random.Random(node_id)
    with httpx.Client() as http:
        last_advert = 0.0
        while not stop.is_set():
            if time.monotonic() - last_advert > 1.0:
                fleet.post(http, "/v1/nodes", {"node_id": node_id, "capabilities": caps,
                                               "instance": instance})  # fmt: skip
                last_advert = time.monotonic()
            r = fleet.get(http, f"/v1/nodes/{node_id}/work")
            steps = r.json()["steps"] if r is not None and r.status_code == 200 else []
            if not steps:
                stop.wait(0.05)  # idle poll interval
                continue
            s = min(steps, key=lambda s: s["seq"])
            base = f"/v1/runs/{s['run_id']}/steps/{s['seq']}"
            c = fleet.post(http, f"{base}/claim", {"node_id": node_id, "instance": instance})
            if c is None or c.status_code != 200:
                continue
            stop.wait(rng.uniform(0.02, 0.15))  # the step's simulated duration
            result = {"node_id": node_id, "instance": instance, "attempt": c.json()["attempt"],
                      "outcome": "pass"}  # fmt: skip
            fleet.post(http, f"{base}/result", result)


def submit_loop(fleet: Fleet, k: int, stop: threading.Event, accepted: dict[str, int]) -> None:
    rng = random.Random(k)
    with httpx.Client() as http:
        for i in itertools.count():
            if stop.is_set():
                return
            run_id = f"s{k}-{i:04d}"
            needs = rng.choice(CLASSES)
            doc = {"run_id": run_id, "roles": {"dut": needs},
                   "steps": [{"name": "t", "role": "dut", "uses": "fail"}]}  # fmt: skip
            r = fleet.post(http, "/v1/runs", doc)
            if r is not None and r.status_code in (200, 201, 202, 422):
                accepted[run_id] = r.status_code
            stop.wait(rng.uniform(0.01, 0.06))  # pacing of the load


def test_three_replicas_one_killed_midway(dsn, tmp_path):
    shared = tmp_path / "records"  # one records root for every Mediator process (§7.7)
    # Two workers each, as before the test session's one-worker default: SIGKILL of the
    # supervisor leaves its workers to finish the requests in flight for up to a second. With
    # one worker the kill lands mid-request, and this test's nodes drop a claim or result whose
    # answer is lost, so a run can stay RUNNING (seen once under the whole suite's load).
    servers = [
        start_server(dsn, tmp_path / f"m{i}", "--workers", "2", env=FAST, records=shared)
        for i in range(3)
    ]
    fleet = Fleet(servers)
    stop_nodes, stop_load = threading.Event(), threading.Event()
    accepted: dict[str, int] = {}
    nodes = [
        threading.Thread(target=node_loop, args=(fleet, f"n{i}", caps, stop_nodes))
        for i, caps in enumerate(
            [
                CLASSES[0],
                CLASSES[0],
                CLASSES[1],
                CLASSES[1],
                CLASSES[2],
                {"board": "a", "scope": True},
            ]
        )
    ]
    submitters = [
        threading.Thread(target=submit_loop, args=(fleet, k, stop_load, accepted)) for k in range(3)
    ]
    try:
        for t in nodes + submitters:
            t.start()
        med = Mediator.connect(dsn, records_root=str(shared), startup_wake=False)
        try:
            deadline = time.monotonic() + 30
            while len(accepted) < 60 and time.monotonic() < deadline:
                stop_load.wait(0.1)
            servers[0].process.proc.send_signal(signal.SIGKILL)  # midway, mid-flight
            servers[0].process.proc.wait(timeout=10)
            target = len(accepted) + 60
            while len(accepted) < target and time.monotonic() < deadline + 30:
                stop_load.wait(0.1)
            stop_load.set()
            for t in submitters:
                t.join(timeout=30)
            # Drain: every run ends (bounded), then the nodes stop.
            drain_deadline = time.monotonic() + 60
            while time.monotonic() < drain_deadline:
                left = med.query(
                    "SELECT count(*) AS n FROM runs WHERE state IN ('QUEUED','RUNNING')"
                )
                if left[0]["n"] == 0:
                    break
                stop_nodes.wait(0.2)
            stop_nodes.set()
            for t in nodes:
                t.join(timeout=30)
            for s in servers[1:]:  # graceful: their last reaper passes seal what is left
                s.process.stop()
            med.seal_unsealed()  # what a restart would do (docs/design.md §12)
            check(med, accepted, shared)
            codes = dict(sorted(Counter(accepted.values()).items()))
            by_verdict = "SELECT verdict, count(*) AS n FROM runs GROUP BY verdict ORDER BY 1"
            verdicts = {r["verdict"]: r["n"] for r in med.query(by_verdict)}
            print(f"\nreplicas: {len(accepted)} runs accepted {codes}, verdicts {verdicts}, "
                  f"one of three Mediators killed with SIGKILL midway")  # fmt: skip
        finally:
            med.close()
    finally:
        stop_load.set()
        stop_nodes.set()
        for s in servers:
            s.process.stop()


def check(med: Mediator, accepted: dict[str, int], records: Path) -> None:
    assert len(accepted) >= 100
    # Every accepted run_id is there.
    present = {r["run_id"] for r in med.query("SELECT run_id FROM runs")}
    assert set(accepted) <= present
    # No node ever leased twice at once: lease intervals per node never overlap.
    events = med.query(
        "SELECT id, node_id, run_id, kind FROM events "
        "WHERE kind IN ('lease_granted', 'lease_released') ORDER BY id"
    )
    holder: dict[str, str | None] = defaultdict(lambda: None)
    for e in events:
        if e["kind"] == "lease_granted":
            assert holder[e["node_id"]] is None, f"{e['node_id']} leased twice: {e}"
            holder[e["node_id"]] = e["run_id"]
        elif holder[e["node_id"]] == e["run_id"]:
            holder[e["node_id"]] = None
    # Every run ended, and every terminal run's record is sealed exactly once.
    states = med.query("SELECT state, count(*) AS n FROM runs GROUP BY state")
    assert {r["state"] for r in states} <= {"PASSED", "FAILED"}, states
    terminal = [r["run_id"] for r in med.query("SELECT run_id FROM runs WHERE sealed")]
    assert len(terminal) == len(present)
    for run_id in terminal:
        seal = json.loads((records / run_id / "seal.json").read_text())
        assert seal["run_id"] == run_id
        assert med.records.verify(run_id).ok
    # Nothing stuck: no run left QUEUED (the drain ended with none), no lease outlives its run.
    assert med.query("SELECT node_id FROM leases l JOIN runs r USING (run_id) "
                     "WHERE r.state <> 'RUNNING'") == []  # fmt: skip
