"""Coverage's tracer paused for repetitions of code a test has already run once.

The statistical tests run the same pure-Python model hundreds of times (seeds, replications).
Under coverage's tracer each pass costs about 2.6 times its CPU (docs/performance.md "Test suite
time"), while coverage needs a line run only once. So these tests run their first repetition
traced and the rest untraced: the same lines are covered, the same assertions made, on the same
results; only the tracer's cost of the repeats is gone. Without coverage (``scripts/test
--fast``, a plain ``pytest``) nothing changes.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from coverage.collector import Collector

P = ParamSpec("P")
T = TypeVar("T")


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """Pause this process's coverage measurement for the block, if one is running.

    An xdist worker runs more than one measurement (coverage's own start in every child process,
    then pytest-cov's), stacked: only the top of coverage's stack of collectors traces, and
    ``Coverage.current()`` need not be it. So the top collector is paused and resumed — coverage's
    own pause, the one ``Coverage.stop``/``start`` use — whoever started it.
    """
    stack = getattr(Collector, "_collectors", None) or []
    top = stack[-1] if stack else None
    if top is None:
        yield
        return
    top.pause()
    try:
        yield
    finally:
        top.resume()


def traced_once(fn: Callable[P, T]) -> Callable[P, T]:
    """`fn`, traced on its first call only: every later call runs with coverage paused."""
    calls = 0

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        nonlocal calls
        calls += 1
        if calls == 1:
            return fn(*args, **kwargs)
        with untraced():
            return fn(*args, **kwargs)

    return wrapper


#: The variables coverage's ``.pth`` reads in a new Python process to start measuring it.
_PROCESS_VARIABLES = ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START")


@contextlib.contextmanager
def untraced_children() -> Iterator[None]:
    """Python processes started in the block run without coverage's tracer (this process keeps
    its own): notebook kernels and the process pools of simulations, which run code the suite
    covers elsewhere, at about twice its CPU when traced. Where a module uses it, the suite's
    coverage was compared with and without: docs/performance.md "Test suite time"."""
    saved = {k: os.environ.pop(k) for k in _PROCESS_VARIABLES if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)
