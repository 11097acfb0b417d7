"""Run records: ``<records_root>/<run_id>/``, opened at submit, sealed once (docs/design.md §12).

Files only — the flows hand in what the database says, so one root can be shared by every Mediator
process and the record is always generated from the committed truth:

* ``contract.json`` at open, by exclusive create (opening twice is a no-op);
* at seal: ``events.jsonl`` and one ``steps/<seq>-<name>.log`` per step, then ``seal.json`` last,
  created exclusively with the sha256 of every other file. Whoever creates ``seal.json`` sealed the
  run; everyone else finds it there and does nothing (I6). A seal's files are read-only from the
  moment it publishes them.

Every path goes through :mod:`mediator.paths` (issue 11 §1): the run id must be a plain name,
and the run's folder is reached from the root by a walk that follows no symlink; every file is
then created, read, linked or renamed relative to that folder's descriptor (issue 13: no path is
resolved per file). Each seal stages its files under hidden names of its own (``.staging-`` and
random digits, created exclusively) beside where they belong and publishes each with a hard link,
which never replaces: concurrent sealers — threads of one process included — never delete or mix
each other's files (issue 11 §7), and a file a seal published itself is hashed from the bytes it
wrote, not read back.
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

from mediator import paths
from mediator.paths import UnsafePath

SEAL = "seal.json"
# A staged file older than this is what a failed or killed seal left (a seal takes seconds);
# younger ones may be a concurrent sealer's and stay (issue 25 §10).
STALE_STAGING_S = 600.0
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


# ---- the record's JSON: json.dumps's bytes, spelled out (issue 13) ------------------------------
# ``json.dumps(indent=2)`` runs the pure-Python encoder (the C one takes no indent on 3.11), and
# every ``json.dumps`` call with options builds a fresh encoder; together they were a fifth of a
# seal. The two functions below give the same bytes for every value json.dumps accepts
# (tests/unit/test_records_json.py checks that on generated documents) in a third of the time.

_ESC = json.encoder.encode_basestring_ascii  # what json.dumps (ensure_ascii) quotes strings with


def _float(o: float) -> str:
    """json's float spelling (``allow_nan``)."""
    if o != o:
        return "NaN"
    if o == float("inf"):
        return "Infinity"
    if o == -float("inf"):
        return "-Infinity"
    return float.__repr__(o)


def _key(k: object) -> str:
    """A dict key as json.dumps turns it into a string (before quoting it)."""
    if isinstance(k, str):
        return k
    if isinstance(k, float):
        return _float(k)
    if k is True:
        return "true"
    if k is False:
        return "false"
    if k is None:
        return "null"
    if isinstance(k, int):
        return int.__repr__(k)
    raise TypeError(f"keys must be str, int, float, bool or None, not {k.__class__.__name__}")


def _pretty(o: Any, out: list[str], nl: str) -> None:
    """Append ``o`` as ``json.dumps(o, indent=2, sort_keys=True, default=str)`` spells it,
    ``nl`` being the newline and indent of the line ``o`` starts on. A document that contains
    itself fails (RecursionError where json.dumps says ValueError): no record has one."""
    if isinstance(o, str):
        out.append(_ESC(o))
    elif o is None:
        out.append("null")
    elif o is True:
        out.append("true")
    elif o is False:
        out.append("false")
    elif isinstance(o, int):
        out.append(int.__repr__(o))
    elif isinstance(o, float):
        out.append(_float(o))
    elif isinstance(o, (list, tuple)):
        if not o:
            out.append("[]")
            return
        inner = nl + "  "
        sep = "[" + inner
        for v in o:
            out.append(sep)
            sep = "," + inner
            _pretty(v, out, inner)
        out.append(nl + "]")
    elif isinstance(o, dict):
        if not o:
            out.append("{}")
            return
        inner = nl + "  "
        sep = "{" + inner
        for k, v in sorted(o.items()):
            out.append(sep + _ESC(_key(k)) + ": ")
            sep = "," + inner
            _pretty(v, out, inner)
        out.append(nl + "}")
    else:
        _pretty(str(o), out, nl)  # default=str


def _dumps(obj: Any) -> bytes:
    """``(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\\n").encode()``."""
    out: list[str] = []
    _pretty(obj, out, "\n")
    out.append("\n")
    return "".join(out).encode()


def _jsonl(items: Iterable[Any]) -> bytes:
    """``json.dumps(item, sort_keys=True, default=str) + "\\n"`` for each item, joined: with
    the one C encoder json.dumps would build per item, built once per call (its own circle
    markers, so threads never share them)."""
    make = json.encoder.c_make_encoder  # type: ignore[attr-defined]
    if make is None:  # a Python without the _json accelerator
        return b"".join((json.dumps(i, sort_keys=True, default=str) + "\n").encode() for i in items)
    encode = make({}, str, _ESC, None, ": ", ", ", True, False, True)
    return "".join(["".join(encode(i, 0)) + "\n" for i in items]).encode()


