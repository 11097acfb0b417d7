"""Throw-away clusters and records leave nothing behind (issue 29 §4, docs/architecture.md
"Throw-away directories").

Every notebook run left a 73–112 MB PostgreSQL folder in /dev/shm: the kernel is shut down
without running its exit handlers, so the cluster's ``atexit`` stop never ran. And
``Mediator.connect()`` + ``close()`` left an empty records folder in /tmp. Here: a real Jupyter
kernel shut down the way nbclient does, a process killed with SIGKILL, and folders a dead process
left — each compared with what must remain.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from mediator import tmpdirs
from mediator.pg import EPHEMERAL_PREFIX, EmbeddedPostgres

# scripts/test --fast leaves it out: clusters of its own, a notebook kernel
pytestmark = [pytest.mark.db, pytest.mark.slow]

SHM = Path("/dev/shm")


def gone(path: Path, timeout: float = 60.0) -> bool:
    """Whether ``path`` disappears within ``timeout`` seconds (another process removes it)."""
    deadline = time.monotonic() + timeout
    while path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_connect_and_close_leave_nothing_in_tmp_or_dev_shm():
    from mediator import Mediator

    mine = f"{os.getpid()}-"
    before = set(os.listdir(tempfile.gettempdir())) | set(os.listdir(SHM))
    med = Mediator.connect()
    records = Path(med.records.root)
    cluster = Path(med.embedded.base_dir)  # type: ignore[union-attr]
    assert records.name.startswith(f"mediator-records-{mine}") and records.is_dir()
    assert cluster.name.startswith(f"{EPHEMERAL_PREFIX}{mine}") and cluster.is_dir()
    med.close()
    after = set(os.listdir(tempfile.gettempdir())) | set(os.listdir(SHM))
    assert not records.exists() and not cluster.exists()
    assert {n for n in after - before if mine in n} == set()


def test_a_cluster_whose_owner_is_killed_is_stopped_and_removed_by_its_watcher():
    """SIGKILL runs no exit handler: the watcher, waiting on a pipe only the owner held, sees it
    close, stops the server and removes the folder."""
    code = (
        "from mediator.pg import EmbeddedPostgres\n"
        "pg = EmbeddedPostgres(database='postgres')\n"
        "print(pg.base_dir, flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        base = Path(owner.stdout.readline().strip())
        assert (base / "data" / "postmaster.pid").exists()
        postmaster = int((base / "data" / "postmaster.pid").read_text().split()[0])
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        owner.stdout.close()  # type: ignore[union-attr]
    assert gone(base)
    assert not tmpdirs.alive(postmaster) or "postgres" not in _cmdline(postmaster)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_a_notebook_kernel_shut_down_leaves_no_cluster_in_dev_shm():
    """The notebook path itself: ``sim.outputs.notebooks.server(None)`` in a real kernel, then the
    kernel shut down as nbclient shuts it down."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        reply = kc.execute_interactive(
            "from sim.outputs.notebooks import server\nprint(server(None))",
            timeout=120,
            output_hook=None,
        )
        assert reply["content"]["status"] == "ok"
        cluster = _kernel_clusters(km)
        assert len(cluster) == 1
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    assert gone(cluster[0])


def _kernel_clusters(km) -> list[Path]:  # type: ignore[no-untyped-def]
    pid = km.provisioner.process.pid
    return [p for p in SHM.glob(f"{EPHEMERAL_PREFIX}{pid}-*")]


def test_folders_a_dead_process_left_are_removed_by_the_next_cluster_and_nothing_else():
    """Only our name, a real directory, a dead owner, and no server running on it."""
    dead = dead_pid()
    orphan = Path(tempfile.mkdtemp(prefix=f"{EPHEMERAL_PREFIX}{dead}-", dir=SHM))
    (orphan / "data").mkdir()
    live = Path(tempfile.mkdtemp(prefix=f"{EPHEMERAL_PREFIX}1-", dir=SHM))  # init is alive
    odd = Path(tempfile.mkdtemp(prefix=f"{EPHEMERAL_PREFIX}x{dead}-", dir=SHM))  # not our shape
    try:
        cluster = EmbeddedPostgres(database="postgres")
        cluster.stop()
        assert not orphan.exists()
        assert live.exists() and odd.exists()
    finally:
        for p in (orphan, live, odd):
            subprocess.run(["rm", "-rf", str(p)], check=False)


def test_a_folder_with_a_server_still_running_on_it_is_kept(tmp_path):
    dead = dead_pid()
    busy = tmp_path / f"{EPHEMERAL_PREFIX}{dead}-busy00"
    idle = tmp_path / f"{EPHEMERAL_PREFIX}{dead}-idle00"
    busy.mkdir()
    idle.mkdir()
    removed = tmpdirs.remove_orphans(EPHEMERAL_PREFIX, str(tmp_path), in_use=lambda p: "busy" in p)
    assert removed == [str(idle)] and busy.exists()
