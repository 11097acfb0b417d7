"""P5 (docs/performance.md): reference-model throughput on the `steady` scenario, one-step runs.

Prints one line per figure: runs per wall second (target ≥ 50,000) with and without the event
log, the same per CPU second of this process (steadier when other work shares the machine),
virtual seconds per wall second, the plan's own cost, and — because the figures depend on the
machine — a baseline measured in the same run (heap pushes+pops per second, the model's
innermost operation) with each figure's ratio to it. Best of `--repeat` runs, so a busy
neighbour on a shared machine does not decide the figure.

    .venv/bin/python bench/bench_model.py [--runs 100000] [--repeat 3] [--compare main]

`--compare REF` first runs the same figures on the `sim` package of git revision REF (exported
to a temporary folder, in a child process), then on this tree: before and after in one run.
"""

from __future__ import annotations

import argparse
import heapq
import io
import itertools
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable

# the package's own names, so that `--compare` runs on a revision of any layout
from sim import SCENARIOS, materialize, run_model

steady = SCENARIOS["steady"]

TARGET = 50_000


def best(
    fn: Callable[[], object], repeat: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Shortest time of `repeat` calls on `clock` (wall by default)."""
    times = []
    for _ in range(repeat):
        t = clock()
        fn()
        times.append(clock() - t)
    return min(times)


def heap_baseline(n: int = 200_000) -> float:
    """Heap push+pop pairs per second on (time, class, key, seq) tuples."""
    seq = itertools.count()

    def work() -> None:
        heap: list[tuple[int, int, int, int]] = []
        for i in range(n):
            heapq.heappush(heap, (i * 7919 % 100_003, 0, i, next(seq)))
        while heap:
            heapq.heappop(heap)

    return n / best(work, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compare", metavar="REF", help="also measure git revision REF first")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare, args.runs, args.repeat)
        print(f"--- this tree ({os.getcwd()})")

    scenario = steady(runs=args.runs)  # M/M/3, λ=0.2/s, μ=0.1/s
    plan = materialize(scenario)
    virtual_s = run_model(plan, record_events=False).end_s
    base = heap_baseline()

    t_events = best(lambda: run_model(plan), args.repeat)
    t_lean = best(lambda: run_model(plan, record_events=False), args.repeat)
    cpu = time.process_time
    c_events = best(lambda: run_model(plan), args.repeat, cpu)
    c_lean = best(lambda: run_model(plan, record_events=False), args.repeat, cpu)
    t_plan = best(lambda: materialize(scenario), args.repeat)
    t_both = best(lambda: run_model(materialize(scenario)), args.repeat)

    n = args.runs
    figures = [
        ("P5 model runs/s (steady, events recorded)", n / t_events, f"target >= {TARGET:,}"),
        ("P5 model runs/s (steady, no event log)", n / t_lean, f"target >= {TARGET:,}"),
        ("P5 model runs/CPU s (steady, events recorded)", n / c_events, f"target >= {TARGET:,}"),
        ("P5 model runs/CPU s (steady, no event log)", n / c_lean, f"target >= {TARGET:,}"),
        ("P5 model virtual s per wall s (steady, events recorded)", virtual_s / t_events, ""),
        ("materialize runs/s (steady plan)", n / t_plan, ""),
        ("materialize + model runs/s (steady)", n / t_both, ""),
    ]
    print(f"model: {run_model.__module__} from {sys.modules[run_model.__module__].__file__}")
    print(f"baseline heap push+pop pairs/s: {base:,.0f}")
    for label, value, note in figures:
        ok = "" if not note else ("  OK" if value >= TARGET else "  BELOW TARGET")
        tail = f"  ({note}){ok}" if note else ""
        print(f"{label}: {value:,.0f}  ratio to baseline {value / base:.3f}{tail}")


def compare(ref: str, runs: int, repeat: int) -> None:
    """Run this script's figures on revision `ref`'s `sim` package, in a child process."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", ref, "sim"], check=True, capture_output=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        env = {**os.environ, "PYTHONPATH": tmp}
        print(f"--- revision {ref}")
        sys.stdout.flush()
        subprocess.run(
            [sys.executable, "-P", __file__, "--runs", str(runs), "--repeat", str(repeat)],
            check=True,
            env=env,
        )


if __name__ == "__main__":
    main()
