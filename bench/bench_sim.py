"""P4 (docs/performance.md): the simulator on the real Mediator — runs per wall second and virtual
seconds per wall second on ``steady`` (one-step runs), against PostgreSQL.

Baseline measured in the same run: the reference model on the same plan (P5's engine), so the
ratio shows what the database round trips cost. Target: ≥ 300 runs per wall second on 2 cores.

Beside the wall-clock ratio, the same ratio in CPU time, with the real run's CPU split between
the simulation's process and its embedded cluster (the postmaster and every server process, the
exited ones through the postmaster's children's times): where a simulated run's time goes,
client or server. (On a shared virtual machine it swings with the host's load as much as the
wall-clock ratio does: the model's 10-ms samples vary 2–3× in CPU time too.)

Run: ``.venv/bin/python bench/bench_sim.py [--runs 3000]`` (``MEDIATOR_SIM_PIN=0``: without the
simulation's CPU pinning, sim/affinity.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import sim
from sim import scenarios as S


def cluster_cpu_s() -> float:
    """CPU seconds of the simulator's embedded cluster so far: its postmaster, the server processes
    alive now, and those that ended (counted in the postmaster's children's times)."""
    from sim import engine

    tick = os.sysconf("SC_CLK_TCK")
    with open(os.path.join(engine._cluster.base_dir, "data", "postmaster.pid")) as f:
        postmaster = int(f.readline())

    def fields(pid: int) -> list[str]:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        return text[text.rindex(")") + 2 :].split()  # from the state field on

    total = sum(int(x) for x in fields(postmaster)[11:15])  # utime stime cutime cstime
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                f = fields(int(entry))
            except (OSError, ValueError):
                continue  # ended meanwhile
            if int(f[1]) == postmaster:  # ppid
                total += int(f[11]) + int(f[12])
    return total / tick


def main() -> None:
    ap = argparse.ArgumentParser(description="P4: simulator throughput on the real Mediator")
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--model-repeats", type=int, default=9, help="model samples (median)")
    args = ap.parse_args()
    plan = sim.materialize(S.steady(runs=args.runs, seed=1))
    sim.run(S.steady(runs=20, seed=2), progress=False)  # start the embedded cluster first
    t, cpu, server = time.perf_counter(), time.process_time(), cluster_cpu_s()
    result = sim.run(plan, progress=False)
    wall = time.perf_counter() - t
    cpu, server = time.process_time() - cpu, cluster_cpu_s() - server
    # The model runs the same plan in a few tens of milliseconds, where one sample swings by
    # ±30 % (warm-up, a collection, the other core's load): take the median of several.
    walls, cpus = [], []
    for _ in range(args.model_repeats):
        t, c = time.perf_counter(), time.process_time()
        model = sim.run_model(plan)
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    model_wall = statistics.median(walls)
    calls = sum(result.counts[k] for k in ("submit", "advert", "claim", "report", "work", "reap"))
    print(
        f"P4 real Mediator, steady, {args.runs} one-step runs: {args.runs / wall:,.0f} runs/s, "
        f"{result.end_s / wall:,.0f} virtual s per wall s (target ≥ 300 runs/s)"
    )
    print(
        f"   time inside Mediator calls: {result.mediator_s / wall:.0%}; "
        f"{calls / args.runs:.1f} calls per run; {result.counts['wake']} sweeps"
    )
    print(
        f"baseline reference model, same plan: {args.runs / model_wall:,.0f} runs/s "
        f"(median of {len(walls)}; {args.runs / max(walls):,.0f}–{args.runs / min(walls):,.0f})"
    )
    print(f"ratio model / Mediator: {(args.runs / model_wall) / (args.runs / wall):,.0f}×")
    model_cpu = statistics.median(cpus)
    print(
        f"CPU per run: simulation {cpu / args.runs * 1e3:.2f} ms + its server processes "
        f"{server / args.runs * 1e3:.2f} ms; model {model_cpu / args.runs * 1e6:.1f} µs "
        f"(median of {len(cpus)}); ratio {(cpu + server) / model_cpu:,.0f}×"
    )
    diff = sim.promotions_diff(model.promotions, result.promotions, tol_s=1e-6)
    print(f"same promotions as the model: {diff is None}" + (f" ({diff})" if diff else ""))


if __name__ == "__main__":
    main()
