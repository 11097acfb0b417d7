"""Database restart under load (quality.md §4): requests in flight while PostgreSQL is down fail
cleanly (503 with an error body, no stack trace), and the service recovers by itself — no
Mediator restart — with nothing committed lost."""

from __future__ import annotations

import shutil
import tempfile
import time

import httpx
import pytest

from mediator.pg import EmbeddedPostgres
from tests.e2e.servers import start_server

pytestmark = [pytest.mark.e2e, pytest.mark.db]


def wait_for(predicate, timeout: float = 60.0, every: float = 0.2):
    """Poll a condition with a bound (the server reconnects on its own schedule)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not met in time")


def test_requests_fail_cleanly_while_the_database_is_down_and_the_service_recovers(tmp_path):
    # A persistent cluster (it must survive its own stop); under /tmp, which the unprivileged
    # server user can enter (pytest's tmp_path is inside a root-only folder).
    data = tempfile.mkdtemp(prefix="mediator-restart-")
    pg = EmbeddedPostgres(data_dir=data)
    server = start_server(pg.dsn(), tmp_path / "m")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            body = {"node_id": "X", "capabilities": {"board": "x"}, "instance": "i1"}
            assert http.post("/v1/nodes", json=body).status_code == 200
            run = {"run_id": "before", "roles": {"dut": {"board": "x"}},
                   "steps": [{"name": "s", "role": "dut"}]}  # fmt: skip
            assert http.post("/v1/runs", json=run).status_code == 201

            pg._pg.terminate()  # the database goes away under the running service
            for r in (http.post("/v1/runs", json={**run, "run_id": "x"}), http.get("/healthz")):
                assert r.status_code == 503, r.text
                text = r.text.lower()
                assert "traceback" not in text and "psycopg" not in text
            assert r.json() == {"status": "unavailable", "database": "unreachable"}

            pg._pg.start()  # back on the same port; the service was not restarted
            wait_for(lambda: http.get("/healthz").status_code == 200)
            assert http.get("/v1/runs/before").json()["state"] == "RUNNING"  # nothing lost
            assert http.post("/v1/nodes", json=body).status_code == 200  # X advertises again
            again = {**run, "run_id": "after"}
            assert http.post("/v1/runs", json=again).status_code == 202  # X is still busy
    finally:
        server.process.stop()
        pg.stop()
        shutil.rmtree(data, ignore_errors=True)
