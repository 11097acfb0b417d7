"""scripts/setup says what it is doing (issue 29 §7: a first setup was minutes of silence).

Run here on a copy of the script beside a virtual environment that is already installed (the
stamp of this pyproject.toml present), so it takes its quick path on any machine: each of its
three steps is named with its outcome and duration, on stderr, and stdout stays empty."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_setup_names_each_step_and_how_it_ended(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "setup", tmp_path / "scripts" / "setup")
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, tmp_path / ".venv" / "bin" / "python")
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (tmp_path / ".venv" / f".installed-{digest}").touch()
    proc = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "setup")],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    for n, what in ((1, "system packages"), (2, "virtual environment"), (3, "the project")):
        assert any(line.startswith(f"setup: [{n}/3] {what}") for line in lines), proc.stderr
    assert "up to date (pyproject.toml unchanged)" in proc.stderr
    assert lines[-1].startswith("setup: ready"), proc.stderr
    assert len(lines) <= 12  # a few lines in a CI log, not hundreds
