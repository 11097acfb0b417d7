"""The OpenAPI document against the live server, with every schemathesis check (issue 15 §1).

A generated client trusts ``/openapi.json``: each status a route gives must be declared with its
body, each parameter's bounds must be the server's, a 405 must say what is allowed (RFC 9110).
schemathesis reads the document and probes a real ``mediator serve --dev`` (its own process, on
the test's database) with ``--checks all`` — examples, coverage, fuzzing and the stateful phase
that chains calls through the links it infers — and fails on any disagreement, in either
direction: a schema-valid request refused, a schema-violating one accepted, an undeclared status,
a body that does not match its schema, a 5xx.

The seed is fixed and the examples bounded, so a run is repeatable (about 1,300 cases) and takes
under a minute on a quiet machine. ``tests/e2e/schemathesis.toml`` holds the few settings the
API's own rules make right, each with its reason. ``GET /v1/events`` is left out: it is a stream
that stays open until events arrive, which schemathesis would read as a timeout; its parameters
are checked in tests/db/test_api.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.servers import start_server

pytestmark = [pytest.mark.e2e, pytest.mark.db]

CONFIG = Path(__file__).with_name("schemathesis.toml")
SEED = 20261201
MAX_EXAMPLES = 45  # per operation and phase: about 1,300 cases
# --max-time would make fuzzing and the stateful phase repeat until it is spent (a count that
# follows the machine's speed); the examples bound the run and this only stops a hung one.
TIMEOUT_S = 300


def seed_rows(url: str) -> None:
    """A node, a running run, a queued one and an open ask, so stateful chains meet real rows."""
    with httpx.Client(base_url=url) as c:
        caps = {"board": "x"}
        c.post("/v1/nodes", json={"node_id": "X", "capabilities": caps, "instance": "i1"})
        steps = [{"name": "build", "role": "dut", "with": {"cmd": "true"}}]
        for run_id in ("run-a", "run-b"):
            doc = {"run_id": run_id, "roles": {"dut": caps}, "steps": steps}
            assert c.post("/v1/runs", json=doc).status_code in (201, 202)
        ask = {"run_id": "run-q", "roles": {}, "steps": [{"name": "ok", "kind": "ask", "ask": "?"}]}
        assert c.post("/v1/runs", json=ask).status_code == 201


def test_schemathesis_all_checks_pass_against_a_live_server(dsn, tmp_path, capsys):
    # A work poll's `wait` is held while the node has nothing to claim (up to 25 s): generated
    # node ids never have work, so the server here holds a poll for 10 ms at most.
    server = start_server(dsn, tmp_path, env={"MEDIATOR_WORK_WAIT_MAX_SECONDS": "0.01"})
    try:
        seed_rows(server.url)
        started = time.monotonic()
        done = subprocess.run(
            [
                str(Path(sys.executable).with_name("schemathesis")),
                "--config-file", str(CONFIG),
                "run", f"{server.url}/openapi.json",
                "--checks", "all",
                "--phases", "examples,coverage,fuzzing,stateful",
                "--seed", str(SEED),
                "--max-examples", str(MAX_EXAMPLES),
                "--exclude-path", "/v1/events",
                "--generation-database", "none",
                "--workers", "1",
                "--no-color",
            ],
            capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    finally:
        server.process.stop()
    out = done.stdout + done.stderr
    cases = re.search(r"(\d+) generated", out)
    with capsys.disabled():
        tally = cases.group(0) if cases else "no summary"
        print(f"\nschemathesis --checks all, seed {SEED}: {tally}, {elapsed:.0f} s")
    assert done.returncode == 0, out[-20_000:]
    assert cases is not None and int(cases.group(1)) > 500, out[-5_000:]
    assert "Tested: 15" in out  # every operation but the stream
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in out, (phase, out[-5_000:])
