"""mediator/paths.py by itself: the one helper every path from request data goes through
(issue 11 §1; docs/security.md, "Paths"). Worked examples of each refusal, no server needed."""

from __future__ import annotations

import os

import pytest

from mediator import paths
from mediator.paths import UnsafePath


@pytest.mark.parametrize("part", ["", ".", "..", ".hidden", "a/b", "a\\b", "a\x00", "/abs", "é"])
def test_a_part_that_is_not_a_plain_name_is_refused_naming_the_field(tmp_path, part):
    assert not paths.safe_part(part)
    with pytest.raises(UnsafePath) as e:
        paths.confined(tmp_path, part, field="run_id")
    assert e.value.field == "run_id" and e.value.status == 400


def test_a_plain_name_that_resolves_outside_the_root_is_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "out").symlink_to(tmp_path)
    with pytest.raises(UnsafePath):
        paths.confined(root, "out")
    assert paths.confined(root, "in") == root / "in"


def test_make_dir_refuses_to_pass_through_a_symlink(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (root / "run").symlink_to(root / "real")
    (root / "real").mkdir()
    with pytest.raises(UnsafePath):
        paths.make_dir(root, "run", "steps")
    assert not (root / "real" / "steps").exists()


def test_writes_and_reads_never_follow_a_link_on_the_way(tmp_path):
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_text("s")
    (root / "run" / "link").symlink_to(secret)
    (root / "run" / "dirlink").symlink_to(tmp_path)
    assert paths.read_bytes(root, "run", "link") is None
    assert paths.read_bytes(root, "run", "dirlink", "secret") is None
    with pytest.raises(OSError):
        paths.write_exclusive(root, "run", "dirlink", "new", data=b"x")
    assert not paths.write_exclusive(root, "run", "link", data=b"x")  # exists: never written
    assert secret.read_text() == "s" and not (tmp_path / "new").exists()
    assert paths.write_exclusive(root, "run", "f", data=b"ok")
    assert paths.read_bytes(root, "run", "f") == b"ok"


def test_only_regular_files_are_read_and_a_fifo_cannot_hang_the_reader(tmp_path):
    """Found while writing this test: a FIFO planted in a record blocked the open for good."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    assert paths.read_bytes(tmp_path, "fifo") is None
    assert paths.read_bytes(tmp_path, "dir") is None
    assert paths.read_bytes(tmp_path) is None
