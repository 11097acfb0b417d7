"""The demo's supervisor: a Mediator and three enode daemons on this machine, a few runs, and one
Ctrl-C that stops all of it (issue 15 §6).

``scripts/demo`` sets up the environment and runs this file. It starts ``mediator serve --dev``
(embedded PostgreSQL under ``--var``, default ``./var``), three ``enode`` daemons, submits the
examples with ``runctl``, prints where to look, and waits.

Why a supervisor and not a shell script's ``trap``: a Ctrl-C in a terminal signals the whole
foreground process group at once. The server then stops while the enodes, told to drain
gracefully, keep advertising to a server that is gone — and a daemon that finished a step keeps
retrying its result — until a second Ctrl-C. Order matters, so the children run in a process
group of their own (the terminal's Ctrl-C reaches only this process) and the first SIGINT or
SIGTERM stops them in order:

1. every enode gets SIGTERM then SIGINT — two stop requests, which ``enode`` documents as "exit
   after the current step" (two different signals, so neither can be merged into the other) —
   while the server is still up to take their last results and drain adverts;
2. once they have exited, the server gets SIGTERM and shuts down its embedded PostgreSQL.

Every wait has a deadline; a child still alive after it is killed, and the supervisor says so
(``demo: killed …``). A second Ctrl-C kills what is left at once. Each child also gets
``PR_SET_PDEATHSIG`` (Linux), so a supervisor killed with SIGKILL leaves nothing behind.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NODES = {
    "dut1": {"board": "stm32f4"},
    "dut2": {"board": "stm32f4", "usb": True},
    "bench": {"scope": True},
}
EXAMPLES = ("flash.json", "smoke.json", "smoke.json", "smoke.json")
START_DEADLINE_S = 120.0  # an embedded PostgreSQL's first initdb on a busy machine
NODE_STOP_DEADLINE_S = 30.0  # the longest example step is 6 s
SERVER_STOP_DEADLINE_S = 30.0


class Stop(Exception):
    """A stop request (SIGINT/SIGTERM) arrived."""


def _die_with_parent() -> None:
    """In the child before exec: its own process group, and SIGTERM when the supervisor dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass  # not Linux: the ordered shutdown below still applies


