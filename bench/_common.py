"""What the HTTP benchmarks share: a cluster, the pgbench baseline, a ``mediator serve`` process
and its stop, and how a figure is printed beside its baseline.

Every benchmark measures its baseline on the same server in the same run (docs/performance.md):
figures from different runs or machines are never divided.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mediator.pg import EmbeddedPostgres

READY = re.compile(r"serving on (http://\S+)")


@contextlib.contextmanager
def durable_or_ephemeral(durable: bool) -> Iterator[EmbeddedPostgres]:
    """The cluster both measurements share: persistent on the disk (fsync on) or tmpfs."""
    if not durable:
        with EmbeddedPostgres() as pg:
            yield pg
        return
    folder = tempfile.mkdtemp(prefix="mediator-bench-", dir="/var/tmp")
    os.chmod(folder, 0o755)  # the server's unprivileged account enters it when we are root
    try:
        with EmbeddedPostgres(data_dir=os.path.join(folder, "pg")) as pg:
            yield pg
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def pgbench_tps(pg: EmbeddedPostgres, seconds: int, clients: int = 2) -> float:
    """pgbench TPC-B-like (scale 10) on its own database of ``pg``: the baseline TPS."""
    db = "pgbench"
    pg.ensure_database(db)
    conn = ["-h", pg.socket_dir, "-p", str(pg.port), "-U", "postgres"]
    subprocess.run(["pgbench", "-i", "-q", "-s", "10", *conn, db], check=True, capture_output=True)
    out = subprocess.run(
        ["pgbench", "-c", str(clients), "-j", str(clients), "-T", str(seconds), *conn, db],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    if m is None:
        raise RuntimeError(out)
    return float(m.group(1))


def start_server(
    dsn: str,
    workdir: Path | str,
    *,
    workers: int = 1,
    env: dict[str, str] | None = None,
    stack: str | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """``mediator serve --dev`` on ``dsn``, port 0, ``workers`` processes; returns the process
    and its URL once it says it serves. ``env`` adds MEDIATOR_* settings; ``stack`` names the
    uvicorn HTTP stack to run on (``bench/_stack.py``; with one worker), else the server's own."""
    main = ["-m", "mediator.cli.main"]
    if stack is not None:
        main = [str(Path(__file__).with_name("_stack.py")), stack]
    work = Path(workdir)
    with (work / "serve.err").open("w") as err:  # the child keeps its own copy
        proc = subprocess.Popen(
            [sys.executable, *main, "--data", str(work / "pg"),
             "--records", str(work / "records"), "serve", "--dev", "--port", "0",
             "--database-url", dsn, "--workers", str(workers)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        m = READY.search(line)
        if m:
            return proc, m.group(1)
    # say why: a bench that dies with no reason sends people hunting (a missing package, a port)
    tail = (work / "serve.err").read_text(errors="replace").strip().splitlines()[-5:]
    raise RuntimeError("mediator serve exited before it listened:\n" + "\n".join(tail))


def stop_server(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, as an operator would; the server stops its workers and exits."""
    proc.terminate()
    proc.wait(timeout=60)
    if proc.stdout is not None:
        proc.stdout.close()


def ratio_line(label: str, figure: float, baseline: float, target: float | None = None) -> str:
    """``label: 0.123× baseline (target ≥ 0.35)``."""
    goal = f" (target ≥ {target:g})" if target is not None else ""
    return f"{label}: {figure / baseline:.3f}× baseline{goal}"
