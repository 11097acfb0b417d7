"""Throw-away directories that name their owner, and the removal of those whose owner is gone.

The embedded cluster of ``Mediator.connect()`` / the simulator / a notebook (``/dev/shm``), the
records of a throw-away Mediator and the metrics directory of a multi-worker server (the system's
temporary folder) are all removed by their process when it stops. A process that is killed outright
(SIGKILL, the OOM killer, a notebook kernel shut down) cannot, so each such directory carries its
owner's pid in its name — ``<prefix><pid>-<random>`` — and the next process to make one removes
those whose owner is dead (docs/architecture.md "Throw-away directories").

Only what is certainly an orphan goes: our name pattern, a real directory (not a symlink) owned by
one of the given accounts, its owner pid not alive, and nothing else still using it (the caller's
``in_use``, e.g. a PostgreSQL server still running on it). A pid that is alive — even if reused by
an unrelated process — keeps its directory.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable

log = logging.getLogger("mediator")


def make(prefix: str, parent: str | None = None) -> str:
    """A fresh directory ``<parent>/<prefix><pid>-<random>`` of mode 0700 (``mkdtemp``)."""
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)


def owner(name: str, prefix: str) -> int | None:
    """The owner pid a directory name made by :func:`make` carries, None if not ours."""
    m = re.fullmatch(rf"{re.escape(prefix)}([0-9]{{1,10}})-[A-Za-z0-9_]+", name)
    return int(m.group(1)) if m else None


def alive(pid: int) -> bool:
    """Whether ``pid`` names a live process (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def remove_orphans(
    prefix: str,
    parent: str | None = None,
    uids: Iterable[int] | None = None,
    in_use: Callable[[str], bool] = lambda path: False,
) -> list[str]:
    """Remove ``parent``'s directories made by :func:`make` with ``prefix`` whose owner is dead.

    Args:
        prefix: the prefix given to :func:`make`.
        parent: the folder they are in (default: the system's temporary folder).
        uids: the accounts such a directory may belong to (default: this process's).
        in_use: a last check on a candidate's path; True keeps it.

    Returns:
        The paths removed.
    """
    parent = parent or tempfile.gettempdir()
    accounts = set(uids) if uids is not None else {os.getuid()}
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for name in names:
        pid = owner(name, prefix)
        if pid is None or pid == os.getpid() or alive(pid):
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in accounts or in_use(path):
            continue
        shutil.rmtree(path, ignore_errors=True)  # fd-based: follows no symlink inside
        log.info("removed %s, left by process %d that is gone", path, pid)
        removed.append(path)
    return removed
