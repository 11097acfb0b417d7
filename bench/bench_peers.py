"""The Mediator beside its peers on this one host: Slurm and labgrid's coordinator (issue 28).

Every figure is measured in the same run, the peers taking turns sample by sample (alternating),
and printed with its ratio to the Mediator's: the machine is shared, so only ratios taken side by
side mean anything (docs/performance.md "Beside its peers").

What runs:

* **mediator** — ``mediator serve --workers 1`` on an embedded PostgreSQL (tmpfs, ``fsync=off``:
  the test and bench cluster; ``--durable`` runs it as ``mediator serve --data DIR`` does, on the
  disk with PostgreSQL's durable defaults) with ``--nodes`` real ``enode`` processes
  (capabilities ``{"pool": "bench"}``; idle, each holds a long poll the server answers when it
  has work, and ``--poll`` is its pace only against a server that holds none) and one more
  enode (``{"pool": "busy"}``) held by a run that never ends, which the queued runs wait for.
  A measured run is one ``shell`` step: it notes its start time, blocks on a FIFO the bench
  writes to release it, and notes its end time.
* **slurm** — ``munged``, ``slurmctld`` and ``slurmd`` from the system's packages (Debian's
  ``slurm-wlm``), on one node with ``--nodes`` boards as a GRES (``board``) and one ``busy``
  GRES held by a job that never ends; a job is ``sbatch --gres=board:1 --wrap <the same script>``;
  the queued jobs wait in a partition of their own for that job to end (``--dependency``; see
  :meth:`SlurmPeer.fill` for why not for the host).
  Measured twice: with the package's default scheduler settings, and tuned (``--slurm tuned``;
  the set is ``SLURM_TUNED`` below).
* **labgrid** — ``labgrid-coordinator`` (gRPC) from PyPI, in its own venv that this script makes
  (``.bench/labgrid-venv``); ``--nodes`` places tagged ``pool=bench`` and one ``pool=busy`` place
  kept acquired. Submitting is creating a reservation; a run starts when the client's
  AcquirePlace of its allocated place returns; a release is ReleasePlace + CancelReservation.
  labgrid has no executor, so its "start" is the lease itself, with no process started.

Figures (each at every ``--depths`` queue depth — that many items already waiting for the busy
resource, which no measured item can use):

* submit throughput, 1 and 4 client processes (Mediator: HTTP POSTs; Slurm: ``sbatch`` runs;
  labgrid: CreateReservation calls) of items that queue;
* submit → start on an idle node: from the submit call to the step's (job's) first command
  (``--settle S``: after S seconds of quiet, so the node is idle rather than just back from the
  previous sample's result);
* release → next start: every node busy, one more item queued; from the end of a running item's
  last command to the queued item's first command;

and, once, idle CPU: % of one core each peer's processes used over ``--idle`` seconds with nothing
submitted, read from ``/proc/PID/stat`` (nodes connected: the enodes wait in held polls and
advertise, slurmd waits).

Install the peers first (root, Debian): ``apt-get install -y slurm-wlm munge`` (labgrid installs
itself into ``.bench/labgrid-venv`` from PyPI on the first run). A peer that cannot be installed
or started is reported as such and the others are measured.

Run: ``.venv/bin/python bench/bench_peers.py [--quick] [--peers mediator slurm labgrid]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench"
HZ = os.sysconf("SC_CLK_TCK")

# The tuned Slurm: batch jobs are scheduled at once (batch_sched_delay defaults to 3 s) and the
# main scheduler may run on every event (sched_min_interval); backfill stays (the default).
SLURM_TUNED = {
    "SchedulerParameters": "batch_sched_delay=0,sched_min_interval=0",
}
SLURM_DEFAULT: dict[str, str] = {}  # the package's defaults (sched/backfill, ...)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- pure helpers (tests/unit/test_bench_peers.py) -----------------------------------------


FULL = {"depths": [0, 1000, 10000], "samples": 5, "submits": 200, "idle": 30.0}
QUICK = {"depths": [0, 100], "samples": 2, "submits": 40, "idle": 5.0}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="The Mediator beside Slurm and labgrid on this host (docs/performance.md). "
        "Install the peers first, as root: apt-get install -y slurm-wlm munge. labgrid is "
        "installed into .bench/labgrid-venv from PyPI on the first run.",
    )
    ap.add_argument(
        "--peers",
        nargs="+",
        default=["mediator", "slurm", "labgrid"],
        choices=["mediator", "slurm", "labgrid"],
        help="which systems to measure (default: all three; mediator always runs)",
    )
    ap.add_argument(
        "--slurm",
        nargs="+",
        default=["default", "tuned"],
        choices=["default", "tuned"],
        help="Slurm scheduler settings to measure (default: both)",
    )
    ap.add_argument("--nodes", type=int, default=4, help="nodes / boards / places (default: 4)")
    ap.add_argument(
        "--depths", type=int, nargs="+", help="queue depths (default: 0 1000 10000; --quick: 0 100)"
    )
    ap.add_argument(
        "--samples", type=int, help="latency samples per figure and peer (default: 5; --quick: 2)"
    )
    ap.add_argument(
        "--submits", type=int, help="submits per throughput figure (default: 200; --quick: 40)"
    )
    ap.add_argument("--idle", type=float, help="idle CPU window, s (default: 30; --quick: 5)")
    ap.add_argument(
        "--poll",
        type=float,
        default=1.0,
        help="the enodes' --poll seconds (default: 1, the enode's default)",
    )
    ap.add_argument(
        "--durable",
        action="store_true",
        help="run the Mediator's cluster as `mediator serve --data DIR` does: on the disk, fsync "
        "on (default: tmpfs, fsync off, as the tests)",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=0.0,
        help="seconds of quiet before each submit → start sample (default: 0). The sample "
        "before ends with the node's result, after which an enode polls at once: without a "
        "pause a submit often meets that poll, and the figure misses the idle node's wait",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: depths 0 100, 2 samples, 40 submits, 5 s idle",
    )
    args = ap.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if "mediator" not in args.peers:
        args.peers = ["mediator", *args.peers]
    return args


def median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def render_table(
    rows: list[tuple[str, str, dict[str, float]]], peers: Sequence[str], higher_is_better: set[str]
) -> str:
    """A Markdown table: one row per (figure, load), one column per peer, each peer's value
    followed by its ratio to the Mediator's (``×`` says how many times better the Mediator is:
    above 1 the Mediator is ahead)."""
    head = "| figure | load | " + " | ".join(peers) + " |"
    sep = "|---|---|" + "---|" * len(peers)
    out = [head, sep]
    for figure, load, values in rows:
        base = values.get("mediator")
        cells = []
        for p in peers:
            v = values.get(p)
            if v is None or v != v:
                cells.append("—")
                continue
            text = _fmt(v, figure)
            if p != "mediator" and base is not None and base == base and v > 0 and base > 0:
                ahead = base / v if figure in higher_is_better else v / base
                text += f" (M {ahead:.2f}×)"
            cells.append(text)
        out.append(f"| {figure} | {load} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _fmt(v: float, figure: str) -> str:
    if "/s" in figure:
        return f"{v:,.0f}"
    if "%" in figure:
        return f"{v:.2f} %"
    return f"{v * 1000:,.0f} ms" if v >= 0.01 else f"{v * 1000:.1f} ms"


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (0 for a process that has ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / HZ


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def tree(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(children(p))
    return seen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- marks: what a running item writes ------------------------------------------------------


class Marks:
    """A directory where an item's script notes its start and end (``date +%s.%N``) and waits on
    its FIFO; the bench releases it by opening the FIFO for writing and closing it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o777)
        self.n = 0

    def new(self) -> str:
        self.n += 1
        tok = f"t{os.getpid()}x{self.n}"
        os.mkfifo(self.root / f"fifo.{tok}", 0o666)
        return tok

    def script(self, tok: str) -> str:
        d = self.root
        return (
            f"date +%s.%N > {d}/start.{tok}.tmp && mv {d}/start.{tok}.tmp {d}/start.{tok}; "
            f"cat {d}/fifo.{tok} > /dev/null; "
            f"date +%s.%N > {d}/end.{tok}.tmp && mv {d}/end.{tok}.tmp {d}/end.{tok}"
        )

    def wait(self, kind: str, tok: str, timeout: float = 120.0) -> float:
        path = self.root / f"{kind}.{tok}"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{kind} of {tok} never came")
            time.sleep(0.002)
        return float(path.read_text())

    def release(self, tok: str) -> None:
        with open(self.root / f"fifo.{tok}", "w"):
            pass

    def release_if_waiting(self, tok: str) -> None:
        """Release ``tok`` if its script still waits; never blocks (at shutdown it may be gone)."""
        with contextlib.suppress(OSError):  # ENXIO: no reader any more
            os.close(os.open(self.root / f"fifo.{tok}", os.O_WRONLY | os.O_NONBLOCK))


