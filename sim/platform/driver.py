"""The one simulation loop: the fleet's daemons in virtual time, driving a broker (issue 14 §1).

Why one loop: the simulator is one platform with two schedulers plugged in (the split Batsim
uses) — the real Mediator (`sim.brokers.mediator.MediatorBroker`) and the reference policy
(`sim.brokers.model.Model`). Everything the *fleet* does — heartbeats on their grid, fleet events,
arrivals, claims in claim order, results, answers to asks, reaper ticks, when to stop, when to
look for stuck runs — is written here once. A broker only answers the calls a node daemon, a
submitter, a human or the reaper timer would make (`DaemonCalls`) and the loop's own questions
about its state (`Oracle`: whom to let poll, when to stop, which runs are stuck); when the loop was
written into each engine, the differential test (tests/db/sim/test_sim.py) could report a
difference in how the fleet was driven as a scheduling difference.

**What the daemons do** (docs/design.md §20):

- every node advertises at t = 0 and then every `advert_interval_s` while it is up; a fleet event
  changes its daemon through `sim.platform.fleet.apply`: an up node advertises the change at once,
  keeping its schedule (a return starts a new one from now); a dark node takes a new policy or
  capabilities on return. The advert's expiry (what the broker returned) is when a dark node stops
  looking live; a bookkeeping event marks it, for stuck accounting.
- a node runs one step at a time. When it is idle and up, and not draining at-boundary (the broker
  would refuse the claim), it asks for work after every event that concerns it — its advert, a
  start, result (its own included) or answer of a run it serves — and claims the
  lowest-positioned claimable step: at once with claim latency 0, else `fleet.claim_latency_s` later
  (rechecking then). Its result is reported `duration_s` after the claim, the plan's pre-sampled
  attempt; a daemon that vanished or restarted meanwhile never reports it (`Daemon.run_epoch`).
- a human answers an ask `delay_s` after it is raised.
- the reaper runs at k·renew_seconds while some node is dark and may still be given a lease (its
  advert has not expired) or still holds one; only a dark node's lease can expire (live nodes
  renew theirs with every advert), so the passes in between could find nothing.

**Same-instant order** is `sim.platform.core`'s: `(time, class, key)`, every key an integer position
— the node's index in `plan.nodes`, the run's in `plan.arrivals`, the event's in
`plan.fleet_events` — never an id string. Idle nodes of a run claim in node order.

**Stopping.** With `horizon_s` the simulation covers [0, horizon_s]; without it, it stops once no
arrival, step, answer, claim, fleet event or reaper pass is pending and no at-boundary drain is
still to finish.

**Stuck** (docs/design.md §20): an interval in which a QUEUED run could have been promoted —
matching it against the live, free fleet gives an assignment — but was not. After an event the
loop asks the broker which queued runs are promotable when the broker says something may have
changed without a sweep (`Broker.dirty`) or an interval is open; intervals still open at the end
are reported open.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from sim.inputs.workload import Plan
from sim.platform import fleet
from sim.platform.core import (
    ADVERT,
    ARRIVAL,
    CLAIM,
    FLEET,
    MARK,
    REAPER,
    RESULT,
    STEP_KEY,
    US,
    EventQueue,
    to_us,
)
from sim.platform.fleet import Daemon


class DaemonCalls(Protocol):
    """The calls a node daemon, a submitter, a human or the reaper timer makes — the Mediator's
    public interface, in the simulator's positions.

    Runs are named by their position in `plan.arrivals`, nodes by theirs in `plan.nodes`, steps by
    their position in the contract. A broker keeps its own view of the fleet (what adverts told
    it); it never reads a `Daemon` beyond what a call passes.
    """

    now: int
    """Virtual time in µs; the loop sets it before every event (the Mediator's clock reads it)."""

    touched: list[int]
    """Runs started, promoted, or with a result or answer since the loop last looked (a broker
    may leave out runs that ended: nothing is left to claim there); the loop empties it after
    every event and lets those runs' idle nodes ask for work."""

    def submit(self, run: int) -> None:
        """Submit the run's contract (R1, wake 8)."""

    def advert(self, node: int, daemon: Daemon, heartbeat: bool) -> int:
        """Advertise the daemon's capabilities, instance and drain policy; return when the advert
        expires (µs). `heartbeat`: a periodic one, not a fleet change."""
        ...

    def work(self, node: int, instance: str) -> Any:
        """The node's lowest-positioned claimable step (a broker's own handle), or None."""

    def claim(self, node: int, instance: str, step: Any) -> tuple[int, int, int]:
        """Claim a step `work` returned; return (run, step, attempt number from 1)."""
        ...

    def report(
        self, node: int, instance: str, run: int, step: int, attempt: int, outcome: str
    ) -> None:
        """Report an attempt's outcome (`pass`, `fail`, `retry`; wake 1)."""

    def asked(self, run: int) -> Iterable[int]:
        """The run's steps with an open ask (what a human sees in the asks list)."""
        ...

    def answer(self, run: int, step: int, ok: bool) -> None:
        """Answer the run's open ask on `step`, if it is still open (wake 1)."""

    def reap(self) -> None:
        """One reaper pass (wake 3)."""

    def cancel(self, node: int) -> None:
        """An operator cancels the RUNNING run the node holds a lease for, if any (wake 2)."""


class Oracle(Protocol):
    """The loop's questions about the broker's state, which no daemon would ask: whom to let
    poll, when to stop, when to run the reaper timer, which runs are stuck. They read the
    broker's state (the real Mediator answers them by read-only SQL) and change nothing."""

    @property
    def dirty(self) -> bool:
        """Whether a queued run may have become promotable without a sweep (then the loop runs
        the stuck check); `promotable` clears it."""
        ...

    def nodes_of(self, run: int) -> Iterable[int]:
        """The nodes that may claim steps of the run now (those leased to it while it runs), in
        node order: the order idle nodes claim in."""
        ...

    def holds_lease(self, nodes: list[int]) -> bool:
        """Whether any of these nodes holds a lease."""
        ...

    def drain_pending(self, nodes: list[int]) -> bool:
        """Whether one of these (up, draining at-boundary) nodes holds a lease of a running run:
        an at-boundary drain its next advert will finish."""
        ...

    def promotable(self) -> Iterable[int]:
        """The QUEUED runs that matching against the live, free fleet would promote now."""
        ...

    def note_fleet(self, node: int, kind: str, applied: bool) -> None:
        """A fleet event was applied to the node's daemon (or ignored) — for the broker's log."""


class Broker(DaemonCalls, Oracle, Protocol):
    """What the loop drives: the daemons' calls and the loop's questions, one object."""


class Driver:
    """One simulation of a plan against one broker (see the module docstring)."""

    def __init__(
        self,
        plan: Plan,
        broker: Broker,
        *,
        exhaustive_stuck: bool = False,
        every: int = 0,
        hook: Callable[[int], bool | None] | None = None,
    ) -> None:
        """`exhaustive_stuck` checks for stuck runs after every event (slow; tests check the
        brokers' `dirty` with it); `hook(events)` is called every `every` events, and a true
        answer stops the simulation there (`stopped`: the result covers the run so far)."""
        sc = plan.scenario
        st = sc.settings
        self.plan = plan
        self.broker = broker
        self.interval = to_us(sc.fleet.advert_interval_s)
        self.renew = to_us(st.renew_seconds)
        self.latency = to_us(sc.fleet.claim_latency_s)
        self.end = to_us(sc.horizon_s) if sc.horizon_s is not None else None
        self.exhaustive_stuck = exhaustive_stuck
        self.every = every if hook is not None else 0
        self.hook = hook
        self.stopped = False  # the hook stopped the loop before the plan's end
        self.daemons = [Daemon(n.node_id, dict(n.capabilities)) for n in plan.nodes]
        self.pos = {n.node_id: i for i, n in enumerate(plan.nodes)}
        self.expires = [-1] * len(self.daemons)  # when each node's last advert expires
        self.now = 0
        self.q = EventQueue()
        self._schedule = self.q.push  # (bound once: the hot paths push through it)
        self.pending = 0  # scheduled events other than heartbeats and marks
        self.reaper_on = False
        self.asked: set[int] = set()  # step_key of every ask whose answer is scheduled
        self.has_ask: dict[int, bool] = {}  # per contract's steps list (by id): any ask step
        self.stuck_open: dict[int, int] = {}  # run → since (µs)
        self._stuck: list[tuple[int, int, int, bool]] = []  # start, run, end, open
        # after `run`: run_id, start, end, open — by start, then run position
        self.stuck_rows: list[tuple[str, int, int, bool]] = []

    # -- scheduling -----------------------------------------------------------------------------

    def _push(self, t: int, cls: int, key: int, action: Callable[[Any], object], arg: Any) -> None:
        if cls != ADVERT and cls != MARK:
            self.pending += 1
        self.q.push(t, cls, key, action, arg)

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> int:
        """Simulate the whole plan; return where it stopped (µs). Stuck intervals are then in
        `stuck_rows`, ordered by start and run position."""
        for i, d in enumerate(self.daemons):  # every daemon starts at t = 0
            self._push(0, ADVERT, i, self._on_advert, (i, d.advert_epoch))
        if self.plan.arrivals:
            self._push(to_us(self.plan.arrivals[0].at_s), ARRIVAL, 0, self._on_arrival, 0)
        if self.plan.fleet_events:
            self._push(to_us(self.plan.fleet_events[0].at_s), FLEET, 0, self._on_fleet, 0)
        broker = self.broker
        touched, stuck_open = broker.touched, self.stuck_open
        end, every, exhaustive = self.end, self.every, self.exhaustive_stuck
        events = 0
        for t, cls, _key, _seq, action, arg in self.q.events(end):
            self.now = broker.now = t
            if cls != ADVERT and cls != MARK:
                self.pending -= 1
            action(arg)
            if touched:
                self._dispatch(touched)
            if stuck_open or broker.dirty or exhaustive:
                self._check_stuck()
            if every:
                events += 1
                if events % every == 0:
                    assert self.hook is not None
                    if self.hook(events):
                        self.stopped = True
                        break
            if end is None and self.pending == 0 and not self._drain_pending():
                break
        if end is not None and end > self.now and not self.stopped:
            self.now = broker.now = end
        for run, since in self.stuck_open.items():
            self._stuck.append((since, run, self.now, True))
        self.stuck_open.clear()
        arrivals = self.plan.arrivals  # rows by start, then run position (sim.platform.core)
        self.stuck_rows = [(arrivals[r].run_id, t0, t1, o) for t0, r, t1, o in sorted(self._stuck)]
        return self.now

    def _drain_pending(self) -> bool:
        nodes = [i for i, d in enumerate(self.daemons) if d.up and d.daemon_drain == "at-boundary"]
        return bool(nodes) and self.broker.drain_pending(nodes)

    # -- arrivals -------------------------------------------------------------------------------

    def _on_arrival(self, i: int) -> None:
        arrivals = self.plan.arrivals
        if i + 1 < len(arrivals):  # one pending arrival at a time keeps the heap small
            self.pending += 1
            self._schedule(
                round(arrivals[i + 1].at_s * US), ARRIVAL, i + 1, self._on_arrival, i + 1
            )
        self.broker.submit(i)

    # -- claims, results, asks ------------------------------------------------------------------

    def _dispatch(self, touched: list[int]) -> None:
        """Idle nodes of touched runs ask for work — runs in the order they were touched, nodes in
        node order — and raised asks get answers."""
        broker, daemons, arrivals = self.broker, self.daemons, self.plan.arrivals
        for run in touched:  # (a claim may touch more runs: the loop sees them too)
            for node in broker.nodes_of(run):
                self._try_claim(node, daemons[node])
            steps = arrivals[run].contract["steps"]
            has_ask = self.has_ask.get(id(steps))
            if has_ask is None:
                has_ask = self.has_ask[id(steps)] = any(s.get("kind") == "ask" for s in steps)
            if has_ask:
                self._schedule_answers(run)
        touched.clear()

    def _try_claim(self, node: int, d: Daemon, now: bool = False) -> None:
        if d.busy is not None or not d.up or d.daemon_drain == "at-boundary":
            return
        broker = self.broker
        step = broker.work(node, d.instance)
        if step is None:
            return
        if self.latency and not now:
            if not d.claim_pending:
                d.claim_pending = True
                self._push(self.now + self.latency, CLAIM, node, self._on_claim,
                           (node, d.run_epoch))  # fmt: skip
            return
        run, seq, attempt = broker.claim(node, d.instance, step)
        d.busy = run * STEP_KEY + seq
        duration, outcome = self.plan.arrivals[run].step_outcomes[seq][attempt - 1]
        self.pending += 1
        self._schedule(
            self.now + round(duration * US),
            RESULT,
            run * STEP_KEY + seq,
            self._on_result,
            (node, d, run, seq, attempt, outcome, d.run_epoch),
        )

    def _on_claim(self, arg: tuple[int, int]) -> None:
        node, epoch = arg
        d = self.daemons[node]
        if epoch != d.run_epoch:
            return  # the daemon that meant to claim is gone; its successor polls anew
        d.claim_pending = False
        self._try_claim(node, d, now=True)

    def _on_result(self, arg: tuple[int, Daemon, int, int, int, str, int]) -> None:
        node, d, run, seq, attempt, outcome, epoch = arg
        if epoch != d.run_epoch:
            return  # the daemon died with this step: its result is never sent
        d.busy = None
        self.broker.report(node, d.instance, run, seq, attempt, outcome)
        # It asks for work again with the run's other nodes (the broker touched the run, or the
        # run a sweep promoted onto it): no poll of its own is needed.

    def _schedule_answers(self, run: int) -> None:
        answers = self.plan.arrivals[run].ask_answers
        for seq in self.broker.asked(run):
            key = run * STEP_KEY + seq
            if key not in self.asked:
                self.asked.add(key)
                answer = answers[seq]
                assert answer is not None
                self._push(self.now + to_us(answer.delay_s), RESULT, key, self._on_answer,
                           (run, seq, answer.ok))  # fmt: skip

    def _on_answer(self, arg: tuple[int, int, bool]) -> None:
        run, seq, ok = arg
        self.broker.answer(run, seq, ok)

    # -- the fleet ------------------------------------------------------------------------------

    def _on_advert(self, arg: tuple[int, int]) -> None:
        node, epoch = arg
        d = self.daemons[node]
        if epoch != d.advert_epoch:
            return  # a heartbeat of a schedule that a vanish or return replaced
        self._push(self.now + self.interval, ADVERT, node, self._on_advert, arg)
        self.expires[node] = self.broker.advert(node, d, True)
        self._try_claim(node, d)

    def _advert(self, node: int, d: Daemon, heartbeat: bool) -> None:
        self.expires[node] = self.broker.advert(node, d, heartbeat)
        self._try_claim(node, d)

    def _on_fleet(self, i: int) -> None:
        events = self.plan.fleet_events
        if i + 1 < len(events):
            self._push(to_us(events[i + 1].at_s), FLEET, i + 1, self._on_fleet, i + 1)
        ev = events[i]
        node = self.pos[ev.node_id]
        d = self.daemons[node]
        effect = fleet.apply(d, ev)
        if effect == fleet.VANISHED:
            # liveness ends at the advert's expiry with no event: mark it, for stuck accounting
            if self.expires[node] > self.now:  # (never into the past: the clock only moves on)
                self._push(self.expires[node], MARK, node, _noop, None)
            self._start_reaper()
        elif effect == fleet.RETURNED:
            self._push(self.now + self.interval, ADVERT, node, self._on_advert,
                       (node, d.advert_epoch))  # fmt: skip
            self._advert(node, d, False)
        elif effect == fleet.ADVERTISE:
            self._advert(node, d, False)
        elif effect == fleet.CANCEL:
            self.broker.cancel(node)
        self.broker.note_fleet(node, ev.kind, effect != fleet.IGNORED)

    # -- the reaper -----------------------------------------------------------------------------

    def _start_reaper(self) -> None:
        if not self.reaper_on:
            self.reaper_on = True
            tick = (self.now // self.renew + 1) * self.renew
            self._push(tick, REAPER, 0, self._on_reap, None)

    def _on_reap(self, _: object) -> None:
        self.broker.reap()
        now = self.now
        dark = [i for i, d in enumerate(self.daemons) if not d.up]
        # Keep going while a dark node may still be given a lease (it looks live until its
        # advert expires) or still holds one; after that no lease of it can expire any more.
        if any(self.expires[i] > now for i in dark) or (dark and self.broker.holds_lease(dark)):
            self._push(now + self.renew, REAPER, 0, self._on_reap, None)
        else:
            self.reaper_on = False

    # -- stuck ----------------------------------------------------------------------------------

    def _check_stuck(self) -> None:
        now = self.now
        promotable = set(self.broker.promotable())
        for run in [r for r in self.stuck_open if r not in promotable]:
            since = self.stuck_open.pop(run)
            if now > since:
                self._stuck.append((since, run, now, False))
        for run in promotable:
            self.stuck_open.setdefault(run, now)


def _noop(_: object) -> None:
    return None
