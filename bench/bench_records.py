"""What a run's record costs (docs/performance.md "Records"): ``Records.open`` and
``Records.seal`` per run, today's against the implementation before issue 13's record work, in the
same run, on ``/dev/shm`` (fsync nearly free: what is left is Python and system calls) and on the
disk (a folder under ``/tmp``).

The baseline is the code itself as it was at commit ``06bb5af`` (``git show`` of
``mediator/records.py`` and ``mediator/paths.py``, loaded as modules), so the ratio is a
before/after on one machine. A floor is printed beside them: the same three files written and
fsynced with plain ``open``/``write`` and the folders synced — no checks, no hashing, no staging.

Every seal writes one typical one-step run (the ``steady`` scenario's shape: a contract, six
events, one step log); both implementations must produce byte-identical records, which the script
checks before it prints.

Run: ``.venv/bin/python bench/bench_records.py [--runs 400] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mediator import records as today

BEFORE = "06bb5af"  # the last commit before issue 13's record work
REPO = Path(__file__).resolve().parent.parent

CONTRACT = {
    "run_id": "r",
    "roles": {"dut": {"board": "stm32f4", "pool": "bench"}},
    "steps": [{"name": "flash", "role": "dut", "uses": "shell", "with": {"cmd": "make flash"}}],
}
AT = "2026-12-01T00:00:00+00:00"
EVENTS = [
    {"id": i, "at": AT, "run_id": "r", "node_id": "n1", "kind": kind, "data": {"seq": 1}}
    for i, kind in enumerate(("submitted", "leased", "claimed", "result", "released", "settled"))
]
LOGS = [(1, "flash", "flashing… ok\n" * 4)]


def load_before() -> Any:
    """``mediator/records.py`` as it was at :data:`BEFORE`, over that commit's ``paths.py``."""

    def source(path: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO), "show", f"{BEFORE}:{path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    old_paths = sys.modules["records_before_paths"] = types.ModuleType("records_before_paths")
    exec(compile(source("mediator/paths.py"), "paths@" + BEFORE, "exec"), old_paths.__dict__)
    text = source("mediator/records.py")
    text = text.replace("from mediator import paths\n", "")
    text = text.replace("from mediator.paths import UnsafePath\n", "")
    old = sys.modules["records_before"] = types.ModuleType("records_before")
    old.__dict__.update(paths=old_paths, UnsafePath=old_paths.UnsafePath)
    exec(compile(text, "records@" + BEFORE, "exec"), old.__dict__)
    return old


def seal(records: Any, run_id: str) -> bool:
    return bool(
        records.seal(
            run_id,
            contract=CONTRACT,
            state="PASSED",
            verdict="pass",
            ended_at=AT,
            events=EVENTS,
            step_logs=LOGS,
        )
    )


def plain(root: Path, run_id: str) -> None:
    """The floor: the three files of a record written and fsynced, the folders synced."""
    import hashlib
    import json

    d = root / run_id
    (d / "steps").mkdir(parents=True)
    files = {
        "contract.json": (json.dumps(CONTRACT, indent=2, sort_keys=True) + "\n").encode(),
        "events.jsonl": b"".join((json.dumps(e) + "\n").encode() for e in EVENTS),
        "steps/0001-flash.log": LOGS[0][2].encode(),
    }
    digests = {}
    for name, data in files.items():
        fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        digests[name] = hashlib.sha256(data).hexdigest()
    for folder in (d / "steps", d):
        fd = os.open(folder, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    fd = os.open(d / "seal.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    os.write(fd, json.dumps(digests).encode())
    os.fsync(fd)
    os.close(fd)


def timed(fn: Callable[[str], Any], ids: list[str]) -> float:
    """µs per call of ``fn`` over ``ids``."""
    t = time.perf_counter()
    for run_id in ids:
        fn(run_id)
    return (time.perf_counter() - t) / len(ids) * 1e6


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode & 0o777)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def measure(where: Path, runs: int, rounds: int, before: Any) -> dict[str, float]:
    """Best of ``rounds`` (µs per call) for each implementation's open and seal, alternating."""
    best: dict[str, float] = {}
    for r in range(rounds):
        for label, cls in (("before", before.Records), ("today", today.Records)):
            root = Path(tempfile.mkdtemp(prefix=f"bench-records-{label}-", dir=where))
            try:
                records = cls(root)
                ids = [f"run-{r}-{i}" for i in range(runs)]
                opened = timed(lambda i, records=records: records.open(i, CONTRACT), ids)
                sealed = timed(lambda i, records=records: seal(records, i), ids)
                assert all(records.verify(i).ok for i in ids[:3])
                for key, us in ((f"{label} open", opened), (f"{label} seal", sealed)):
                    best[key] = min(best.get(key, us), us)
            finally:
                shutil.rmtree(root)
        root = Path(tempfile.mkdtemp(prefix="bench-records-plain-", dir=where))
        try:
            us = timed(lambda i, root=root: plain(root, i), [f"p-{r}-{i}" for i in range(runs)])
            best["plain"] = min(best.get("plain", us), us)
        finally:
            shutil.rmtree(root)
    return best


def same_bytes(where: Path, before: Any) -> bool:
    """Both implementations write the same files, byte for byte and mode for mode."""
    roots = [Path(tempfile.mkdtemp(prefix="bench-records-same-", dir=where)) for _ in range(2)]
    try:
        for root, cls in zip(roots, (before.Records, today.Records), strict=True):
            records = cls(root)
            records.open("r", CONTRACT)
            assert seal(records, "r") and not seal(records, "r")
            assert seal(records, "unopened")
        return tree(roots[0]) == tree(roots[1])
    finally:
        for root in roots:
            shutil.rmtree(root)


def main() -> None:
    ap = argparse.ArgumentParser(description="Records.open and Records.seal, before and after")
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    before = load_before()
    places = [Path("/dev/shm"), Path(tempfile.gettempdir())]
    print(f"µs per call, best of {args.rounds} rounds of {args.runs} runs; before = {BEFORE}")
    print(
        f"{'where':12} {'open before':>12} {'open today':>11} {'seal before':>12} "
        f"{'seal today':>11} {'plain 3 files':>14} {'open+seal before/today':>24}"
    )
    for where in places:
        if not where.is_dir():
            print(f"{where!s:12} (absent)")
            continue
        assert same_bytes(where, before), "today's records differ from before's"
        b = measure(where, args.runs, args.rounds, before)
        ratio = (b["before open"] + b["before seal"]) / (b["today open"] + b["today seal"])
        print(
            f"{where!s:12} {b['before open']:12.1f} {b['today open']:11.1f} "
            f"{b['before seal']:12.1f} {b['today seal']:11.1f} {b['plain']:14.1f} "
            f"{ratio:23.2f}×"
        )


if __name__ == "__main__":
    main()