# ---- the client processes that submit ----------------------------------------------------------

# What a throughput client submits: a run for the busy pool, so it queues and never starts.
QUEUED_CONTRACT: dict[str, Any] = {
    "roles": {"dut": {"pool": "busy"}},
    "steps": [{"name": "s", "role": "dut", "uses": "shell", "with": {"cmd": "true"}}],
}


def _all_ready(out: str, clients: int, start_at: float) -> float:
    """The clients' barrier: say this one is ready (``out.ready``), wait for every client of the
    figure, then for ``start_at``; returns when this client starts. A client process's start-up
    (the interpreter, httpx) takes 0.2 s of CPU and, on a loaded host, more than the 2 s of
    grace ``start_at`` gives: without the barrier a late client's start-up fell inside the
    measured window, and more so with more clients."""
    Path(out + ".ready").touch()
    folder = Path(out).parent
    while len(list(folder.glob("*.ready"))) < clients:
        time.sleep(0.001)
    time.sleep(max(0.0, start_at - time.time()))
    return time.time()


def client_main(
    kind: str, target: str, count: int, out: str, start_at: float, clients: int = 1
) -> None:
    """One submitting client (a process of its own): ``count`` submits of queued items, from
    when every client of the figure is ready and ``start_at`` (a wall-clock time they share) has
    come."""
    started = start_at
    if kind == "mediator":
        import httpx

        contract = QUEUED_CONTRACT
        with httpx.Client(base_url=target, timeout=60) as http:
            http.get("/healthz")
            started = _all_ready(out, clients, start_at)
            for _ in range(count):
                r = http.post("/v1/runs", json=contract)
                if r.status_code not in (200, 201, 202):
                    raise SystemExit(f"submit answered {r.status_code}: {r.text[:200]}")
    elif kind == "slurm":
        started = _all_ready(out, clients, start_at)
        for _ in range(count):
            subprocess.run(
                [
                    "sbatch",
                    "--parsable",
                    "-Q",
                    "-p",
                    "busy",
                    "--gres=busy:1",
                    # Waiting on the blocker, not for the host: see SlurmPeer.fill.
                    f"--dependency=afterany:{os.environ['BENCH_SLURM_BLOCKER']}",
                    "-o",
                    "/dev/null",
                    "-J",
                    "q",
                    "--wrap",
                    "true",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
    Path(out).write_text(json.dumps([started, time.time()]))


def run_clients(kind: str, target: str, clients: int, total: int, env: dict[str, str]) -> float:
    """``clients`` processes submitting ``total`` items together; items per wall second from the
    first client's start (once every client is ready: :func:`_all_ready`) to the last one's
    end."""
    start_at = time.time() + 2.0  # every client has started and connected by then
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for k in range(clients):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "_client",
                        kind,
                        target,
                        str(total // clients),
                        f"{tmp}/{k}.json",
                        repr(start_at),
                        str(clients),
                    ],
                    env={**os.environ, **env},
                )
            )
        for p in procs:
            if p.wait() != 0:
                raise RuntimeError(f"a {kind} client failed")
        spans = [json.loads(Path(f"{tmp}/{k}.json").read_text()) for k in range(clients)]
    n = (total // clients) * clients
    return n / (max(e for _, e in spans) - min(s for s, _ in spans))


# ---- the peers ---------------------------------------------------------------------------------


class Unavailable(Exception):
    """A peer that cannot be installed or started here: the run goes on without it."""


class MediatorPeer:
    name = "mediator"

    def __init__(self, args: argparse.Namespace, work: Path, marks: Marks) -> None:
        self.args, self.work, self.marks = args, work, marks
        self.procs: list[subprocess.Popen[Any]] = []

    def start(self) -> None:
        sys.path.insert(0, str(ROOT / "bench"))
        from _common import durable_or_ephemeral, start_server

        # --durable: the cluster `mediator serve --data DIR` runs (fsync on, on the disk)
        self._cluster = durable_or_ephemeral(self.args.durable)
        self.pg = self._cluster.__enter__()
        self.pg.ensure_database("peers")
        (self.work / "m").mkdir()
        os.chmod(self.work / "m", 0o755)
        # One principal queues every item: its cap on QUEUED runs (docs/security.md "Fair
        # under floods", 1,000 by default) is raised past the deepest queue measured.
        cap = {"MEDIATOR_MAX_QUEUED_RUNS_PER_PRINCIPAL": "100000"}
        self.server, self.url = start_server(
            self.pg.dsn("peers"), self.work / "m", workers=1, env=cap
        )
        import httpx

        self.http = httpx.Client(base_url=self.url, timeout=60)
        enode = str(Path(sys.executable).with_name("enode"))
        for i in range(self.args.nodes + 1):
            caps = self.work / f"caps{i}.json"
            pool = "busy" if i == self.args.nodes else "bench"
            caps.write_text(json.dumps({"pool": pool}))
            self.procs.append(
                subprocess.Popen(
                    [
                        enode,
                        "--url",
                        self.url,
                        "--node-id",
                        f"{pool}{i}",
                        "--caps",
                        str(caps),
                        "--poll",
                        str(self.args.poll),
                        "--keep-dir",
                        str(self.work / f"keep{i}"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=(self.work / f"enode{i}.err").open("w"),
                )
            )
        deadline = time.monotonic() + 60
        while len(self.http.get("/v1/nodes").json()["nodes"]) < self.args.nodes + 1:
            if time.monotonic() > deadline:
                raise Unavailable("the enodes did not advertise within 60 s")
            time.sleep(0.1)
        self.blocker = self.marks.new()  # holds the busy node for the whole run
        self._submit(self.blocker, "busy")
        self.marks.wait("start", self.blocker)
        self.depth = 0

    def _submit(self, tok: str, pool: str = "bench") -> dict[str, Any]:
        contract = {
            "roles": {"dut": {"pool": pool}},
            "steps": [
                {
                    "name": "s",
                    "role": "dut",
                    "uses": "shell",
                    "with": {"cmd": self.marks.script(tok)},
                }
            ],
        }
        r = self.http.post("/v1/runs", json=contract)
        r.raise_for_status()
        return dict(r.json())

    def reset(self) -> None:
        """Back to an empty queue, outside any timing: the queued runs end by SQL, as
        bench_submit.py frees its fleet between rounds."""
        import psycopg

        with psycopg.connect(self.pg.dsn("peers"), autocommit=True) as conn:
            conn.execute(
                "UPDATE runs SET state = 'PASSED', verdict = 'pass', ended_at = now() "
                "WHERE state = 'QUEUED'"
            )
        self.depth = 0

    def _wait_ended(self, run_id: str) -> None:
        while self.http.get(f"/v1/runs/{run_id}").json()["state"] in ("QUEUED", "RUNNING"):
            time.sleep(0.005)

    def fill(self, depth: int) -> None:
        if depth > self.depth:
            run_clients("mediator", self.url, 4, depth - self.depth, {})
            self.depth = depth

    def submit_rate(self, clients: int) -> float:
        rate = run_clients("mediator", self.url, clients, self.args.submits, {})
        self.depth += self.args.submits
        return rate

    def submit_to_start(self) -> float:
        tok = self.marks.new()
        t0 = time.time()
        run = self._submit(tok)
        started = self.marks.wait("start", tok)
        self.marks.release(tok)
        self._wait_ended(run["run_id"])
        return started - t0

    def release_to_next(self) -> float:
        toks = [self.marks.new() for _ in range(self.args.nodes)]
        runs = [self._submit(t) for t in toks]
        for t in toks:
            self.marks.wait("start", t)
        nxt = self.marks.new()
        runs.append(self._submit(nxt))
        self.marks.release(toks[0])
        ended = self.marks.wait("end", toks[0])
        started = self.marks.wait("start", nxt)
        for t in [*toks[1:], nxt]:
            self.marks.release(t)
        for r in runs:
            self._wait_ended(r["run_id"])
        return started - ended

    def pids(self) -> dict[str, list[int]]:
        pidfile = next(Path(self.pg.base_dir).rglob("postmaster.pid"))
        pg_pid = int(pidfile.read_text().split()[0])
        return {
            "server": tree(self.server.pid),
            "postgres": tree(pg_pid),
            "nodes": [p.pid for p in self.procs],
        }

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        self.marks.release_if_waiting(self.blocker)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.server.terminate()
        self.server.wait(timeout=60)
        self._cluster.__exit__(None, None, None)


def _slurm_conf(d: Path, nodes: int, extra: dict[str, str], ports: tuple[int, int]) -> str:
    host = socket.gethostname()
    lines = {
        "ClusterName": "bench",
        "SlurmctldHost": host,
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "SlurmctldPort": str(ports[0]),
        "SlurmdPort": str(ports[1]),
        "AuthType": "auth/munge",
        "AuthInfo": f"socket={d}/munge.sock",
        "StateSaveLocation": f"{d}/state",
        "SlurmdSpoolDir": f"{d}/spool",
        "SlurmctldPidFile": f"{d}/slurmctld.pid",
        "SlurmdPidFile": f"{d}/slurmd.pid",
        "SlurmctldLogFile": f"{d}/slurmctld.log",
        "SlurmdLogFile": f"{d}/slurmd.log",
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "MpiDefault": "none",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_CPU",
        "SlurmdParameters": "config_overrides",
        "GresTypes": "board,busy",
        "MaxJobCount": "100000",
        "ReturnToService": "2",
        "JobCompType": "jobcomp/none",
        "AccountingStorageType": "accounting_storage/none",
        "JobAcctGatherType": "jobacct_gather/none",
        **extra,
    }
    text = "".join(f"{k}={v}\n" for k, v in lines.items())
    text += (
        f"NodeName={host} CPUs={nodes + 2} Gres=board:{nodes},busy:1 State=UNKNOWN\n"
        f"PartitionName=bench Nodes={host} Default=YES MaxTime=INFINITE State=UP\n"
        # The queued jobs wait in a partition of their own: in one partition Slurm's main
        # scheduler stops at the first job that cannot start, and a measured job behind
        # them would wait for backfill (bf_interval, 30 s) — another needs class, as the
        # Mediator's queued runs are.
        f"PartitionName=busy Nodes={host} MaxTime=INFINITE State=UP\n"
    )
    return text


class SlurmPeer:
    def __init__(self, args: argparse.Namespace, work: Path, marks: Marks, mode: str) -> None:
        self.args, self.marks, self.mode = args, marks, mode
        self.name = f"slurm-{mode}"
        self.d = work / self.name
        self.procs: list[subprocess.Popen[Any]] = []

    def start(self) -> None:
        for tool in ("slurmctld", "slurmd", "munged", "sbatch"):
            if shutil.which(tool) is None:
                raise Unavailable(
                    f"{tool} not found: install with apt-get install -y slurm-wlm munge"
                )
        d = self.d
        for sub in ("state", "spool"):
            (d / sub).mkdir(parents=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        subprocess.run(
            [
                "munged",
                "--force",
                f"--socket={d}/munge.sock",
                f"--key-file={key}",
                f"--pid-file={d}/munged.pid",
                f"--log-file={d}/munged.log",
                f"--seed-file={d}/munged.seed",
            ],
            check=True,
        )
        extra = SLURM_TUNED if self.mode == "tuned" else SLURM_DEFAULT
        conf = d / "slurm.conf"
        conf.write_text(_slurm_conf(d, self.args.nodes, extra, (free_port(), free_port())))
        (d / "gres.conf").write_text(f"Name=board Count={self.args.nodes}\nName=busy Count=1\n")
        self.env = {"SLURM_CONF": str(conf)}
        os.environ["SLURM_CONF"] = str(conf)
        for cmd in (["slurmctld", "-D", "-i"], ["slurmd", "-D"]):
            self.procs.append(
                subprocess.Popen(
                    cmd, stdout=(d / f"{cmd[0]}.out").open("w"), stderr=subprocess.STDOUT
                )
            )
        deadline = time.monotonic() + 60
        while True:
            r = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
            if r.returncode == 0 and r.stdout.strip() in ("idle", "mix", "alloc"):
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise Unavailable(
                    f"Slurm did not come up (sinfo: {r.stdout.strip() or r.stderr.strip()}); "
                    f"see {d}/slurmctld.log and slurmd.log"
                )
            time.sleep(0.2)
        self.blocker = self.marks.new()
        self.env["BENCH_SLURM_BLOCKER"] = self._sbatch(self.blocker, "busy", "busy")
        self.marks.wait("start", self.blocker)
        self.depth = 0

    def _sbatch(self, tok: str, gres: str = "board", partition: str = "bench") -> str:
        return subprocess.run(
            [
                "sbatch",
                "--parsable",
                "-p",
                partition,
                f"--gres={gres}:1",
                "-o",
                "/dev/null",
                "-J",
                tok,
                "--wrap",
                self.marks.script(tok),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def _wait_gone(self, toks: Iterable[str]) -> None:
        names = set(toks)
        while True:
            out = subprocess.run(
                ["squeue", "-h", "-t", "PD,R,CG,CF", "-o", "%j"], capture_output=True, text=True
            ).stdout.split()
            if not names & set(out):
                return
            time.sleep(0.02)

    def fill(self, depth: int) -> None:
        """Queue jobs that wait for the blocker job to end (``--dependency``). Jobs that wait
        for the host's resources instead (measured first) starve every later job on a
        one-host cluster: Slurm's main scheduler keeps the host for the first pending job it
        cannot start, and backfill only looks at the first bf_max_job_test (500) jobs — at
        1,000 queued a job on a free board had not started after 120 s."""
        if depth > self.depth:
            run_clients("slurm", "", 4, depth - self.depth, self.env)
            self.depth = depth

    def submit_rate(self, clients: int) -> float:
        rate = run_clients("slurm", "", clients, self.args.submits, self.env)
        self.depth += self.args.submits
        return rate

    def submit_to_start(self) -> float:
        tok = self.marks.new()
        t0 = time.time()
        self._sbatch(tok)
        started = self.marks.wait("start", tok)
        self.marks.release(tok)
        self._wait_gone([tok])
        return started - t0

    def release_to_next(self) -> float:
        toks = [self.marks.new() for _ in range(self.args.nodes)]
        for t in toks:
            self._sbatch(t)
        for t in toks:
            self.marks.wait("start", t)
        nxt = self.marks.new()
        self._sbatch(nxt)
        self.marks.release(toks[0])
        ended = self.marks.wait("end", toks[0])
        started = self.marks.wait("start", nxt)
        for t in [*toks[1:], nxt]:
            self.marks.release(t)
        self._wait_gone([*toks, nxt])
        return started - ended

    def pids(self) -> dict[str, list[int]]:
        munged = int((self.d / "munged.pid").read_text())
        return {"slurmctld": [self.procs[0].pid], "slurmd": [self.procs[1].pid], "munged": [munged]}

    def stop(self) -> None:
        subprocess.run(["scancel", "--user=root"], capture_output=True)
        if hasattr(self, "blocker"):
            self.marks.release_if_waiting(self.blocker)
        for p in self.procs:
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        pid = self.d / "munged.pid"
        if pid.exists():
            os.kill(int(pid.read_text()), signal.SIGTERM)


LABGRID_DRIVER = ROOT / "bench" / "_labgrid_driver.py"


class LabgridPeer:
    name = "labgrid"

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.d = work / "labgrid"
        self.d.mkdir()
        self.venv = CACHE / "labgrid-venv"

    def _install(self) -> None:
        py = self.venv / "bin" / "python"
        if (self.venv / "bin" / "labgrid-coordinator").exists():
            return
        log("labgrid: making .bench/labgrid-venv and installing labgrid from PyPI")
        try:
            subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
            subprocess.run([str(py), "-m", "pip", "install", "-q", "labgrid"], check=True)
        except subprocess.CalledProcessError as exc:
            raise Unavailable(f"labgrid could not be installed: {exc}") from None

    def start(self) -> None:
        self._install()
        port = free_port()
        self.addr = f"127.0.0.1:{port}"
        self.coord = subprocess.Popen(
            [str(self.venv / "bin" / "labgrid-coordinator"), "-l", self.addr],
            cwd=self.d,
            stdout=(self.d / "coordinator.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        self.drv = subprocess.Popen(
            [
                str(self.venv / "bin" / "python"),
                str(LABGRID_DRIVER),
                self.addr,
                str(self.args.nodes),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(self.d / "driver.err").open("w"),
            text=True,
        )
        try:
            self._ask("ready")
        except Unavailable:
            self.coord.terminate()
            raise
        self.depth = 0

    def _ask(self, *cmd: object) -> Any:
        assert self.drv.stdin is not None and self.drv.stdout is not None
        self.drv.stdin.write(json.dumps(cmd) + "\n")
        self.drv.stdin.flush()
        line = self.drv.stdout.readline()
        if not line:
            err = (self.d / "driver.err").read_text()[-500:]
            raise Unavailable(f"the labgrid driver stopped: {err}")
        reply = json.loads(line)
        if "error" in reply:
            raise Unavailable(reply["error"])
        return reply["value"]

    def reset(self) -> None:
        self._ask("reset")
        self.depth = 0

    def fill(self, depth: int) -> None:
        if depth > self.depth:
            got = int(self._ask("fill", depth - self.depth))
            if got < depth - self.depth:
                self.depth += got
                raise RuntimeError(f"only {self.depth} queued in 45 s of CreateReservation calls")
            self.depth = depth

    def submit_rate(self, clients: int) -> float:
        rate = float(self._ask("rate", clients, self.args.submits))
        self.depth += self.args.submits
        return rate

    def submit_to_start(self) -> float:
        return float(self._ask("submit_to_start"))

    def release_to_next(self) -> float:
        return float(self._ask("release_to_next"))

    def pids(self) -> dict[str, list[int]]:
        return {"coordinator": [self.coord.pid]}

    def stop(self) -> None:
        for p in (self.drv, self.coord):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


# ---- the run -----------------------------------------------------------------------------------


def idle_cpu(peers: list[Any], seconds: float) -> dict[str, dict[str, float]]:
    """% of one core per peer and per process group over ``seconds`` of nothing submitted."""
    groups = {p.name: p.pids() for p in peers}
    before = {
        (n, g): sum(cpu_seconds(x) for x in pids)
        for n, gs in groups.items()
        for g, pids in gs.items()
    }
    t0 = time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t0
    out: dict[str, dict[str, float]] = {}
    for (n, g), b in before.items():
        after = sum(cpu_seconds(x) for x in groups[n][g])
        out.setdefault(n, {})[g] = 100 * (after - b) / dt
    return out


def settled(peer: Any, seconds: float) -> float:
    """``peer.submit_to_start()`` after ``seconds`` of nothing happening (``--settle``)."""
    time.sleep(seconds)
    return float(peer.submit_to_start())


def alternate(peers: list[Any], samples: int, what: Callable[[Any], float]) -> dict[str, float]:
    """``samples`` rounds, every peer once a round, the order rotating each round; medians."""
    got: dict[str, list[float]] = {p.name: [] for p in peers}
    failed: set[str] = set()
    for k in range(samples):
        order = peers[k % len(peers) :] + peers[: k % len(peers)]
        for p in order:
            if p.name in failed:
                continue
            try:
                got[p.name].append(what(p))
            except (TimeoutError, RuntimeError, subprocess.CalledProcessError) as exc:
                failed.add(p.name)  # a peer that cannot do it here: say so, go on
                log(f"{p.name}: {exc}")
                NOTES.append(f"{p.name}: a figure failed — {exc}")
    return {n: median(v) for n, v in got.items()}


NOTES: list[str] = []


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    load0 = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    os.chmod(work, 0o755)
    marks = Marks(work / "marks")
    candidates: list[Any] = [MediatorPeer(args, work, marks)]
    if "slurm" in args.peers:
        candidates += [SlurmPeer(args, work, marks, mode) for mode in args.slurm]
    if "labgrid" in args.peers:
        candidates.append(LabgridPeer(args, work))
    rows: list[tuple[str, str, dict[str, float]]] = []
    notes: list[str] = []
    # Slurm's two settings cannot share the host's slurmd: each has its own phase, measured
    # alternating with the Mediator and labgrid.
    slurms = [c for c in candidates if isinstance(c, SlurmPeer)]
    others = [c for c in candidates if not isinstance(c, SlurmPeer)]
    started: list[Any] = []
    try:
        for c in others:
            log(f"starting {c.name}")
            try:
                c.start()
                started.append(c)
            except (Unavailable, OSError, subprocess.CalledProcessError) as exc:
                notes.append(f"{c.name}: not measured — {exc}")
                log(notes[-1])
        phases = [[s] for s in slurms] or [[]]
        for phase in phases:
            live = list(started)
            for c in list(live):
                try:
                    c.reset()
                except (Unavailable, OSError, RuntimeError) as exc:
                    notes.append(f"{c.name}: dropped — its queue could not be emptied: {exc}")
                    live.remove(c)
            for s in phase:
                log(f"starting {s.name}")
                try:
                    s.start()
                    live.append(s)
                except (Unavailable, OSError, subprocess.CalledProcessError) as exc:
                    notes.append(f"{s.name}: not measured — {exc}")
                    log(notes[-1])
                    s.stop()
            tag = f" ({phase[0].name} phase)" if phase and phase[0] in live else ""
            try:
                log(f"idle CPU over {args.idle:g} s{tag}")
                idle = idle_cpu(live, args.idle)
                load = f"load {os.getloadavg()[0]:.1f}"
                rows.append(
                    (
                        f"idle CPU, % of a core{tag}",
                        load,
                        {n: sum(g.values()) for n, g in idle.items()},
                    )
                )
                for n, g in idle.items():
                    notes.append(
                        f"idle CPU {n}{tag}: " + ", ".join(f"{k} {v:.2f} %" for k, v in g.items())
                    )
                    log(notes[-1])
                for depth in args.depths:
                    for p in live:
                        log(f"queue depth {depth}: filling {p.name}")
                        try:
                            p.fill(depth)
                        except Exception as exc:  # a peer that cannot hold the queue: say so
                            notes.append(f"{p.name} at depth {depth}: fill failed — {exc}")
                            log(notes[-1])
                    load = f"depth {depth}, load {os.getloadavg()[0]:.1f}"
                    for name, fn in (
                        ("submit → start, idle node", lambda p: settled(p, args.settle)),
                        ("release → next start", lambda p: p.release_to_next()),
                    ):
                        log(f"depth {depth}: {name}")
                        rows.append((name + tag, load, alternate(live, args.samples, fn)))
                        log(rows[-1][0] + ": " + json.dumps(rows[-1][2]))
                    for clients in (1, 4):
                        log(f"depth {depth}: submit throughput, {clients} client(s)")
                        rate = alternate(live, 1, lambda p, c=clients: p.submit_rate(c))
                        rows.append((f"submits/s, {clients} client(s){tag}", load, rate))
                        log(rows[-1][0] + ": " + json.dumps(rows[-1][2]))
            finally:
                for s in phase:
                    if s in live:
                        s.stop()
    finally:
        for c in started:
            c.stop()
    names = [c.name for c in candidates]
    print(
        f"bench_peers: {args.nodes} nodes, enode --poll {args.poll:g}, samples {args.samples}, "
        f"{args.submits} submits per throughput figure; loadavg at start {load0[0]:.1f} "
        f"{load0[1]:.1f} {load0[2]:.1f}, at end {os.getloadavg()[0]:.1f}"
    )
    print("values: medians; (M n×) = how many times better the Mediator's figure is")
    higher = {r[0] for r in rows if r[0].startswith("submits/s")}
    print(render_table(rows, names, higher))
    for n in [*notes, *NOTES]:
        print("- " + n)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_client":
        client_main(
            sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], float(sys.argv[6]),
            int(sys.argv[7]),
        )  # fmt: skip
    else:
        main()
