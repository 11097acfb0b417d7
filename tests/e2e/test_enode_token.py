"""Issue 25 §3: the node's token stays out of the process list and out of step logs
(docs/security.md "enode").

``enode --token T`` put the token in ``/proc/PID/cmdline``, readable by every local user, and a
step that ran ``env`` wrote ``MEDIATOR_TOKEN`` into its log — which other clients read, and which
is sealed 0444 on disk. Here real ``enode`` processes serve a real ``mediator serve --tokens``:
with ``--token-file`` the token is in no command line; whether it came from the file or from
``$MEDIATOR_TOKEN``, a step's ``env`` shows the step's own variables and no secret.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.servers import Process, Server, start_server

pytestmark = [pytest.mark.e2e]

NODE_TOKEN = "node-secret-7d1e-0123456789abcdef"
CLIENT_TOKEN = "client-secret-0123456789abcdef"


@pytest.fixture
def server(dsn: str, tmp_path: Path) -> Iterator[Server]:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[[token]]\ntoken = "{NODE_TOKEN}"\nprincipal = "lab"\nrole = "node"\n\n'
        f'[[token]]\ntoken = "{CLIENT_TOKEN}"\nprincipal = "alice"\nrole = "client"\n'
    )
    tokens.chmod(0o600)
    s = start_server(dsn, tmp_path, "--workers", "1", tokens=str(tokens))
    yield s
    assert s.process.stop() == 0


def enode_argv(server: Server, tmp_path: Path, node_id: str, *extra: str) -> list[str]:
    caps = tmp_path / f"{node_id}.json"
    caps.write_text(json.dumps({"board": node_id}))
    return [sys.executable, "-m", "mediator.enode.main", "--url", server.url,
            "--node-id", node_id, "--caps", str(caps), "--poll", "0.1",
            "--keep-dir", str(tmp_path / "keep"), *extra]  # fmt: skip


@pytest.fixture
def enode(server: Server, tmp_path: Path) -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def start(node_id: str, *extra: str, env: dict[str, str] | None = None) -> Process:
        p = Process.start(enode_argv(server, tmp_path, node_id, *extra), env=env)
        started.append(p)
        p.wait_for(re.compile(rf"advertised node {node_id}\b"))
        return p

    yield start
    for p in started:
        p.stop()


def step_log(server: Server, node: Process, node_id: str) -> str:
    """Submit a run whose one step prints its environment on ``node_id``; its sealed log."""
    run = f"env-{node_id}"
    step = {"name": "env", "role": "dut", "uses": "shell", "with": {"cmd": "env"}}
    contract = {"run_id": run, "roles": {"dut": {"board": node_id}}, "steps": [step]}
    auth = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
    with httpx.Client(base_url=server.url, headers=auth, timeout=30) as http:
        assert http.post("/v1/runs", json=contract).status_code == 201
        node.wait_for(re.compile(rf"run {run} settled PASSED"))
        r = http.get(f"/v1/runs/{run}/record/steps/0000-env.log")
        assert r.status_code == 200, r.text
        return r.text


def test_a_token_file_keeps_the_token_out_of_the_process_list_and_step_logs(
    server: Server, enode: Callable[..., Process], tmp_path: Path
) -> None:
    token_file = tmp_path / "node.token"
    token_file.write_text(NODE_TOKEN + "\n")
    token_file.chmod(0o600)
    node = enode("A", "--token-file", str(token_file), env={"MEDIATOR_TOKEN_FILE": ""})
    cmdline = Path(f"/proc/{node.proc.pid}/cmdline").read_bytes()
    assert NODE_TOKEN.encode() not in cmdline
    log = step_log(server, node, "A")
    assert "MEDIATOR_RUN_ID=env-A" in log  # the step's own variables are there
    assert NODE_TOKEN not in log and "MEDIATOR_TOKEN" not in log, log


def test_a_token_from_the_environment_never_reaches_a_step(
    server: Server, enode: Callable[..., Process]
) -> None:
    node = enode("B", env={"MEDIATOR_TOKEN": NODE_TOKEN, "MEDIATOR_URL": "http://x"})
    log = step_log(server, node, "B")
    assert "MEDIATOR_NODE_ID=B" in log
    assert NODE_TOKEN not in log and "MEDIATOR_TOKEN" not in log and "MEDIATOR_URL" not in log


def test_token_on_the_command_line_warns_and_a_shared_token_file_is_refused(
    server: Server, enode: Callable[..., Process], tmp_path: Path
) -> None:
    node = enode("C", "--token", NODE_TOKEN)
    assert any("--token is readable by every local user" in line for line in node.output)
    shared = tmp_path / "shared.token"
    shared.write_text(NODE_TOKEN)
    for mode in (0o644, 0o640):
        shared.chmod(mode)
        p = Process.start(enode_argv(server, tmp_path, "D", "--token-file", str(shared)))
        assert p.proc.wait(timeout=60) == 2
        p.stop()
        text = "".join(p.output)
        assert "chmod 600" in text and "Traceback" not in text and NODE_TOKEN not in text, text


def runctl(server: Server, *argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """A real ``runctl`` process against the tokens server; its status, stdout and stderr."""
    import os
    import subprocess

    base = {k: v for k, v in os.environ.items() if not k.startswith("MEDIATOR_")}
    proc = subprocess.run(
        [sys.executable, "-m", "mediator.cli.runctl", "--url", server.url, *argv],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_runctl_reads_its_token_from_a_private_file_as_enode_does(
    server: Server, tmp_path: Path
) -> None:
    """Issue 25 §3, for runctl too: a client's token had to be on the command line (readable by
    every local user in /proc) or in the environment. ``runctl --token-file`` (or
    ``$MEDIATOR_TOKEN_FILE``) reads it from a 0600 file with enode's own check; ``--token`` still
    works and warns; a file other accounts may read is refused with the fix, the token unsaid."""
    token_file = tmp_path / "client.token"
    token_file.write_text(CLIENT_TOKEN + "\n")
    token_file.chmod(0o600)
    assert runctl(server, "list")[0] == 1  # no token: 401 from a server with tokens
    code, out, err = runctl(server, "list", "--token-file", str(token_file))
    assert (code, err) == (0, ""), err
    assert out == "(none)\n"  # the list, empty: authenticated as the client
    code, _, err = runctl(server, "list", env={"MEDIATOR_TOKEN_FILE": str(token_file)})
    assert (code, err) == (0, ""), err
    code, _, err = runctl(server, "list", "--token", CLIENT_TOKEN)
    assert code == 0 and "--token is readable by every local user" in err, err
    code, _, err = runctl(server, "list", "--token", "x", "--token-file", str(token_file))
    assert code == 2 and "not both" in err, err
    for mode in (0o644, 0o640):
        token_file.chmod(mode)
        code, out, err = runctl(server, "list", "--token-file", str(token_file))
        assert code == 2 and "chmod 600" in err and CLIENT_TOKEN not in out + err, err