def _parts(name: str) -> tuple[str, ...]:
    return tuple(name.split("/"))


def _is_json(data: bytes) -> bool:
    """Whether a record file holds a whole JSON document (a crash can leave it empty or cut)."""
    try:
        json.loads(data)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
        return False
    return True


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Records:
    """The record store rooted at ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        Path(root).mkdir(parents=True, exist_ok=True)
        self.root = Path(root).resolve()
        self._root = str(self.root)  # what os.open takes without converting a Path each time

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
        paths.check_part(run_id, "run_id")
        data = _dumps(contract)
        run = paths.open_folder(self._root, run_id, create=True)
        try:
            paths.write_new_at(run, "contract.json", data, sync=False)
        finally:
            os.close(run)

    def sweep_staging(self, older_than_s: float = STALE_STAGING_S) -> int:
        """Remove staged files a seal left behind (a crash between staging and publishing;
        ``mediator serve`` calls this at start). Returns how many were removed. A seal that
        fails by itself — a full disk — removes its own at once (docs/design.md §12)."""
        return paths.sweep_staged(self._root, older_than_s)

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
        paths.check_part(run_id, "run_id")
        run = paths.open_folder(self._root, run_id, create=True)
        try:
            if paths.exists_at(run, SEAL):
                return False
            steps = paths.folder_at(run, "steps", create=True)
            try:
                head = {"run_id": run_id, "state": state, "verdict": verdict, "ended_at": ended_at}
                return self._seal(run, steps, head, contract, events, step_logs)
            finally:
                os.close(steps)
        finally:
            os.close(run)

    def _seal(
        self,
        run: int,
        steps: int,
        head: dict[str, Any],
        contract: Mapping[str, Any],
        events: Iterable[Mapping[str, Any]],
        step_logs: Iterable[tuple[int, str, str]],
    ) -> bool:
        """:meth:`seal` inside the run's folder ``run`` and its ``steps`` folder (descriptors)."""
        digests: dict[str, str] = {}
        files: dict[str, bytes] = {}
        have = self._contract(run, contract)
        if have is None:  # a cancel right after submit may seal before open wrote it
            files["contract.json"] = _dumps(contract)
        else:
            digests["contract.json"] = _digest(have)
        files["events.jsonl"] = _jsonl(events)
        for seq, name, text in step_logs:
            safe = _SAFE.sub("_", name)
            files[f"steps/{seq:04d}-{safe}.log"] = text.encode("utf-8", "replace")
        # Each file is staged whole, synced and read-only under a name no other sealer can have,
        # then published by a hard link (issue 11 §7). The first link wins and is never
        # replaced: every sealer ends up covering the same files.
        staged: list[tuple[int, str, str]] = []  # (folder, staged name, record file name)
        try:
            for rel, data in files.items():
                folder = steps if rel.startswith("steps/") else run
                staged.append((folder, paths.stage_at(folder, data, read_only=True), rel))
            if paths.exists_at(run, SEAL):
                return False
            for folder, stage, rel in staged:
                name = rel.rpartition("/")[2]
                if paths.link_at(folder, stage, name):
                    # The name is our synced file for good (a link never replaces, and nothing
                    # writes into a published file): its bytes are the ones we wrote.
                    digests[rel] = _digest(files[rel])
                    continue
                # Someone published it first — a concurrent sealer, an earlier attempt that
                # failed before seal.json, or (contract.json) an open racing this seal: cover
                # what is there, checked, read-only and synced like any file we did not write.
                there = (
                    self._contract(run, contract)
                    if rel == "contract.json"
                    else paths.read_at(folder, name, freeze=True)
                )
                if there is None:
                    raise UnsafePath(f"The record file {rel} vanished while sealing.")
                digests[rel] = _digest(there)
        finally:
            for folder, stage, _ in staged:
                paths.discard_at(folder, stage)
        # Durable before seal.json claims it (docs/design.md §12): every file's bytes were
        # synced as it was written (or read, above); now the folders' entries, so a crash never
        # leaves a seal over files that are empty or missing.
        os.fsync(steps)
        os.fsync(run)
        seal = {**head, "sha256": dict(sorted(digests.items()))}
        if not paths.write_new_at(run, SEAL, _dumps(seal), read_only=True):
            return False
        os.fsync(run)
        return True

    def _contract(self, run: int, contract: Mapping[str, Any]) -> bytes | None:
        """``contract.json`` as a seal covers it, read-only and synced; None if absent.

        Open does not fsync, so a crash may have left the file empty or cut short: it is then
        replaced by the database's ``contract`` before any seal covers it, and read again.
        Anything but a plain file there is refused (:class:`UnsafePath`).
        """
        data = paths.read_at(run, "contract.json", freeze=True)
        if data is None or _is_json(data):
            return data
        stage = paths.stage_at(run, _dumps(contract), read_only=True)
        try:
            paths.replace_at(run, stage, "contract.json")
        finally:
            paths.discard_at(run, stage)
        return paths.read_at(run, "contract.json", freeze=True)

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
