"""The only module that imports psycopg.

It owns the connection pool, runs the named queries of ``queries.sql``, turns rows into the frozen
dataclasses of ``mediator.core.rows`` and driver errors into ``mediator.core.errors``
(procrastinate's
connector pattern), so flows, the API and the simulator never see a driver type.

Every named query reads time as ``mediator_now(%(now)s)`` and every statement carries the clock's
instant as its ``now`` parameter (docs/design.md §13; NULL without a clock: the server's ``now()``):
that is how the simulator's virtual time reaches SQL without a ``set_config`` round trip of its
own (issue 13). Only ``read_only`` analytics still set ``mediator.now`` for hand-written SQL.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import orjson
import psycopg
import psycopg.errors
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb, set_json_dumps, set_json_loads
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from mediator.core.errors import MediatorError, NodeTaken, StoreUnavailable
from mediator.core.progress import Decision
from mediator.core.rows import (
    AdvertResult,
    Applied,
    Ask,
    AskStatus,
    ClaimRefusal,
    Event,
    FleetNode,
    Lease,
    LiveAdvert,
    NeedsClass,
    Node,
    NodeLease,
    NodeState,
    QueuedDetail,
    QueuedRun,
    ResultSource,
    Run,
    RunLease,
    RunSummary,
    SealSource,
    Step,
)
from mediator.core.states import (
    RunState,
    StepState,
    run_sources,
    run_transition,
    step_sources,
    step_transition,
)
from mediator.store.queries import QUERIES, schema_sql

log = logging.getLogger(__name__)

SCHEMA_VERSION = 6
_SCHEMA_LOCK = 0x6D656469  # advisory lock id: one process loads the schema, the others wait
_GAPS_LOCK = 0x6D656467  # advisory lock id: one give-back of a gap at a time (Tx.give_back)

Clock = Callable[[], datetime]


# jsonb in and out with orjson (issue 13: a simulated run loads some 30 jsonb values; orjson is
# several times json's speed, bench/bench_json.py) — but only where it means the same. orjson reads
# an integer beyond 64 bits as a rounded float and writes no integer beyond 64 bits; jsonb keeps
# them exact, so text with a run of 19 digits is read by json, and a value orjson refuses is
# written by json. Everything else reaching jsonb was checked by the contract parser (no NaN,
# no set, no NUL: docs/security.md), where the two agree.
_LONG_DIGITS = re.compile(rb"\d{19}")


def _json_loads(data: bytes | bytearray | memoryview | str) -> Any:
    # psycopg hands a memoryview over its result: the scan and orjson read it in place (a copy
    # per value cost more than the scan); only json needs bytes.
    raw = data.encode() if isinstance(data, str) else data
    if _LONG_DIGITS.search(raw) is None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # json's own error (or its answer) then
    return json.loads(bytes(raw))


def _json_dumps(obj: Any) -> bytes | str:
    try:
        return orjson.dumps(obj)
    except TypeError:  # JSONEncodeError too: an integer beyond 64 bits, a key that is no str
        return json.dumps(obj)


def _map_error(exc: psycopg.Error) -> MediatorError:
    """Driver error → our own; never leaks SQL or server text to the caller (SECURITY-15)."""
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        return StoreUnavailable("The database is unavailable; try again shortly.")
    err = MediatorError("The request could not be completed because of a storage error.")
    err.__cause__ = exc
    return err


def _event(e: dict[str, Any]) -> dict[str, Any]:
    return {"node_id": e.get("node_id", ""), "kind": e["kind"], "data": e.get("data", {})}


def check_edges(params: dict[str, Any]) -> None:
    """The state table decides (issue 13): a statement's state targets are parameters named
    ``…_to`` (``run_to`` for ``runs.state``, any other for ``steps.state``), each guarded in its
    SQL by ``state = ANY(%(…_from)s)`` — or, with no ``…_from``, written by an INSERT (from no
    row). Every such pair must be edges of ``mediator.core.states``; a ``None`` target writes no
    state.
    ``tests/unit/test_state_sql.py`` proves the SQL side keeps to this convention.

    Raises:
        InvalidTransition: a target that is not an edge from one of its sources.
    """
    for key, to in params.items():
        if not key.endswith("_to") or to is None:
            continue
        check = run_transition if key.startswith("run") else step_transition
        for frm in params.get(key[:-3] + "_from") or [None]:
            check(frm, to)


def _run_edge(to: RunState | str) -> dict[str, Any]:
    """``run_to`` and its guard ``run_from``: every state the table allows ``to`` from."""
    return {"run_to": str(to), "run_from": [str(s) for s in run_sources(to)]}


def _step_edge(to: StepState | str, name: str = "step") -> dict[str, Any]:
    return {f"{name}_to": str(to), f"{name}_from": [str(s) for s in step_sources(to)]}


def _split(row: dict[str, Any], prefix: str) -> dict[str, Any]:
    n = len(prefix)
    return {k[n:]: v for k, v in row.items() if k.startswith(prefix)}


def _result_source(run_id: str, rows: list[dict[str, Any]]) -> ResultSource | None:
    """``result_source``'s rows (one per step; run, node and leases on each) as one object."""
    if not rows:
        return None
    first = rows[0]
    head = {k: v for k, v in first.items() if not k.startswith(("s_", "n_"))}
    version, leases = head.pop("version"), head.pop("leases")
    steps = tuple(Step(run_id=run_id, **_split(r, "s_")) for r in rows if r["s_seq"] is not None)
    node = NodeState(**_split(first, "n_")) if first["n_node_id"] is not None else None
    return ResultSource(
        run=Run(**head, steps=steps),
        version=int(version),
        steps=steps,
        node=node,
        leases=tuple(RunLease(**x) for x in leases),
    )


