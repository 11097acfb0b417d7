"""The one fleet loop and the broker interface (issue 14 §1).

`sim.platform.driver.Driver` is the fleet — heartbeats, arrivals, claims, results, the reaper, the
stop rule — written once; a broker answers its calls. Here the reference policy
(`sim.brokers.model.Model`) is the broker, wrapped so that every call is recorded: the calls are
what a broker sees, and what the real Mediator (`sim.brokers.mediator.MediatorBroker`) is given in
the same order on the same plan.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sim.brokers.model import Model
from sim.inputs.scenarios import (
    Constant,
    Fleet,
    FleetEvent,
    NodeGroup,
    Scenario,
    Scripted,
    Settings,
    StepSpec,
    Template,
    Workload,
)
from sim.inputs.workload import Plan, materialize
from sim.platform.core import US
from sim.platform.driver import Broker, Driver

CALLS = ("submit", "advert", "work", "claim", "report", "answer", "reap")


class Recording:
    """A broker that forwards to another and records (time in s, call, node/run arguments).

    At every call it also checks the loop's heap: every same-instant tie-break key is an integer
    position (issue 14 §1), never an id string like "r0000012" or "n003".
    """

    def __init__(self, inner: Model, driver: list[Driver]) -> None:
        self._inner = inner
        self._driver = driver
        self.calls: list[tuple[float, str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in CALLS:
            return attr

        def call(*args: Any) -> Any:
            heap = self._driver[0].q.queued() if self._driver else []
            assert all(type(e[2]) is int for e in heap), [e[:3] for e in heap]
            shown = tuple(a for a in args if isinstance(a, int | str) and not isinstance(a, bool))
            self.calls.append((self._inner.now / US, name, shown))
            return attr(*args)

        return call

    # the loop reads and writes these directly
    @property
    def now(self) -> int:
        return self._inner.now

    @now.setter
    def now(self, t: int) -> None:
        self._inner.now = t

    @property
    def touched(self) -> list[int]:
        return self._inner.touched

    @property
    def dirty(self) -> bool:
        return self._inner.dirty


def drive(plan: Plan) -> tuple[Recording, int]:
    holder: list[Driver] = []
    broker = Recording(Model(plan), holder)
    typed: Broker = broker  # type: ignore[assignment]  # (a forwarding proxy)
    driver = Driver(plan, typed)
    holder.append(driver)
    return broker, driver.run()


def scenario(nodes: tuple[str, ...], items: tuple[tuple[float, str], ...], **kw: Any) -> Scenario:
    tpl = Template("t", {"node": {}}, (StepSpec("s", "node", duration=Constant(5.0)),))
    groups = tuple(NodeGroup(1, {}, id_prefix=p) for p in nodes)
    return Scenario(
        name="driver",
        fleet=Fleet(groups, advert_interval_s=10.0, events=kw.pop("events", ())),
        workload=Workload(Scripted(items), (tpl,)),
        settings=Settings(),
        **kw,
    )


def test_one_node_two_runs_the_calls_a_broker_sees() -> None:
    """One node, runs at 1 s and 2 s of 5 s each. The node advertises at 0 and 10 (nothing to
    claim at 0, busy at 10); run 0 is claimed at once; run 1 queues (the node is busy) and is
    promoted by run 0's result at 6 s, and the node, a node of the promoted run, asks for work and
    claims it; run 1's result at 11 s ends it — nothing left to claim, no poll — and leaves
    nothing pending, so the simulation stops there (no horizon)."""
    broker, end = drive(materialize(scenario(("n",), ((1.0, "t"), (2.0, "t")))))
    assert broker.calls == [
        (0.0, "advert", (0,)),
        (0.0, "work", (0, "n000#0")),
        (1.0, "submit", (0,)),
        (1.0, "work", (0, "n000#0")),
        (1.0, "claim", (0, "n000#0")),
        (2.0, "submit", (1,)),
        (6.0, "report", (0, "n000#0", 0, 0, 1, "pass")),
        (6.0, "work", (0, "n000#0")),
        (6.0, "claim", (0, "n000#0")),
        (10.0, "advert", (0,)),
        (11.0, "report", (0, "n000#0", 1, 0, 1, "pass")),
    ]
    assert end == 11 * US


def test_same_instant_order_follows_positions_not_id_strings() -> None:
    """issue 14 §1: at one instant, heartbeats go in node *position* order, whatever the ids
    say. Here position 0 is "b000" and position 1 is "a000": b advertises first at every
    heartbeat, then a — and a vanish/return of a, arrivals and results all carry integer keys
    (`Recording` checks the heap at every call)."""
    sc = scenario(
        ("a", "b"),
        ((0.0, "t"), (0.0, "t"), (3.0, "t")),
        horizon_s=40.0,
        events=(FleetEvent(12.0, "a000", "vanish"), FleetEvent(25.0, "a000", "return")),
    )
    plan = materialize(sc)
    assert [n.node_id for n in plan.nodes] == ["a000", "b000"]
    plan = dataclasses.replace(plan, nodes=tuple(reversed(plan.nodes)))  # b000 is node 0 now
    broker, _ = drive(plan)
    adverts = [(t, args[0]) for t, name, args in broker.calls if name == "advert"]
    at_zero = [node for t, node in adverts if t == 0.0]
    assert at_zero == [0, 1]  # b000 (position 0) before a000, though "a000" < "b000"
    assert (25.0, 1) in adverts  # a's return advertises at once, and its new grid follows
    assert (35.0, 1) in adverts and (30.0, 1) not in adverts
    assert any(name == "reap" for _, name, _ in broker.calls)  # the dark node's lease timer ran
