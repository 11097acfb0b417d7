"""The embedded PostgreSQL is reachable only by its owner (issue 11 §10, docs/security.md "The
embedded database").

It trusts whoever connects, so no one else may connect: no TCP address at all, and a unix socket
in a directory only the server's account can enter. Once, any local account (``nobody``) got a
superuser session with ``psql -h 127.0.0.1 -U postgres``. And a persistent cluster keeps one
address across restarts, so the address ``mediator serve`` prints stays good.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator

import psycopg
import pytest

from mediator.pg import EmbeddedPostgres, RunAs

# One xdist worker runs the module, so the module-scoped cluster below starts once; scripts/test
# --fast leaves it out (clusters of its own, killed and restarted).
pytestmark = [pytest.mark.db, pytest.mark.xdist_group("embedded_pg"), pytest.mark.slow]

PSQL = shutil.which("psql") or "/usr/bin/psql"
# Another local account: nobody, unless the server itself runs as nobody (no postgres account).
_SERVER = RunAs.pick()
OTHER_UID = 65533 if _SERVER is not None and _SERVER.uid == 65534 else 65534


@pytest.fixture(scope="module")
def pg() -> Iterator[EmbeddedPostgres]:
    cluster = EmbeddedPostgres(database="postgres")
    yield cluster
    cluster.stop()


def psql_as(uid: int | None, conninfo: str) -> subprocess.CompletedProcess[str]:
    argv = [PSQL, "-X", "-At", conninfo, "-c", "SELECT current_user"]
    if uid is not None:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def test_the_owner_connects_over_the_socket_and_nothing_listens_on_tcp(pg):
    with psycopg.connect(pg.dsn()) as con:
        assert con.execute("SHOW listen_addresses").fetchone() == ("",)
        assert con.execute("SELECT inet_server_addr()").fetchone() == (None,)  # a unix socket
    with psycopg.connect(pg.url()) as con:  # the URL form names the same socket
        assert con.execute("SELECT 1").fetchone() == (1,)
    mode = stat.S_IMODE(os.stat(pg.socket_dir).st_mode)
    assert mode == 0o700, oct(mode)


def test_another_local_account_cannot_connect(pg):
    if os.geteuid() != 0:
        # Becoming another account needs root; what keeps one out is then checked directly.
        st = os.stat(pg.socket_dir)
        assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0
        return
    assert psql_as(None, pg.dsn()).stdout.strip() == "postgres"  # the method works for us
    over_socket = psql_as(OTHER_UID, pg.dsn())
    assert over_socket.returncode != 0
    assert "Permission denied" in over_socket.stderr
    over_tcp = psql_as(OTHER_UID, f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres")
    assert over_tcp.returncode != 0
    assert "Connection refused" in over_tcp.stderr or "could not connect" in over_tcp.stderr


def test_a_persistent_cluster_keeps_its_address_across_restarts():
    base = tempfile.mkdtemp(prefix="mediator-pg-stable-")
    try:
        first = EmbeddedPostgres(data_dir=base)
        address = first.dsn()
        with psycopg.connect(address) as con:
            con.execute("CREATE TABLE kept (x int)")
        first.stop()
        again = EmbeddedPostgres(data_dir=base)
        try:
            assert again.dsn() == address and again.url() == first.url()
            with psycopg.connect(address) as con:  # the printed address still works
                assert con.execute("SELECT count(*) FROM kept").fetchone() == (0,)
        finally:
            again.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_restart_right_after_kill_9_waits_for_the_dead_servers_backends():
    """issue 30's crash test, made deterministic: after ``kill -9`` of the postmaster its backends
    live on for a moment, holding the shared memory, and a new server refuses to start
    ("pre-existing shared memory block … is still in use"). A backend is frozen (SIGSTOP) to hold
    that moment open and let go only once the restart has been refused; the restart must wait
    for it, not fail. (The restart runs in this thread: the server is bound to the life of the
    thread that starts it, ``--pdeathsig``.)"""
    import signal
    import threading
    import time
    from pathlib import Path

    base = tempfile.mkdtemp(prefix="mediator-pg-crash-")
    first = EmbeddedPostgres(data_dir=base, database="postgres")
    con = psycopg.connect(first.dsn())
    backend = con.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    log = Path(base) / "_Cluster.log"
    refused = threading.Event()
    done = threading.Event()

    def release_when_refused() -> None:
        # let the frozen backend go once the new server has said why it cannot start
        while not done.is_set():
            if "pre-existing shared memory block" in (log.read_text() if log.exists() else ""):
                refused.set()
                break
            time.sleep(0.05)
        os.kill(backend, signal.SIGCONT)  # it sees its postmaster gone and exits

    os.kill(backend, signal.SIGSTOP)
    watcher = threading.Thread(target=release_when_refused)
    try:
        postmaster = first._pg.child_process
        postmaster.send_signal(signal.SIGKILL)
        postmaster.wait(timeout=30)
        first._pg.child_process = None
        first._release()  # as the killed process's exit would
        log.unlink()
        watcher.start()
        again = EmbeddedPostgres(data_dir=base, database="postgres")
        try:
            assert refused.is_set()  # the first attempt met the backend, and it was waited for
            with psycopg.connect(again.dsn()) as c:
                assert c.execute("SELECT 1").fetchone() == (1,)
        finally:
            again.stop()
    finally:
        done.set()
        if watcher.is_alive() or not watcher.ident:
            os.kill(backend, signal.SIGCONT)
        watcher.join(timeout=30)
        with contextlib.suppress(Exception):
            con.close()
        shutil.rmtree(base, ignore_errors=True)


def test_a_pid_file_naming_a_process_that_is_not_the_server_does_not_block_the_restart():
    """issue 30's crash test met this on a loaded machine: the postmaster killed with ``kill -9``
    lingered as a zombie, PostgreSQL took the pid in its leftover ``postmaster.pid`` (and in the
    socket's lock file) for a live server and refused to start ("lock file … already exists").
    A zombie stands in for it here; no process of the cluster is left, so the restart clears
    both files."""
    import time
    from pathlib import Path

    base = tempfile.mkdtemp(prefix="mediator-pg-zombie-")
    # The server's own account's zombie, as the killed postmaster was: PostgreSQL ignores a pid
    # it may not signal.
    zombie = subprocess.Popen(_SERVER.wrap(["true"]) if _SERVER is not None else ["true"])
    try:
        first = EmbeddedPostgres(data_dir=base, database="postgres")
        pidfile = Path(base) / "data" / "postmaster.pid"
        lines = pidfile.read_text().splitlines(keepends=True)
        first.stop()
        deadline = time.monotonic() + 30
        while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        socket_lock = Path(base) / "tmp" / f".s.PGSQL.{first.port}.lock"
        for leftover in (pidfile, socket_lock):  # the dead server's files, naming the zombie
            leftover.write_text("".join([f"{zombie.pid}\n", *lines[1:]]))
        again = EmbeddedPostgres(data_dir=base, database="postgres")
        try:
            with psycopg.connect(again.dsn()) as c:
                assert c.execute("SELECT 1").fetchone() == (1,)
        finally:
            again.stop()
    finally:
        zombie.wait()
        shutil.rmtree(base, ignore_errors=True)
