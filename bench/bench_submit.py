"""P1 (docs/performance.md): submit throughput over HTTP against pgbench on the same server.

One embedded PostgreSQL serves both measurements in the same run:

* baseline — ``pgbench`` TPC-B-like, 2 clients, 2 threads, ``--time`` seconds, on its own database;
* figure — ``mediator serve`` (a separate process, one uvicorn worker) on another database, with
  a lab of ``--nodes`` live nodes (default 100), and 4 client threads POSTing contracts that each go
  straight to RUNNING (201) on a free node until the fleet is leased; then, outside the timing, the
  runs are ended and the nodes freed by SQL, and the next round starts — ``--rounds`` of them. Each
  client asks for its own lane of nodes, so the figure is the 201 path, not lease races (those are
  R2's queue path, measured by the tests).

Target: figure ≥ 0.35 × baseline TPS. Prints one line per figure and the ratio.

Run: ``.venv/bin/python bench/bench_submit.py [--time 10] [--nodes 3000]``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from mediator import Config, Mediator
from mediator.pg import EmbeddedPostgres

READY = re.compile(r"serving on (http://\S+)")


def pgbench_tps(pg: EmbeddedPostgres, seconds: int) -> float:
    db = "pgbench"
    pg.ensure_database(db)
    conn = ["-h", pg.socket_dir, "-p", str(pg.port), "-U", "postgres"]
    subprocess.run(["pgbench", "-i", "-q", "-s", "10", *conn, db], check=True, capture_output=True)
    out = subprocess.run(
        ["pgbench", "-c", "2", "-j", "2", "-T", str(seconds), *conn, db],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    if m is None:
        raise RuntimeError(out)
    return float(m.group(1))


def start_server(dsn: str, workdir: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "mediator.cli.main", "--data", str(workdir / "pg"),
         "--records", str(workdir / "records"), "serve", "--dev", "--port", "0",
         "--database-url", dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={"MEDIATOR_ADVERT_TTL_SECONDS": "3600", "MEDIATOR_LEASE_TTL_SECONDS": "3600",
             "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        m = READY.search(line)
        if m:
            return proc, m.group(1)
    raise RuntimeError("the server did not start")


def submit_round(url: str, per_client: int, clients: int = 4) -> tuple[float, int, int]:
    counts = {"201": 0, "other": 0}
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def client(k: int) -> None:
        # Each client has its own lane of nodes: concurrent submits that all picked the same
        # first free node would lose the lease race and be queued (R2), which is not this path.
        contract = {"roles": {"dut": {"pool": "bench", "lane": k}},
                    "steps": [{"name": "s", "role": "dut"}]}  # fmt: skip
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


def main() -> None:
    ap = argparse.ArgumentParser(description="P1: submit throughput over HTTP vs pgbench")
    ap.add_argument("--time", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    with EmbeddedPostgres() as pg, tempfile.TemporaryDirectory() as tmp:
        baseline = pgbench_tps(pg, args.time)
        print(f"baseline pgbench TPC-B-like -c2 -j2: {baseline:,.0f} TPS")
        pg.ensure_database("p1")
        dsn = pg.dsn("p1")
        cfg = Config(advert_ttl_seconds=3600, lease_ttl_seconds=3600)
        med = Mediator.connect(dsn, cfg, records_root=str(Path(tmp) / "records"))
        for i in range(args.nodes):
            med.advert(f"n{i:05d}", {"pool": "bench", "lane": i % 4}, "i1")
        proc, url = start_server(dsn, Path(tmp))
        elapsed = ok = other = 0
        try:
            for _ in range(args.rounds):
                e, k, o = submit_round(url, per_client=args.nodes // 4)
                elapsed, ok, other = elapsed + e, ok + k, other + o
                free_everything(med)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            med.close()
        tps = ok / elapsed
        print(f"P1 submit over HTTP, 4 clients, 201 RUNNING, fleet of {args.nodes}: "
              f"{tps:,.0f} runs/s ({ok} runs, {args.rounds} rounds, {other} non-201)")  # fmt: skip
        print(f"P1 ratio to pgbench: {tps / baseline:.2f} (target ≥ 0.35)")


if __name__ == "__main__":
    main()
