"""The reference model: the Mediator's scheduling policy, re-implemented in memory (design.md §20).

Why it exists: fast sweeps where a database would be too slow (P5: ≥ 50,000 runs per wall second),
and a *differential check* — on the same `sim.workload.Plan` the real Mediator and this model must
promote the same runs onto the same nodes at the same virtual instants. It must not import
`mediator` (a boundary test checks): two independent implementations that agree are evidence;
one implementation used twice is not.

What it implements (docs/design.md §1–3, §5–7, rule ids from seed 000):

- matcher (§6): roles in name order; every role must have a live candidate first, else
  NO_CANDIDATE for the first empty role in name order (as `mediator.match` does); folding reuses
  the earliest chosen node that serves the role; otherwise the first live, available candidate
  ordered by how many of the roles from this one onward it serves (more first), then node_id;
  none → ALL_BUSY; more distinct nodes than `max_width` → TOO_WIDE. JSON types are kept (a
  boolean never equals a number; 1 equals 1.0; a need `true` wants a truthy capability; a list
  capability matches a member).
- submit (§7.1): unavailable = busy ∪ draining. Assignment → RUNNING at once; ALL_BUSY or
  TOO_WIDE → QUEUED, then one WakeQueued (R17, wake 8) — unless the match ignoring availability
  is too wide as well: then, like NO_CANDIDATE, FAILED, verdict `rejected` (R1, amended).
- WakeQueued (§7.2): FIFO by (created_at, run_id); a run that cannot go is skipped, never stops
  the sweep (R6); ALL_BUSY and NO_CANDIDATE are remembered per needs_key for the rest of the sweep,
  TOO_WIDE is not and leaves the run QUEUED (R10); promoted nodes join `unavailable` (R9); the
  sweep ends as soon as no live node is free.
- steps (§7.4): an exec step runs on its role's node once its `after` steps PASSED; `retry` is a
  rollback (no release, no wake, R15) unless it was the `max_attempts`-th attempt, which fails;
  a failed step SKIPs its dependants; a node whose steps in the run are all terminal is released
  at once (partial release); all steps terminal → settle PASSED/FAILED.
- wake points (§7.3): 1 result/answer (not after a retry rollback; a late result for an ended
  run wakes only if it freed the node's lease), 3 reaper only if it released, 4 advert handler
  lost a run (restart) or finished an at-boundary drain, 6 drain cleared, 7 node (re)appears
  (only with `wake_on_return`), 8 submit's guard, 9 an advert whose capabilities differ from
  the stored ones. (2 cancel: the plan has no cancels; 5 process
  start: the queue is empty then.) No other call wakes — an extra wake is observable: it would
  end a stuck interval early.
- leases (§7.5): renewed by the node's adverts; expire when `not_after <= now`; the reaper runs at
  k·renew_s; a lost run's open steps are SKIPPED. Restart detection: an advert with a new
  instance whose lease belongs to an ended run frees it; else it loses the run if a step of it on
  this node has an attempt under the lease's instance (`attempt > 0 and instance == old`, a
  rolled-back step included), else rebinds the lease. A node still running a CLAIMED step of an
  ended run keeps its lease until that step's result (I2) or expiry.
- drain: `graceful` — unavailable, the current run finishes; `at-boundary` — unavailable, claims
  refused, and once a leased node of the run has no CLAIMED step but still a PENDING one the run
  ends FAILED/`drained` with its open steps SKIPPED (a node it no longer needs is released).
  That is checked by the node's adverts (wake 4) and by every result or answer transaction of
  the run that leaves steps open (wake 1), as `mediator.flows.steps` does.

The fleet as the daemons behave (the contract the real-Mediator engine must follow too):

- every node advertises at t = 0 and then every `advert_interval_s` while it is up; an advert sets
  `expires_at = now + advert_ttl` (live while `expires_at > now`) and renews the node's lease;
- `vanish`, `return`, `restart`, `drain`/`undrain`, `caps` (wake 9): what the daemon does is
  `sim.fleet.apply`, shared with the real-Mediator engine; an up node advertises the change at
  once, keeping its schedule (a return starts a new one from now), a dark node takes a new
  policy or capabilities on return, and an event that does not apply is ignored.
- a node runs one step at a time. With claim latency 0 it claims, at the same instant, the
  lowest-positioned claimable step of its run whenever it has one and is idle; with latency L it
  claims L seconds after that (rechecking then). A result is reported `duration_s` after the claim.

**Same-instant ordering.** Virtual time is an integer number of microseconds; events are ordered
by (time, class, key) as `sim.core` defines once for both engines: results, delayed claims, fleet
events, heartbeats, the reaper, arrivals, bookkeeping. Events created at the current instant (a
zero-length step) take their place in that order. A vanish at the instant of its node's heartbeat
suppresses it. The model skips reaper passes that cannot find an expired lease (only a dark
node's lease can expire), which no one can observe.

**Stopping.** With `horizon_s` the simulation covers [0, horizon_s]; without it, it stops once no
arrival, step, answer, fleet event, reaper pass or pending at-boundary drain is left.

**Stuck** (design.md §20): an interval in which a QUEUED run could have been promoted — matching it
against the live, free nodes gives an assignment — but was not. With `wake_on_return` the model
has none (every release and every returning node wakes the queue); without it, a returned node
leaves its queued runs stuck until an unrelated wake.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import pandas as pd  # type: ignore[import-untyped, unused-ignore]

from sim import fleet
from sim.analysis import replication_seeds, wait_statistics
from sim.core import (
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
    gc_paused,
    to_us,
)
from sim.fleet import Daemon
from sim.workload import Arrival, Plan, materialize

__all__ = [  # sim.core's names stay importable from here, where callers have found them
    "US",
    "EventQueue",
    "Model",
    "ModelResult",
    "gc_paused",
    "promotions_diff",
    "replicate",
    "run_model",
    "satisfies",
    "to_us",
]

T = TypeVar("T")

# Run and step states.
QUEUED, RUNNING, PASSED, FAILED = "QUEUED", "RUNNING", "PASSED", "FAILED"
PENDING, CLAIMED, ASKED, SKIPPED = "PENDING", "CLAIMED", "ASKED", "SKIPPED"

OK, NO_CANDIDATE, ALL_BUSY, TOO_WIDE = "OK", "NO_CANDIDATE", "ALL_BUSY", "TOO_WIDE"


# ---------------------------------------------------------------------------------------------
# Capabilities and the matcher's static part
# ---------------------------------------------------------------------------------------------


def _same(want: Any, have: Any) -> bool:
    # JSON equality: a boolean only equals a boolean (bool is an int in Python), numbers compare
    # numerically, strings as strings.
    if isinstance(want, bool) or isinstance(have, bool):
        return isinstance(want, bool) and isinstance(have, bool) and want == have
    if isinstance(want, int | float) and isinstance(have, int | float):
        return bool(want == have)
    return isinstance(want, str) and isinstance(have, str) and want == have


def satisfies(needs: Mapping[str, Any], caps: Mapping[str, Any]) -> bool:
    """Whether capabilities meet every need of one role (docs/design.md §4).

    Args:
        needs: `{key: scalar}`; `true` asks for a present, truthy capability.
        caps: `{key: scalar or list of scalars}`; a list matches any member.

    Returns:
        True when every need is met (also for empty needs).
    """
    for key, want in needs.items():
        if key not in caps:
            return False
        have = caps[key]
        if want is True:
            if not have:
                return False
        elif isinstance(have, list | tuple):
            if not any(_same(want, h) for h in have):
                return False
        elif not _same(want, have):
            return False
    return True


def _still_needed(node: _Node, steps: list[_Step]) -> bool:
    """At-boundary drain (amended): the run ends only if it still needs the node — no step of
    it CLAIMED there, and some step of it there still PENDING. A node the run no longer needs is
    released by applyRelease, so commit order never decides the outcome."""
    states = [s.state for s in steps if s.node is node]
    return CLAIMED not in states and PENDING in states


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality as jsonb sees it (wake 9 compares stored and advertised capabilities):
    key order does not matter, 1 equals 1.0, a boolean only equals a boolean."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping | list | tuple) or isinstance(b, Mapping | list | tuple):
        return False
    return _same(a, b) or (a is None and b is None)


class _Node(Daemon):
    """A node: its daemon (`sim.fleet.Daemon`) and what the Mediator knows of it."""

    __slots__ = ("caps", "drain", "expires_at", "idx", "lease")

    def __init__(self, idx: int, node_id: str, caps: dict[str, Any]) -> None:
        super().__init__(node_id, caps)
        self.idx = idx
        self.caps = caps  # what the Mediator knows (last advert)
        self.drain = ""  # what the Mediator knows (last advert)
        self.expires_at = -1  # never advertised: not live
        self.lease: _Lease | None = None


class _Lease:
    __slots__ = ("granted_at", "instance", "node", "not_after", "run")

    def __init__(self, node: _Node, run: _Run, instance: str, now: int, ttl: int) -> None:
        self.node = node
        self.run = run
        self.instance = instance
        self.granted_at = now
        self.not_after = now + ttl


class _Needs:
    """Per needs_key: the roles, who can serve each (recomputed only when an advert changes a
    node's capabilities, wake 9), candidate order for step 4 of the matcher, and this key's
    queue."""

    __slots__ = ("head", "key", "needs", "order", "queue", "roles", "serves")

    def __init__(
        self, key: str, needs_by_role: Mapping[str, Mapping[str, Any]], nodes: list[_Node]
    ):
        self.key = key
        self.needs = needs_by_role
        self.roles = tuple(sorted(needs_by_role))
        self.index(nodes)
        self.queue: list[_Run] = []  # this key's QUEUED runs in FIFO order (lazy deletion)
        self.head = 0

    def index(self, nodes: list[_Node]) -> None:
        """Who serves each role, from the nodes' capabilities as the Mediator knows them."""
        needs_by_role = self.needs
        serves = [
            frozenset(n.idx for n in nodes if satisfies(needs_by_role[r], n.caps))
            for r in self.roles
        ]
        self.serves = tuple(serves)
        order = []
        for i in range(len(self.roles)):
            later = serves[i:]
            cands = [n for n in nodes if n.idx in serves[i]]
            cands.sort(key=lambda n: (-sum(n.idx in s for s in later), n.node_id))
            order.append(tuple(cands))
        self.order = tuple(order)


class _Shape:
    """A contract's step structure, parsed once per distinct `steps` list."""

    __slots__ = ("after", "dependants", "has_ask", "kinds", "n", "roles")

    def __init__(self, steps: list[dict[str, Any]], roles: tuple[str, ...]):
        names = [s["name"] for s in steps]
        pos = {n: i for i, n in enumerate(names)}
        self.n = len(steps)
        self.kinds = tuple(s.get("kind", "exec") for s in steps)
        self.has_ask = "ask" in self.kinds
        self.roles = tuple(
            roles.index(s["role"]) if s.get("kind", "exec") == "exec" else -1 for s in steps
        )
        self.after = tuple(tuple(pos[a] for a in s.get("after", ())) for s in steps)
        deps: list[list[int]] = [[] for _ in steps]
        for i, aft in enumerate(self.after):
            for a in aft:
                deps[a].append(i)
        self.dependants = tuple(tuple(d) for d in deps)


class _Step:
    __slots__ = ("attempt", "idx", "instance", "node", "run", "state")

    def __init__(self, run: _Run, idx: int) -> None:
        self.run = run
        self.idx = idx
        self.state = PENDING
        self.node: _Node | None = None
        self.attempt = 0
        self.instance = ""


class _Run:
    __slots__ = (
        "arrival",
        "created",
        "ended",
        "failed",
        "needs",
        "node_open",
        "nodes",
        "open",
        "reject",
        "seq",
        "shape",
        "started",
        "state",
        "steps",
        "verdict",
    )

    def __init__(self, seq: int, arrival: Arrival, needs: _Needs, shape: _Shape, now: int):
        self.seq = seq
        self.arrival = arrival
        self.needs = needs
        self.shape = shape
        self.steps = [_Step(self, i) for i in range(shape.n)]
        self.state = ""
        self.verdict = ""
        self.reject = ""
        self.created = now
        self.started = -1
        self.ended = -1
        self.nodes: list[_Node] = []  # distinct assigned nodes, in role order of first use
        self.open = shape.n
        self.node_open: dict[_Node, int] = {}
        self.failed = False


# ---------------------------------------------------------------------------------------------
# Result
# ---------------------------------------------------------------------------------------------


@dataclass(eq=False)
class ModelResult:
    """What a model run produced; times in seconds of virtual time.

    Attributes:
        runs: one row per run — run_id, template, created_at, started_at, ended_at, wait_s,
            run_s, state, verdict, width, nodes (distinct node ids, sorted, comma-joined),
            reject, warmup (among the first `warmup_runs`), source_id (the run's id in the
            replayed trace; None when the workload is not a trace).
        promotions: every start of a run in order — at_s, run_id, nodes, how (`created`: at
            submit, 201; `promoted`: by a sweep), wake (the wake point of that sweep; 0 at submit).
            The differential test compares (at_s, run_id, nodes) with the real Mediator's.
        events: at_s, kind, run_id, node_id, detail — the Mediator's event kinds plus `fleet`
            (a fleet event applied or ignored) and `wake` (a sweep ran; detail = its point).
            Built on first access (it is by far the largest table).
        queue: at_s, length — the QUEUED count after every change.
        stuck: run_id, start_s, end_s, duration_s, open (still stuck when the simulation ended).
        leases: node_id, run_id, granted_at, released_at (NaN if still held at the end).
        counts: Mediator calls by kind (submit, advert, claim, report, answer, reaper passes
            that could matter, reaper_ticks that the real timer makes, wakes, promotions).
        end_s: where the simulation stopped.
        scenario_hash: `Scenario.scenario_hash()` of the plan's scenario.
        wall_s: how long the simulation took (wall clock; for virtual seconds per wall second).
        nodes: node_id, label, capabilities (canonical JSON: nodes with equal text form one
            capability class).
    """

    runs: pd.DataFrame
    promotions: pd.DataFrame
    event_rows: list[tuple[int, str, str, str, str]] = field(repr=False)
    queue: pd.DataFrame
    stuck: pd.DataFrame
    leases: pd.DataFrame
    counts: dict[str, int] = field(default_factory=dict)
    end_s: float = 0.0
    scenario_hash: str = ""
    wall_s: float = 0.0
    nodes: pd.DataFrame = field(default_factory=pd.DataFrame)

    @functools.cached_property
    def events(self) -> pd.DataFrame:
        """The event log as a DataFrame (see the class docstring)."""
        with gc_paused():
            return _frame(
                self.event_rows, ("at_s", "kind", "run_id", "node_id", "detail"), ("at_s",)
            )

    def advert_share(self) -> float:
        """Adverts as a share of all Mediator calls the real engine would make (design.md §20)."""
        c = self.counts
        calls = sum(c.get(k, 0) for k in ("submit", "advert", "claim", "report", "answer"))
        calls += c.get("reaper_ticks", 0)
        return c.get("advert", 0) / calls if calls else 0.0

    def utilization(self) -> pd.DataFrame:
        """Per node: seconds it held a lease (busy_s) and that share of [0, end_s].

        Group by `capabilities` for the utilization per capability class.
        """
        leases = self.leases
        end = self.end_s
        held = (leases["released_at"].fillna(end).clip(upper=end) - leases["granted_at"]).clip(
            lower=0
        )
        busy = held.groupby(leases["node_id"]).sum()
        out = self.nodes[["node_id", "capabilities"]].copy()
        out["busy_s"] = out["node_id"].map(busy).fillna(0.0).astype(float)
        out["utilization"] = out["busy_s"] / end if end else 0.0
        return out

    def summary(self) -> dict[str, Any]:
        """Counts, throughput, waits of the measured runs with intervals, utilization, stuck
        time, advert share, virtual seconds per wall second.

        The wait intervals come from one run, by batch means and batch quantiles
        (`sim.analysis.wait_statistics`; each `Interval` names its method), which hold for
        correlated waits; a run too short for its load adds `warnings` (the command line
        prints them). Replications (`replicate`) are stronger still.
        """
        runs = self.runs[~self.runs["warmup"]]
        waits = runs["wait_s"].dropna().to_numpy(dtype=float)
        out: dict[str, Any] = {
            "runs": len(self.runs),
            "measured": len(runs),
            "by_verdict": self.runs["verdict"].value_counts().to_dict(),
            "end_s": self.end_s,
            "throughput_per_s": float(runs["state"].isin([PASSED, FAILED]).sum() / self.end_s)
            if self.end_s
            else 0.0,
            "stuck_s": float(self.stuck["duration_s"].sum()),
            "advert_share": self.advert_share(),
        }
        if not self.nodes.empty and self.end_s:
            out["utilization"] = float(self.utilization()["utilization"].mean())
        if self.wall_s:
            out["virtual_s_per_wall_s"] = self.end_s / self.wall_s
        out.update(wait_statistics(waits))
        return out


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


class Model:
    """One simulation of a plan. Use `run_model`; the class is public for stepping in tests."""

    def __init__(self, plan: Plan, *, record_events: bool = True, exhaustive_stuck: bool = False):
        sc = plan.scenario
        st = sc.settings
        self.plan = plan
        self.lease_ttl = to_us(st.lease_ttl_s)
        self.renew = to_us(st.renew_s)
        self.advert_ttl = to_us(st.advert_ttl_s)
        self.interval = to_us(sc.fleet.advert_interval_s)
        self.latency = to_us(st.claim_latency_s)
        self.max_width = st.max_width
        self.max_attempts = st.max_attempts
        self.wake_on_return = st.wake_on_return
        self.end = to_us(sc.horizon_s) if sc.horizon_s is not None else None
        self.warmup = sc.warmup_runs
        self.record_events = record_events
        self.exhaustive_stuck = exhaustive_stuck
        if self.lease_ttl <= 0:
            raise ValueError("lease_ttl must be positive (R11)")

        self.nodes = [_Node(i, n.node_id, n.capabilities) for i, n in enumerate(plan.nodes)]
        self.by_id = {n.node_id: n for n in self.nodes}
        self.now = 0
        self.q = EventQueue()
        self.progress = 0  # pending events other than heartbeats and bookkeeping
        self.free: set[_Node] = set()  # nodes with no lease and no drain (liveness checked lazily)
        self.nq = 0
        self.qkeys: set[_Needs] = set()
        self.needs_cache: dict[Any, tuple[Any, _Needs]] = {}
        self.needs_by_key: dict[str, _Needs] = {}
        self.shape_cache: dict[int, tuple[Any, _Shape]] = {}
        self.reap_at: set[int] = set()
        self.runs: list[_Run] = []
        self.dirty = False
        self.stuck_open: dict[_Run, int] = {}
        self.stuck_rows: list[tuple[str, int, int, bool]] = []
        self.ev: list[tuple[int, str, str, str, str]] = []
        self.promos: list[tuple[int, str, str, str, int]] = []
        self.qlen: list[tuple[int, int]] = [(0, 0)]
        self.lease_rows: list[tuple[str, str, int, int]] = []
        # Mediator calls by kind (plain attributes: a dict update per call costs more)
        self.n_submit = self.n_advert = self.n_claim = self.n_report = self.n_answer = 0
        self.n_reap = self.n_wake = self.n_promote = 0
        self._next_fleet = 0

    # -- scheduling -----------------------------------------------------------------------------

    def _push(self, t: int, cls: int, key: Any, action: Callable[[Any], None], arg: Any) -> None:
        if cls != ADVERT and cls != MARK:
            self.progress += 1
        self.q.push(t, cls, key, action, arg)

    def _log(self, kind: str, run_id: str = "", node_id: str = "", detail: str = "") -> None:
        if self.record_events:
            self.ev.append((self.now, kind, run_id, node_id, detail))

    def run(self) -> ModelResult:
        """Simulate the whole plan and return the result."""
        started = time.perf_counter()
        with gc_paused():
            result = self._run()
        result.wall_s = time.perf_counter() - started
        return result

    def _run(self) -> ModelResult:
        for node in self.nodes:  # every daemon starts at t = 0
            self._push(0, ADVERT, node.idx, self._on_advert, (node, node.advert_epoch))
        self._schedule_arrival()
        self._schedule_fleet()
        heap, end = self.q._heap, self.end
        pop = heapq.heappop
        while heap:
            t, cls, _key, _seq, action, arg = pop(heap)
            if end is not None and t > end:
                break
            self.now = t
            if cls != ADVERT and cls != MARK:
                self.progress -= 1
            action(arg)
            if self.dirty or self.stuck_open or self.exhaustive_stuck:
                self._check_stuck()
            if end is None and self.progress == 0 and not self._drain_pending():
                break
        if end is not None:
            self.now = max(self.now, end)
        return self._result()

    def _schedule_arrival(self) -> None:
        if self.plan.arrivals:
            self._push(to_us(self.plan.arrivals[0].at_s), ARRIVAL, 0, self._on_arrival, 0)

    def _schedule_fleet(self) -> None:
        events = self.plan.fleet_events
        i = self._next_fleet
        if i < len(events):
            self._push(to_us(events[i].at_s), FLEET, i, self._on_fleet, i)

    def _drain_pending(self) -> bool:
        # An at-boundary drain that the node's next advert will finish is still to come.
        return any(
            n.up
            and n.drain == "at-boundary"
            and n.lease is not None
            and n.lease.run.state == RUNNING
            for n in self.nodes
        )

    # -- matcher --------------------------------------------------------------------------------

    def _needs_of(self, contract: Mapping[str, Any]) -> _Needs:
        roles = contract["roles"]
        hit = self.needs_cache.get(id(roles))
        if hit is not None and hit[0] is roles:
            return hit[1]
        key = json.dumps(roles, sort_keys=True, separators=(",", ":"))
        info = self.needs_by_key.get(key)
        if info is None:
            info = self.needs_by_key[key] = _Needs(key, roles, self.nodes)
        self.needs_cache[id(roles)] = (roles, info)
        return info

    def _shape_of(self, contract: Mapping[str, Any], info: _Needs) -> _Shape:
        steps = contract["steps"]
        hit = self.shape_cache.get(id(steps))
        if hit is not None and hit[0] is steps:
            return hit[1]
        shape = _Shape(steps, info.roles)
        self.shape_cache[id(steps)] = (steps, shape)
        return shape

    def _match(self, info: _Needs) -> tuple[str, list[_Node] | None]:
        """docs/design.md §4 against the current fleet; returns (code, chosen node per role)."""
        now = self.now
        order = info.order
        if len(order) == 1:  # the common case, in one pass
            seen_live = False
            for n in order[0]:
                if n.expires_at > now:
                    if n.lease is None and not n.drain:
                        return OK, [n]
                    seen_live = True
            return (ALL_BUSY if seen_live else NO_CANDIDATE), None
        for cands in order:  # every role needs a live candidate before anything is chosen
            if not any(n.expires_at > now for n in cands):
                return NO_CANDIDATE, None
        chosen: list[_Node] = []
        used: list[_Node] = []
        for i, cands in enumerate(order):
            serves = info.serves[i]
            pick = next((u for u in used if u.idx in serves), None)  # folding
            if pick is None:
                pick = next(
                    (n for n in cands if n.expires_at > now and n.lease is None and not n.drain),
                    None,
                )
                if pick is None:
                    return ALL_BUSY, None
                used.append(pick)
            chosen.append(pick)
        if len(used) > self.max_width:
            return TOO_WIDE, None
        return OK, chosen

    def _too_wide_free(self, info: _Needs) -> bool:
        """Whether the match that ignores availability (every live node free) is too wide."""
        if len(info.order) == 1:
            return False
        now = self.now
        used: list[_Node] = []
        for i, cands in enumerate(info.order):
            serves = info.serves[i]
            if not any(u.idx in serves for u in used):
                pick = next((n for n in cands if n.expires_at > now), None)
                if pick is None:
                    return False  # NO_CANDIDATE: not this question
                used.append(pick)
        return len(used) > self.max_width

    def _any_free_live(self) -> bool:
        now = self.now
        for n in self.free:  # noqa: SIM110 — a loop beats any(<generator>) on this hot path
            if n.expires_at > now:
                return True
        return False

    # -- submit and the sweep -------------------------------------------------------------------

    def _on_arrival(self, i: int) -> None:
        arrivals = self.plan.arrivals
        if i + 1 < len(arrivals):  # one pending arrival at a time keeps the heap small
            self.progress += 1
            heapq.heappush(
                self.q._heap,
                (
                    round(arrivals[i + 1].at_s * US),
                    ARRIVAL,
                    i + 1,
                    next(self.q._seq),
                    self._on_arrival,
                    i + 1,
                ),
            )
        arrival = arrivals[i]
        contract = arrival.contract
        roles = contract["roles"]
        hit = self.needs_cache.get(id(roles))
        info = hit[1] if hit is not None and hit[0] is roles else self._needs_of(contract)
        steps = contract["steps"]
        hit2 = self.shape_cache.get(id(steps))
        shape = hit2[1] if hit2 is not None and hit2[0] is steps else self._shape_of(contract, info)
        run = _Run(i, arrival, info, shape, self.now)
        self.runs.append(run)
        self.n_submit += 1
        if self.record_events:
            self.ev.append((self.now, "submitted", arrival.run_id, "", ""))
        code, chosen = self._match(info)
        if code == OK:
            assert chosen is not None
            self._start(run, chosen, "created", 0)
        elif code in (ALL_BUSY, TOO_WIDE) and not self._too_wide_free(info):
            # R1/R10 amended: refused only if too wide with every node free as well.
            run.state = QUEUED
            info.queue.append(run)
            self.qkeys.add(info)
            self.nq += 1
            self.qlen.append((self.now, self.nq))
            self._log("queued", arrival.run_id)
            self._wake(8)  # R17: the missed-wake guard
        else:
            code = NO_CANDIDATE if code == NO_CANDIDATE else TOO_WIDE
            run.state, run.verdict, run.reject, run.ended = FAILED, "rejected", code, self.now
            self._log("rejected", arrival.run_id, "", code)

    def _wake(self, point: int) -> None:
        """WakeQueued (§7.2)."""
        self.n_wake += 1
        if self.record_events:
            self.ev.append((self.now, "wake", "", "", str(point)))
        if not self.nq or not self._any_free_live():
            return
        heads: list[tuple[int, int, _Needs]] = []
        for info in self.qkeys:
            if info.head > 1024 and info.head * 2 > len(info.queue):
                # drop the promoted prefix; only here, where no position is held in `heads`
                del info.queue[: info.head]
                info.head = 0
            pos = self._first_queued(info, info.head)
            if pos is not None:
                heads.append((info.queue[pos].seq, pos, info))
        heapq.heapify(heads)
        left_too_wide = False
        while heads:
            _seq, pos, info = heapq.heappop(heads)
            run = info.queue[pos]
            code, chosen = self._match(info)
            if code == OK:
                assert chosen is not None
                self._unqueue(run)
                self._start(run, chosen, "promoted", point)
                if not self._any_free_live():
                    break
            elif code == TOO_WIDE:
                left_too_wide = True  # R10: stays QUEUED, and the key is not remembered
            else:
                continue  # ALL_BUSY / NO_CANDIDATE: the key stays failed for this sweep
            nxt = self._first_queued(info, pos + 1)
            if nxt is not None:
                heapq.heappush(heads, (info.queue[nxt].seq, nxt, info))
        if left_too_wide:
            self.dirty = True  # a TOO_WIDE run may match again against the final state

    @staticmethod
    def _first_queued(info: _Needs, pos: int) -> int | None:
        q = info.queue
        while pos < len(q):
            if q[pos].state == QUEUED:
                return pos
            pos += 1
        return None

    def _unqueue(self, run: _Run) -> None:
        info = run.needs
        self.nq -= 1
        self.qlen.append((self.now, self.nq))
        q = info.queue
        while info.head < len(q) and (q[info.head] is run or q[info.head].state != QUEUED):
            info.head += 1
        if info.head == len(q):
            q.clear()
            info.head = 0
            self.qkeys.discard(info)
        self._close_stuck(run)

    def _start(self, run: _Run, chosen: list[_Node], how: str, point: int) -> None:
        """CreateRun / promote: RUNNING, leases, steps bound to nodes, due asks raised."""
        now = self.now
        run.state = RUNNING
        run.started = now
        rid = run.arrival.run_id
        shape = run.shape
        if len(chosen) == 1:
            nodes = chosen
            ordered = chosen
            ids = chosen[0].node_id
        else:
            nodes = list(dict.fromkeys(chosen))
            ordered = sorted(nodes, key=_node_id)
            ids = ",".join(n.node_id for n in ordered)
        run.nodes = nodes
        log = self.record_events
        free = self.free
        for n in ordered:  # leases inserted in node_id order
            n.lease = lease = _Lease(n, run, n.instance, now, self.lease_ttl)
            free.discard(n)
            if log:
                self.ev.append((self.now, "lease_granted", rid, n.node_id, ""))
            if not n.up:  # a live but dark node: nothing will renew this lease
                self._schedule_reap(lease.not_after)
        node_open = run.node_open
        for step, role in zip(run.steps, shape.roles, strict=True):
            if role >= 0:
                n = chosen[role]
                step.node = n
                node_open[n] = node_open.get(n, 0) + 1
        self.n_promote += 1
        self.promos.append((now, rid, ids, how, point))
        if log:
            self.ev.append((self.now, "promoted" if how == "promoted" else "started", rid, ids, ""))
        if shape.has_ask:
            self._raise_asks(run)
        for n in nodes:
            self._try_claim(n)

    # -- steps ----------------------------------------------------------------------------------

    @staticmethod
    def _claimable(run: _Run, node: _Node) -> _Step | None:
        after = run.shape.after
        steps = run.steps
        for s in steps:
            if s.node is node and s.state == PENDING:
                for a in after[s.idx]:
                    if steps[a].state != PASSED:
                        break
                else:
                    return s
        return None

    def _try_claim(self, node: _Node, now: bool = False) -> None:
        """Let an idle node claim its next step: at once, or after the claim latency."""
        lease = node.lease
        if (
            lease is None
            or node.busy is not None
            or not node.up
            or node.drain == "at-boundary"  # claims refused while draining at-boundary
            or lease.run.state != RUNNING
            or lease.instance != node.instance
        ):
            return
        step = self._claimable(lease.run, node)
        if step is None:
            return
        if self.latency and not now:
            if not node.claim_pending:
                node.claim_pending = True
                self._push(
                    self.now + self.latency, CLAIM, node.idx, self._on_claim, (node, node.run_epoch)
                )
            return
        self._claim(node, step)

    def _on_claim(self, arg: tuple[_Node, int]) -> None:
        node, epoch = arg
        if epoch != node.run_epoch:
            return  # the daemon that meant to claim is gone; its successor polls anew
        node.claim_pending = False
        self._try_claim(node, now=True)

    def _claim(self, node: _Node, step: _Step) -> None:
        run = step.run
        step.state = CLAIMED
        step.attempt += 1
        step.instance = node.instance
        node.busy = step
        self.n_claim += 1
        if self.record_events:
            self.ev.append((self.now, "claimed", run.arrival.run_id, node.node_id, str(step.idx)))
        att = run.arrival.step_outcomes[step.idx][step.attempt - 1]
        self.progress += 1
        heapq.heappush(
            self.q._heap,
            (
                self.now + round(att[0] * US),
                RESULT,
                run.seq * STEP_KEY + step.idx,
                next(self.q._seq),
                self._on_result,
                (node, step, node.run_epoch, att[1]),
            ),
        )

    def _on_result(self, arg: tuple[_Node, _Step, int, str]) -> None:
        node, step, epoch, outcome = arg
        if epoch != node.run_epoch:
            return  # the daemon died with this step: its result is never sent
        node.busy = None
        run = step.run
        rid = run.arrival.run_id
        self.n_report += 1
        if run.state != RUNNING:
            # 409 run_ended: the late result is recorded and the lease kept for this step is
            # freed (I2's exception ends here); it wakes only if that released the node.
            step.state = PASSED if outcome == "pass" else FAILED
            self._log("result", rid, node.node_id, "run_ended")
            lease = node.lease
            if lease is not None and lease.run is run:
                self._release(node)
                self._wake(1)
            return
        if outcome == "retry" and step.attempt < self.max_attempts:
            step.state = PENDING  # R15: a rollback — no release, no wake
            self._log("result", rid, node.node_id, "retry")
            self._try_claim(node)
            return
        if self.record_events:
            self.ev.append((self.now, "result", rid, node.node_id, outcome))
        self._finish_step(step, PASSED if outcome == "pass" else FAILED)
        self._wake(1)
        self._claims_after(run)

    def _claims_after(self, run: _Run) -> None:
        if run.state == RUNNING:
            for n in run.nodes:
                if n.lease is not None and n.lease.run is run:
                    self._try_claim(n)

    def _raise_asks(self, run: _Run) -> None:
        steps = run.steps
        shape = run.shape
        for s in steps:
            if (
                s.state == PENDING
                and shape.kinds[s.idx] == "ask"
                and all(steps[a].state == PASSED for a in shape.after[s.idx])
            ):
                s.state = ASKED
                self._log("ask_raised", run.arrival.run_id, "", str(s.idx))
                answer = run.arrival.ask_answers[s.idx]
                assert answer is not None
                self._push(
                    self.now + to_us(answer[0]),
                    RESULT,
                    run.seq * STEP_KEY + s.idx,
                    self._on_answer,
                    (s, answer[1]),
                )

    def _on_answer(self, arg: tuple[_Step, bool]) -> None:
        step, ok = arg
        run = step.run
        if run.state != RUNNING or step.state != ASKED:
            return  # the ask was closed when the run ended: the answer is refused, no wake
        self.n_answer += 1
        self._log("ask_answered", run.arrival.run_id, "", "ok" if ok else "not ok")
        self._finish_step(step, PASSED if ok else FAILED)
        self._wake(1)
        self._claims_after(run)

    def _finish_step(self, step: _Step, state: str) -> None:
        """A step became terminal: skip dependants, raise asks, partial release, settle."""
        run = step.run
        steps = run.steps
        terminal = [step]
        step.state = state
        if state == FAILED:
            run.failed = True
            todo = list(run.shape.dependants[step.idx])
            while todo:
                s = steps[todo.pop()]
                if s.state == PENDING:
                    s.state = SKIPPED
                    terminal.append(s)
                    todo.extend(run.shape.dependants[s.idx])
        run.open -= len(terminal)
        if run.open == 0:
            self._settle(run)
            return
        for held in run.nodes:  # at-boundary drain, checked in the result transaction too (§7.5)
            if (
                held.drain == "at-boundary"
                and held.lease is not None
                and held.lease.run is run
                and _still_needed(held, steps)
            ):
                self._end_run(run, "drained")
                return
        if run.shape.has_ask:
            self._raise_asks(run)
        node_open = run.node_open
        for s in terminal:  # applyRelease: a node whose steps here are all terminal goes free
            n = s.node
            if n is not None:
                node_open[n] -= 1
                if node_open[n] == 0 and n.lease is not None and n.lease.run is run:
                    self._release(n)

    def _settle(self, run: _Run) -> None:
        run.state = FAILED if run.failed else PASSED
        run.verdict = "fail" if run.failed else "pass"
        run.ended = self.now
        if self.record_events:
            self.ev.append((self.now, "settled", run.arrival.run_id, "", run.verdict))
        for n in run.nodes:
            if n.lease is not None and n.lease.run is run:
                self._release(n)

    def _end_run(self, run: _Run, verdict: str) -> None:
        """lost / drained: FAILED, open steps SKIPPED, leases freed except where a step is still
        CLAIMED (the node keeps its lease until that result or expiry — I2)."""
        run.state, run.verdict, run.ended = FAILED, verdict, self.now
        for s in run.steps:
            if s.state == PENDING or s.state == ASKED:
                s.state = SKIPPED
        self._log("settled", run.arrival.run_id, "", verdict)
        for n in run.nodes:
            lease = n.lease
            if (
                lease is not None
                and lease.run is run
                and not any(s.node is n and s.state == CLAIMED for s in run.steps)
            ):
                self._release(n)

    def _release(self, node: _Node) -> None:
        lease = node.lease
        assert lease is not None
        node.lease = None
        if not node.drain:
            self.free.add(node)
        rid = lease.run.arrival.run_id
        self.lease_rows.append((node.node_id, rid, lease.granted_at, self.now))
        if self.record_events:
            self.ev.append((self.now, "lease_released", rid, node.node_id, ""))

    # -- reaper ---------------------------------------------------------------------------------

    def _schedule_reap(self, not_after: int) -> None:
        renew = self.renew
        tick = max(renew, -(-not_after // renew) * renew)  # first pass at k·renew_s >= not_after
        if tick not in self.reap_at:
            self.reap_at.add(tick)
            self._push(tick, REAPER, 0, self._on_reap, tick)

    def _on_reap(self, tick: int) -> None:
        self.reap_at.discard(tick)
        self.n_reap += 1
        released = False
        for n in self.nodes:
            lease = n.lease
            if lease is not None and lease.not_after <= self.now:
                run = lease.run
                self._release(n)
                if run.state == RUNNING:
                    self._end_run(run, "lost")
                released = True
        if released:
            self._wake(3)

    # -- fleet ----------------------------------------------------------------------------------

    def _on_advert(self, arg: tuple[_Node, int]) -> None:
        node, epoch = arg
        if epoch != node.advert_epoch:
            return  # a heartbeat of a schedule that a vanish or return replaced
        self._push(self.now + self.interval, ADVERT, node.idx, self._on_advert, arg)
        self._advert(node)

    def _advert(self, node: _Node) -> None:
        """UpsertAdvert and what the handler does with it (§7.3, §7.5)."""
        now = self.now
        self.n_advert += 1
        was_live = node.expires_at > now
        prev_drain = node.drain
        changed = not _json_equal(node.caps, node.daemon_caps)  # wake 9
        if changed:
            node.caps = node.daemon_caps
            for info in self.needs_by_key.values():
                info.index(self.nodes)
        node.expires_at = now + self.advert_ttl
        node.drain = node.daemon_drain
        if node.drain:
            self.free.discard(node)
        elif node.lease is None:
            self.free.add(node)
        released = False
        lease = node.lease
        if lease is not None:
            lease.not_after = now + self.lease_ttl
            run = lease.run
            if lease.instance != node.instance:  # restart detection
                old = lease.instance
                if run.state != RUNNING:  # a late lease for a step its dead daemon never reports
                    self._release(node)
                    released = True
                elif any(s.node is node and s.attempt and s.instance == old for s in run.steps):
                    self._release(node)  # something ran under the old instance: lost
                    self._end_run(run, "lost")
                    released = True
                else:
                    lease.instance = node.instance  # nothing ran there yet: rebind
                    self._log("lease_rebound", run.arrival.run_id, node.node_id)
            elif (
                node.drain == "at-boundary"
                and run.state == RUNNING
                and _still_needed(node, run.steps)
            ):
                self._end_run(run, "drained")
                released = True
        if released:
            self._wake(4)
        elif prev_drain and not node.drain:
            self._wake(6)
        elif changed:
            self._wake(9)
        elif not was_live:
            if self.wake_on_return:
                self._wake(7)
            else:
                self.dirty = True  # capacity came back without a wake: a run may be stuck
        self._try_claim(node)

    def _on_fleet(self, i: int) -> None:
        self._next_fleet = i + 1
        self._schedule_fleet()
        ev = self.plan.fleet_events[i]
        node = self.by_id[ev.node_id]
        effect = fleet.apply(node, ev)
        if effect == fleet.VANISHED:
            if node.lease is not None:
                self._schedule_reap(node.lease.not_after)
            # liveness ends at expires_at with no event: mark it, for stuck accounting
            self._push(node.expires_at, MARK, node.idx, _noop, None)
        elif effect == fleet.RETURNED:
            self._push(
                self.now + self.interval,
                ADVERT,
                node.idx,
                self._on_advert,
                (node, node.advert_epoch),
            )
            self._advert(node)
        elif effect == fleet.ADVERTISE:
            self._advert(node)
        kind = ev.kind
        self._log("fleet", "", node.node_id, kind if effect != fleet.IGNORED else f"{kind} ignored")

    # -- stuck ----------------------------------------------------------------------------------

    def _close_stuck(self, run: _Run) -> None:
        since = self.stuck_open.pop(run, None)
        if since is not None and self.now > since:
            self.stuck_rows.append((run.arrival.run_id, since, self.now, False))

    def _check_stuck(self) -> None:
        self.dirty = False
        now = self.now
        promotable: set[_Run] = set()
        if self.nq and self._any_free_live():
            for info in self.qkeys:
                if self._match(info)[0] == OK:
                    promotable.update(r for r in info.queue[info.head :] if r.state == QUEUED)
        for run in [r for r in self.stuck_open if r not in promotable]:
            self._close_stuck(run)
        for run in promotable:
            self.stuck_open.setdefault(run, now)

    # -- output ---------------------------------------------------------------------------------

    def _result(self) -> ModelResult:
        end = self.now
        for run, since in self.stuck_open.items():
            self.stuck_rows.append((run.arrival.run_id, since, end, True))
        self.stuck_open.clear()
        runs = self.runs
        created = _seconds([r.created for r in runs])
        started = _seconds([r.started for r in runs])
        ended = _seconds([r.ended for r in runs])
        runs_df = pd.DataFrame(
            {
                "run_id": [r.arrival.run_id for r in runs],
                "template": [r.arrival.template for r in runs],
                "created_at": created,
                "started_at": started,
                "ended_at": ended,
                "wait_s": started - created,
                "run_s": ended - started,
                "state": [r.state for r in runs],
                "verdict": [r.verdict or None for r in runs],
                "width": np.fromiter((len(r.nodes) for r in runs), dtype=np.int64, count=len(runs)),
                "nodes": [_ids(r.nodes) for r in runs],
                "reject": [r.reject or None for r in runs],
                "warmup": np.arange(len(runs)) < self.warmup,
                "source_id": _source_ids(self.plan, len(runs)),
            }
        )
        promos = _frame(self.promos, ("at_s", "run_id", "nodes", "how", "wake"), ("at_s",))
        queue = _frame(self.qlen, ("at_s", "length"), ("at_s",))
        self.stuck_rows.sort(key=lambda r: (r[1], r[0]))
        stuck = _frame(
            self.stuck_rows, ("run_id", "start_s", "end_s", "open"), ("start_s", "end_s")
        )
        stuck.insert(3, "duration_s", stuck["end_s"] - stuck["start_s"])
        held = [
            (n.node_id, n.lease.run.arrival.run_id, n.lease.granted_at, -1)
            for n in self.nodes
            if n.lease is not None
        ]
        leases = _frame(
            self.lease_rows + held,
            ("node_id", "run_id", "granted_at", "released_at"),
            ("granted_at", "released_at"),
        )
        counts = {
            "submit": self.n_submit,
            "advert": self.n_advert,
            "claim": self.n_claim,
            "report": self.n_report,
            "answer": self.n_answer,
            "reap": self.n_reap,
            "reaper_ticks": end // self.renew,
            "wake": self.n_wake,
            "promote": self.n_promote,
        }
        return ModelResult(
            runs=runs_df,
            promotions=promos,
            event_rows=self.ev,
            queue=queue,
            stuck=stuck,
            leases=leases,
            counts=counts,
            end_s=end / US,
            scenario_hash=self.plan.scenario.scenario_hash(),
            nodes=pd.DataFrame(
                {
                    "node_id": [n.node_id for n in self.plan.nodes],
                    "label": [n.label for n in self.plan.nodes],
                    "capabilities": [
                        json.dumps(n.capabilities, sort_keys=True) for n in self.plan.nodes
                    ],
                }
            ),
        )


def _seconds(values: list[int]) -> np.ndarray:
    """Integer µs → float seconds; negative (never happened) → NaN."""
    a = np.asarray(values, dtype=np.int64)
    out = a / US
    out[a < 0] = np.nan
    return out


def _source_ids(plan: Plan, n: int) -> Any:
    """The trace's own ids of the first `n` arrivals (issue 14 §7), or None for each run."""
    if plan.source_ids:
        return list(plan.source_ids[:n])
    return np.full(n, None, dtype=object)


def _ids(nodes: list[_Node]) -> str:
    if len(nodes) == 1:
        return nodes[0].node_id
    return ",".join(sorted(n.node_id for n in nodes))


def _frame(
    rows: list[tuple[Any, ...]], columns: tuple[str, ...], times: tuple[str, ...]
) -> pd.DataFrame:
    """Rows → DataFrame by columns (much faster than row-wise), µs columns → seconds."""
    data: dict[str, Any] = {}
    for i, name in enumerate(columns):
        col = [r[i] for r in rows]
        data[name] = _seconds(col) if name in times else col
    return pd.DataFrame(data, columns=list(columns))


def _noop(_: Any) -> None:
    return None


def _node_id(node: _Node) -> str:
    return node.node_id


def run_model(
    plan_or_scenario: Plan | Any,
    *,
    record_events: bool = True,
    exhaustive_stuck: bool = False,
) -> ModelResult:
    """Run the reference model.

    Args:
        plan_or_scenario: a `Plan`, or a `Scenario` (materialized first).
        record_events: keep the `events` table (the other tables are always kept); off for the
            fastest sweeps.
        exhaustive_stuck: re-check stuck runs after every event instead of only when something
            could have changed — slow; tests use it to check the fast bookkeeping.

    Returns:
        The `ModelResult`.
    """
    plan = plan_or_scenario if isinstance(plan_or_scenario, Plan) else materialize(plan_or_scenario)
    return Model(plan, record_events=record_events, exhaustive_stuck=exhaustive_stuck).run()


def replicate(
    scenario: Any,
    n: int,
    fn: Callable[[Any], T] | None = None,
    executor: Executor | None = None,
) -> list[T]:
    """Run `fn` on `n` copies of a scenario that differ only in their seed.

    It lives here, not in `sim.analysis`, so that the statistics import no part of the
    simulator and the model can import them (issue 14 §1: no import cycle).

    Args:
        scenario: a `sim.scenarios.Scenario`.
        n: number of replications.
        fn: what to run on each copy; default `run_model`. Must be picklable for a process pool.
        executor: any `concurrent.futures.Executor` (a process pool, a Dask client's executor);
            None runs them here, one after the other.

    Returns:
        One result per replication, in seed order (`sim.analysis.replication_seeds`).
    """
    run = fn if fn is not None else run_model
    copies = [replace(scenario, seed=s) for s in replication_seeds(scenario.seed, n)]
    if executor is None:
        return [run(c) for c in copies]  # type: ignore[misc]
    return list(executor.map(run, copies))  # type: ignore[arg-type]


def promotions_diff(a: pd.DataFrame, b: pd.DataFrame, tol_s: float = 0.0) -> str | None:
    """The first difference between two promotion lists (at_s, run_id, nodes), or None.

    For the differential test: both lists are compared row by row in their recorded order.

    Args:
        a: the model's `promotions`.
        b: the other engine's, with at least the columns at_s, run_id, nodes.
        tol_s: tolerance on times (0: exact, as integer-microsecond clocks allow).

    Returns:
        A one-line description of the first diverging row, or None if they agree.
    """
    rows_a = list(a[["at_s", "run_id", "nodes"]].itertuples(index=False, name=None))
    rows_b = list(b[["at_s", "run_id", "nodes"]].itertuples(index=False, name=None))
    for i, (x, y) in enumerate(itertools.zip_longest(rows_a, rows_b)):
        if x is None or y is None or x[1:] != y[1:] or abs(x[0] - y[0]) > tol_s:
            return f"promotion #{i}: {x} != {y}"
    return None
