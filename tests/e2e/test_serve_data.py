"""``mediator serve`` with its own embedded PostgreSQL, as a new user runs it (issues 29, 30).

Real processes on real clusters: the server is ``python -m mediator.cli.main serve`` started in a
folder of its own, the way the README's "Try it by hand" starts it in a fresh clone, and its
cluster lives on the disk, in ``--data`` (default ``./var/pg``).

* A persistent cluster is durable: ``fsync``, ``synchronous_commit`` and ``full_page_writes`` are
  on, and the server says which kind of cluster it started (docs/design.md §19 "The embedded
  database"). Until issue 30 every cluster ran with ``-F`` (fsync off): an OS crash could lose
  committed runs that a sealed record already described.
* Killed outright (``kill -9`` of the postmaster and of the server) right after answering, the
  server restarted on the same ``--data`` still has every run it acknowledged.
* ``serve --dev`` in an empty folder comes up (it once died on a missing ``./var``).
* A second server on the same ``--data`` is refused in one line naming the first one's pid, and
  leaves the first one's cluster and log alone; a port in use is named before any cluster is made.

The folders are made under /tmp with mode 0755: as root the cluster runs as an unprivileged
account, which must be able to enter them (pytest's tmp_path is inside a root-only folder).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.e2e.servers import READY, Process

pytestmark = [pytest.mark.e2e, pytest.mark.db]

DATABASE = re.compile(r"database (host=\S+ port=\d+ user=\S+ dbname=\S+)")
KIND = re.compile(r"embedded PostgreSQL, (.*)")


@pytest.fixture
def home() -> Iterator[Path]:
    """An empty folder the server's account can enter: a fresh clone's top folder."""
    path = Path(tempfile.mkdtemp(prefix="mediator-home-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# Adverts and leases outlive the test however slow the machine: the reaper must not end a run
# between the crash and the look after the restart (the runs' states are compared).
LONG_TTLS = {"MEDIATOR_ADVERT_TTL_SECONDS": "3600", "MEDIATOR_LEASE_TTL_SECONDS": "3600"}


def serve(home: Path, *args: str) -> Process:
    argv = [sys.executable, "-m", "mediator.cli.main", "serve", "--dev", "--workers", "1", *args]
    return Process.start(argv, env=LONG_TTLS, cwd=str(home))


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "mediator.cli.main", "serve", "--dev", "--workers", "1", *args]
    return subprocess.run(argv, cwd=home, capture_output=True, text=True, timeout=120, check=False)


def settings(dsn: str) -> dict[str, str]:
    names = ("fsync", "synchronous_commit", "full_page_writes")
    with psycopg.connect(dsn) as con:
        return {n: con.execute(f"SHOW {n}").fetchone()[0] for n in names}  # type: ignore[index]


def test_serve_dev_in_an_empty_folder_comes_up_and_answers_healthz(home):
    """issue 29 §1: the README's first command, in a fresh clone: no ./var yet."""
    server = serve(home, "--port", "0")
    try:
        url = server.wait_for(READY, timeout=120).group(1)
        assert httpx.get(f"{url}/healthz", timeout=10).json()["status"] == "ok"
        assert (home / "var" / "pg" / "data" / "PG_VERSION").exists()
    finally:
        assert server.stop() == 0
    assert "Traceback" not in "".join(server.output)


def test_a_persistent_cluster_keeps_postgresqls_durable_defaults_and_serve_says_so(home):
    """issue 30: ``serve --data DIR`` runs its cluster with fsync, synchronous_commit and
    full_page_writes on (it ran with ``-F``, fsync off), and prints that it is durable and
    where; an ephemeral cluster (tests, simulations, notebooks) has all three off."""
    from mediator.pg import EmbeddedPostgres

    data = home / "lab"
    server = serve(home, "--data", str(data), "--port", "0")
    try:
        kind = server.wait_for(KIND, timeout=120).group(1)
        dsn = server.wait_for(DATABASE).group(1)
        server.wait_for(READY)
        assert kind == f"persistent and durable (fsync on): {data}"
        durable = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
        assert settings(dsn) == durable
    finally:
        assert server.stop() == 0
    scratch = EmbeddedPostgres(database="postgres")
    try:
        assert scratch.kind.startswith("ephemeral, fsync off")
        assert settings(scratch.dsn()) == {
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
        }
    finally:
        scratch.stop()


def _postmaster(data: Path) -> int:
    return int((data / "data" / "postmaster.pid").read_text().split()[0])


def test_every_acknowledged_run_survives_kill_9_of_the_database_and_the_server(home):
    """issue 30: right after the last answer, ``kill -9`` the postmaster and the server; started
    again on the same ``--data``, the server has every run it answered 201 or 202 for, in the
    state it answered. 40 runs start on 40 nodes and 40 more queue behind them."""
    data = home / "lab"
    nodes, runs = 40, 80
    server = serve(home, "--data", str(data), "--port", "0")
    acknowledged: dict[str, str] = {}
    try:
        url = server.wait_for(READY, timeout=120).group(1)
        with httpx.Client(base_url=url, timeout=30) as http:
            for i in range(nodes):
                body = {"node_id": f"n{i}", "capabilities": {"board": "x"}, "instance": "i"}
                assert http.post("/v1/nodes", json=body).status_code == 200
            for i in range(runs):
                run = {"run_id": f"r{i:03d}", "roles": {"dut": {"board": "x"}},
                       "steps": [{"name": "s", "role": "dut",
                                  "with": {"cmd": "true"}}]}  # fmt: skip
                r = http.post("/v1/runs", json=run)
                assert r.status_code in (201, 202), r.text
                acknowledged[run["run_id"]] = r.json()["state"]
        os.kill(_postmaster(data), signal.SIGKILL)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(timeout=30)
    finally:
        server.stop()
    assert list(acknowledged.values()).count("RUNNING") == nodes

    again = serve(home, "--data", str(data), "--port", "0")
    try:
        url = again.wait_for(READY, timeout=120).group(1)
        with httpx.Client(base_url=url, timeout=30) as http:
            found = {rid: http.get(f"/v1/runs/{rid}").json().get("state") for rid in acknowledged}
    finally:
        assert again.stop() == 0
    assert found == acknowledged


def test_a_second_server_on_the_same_data_directory_is_refused_in_one_line(home):
    """issue 29 §2: the second ``serve`` on the same ``./var/pg`` used to start without a word on
    the first one's cluster (its own postgres died on the lock file, logged in the _Cluster.log
    it overwrote). Now it exits non-zero naming the first's pid and the directory, touching
    neither the first's log nor its service."""
    first = serve(home, "--port", "0")
    try:
        url = first.wait_for(READY, timeout=120).group(1)
        log = home / "var" / "pg" / "_Cluster.log"
        before = log.read_bytes()
        second = run_cli(home, "--port", "0")
        assert second.returncode == 1
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert f"in use by process {first.proc.pid}" in lines[0]
        assert str(home / "var" / "pg") in lines[0] and "--data" in lines[0]
        assert "serving on" not in second.stdout
        assert log.read_bytes() == before
        assert httpx.get(f"{url}/healthz", timeout=10).json()["status"] == "ok"
    finally:
        assert first.stop() == 0


def test_a_port_in_use_is_named_in_one_line_before_any_cluster_is_made(home):
    """issue 29 §5: a whole cluster was created, then ``cannot listen: Address already in use``
    with no port named. Now the port is checked first."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run_cli(home, "--port", str(port))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"mediator: port {port} on 127.0.0.1 is in use (another server?); choose another with "
        "--port, or --port 0 for any free one"
    ]
    assert not (home / "var").exists()  # no cluster was made