class Demo:
    def __init__(self, var: Path, port: int) -> None:
        self.var = var
        self.port = port
        self.server: subprocess.Popen[bytes] | None = None
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self.url = ""
        self.stopping = False

    # ---- starting --------------------------------------------------------------------------
    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen(
                argv,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "MEDIATOR_URL": self.url} if self.url else None,
                process_group=0,  # out of the terminal's group: Ctrl-C reaches only us
                preexec_fn=_die_with_parent,
            )

    def start(self) -> None:
        logs = self.var / "demo"
        logs.mkdir(parents=True, exist_ok=True)
        server_log = logs / "mediator.log"
        self.server = self._spawn(
            [
                str(BIN / "mediator"),
                "--data",
                str(self.var / "pg"),
                "serve",
                "--dev",
                "--port",
                str(self.port),
            ],
            server_log,
        )
        self.url = _until(
            lambda: _served_url(server_log),
            START_DEADLINE_S,
            f"the server did not start; see {server_log}",
            alive=[self.server],
        )
        _until(
            lambda: _get(self.url + "/healthz") is not None,
            START_DEADLINE_S,
            f"the server does not answer; see {server_log}",
            alive=[self.server],
        )
        for node, caps in NODES.items():
            caps_file = logs / f"{node}.json"
            caps_file.write_text(json.dumps(caps) + "\n")
            self.nodes[node] = self._spawn(
                [
                    str(BIN / "enode"),
                    "--node-id",
                    node,
                    "--caps",
                    str(caps_file),
                    "--label",
                    f"demo {node}",
                ],
                logs / f"{node}.log",
            )
        # The runs below need the nodes' adverts in; wait for them, not for a fixed time.
        _until(
            lambda: set(NODES) <= _live_nodes(self.url),
            START_DEADLINE_S,
            f"the nodes did not advertise; see {logs}/*.log",
            alive=[self.server, *self.nodes.values()],
        )
        env = {**os.environ, "MEDIATOR_URL": self.url}
        for example in EXAMPLES:
            subprocess.run(
                [str(BIN / "runctl"), "submit", str(ROOT / "examples" / example)],
                env=env,
                check=False,
            )
        print(
            f"""
The demo is running.
  panel (fleet, queue, work graphs):  {self.url}/
  the ask of the flash run:           runctl asks; runctl answer ASK_ID ok
  fleet and runs from the shell:      runctl nodes; runctl list   (MEDIATOR_URL={self.url})
  logs:                               {logs}/*.log
Ctrl-C stops the nodes, then the server.""",
            flush=True,
        )

    def wait(self) -> int:
        """Until a stop request or a child's unexpected exit (then 1)."""
        children = [self.server, *self.nodes.values()]
        while True:
            for child in children:
                if child is not None and child.poll() is not None:
                    print(
                        f"demo: {_name(self, child)} exited ({child.returncode}); stopping",
                        file=sys.stderr,
                    )
                    return 1
            time.sleep(0.5)  # a stop request interrupts this at once (the handler raises Stop)

    # ---- stopping --------------------------------------------------------------------------
    def stop(self) -> None:
        """Nodes first (the server takes their last results), then the server."""
        self.stopping = True
        nodes = [p for p in self.nodes.values() if p.poll() is None]
        for p in nodes:
            _signal(p, signal.SIGTERM)
            _signal(p, signal.SIGINT)  # the second stop request: exit after the current step
        self._reap(nodes, NODE_STOP_DEADLINE_S)
        if self.server is not None and self.server.poll() is None:
            _signal(self.server, signal.SIGTERM)
            self._reap([self.server], SERVER_STOP_DEADLINE_S)
        print("demo: stopped", flush=True)

    def kill_all(self) -> None:
        for p in [*self.nodes.values(), self.server]:
            if p is not None and p.poll() is None:
                _signal(p, signal.SIGKILL)
                print(f"demo: killed {_name(self, p)}", file=sys.stderr)
                p.wait()

    def _reap(self, procs: list[subprocess.Popen[bytes]], deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        for p in procs:
            try:
                p.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(p, signal.SIGKILL)
                print(
                    f"demo: killed {_name(self, p)}: it did not stop within {deadline_s:g} s",
                    file=sys.stderr,
                )
                p.wait()


def _name(demo: Demo, p: subprocess.Popen[bytes]) -> str:
    if p is demo.server:
        return "the server"
    return next((f"enode {n}" for n, q in demo.nodes.items() if q is p), f"pid {p.pid}")


def _signal(p: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        p.send_signal(sig)


def _served_url(log: Path) -> str | None:
    try:
        text = log.read_text("utf-8", errors="replace")
    except FileNotFoundError:
        return None
    found = re.search(r"serving on (http://\S+)", text)
    return found.group(1) if found else None


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            body: bytes = resp.read()
            return body
    except (urllib.error.URLError, OSError):
        return None


def _live_nodes(url: str) -> set[str]:
    body = _get(url + "/v1/nodes")
    if body is None:
        return set()
    return {n["node_id"] for n in json.loads(body).get("nodes", [])}


def _until(
    check: Callable[[], T | bool | None],
    deadline_s: float,
    failure: str,
    alive: list[subprocess.Popen[bytes] | None],
) -> T:
    """Poll ``check`` until it gives a value (a condition with a deadline, not a sleep)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = check()
        if value:
            return value  # type: ignore[return-value]
        if any(p is not None and p.poll() is not None for p in alive):
            break
        time.sleep(0.2)
    raise SystemExit(f"demo: {failure}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="scripts/demo",
        description="A Mediator and three enode daemons on this machine; Ctrl-C stops them all.",
        allow_abbrev=False,
    )
    ap.add_argument(
        "--var",
        default=str(ROOT / "var"),
        help="where the database, records and logs go (default: ./var)",
    )
    ap.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("PORT", "8640")),
        help="the server's port; 0 picks a free one (default: $PORT or 8640)",
    )
    args = ap.parse_args(argv)
    demo = Demo(Path(args.var).resolve(), args.port)

    def on_signal(signum: int, _frame: object) -> None:
        if demo.stopping:
            demo.kill_all()  # a second Ctrl-C: no more waiting
            os._exit(130)
        demo.stopping = True  # from here on, another signal kills instead of waiting
        raise Stop

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    code = 0
    try:
        demo.start()
        code = demo.wait()
    except Stop:
        code = 0
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        code = 1
    finally:
        demo.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
