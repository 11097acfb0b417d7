"""docs/design.md §4 "Actions" (issue 29 §3): a `uses` that no node can run is refused at submit.

A step with ``"uses": "frobnicate"`` was answered 202/201 and then failed on the node, long after
the caller left, with the reason in a log only the record held. Now each node's daemon advertises
the actions it offers — the built-ins and every plugin installed under the ``mediator.actions``
entry points — and a submit whose plugin ``uses`` no live node able to fill the step's role
offers is answered 422 ``unknown_action`` naming ``steps[i].uses``, writing nothing. Here with
real processes: ``mediator serve``, ``enode`` daemons (one with a real plugin installed as a
package would install it: a ``.dist-info`` with an entry point on the path) and ``runctl``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.servers import Process, Server, start_server

pytestmark = [pytest.mark.e2e]

PLUGIN = """
from mediator.enode.actions import Outcome

def frobnicate(with_, ctx):
    return Outcome("pass", "frobnicated " + str(with_.get("times", 1)) + " times\\n")
"""


@pytest.fixture
def server(dsn: str, tmp_path: Path) -> Iterator[Server]:
    s = start_server(dsn, tmp_path, "--workers", "1")
    yield s
    assert s.process.stop() == 0


def plugin_path(tmp_path: Path) -> Path:
    """A folder holding the package ``labplug`` and its metadata, as pip would install it: the
    plugin action ``frobnicate`` in the entry-point group ``mediator.actions``."""
    site = tmp_path / "site"
    (site / "labplug-1.0.dist-info").mkdir(parents=True, exist_ok=True)
    (site / "labplug.py").write_text(PLUGIN)
    info = site / "labplug-1.0.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: labplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[mediator.actions]\nfrobnicate = labplug:frobnicate\n")
    return site


def enode(server: Server, tmp_path: Path, node_id: str, board: str, path: str = "") -> Process:
    caps = tmp_path / f"{node_id}.json"
    caps.write_text(json.dumps({"board": board}))
    argv = [sys.executable, "-m", "mediator.enode.main", "--url", server.url, "--node-id", node_id,
            "--caps", str(caps), "--poll", "0.1", "--keep-dir", str(tmp_path / "keep")]  # fmt: skip
    env = {"PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH")) if p)}
    p = Process.start(argv, env=env)
    p.wait_for(re.compile(rf"advertised node {node_id}\b"))
    return p


def runctl(server: Server, *argv: str) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "mediator.cli.runctl", "--url", server.url, *argv],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def contract(tmp_path: Path, run_id: str, board: str, uses: str) -> str:
    step = {"name": "go", "role": "dut", "uses": uses, "with": {"times": 3}}
    path = tmp_path / f"{run_id}.json"
    path.write_text(json.dumps({"run_id": run_id, "roles": {"dut": {"board": board}},
                                "steps": [step]}))  # fmt: skip
    return str(path)


def test_a_uses_no_node_offers_is_refused_at_submit_and_one_a_node_offers_runs(
    server: Server, tmp_path: Path
) -> None:
    """Issue 29 §3: ``"uses": "frobnicate"`` was accepted and failed on the node. Refused at
    submit (exit 3, the field named, nothing written) while no node able to fill the role offers
    it — per role: a node of another board that has the plugin does not count — and the same
    submit runs to PASSED once a node of that board with the plugin advertises."""
    plain = enode(server, tmp_path, "plain", "stm32")
    other = enode(server, tmp_path, "other", "nrf52", path=str(plugin_path(tmp_path)))
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            fleet = {n["node_id"]: n for n in http.get("/v1/nodes").json()["nodes"]}
        assert set(fleet) == {"plain", "other"}

        doc = contract(tmp_path, "frob-1", "stm32", "frobnicate")
        code, out, err = runctl(server, "submit", doc)
        assert code == 3, (code, out, err)
        assert "unknown_action" in err and "steps[0].uses" in err, err
        assert "fail, shell, sleep" in err, err  # what the stm32 node does offer
        assert "Traceback" not in err
        assert runctl(server, "status", "frob-1")[0] != 0  # nothing was written
        code, _, err = runctl(server, "submit", "--dry-run", doc)
        assert code == 3 and "unknown_action" in err, err

        # A built-in needs no advertising, and the node with the plugin serves its own board.
        code, out, err = runctl(server, "submit", "--wait",
                                contract(tmp_path, "frob-2", "nrf52", "frobnicate"))  # fmt: skip
        assert code == 0 and "PASSED" in out, (out, err)
        code, out, _ = runctl(server, "logs", "frob-2")
        assert "frobnicated 3 times" in out, out

        # The refused submit, repeated once an stm32 node with the plugin advertises: it runs.
        plug = enode(server, tmp_path, "plug", "stm32", path=str(plugin_path(tmp_path)))
        plain.stop()
        code, out, err = runctl(server, "submit", "--wait", doc)
        assert code == 0 and "PASSED" in out, (out, err)
        plug.stop()
    finally:
        plain.stop()
        other.stop()


def test_enode_adverts_without_actions_to_a_mediator_from_before_them(tmp_path: Path) -> None:
    """Compatibility, the other way: a Mediator whose adverts have no ``actions`` field answers
    400 ``unknown_field`` for it (strict input). The new enode then advertises without it and
    goes on serving, instead of exiting as a node refused for good. The server here is a real
    HTTP server on loopback answering as such a Mediator would (tests/adversarial/hostile.py)."""
    from tests.adversarial.hostile import Answer, Hostile, json_answer, serve

    old = Hostile()

    def advert() -> Answer:
        if b'"actions"' in old.bodies[-1]:
            body = (b'{"error": {"code": "unknown_field", "message": "actions is not a known '
                    b'field; use node_id, label, capabilities, instance, policy.", '
                    b'"field": "actions"}}')  # fmt: skip
            return 400, {"Content-Type": "application/json"}, body
        return json_answer('{"advert_ttl_seconds": 30}')()

    old.routes["POST /v1/nodes"] = advert
    old.routes["/v1/nodes/n1/work"] = json_answer('{"steps": []}')
    old.routes["GET /v1/nodes"] = json_answer('{"nodes": []}')  # a stop looks for its lease
    server, thread = serve(old)
    caps = tmp_path / "caps.json"
    caps.write_text('{"board": "x"}')
    node = Process.start(
        [sys.executable, "-m", "mediator.enode.main", "--url", old.url, "--node-id", "n1",
         "--caps", str(caps), "--keep-dir", str(tmp_path / "keep"), "--poll", "0.05",
         "--stop-grace", "2"],
    )  # fmt: skip
    try:
        node.wait_for(re.compile(r"takes no actions in adverts"))
        node.wait_for(re.compile(r"advertised node n1\b"))
        first, second = (json.loads(b) for b in old.bodies[:2])
        assert first["actions"] == ["fail", "shell", "sleep"] and "actions" not in second
        assert node.stop() == 0
    finally:
        node.stop()
        server.shutdown()
        server.server_close()
        thread.join(10)
