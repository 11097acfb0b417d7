"""P1 (docs/performance.md): submit throughput over HTTP against pgbench on the same server.

One embedded PostgreSQL serves both measurements in the same run:

* baseline — ``pgbench`` TPC-B-like, 2 clients, 2 threads, ``--time`` seconds, on its own database;
* figure — ``mediator serve --workers N`` (a separate process; N = 1 and 2 by default, one figure
  each) on another database, with
  a lab of ``--nodes`` live nodes (default 100), and 4 client threads POSTing contracts that each go
  straight to RUNNING (201) on a free node until the fleet is leased; then, outside the timing, the
  runs are ended and the nodes freed by SQL, and the next round starts — ``--rounds`` of them. Each
  client asks for its own lane of nodes, so the figure is the 201 path, not lease races (those are
  R2's queue path, measured by the tests).

Target: figure ≥ 0.35 × baseline TPS. Prints one line per figure and the ratio. ``--profile DIR``
samples every serving process with py-spy while the rounds run and leaves py-spy's raw stacks in
DIR (``bench/profile_breakdown.py DIR`` sums them by layer: docs/performance.md P1).

``--durable`` runs the cluster as ``mediator serve --data`` does: persistent on the disk (a fresh
folder under /var/tmp, removed at the end) with PostgreSQL's durable defaults, fsync on — the
baseline and the figure both pay one WAL flush per commit. Without it the cluster is the tests'
ephemeral one on tmpfs with fsync off (docs/design.md §19 "The embedded database").

Run: ``.venv/bin/python bench/bench_submit.py [--time 10] [--nodes 3000] [--workers 1 2]
[--durable]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _common import durable_or_ephemeral, pgbench_tps, ratio_line, stop_server
from _common import start_server as _start

from mediator import Config, Mediator

__all__ = ["free_everything", "pgbench_tps", "start_server", "submit_round"]

LONG_TTLS = {"MEDIATOR_ADVERT_TTL_SECONDS": "3600", "MEDIATOR_LEASE_TTL_SECONDS": "3600"}


def start_server(
    dsn: str,
    workdir: Path,
    workers: int = 1,
    env: dict[str, str] | None = None,
    stack: str | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """The server under test: adverts and leases outlive the whole bench."""
    return _start(dsn, workdir, workers=workers, env={**LONG_TTLS, **(env or {})}, stack=stack)


def submit_round(url: str, per_client: int, clients: int = 4) -> tuple[float, int, int]:
    counts = {"201": 0, "other": 0}
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def client(k: int) -> None:
        # Each client has its own lane of nodes: concurrent submits that all picked the same
        # first free node would lose the lease race and be queued (R2), which is not this path.
        contract = {"roles": {"dut": {"pool": "bench", "lane": k}},
                    "steps": [{"name": "s", "role": "dut", "uses": "fail"}]}  # fmt: skip
        with httpx.Client(base_url=url, timeout=30) as http:
            http.get("/healthz")
            barrier.wait()
            for _ in range(per_client):
                r = http.post("/v1/runs", json=contract)
                with lock:
                    counts["201" if r.status_code == 201 else "other"] += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    return elapsed, counts["201"], counts["other"]


def free_everything(med: Mediator) -> None:
    """End every run and free every node by SQL: set-up between rounds, not measured."""
    with med.store.pool.connection() as conn, conn.transaction():
        conn.execute("DELETE FROM leases")
        conn.execute("UPDATE runs SET state = 'PASSED', verdict = 'pass', ended_at = now() "
                     "WHERE state <> 'PASSED'")  # fmt: skip


def measure(
    med: Mediator,
    dsn: str,
    work: Path,
    workers: int,
    rounds: int,
    nodes: int,
    profile: bool,
    stack: str | None = None,
) -> tuple[float, int, int]:
    """HTTP submits per second with ``workers`` server processes (on uvicorn ``stack``, when
    given). With ``profile``, py-spy then samples every serving process during as many rounds
    again (not timed: sampling slows the server) and leaves its raw stacks in ``work``."""
    proc, url = start_server(dsn, work, workers, stack=stack)
    elapsed = ok = other = 0
    try:
        submit_round(url, per_client=4)  # warm-up: imports, prepared statements, pools
        free_everything(med)
        cpu0 = _cpu_seconds(_server_pids(proc))
        for _ in range(rounds):
            e, k, o = submit_round(url, per_client=nodes // 4)
            elapsed, ok, other = elapsed + e, ok + k, other + o
            free_everything(med)
        CPU_PER_RUN.append((_cpu_seconds(_server_pids(proc)) - cpu0) / max(ok, 1))
        if profile:
            tag = f"w{workers}" + (f"-{stack}" if stack else "")
            spies = [_spy(pid, work / f"profile-{tag}-{pid}") for pid in _server_pids(proc)]
            try:
                for _ in range(rounds):
                    submit_round(url, per_client=nodes // 4)
                    free_everything(med)
            finally:
                for spy in spies:
                    spy.send_signal(2)  # py-spy writes its output on SIGINT
                    spy.wait(timeout=60)
    finally:
        stop_server(proc)
    return ok / elapsed, ok, other


# Server CPU seconds per submit, one entry per measure() call: unlike runs/s, it hardly moves
# when other work loads the machine (the serving processes' utime + stime from /proc).
CPU_PER_RUN: list[float] = []


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _server_pids(proc: subprocess.Popen[str]) -> list[int]:
    """The processes that serve: the server itself with one worker, else its workers."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == proc.pid:
            cmd = (stat.parent / "cmdline").read_bytes()
            if b"spawn_main" in cmd:
                kids.append(int(stat.parent.name))
    return kids or [proc.pid]


