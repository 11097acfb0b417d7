"""Real processes for end-to-end tests: ``mediator serve`` and ``enode`` as subprocesses.

Each server runs on the test's own database (the session cluster's per-test copy) with port 0, and
says where it listens on its first line of output; tests wait for that line (bounded), never
sleep. Teardown sends SIGTERM (graceful shutdown) and kills only if that takes too long.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

READY = re.compile(r"serving on (http://\S+)")


def _pump(stream, lines: queue.Queue[str], sink: list[str]) -> None:  # type: ignore[type-arg]
    for line in iter(stream.readline, ""):
        sink.append(line)
        lines.put(line)
    lines.put("")


@dataclass
class Process:
    """A child process whose output is collected line by line."""

    proc: subprocess.Popen  # type: ignore[type-arg]
    output: list[str] = field(default_factory=list)
    _lines: queue.Queue[str] = field(default_factory=queue.Queue)
    _pump: threading.Thread | None = None

    @classmethod
    def start(
        cls, argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None
    ) -> Process:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
        p = cls(proc)
        p._pump = threading.Thread(
            target=_pump, args=(proc.stdout, p._lines, p.output), daemon=True
        )
        p._pump.start()
        return p

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 30.0) -> re.Match[str]:
        """The first output line matching ``pattern``; fails after ``timeout`` or at exit."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line matching {pattern.pattern!r}:\n{''.join(self.output)}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line == "":
                raise RuntimeError(f"process exited ({self.proc.wait()}):\n{''.join(self.output)}")
            m = pattern.search(line)
            if m:
                return m

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self._pump is not None:
            self._pump.join(timeout=5)  # the pipe reaches EOF once the child has exited
        if self.proc.stdout is not None:
            self.proc.stdout.close()  # an open pipe is a ResourceWarning, an error here
        return self.proc.returncode


@dataclass
class Server:
    url: str
    process: Process
    records: Path


def start_server(
    dsn: str,
    workdir: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    tokens: str | None = None,
    records: Path | None = None,
) -> Server:
    """``mediator serve`` on ``dsn`` (no embedded cluster), on a free loopback port: ``--dev``,
    or with the tokens file ``tokens``; ``records`` is the records root (default: in
    ``workdir``; replicas share one)."""
    records = records or workdir / "records"
    auth = ["--tokens", tokens] if tokens else ["--dev"]
    argv = [
        sys.executable, "-m", "mediator.cli.main",
        "--data", str(workdir / "pg"), "--records", str(records),
        "serve", *auth, "--host", "127.0.0.1", "--port", "0", "--database-url", dsn, *extra,
    ]  # fmt: skip
    p = Process.start(argv, env=env)
    url = p.wait_for(READY).group(1)
    return Server(url, p, records)
