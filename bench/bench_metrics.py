"""What /metrics costs a request (docs/performance.md "Request metrics"): the counter and the
latency histogram each response updates, in prometheus_client's multiprocess mode (what
``mediator serve --workers N`` uses, docs/design.md §19) against plain in-process values (what
``--workers 1`` uses), each in a fresh interpreter of the same run — the library fixes its mode at
import — with the instruments :class:`mediator.api.metrics.Instruments` makes.

Run: ``.venv/bin/python bench/bench_metrics.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

ONE = """
import timeit
from mediator.api.metrics import Instruments
m = Instruments(None)
def one():
    m.requests.labels("GET", "/healthz", "200").inc()
    m.latency.labels("/healthz").observe(0.002)
n = 20000
print(min(timeit.repeat(one, number=n, repeat=7)) / n * 1e6)
"""


def per_request(multiprocess: bool) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as path:
        if multiprocess:
            env["PROMETHEUS_MULTIPROC_DIR"] = path
        out = subprocess.run(
            [sys.executable, "-c", ONE], env=env, capture_output=True, text=True, check=True
        )
    return float(out.stdout)


def main() -> None:
    base = per_request(False)
    multi = per_request(True)
    print(f"in-process (--workers 1):    {base:6.1f} µs per request (counter + histogram)")
    print(f"multiprocess (--workers N):  {multi:6.1f} µs per request ({multi - base:+.1f} µs)")


if __name__ == "__main__":
    main()
