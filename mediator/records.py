"""Run records: ``<records_root>/<run_id>/``, opened at submit, sealed once (docs/design.md §12).

Files only — the flows hand in what the database says, so one root can be shared by every Mediator
process and the record is always generated from the committed truth:

* ``contract.json`` at open, by exclusive create (opening twice is a no-op);
* at seal: ``events.jsonl`` and one ``steps/<seq>-<name>.log`` per step, then ``seal.json`` last,
  created exclusively with the sha256 of every other file. Whoever creates ``seal.json`` sealed the
  run; everyone else finds it there and does nothing (I6). Sealed files are made read-only.

Every path goes through :mod:`mediator.paths` (issue 11 §1): the run id must be a plain name, the
folder must stay inside the root, and files are opened without following symlinks. Each seal
stages its files in a folder of its own (``tempfile.mkdtemp``), so concurrent sealers — threads
of one process included — never delete each other's files (issue 11 §7).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mediator import paths
from mediator.paths import UnsafePath

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


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()


def _parts(name: str) -> tuple[str, ...]:
    return tuple(name.split("/"))


def _is_json(data: bytes | None) -> bool:
    """Whether a record file holds a whole JSON document (a crash can leave it empty or cut);
    None — absent or not a plain file — is left for the seal's own checks to refuse."""
    if data is None:
        return True
    try:
        json.loads(data)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
        return False
    return True


def _write_synced(path: Path, data: bytes) -> None:
    """Write a staged file (in a folder of our own, ``mkdtemp``) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


class Records:
    """The record store rooted at ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        Path(root).mkdir(parents=True, exist_ok=True)
        self.root = Path(root).resolve()

    def dir(self, run_id: str) -> Path:
        """The run's folder; :class:`UnsafePath` (400) for an id that is not a plain name."""
        return paths.confined(self.root, run_id, field="run_id")

    def open(self, run_id: str, contract: Mapping[str, Any]) -> None:
        """Write ``contract.json`` if it is not there yet (idempotent).

        Without fsync: this is on every submit's path (its largest single cost in the P1
        profile, docs/performance.md), and the record only has to be durable once sealed — the
        seal checks this file, repairs it from the database's contract if a crash left it torn,
        and syncs it with the rest (docs/design.md §12).
        """
        paths.make_dir(self.root, run_id)
        paths.write_exclusive(self.root, run_id, "contract.json", data=_dumps(contract), sync=False)

    def is_sealed(self, run_id: str) -> bool:
        return os.path.lexists(self.dir(run_id) / SEAL)

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
        if os.path.lexists(d / SEAL):
            return False
        paths.make_dir(self.root, run_id, "steps")
        # A cancel right after submit may seal before open wrote the contract; and open does not
        # fsync, so a crash may have left the file empty or torn: repair it from the database.
        wanted = _dumps(contract)
        created = paths.write_exclusive(self.root, run_id, "contract.json", data=wanted)
        if not created and not _is_json(paths.read_bytes(self.root, run_id, "contract.json")):
            self._repair(run_id, "contract.json", wanted)
        files: dict[str, bytes] = {
            "events.jsonl": b"".join(
                (json.dumps(e, sort_keys=True, default=str) + "\n").encode() for e in events
            )
        }
        for seq, name, text in step_logs:
            safe = _SAFE.sub("_", name)
            files[f"steps/{seq:04d}-{safe}.log"] = text.encode("utf-8", "replace")
        # Staged in a folder no other sealer can have (issue 11 §7): a concurrent sealer's
        # files never mix with ours, and whoever creates seal.json first is the one that counts.
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=d))
        try:
            (staging / "steps").mkdir()
            for name, content in files.items():
                _write_synced(staging / name, content)
            if os.path.lexists(d / SEAL):
                return False
            for name in files:
                paths.move_in(staging / name, self.root, run_id, *_parts(name))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        names = ["contract.json", *files]
        digests = {}
        for n in sorted(names):
            data = paths.read_bytes(self.root, run_id, *_parts(n))
            if data is None:
                raise UnsafePath(f"Record file {n} of run {run_id} is not a plain file.")
            digests[n] = hashlib.sha256(data).hexdigest()
        # Durable before seal.json claims it (docs/design.md §12): every file's bytes and the
        # folders' entries reach the disk first, so a crash never leaves a seal over files
        # that are empty or missing.
        paths.sync(self.root, run_id, "contract.json")
        paths.sync(self.root, run_id, "steps")
        paths.sync(self.root, run_id)
        seal = {
            "run_id": run_id,
            "state": state,
            "verdict": verdict,
            "ended_at": ended_at,
            "sha256": digests,
        }
        if not paths.write_exclusive(self.root, run_id, SEAL, data=_dumps(seal)):
            return False
        paths.sync(self.root, run_id)
        for n in [*names, SEAL]:
            paths.make_read_only(self.root, run_id, *_parts(n))
        return True

    def _repair(self, run_id: str, name: str, data: bytes) -> None:
        """Replace a record file a crash left torn, before any seal covers it."""
        d = self.dir(run_id)
        staging = Path(tempfile.mkdtemp(prefix=".repair-", dir=d))
        try:
            _write_synced(staging / "file", data)
            paths.replace_file(staging / "file", self.root, run_id, *_parts(name))
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def manifest(self, run_id: str) -> dict[str, Any] | None:
        """``seal.json`` once sealed, else the list of files so far; None if no record."""
        d = self.dir(run_id)
        if not d.is_dir() or d.is_symlink():
            return None
        sealed = paths.read_bytes(self.root, run_id, SEAL)
        if sealed is not None:
            return dict(json.loads(sealed.decode("utf-8")), sealed=True)
        return {"run_id": run_id, "sealed": False, "files": paths.files_under(d)}

    def read_file(self, run_id: str, name: str) -> bytes | None:
        """One file of the run's own record; None for anything else — another run's file, a
        hidden staging file, a symlink, a name with ``..`` or a separator (issue 11 §1)."""
        parts = _parts(name)
        if not paths.safe_part(run_id) or len(parts) > 2 or not all(map(paths.safe_part, parts)):
            return None
        return paths.read_bytes(self.root, run_id, *parts)

    def verify(self, run_id: str) -> Verification:
        """Re-hash every file against ``seal.json``."""
        if not paths.safe_part(run_id):
            return Verification(run_id, False, (), (), ())
        d = self.dir(run_id)
        raw = paths.read_bytes(self.root, run_id, SEAL)
        if raw is None:
            return Verification(run_id, False, (), (), ())
        sealed: dict[str, str] = json.loads(raw.decode("utf-8"))["sha256"]
        present = set(paths.files_under(d, links=True)) - {SEAL}

        def digest(n: str) -> str | None:
            data = paths.read_bytes(self.root, run_id, *_parts(n))
            return None if data is None else hashlib.sha256(data).hexdigest()

        changed = tuple(sorted(n for n in sealed if n in present and digest(n) != sealed[n]))
        missing = tuple(sorted(set(sealed) - present))
        extra = tuple(sorted(present - set(sealed)))
        return Verification(run_id, True, changed, missing, extra)
