"""bench/profile_breakdown.py charges a sample to a layer only while its thread serves a request.
On uvloop the loop waits in C, so an idle event loop shows as its caller's last Python frame
(``Runner.run``): that is waiting, not "asyncio event loop" work (docs/performance.md P1)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from profile_breakdown import classify

MAIN = 'thread (0x7F3B2C) "MainThread"'


def test_the_idle_uvloop_loop_is_not_counted() -> None:
    stack = f"{MAIN};<module> (mediator/cli/main.py:737);Runner.run (asyncio/runners.py:118)"
    assert classify(stack) is None


def test_the_idle_asyncio_loop_is_not_counted() -> None:
    stack = f"{MAIN};run_forever (asyncio/base_events.py:607);select (selectors.py:468)"
    assert classify(stack) is None


def test_a_request_parsed_on_the_uvloop_loop_is_charged_to_the_http_layer() -> None:
    stack = (
        f"{MAIN};Runner.run (asyncio/runners.py:118);"
        "data_received (uvicorn/protocols/http/httptools_impl.py:170)"
    )
    assert classify(stack) == "uvicorn and h11/httptools (HTTP parsing, ASGI)"
