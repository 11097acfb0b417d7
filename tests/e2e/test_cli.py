"""``mediator serve`` refusals and ``mediator records verify``, as real processes (§7.7, §8)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.db.conftest import ManualClock, advert, contract

pytestmark = [pytest.mark.e2e]


def mediator_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mediator.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_serve_exits_2_before_listening_on_invalid_configuration(tmp_path):
    r = mediator_cli("serve", "--dev", env={"MEDIATOR_LEASE_TTL_SECONDS": "0"})
    assert r.returncode == 2 and "lease_ttl_seconds" in r.stderr
    r = mediator_cli("serve", "--dev", "--host", "0.0.0.0")
    assert r.returncode == 2 and "loopback" in r.stderr
    r = mediator_cli("serve")  # neither tokens nor --dev
    assert r.returncode == 2 and "tokens" in r.stderr


@pytest.mark.db
def test_records_verify_detects_a_changed_byte(dsn, tmp_path):
    from mediator import Mediator

    records = tmp_path / "records"
    med = Mediator.connect(dsn, clock=ManualClock(), records_root=str(records))
    try:
        advert(med, "X")
        med.submit(contract("a"))
        [step] = med.work("X")
        s = med.claim("a", step.seq, "X")
        med.report("a", s.seq, "X", s.attempt, "pass", log="all good\n")
    finally:
        med.close()
    ok = mediator_cli("--records", str(records), "records", "verify", "a")
    assert (ok.returncode, "ok" in ok.stdout) == (0, True)
    log = records / "a" / "steps" / "0000-dut-0.log"
    log.chmod(0o644)
    log.write_text("all good!\n")
    bad = mediator_cli("--records", str(records), "records", "verify", "a")
    assert bad.returncode == 1
    assert "CHANGED steps/0000-dut-0.log" in bad.stdout
    missing = mediator_cli("--records", str(records), "records", "verify", "nope")
    assert missing.returncode == 1 and "no such record" in missing.stdout


@pytest.mark.db
def test_records_verify_takes_the_short_ids_runctl_prints(dsn, tmp_path):
    """issue 29: runctl shows and takes short ids (the tail of a generated id); verify needed
    the whole id and called a short one "not sealed"."""
    from mediator import Mediator

    records = tmp_path / "records"
    med = Mediator.connect(dsn, clock=ManualClock(), records_root=str(records))
    try:
        advert(med, "X")
        run_id = med.submit(contract(None)).run.run_id  # type: ignore[union-attr]
        [step] = med.work("X")
        s = med.claim(run_id, step.seq, "X")
        med.report(run_id, s.seq, "X", s.attempt, "pass", log="ok\n")
    finally:
        med.close()
    for given in (run_id[-8:], "…" + run_id[-8:]):
        ok = mediator_cli("--records", str(records), "records", "verify", given)
        assert (ok.returncode, ok.stdout) == (0, f"{run_id}: ok — every file matches seal.json\n")
    short = mediator_cli("--records", str(records), "records", "verify", run_id[-3:])
    assert short.returncode == 1 and "no such record" in short.stdout  # too short to be sure


def test_a_data_directory_the_server_user_cannot_reach_is_named_clearly(tmp_path):
    """Running as root, the server runs as an unprivileged user; a data directory inside a
    root-only folder (like pytest's tmp_path) must fail with a message saying so."""
    from mediator import PostgresNotInstalled
    from mediator.pg import EmbeddedPostgres, RunAs

    if RunAs.pick() is None:
        assert os.geteuid() != 0  # not root: the server runs as ourselves, nothing to check
        return
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    with pytest.raises(PostgresNotInstalled) as e:
        EmbeddedPostgres(data_dir=str(locked / "pg"))
    assert "cannot enter" in e.value.message and str(locked) in e.value.message