SweepHead = tuple[list[NeedsClass], list[FleetNode], list[QueuedRun]]


def _sweep_head(rows: list[dict[str, Any]]) -> SweepHead:
    """``sweep_head``'s rows (told apart by ``part``) as classes, fleet and queue head."""
    classes, fleet, head = [], [], []
    for r in rows:
        if r["part"] == "class":
            classes.append(NeedsClass(r["needs_key"], r["needs"]))
        elif r["part"] == "node":
            fleet.append(FleetNode(r["node_id"], r["capabilities"], r["instance"],
                                   r["drain"], r["busy"]))  # fmt: skip
        else:
            head.append(QueuedRun(r["run_id"], r["needs_key"], r["created_at"]))
    fleet.sort(key=lambda n: n.node_id)
    head.sort(key=lambda q: (q.created_at, q.run_id))
    return classes, fleet, head


# One cursor per connection and statement (issue 13, docs/performance.md): a cursor keeps its
# adaptation state (psycopg's Transformer, with the loaders it made for each column type) only
# while it runs the same query again, so a fresh cursor per statement — or one cursor taking
# turns between statements — made it all anew every time: about 20 µs per statement of a
# simulated run. The cursors live on their connection (so they go with it: a cache keyed by the
# connection elsewhere would keep it alive through each cursor's reference to it), and each
# result is freed as soon as its rows are read, so a cursor holds no rows between two runs of its
# statement.
class _Connection(psycopg.Connection[Any]):
    """The pool's connections: psycopg's, with the store's kept cursors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statement_cursors: dict[tuple[str, Any], psycopg.Cursor[Any]] = {}


_NAMES: dict[str, tuple[str, ...]] = {}  # a statement's column names: fixed by its SQL text


def _row_maker(name: str, shape: Any) -> Any:
    """A row factory for statement ``name``: ``dict`` rows, ``tuple`` rows or instances of the
    row class ``shape`` (psycopg's dict_row and class_row, but the column names are read from
    the first result and kept: the same statement always has the same columns)."""

    def factory(cur: psycopg.Cursor[Any]) -> Any:
        names = _NAMES.get(name)
        if names is None:
            res = cur.pgresult
            if res is None or not res.nfields:
                return tuple
            names = _NAMES[name] = tuple((res.fname(i) or b"").decode() for i in range(res.nfields))
        if shape is dict:
            return lambda values: dict(zip(names, values, strict=True))
        if shape is tuple:
            return tuple
        return lambda values: shape(**dict(zip(names, values, strict=True)))

    return factory


def _release(cur: psycopg.Cursor[Any]) -> None:
    """Free the result a cursor still points at (its rows are read): a kept cursor must not hold
    a large run's contract until its statement runs again."""
    res = cur.pgresult
    if res is not None:
        res.clear()


