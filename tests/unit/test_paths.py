"""mediator/paths.py's descriptor helpers (issue 13), which a record's open and seal now use
instead of resolving a path per file — each keeps issue 11 §1's rules (docs/security.md,
"Paths"): only plain names, nothing followed through a symlink, a planted symlink, FIFO or folder
refused rather than used. Worked examples of each, no server needed.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from mediator import paths
from mediator.paths import UnsafePath


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root").mkdir()
    (tmp_path / "outside").mkdir()
    return tmp_path / "root"


@pytest.fixture
def folder(root: Path) -> Iterator[int]:
    fd = paths.open_folder(root, "run", create=True)
    yield fd
    os.close(fd)


def test_open_folder_makes_what_is_missing_and_reopens_what_is_there(root: Path) -> None:
    for _ in range(2):
        fd = paths.open_folder(root, "run", "steps", create=True)
        os.close(fd)
    assert (root / "run" / "steps").is_dir()
    with pytest.raises(FileNotFoundError):
        paths.open_folder(root, "other")  # without create, nothing is made


@pytest.mark.parametrize("part", ["..", ".", ".hidden", "a/b", "", "é"])
def test_open_folder_refuses_a_part_that_is_not_a_plain_name_naming_the_field(
    root: Path, part: str
) -> None:
    with pytest.raises(UnsafePath) as e:
        paths.open_folder(root, part, create=True, field="run_id")
    assert (e.value.field, e.value.status) == ("run_id", 400)
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("planted", ["symlink", "file", "fifo"])
def test_open_folder_refuses_anything_but_a_plain_folder_and_follows_nothing(
    root: Path, planted: str
) -> None:
    run = root / "run"
    if planted == "symlink":
        run.symlink_to(root.parent / "outside")
    elif planted == "file":
        run.write_text("in the way")
    else:
        os.mkfifo(run)
    with pytest.raises(UnsafePath):
        paths.open_folder(root, "run", "steps", create=True)
    assert list((root.parent / "outside").iterdir()) == []


def test_read_at_gives_a_plain_files_bytes_and_none_for_nothing(root: Path, folder: int) -> None:
    (root / "run" / "f").write_bytes(b"bytes")
    assert paths.read_at(folder, "f") == b"bytes"
    assert paths.read_at(folder, "absent") is None


@pytest.mark.parametrize("planted", ["symlink", "fifo", "folder"])
def test_read_at_refuses_what_is_not_a_plain_file_without_hanging_or_touching_it(
    root: Path, folder: int, planted: str
) -> None:
    secret = root.parent / "outside" / "secret"
    secret.write_text("s")
    secret.chmod(0o600)
    name = root / "run" / "f"
    if planted == "symlink":
        name.symlink_to(secret)
    elif planted == "fifo":
        os.mkfifo(name)  # O_NONBLOCK: a FIFO must not hang the thread that opens it
    else:
        name.mkdir()
    with pytest.raises(UnsafePath):
        paths.read_at(folder, "f", freeze=True)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600  # never chmod'ed through the link


def test_read_at_with_freeze_leaves_the_file_read_only(root: Path, folder: int) -> None:
    (root / "run" / "f").write_bytes(b"x")
    assert paths.read_at(folder, "f", freeze=True) == b"x"
    assert stat.S_IMODE((root / "run" / "f").stat().st_mode) == 0o444


def test_staged_files_are_hidden_distinct_and_never_served(root: Path, folder: int) -> None:
    names = {paths.stage_at(folder, b"x") for _ in range(50)}
    assert len(names) == 50 and all(n.startswith(paths.STAGED) for n in names)
    assert not any(paths.safe_part(n) for n in names)  # read_file and the routes refuse them
    assert paths.files_under(root / "run") == []


def test_a_link_never_replaces_what_is_there(root: Path, folder: int) -> None:
    """Of concurrent publishers exactly one wins, and the winner's file stays (issue 11 §7)."""
    first, second = paths.stage_at(folder, b"first"), paths.stage_at(folder, b"second")
    assert paths.link_at(folder, first, "f")
    assert not paths.link_at(folder, second, "f")
    assert (root / "run" / "f").read_bytes() == b"first"
    (root / "run" / "dangling").symlink_to(root.parent / "outside" / "new")
    assert not paths.link_at(folder, second, "dangling")  # a symlink there is not followed
    assert not (root.parent / "outside" / "new").exists()


def test_without_hard_links_the_staged_file_is_renamed_in_and_read_back(
    root: Path, folder: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system without hard links (EPERM, as vfat says): the name is filled by a rename
    when it is absent, and False tells the caller to read back what is there."""

    def no_links(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    first, second = paths.stage_at(folder, b"first"), paths.stage_at(folder, b"second")
    assert not paths.link_at(folder, first, "f")
    assert not paths.link_at(folder, second, "f")
    assert (root / "run" / "f").read_bytes() == b"first"


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".", ".hidden", ".staging-xyz", ""])
def test_the_descriptor_helpers_take_plain_names_only(folder: int, name: str) -> None:
    for call in (
        lambda: paths.write_new_at(folder, name, b"x"),
        lambda: paths.read_at(folder, name),
        lambda: paths.exists_at(folder, name),
        lambda: paths.discard_at(folder, name),
    ):
        with pytest.raises(UnsafePath):
            call()


def test_write_new_at_creates_once_and_never_through_a_symlink(root: Path, folder: int) -> None:
    target = root.parent / "outside" / "target"
    (root / "run" / "link").symlink_to(target)
    assert not paths.write_new_at(folder, "link", b"x")
    assert not target.exists()
    assert paths.write_new_at(folder, "f", b"one", read_only=True)
    assert not paths.write_new_at(folder, "f", b"two")
    assert (root / "run" / "f").read_bytes() == b"one"
    assert stat.S_IMODE((root / "run" / "f").stat().st_mode) == 0o444
