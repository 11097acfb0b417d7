"""The simulator's CPU claim (sim/affinity.py; docs/performance.md P4): a simulation's loop and its
server processes share one CPU, parallel simulations never share one, and pinning only ever
touches this thread and ``postgres`` processes. Worked examples on the machine's real CPUs."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from typing import Any

import pytest

from sim.affinity import CpuClaim, claim_cpu

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="CPU affinity is a Linux interface"
)


@pytest.fixture(autouse=True)
def private_tmp(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Each test's lock files in its own temporary folder: a simulation running elsewhere on
    the machine (a benchmark) holds no CPU these tests count on."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("MEDIATOR_SIM_PIN", raising=False)
    return tmp_path


def _in_thread(fn: Any) -> Any:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_claims_take_distinct_cpus_until_none_is_left_and_release_restores() -> None:
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        assert claim_cpu() is None  # one CPU: the loop and the server share it already
        return
    held: list[CpuClaim] = []
    barrier = threading.Barrier(len(allowed) + 1)
    seen: dict[int, set[int]] = {}

    def claim_and_hold() -> None:
        c = claim_cpu()
        assert c is not None
        held.append(c)
        seen[c.cpu] = os.sched_getaffinity(0)  # this thread now runs on its CPU only
        barrier.wait(10)  # every CPU claimed at once
        barrier.wait(10)  # until the main thread has tried one more
        c.release()

    threads = [threading.Thread(target=claim_and_hold) for _ in allowed]
    for t in threads:
        t.start()
    barrier.wait(10)
    try:
        assert sorted(c.cpu for c in held) == sorted(allowed)  # distinct CPUs, all of them
        assert all(seen[cpu] == {cpu} for cpu in seen)
        assert claim_cpu() is None  # every CPU is held: the simulation runs unpinned
        assert os.sched_getaffinity(0) == allowed  # and this thread was not moved
    finally:
        barrier.wait(10)
        for t in threads:
            t.join()
    # Released: the locks are free again and a claim succeeds; releasing restores the thread.
    c = claim_cpu()
    assert c is not None and os.sched_getaffinity(0) == {c.cpu}
    c.release()
    c.release()  # twice is harmless
    assert os.sched_getaffinity(0) == allowed


@pytest.mark.slow  # scripts/test --fast leaves it out
def test_a_claim_held_by_another_process_is_respected(private_tmp: Any) -> None:
    """flock works across processes: a CPU another simulation holds is not taken."""
    # (min_cpus=1: on a one-CPU machine the child holds the only CPU and ours is refused)
    allowed = sorted(os.sched_getaffinity(0))
    code = (
        "import sys, tempfile; tempfile.tempdir = sys.argv[1]\n"
        "from sim.affinity import claim_cpu\n"
        "c = claim_cpu(min_cpus=1); print(c.cpu, flush=True); sys.stdin.read()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(private_tmp)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None
        theirs = int(child.stdout.readline())
        mine = _in_thread(lambda: claim_cpu(min_cpus=1))
        if len(allowed) == 1:
            assert mine is None
        else:
            assert mine is not None and mine.cpu != theirs
            mine.release()
    finally:
        child.communicate("")
    assert child.returncode == 0


def test_pin_leaves_a_process_that_is_not_postgres_alone() -> None:
    c = _in_thread(lambda: claim_cpu(min_cpus=1))
    assert c is not None
    other = subprocess.Popen(["sleep", "30"])
    try:
        before = os.sched_getaffinity(other.pid)
        c.pin(other.pid)
        c.pin(2**22 + 12345)  # no such process
        assert os.sched_getaffinity(other.pid) == before
        assert c.pinned == []
    finally:
        other.kill()
        other.wait()
        c.release()


def test_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDIATOR_SIM_PIN", "0")
    before = os.sched_getaffinity(0)
    assert claim_cpu() is None
    assert os.sched_getaffinity(0) == before


def test_one_cpu_is_not_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    assert claim_cpu() is None


@pytest.mark.parametrize("how", ["symlink", "shared", "file"])
def test_a_lock_folder_that_is_not_private_pins_nothing(private_tmp: Any, how: str) -> None:
    """The lock folder's name is predictable: a planted symlink, a world-writable folder or a
    file there makes the simulation run unpinned, with no lock file written through it."""
    path = private_tmp / f"mediator-sim-cpus-{os.getuid()}"
    elsewhere = private_tmp / "elsewhere"
    elsewhere.mkdir()
    if how == "symlink":
        path.symlink_to(elsewhere)
    elif how == "shared":
        path.mkdir()
        path.chmod(0o777)
    else:
        path.write_text("")
    before = os.sched_getaffinity(0)
    assert claim_cpu() is None
    assert os.sched_getaffinity(0) == before
    assert list(elsewhere.iterdir()) == []


def test_a_planted_symlink_as_lock_file_is_not_followed(private_tmp: Any) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    folder = private_tmp / f"mediator-sim-cpus-{os.getuid()}"
    folder.mkdir(mode=0o700)
    target = private_tmp / "victim"
    (folder / f"cpu{allowed[0]}.lock").symlink_to(target)
    c = _in_thread(lambda: claim_cpu(min_cpus=1))
    if len(allowed) == 1:
        assert c is None  # the planted name was the only CPU's: skipped, nothing claimed
    else:
        assert c is not None and c.cpu == allowed[1]  # the planted name is skipped
        c.release()
    assert not target.exists()