class Tx:
    """One open transaction. Methods are the store floor of seed 003 plus what the flows need."""

    def __init__(self, conn: _Connection, now: datetime | None = None) -> None:
        self.conn = conn
        self.now = now  # the clock's instant for every statement of this Tx (None: the server's)

    # ---- plumbing ----------------------------------------------------------------------------
    def _leasing(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Run a statement that inserts leases: a lease's primary key, a deadlock or a lock
        timeout means another run took one of its nodes first (R9, I1) — NodeTaken."""
        try:
            return self._rows(name, params)
        except (
            psycopg.errors.UniqueViolation,
            psycopg.errors.DeadlockDetected,
            psycopg.errors.LockNotAvailable,
        ) as exc:
            raise NodeTaken("A node of this assignment was taken by another run.") from exc

    def _cursor(self, name: str, shape: Any = dict) -> psycopg.Cursor[Any]:
        """This connection's cursor for statement ``name``, made once (see :func:`_row_maker`)."""
        cursors = self.conn.statement_cursors
        cur = cursors.get((name, shape))
        if cur is None:
            cur = cursors[name, shape] = self.conn.cursor(row_factory=_row_maker(name, shape))
        return cur

    def _rows(self, name: str, params: dict[str, Any] | None = None, row: Any = dict) -> list[Any]:
        """Statement ``name``'s rows: dicts, tuples (``row=tuple``) or instances of a row class."""
        check_edges(params or {})
        cur = self._cursor(name, row or dict)
        try:
            cur.execute(QUERIES[name], {**(params or {}), "now": self.now}, prepare=True)
            # pgresult.nfields, not description: description builds a Column per column on
            # every call, and the row factory builds it once more (issue 13: per-statement cost)
            res = cur.pgresult
            return cur.fetchall() if res is not None and res.nfields else []
        finally:
            _release(cur)

    def _one(self, name: str, params: dict[str, Any] | None = None, row: Any = dict) -> Any:
        rows = self._rows(name, params, row)
        return rows[0] if rows else None

    def _exec(self, name: str, params: dict[str, Any] | None = None) -> int:
        check_edges(params or {})
        cur = self._cursor(name, dict)
        try:
            cur.execute(QUERIES[name], {**(params or {}), "now": self.now}, prepare=True)
            return cur.rowcount
        finally:
            _release(cur)

    # ---- reads -------------------------------------------------------------------------------
    def observed_at(self) -> datetime:
        return self._one("observed_at")["observed_at"]  # type: ignore[no-any-return]

    def fleet_for(self, roles: dict[str, dict[str, Any]]) -> list[FleetNode]:
        """Live nodes that may serve some role of ``roles`` (a superset of the candidates)."""
        return self.submit_read(roles, None)[1]

    def submit_read(
        self, roles: dict[str, dict[str, Any]], run_id: str | None
    ) -> tuple[bool, list[FleetNode]]:
        """A submit's one read (issue 13): whether ``run_id`` exists (R3) and :meth:`fleet_for`."""
        rows = self._rows("fleet_for", {"roles": Jsonb(roles), "run_id": run_id}, row=tuple)
        fleet = [FleetNode(*r[1:]) for r in rows if r[1] is not None]
        return bool(rows and rows[0][0]), fleet

    def live_adverts(self) -> list[LiveAdvert]:
        return self._rows("live_adverts", row=LiveAdvert)

    def busy_nodes(self) -> set[str]:
        return {r["node_id"] for r in self._rows("busy_nodes")}

    def draining_nodes(self) -> set[str]:
        return {r["node_id"] for r in self._rows("draining_nodes")}

    def unavailable_nodes(self) -> set[str]:
        return {r["node_id"] for r in self._rows("unavailable_nodes")}

    def list_nodes(self) -> list[Node]:
        out = []
        for r in self._rows("list_nodes"):
            lease_run, lease_na = r.pop("lease_run_id"), r.pop("lease_not_after")
            lease = Lease(lease_run, lease_na) if lease_run is not None else None
            out.append(Node(**r, lease=lease))
        return out

    def list_runs(
        self, state: str | None, work_id: str | None, since: datetime | None, limit: int
    ) -> list[RunSummary]:
        params = {"state": state, "work_id": work_id, "since": since, "limit": limit}
        return self._rows("list_runs", params, row=RunSummary)

    def list_queued(self) -> list[QueuedRun]:
        return self._rows("list_queued", row=QueuedRun)

    def sweep_head(self, limit: int, sealed: str | None = None) -> SweepHead:
        """The waiting needs classes, the live fleet (node_id order) and the first ``limit``
        queued runs in FIFO order, in one statement (issue 13); all empty: nothing is queued.
        With ``sealed``, the same statement first marks that run's record sealed (what
        :meth:`mark_sealed` does, for a seal whose wake follows)."""
        return _sweep_head(self._rows("sweep_head", {"limit": limit, "sealed": sealed}))

    def queued_page(
        self, keys: Sequence[str], after_at: datetime | str, after_id: str, limit: int
    ) -> list[QueuedRun]:
        params = {"keys": list(keys), "after_at": after_at, "after_id": after_id, "limit": limit}
        return self._rows("queued_page", params, row=QueuedRun)

    def queue_position(self, run_id: str) -> int:
        return int(self._one("queue_position", {"run_id": run_id})["position"])

    def queued_details(self, run_ids: Sequence[str]) -> list[QueuedDetail]:
        """Position and needs of the QUEUED runs among ``run_ids``, in one statement (issue 15
        §4: a page of ``GET /v1/runs`` costs the same however many rows are queued)."""
        params = {"run_ids": list(run_ids)}
        return self._rows("queued_details", params, row=QueuedDetail)

    def live_contract(self, run_id: str) -> dict[str, Any] | None:
        r = self._one("live_contract", {"run_id": run_id})
        return r["contract"] if r else None

    def get_run(self, run_id: str, *, lock: bool = False) -> Run | None:
        name = "lock_run" if lock else "get_run"
        return self._one(name, {"run_id": run_id}, row=Run)  # type: ignore[no-any-return]

    def steps(self, run_id: str) -> list[Step]:
        return self._rows("run_steps", {"run_id": run_id}, row=Step)

    def seal_source(self, run_id: str) -> SealSource | None:
        return self._one("seal_source", {"run_id": run_id}, row=SealSource)  # type: ignore[no-any-return]

    def mark_sealed(self, run_id: str) -> bool:
        """Mark the run's record sealed; returns whether any run is QUEUED, read now."""
        return bool(self._one("mark_sealed", {"run_id": run_id})["queued"])

    def unsealed_runs(self, limit: int = 1000) -> list[str]:
        return [r["run_id"] for r in self._rows("unsealed_runs", {"limit": limit})]

    # ---- lifecycle reads -----------------------------------------------------------------------
    def work(self, node_id: str) -> list[Step]:
        return self._rows("work", {"node_id": node_id}, row=Step)

    def lock_steps(self, run_id: str) -> list[Step]:
        return self._rows("lock_steps", {"run_id": run_id}, row=Step)

    def lock_run_steps(
        self, run_id: str, node_id: str | None = None
    ) -> tuple[Run | None, list[Step], NodeState | None]:
        """Lock the run, then its steps, in one statement (issue 13); with the row of
        ``node_id`` as ``node_row`` reads it (None: no such node)."""
        rows = self._rows("lock_run_steps", {"run_id": run_id, "node_id": node_id})
        if not rows:
            return None, [], None
        first = rows[0]
        run = Run(**{k: v for k, v in first.items() if not k.startswith(("s_", "n_"))})
        steps = [
            Step(run_id=run.run_id, **{k[2:]: v for k, v in r.items() if k.startswith("s_")})
            for r in rows
            if r["s_seq"] is not None
        ]
        node = NodeState(**_split(first, "n_")) if first["n_node_id"] is not None else None
        return run, steps, node

    def run_leases(self, run_id: str) -> list[RunLease]:
        """The run's leases in node_id order, locked, with each node's drain policy."""
        return self._rows("run_leases", {"run_id": run_id}, row=RunLease)

    def node_leases(self, node_id: str) -> list[NodeLease]:
        return self._rows("node_leases", {"node_id": node_id}, row=NodeLease)

    def expired_lease_runs(self) -> list[str]:
        return [r["run_id"] for r in self._rows("expired_lease_runs")]

    def open_asks(self) -> list[Ask]:
        return self._rows("open_asks", row=Ask)

    def get_ask(self, ask_id: int) -> AskStatus | None:
        return self._one("get_ask", {"ask_id": ask_id}, row=AskStatus)  # type: ignore[no-any-return]

    def lock_ask(self, ask_id: int) -> AskStatus | None:
        return self._one("lock_ask", {"ask_id": ask_id}, row=AskStatus)  # type: ignore[no-any-return]

    def events_since(self, tx: int, after: int, limit: int = 500) -> list[tuple[int, Event]]:
        """Events after the place ``(tx, after)``, in (tx, id) order (issue 13 §6): each with the
        transaction id that orders it (not part of the event itself)."""
        rows = self._rows("events_since", {"tx": str(tx), "after": after, "limit": limit})
        return [(int(r.pop("place_tx")), Event(**r)) for r in rows]  # xid8 as a number

    def event_position(self, event_id: int | None) -> tuple[int, int]:
        """The (tx, id) place a stream starts from: after ``event_id``, or from now (None)."""
        row = self._one("event_position", {"id": event_id})
        return int(row["tx"]), int(row["id"])

    def last_event_id(self) -> int:
        return int(self._one("last_event_id")["id"])

    def node_principal(self, node_id: str) -> str | None:
        r = self._one("node_principal", {"node_id": node_id})
        return r["principal"] if r else None

    def run_counts(self) -> dict[str, int]:
        """QUEUED and RUNNING counts, lab-wide; cheap at any history size (issue 13)."""
        return {r["state"]: int(r["n"]) for r in self._rows("run_counts")}

    def run_totals(self) -> dict[str, int]:
        """Counts of every state (reads every run: /metrics only)."""
        return {r["state"]: int(r["n"]) for r in self._rows("run_totals")}

    def wait_histogram(self, bounds: Sequence[float]) -> list[tuple[float, int]]:
        rows = self._rows("wait_histogram", {"bounds": list(bounds)})
        return [(float(r["le"]), int(r["n"])) for r in rows]

    def wait_sum(self) -> tuple[int, float]:
        r = self._one("wait_sum")
        return int(r["n"]), float(r["total"])

    def ping(self) -> bool:
        return bool(self._one("ping")["ok"])

    def active_runs(self) -> list[str]:
        return [r["run_id"] for r in self._rows("active_runs")]

    def unsealed_count(self) -> int:
        return int(self._one("unsealed_count")["n"])

    def give_back(
        self,
        kind: str,
        seconds: float,
        advert_ttl_s: float,
        lease_ttl_s: float,
        *,
        began: datetime | None = None,
        ended: datetime | None = None,
        minimum: float = 0.0,
    ) -> float:
        """Give adverts and leases back a gap (a stall, a clock jump, an outage) once across every
        Mediator process on this database: less what gaps of its family recorded over an
        overlapping interval gave already (jumps; stalls and outages); returns the seconds given
        (docs/design.md §13, "time you can trust")."""
        self._exec("gap_lock", {"key": _GAPS_LOCK})
        params = {
            "kind": kind,
            "family": ["jump"] if kind == "jump" else ["stall", "outage"],
            "secs": seconds,
            "began": began,
            "ended": ended,
            "minimum": minimum,
            "advert_ttl": advert_ttl_s,
            "lease_ttl": lease_ttl_s,
        }
        row = self._one("give_back", params)
        return float(row["seconds"]) if row else 0.0

    def gap_fleet(self, grace_s: float) -> list[tuple[str, dict[str, Any], bool]]:
        """Nodes live when a gap that ended within ``grace_s`` began: (node_id, capabilities,
        expired now) — submit's last look before it refuses a run (docs/design.md §13)."""
        rows = self._rows("gap_fleet", {"grace": grace_s}, row=tuple)
        return [(r[0], r[1], bool(r[2])) for r in rows]

    # ---- lifecycle writes ----------------------------------------------------------------------
    def claim_step(
        self, run_id: str, seq: int, node_id: str, instance: str | None
    ) -> tuple[ResultSource, int] | None:
        """The guarded claim and its event in one statement; None when a condition failed.
        Else the run as the claim left it, in :meth:`result_source`'s shape (issue 13), and
        the length of its contract's text (what keeping it would weigh)."""
        params = {"run_id": run_id, "seq": seq, "node_id": node_id, "instance": instance}
        rows = self._rows("claim_step", params)
        size = int(rows[0].pop("size")) if rows else 0
        src = _result_source(run_id, rows)
        return (src, size) if src is not None else None

    def claim_refusal(self, run_id: str, seq: int, node_id: str) -> ClaimRefusal | None:
        params = {"run_id": run_id, "seq": seq, "node_id": node_id}
        return self._one("claim_refusal", params, row=ClaimRefusal)  # type: ignore[no-any-return]

    def result_source(self, run_id: str, node_id: str) -> ResultSource | None:
        """The run, its version, steps, the node's row and the run's leases, in one unlocked
        read (issue 13); None: no such run."""
        return _result_source(
            run_id, self._rows("result_source", {"run_id": run_id, "node_id": node_id})
        )

    def apply_result(
        self,
        src: ResultSource,
        node_id: str,
        decision: Decision,
        log: str = "",
    ) -> Applied:
        """Apply what ``mediator.core.progress`` decided from ``src`` in one statement (issue 13),
        only if the run is still as read: its version, the reporting node's instance and the
        at-boundary nodes among its leases. ``matched`` False: nothing was written; read again.
        """
        seq, step_to, ends = decision.step or (None, None, False)
        params: dict[str, Any] = {
            "run_id": src.run.run_id,
            "version": src.version,
            "node_id": node_id,
            "node_instance": src.node.instance if src.node is not None else "",
            "boundary": sorted(x.node_id for x in src.leases if x.drain == "at-boundary"),
            "run_to": str(decision.run_to) if decision.run_to is not None else None,
            "run_from": [str(decision.run_from)],
            "verdict": str(decision.verdict) if decision.verdict is not None else None,
            "seq": seq,
            "step_to": str(step_to) if step_to is not None else None,
            "step_from": [str(decision.step_from)],
            "step_ends": ends,
            "log": log,
            "skips": list(decision.skipped),
            **_step_edge(StepState.SKIPPED, "skip"),
            "asks": list(decision.asks),
            "ask_to": str(StepState.ASKED),
            "ask_from": [str(StepState.PENDING)],
            "release": sorted(decision.release),
            "release_reason": decision.release_reason,
            "close_asks": decision.close_asks,
            "head": Jsonb([_event(e) for e in decision.head]),
            "tail": Jsonb([_event(e) for e in decision.tail]),
        }
        rows = self._rows("apply_result", params)
        if not rows:
            return Applied(False)
        asks = tuple(
            Ask(ask_id=r["ask_id"], run_id=r["run_id"], seq=r["seq"], question=r["question"],
                raised_at=r["raised_at"])
            for r in rows
            if r["ask_id"] is not None
        )  # fmt: skip
        first = rows[0]
        seal = SealSource(**_split(first, "seal_")) if first["seal_state"] is not None else None
        return Applied(True, tuple(first["released"]), asks, seal)

    def promote(
        self,
        run_id: str,
        assigned: dict[str, str],
        chosen: dict[str, dict[str, Any]],
        leases: list[dict[str, str]],
        events: list[dict[str, Any]],
        ttl_s: float,
    ) -> list[Ask] | None:
        """QUEUED → RUNNING with leases, steps' nodes, asks and events in one statement
        (issue 13). Returns the asks raised, or None when the run was no longer QUEUED (R8).

        Raises:
            NodeTaken: a lease conflicts (R9, I1); nothing was written.
        """
        params = {
            "run_id": run_id,
            **_run_edge(RunState.RUNNING),
            "assigned": Jsonb(assigned),
            "chosen": Jsonb(chosen),
            "leases": Jsonb(sorted(leases, key=lambda x: x["node_id"])),
            "events": Jsonb([_event(e) for e in events]),
            "ttl": ttl_s,
            "ask_to": str(StepState.ASKED),
            "ask_from": [str(StepState.PENDING)],
        }
        params["run_from"] = [str(RunState.QUEUED)]  # R8: promotion is QUEUED → RUNNING only
        rows = self._leasing("promote", params)
        if not rows:
            return None
        return [
            Ask(ask_id=r["ask_id"], run_id=r["run_id"], seq=r["seq"], question=r["question"],
                raised_at=r["raised_at"])
            for r in rows
            if r["ask_id"] is not None
        ]  # fmt: skip

    def finish_step(self, run_id: str, seq: int, state: str, log: str = "") -> None:
        self._exec("finish_step", {"run_id": run_id, "seq": seq, "log": log, **_step_edge(state)})

    def skip_steps(self, run_id: str, seqs: Sequence[int]) -> None:
        if seqs:
            self._exec("skip_steps", {"run_id": run_id, "seqs": list(seqs)})

    def delete_leases(self, run_id: str, nodes: Sequence[str]) -> list[str]:
        if not nodes:
            return []
        rows = self._rows("delete_leases", {"run_id": run_id, "nodes": sorted(nodes)})
        return sorted(r["node_id"] for r in rows)

    def delete_expired_leases(self, run_id: str) -> list[str]:
        return sorted(r["node_id"] for r in self._rows("delete_expired_leases", {"run_id": run_id}))

    def end_run(self, run_id: str, state: str, verdict: str) -> bool:
        params = {"run_id": run_id, "verdict": verdict, **_run_edge(state)}
        return self._exec("end_run", params) == 1

    def close_asks(self, run_id: str) -> None:
        self._exec("close_asks", {"run_id": run_id})

    def rebind_lease(self, node_id: str, run_id: str, instance: str, ttl_s: float) -> None:
        params = {"node_id": node_id, "run_id": run_id, "instance": instance, "ttl": ttl_s}
        self._exec("rebind_lease", params)
        self._exec("rebind_chosen", params)

    def answer_ask(self, ask_id: int, answer: str, ok: bool, by: str) -> bool:
        params = {"ask_id": ask_id, "answer": answer, "ok": ok, "by": by}
        return self._exec("answer_ask", params) == 1

    # ---- writes ------------------------------------------------------------------------------
    def upsert_advert(
        self,
        node_id: str,
        label: str,
        principal: str,
        capabilities: dict[str, Any],
        instance: str,
        drain: str,
        ttl_s: float,
        lease_ttl_s: float | None = None,
    ) -> AdvertResult | None:
        """The advert upsert; with ``lease_ttl_s``, this instance's leases are renewed in the same
        statement (issue 13: a heartbeat is one statement). None: another principal's node."""
        params = {
            "node_id": node_id,
            "label": label,
            "principal": principal,
            "capabilities": Jsonb(capabilities),
            "instance": instance,
            "drain": drain,
            "ttl": ttl_s,
            "lease_ttl": lease_ttl_s,
        }
        return self._one("upsert_advert", params, row=AdvertResult)  # type: ignore[no-any-return]

    def create_run(
        self,
        *,
        run: dict[str, Any],
        needs: dict[str, Any],
        steps: list[dict[str, Any]],
        leases: list[dict[str, str]],
        events: list[dict[str, Any]],
        ttl_s: float,
    ) -> Run | None:
        """Everything a submit writes, in one statement (issue 13): ``run`` holds insert_run's
        fields; ``events`` their node_id, kind and data (the run_id is the run's). Returns the
        run with its steps as committed, or None when the run_id exists already (R3).

        Raises:
            NodeTaken: a lease conflicts (R2); nothing was written.
        """
        states = {str(s["state"]) for s in steps}
        if len(states) != 1:
            raise ValueError("a run is created with every step in one state")
        state = run["state"]
        params = {
            **{k: v for k, v in run.items() if k != "state"},
            "run_to": str(state),
            "step_to": states.pop(),
            "started": state == RunState.RUNNING,
            "ended": state in (RunState.PASSED, RunState.FAILED),
            "contract": Jsonb(run["contract"]),
            "assigned": Jsonb(run["assigned"]) if run["assigned"] is not None else None,
            "reject": Jsonb(run["reject"]) if run["reject"] is not None else None,
            "needs": Jsonb(needs),
            "steps": Jsonb([{k: v for k, v in s.items() if k != "state"} for s in steps]),
            "leases": Jsonb(leases),
            "events": Jsonb([_event(e) for e in events]),
            "ttl": ttl_s,
        }
        rows = self._leasing("create_run", params)
        if not rows:
            return None
        head = {k: v for k, v in rows[0].items() if not k.startswith("s_")}
        steps_out = tuple(
            Step(run_id=head["run_id"], **{k[2:]: v for k, v in r.items() if k.startswith("s_")})
            for r in rows
            if r["s_seq"] is not None
        )
        return Run(**head, steps=steps_out)

    def raise_asks(self, run_id: str) -> list[Ask]:
        return self._rows("raise_asks", {"run_id": run_id}, row=Ask)

    def insert_events(self, events: list[dict[str, Any]]) -> None:
        if events:
            rows = [
                {
                    "run_id": e.get("run_id", ""),
                    "node_id": e.get("node_id", ""),
                    "kind": e["kind"],
                    "data": e.get("data", {}),
                }
                for e in events
            ]
            self._exec("insert_events", {"events": Jsonb(rows)})


class Store:
    """A connection pool with transactions that carry the Mediator's clock.

    Args:
        dsn: libpq connection string or URL.
        clock: when given, every transaction sets ``mediator.now`` to ``clock()`` first.
        max_size: pool size; the simulator needs one connection, the HTTP API one per worker.
        lock_timeout_ms: a short lock wait turns a stuck lease insert into NodeTaken (§7).
        on_backend: called with the server process id of every new connection made over a unix
            socket (so the process is on this machine); the simulator pins it to its own CPU
            (sim/affinity.py). A failure in it is logged and the connection used all the same.
    """

    def __init__(
        self,
        dsn: str,
        clock: Clock | None = None,
        *,
        max_size: int = 8,
        lock_timeout_ms: int = 2000,
        on_backend: Callable[[int], None] | None = None,
    ) -> None:
        self.dsn = dsn
        self._on_backend = on_backend
        self.clock = clock
        self._conn_now: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._lock_timeout_ms = lock_timeout_ms
        self._max_size = max_size
        # Outage tracking (wake 5; "outages don't count against nodes", docs/design.md): the
        # monotonic instant of the last statement that reached the database, the instant the
        # database was last reachable before the current outage (None: no outage), and what to
        # call once it answers again — with the outage's length in seconds.
        self._last_ok = time.monotonic()
        self._down_since: float | None = None
        self._state = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._probing = False
        self._closing = threading.Event()
        self.on_reconnect: list[Callable[[float], None]] = []
        try:
            self.pool = self._new_pool()
            self.pool.wait(timeout=10)
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreUnavailable(
                "Could not connect to the Mediator's database; check the database URL."
            ) from exc
        self._ensure_schema()

    def _new_pool(self) -> ConnectionPool[_Connection]:
        return ConnectionPool(
            self.dsn,
            min_size=1,
            max_size=self._max_size,
            # A bounded connect (libpq's minimum): an unreachable host fails in seconds.
            kwargs={"autocommit": True, "prepare_threshold": 0, "connect_timeout": 2},
            connection_class=_Connection,
            configure=self._configure,
            open=True,
            # How long a request waits for a connection before it is answered 503: long
            # enough to ride out a burst, short enough that a database outage is reported
            # promptly (docs/performance.md). During a known outage requests wait 1 s at most.
            timeout=5,
            reconnect_timeout=3600,
            name="mediator",
        )

    # ---- outages and reconnects (wake 5, issue 11 §8) ----------------------------------------
    @property
    def down(self) -> bool:
        """True from a failed statement until the watcher reaches the database again."""
        return self._down_since is not None

    def _ok(self) -> None:
        self._last_ok = time.monotonic()

    def _failed(self) -> None:
        """A statement could not reach the database: the outage began when the database was
        last reached (so heartbeats that failed before anyone noticed count as outage too);
        start the watcher that reconnects."""
        with self._state:
            if self._down_since is None:
                self._down_since = self._last_ok
                log.warning("the database is unreachable; reconnecting")
            self._start_watcher()

    def watch(self) -> None:
        """Run the reconnect callbacks as soon as the database answers, even if nothing saw it
        go away: a sweep that failed for a database error asks for this (wake 5)."""
        with self._state:
            if self._down_since is None:
                self._down_since = time.monotonic()
            self._start_watcher()

    def _start_watcher(self) -> None:
        # Under self._state. The watcher clears self._watcher under the same lock when it
        # exits, so an outage noticed while it is finishing is never left without one.
        if self._closing.is_set() or self._watcher is not None:
            return
        self._watcher = threading.Thread(target=self._watch, name="mediator-reconnect", daemon=True)
        self._watcher.start()

    def _reachable(self) -> bool:
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def _watch(self) -> None:
        """Poll the database with direct connections (every 0.1 s; a refused connection costs
        microseconds) until it answers; then replace the pool, whose own reconnect backoff grows
        to tens of seconds during a long outage, so service resumes at once; then tell the
        Mediator how long the outage was. If a callback finds the database gone again, poll
        again."""
        while True:
            while not self._closing.is_set() and not self._reachable():
                self._closing.wait(0.1)
            if self._closing.is_set():
                with self._state:
                    self._watcher = None
                return
            old, self.pool = self.pool, self._new_pool()
            threading.Thread(target=old.close, kwargs={"timeout": 5}, daemon=True).start()
            with self._state:
                since, self._down_since = self._down_since, None
            self._ok()
            outage = max(0.0, time.monotonic() - since) if since is not None else 0.0
            log.warning("the database answers again (outage of %.1f s)", outage)
            for callback in list(self.on_reconnect):
                try:
                    callback(outage)
                except Exception:
                    log.exception("reconnect callback failed")
            with self._state:
                if self._down_since is None:
                    self._watcher = None
                    return

    def reconnecting(self) -> bool:
        """True while the watcher is at work (polling, or running the reconnect callbacks)."""
        return self._watcher is not None

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        set_json_loads(_json_loads, conn)
        set_json_dumps(_json_dumps, conn)
        conn.execute(f"SET lock_timeout = {int(self._lock_timeout_ms)}")
        # Timestamps leave the database as UTC whatever the server's zone (records, /v1/events).
        conn.execute("SET TIME ZONE 'UTC'")
        # A unix socket's host is its directory: the server process is on this machine, so its
        # pid means something here (a TCP peer's pid would name an unrelated local process).
        if self._on_backend is not None and (conn.info.host or "").startswith("/"):
            try:
                self._on_backend(conn.info.backend_pid)
            except Exception:
                log.warning("the new connection's on_backend hook failed", exc_info=True)

    def _ensure_schema(self) -> None:
        with self.pool.connection() as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (_SCHEMA_LOCK,))
            try:
                exists = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
                if not (exists and exists[0]):
                    with conn.transaction():
                        conn.execute(schema_sql().encode(), prepare=False)
                row = conn.execute(QUERIES["schema_version"]).fetchone()
                version = row[0] if row else None
                if version != SCHEMA_VERSION:
                    raise MediatorError(
                        f"The database holds schema version {version}, this Mediator needs "
                        f"{SCHEMA_VERSION}; use a fresh database (no migrations before 1.0)."
                    )
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (_SCHEMA_LOCK,))

    def _instant(self) -> datetime | None:
        """The clock's instant for a Tx's statements (issue 13: a parameter, not a statement)."""
        return self.clock() if self.clock is not None else None

    def _set_clock(self, conn: psycopg.Connection[Any]) -> None:
        """Give the connection the clock's instant before it is used (docs/design.md §13).

        The setting is session-level and re-sent only when the instant changed since this
        connection last saw it: a simulated event runs several transactions at one virtual
        instant, and each would otherwise pay a round trip for the same value. A connection is
        used by one caller at a time, so its setting is the instant of the work it does now.
        """
        if self.clock is None:
            return
        now = self.clock().isoformat()
        if self._conn_now.get(conn) != now:
            conn.execute("SELECT set_config('mediator.now', %s, false)", (now,), prepare=True)
            self._conn_now[conn] = now

    def _timeout(self) -> float | None:
        return 1.0 if self._down_since is not None else None  # None: the pool's own (5 s)

    @contextmanager
    def _connection(self, timeout: float | None = None) -> Iterator[_Connection]:
        """``pool.connection()``, but a pool the reconnect watcher has just replaced is not an
        error: nothing was sent yet, so take the connection from the new one."""
        pool = self.pool
        try:
            conn = pool.getconn(timeout)
        except PoolClosed:
            pool = self.pool
            conn = pool.getconn(timeout)
        try:
            with conn:
                yield conn
        finally:
            pool.putconn(conn)

    def _error(self, exc: psycopg.Error | PoolTimeout) -> MediatorError:
        err = _map_error(exc)
        if isinstance(exc, PoolTimeout):
            # No connection within the wait: a saturated pool, or an outage the pool noticed
            # first. Only an outage starts the watcher; one probe at a time decides which.
            with self._state:
                if self._probing or self._down_since is not None:
                    return err
                self._probing = True
            threading.Thread(target=self._probe, name="mediator-probe", daemon=True).start()
        elif isinstance(err, StoreUnavailable):
            self._failed()
        return err

    def _probe(self) -> None:
        try:
            if not self._closing.is_set() and not self._reachable():
                self._failed()
        finally:
            self._probing = False

    @contextmanager
    def tx(self) -> Iterator[Tx]:
        """A transaction; on any exception it rolls back and the error is re-raised as ours."""
        try:
            with self._connection(self._timeout()) as conn, conn.transaction():
                yield Tx(conn, self._instant())
            self._ok()
        except MediatorError:
            raise
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._error(exc) from exc

    @contextmanager
    def autocommit(self) -> Iterator[Tx]:
        """Statements without a transaction block: each is its own transaction and snapshot, and
        BEGIN and COMMIT cost nothing. For reads whose statements need not share a snapshot
        (the order of statements is the guarantee, as with observed_at first), and for single
        statements that are atomic on their own."""
        try:
            with self._connection(self._timeout()) as conn:
                yield Tx(conn, self._instant())
            self._ok()
        except MediatorError:
            raise
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._error(exc) from exc

    def ping(self) -> bool:
        """``/healthz``: answers within about a second whether the database is reachable. While
        an outage is known the watcher is the one trying; the answer is then immediate."""
        if self._down_since is not None:
            raise StoreUnavailable("The database is unavailable; try again shortly.")
        try:
            with self._connection(1.0) as conn:
                ok = conn.execute("SELECT 1").fetchone()
            self._ok()
            return bool(ok)
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._error(exc) from exc

    def notifications(self, channel: str, timeout: float) -> Iterator[None]:
        """Yield once per NOTIFY on ``channel`` until ``timeout`` seconds pass without one.

        A dedicated connection (LISTEN holds it); the caller loops to keep listening. Raises
        StoreUnavailable if the connection breaks, so the caller can reconnect.
        """
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(f"LISTEN {channel}")
                for _ in conn.notifies(timeout=timeout):
                    yield None
        except psycopg.Error as exc:
            raise _map_error(exc) from exc

    def read_only(
        self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Run one query in a READ ONLY transaction: analytics (the simulator, notebooks) read
        the database this way and can never write it (docs/architecture.md)."""
        try:
            with self.pool.connection() as conn:
                self._set_clock(conn)
                with conn.transaction():
                    conn.execute("SET TRANSACTION READ ONLY")
                    cur = conn.cursor(row_factory=dict_row)
                    cur.execute(sql.encode() if params is None else sql, params, prepare=False)
                    rows: list[dict[str, Any]] = cur.fetchall() if cur.description else []
                    cur.close()
                    return rows
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            raise MediatorError("Analytics queries are read-only.") from exc
        except psycopg.Error as exc:
            raise self._error(exc) from exc

    def close(self) -> None:
        self._closing.set()
        w = self._watcher
        if w is not None and w is not threading.current_thread():
            w.join(timeout=10)
        self.pool.close()


def load_schema(dsn: str) -> None:
    """Load schema.sql into an empty database (used to build the tests' template database)."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(schema_sql().encode())


def admin_execute(dsn: str, sql: str) -> None:
    """Run one administrative statement outside a transaction (CREATE/DROP DATABASE)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.encode())
