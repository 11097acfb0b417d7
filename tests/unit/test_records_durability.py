"""A sealed record is durable, and opening one costs no fsync (docs/design.md §12).

Opening a record is on every submit's path, and its fsync was the largest single cost of a
submit in the P1 profile (docs/performance.md). The record only has to survive a crash once
``seal.json`` claims it, so the open writes ``contract.json`` without fsync and the seal makes
everything durable before it creates ``seal.json``: each file's bytes, then the folders'
entries. A crash between open and seal can leave ``contract.json`` empty or cut short; the seal
repairs it from the database's contract before hashing it.

These tests watch ``os.fsync`` (the real call still runs) to see which files reached the disk
and in which order.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from mediator.records import SEAL, Records

CONTRACT = {"work_id": "w-1", "roles": {"r": {"needs": {}}}, "steps": [{"name": "build"}]}


def _seal(records: Records, run_id: str) -> bool:
    return records.seal(
        run_id,
        contract=CONTRACT,
        state="PASSED",
        verdict="passed",
        ended_at="2026-12-01T00:00:00+00:00",
        events=[{"id": 1, "kind": "settled"}],
        step_logs=[(1, "build", "ok\n")],
    )


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The inode of every fsync'd descriptor, in call order."""
    seen: list[int] = []
    real = os.fsync

    def fsync(fd: Any) -> None:
        seen.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_opening_a_record_does_not_fsync(tmp_path: Path, synced: list[int]) -> None:
    records = Records(tmp_path)
    records.open("r1", CONTRACT)
    assert json.loads((tmp_path / "r1" / "contract.json").read_bytes()) == CONTRACT
    assert synced == []


def test_every_file_and_folder_is_synced_before_seal_json_exists(
    tmp_path: Path, synced: list[int]
) -> None:
    records = Records(tmp_path)
    records.open("r1", CONTRACT)
    assert _seal(records, "r1")
    d = tmp_path / "r1"
    ino = {n: os.stat(d / n).st_ino for n in ("contract.json", "events.jsonl", "steps", ".")}
    ino["log"] = os.stat(d / "steps" / "0001-build.log").st_ino
    seal_at = synced.index(os.stat(d / SEAL).st_ino)
    for name, inode in ino.items():
        assert inode in synced[:seal_at], f"{name} was not synced before seal.json"
    # the folder entry of seal.json itself reaches the disk too
    assert ino["."] in synced[seal_at + 1 :]
    assert records.verify("r1").ok


@pytest.mark.parametrize("torn", [b"", b'{"work_id": "w-1", "ro'], ids=["empty", "cut"])
def test_a_contract_torn_by_a_crash_before_the_seal_is_repaired_from_the_database(
    tmp_path: Path, torn: bytes
) -> None:
    records = Records(tmp_path)
    records.open("r1", CONTRACT)
    (tmp_path / "r1" / "contract.json").write_bytes(torn)  # what a crash may leave
    assert _seal(records, "r1")
    assert json.loads((tmp_path / "r1" / "contract.json").read_bytes()) == CONTRACT
    assert records.verify("r1").ok
    assert [p.name for p in (tmp_path / "r1").iterdir() if p.name.startswith(".")] == []


def test_a_whole_contract_is_kept_as_opened(tmp_path: Path) -> None:
    """Only a file that is not a JSON document counts as torn; the opened bytes stay."""
    records = Records(tmp_path)
    records.open("r1", CONTRACT)
    before = (tmp_path / "r1" / "contract.json").read_bytes()
    assert _seal(records, "r1")
    assert (tmp_path / "r1" / "contract.json").read_bytes() == before


def test_sealing_twice_repairs_nothing_and_writes_nothing(tmp_path: Path) -> None:
    records = Records(tmp_path)
    records.open("r1", CONTRACT)
    assert _seal(records, "r1")
    assert not _seal(records, "r1")  # I6
    assert records.verify("r1").ok
