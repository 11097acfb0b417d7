"""Issue 25 §10: a seal on a full disk lost nothing, but left its staged files for ever (306
``.staging-*`` files after a minute of retries). A seal that fails removes what it staged, and
``mediator serve`` removes at start what a killed seal left (docs/design.md §12).

The full disk is real: ``RLIMIT_FSIZE`` makes the kernel refuse every write past a size, as a
full file system refuses with ENOSPC (here EFBIG), in the middle of ``os.write``.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mediator.records import STALE_STAGING_S, Records
from tests.e2e.servers import start_server

LOG = "x" * 300_000  # larger than the "disk" below


@contextlib.contextmanager
def disk_full_after(size: int) -> Iterator[None]:
    """Writes past ``size`` bytes in one file fail (EFBIG) while inside."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def staged(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".staging-*"))


def seal(records: Records, run_id: str) -> bool:
    return records.seal(
        run_id, contract={"run_id": run_id}, state="PASSED", verdict="PASSED",
        ended_at="2026-12-01T00:00:00Z", events=[{"id": 1, "kind": "RUN_PASSED"}],
        step_logs=[(0, "small", "ok\n"), (1, "big", LOG), (2, "after", "never staged\n")],
    )  # fmt: skip


def test_a_seal_that_fails_on_a_full_disk_leaves_no_staged_file(tmp_path: Path) -> None:
    records = Records(tmp_path / "records")
    records.open("r1", {"run_id": "r1"})
    for _ in range(10):  # the reaper retries a failed seal; each try used to leave files
        with disk_full_after(100_000), pytest.raises(OSError):
            seal(records, "r1")
    assert staged(records.root) == []
    assert not (records.root / "r1" / "seal.json").exists()
    assert seal(records, "r1")  # room again: the seal goes through, and covers everything
    assert records.verify("r1").ok and staged(records.root) == []


def test_a_torn_seal_json_is_not_left_either(tmp_path: Path) -> None:
    """The same rule for a record file created under its own name: ours by O_EXCL, removed."""
    from mediator import paths

    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with disk_full_after(1000), pytest.raises(OSError):
            paths.write_new_at(fd, "seal.json", b"{" + b" " * 5000)
    finally:
        os.close(fd)
    assert list(tmp_path.iterdir()) == []


def plant(records: Path, age_s: float) -> list[Path]:
    run = records / "r-old"
    (run / "steps").mkdir(parents=True, exist_ok=True)
    n = len(list(records.rglob(".staging-*")))
    files = [run / f".staging-{n:016x}", run / "steps" / f".staging-{n + 1:016x}"]
    then = time.time() - age_s
    for f in files:
        f.write_bytes(b"half a seal")
        os.utime(f, (then, then))
    return files


def test_staged_files_a_killed_seal_left_are_removed_at_start(dsn: str, tmp_path: Path) -> None:
    """``mediator serve`` sweeps them; a young one (a concurrent sealer's) and anything that
    is not a regular staged file stay, and no link is followed."""
    records = tmp_path / "records"
    old = plant(records, STALE_STAGING_S + 60)
    young = plant(records, 0)
    outside = tmp_path / "precious"
    outside.write_text("keep")
    link = records / "r-old" / ".staging-00000000000000ff"
    link.symlink_to(outside)
    os.utime(link, (0, 0), follow_symlinks=False)
    (records / "r-link").symlink_to(tmp_path)  # a run folder that is a link: not entered
    (tmp_path / ".staging-00000000000000aa").write_text("not in a run folder of the root")
    os.utime(tmp_path / ".staging-00000000000000aa", (0, 0))
    server = start_server(dsn, tmp_path, records=records)
    try:
        assert any("removed 2 staged record files" in line for line in server.process.output)
    finally:
        assert server.process.stop() == 0
    assert not any(f.exists() for f in old)
    assert all(f.exists() for f in young)
    assert link.is_symlink() and outside.read_text() == "keep"
    assert (tmp_path / ".staging-00000000000000aa").exists()
