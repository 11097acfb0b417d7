"""Sealing a record from its folder's descriptor (issue 13) keeps every guarantee it had:

* the bytes of every file are what they were (a worked example, spelled out below) and every
  sealed file is read-only;
* a symlink, FIFO or folder planted in place of any record file or folder is refused, never
  followed, and nothing is sealed (issue 11 §1, docs/security.md "Paths");
* sealers in separate processes — like threads (tests/adversarial/test_seal_race.py) — never
  delete or mix each other's files, and exactly one of them seals (issue 11 §7, I6);
* a file someone else published first is covered as it is, read back, not as we would have
  written it; without hard links (a file system that has none) the seal still works.
"""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from mediator import paths
from mediator.paths import UnsafePath
from mediator.records import SEAL, Records

CONTRACT = {"run_id": "r1", "roles": {"dut": {"board": "x"}}, "steps": [{"name": "build"}]}
EVENTS = [
    {"id": 1, "kind": "submitted", "data": {"needs": {"board": "x"}}},
    {"id": 2, "kind": "settled", "data": {"verdict": "pass"}},
]


def seal(records: Records, run_id: str = "r1") -> bool:
    return records.seal(
        run_id,
        contract=CONTRACT,
        state="PASSED",
        verdict="pass",
        ended_at="2026-12-01T00:00:00+00:00",
        events=EVENTS,
        step_logs=[(1, "build", "ok ✓\n"), (2, "test/../x", "fine\n")],
    )


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_sealed_record_byte_for_byte(tmp_path: Path) -> None:
    """The files as records have always been spelled: a record sealed before issue 13 and one
    sealed after are the same bytes, so both verify and compare equal."""
    records = Records(tmp_path)
    records.open("r1", CONTRACT)
    assert seal(records)
    d = tmp_path / "r1"
    contract = (
        b'{\n  "roles": {\n    "dut": {\n      "board": "x"\n    }\n  },\n  "run_id": "r1",\n'
        b'  "steps": [\n    {\n      "name": "build"\n    }\n  ]\n}\n'
    )
    events = (
        b'{"data": {"needs": {"board": "x"}}, "id": 1, "kind": "submitted"}\n'
        b'{"data": {"verdict": "pass"}, "id": 2, "kind": "settled"}\n'
    )
    files = {
        "contract.json": contract,
        "events.jsonl": events,
        "steps/0001-build.log": "ok ✓\n".encode(),
        "steps/0002-test_.._x.log": b"fine\n",
    }
    for name, data in files.items():
        assert (d / name).read_bytes() == data, name
    digests = ",\n".join(f'    "{n}": "{sha(b)}"' for n, b in sorted(files.items()))
    assert (d / SEAL).read_text() == (
        '{\n  "ended_at": "2026-12-01T00:00:00+00:00",\n  "run_id": "r1",\n'
        f'  "sha256": {{\n{digests}\n  }},\n  "state": "PASSED",\n  "verdict": "pass"\n}}\n'
    )
    assert sorted(str(p.relative_to(d)) for p in d.rglob("*")) == sorted(
        [*files, SEAL, "steps"]
    )  # no staged file left beside them


def test_every_sealed_file_is_read_only(tmp_path: Path) -> None:
    records = Records(tmp_path)
    records.open("r1", CONTRACT)
    assert seal(records)
    for name in ("contract.json", "events.jsonl", "steps/0001-build.log", SEAL):
        assert stat.S_IMODE((tmp_path / "r1" / name).stat().st_mode) == 0o444, name


def test_a_record_never_opened_is_sealed_with_the_databases_contract(tmp_path: Path) -> None:
    """A cancel right after submit may seal before open wrote contract.json (docs/design.md §12)."""
    records = Records(tmp_path)
    assert seal(records)
    assert json.loads((tmp_path / "r1" / "contract.json").read_bytes()) == CONTRACT
    assert records.verify("r1").ok


@pytest.mark.parametrize("run_id", ["..", ".", ".hidden", "a/b", "", "../outside"])
def test_a_run_id_that_is_not_a_plain_name_is_refused_and_nothing_is_written(
    tmp_path: Path, run_id: str
) -> None:
    records = Records(tmp_path / "root")
    for call in (lambda: records.open(run_id, CONTRACT), lambda: seal(records, run_id)):
        with pytest.raises(UnsafePath) as e:
            call()
        assert (e.value.field, e.value.status) == ("run_id", 400)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["root"]


# What may be planted in place of each record file or folder before the seal, and where.
PLANTED = [
    ("run folder, symlink out", "", "symlink-dir"),
    ("run folder, a file", "", "file"),
    ("steps, symlink out", "steps", "symlink-dir"),
    ("steps, a FIFO", "steps", "fifo"),
    ("contract.json, symlink", "contract.json", "symlink"),
    ("contract.json, FIFO", "contract.json", "fifo"),
    ("contract.json, folder", "contract.json", "folder"),
    ("events.jsonl, symlink", "events.jsonl", "symlink"),
    ("events.jsonl, FIFO", "events.jsonl", "fifo"),
    ("step log, symlink", "steps/0001-build.log", "symlink"),
    ("step log, folder", "steps/0001-build.log", "folder"),
]


