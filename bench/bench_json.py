"""What JSON costs the API (docs/performance.md "JSON"): the strict request decoder against
``json.loads`` and ``orjson.loads`` on the same bodies in the same run, and response encoding with
``json.dumps`` against ``orjson.dumps``.

Bodies: a typical one-step contract (what P1 submits), a 100-step contract, the 1 MiB body limit
filled with a 1,000-step contract, and the exact path (a body with a ``\\u0000`` in a result's log,
which must walk the tree). The strict decoder of today is timed beside the one it replaced (kept
here, verbatim in behaviour: pairs kept, then a walk over the whole tree), so the figure is a
before/after on one machine.

Run: ``.venv/bin/python bench/bench_json.py``.
"""

from __future__ import annotations

import json
import timeit
from collections.abc import Callable
from typing import Any

import orjson

from mediator.api import limits


def contract(steps: int) -> bytes:
    return json.dumps(
        {
            "roles": {"dut": {"board": "stm32f4", "pool": "bench", "lane": 3}},
            "steps": [
                {"name": f"s{i}", "role": "dut", "uses": "shell", "with": {"cmd": f"echo {i}"}}
                for i in range(steps)
            ],
        }
    ).encode()


def walk_decode(raw: bytes) -> Any:
    """The decoder before issue 13: every body kept as pairs, then walked."""
    return limits._build(limits._parse(raw.decode("utf-8"), limits._Pairs), "", frozenset())


def per_call_us(fn: Callable[[], Any]) -> float:
    timer = timeit.Timer(fn)
    n, _ = timer.autorange()
    return min(timer.repeat(5, n)) / n * 1e6


def main() -> None:
    bodies = {
        "one-step contract": contract(1),
        "100-step contract": contract(100),
        "1,000-step contract": contract(1000),
    }
    log = json.dumps({"node_id": "n", "attempt": 1, "outcome": "fail", "log": "a\x00b" * 50})
    print(f"{'decode, µs per body':34} {'json':>8} {'orjson':>8} {'strict':>8} {'walked':>8}"
          f" {'strict/json':>12} {'walked/json':>12}")  # fmt: skip
    for name, raw in bodies.items():
        base = per_call_us(lambda raw=raw: json.loads(raw))
        fast = per_call_us(lambda raw=raw: orjson.loads(raw))
        strict = per_call_us(lambda raw=raw: limits.decode(raw))
        walked = per_call_us(lambda raw=raw: walk_decode(raw))
        print(f"{name + f' ({len(raw):,} B)':34} {base:8.1f} {fast:8.1f} {strict:8.1f} "
              f"{walked:8.1f} {strict / base:11.2f}× {walked / base:11.2f}×")  # fmt: skip
    raw = log.encode()
    base = per_call_us(lambda: json.loads(raw))
    strict = per_call_us(lambda: limits.decode(raw, {"log"}))
    print(f"{'result with NUL in log (exact path)':34} {base:8.1f} {'':>8} {strict:8.1f} "
          f"{'':>8} {strict / base:11.2f}×")  # fmt: skip

    run = json.loads(contract(10))
    at = "2026-12-01T00:00:00+00:00"
    listing = {"observed_at": at, "counts": {"queued": 1, "running": 2},
               "runs": [{"run_id": f"r{i}", "state": "PASSED", "contract": run, "created_at": at}
                        for i in range(100)]}  # fmt: skip
    print(f"\n{'encode, µs per body':34} {'json':>8} {'orjson':>8} {'json/orjson':>12}")
    for name, doc in (("a submit's answer", {"run_id": "r1", "state": "RUNNING",
                                             "contract": json.loads(contract(1))}),
                      ("GET /v1/runs, 100 runs", listing)):  # fmt: skip
        slow = per_call_us(lambda doc=doc: json.dumps(doc).encode())
        fast = per_call_us(lambda doc=doc: orjson.dumps(doc))
        print(f"{name:34} {slow:8.1f} {fast:8.1f} {slow / fast:11.2f}×")


if __name__ == "__main__":
    main()