def _spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw",
         "--output", f"{out}.txt", "--threads", "--idle"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def compare_stacks(
    med: Mediator, dsn: str, work: Path, args: argparse.Namespace, baseline: float
) -> None:
    """Each stack in turn, ``--repeat`` times, one worker: the stacks share the machine's
    moments, so their ratio holds even while others load it."""
    got: dict[str, list[float]] = {s: [] for s in args.stacks}
    cpu: dict[str, list[float]] = {s: [] for s in args.stacks}
    for turn in range(args.repeat):
        for stack in args.stacks if turn % 2 == 0 else args.stacks[::-1]:
            tps, ok, other = measure(
                med, dsn, work, 1, args.rounds, args.nodes, args.profile is not None, stack
            )
            got[stack].append(tps)
            cpu[stack].append(CPU_PER_RUN[-1])
            print(f"turn {turn + 1}, {stack}: {tps:,.0f} runs/s ({ok} runs, {other} non-201), "
                  f"server CPU {1000 * CPU_PER_RUN[-1]:.2f} ms per submit", flush=True)  # fmt: skip
    first = args.stacks[0]
    for stack, rates in got.items():
        med_rate = sorted(rates)[len(rates) // 2]
        print(f"P1 submit over HTTP, --workers 1, {stack}: median {med_rate:,.0f} runs/s; "
              f"{med_rate / baseline:.3f}× pgbench; "
              f"{med_rate / sorted(got[first])[len(got[first]) // 2]:.2f}× {first}; server CPU "
              f"{1000 * sorted(cpu[stack])[len(rates) // 2]:.2f} ms per submit")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description="P1: submit throughput over HTTP vs pgbench")
    ap.add_argument("--time", type=int, default=10, help="pgbench seconds (default: 10)")
    ap.add_argument("--nodes", type=int, default=100, help="fleet size (default: 100)")
    ap.add_argument("--rounds", type=int, default=20, help="rounds per figure (default: 20)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                    help="server worker counts to measure (default: 1 2)")  # fmt: skip
    ap.add_argument("--profile", metavar="DIR", default=None,
                    help="sample the server with py-spy; raw stacks go to DIR")  # fmt: skip
    ap.add_argument("--durable", action="store_true",
                    help="a persistent cluster on the disk, fsync on, as `mediator serve --data` "
                    "runs (default: off: an ephemeral tmpfs cluster, fsync off)")  # fmt: skip

    ap.add_argument(
        "--stacks",
        nargs="+",
        default=None,
        choices=["h11-asyncio", "httptools-uvloop"],
        help="compare uvicorn HTTP stacks instead (one worker), taking turns --repeat times "
        "(default: the server's own stack)",
    )
    ap.add_argument("--repeat", type=int, default=3,
                    help="turns per stack with --stacks (default: 3)")  # fmt: skip
    args = ap.parse_args()
    with durable_or_ephemeral(args.durable) as pg, tempfile.TemporaryDirectory() as tmp:
        print(f"cluster: {pg.kind}")
        baseline = pgbench_tps(pg, args.time)
        print(f"baseline pgbench TPC-B-like -c2 -j2: {baseline:,.0f} TPS")
        pg.ensure_database("p1")
        dsn = pg.dsn("p1")
        cfg = Config(advert_ttl_seconds=3600, lease_ttl_seconds=3600)
        med = Mediator.connect(dsn, cfg, records_root=str(Path(tmp) / "records"))
        for i in range(args.nodes):
            med.advert(f"n{i:05d}", {"pool": "bench", "lane": i % 4}, "i1")
        work = Path(args.profile) if args.profile else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        os.chmod(work, 0o755)
        try:
            if args.stacks:
                compare_stacks(med, dsn, work, args, baseline)
                return
            for workers in args.workers:
                tps, ok, other = measure(
                    med, dsn, work, workers, args.rounds, args.nodes, args.profile is not None
                )
                print(f"P1 submit over HTTP, 4 clients, 201 RUNNING, fleet of {args.nodes}, "
                      f"--workers {workers}: {tps:,.0f} runs/s "
                      f"({ok} runs, {other} non-201)")  # fmt: skip
                print(ratio_line(f"P1 ratio to pgbench, --workers {workers}", tps, baseline, 0.35))
        finally:
            med.close()


if __name__ == "__main__":
    main()