@pytest.mark.parametrize(("what", "where", "kind"), PLANTED, ids=[p[0] for p in PLANTED])
def test_anything_planted_in_place_of_a_record_file_or_folder_is_refused_not_followed(
    tmp_path: Path, what: str, where: str, kind: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret"
    secret.write_bytes(b"not a record's\n")
    secret.chmod(0o600)
    records = Records(tmp_path / "root")
    run = tmp_path / "root" / "r1"
    if where:
        (run / "steps").mkdir(parents=True)
    target = run / where if where else run
    if target.is_dir() and where == "steps":
        target.rmdir()
    if kind == "symlink-dir":
        target.symlink_to(outside)
    elif kind == "symlink":
        target.symlink_to(secret)
    elif kind == "file":
        target.write_text("in the way")
    elif kind == "fifo":
        os.mkfifo(target)  # must not hang the sealing thread
    else:
        target.mkdir()
    with pytest.raises(UnsafePath):
        seal(records)
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]  # nothing written through
    assert secret.read_bytes() == b"not a record's\n"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600  # nor chmod'ed through a link
    if where:  # the run folder itself is a plain folder: nothing sealed in it
        assert not os.path.lexists(run / SEAL) and not records.verify("r1").sealed


def test_a_file_someone_else_published_first_is_covered_as_it_is(tmp_path: Path) -> None:
    """An earlier seal that failed before seal.json (or a concurrent one) left events.jsonl:
    the link does not replace it, and the seal hashes what is there — read back."""
    records = Records(tmp_path)
    records.open("r1", CONTRACT)
    (tmp_path / "r1" / "steps").mkdir()
    earlier = b'{"id": 1, "kind": "submitted"}\n'
    (tmp_path / "r1" / "events.jsonl").write_bytes(earlier)
    assert seal(records)
    manifest = records.manifest("r1")
    assert manifest is not None and manifest["sha256"]["events.jsonl"] == sha(earlier)
    assert (tmp_path / "r1" / "events.jsonl").read_bytes() == earlier
    assert stat.S_IMODE((tmp_path / "r1" / "events.jsonl").stat().st_mode) == 0o444
    assert records.verify("r1").ok


def test_an_open_that_lands_while_the_seal_stages_its_contract_is_what_is_sealed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seal found no contract.json and staged one; open wrote its own before the link. The
    link loses, and the seal covers open's file, checked like any contract."""
    records = Records(tmp_path)
    opened = {**CONTRACT, "note": "written by open"}
    real = paths.link_at

    def open_first(dir_fd: int, staged: str, name: str) -> bool:
        if name == "contract.json":
            records.open("r1", opened)
        return real(dir_fd, staged, name)

    monkeypatch.setattr(paths, "link_at", open_first)
    assert seal(records)
    assert json.loads((tmp_path / "r1" / "contract.json").read_bytes()) == opened
    assert records.verify("r1").ok


def test_without_hard_links_a_seal_still_covers_every_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system without hard links (EPERM): files are renamed in and read back."""

    def no_links(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    records = Records(tmp_path)
    records.open("r1", CONTRACT)
    assert seal(records)
    assert not seal(records)
    assert records.verify("r1").ok
    assert [p for p in tmp_path.rglob(".*")] == []


PROCESSES = 6
RUNS = 8


def _sealer(root: str, start: Any, out: Any) -> None:
    """One sealing process: every run, in an order of its own, after all have started."""
    records = Records(root)
    start.wait(timeout=60)
    pid = os.getpid()
    mine = [f"run-{(n + pid) % RUNS}" for n in range(RUNS)]
    try:
        out.put((pid, [r for r in mine if seal(records, r)], None))
    except BaseException as exc:  # any failure at all is the finding
        out.put((pid, [], repr(exc)))


@pytest.mark.slow  # scripts/test --fast leaves it out
def test_sealers_in_separate_processes_seal_each_run_exactly_once(tmp_path: Path) -> None:
    """Issue 11 §7 across processes (one records root shared by several Mediator processes):
    each run is sealed by exactly one of them, nothing is lost or mixed, nothing is left."""
    root = tmp_path / "records"
    Records(root)
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_sealer, args=(str(root), start, out)) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    answers = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [err for _, _, err in answers if err] == []
    sealed = sorted(r for _, runs, _ in answers for r in runs)
    assert sealed == sorted(f"run-{n}" for n in range(RUNS))  # each exactly once (I6)
    records = Records(root)
    for n in range(RUNS):
        assert records.verify(f"run-{n}").ok
    assert [p for p in root.rglob(".*")] == []
