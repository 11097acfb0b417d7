"""Issue 11 §9: configuration that cannot work is refused in one place — file, environment or
flag — and ``mediator serve`` exits 2 naming the setting before anything listens."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e]

NUMERIC = ["lease_ttl_seconds", "renew_seconds", "advert_ttl_seconds"]


def serve(
    *args: str, env: dict[str, str] | None = None, before: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # A configuration that passes would meet a database that is not there (exit 1, not 2).
        [sys.executable, "-m", "mediator.cli.main", *before, "serve", "--dev",
         "--database-url", "postgresql://127.0.0.1:1/none?connect_timeout=1", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )  # fmt: skip


# Every setting × value is checked in-process (tests/unit/test_config.py); here each source is
# shown to reach that one check through the real command, a process per case.
CASES = [(s, "nan") for s in NUMERIC] + [("lease_ttl_seconds", v) for v in ("inf", "1e-9")]


@pytest.mark.parametrize(("setting", "value"), CASES)
def test_nonsense_in_the_environment_exits_2_naming_the_setting(setting, value):
    r = serve(env={f"MEDIATOR_{setting.upper()}": value})
    assert r.returncode == 2 and setting in r.stderr, (r.returncode, r.stderr[-300:])
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("value", ["nan"])
def test_nonsense_in_the_file_exits_2_naming_the_setting(tmp_path, value):
    f = tmp_path / "m.toml"
    f.write_text(f"[mediator]\nlease_ttl_seconds = {value}\n")
    r = serve(before=("--config", str(f)))
    assert r.returncode == 2 and "lease_ttl_seconds" in r.stderr, r.stderr[-300:]


@pytest.mark.parametrize("port", ["70000"])
def test_nonsense_flags_exit_2(port):
    r = serve("--port", port)
    assert r.returncode == 2 and "port" in r.stderr, r.stderr[-300:]
