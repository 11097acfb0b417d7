"""Refresh the panel's screenshots in this folder (shown in docs/panel.md).

The pictures are taken by the browser tests themselves (tests/e2e/test_panel.py), so they always
show what the tests check; this script only runs those tests with ``MEDIATOR_SCREENSHOTS`` pointing
here. Usage, from the repository root: ``.venv/bin/python docs/screenshots/make.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def main() -> int:
    env = {**os.environ, "MEDIATOR_SCREENSHOTS": str(HERE)}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
               "tests/e2e/test_panel.py"]  # fmt: skip
    return subprocess.run(command, cwd=REPO, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
