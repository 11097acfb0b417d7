"""Run records: ``<records_root>/<run_id>/``, opened at submit, sealed once (docs/design.md §12).

Files only — the flows hand in what the database says, so one root can be shared by every Mediator
process and the record is always generated from the committed truth:

* ``contract.json`` at open, by exclusive create (opening twice is a no-op);
* at seal: ``events.jsonl`` and one ``steps/<seq>-<name>.log`` per step, then ``seal.json`` last,
  created exclusively with the sha256 of every other file. Whoever creates ``seal.json`` sealed the
  run; everyone else finds it there and does nothing (I6). Sealed files are made read-only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEAL = "seal.json"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Verification:
    run_id: str
    sealed: bool
    changed: tuple[str, ...]  # files whose bytes differ from seal.json
    missing: tuple[str, ...]
    extra: tuple[str, ...]  # files present but not sealed

    @property
    def ok(self) -> bool:
        return self.sealed and not (self.changed or self.missing or self.extra)


def _write_exclusive(path: Path, data: bytes) -> bool:
    """Create ``path`` with ``data`` unless it exists; True if this call created it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()


class Records:
    """The record store rooted at ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def dir(self, run_id: str) -> Path:
        return self.root / run_id

    def open(self, run_id: str, contract: Mapping[str, Any]) -> None:
        """Write ``contract.json`` if it is not there yet (idempotent)."""
        d = self.dir(run_id)
        d.mkdir(exist_ok=True)
        _write_exclusive(d / "contract.json", _dumps(contract))

    def is_sealed(self, run_id: str) -> bool:
        return (self.dir(run_id) / SEAL).exists()

    def seal(
        self,
        run_id: str,
        *,
        contract: Mapping[str, Any],
        state: str,
        verdict: str | None,
        ended_at: str | None,
        events: Iterable[Mapping[str, Any]],
        step_logs: Iterable[tuple[int, str, str]],
    ) -> bool:
        """Seal the record; False (and nothing written) if it was sealed already (I6)."""
        d = self.dir(run_id)
        if (d / SEAL).exists():
            return False
        d.mkdir(exist_ok=True)
        _write_exclusive(d / "contract.json", _dumps(contract))  # a cancel right after submit
        files: dict[str, bytes] = {
            "events.jsonl": b"".join(
                (json.dumps(e, sort_keys=True, default=str) + "\n").encode() for e in events
            )
        }
        for seq, name, text in step_logs:
            files[f"steps/{seq:04d}-{_SAFE.sub('_', name)}.log"] = text.encode("utf-8")
        # Written into a private staging folder first: a concurrent sealer's files never mix
        # with ours, and whoever creates seal.json first is the one whose files count.
        staging = d / f".staging-{os.getpid()}-{id(self)}"
        (staging / "steps").mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (staging / name).write_bytes(data)
        if (d / SEAL).exists():
            _rmtree(staging)
            return False
        (d / "steps").mkdir(exist_ok=True)
        for name in files:
            if not (d / name).exists():
                os.replace(staging / name, d / name)
        _rmtree(staging)
        names = ["contract.json", *files]
        digests = {n: hashlib.sha256((d / n).read_bytes()).hexdigest() for n in sorted(names)}
        seal = {
            "run_id": run_id,
            "state": state,
            "verdict": verdict,
            "ended_at": ended_at,
            "sha256": digests,
        }
        if not _write_exclusive(d / SEAL, _dumps(seal)):
            return False
        for n in [*names, SEAL]:
            (d / n).chmod(0o444)
        return True

    def manifest(self, run_id: str) -> dict[str, Any] | None:
        """``seal.json`` once sealed, else the list of files so far; None if no record."""
        d = self.dir(run_id)
        if not d.is_dir():
            return None
        if (d / SEAL).exists():
            return dict(json.loads((d / SEAL).read_text("utf-8")), sealed=True)
        files = sorted(
            str(p.relative_to(d))
            for p in d.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )
        return {"run_id": run_id, "sealed": False, "files": files}

    def read_file(self, run_id: str, name: str) -> bytes | None:
        """One record file; None for anything outside the run's record (no path traversal)."""
        d = self.dir(run_id).resolve()
        target = (d / name).resolve()
        if d not in target.parents or not target.is_file():
            return None
        return target.read_bytes()

    def verify(self, run_id: str) -> Verification:
        """Re-hash every file against ``seal.json``."""
        d = self.dir(run_id)
        seal_path = d / SEAL
        if not seal_path.exists():
            return Verification(run_id, False, (), (), ())
        sealed: dict[str, str] = json.loads(seal_path.read_text("utf-8"))["sha256"]
        present = {
            str(p.relative_to(d))
            for p in d.rglob("*")
            if p.is_file() and p.name != SEAL and not p.relative_to(d).parts[0].startswith(".")
        }
        changed = tuple(
            sorted(
                n
                for n in sealed
                if n in present and hashlib.sha256((d / n).read_bytes()).hexdigest() != sealed[n]
            )
        )
        missing = tuple(sorted(set(sealed) - present))
        extra = tuple(sorted(present - set(sealed)))
        return Verification(run_id, True, changed, missing, extra)


def _rmtree(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    path.rmdir()
