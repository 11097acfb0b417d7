"""One CPU for a simulation's loop and its database server processes (docs/performance.md, P4).

A simulation on the real Mediator is a strict ping-pong: the loop sends a statement and waits, the
server process works and answers, never both at once. When the two sit on different CPUs, every
hand-off is a cross-CPU wake-up; on a virtual machine that costs about 100 µs (measured here: a
prepared ``SELECT 1`` takes 125 µs across two CPUs and 24 µs on one), and a simulated run makes
about seven round trips. On one CPU the hand-off is an ordinary context switch, and nothing is lost
because nothing ran in parallel.

Parallel simulations (the gate's processes, Dask workers, threads) must not share a CPU, so each
claims one with an exclusive ``flock`` on a lock file per CPU in a private directory; the lock
goes with the process (or with :meth:`CpuClaim.release`). When every allowed CPU is claimed, or
the machine has one CPU, or the platform cannot pin, or the lock directory is not private,
nothing is pinned and the simulation runs as before — pinning is a speed-up, never a condition.

Only processes on this machine are pinned: the store calls the hook only for unix-socket
connections, and a pid is pinned only if it names a ``postgres`` process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from dataclasses import dataclass, field

log = logging.getLogger("sim")

_ENV = "MEDIATOR_SIM_PIN"  # "0" turns pinning off (to measure without it, or on a shared host)


@dataclass
class CpuClaim:
    """A CPU this thread holds: the loop runs on it, and so does every pinned server process."""

    cpu: int
    _fd: int
    _previous: set[int]
    pinned: list[int] = field(default_factory=list)

    def pin(self, pid: int) -> None:
        """Pin server process ``pid`` to the claimed CPU (a ``postgres`` process only)."""
        try:
            with open(f"/proc/{int(pid)}/comm", encoding="ascii", errors="replace") as f:
                name = f.read().strip()
        except OSError:
            return  # gone already, or no /proc: nothing to pin
        if not name.startswith("postgres"):
            return  # not a server process of ours: leave it alone
        try:
            os.sched_setaffinity(pid, {self.cpu})
        except OSError as exc:  # another account's process without the right to move it
            log.debug("cannot pin server process %s to CPU %s: %s", pid, self.cpu, exc)
            return
        self.pinned.append(pid)

    def release(self) -> None:
        """Give the CPU back: this thread may run anywhere again, the lock is dropped. (The
        pinned server processes end with their connections.)"""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, self._previous)
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = -1


def _lock_dir() -> str | None:
    """A directory only this account can write, for the per-CPU lock files; None if the name
    is taken by something else (a symlink, another account's directory)."""
    path = os.path.join(tempfile.gettempdir(), f"mediator-sim-cpus-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        log.warning("not pinning the simulation: %s is not a private directory", path)
        return None
    return path


def claim_cpu(min_cpus: int = 2) -> CpuClaim | None:
    """Claim a free CPU among those this thread may use and move the thread onto it; None when
    pinning is off, impossible, or every CPU is claimed by another simulation.

    ``min_cpus``: pin only when this thread may use at least that many CPUs. With one, the loop
    and the server share it already and pinning gains nothing, so simulations keep the default;
    the tests pass 1 to exercise the claim itself on any machine."""
    if os.environ.get(_ENV, "1") == "0" or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except OSError:
        return None
    if len(allowed) < max(min_cpus, 1):
        return None  # one CPU: the loop and the server share it already
    folder = _lock_dir()
    if folder is None:
        return None
    import fcntl

    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    for cpu in allowed:
        try:
            fd = os.open(os.path.join(folder, f"cpu{cpu}.lock"), flags, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # another simulation holds this CPU
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError:
            os.close(fd)
            return None
        return CpuClaim(cpu, fd, set(allowed))
    return None
