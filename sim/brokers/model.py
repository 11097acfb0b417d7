"""The reference model: the Mediator's scheduling policy, re-implemented in memory (design.md §20).

Why it exists: fast sweeps where a database would be too slow (P5: ≥ 50,000 runs per wall second),
and a *differential check* — on the same `sim.inputs.workload.Plan` the real Mediator and this model
must promote the same runs onto the same nodes at the same virtual instants. It is a *broker*
(`sim.platform.driver.Broker`): the fleet's daemons, arrivals, the reaper timer and the stop rule
are `sim.platform.driver`'s, shared with the real Mediator (`sim.brokers.mediator.MediatorBroker`);
what is measured is `sim.platform.measure`'s. This module holds the policy alone. It must not import
`mediator` (a boundary test checks): two independent implementations that agree are evidence;
one implementation used twice is not.

What it implements (docs/design.md §1–3, §5–7, rule ids from seed 000):

- matcher (§6): roles in name order; every role must have a live candidate first, else
  NO_CANDIDATE for the first empty role in name order (as `mediator.core.match` does); folding
  reuses
  the earliest chosen node that serves the role; otherwise the first live, available candidate
  ordered by how many of the roles from this one onward it serves (more first), then node_id;
  none → ALL_BUSY; more distinct nodes than `max_width` → the narrowest choice of the same
  nodes instead, the first of them in that same order, and TOO_WIDE only if none fits
  (`_narrowest`, §4 "Width, exactly"). JSON types are kept (a
  boolean never equals a number; 1 equals 1.0; a need `true` wants a truthy capability; a list
  capability matches a member).
- submit (§7.1): unavailable = busy ∪ draining. Assignment → RUNNING at once; ALL_BUSY or
  TOO_WIDE → QUEUED, then one WakeQueued (R17, wake 8) — unless no choice of live nodes, busy
  or not, fits `max_width`: then, like NO_CANDIDATE, FAILED, verdict `rejected` (R1, amended).
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
  the stored ones, 2 a cancel (a `cancel` fleet event: the run the node holds ends
  FAILED/cancelled, its nodes freed but for one still running a claimed step). (5 process
  start: the queue is empty then.) No other call wakes — an extra wake is observable: it would
  end a stuck interval early.
- leases (§7.5): renewed by the node's adverts; expire when `not_after <= now`; the reaper runs
  at k·renew_seconds (the loop's timer, `sim.platform.driver`); a lost run's open steps are SKIPPED.
  Restart detection: an advert with a new instance whose lease belongs to an ended run frees it;
  else it loses the run if a step of it on this node has an attempt under the lease's instance
  (`attempt > 0 and instance == old`, a rolled-back step included), else rebinds the lease. A
  node still running a CLAIMED step of an ended run keeps its lease until that step's result (I2)
  or expiry.
- drain: `graceful` — unavailable, the current run finishes; `at-boundary` — unavailable, claims
  refused, and once a leased node of the run has no CLAIMED step but still a PENDING one the run
  ends FAILED/`drained` with its open steps SKIPPED (a node it no longer needs is released).
  That is checked by the node's adverts (wake 4) and by every result or answer transaction of
  the run that leaves steps open (wake 1), as `mediator.flows.steps` does.

It answers the calls the loop makes (`submit`, `advert`, `work`, `claim`, `report`, `answer`,
`reap`) with the state the Mediator would have; `promotable` is the stuck check's question, and
`dirty` says when it is worth asking: capacity came back without a wake (wake 7 off), or a sweep
left a TOO_WIDE run queued. With `wake_on_return` the model has no stuck interval (every release
and every returning node wakes the queue); without it, a returned node leaves its queued runs
stuck until an unrelated wake.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any, TypeVar

from sim.analysis import replication_seeds
from sim.inputs.workload import Arrival, Plan, materialize
from sim.platform.core import US, EventQueue, gc_paused, to_us
from sim.platform.driver import Driver
from sim.platform.fleet import Daemon
from sim.platform.measure import ModelResult, model_result, promotions_diff

__all__ = [  # names callers have found here over time stay importable from here
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

_NONE_OPEN: dict[Any, int] = {}  # `_Run.node_open` of one-step runs: never read, never written


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


class _Node:
    """What the Mediator knows of a node: set by its adverts, and the lease it holds."""

    __slots__ = ("caps", "drain", "expires_at", "idx", "instance", "lease", "node_id", "solo")

    def __init__(self, idx: int, node_id: str, caps: dict[str, Any]) -> None:
        self.idx = idx  # position in plan.nodes (the driver's name for it)
        self.solo = (idx,)  # `_Run.ordered` of a run on this node alone (one tuple, not one a run)
        self.node_id = node_id
        self.caps = caps  # last advert's capabilities
        self.drain = ""  # last advert's drain policy
        self.instance = ""  # last advert's daemon instance
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
        "ordered",
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
        self.steps = [_Step(self, 0)] if shape.n == 1 else [_Step(self, i) for i in range(shape.n)]
        self.state = ""
        self.verdict = ""
        self.reject = ""
        self.created = now
        self.started = -1
        self.ended = -1
        self.nodes: Sequence[_Node] = ()  # distinct assigned nodes, in role order of first use
        self.ordered: tuple[int, ...] = ()  # their positions, in node order
        self.open = shape.n
        self.node_open: dict[_Node, int] = _NONE_OPEN  # per node, its open steps (n > 1 only)
        self.failed = False


# ---------------------------------------------------------------------------------------------
# The broker
# ---------------------------------------------------------------------------------------------


class Model:
    """The reference policy as a `sim.platform.driver.Broker`. Use `run_model`; the class is public
    for stepping in tests."""

    def __init__(self, plan: Plan, *, record_events: bool = True) -> None:
        st = plan.scenario.settings
        self.plan = plan
        self.lease_ttl = to_us(st.lease_ttl_seconds)
        self.advert_ttl = to_us(st.advert_ttl_seconds)
        self.max_width = st.max_width
        self.max_attempts = st.max_attempts
        self.wake_on_return = st.wake_on_return
        self.record_events = record_events
        if self.lease_ttl <= 0:
            raise ValueError("lease_ttl must be positive (R11)")

        self.nodes = [_Node(i, n.node_id, n.capabilities) for i, n in enumerate(plan.nodes)]
        self.now = 0
        self.touched: list[int] = []
        self.dirty = False
        self.free: set[_Node] = set()  # nodes with no lease and no drain (liveness checked lazily)
        self.nq = 0
        self.qkeys: set[_Needs] = set()
        self.needs_cache: dict[Any, tuple[Any, _Needs]] = {}
        self.needs_by_key: dict[str, _Needs] = {}
        self.shape_cache: dict[int, tuple[Any, _Shape]] = {}
        self.runs: list[_Run] = []  # in arrival order: runs[i] is plan.arrivals[i]
        self.ev: list[tuple[int, str, str, str, str]] = []
        self.promos: list[tuple[int, str, str, str, int]] = []
        self.qlen: list[tuple[int, int]] = [(0, 0)]
        self.lease_rows: list[tuple[str, str, int, int]] = []
        # Mediator calls by kind (plain attributes: a dict update per call costs more)
        self.n_submit = self.n_advert = self.n_claim = self.n_report = self.n_answer = 0
        self.n_reap = self.n_wake = self.n_promote = 0

    def _log(self, kind: str, run_id: str = "", node_id: str = "", detail: str = "") -> None:
        if self.record_events:
            self.ev.append((self.now, kind, run_id, node_id, detail))

    def counts(self) -> dict[str, int]:
        """Calls by kind (`reap`: the passes the driver made)."""
        return {
            "submit": self.n_submit,
            "advert": self.n_advert,
            "claim": self.n_claim,
            "report": self.n_report,
            "answer": self.n_answer,
            "reap": self.n_reap,
            "reaper_ticks": 0,  # set by run_model from where the simulation stopped
            "wake": self.n_wake,
            "promote": self.n_promote,
        }

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
            narrow = self._narrowest(
                info, lambda n: n.expires_at > now and n.lease is None and not n.drain
            )
            return (TOO_WIDE, None) if narrow is None else (OK, narrow)
        return OK, chosen

    def _narrowest(self, info: _Needs, usable: Callable[[_Node], bool]) -> list[_Node] | None:
        """The narrowest choice of `usable` nodes within `max_width`, node per role, or None.

        §4 "Width, exactly": widths 1, 2, … in turn; at each, a walk in the matcher's own order
        (the first role no picked node serves takes each of its usable candidates in `order`)
        that stops at the first full cover. Candidates adding the same roles as an earlier one
        are skipped, and (roles covered, picks left) pairs that failed are not walked again.
        """
        n_roles = len(info.roles)
        cands = [[n for n in info.order[i] if usable(n)] for i in range(n_roles)]
        if not all(cands):
            return None
        covers: dict[int, frozenset[int]] = {}
        for lst in cands:
            for n in lst:
                if n.idx not in covers:
                    covers[n.idx] = frozenset(i for i in range(n_roles) if n.idx in info.serves[i])
        dead: set[tuple[frozenset[int], int]] = set()

        def walk(done: frozenset[int], picked: list[_Node], left: int) -> list[_Node] | None:
            todo = next((i for i in range(n_roles) if i not in done), None)
            if todo is None:
                return picked
            if left == 0 or (done, left) in dead:
                return None
            seen: set[frozenset[int]] = set()
            for n in cands[todo]:
                gain = covers[n.idx] - done
                if gain not in seen:
                    seen.add(gain)
                    got = walk(done | gain, [*picked, n], left - 1)
                    if got is not None:
                        return got
            dead.add((done, left))
            return None

        for width in range(1, self.max_width + 1):
            picked = walk(frozenset(), [], width)
            if picked is not None:
                return [next(n for n in picked if n.idx in info.serves[i]) for i in range(n_roles)]
        return None

    def _too_wide_free(self, info: _Needs) -> bool:
        """Whether no choice of live nodes, busy or not, fits `max_width` (§4: exactly)."""
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
        if len(used) <= self.max_width:
            return False  # the greedy choice fits
        return self._narrowest(info, lambda n: n.expires_at > now) is None

    def _any_free_live(self) -> bool:
        now = self.now
        for n in self.free:  # noqa: SIM110 — a loop beats any(<generator>) on this hot path
            if n.expires_at > now:
                return True
        return False

    # -- submit and the sweep -------------------------------------------------------------------

    # -- submit and the sweep -------------------------------------------------------------------

    def submit(self, i: int) -> None:
        """CreateRun (§7.1): RUNNING at once, QUEUED and a WakeQueued (R17, wake 8), or FAILED."""
        arrival = self.plan.arrivals[i]
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
            # R1/R10 amended: refused only if no choice of live nodes fits (§4, exactly).
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
            run.ordered = chosen[0].solo
        else:
            nodes = list(dict.fromkeys(chosen))
            ordered = sorted(nodes, key=_node_id)
            ids = ",".join(n.node_id for n in ordered)
            run.ordered = tuple(sorted(n.idx for n in nodes))
        run.nodes = nodes
        log = self.record_events
        free = self.free
        for n in ordered:  # leases inserted in node_id order
            n.lease = _Lease(n, run, n.instance, now, self.lease_ttl)
            free.discard(n)
            if log:
                self.ev.append((self.now, "lease_granted", rid, n.node_id, ""))
        if shape.n == 1:  # (its result settles the run: no partial release to count for)
            if shape.roles[0] >= 0:
                run.steps[0].node = chosen[shape.roles[0]]
        else:
            node_open: dict[_Node, int] = {}
            run.node_open = node_open
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
        self.touched.append(run.seq)  # its nodes claim (sim.platform.driver)

    # -- steps ----------------------------------------------------------------------------------

    def nodes_of(self, i: int) -> Iterable[int]:
        """The nodes leased to run `i` while it runs, in node order."""
        run = self.runs[i]
        if run.state != RUNNING:
            return ()
        nodes = self.nodes
        ordered = run.ordered
        if len(ordered) == 1:
            lease = nodes[ordered[0]].lease
            return ordered if lease is not None and lease.run is run else ()
        return [k for k in ordered if (ls := nodes[k].lease) is not None and ls.run is run]

    def work(self, node: int, instance: str) -> _Step | None:
        """The node's claimable step: its lease's run is running, the lease is this instance's,
        no at-boundary drain (claims refused), and a PENDING step there has its `after` PASSED."""
        n = self.nodes[node]
        lease = n.lease
        if lease is None or n.drain == "at-boundary" or lease.instance != instance:
            return None
        run = lease.run
        if run.state != RUNNING:
            return None
        after = run.shape.after
        steps = run.steps
        for s in steps:
            if s.node is n and s.state == PENDING:
                for k in after[s.idx]:
                    if steps[k].state != PASSED:
                        break
                else:
                    return s
        return None

    def claim(self, node: int, instance: str, step: _Step) -> tuple[int, int, int]:
        """ClaimStep: CLAIMED under this instance, the next attempt."""
        run = step.run
        step.state = CLAIMED
        step.attempt += 1
        step.instance = instance
        self.n_claim += 1
        if self.record_events:
            self.ev.append((self.now, "claimed", run.arrival.run_id, self.nodes[node].node_id,
                            str(step.idx)))  # fmt: skip
        return run.seq, step.idx, step.attempt

    def report(
        self, node: int, instance: str, i: int, seq: int, attempt: int, outcome: str
    ) -> None:
        """ReportResult (§7.4): a retry rolls back (R15); a late result frees the lease kept for
        it (I2); otherwise the step is terminal, then wake 1."""
        n = self.nodes[node]
        run = self.runs[i]
        step = run.steps[seq]
        rid = run.arrival.run_id
        self.n_report += 1
        if run.state != RUNNING:
            # 409 run_ended: the late result is recorded and the lease kept for this step is
            # freed (I2's exception ends here); it wakes only if that released the node.
            step.state = PASSED if outcome == "pass" else FAILED
            self._log("result", rid, n.node_id, "run_ended")
            lease = n.lease
            if lease is not None and lease.run is run:
                self._release(n)
                self._wake(1)
            return
        if outcome == "retry" and step.attempt < self.max_attempts:
            step.state = PENDING  # R15: a rollback — no release, no wake
            self._log("result", rid, n.node_id, "retry")
            self.touched.append(i)  # the step is claimable again
            return
        if self.record_events:
            self.ev.append((self.now, "result", rid, n.node_id, outcome))
        self._finish_step(step, PASSED if outcome == "pass" else FAILED)
        self._wake(1)
        if run.state == RUNNING:  # (an ended run has nothing left to claim or answer)
            self.touched.append(i)

    def asked(self, i: int) -> Iterable[int]:
        """The run's steps with an open ask."""
        return [s.idx for s in self.runs[i].steps if s.state == ASKED]

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

    def answer(self, i: int, seq: int, ok: bool) -> None:
        """AnswerAsk: refused (no wake) if the ask was closed when the run ended; else wake 1."""
        run = self.runs[i]
        step = run.steps[seq]
        if run.state != RUNNING or step.state != ASKED:
            return
        self.n_answer += 1
        self._log("ask_answered", run.arrival.run_id, "", "ok" if ok else "not ok")
        self._finish_step(step, PASSED if ok else FAILED)
        self._wake(1)
        if run.state == RUNNING:
            self.touched.append(i)

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

    # -- reaper ---------------------------------------------------------------------------------

    def reap(self) -> None:
        """One reaper pass (§7.5): expired leases (`not_after <= now`) are freed, their running
        runs lost; wake 3 only if it released."""
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

    def cancel(self, node: int) -> None:
        """Cancel (§10) of the RUNNING run the node holds a lease for: ended FAILED/cancelled,
        leases freed except where a step is still CLAIMED (I2); wake 2."""
        lease = self.nodes[node].lease
        if lease is None or lease.run.state != RUNNING:
            return
        self._end_run(lease.run, "cancelled")
        self._wake(2)

    def holds_lease(self, nodes: list[int]) -> bool:
        return any(self.nodes[k].lease is not None for k in nodes)

    def drain_pending(self, nodes: list[int]) -> bool:
        # An at-boundary drain that the node's next advert will finish is still to come.
        for k in nodes:
            n = self.nodes[k]
            if n.drain == "at-boundary" and n.lease is not None and n.lease.run.state == RUNNING:
                return True
        return False

    # -- fleet ----------------------------------------------------------------------------------

    def advert(self, node: int, daemon: Daemon, heartbeat: bool) -> int:
        """UpsertAdvert and what the handler does with it (§7.3, §7.5); returns the expiry."""
        n = self.nodes[node]
        now = self.now
        self.n_advert += 1
        was_live = n.expires_at > now
        prev_drain = n.drain
        changed = not _json_equal(n.caps, daemon.daemon_caps)  # wake 9
        if changed:
            n.caps = daemon.daemon_caps
            for info in self.needs_by_key.values():
                info.index(self.nodes)
        n.expires_at = now + self.advert_ttl
        n.drain = daemon.daemon_drain
        n.instance = daemon.instance
        if n.drain:
            self.free.discard(n)
        elif n.lease is None:
            self.free.add(n)
        released = False
        lease = n.lease
        if lease is not None:
            lease.not_after = now + self.lease_ttl
            run = lease.run
            if lease.instance != n.instance:  # restart detection
                old = lease.instance
                if run.state != RUNNING:  # a late lease for a step its dead daemon never reports
                    self._release(n)
                    released = True
                elif any(s.node is n and s.attempt and s.instance == old for s in run.steps):
                    self._release(n)  # something ran under the old instance: lost
                    self._end_run(run, "lost")
                    released = True
                else:
                    lease.instance = n.instance  # nothing ran there yet: rebind
                    self._log("lease_rebound", run.arrival.run_id, n.node_id)
            elif n.drain == "at-boundary" and run.state == RUNNING and _still_needed(n, run.steps):
                self._end_run(run, "drained")
                released = True
        if released:
            self._wake(4)
        elif prev_drain and not n.drain:
            self._wake(6)
        elif changed:
            self._wake(9)
        elif not was_live:
            if self.wake_on_return:
                self._wake(7)
            else:
                self.dirty = True  # capacity came back without a wake: a run may be stuck
        return n.expires_at

    def note_fleet(self, node: int, kind: str, applied: bool) -> None:
        self._log("fleet", "", self.nodes[node].node_id, kind if applied else f"{kind} ignored")

    # -- stuck ----------------------------------------------------------------------------------

    def promotable(self) -> Iterable[int]:
        """The QUEUED runs of every needs class that matches the live, free fleet now."""
        self.dirty = False
        out: list[int] = []
        if self.nq and self._any_free_live():
            for info in self.qkeys:
                if self._match(info)[0] == OK:
                    out.extend(r.seq for r in info.queue[info.head :] if r.state == QUEUED)
        return out


def _node_id(node: _Node) -> str:
    return node.node_id


def run_model(
    plan_or_scenario: Plan | Any,
    *,
    record_events: bool = True,
    exhaustive_stuck: bool = False,
) -> ModelResult:
    """Run the reference model: `sim.platform.driver`'s fleet against this broker, measured by
    `sim.platform.measure`.

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
    started = time.perf_counter()
    with gc_paused():
        model = Model(plan, record_events=record_events)
        driver = Driver(plan, model, exhaustive_stuck=exhaustive_stuck)
        end = driver.run()
        held = [
            (n.node_id, n.lease.run.arrival.run_id, n.lease.granted_at, -1)
            for n in model.nodes
            if n.lease is not None
        ]
        counts = model.counts()
        counts["reaper_ticks"] = end // driver.renew
        result = model_result(
            plan,
            model.runs,
            promotions=model.promos,
            queue=model.qlen,
            stuck=driver.stuck_rows,
            leases=model.lease_rows + held,
            event_rows=model.ev,
            counts=counts,
            end_us=end,
        )
    result.wall_s = time.perf_counter() - started
    return result


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
        scenario: a `sim.inputs.scenarios.Scenario`.
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
