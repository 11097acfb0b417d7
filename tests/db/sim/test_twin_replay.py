"""Replaying and auditing a lab's twin (docs/design.md §20, "Replaying a twin"; issue 27 §3).

The round trip, exactly: a lab day simulated on the real Mediator (`sim.inputs.twin.lab_day`:
stm32 and imx8 boards, linux hosts, multi-role runs with asks and retries, a board that vanishes
and returns, a drained host, a daemon restart) → `sim.twin.export` from its database → replayed
on the real Mediator and on the model → the same runs start at the same instants on the same
nodes as in the lab. Then the audit: a clean history audits clean, and a run promoted by hand
through SQL, out of FIFO order, is found and named.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

import sim
from mediator import Config, Mediator
from sim.inputs.scenarios import Settings
from sim.inputs.twin import TwinError, lab_day, recorded_decisions
from sim.outputs.audit import audit, production, replay, starting_at
from sim.outputs.cli import main
from sim.outputs.twinreport import twin_report
from tests.db.conftest import EPOCH, ManualClock, advert
from tests.db.sim.test_twin_export import DAY, SINCE, UNTIL, play_the_day

LAB = lab_day(hours=2.0, seed=3)

# One worker: the simulated lab day (the module fixture `day`) is made once, not on each worker.
pytestmark = pytest.mark.xdist_group("twin_day")


@pytest.fixture(scope="module")
def day(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """The lab day on the real Mediator, its database kept, and its whole window exported."""
    lab = sim.twin.simulate_lab(LAB, database_url=cluster.url("postgres"))
    out = tmp_path_factory.mktemp("twin")
    sim.twin.export(lab.database_url, lab.since, lab.until, out, progress=False)
    yield lab, out
    cluster.drop(lab.database_url.rsplit("/", 1)[1].split("?")[0])


def table(folder: Path, name: str) -> list[dict[str, str]]:
    with (folder / f"{name}.csv").open() as f:
        return list(csv.DictReader(f))


def load(folder: Path, **kw: Any) -> sim.Scenario:
    return sim.twin.load(folder, settings=LAB.settings, advert_interval_s=10.0, **kw)


def test_the_export_holds_the_labs_own_decisions(day: tuple[Any, Path]) -> None:
    """What the lab decided (its Result's promotions) is what the twin says it decided."""
    lab, out = day
    promos = lab.result.promotions
    mine = [(round(at * 1e6), r, n) for at, r, n in promos[["at_s", "run_id", "nodes"]].values]
    window = round((lab.until - lab.since).total_seconds() * 1e6)  # [since, until): half open
    assert recorded_decisions(out) == sorted(x for x in mine if x[0] < window)
    assert len(mine) > 60  # a busy enough day: the stm32 board's vanish and the drain among them
    kinds = {row["kind"] for row in table(out, "fleet_events")}
    assert {"expired", "returned", "drain_set", "restarted"} <= kinds


@pytest.mark.parametrize("broker", ["model", "mediator"])
def test_a_lab_day_replays_exactly_on_either_broker(day: tuple[Any, Path], broker: str) -> None:
    """Issue 27 §3: same run, same nodes, same instant — every decision of the window."""
    _lab, out = day
    rep = replay(load(out), broker)
    assert rep.divergence is None, rep.divergence.text()
    assert [d.key for d in rep.policy] == [d.key for d in rep.lab] and len(rep.lab) > 60
    assert rep.result.violations == []


def test_a_replay_that_forgets_the_fleet_history_is_not_exact(day: tuple[Any, Path]) -> None:
    """Not a tautology: the comparison sees a replay whose stm32 board never vanished."""
    _lab, out = day
    twin = load(out)
    rep = replay(twin, "model")
    assert rep.divergence is None
    frozen = out.parent / "frozen"
    frozen.mkdir(exist_ok=True)
    for f in out.iterdir():
        text = f.read_text()
        if f.name == "fleet_events.csv":
            text = text.splitlines()[0] + "\n"
        (frozen / f.name).write_text(text)
    rep = replay(load(frozen), "model")
    assert rep.divergence is not None


def test_a_pseudonymized_twin_replays_the_same_decisions_under_the_pseudonyms(
    day: tuple[Any, Path], tmp_path: Path
) -> None:
    lab, out = day
    key = b"our lab"
    sim.twin.export(lab.database_url, lab.since, lab.until, tmp_path, pseudonymize=True, key=key,
                    progress=False)  # fmt: skip
    names = sim.twin.Pseudonyms(key)
    plain = replay(load(out), "model").policy
    renamed = [
        (d.at_us, names("run", d.run_id),
         ",".join(sorted(str(names("node", n)) for n in d.roles.split(","))))
        for d in plain
    ]  # fmt: skip
    rep = replay(load(tmp_path), "model")
    assert rep.divergence is None
    assert [(d.at_us, d.run_id, d.roles) for d in rep.policy] == renamed


def test_a_window_cut_mid_run_replays_from_its_state_at_since(
    day: tuple[Any, Path], tmp_path: Path
) -> None:
    """Runs running at --since start on the nodes they held, their finished steps left out; the
    window's end stops runs still going. Both brokers reproduce the window."""
    lab, _ = day
    since, until = lab.since + timedelta(seconds=2400), lab.since + timedelta(seconds=6000)
    sim.twin.export(lab.database_url, since, until, tmp_path, progress=False)
    runs = table(tmp_path, "runs")
    assert sum(r["at_since"] == "running" for r in runs) >= 2
    assert sum(r["at_until"] == "running" for r in runs) >= 1
    twin = load(tmp_path)
    for broker in ("model", "mediator"):
        rep = replay(twin, broker)
        assert rep.divergence is None, (broker, rep.divergence.text())
        assert len(rep.lab) > 30
    # and from any instant of a window, the state there being the start (what the audit does)
    later = starting_at(twin, 1234.5)
    assert replay(later, "model").divergence is None
    assert production(later)[0].at_us >= 1_234_500_000


def test_a_clean_history_audits_clean(day: tuple[Any, Path], capsys: Any) -> None:
    _lab, out = day
    result = audit(load(out))
    assert result.clean and result.replays == 1
    assert result.verdict().startswith(f"clean: all {result.decisions} decisions")
    sets = ["--set", "fleet.advert_interval_s=10"]
    assert main(["twin", "audit", str(out), *sets]) == 0
    assert "clean" in capsys.readouterr().out
    assert main(["twin", "replay", str(out), "--broker", "mediator", *sets]) == 0


# ---- a planted anomaly ----------------------------------------------------------------------

HAND = Config(advert_ttl_seconds=86_400, lease_ttl_seconds=86_400, wake_on_return=False)
HAND_SETTINGS = Settings(advert_ttl_seconds=86_400, lease_ttl_seconds=86_400, wake_on_return=False)


def at(clock: ManualClock, t: float) -> None:
    clock.now = EPOCH + timedelta(seconds=t)


def one_step(run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, "roles": {"dut": {"board": "x"}},
            "steps": [{"name": "test", "role": "dut", "with": {"cmd": "true"}}]}  # fmt: skip


def promote_by_hand(dsn: str, run_id: str, node: str, t: float) -> None:
    """What an operator might do in psql: start a queued run on a free node, skipping the
    sweep (and so FIFO)."""
    when = EPOCH + timedelta(seconds=t)
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        assigned = json.dumps({"dut": node})
        conn.execute(
            "UPDATE runs SET state = 'RUNNING', assigned = %s, started_at = %s, "
            "version = version + 1 WHERE run_id = %s",
            (assigned, when, run_id),
        )
        conn.execute(
            "INSERT INTO leases (node_id, run_id, instance, granted_at, not_after) "
            "VALUES (%s, %s, 'i1', %s, %s)",
            (node, run_id, when, when + timedelta(days=1)),
        )
        conn.execute(
            "UPDATE steps SET node_id = %s, chosen = %s WHERE run_id = %s",
            (node, json.dumps({"board": "x"}), run_id),
        )
        conn.execute(
            "INSERT INTO events (at, run_id, node_id, kind, data) VALUES "
            "(%s, %s, '', 'promoted', %s), (%s, %s, %s, 'lease_granted', '{}')",
            (when, run_id, json.dumps({"assigned": {"dut": node}}), when, run_id, node),
        )


def hand_day(dsn: str, tmp_path: Path, plant: bool) -> Path:
    """X runs a; b then c queue behind it; Y appears at 40 (no wake: wake_on_return is off).
    With the plant, c is promoted onto Y by hand at 50, though b is ahead of it; without, the
    day goes as the policy has it (a's result at 100 wakes the queue)."""
    clock = ManualClock()
    med = Mediator.connect(dsn, config=HAND, clock=clock, records_root=str(tmp_path / "records"))
    try:
        advert(med, "X")
        at(clock, 10)
        med.submit(one_step("a"))
        med.claim("a", 0, "X")
        at(clock, 20)
        med.submit(one_step("b"))
        at(clock, 30)
        med.submit(one_step("c"))
        at(clock, 40)
        advert(med, "Y")
        if plant:
            promote_by_hand(dsn, "c", "Y", 50)
            at(clock, 50)
            med.claim("c", 0, "Y")
            at(clock, 80)
            med.report("c", 0, "Y", 1, "pass")
        at(clock, 100)
        med.report("a", 0, "X", 1, "pass")
        for run_id in ("b", "c"):
            run = med.get_run(run_id)
            if run.state == "RUNNING":
                node = run.steps[0].node_id
                at(clock, 150)
                med.claim(run_id, 0, node)
                at(clock, 200)
                med.report(run_id, 0, node, 1, "pass")
    finally:
        med.close()
    out = tmp_path / ("planted" if plant else "clean")
    sim.twin.export(dsn, EPOCH, EPOCH + timedelta(seconds=300), out, progress=False)
    return out


def hand_twin(out: Path) -> sim.Scenario:
    return sim.twin.load(out, settings=HAND_SETTINGS, advert_interval_s=3600.0)


def test_the_audit_names_a_run_promoted_by_hand_out_of_fifo_order(dsn: str, tmp_path: Path) -> None:
    out = hand_day(dsn, tmp_path, plant=True)
    assert [d[1] for d in recorded_decisions(out)] == ["a", "c", "b"]
    for broker in ("model", "mediator"):
        result = audit(hand_twin(out), broker)
        [finding] = result.findings
        assert (finding.run_id, finding.at_s) == ("c", 50.0)
        text = finding.text()
        assert "lab:      c started at 50.000000 s on Y" in text
        assert "policy:   nothing decided at 50.000000 s; next: b started at 100.000000 s" in text
        assert "queue at 50.000000 s, policy: 2 run(s) (lab: 2): b c" in text
        assert result.verdict() == "1 decision(s) of 3 differ from the policy: c"


def test_the_same_day_without_the_plant_audits_clean(dsn: str, tmp_path: Path) -> None:
    out = hand_day(dsn, tmp_path, plant=False)
    assert [d[1] for d in recorded_decisions(out)] == ["a", "b", "c"]  # b on X, c on Y at 100
    assert audit(hand_twin(out), "mediator").clean


def test_the_cli_audit_exits_1_and_names_the_run(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = hand_day(dsn, tmp_path, plant=True)
    sets = [
        "--set",
        "settings.advert_ttl_seconds=86400",
        "--set",
        "settings.lease_ttl_seconds=86400",
        "--set",
        "settings.wake_on_return=false",
        "--set",
        "fleet.advert_interval_s=3600",
    ]
    assert main(["twin", "audit", str(out), *sets]) == 1  # fmt: skip
    printed = capsys.readouterr().out
    assert "1 decision(s) of 3 differ from the policy: c" in printed


def test_a_twin_of_another_format_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "twin.json").write_text(json.dumps({"format": "mediator-twin/1"}))
    with pytest.raises(TwinError, match="format 'mediator-twin/1'; this replay reads"):
        sim.twin.load(tmp_path)
    assert main(["twin", "audit", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "mediator-twin/1" in err and "Traceback" not in err
    assert main(["twin", "audit", str(tmp_path / "nowhere")]) == 2


# ---- what-ifs on the twin (issue 27 §4) ------------------------------------------------------


def waits(result: Any, cls: str) -> Any:
    runs = result.runs
    return runs[runs["template"].str.contains(cls, regex=False)].set_index("source_id")["wait_s"]


def test_more_boards_of_a_class_never_lengthen_its_waits(day: tuple[Any, Path]) -> None:
    """Two stm32 boards more: the recorded boards keep their ids, two new ones advertise the
    class's capabilities, and no stm32 run waits longer (a run each of them took shorter)."""
    _lab, out = day
    twin = load(out)
    more = sim.twin.with_nodes(twin, "board=stm32", 2)
    ids = [n.node_id for n in sim.materialize(more).nodes]
    assert {"stm32-000", "stm32-003", "board=stm32+004", "board=stm32+005"} <= set(ids)
    base, now = sim.run(twin, "model"), sim.run(more, "model")
    before, after = waits(base, "board=stm32"), waits(now, "board=stm32")
    assert (after <= before + 1e-9).all() and (after < before).any()
    assert len(now.runs) == len(base.runs)  # the same runs, as recorded


def test_a_host_fewer_drops_its_history_and_lengthens_the_host_waits(
    day: tuple[Any, Path],
) -> None:
    _lab, out = day
    twin = load(out)
    fewer = sim.twin.with_nodes(twin, "host=linux", -1)
    plan = sim.materialize(fewer)
    assert "host-002" not in {n.node_id for n in plan.nodes}
    assert "host-002" not in {e.node_id for e in plan.fleet_events}
    base, now = sim.run(twin, "model"), sim.run(fewer, "model")
    assert now.runs["wait_s"].mean() > base.runs["wait_s"].mean()
    with pytest.raises(TwinError, match="no node group of class 'board=esp32'"):
        sim.twin.with_nodes(twin, "board=esp32", 1)


def test_a_board_dark_for_an_interval_is_given_nothing_then(day: tuple[Any, Path]) -> None:
    """The vanished-node window on the twin: imx8-000 dark from 1000 s to 4000 s takes no lease
    after its advert expired (30 s) and before it returned."""
    _lab, out = day
    twin = sim.twin.dark(load(out), ["imx8-000"], 1000.0, 4000.0)
    result = sim.run(twin, "model")
    leases = result.leases[result.leases["node_id"] == "imx8-000"]
    granted = leases["granted_at"]
    assert not ((granted > 1030.0) & (granted < 4000.0)).any()
    assert (granted >= 4000.0).any()


def test_scaled_arrivals_keep_the_recorded_runs_and_add_shifted_copies(
    day: tuple[Any, Path],
) -> None:
    _lab, out = day
    twin = load(out)
    n = len(sim.materialize(twin).arrivals)
    more = sim.materialize(sim.twin.scaled(twin, 1.5))
    fewer = sim.materialize(sim.twin.scaled(twin, 0.5))
    assert 1.3 * n < len(more.arrivals) < 1.7 * n
    assert 0.3 * n < len(fewer.arrivals) < 0.7 * n
    copies = [s for s in more.source_ids if "~" in s]
    assert copies and {s.split("~")[0] for s in copies} <= set(sim.materialize(twin).source_ids)
    assert [a.at_s for a in more.arrivals] == sorted(a.at_s for a in more.arrivals)
    # seeded: the same seed, the same draw
    again = sim.materialize(sim.twin.scaled(twin, 1.5))
    assert again.source_ids == more.source_ids


def test_settings_and_fleet_changes_through_set_as_on_any_scenario(
    day: tuple[Any, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`--set` paths reach a twin: max_width 1 refuses the two-role imx8 runs (TOO_WIDE), and
    `python -m sim run DIR` takes the same assignments."""
    _lab, out = day
    narrow = load(out).with_sets(["max_width=1"])
    result = sim.run(narrow, "model")
    hil = result.runs[result.runs["template"].str.startswith("ctl[")]
    assert len(hil) and (hil["reject"] == "TOO_WIDE").all()
    sets = ["--set", "fleet.groups.1.count=6", "--set", "workload.arrivals.scale=1.2",
            "--set", "settings.wake_on_return=false", "--set", "fleet.advert_interval_s=10",
            "--set", 'fleet.events=[{at_s=600, node_id="host-001", kind="vanish"}, '
                     '{at_s=900, node_id="host-001", kind="return"}]']  # fmt: skip
    assert main(["run", str(out), "--broker", "model", "--quiet", *sets]) == 0
    assert "twin:" in capsys.readouterr().out


def test_capacity_plans_work_on_a_twin(day: tuple[Any, Path]) -> None:
    """sim.plan sizes one class of the twin; the per-class plan sizes every class, one
    replication (a twin at scale 1 is deterministic)."""
    _lab, out = day
    twin = load(out)
    stm32 = sim.twin.group_of(twin, "board=stm32")
    p = sim.plan(twin, {"quantile": 0.95, "wait_s": 600}, [1, 2, 3, 4], group=stm32,
                 confirm_replications=0, progress=False)  # fmt: skip
    frame = p.to_frame()
    assert list(frame["replications"]) == [1, 1, 1, 1]
    assert frame["wait_p95_s"].is_monotonic_decreasing
    per = sim.plan(twin, {"quantile": 0.95, "wait_s": 600}, [1, 2, 3, 4], per_class=True)
    assert per.counts is not None and set(per.counts) == {g.id_prefix for g in twin.fleet.groups}


# ---- the lab's report (issue 27 §5) ----------------------------------------------------------


def test_the_twin_report_answers_for_that_lab(
    day: tuple[Any, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m sim report --twin DIR`: nodes per class at the recorded and at grown load,
    each what-if against the recorded replay, the audit's verdict."""
    _lab, out = day
    sets = ["--set", "fleet.advert_interval_s=10"]
    assert main(["report", "--twin", str(out), "--out", str(tmp_path), "--wait", "900", *sets]) == 0
    printed = capsys.readouterr().out
    assert "To keep the p95 wait within 15 min:" in printed and "at the recorded load" in printed
    assert "Audit: clean: all" in printed
    page = (tmp_path / "index.html").read_text()
    for row in ("as recorded", "+1 board=stm32", "−1 host=linux", "arrivals ×1.5", "wake 7 off",
                "max_width 1", "stm32-000 dark"):  # fmt: skip
        assert f"<td>{row}" in page, row
    rep = twin_report(load(out), target={"wait_s": 900})
    assert rep.today.counts is not None
    fewer_hosts = next(w for w in rep.what_ifs if w.name == "−1 host=linux")
    assert fewer_hosts.p95_s >= rep.recorded.p95_s
    narrow = next(w for w in rep.what_ifs if w.name == "max_width 1")
    assert np.isnan(narrow.by_class["arch=arm,board=imx8+"])  # its two-role runs: TOO_WIDE


def test_the_export_tests_day_replays_exactly(dsn: str, tmp_path: Path) -> None:
    """The export test's hand-played day (tests/db/sim/test_twin_export.py) — a run running at
    --since, a step retried, an ask answered after a minute, a run cancelled while running, a
    drain, a restart, a run still going at --until — replays to the same decisions."""
    clock = ManualClock()
    med = Mediator.connect(dsn, config=DAY, clock=clock, records_root=str(tmp_path / "records"))
    try:
        play_the_day(med, clock)
    finally:
        med.close()
    out = tmp_path / "twin"
    sim.twin.export(dsn, SINCE, UNTIL, out, progress=False)
    settings = Settings(advert_ttl_seconds=86_400, lease_ttl_seconds=86_400)
    twin = sim.twin.load(out, settings=settings, advert_interval_s=3600.0)
    for broker in ("model", "mediator"):
        rep = replay(twin, broker)
        assert rep.divergence is None, (broker, rep.divergence.text())
        assert [d.run_id for d in rep.lab] == ["b", "c", "late"]
    # the run running at --since starts at 0 on X, pinned; its step ends where it did (50 s)
    plan = sim.materialize(twin)
    early = plan.arrivals[plan.source_ids.index("early")]
    assert early.contract["roles"]["dut"] == {"board": "x", "twin.node": "X"}
    assert early.step_outcomes[0][0] == (50.0, "pass")
    # c, cancelled while running at 420 s, fails there
    c = plan.arrivals[plan.source_ids.index("c")]
    assert (c.at_s, c.step_outcomes[0][0]) == (400.0, (20.0, "fail"))
