"""The fleet, one definition for both brokers (issue 14 §1; wake 9 for `caps`).

`sim.platform.fleet.apply` is what a node's daemon does for each fleet event of a plan; the
real-Mediator engine and the reference model both call it and only decide what their broker does
about it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from sim.inputs.scenarios import FleetEvent
from sim.platform import fleet
from sim.platform.fleet import Daemon

ROOT = Path(__file__).resolve().parents[3]


def ev(kind: str, **kw: object) -> FleetEvent:
    return FleetEvent(at_s=0.0, node_id="n1", kind=kind, **kw)  # type: ignore[arg-type]


def test_a_vanished_daemon_loses_its_step_and_its_heartbeat_schedule() -> None:
    d = Daemon("n1", {"board": "a"})
    d.busy, d.claim_pending = ("r1", 0), True
    assert fleet.apply(d, ev("vanish")) == fleet.VANISHED
    assert (d.up, d.busy, d.claim_pending, d.run_epoch, d.advert_epoch) == (
        False,
        None,
        False,
        1,
        1,
    )
    assert fleet.apply(d, ev("vanish")) == fleet.IGNORED  # already dark
    assert fleet.apply(d, ev("restart")) == fleet.IGNORED  # a dark daemon cannot restart


def test_return_boots_a_fresh_instance_with_a_new_schedule() -> None:
    d = Daemon("n1", {})
    assert fleet.apply(d, ev("return")) == fleet.IGNORED  # it is up
    fleet.apply(d, ev("vanish"))
    assert fleet.apply(d, ev("return")) == fleet.RETURNED
    assert (d.up, d.instance, d.advert_epoch) == (True, "n1#1", 2)


def test_restart_keeps_the_schedule_but_loses_the_step() -> None:
    d = Daemon("n1", {})
    d.busy = ("r1", 2)
    assert fleet.apply(d, ev("restart")) == fleet.ADVERTISE
    assert (d.instance, d.busy, d.run_epoch, d.advert_epoch) == ("n1#1", None, 1, 0)


def test_policy_and_capabilities_go_out_at_once_or_on_return() -> None:
    d = Daemon("n1", {"board": "a"})
    assert fleet.apply(d, ev("drain", policy="at-boundary")) == fleet.ADVERTISE
    assert d.daemon_drain == "at-boundary"
    assert fleet.apply(d, ev("undrain")) == fleet.ADVERTISE and d.daemon_drain == ""
    fleet.apply(d, ev("vanish"))
    assert fleet.apply(d, ev("caps", capabilities={"board": "b"})) == fleet.HELD  # wake 9 later
    assert d.daemon_caps == {"board": "b"}
    assert fleet.apply(d, ev("drain")) == fleet.HELD and d.daemon_drain == "graceful"


def test_cancel_is_an_operators_and_leaves_the_daemon_as_it_was() -> None:
    """A `cancel` event (issue 24: wake 2 and the cancel rule in the gate) asks the broker to
    cancel the run leased on the node; the daemon keeps its step in flight, which reports and is
    answered run_ended (docs/design.md §10)."""
    d = Daemon("n1", {"board": "a"})
    d.busy = ("r1", 0)
    assert fleet.apply(d, ev("cancel")) == fleet.CANCEL
    assert (d.up, d.busy, d.instance, d.run_epoch, d.advert_epoch) == (
        True,
        ("r1", 0),
        "n1#0",
        0,
        0,
    )


def test_neither_broker_decides_fleet_events_itself() -> None:
    # issue 14 §1: the daemons' behaviour used to be written twice; then both engines handed the
    # event to `sim.platform.fleet.apply`; now neither broker sees fleet events at all — the one
    # loop, `sim.platform.driver`, applies them and calls the broker as the daemon would.
    kinds = {"vanish", "return", "restart", "drain", "undrain", "caps"}
    for name in ("brokers/mediator.py", "brokers/model.py"):
        tree = ast.parse((ROOT / "sim" / name).read_text("utf-8"))
        compared = {
            c.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Compare)
            for c in ast.walk(node)
            if isinstance(c, ast.Constant) and isinstance(c.value, str)
        }
        assert not compared & kinds, (name, compared & kinds)
        assert "fleet.apply" not in (ROOT / "sim" / name).read_text("utf-8"), name
    assert "fleet.apply(" in (ROOT / "sim" / "platform" / "driver.py").read_text("utf-8")
