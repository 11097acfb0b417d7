"""The one way `sim` builds a local process pool (capacity plans, the report, the gate).

Why one module: each caller used to build its own `ProcessPoolExecutor`, and only one of them
knew that a spawned worker imports ``__main__`` again — a plain script without a main guard would
rerun itself in every worker and break the pool (BrokenProcessPool, issue 14 §4) — or that a
process with threads must not fork. Here both rules are written once. Imports no part of `sim`.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import sys
import threading
from concurrent.futures import Executor, ProcessPoolExecutor


def spawn_pool(workers: int | None = None) -> ProcessPoolExecutor:
    """A pool of `workers` spawned processes (None: one per core): each starts clean, with no
    inherited threads, database connections or embedded cluster (the callers that hold those —
    a notebook kernel, the report, the gate — use it)."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def main_is_guarded() -> bool:
    """Whether a spawned worker may import ``__main__`` again without rerunning the caller: true
    in a notebook or a REPL (no script file), or a script with a ``__main__`` guard."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or not str(path).endswith(".py"):
        return True
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return False
    return re.search(r"""^\s*if\s+__name__\s*==\s*['"]__main__['"]\s*:""", text, re.M) is not None


def local_pool(tasks: int) -> Executor | None:
    """A local process pool, one worker per core — or None (run here, one after the other).

    Spawned workers import ``__main__`` again; a plain script without a main guard would rerun
    itself in every worker and break the pool (BrokenProcessPool, issue 14 §4). So: spawn when
    that is safe (notebooks, guarded scripts); else fork when this process has no other thread
    (forking threads is unsafe); else run in-process.
    """
    workers = max(1, min(os.cpu_count() or 1, tasks))
    if workers == 1:
        return None
    if main_is_guarded():
        # Spawned, not forked: a notebook kernel or a test session has threads and open
        # database connections that a forked child would inherit.
        return spawn_pool(workers)
    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    return None
