"""issue 16 §6: the scheduler gate's wall time — ``check`` of every built-in scenario at CI scale
on the real Mediator (the committed ``sim-baseline/``), against an embedded PostgreSQL.

Baseline measured in the same run: the same check one case at a time (``--jobs 1``), beside the
default (one case per core). Besides wall time it prints the CPU seconds spent — this process, its
workers and the PostgreSQL server's backends — and the load average, because on a shared machine
the wall time says as much about the neighbours as about the gate: CPU seconds ÷ cores is what the
check needs on an idle machine. Target: ≤ 60 s.

Run: ``.venv/bin/python bench/bench_gate.py [--baseline sim-baseline] [--jobs N]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

from sim.brokers import mediator as engine
from sim.brokers.mediator import server_url
from sim.outputs import gate


def _postmaster_cpu() -> float:
    """CPU seconds of the embedded server: the postmaster's own and that of its exited backends
    (a backend's time is added to the postmaster's ``cutime`` when it exits)."""

    pidfile = next(Path(engine.embedded_cluster().base_dir).rglob("postmaster.pid"))
    pid = int(pidfile.read_text().split()[0])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return sum(int(f) for f in fields[11:15]) / tick  # utime, stime, cutime, cstime


def _own_cpu() -> float:
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(baseline: Path, jobs: int, url: str) -> tuple[float, float, int]:
    load = os.getloadavg()[0]
    cpu0, pg0 = _own_cpu(), _postmaster_cpu()
    t = time.perf_counter()
    report = gate.check(baseline, jobs=jobs, database_url=url)
    wall = time.perf_counter() - t
    cpu = _own_cpu() - cpu0 + _postmaster_cpu() - pg0
    after = os.getloadavg()[0]
    print(f"  jobs={jobs}: {len(report.outcomes)} cases in {wall:.1f} s wall, {cpu:.1f} CPU s "
          f"(load average {load:.1f} → {after:.1f}), exit {report.exit_code}")  # fmt: skip
    for o in report.outcomes:
        print(f"      {o.name:28s} {o.decisions:4d} decisions {o.wall_s:6.1f} s  {o.status}")
    return wall, cpu, report.exit_code


def main() -> None:
    ap = argparse.ArgumentParser(description="issue 16 §6: the gate's wall time at CI scale")
    ap.add_argument("--baseline", default="sim-baseline")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    url = server_url(None)  # the embedded cluster, started before the clock runs
    print(f"sim check --baseline {args.baseline}, every built-in scenario at CI scale, "
          f"{os.cpu_count()} cores")  # fmt: skip
    base_wall, base_cpu, _ = measure(Path(args.baseline), 1, url)
    wall, cpu, _ = measure(Path(args.baseline), args.jobs, url)
    cores = os.cpu_count() or 1
    print(f"gate, jobs={args.jobs}: {wall:.1f} s wall (target ≤ 60 s); CPU {cpu:.1f} s, i.e. "
          f"≈ {cpu / min(cores, args.jobs):.0f} s on an idle machine")  # fmt: skip
    print(f"baseline, jobs=1: {base_wall:.1f} s wall; CPU {base_cpu:.1f} s")


if __name__ == "__main__":
    main()
