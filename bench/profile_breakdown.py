"""Where a server's time goes: py-spy's raw stacks (``bench_submit.py --profile DIR``) by layer.

py-spy samples every thread of every serving process, idle or not (``--idle``). A sample counts if
its thread is serving a request at that instant: the event loop thread when it is not waiting in
``select``, a thread-pool thread while it runs a route. Each counted sample is charged to the
first layer found walking from the innermost frame outwards: a thread waiting on PostgreSQL's
socket inside psycopg counts as "PostgreSQL round trips", ``json`` called from the body check
counts as JSON, not as middleware. The shares are of request-serving thread time (wall clock),
so they say where a submit's time goes, waiting included.

Run: ``.venv/bin/python bench/profile_breakdown.py DIR``.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

_PG = r"\(psycopg[/_]|psycopg_pool/|\(psycopg_c"
_JSON = r"\(json/|orjson|limits\.py.*\b(decode|_build|_int|_float|_bad_text)\b"
_FLOWS = r"mediator/(flows|lifecycle|match|contract|states|rows|store|clock)"
_POOL = r"\(anyio/|\(threading\.py|\(queue\.py|\(concurrent/"
LAYERS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("PostgreSQL round trips and psycopg", _PG),
        ("JSON encode/decode", _JSON),
        ("records (files on disk)", r"mediator/records\.py|\(shutil\.py|\(pathlib\.py|\(os\.py"),
        ("Mediator.submit: flows, matcher, contract (Python)", _FLOWS),
        ("auth", r"mediator/api/auth\.py"),
        ("access log (logging)", r"\(logging/"),
        ("the API's routes and middleware", r"mediator/api/"),
        ("FastAPI routing, validation, dependency injection", r"\(fastapi/|\(pydantic"),
        ("Starlette (requests, responses, middleware)", r"\(starlette/"),
        ("thread-pool hand-off (anyio, threading)", _POOL),
        ("uvicorn and h11/httptools (HTTP parsing, ASGI)", r"\(uvicorn/|\(h11/|httptools"),
        ("asyncio event loop", r"\(asyncio/|\(selectors\.py"),
    )
)
_SERVING = re.compile(r"\(mediator/|\(fastapi/|\(starlette/")
# The loop waiting: asyncio's in select(); uvloop's in C, under its caller's last Python frame.
_IDLE_LEAF = re.compile(
    r"\b(select|poll) \((selectors|asyncio/selector_events)\.py|\brun \(asyncio/runners\.py"
)


def classify(stack: str) -> str | None:
    """The layer a sample is charged to, or None if its thread was not serving a request."""
    frames = stack.split(";")
    if "MainThread" in frames[0]:
        if _IDLE_LEAF.search(frames[-1]):
            return None  # the event loop waits for something to do
    elif "AnyIO worker thread" not in frames[0] or not _SERVING.search(stack):
        return None  # an idle pool thread, the database pool's own threads, the listener...
    for frame in reversed(frames):
        for name, pattern in LAYERS:
            if pattern.search(frame):
                return name
    return "other"


def breakdown(paths: list[Path]) -> Counter[str]:
    layers: Counter[str] = Counter()
    for path in paths:
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            layer = classify(stack)
            if layer is not None:
                layers[layer] += int(count)
    return layers


def main() -> None:
    root = Path(sys.argv[1])
    groups: dict[str, list[Path]] = {}
    for p in sorted(root.glob("profile-w*-*.txt")):
        # profile-w<workers>[-<stack>]-<pid>.txt: one group per worker count and stack
        key = p.name.removeprefix("profile-w").rsplit("-", 1)[0]
        groups.setdefault(key, []).append(p)
    for key, paths in groups.items():
        layers = breakdown(paths)
        total = sum(layers.values())
        workers, _, stack = key.partition("-")
        label = f"--workers {workers}" + (f", {stack}" if stack else "")
        print(f"{label}: {total} samples of request-serving threads")
        for name, n in layers.most_common():
            print(f"  {100 * n / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
