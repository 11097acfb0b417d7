"""The lab's own twin (docs/design.md §20): `sim.twin.export` of a small lab day on the real
Mediator, read back as the tables a replay needs — each row checked against what the day did.

The day (seconds from EPOCH; the window is [100, 1000)):
  0    nodes X and Y appear (board x)
  10   `early` submitted, starts on X; 20 its step claimed — still running at `since`
  50   `old` submitted … 60 passed: ended before the window, not exported
  150  `early`'s step passes
  200  Y drains (graceful)
  300  `b` (flash → probe ask → verify) starts on X; flash claimed 310, retried 320, claimed again
       330 (attempt 2), passed 340; the probe asked at 340, answered 400; verify 410 → 420 pass
  500  `c` submitted, starts on X; 520 cancelled
  600  Y's drain lifted; 650 Y restarts (instance i2)
  700  `late` starts on X, its step claimed at 710 — still running at `until`
  2000 `late` passes, after the window: not in it
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import sim
from mediator import Config, Mediator
from mediator.core.errors import MediatorError
from mediator.store.connector import SCHEMA_VERSION
from tests.db.conftest import EPOCH, ManualClock, advert

# scripts/test --fast leaves it out: simulations on the real Mediator
pytestmark = pytest.mark.slow

DAY = Config(advert_ttl_seconds=86_400, lease_ttl_seconds=86_400)
SINCE, UNTIL = EPOCH + timedelta(seconds=100), EPOCH + timedelta(seconds=1000)


@pytest.fixture
def lab(dsn: str, tmp_path: Path) -> Iterator[tuple[Mediator, ManualClock]]:
    clock = ManualClock()
    med = Mediator.connect(dsn, config=DAY, clock=clock, records_root=str(tmp_path / "records"))
    yield med, clock
    med.close()


def one_step(run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, "roles": {"dut": {"board": "x"}},
            "steps": [{"name": "test", "role": "dut", "with": {"cmd": "true"}}]}  # fmt: skip


def at(clock: ManualClock, t: float) -> None:
    clock.now = EPOCH + timedelta(seconds=t)


def do_step(med: Mediator, run_id: str, seq: int, outcome: str | None) -> None:
    node = med.get_run(run_id).steps[seq].node_id
    s = med.claim(run_id, seq, node)
    if outcome is not None:
        med.report(run_id, seq, node, s.attempt, outcome)


def play_the_day(med: Mediator, clock: ManualClock) -> None:
    advert(med, "X")
    advert(med, "Y")
    at(clock, 10)
    med.submit(one_step("early"))
    at(clock, 20)
    do_step(med, "early", 0, None)
    at(clock, 50)
    med.submit(one_step("old"))
    at(clock, 60)
    do_step(med, "old", 0, "pass")
    at(clock, 150)
    med.report("early", 0, "X", 1, "pass")
    at(clock, 200)
    advert(med, "Y", drain="graceful")
    at(clock, 300)
    med.submit({
        "run_id": "b", "work_id": "nightly", "roles": {"dut": {"board": "x"}},
        "steps": [{"name": "flash", "role": "dut", "with": {"cmd": "true"}},
                  {"name": "probe", "kind": "ask", "ask": "Clip the probe", "after": ["flash"]},
                  {"name": "verify", "role": "dut", "after": ["probe"], "with": {"cmd": "true"}}],
    })  # fmt: skip
    at(clock, 310)
    do_step(med, "b", 0, None)
    at(clock, 320)
    med.report("b", 0, "X", 1, "retry")
    at(clock, 330)
    do_step(med, "b", 0, None)
    at(clock, 340)
    med.report("b", 0, "X", 2, "pass")
    at(clock, 400)
    [ask] = med.asks()
    med.answer(ask.ask_id, "done", ok=True)
    at(clock, 410)
    do_step(med, "b", 2, None)
    at(clock, 420)
    med.report("b", 2, "X", 1, "pass")
    at(clock, 500)
    med.submit(one_step("c"))
    at(clock, 520)
    med.cancel("c", principal="cli")
    at(clock, 600)
    advert(med, "Y")
    at(clock, 650)
    advert(med, "Y", instance="i2")
    at(clock, 700)
    med.submit(one_step("late"))
    at(clock, 710)
    do_step(med, "late", 0, None)
    at(clock, 2000)
    do_report = med.get_run("late").steps[0].node_id
    med.report("late", 0, do_report, 1, "pass")


def table(out: Path, name: str) -> list[dict[str, str]]:
    with (out / f"{name}.csv").open() as f:
        return list(csv.DictReader(f))


def test_a_lab_day_exports_the_runs_steps_attempts_asks_and_fleet(
    lab: tuple[Mediator, ManualClock], dsn: str, tmp_path: Path
) -> None:
    med, clock = lab
    play_the_day(med, clock)
    out = tmp_path / "twin"
    done = sim.twin.export(dsn, SINCE, UNTIL.isoformat(), out, progress=False)

    runs = table(out, "runs")
    assert [(r["run_id"], r["submit_s"], r["started_s"], r["ended_s"], r["verdict"],
             r["at_since"], r["at_until"], r["cancelled_s"]) for r in runs] == [
        ("early", "-90.0", "-90.0", "50.0", "pass", "running", "ended", ""),
        ("b", "200.0", "200.0", "320.0", "pass", "new", "ended", ""),
        ("c", "400.0", "400.0", "420.0", "cancelled", "new", "ended", "420.0"),
        ("late", "600.0", "600.0", "", "", "new", "running", ""),
    ]  # fmt: skip
    assert json.loads(runs[1]["needs"]) == {"dut": {"board": "x"}}
    assert runs[1]["work_id"] == "nightly"
    # where each run started: what a replay compares (late's start is in the window too)
    assert [json.loads(r["assigned"]) for r in runs] == [{"dut": "X"}] * 4
    # every node named, in the lab's id order (a pseudonymized replay keeps the matcher's order)
    assert [(n["node_id"], n["order"]) for n in table(out, "nodes")] == [("X", "0"), ("Y", "1")]

    steps = table(out, "steps")
    assert [(s["run_id"], s["seq"], s["name"], s["kind"]) for s in steps if s["run_id"] == "b"] == [
        ("b", "0", "flash", "exec"), ("b", "1", "probe", "ask"), ("b", "2", "verify", "exec"),
    ]  # fmt: skip

    attempts = table(out, "attempts")
    assert [(a["run_id"], a["seq"], a["attempt"], a["node_id"], a["claimed_s"], a["result_s"],
             a["outcome"]) for a in attempts] == [
        ("early", "0", "1", "X", "-80.0", "50.0", "pass"),  # claimed before the window
        ("b", "0", "1", "X", "210.0", "220.0", "retry"),
        ("b", "0", "2", "X", "230.0", "240.0", "pass"),
        ("b", "2", "1", "X", "310.0", "320.0", "pass"),
        ("late", "0", "1", "X", "610.0", "", ""),  # its result lands after the window
    ]  # fmt: skip

    asks = table(out, "asks")
    assert [(a["run_id"], a["seq"], a["raised_s"], a["answered_s"], a["answer_delay_s"], a["ok"])
            for a in asks] == [("b", "1", "240.0", "300.0", "60.0", "true")]  # fmt: skip

    at_since = table(out, "fleet_at_since")
    assert [(n["node_id"], n["instance"], n["drain"], n["present"]) for n in at_since] == [
        ("X", "i1", "", "true"), ("Y", "i1", "", "true"),
    ]  # fmt: skip
    events = table(out, "fleet_events")
    assert [(e["at_s"], e["node_id"], e["kind"], e["instance"], e["drain"]) for e in events] == [
        ("100.0", "Y", "drain_set", "i1", "graceful"),
        ("500.0", "Y", "drain_lifted", "i1", ""),
        ("550.0", "Y", "restarted", "i2", ""),
    ]  # fmt: skip

    manifest = json.loads((out / "twin.json").read_text())
    assert manifest["format"] == "mediator-twin/2" and manifest["schema_version"] == SCHEMA_VERSION
    assert manifest["tables"]["runs"]["rows"] == 4 == done.rows["runs"]
    assert manifest["pseudonymized"] is False

    # Server-side cursors a row at a time write the same tables as the default batches.
    paged = tmp_path / "paged"
    sim.twin.export(dsn, SINCE, UNTIL, paged, progress=False, batch=1)
    for name in manifest["tables"]:
        assert table(paged, name) == table(out, name)


def test_pseudonyms_are_stable_and_consistent_across_tables(
    lab: tuple[Mediator, ManualClock], dsn: str, tmp_path: Path
) -> None:
    med, clock = lab
    play_the_day(med, clock)
    a, b, c = (tmp_path / n for n in "abc")
    sim.twin.export(dsn, SINCE, UNTIL, a, pseudonymize=True, key=b"lab", progress=False)
    sim.twin.export(dsn, SINCE, UNTIL, b, pseudonymize=True, key=b"lab", progress=False)
    sim.twin.export(dsn, SINCE, UNTIL, c, pseudonymize=True, key=b"other", progress=False)
    for name in ("runs", "steps", "attempts", "asks", "fleet_at_since", "fleet_events", "nodes"):
        assert table(a, name) == table(b, name)  # same key, same pseudonyms
    runs = table(a, "runs")
    run_ids = {r["run_id"] for r in runs}
    assert not run_ids & {"early", "b", "c", "late"}
    assert all(r.startswith("r-") and len(r) == 18 for r in run_ids)
    # every table names a run by the same pseudonym
    for name in ("steps", "attempts", "asks"):
        assert {r["run_id"] for r in table(a, name)} <= run_ids
    nodes = {n["node_id"] for n in table(a, "fleet_at_since")}
    assert len(nodes) == 2 and all(n.startswith("n-") for n in nodes)
    assert {x["node_id"] for x in table(a, "attempts")} <= nodes
    assert {e["node_id"] for e in table(a, "fleet_events")} <= nodes
    assert {n for r in runs for n in json.loads(r["assigned"] or "{}").values()} <= nodes
    assert {n["node_id"] for n in table(a, "nodes")} == nodes
    assert runs[1]["work_id"].startswith("w-")
    # the mapping is HMAC-SHA256 under the key: recomputable by whoever holds it
    assert sim.twin.Pseudonyms(b"lab")("run", "early") == runs[0]["run_id"]
    # another key, other pseudonyms
    assert {r["run_id"] for r in table(c, "runs")}.isdisjoint(run_ids)
    # the ask's text never leaves the database
    assert "Clip the probe" not in "".join(p.read_text() for p in a.iterdir())


def test_the_fleet_at_since_counts_expiries_noticed_or_not(dsn: str, tmp_path: Path) -> None:
    """Z expired at 30 and a reaper pass noticed; W expired at 30 unnoticed and came back at 150:
    both are absent at `since` (100). V appeared at 90 and is there."""
    clock = ManualClock()
    med = Mediator.connect(dsn, config=Config(), clock=clock, records_root=str(tmp_path / "r"))
    try:
        advert(med, "Z")
        advert(med, "W")
        at(clock, 40)
        med.reap()  # notices Z and W went at 30
        at(clock, 90)
        advert(med, "V")
        at(clock, 95)
        advert(med, "Z")  # Z returned before `since`
        at(clock, 150)
        advert(med, "W")
    finally:
        med.close()
    out = tmp_path / "twin"
    sim.twin.export(dsn, SINCE, UNTIL, out, progress=False)
    at_since = {n["node_id"]: n["present"] for n in table(out, "fleet_at_since")}
    assert at_since == {"V": "true", "W": "false", "Z": "true"}
    [back] = table(out, "fleet_events")
    assert (back["node_id"], back["kind"], back["at_s"], back["gone_s"]) == (
        "W", "returned", "50.0", "-70.0")  # fmt: skip


def test_the_fleet_at_since_sees_an_expiry_no_reaper_noticed(dsn: str, tmp_path: Path) -> None:
    clock = ManualClock()
    med = Mediator.connect(dsn, config=Config(), clock=clock, records_root=str(tmp_path / "r"))
    try:
        advert(med, "W")
        at(clock, 150)
        advert(med, "W")  # gone at 30, back at 150; no reaper pass in between
    finally:
        med.close()
    out = tmp_path / "twin"
    sim.twin.export(dsn, SINCE, UNTIL, out, progress=False)
    assert [(n["node_id"], n["present"]) for n in table(out, "fleet_at_since")] == [("W", "false")]


def test_a_database_of_another_schema_version_is_refused(dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE schema_version SET version = 6")
    with pytest.raises(
        MediatorError, match=f"schema version 6; this reader needs {SCHEMA_VERSION}"
    ):
        sim.twin.export(dsn, SINCE, UNTIL, tmp_path / "twin", progress=False)
    assert not (tmp_path / "twin" / "twin.json").exists()


def test_the_cli_refuses_a_bad_window_and_an_old_database_in_one_line(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sim.outputs.cli import main

    out = str(tmp_path / "twin")
    args = ["twin", "export", "--database-url", dsn, "--out", out, "--quiet"]
    assert main([*args, "--since", "2031-03-01T12:00Z", "--until", "2031-03-01T11:00Z"]) == 2
    assert capsys.readouterr().err == "sim twin export: until must come after since\n"
    assert main([*args, "--since", "yesterday", "--until", "2031-03-01T11:00Z"]) == 2
    assert "since must be an ISO 8601 instant" in capsys.readouterr().err
    assert main([*args, "--since", "2031-03-01T12:00Z", "--until", "2031-03-02T12:00Z"]) == 0
    assert "wrote" in capsys.readouterr().out
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE schema_version SET version = 6")
    assert main([*args, "--since", "2031-03-01T12:00Z", "--until", "2031-03-02T12:00Z"]) == 2
    err = capsys.readouterr().err
    assert "schema version 6" in err and "Traceback" not in err
