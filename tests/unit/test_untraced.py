"""The statistical tests' tracer pause (tests/untraced.py): the first call traced, the rest not.

It runs under the suite's own coverage when there is one (`scripts/test`), else under a private
measurement started here, so the pause is checked either way.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import coverage

from tests.untraced import traced_once


@contextlib.contextmanager
def measured() -> Iterator[None]:
    if coverage.Coverage.current() is not None:
        yield
        return
    cov = coverage.Coverage(data_file=None)
    cov.start()
    try:
        yield
    finally:
        cov.stop()


def test_only_the_first_call_is_traced_and_the_tracer_comes_back() -> None:
    tracers: list[object] = []
    probe = traced_once(lambda: tracers.append(sys.gettrace()))
    with measured():
        before = sys.gettrace()
        probe()
        probe()
        probe()
        after = sys.gettrace()
    assert before is not None and tracers[0] is not None  # the first call is measured
    assert tracers[1:] == [None, None]  # the repeats are not
    assert after is not None  # and measurement goes on after them
