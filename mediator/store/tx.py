"""The query side of the store: :class:`Tx`, one method per named query of ``queries.sql``.

Each method says what it asks or writes in the flows' words and builds the statement's parameters
(jsonb values, the state edges each write is guarded by); :class:`~mediator.store.connector.
Statements` runs it. Rows come back as the frozen dataclasses of ``mediator.core.rows``. No driver
type is imported here: psycopg is the connector's (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

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
from mediator.core.states import RunState, StepState, run_sources, step_sources
from mediator.store.connector import Jsonb, Statements, json_loads

_GAPS_LOCK = 0x6D656467  # advisory lock id: one give-back of a gap at a time (Tx.give_back)


def _event(e: dict[str, Any]) -> dict[str, Any]:
    return {"node_id": e.get("node_id", ""), "kind": e["kind"], "data": e.get("data", {})}


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


class SubmitRead(NamedTuple):
    """A submit's one read: whether its ``run_id`` exists (R3), and the live nodes that may serve
    some role of it."""

    exists: bool
    fleet: list[FleetNode]
    queued: int = 0  # the submitter's QUEUED runs (docs/security.md "Fair under floods")
    classes: int = 0  # … their distinct needs classes
    has_class: bool = False  # … whether this contract's class is one of them


class SweepHead(NamedTuple):
    """A sweep's first read (``sweep_head``, one statement): the needs classes waiting, the live
    fleet, and the queue's head in (created_at, run_id) order.

    ``classes``: (needs_key, needs) — every class waiting when ``full``; else only the classes
    whose waiting may have changed since ``since``, needs None for one that no longer waits
    (docs/design.md §6 "Sweeps remember"). ``mark``: what the next read passes as ``since``.
    ``queued``: whether any run is QUEUED (False: everything else is empty). ``blocked``: the
    read was R17's guard's, and at most 64 classes wait, each with a role that no live, free,
    undrained node might meet (docs/design.md R17): nothing but the mark was read then."""

    classes: list[tuple[str, dict[str, Any] | None]]
    fleet: list[FleetNode]
    head: list[QueuedRun]
    since: int | None = None
    mark: int | None = None
    full: bool = True
    queued: bool = False
    blocked: bool = False


# A class's needs as text → as decoded: a read of every waiting class (a process's first, or one
# after a long quiet: docs/design.md §6 "Sweeps remember") decodes a flood's thousands of classes
# again otherwise. Keyed by the text itself, so an entry is never wrong; emptied when it grows
# past its bound. Read-only use.
_DECODED: dict[str, dict[str, Any]] = {}
_DECODED_MAX = 100_000


def _needs(text: str) -> dict[str, Any]:
    found = _DECODED.get(text)
    if found is None:
        if len(_DECODED) >= _DECODED_MAX:
            _DECODED.clear()
        found = _DECODED[text] = json_loads(text)
    return found


def _sweep_head(rows: list[dict[str, Any]], since: int | None) -> SweepHead:
    """``sweep_head``'s rows (told apart by ``part``) as classes, fleet and queue head."""
    classes: list[tuple[str, dict[str, Any] | None]] = []
    fleet, head = [], []
    mark, full, queued, blocked = None, True, False, False
    for r in rows:
        part = r["part"]
        if part == "class":
            text = r["needs"]
            classes.append((r["needs_key"], _needs(text) if text is not None else None))
        elif part == "node":
            fleet.append(FleetNode(r["node_id"], r["capabilities"], r["instance"],
                                   r["drain"], r["busy"]))  # fmt: skip
        elif part == "queued":
            head.append(QueuedRun(r["run_id"], r["needs_key"], r["created_at"]))
        else:
            mark, full, queued = int(r["mark"]), bool(r["whole"]), bool(r["queued"])
            blocked = bool(r["blocked"])
    fleet.sort(key=lambda n: n.node_id)
    head.sort(key=lambda q: (q.created_at, q.run_id))
    return SweepHead(classes, fleet, head, since, mark, full, queued, blocked)


def _actions(value: Any) -> frozenset[str] | None:
    """A node's ``actions`` column as a set; None (not advertised) stays None."""
    return None if value is None else frozenset(value)


class Tx(Statements):
    """One open transaction. Methods are the store floor of seed 003 plus what the flows need."""

    # ---- reads -------------------------------------------------------------------------------
    def observed_at(self) -> datetime:
        return self._one("observed_at")["observed_at"]  # type: ignore[no-any-return]

    def fleet_for(self, roles: dict[str, dict[str, Any]]) -> list[FleetNode]:
        """Live nodes that may serve some role of ``roles`` (a superset of the candidates)."""
        return self.submit_read(roles, None).fleet

    def submit_read(
        self,
        roles: dict[str, dict[str, Any]],
        run_id: str | None,
        submitter: str | None = None,
        key: str = "",
    ) -> SubmitRead:
        """A submit's one read (issue 13): whether ``run_id`` exists (R3) and :meth:`fleet_for`;
        with ``submitter``, that principal's queued runs and classes (``key``'s among them)."""
        params = {"roles": Jsonb(roles), "run_id": run_id, "submitter": submitter, "key": key}
        rows = self._rows("fleet_for", params, row=tuple)
        fleet = [FleetNode(r[1], r[2], r[3], r[4], r[5], _actions(r[9])) for r in rows if r[1]]
        first = rows[0] if rows else (False, None, None, None, None, None, 0, 0, False, None)
        return SubmitRead(bool(first[0]), fleet, int(first[6] or 0), int(first[7] or 0),
                          bool(first[8]))  # fmt: skip

    def live_adverts(self) -> list[LiveAdvert]:
        return self._rows("live_adverts", row=LiveAdvert)

    def busy_nodes(self) -> set[str]:
        return {r["node_id"] for r in self._rows("busy_nodes")}

    def draining_nodes(self) -> set[str]:
        return {r["node_id"] for r in self._rows("draining_nodes")}

    def unavailable_nodes(self) -> set[str]:
        return {r["node_id"] for r in self._rows("unavailable_nodes")}

    def list_nodes(self, after: str = "", limit: int | None = None) -> list[Node]:
        """Live nodes in node_id order past ``after``, at most ``limit`` (None: all)."""
        out = []
        for r in self._rows("list_nodes", {"after": after, "limit": limit}):
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

    def sweep_head(
        self,
        limit: int,
        sealed: str | None = None,
        since: int | None = None,
        guard: bool = False,
    ) -> SweepHead:
        """The waiting needs classes (every one, or with ``since`` — the ``mark`` of an earlier
        read — those whose waiting may have changed since), the live fleet (node_id order) and
        the first ``limit`` queued runs in FIFO order, in one statement (issue 13); nothing but
        the mark when nothing is queued. With ``sealed``, the same statement first marks that
        run's record sealed (what :meth:`mark_sealed` does, for a seal whose wake follows).
        With ``guard`` (R17's guard), only the mark comes when no waiting class could be
        assigned the nodes free in this snapshot (``SweepHead.blocked``)."""
        params = {
            "limit": limit,
            "sealed": sealed,
            "since": None if since is None else str(since),
            "guard": guard,
        }
        return _sweep_head(self._rows("sweep_head", params), since)

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

    def nodes_with_work(self, node_ids: list[str]) -> set[str]:
        """The nodes among ``node_ids`` with a claimable step (what :meth:`work` finds)."""
        return {r["node_id"] for r in self._rows("nodes_with_work", {"node_ids": node_ids})}

    def lock_steps(self, run_id: str) -> list[Step]:
        return self._rows("lock_steps", {"run_id": run_id}, row=Step)

    def lock_run_steps(self, run_id: str) -> tuple[Run | None, list[Step]]:
        """Lock the run, then its steps, in one statement (issue 13); no run: ``(None, [])``."""
        rows = self._rows("lock_run_steps", {"run_id": run_id})
        if not rows:
            return None, []
        first = rows[0]
        run = Run(**{k: v for k, v in first.items() if not k.startswith("s_")})
        steps = [
            Step(run_id=run.run_id, **{k[2:]: v for k, v in r.items() if k.startswith("s_")})
            for r in rows
            if r["s_seq"] is not None
        ]
        return run, steps

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

    def gap_fleet(
        self, grace_s: float, open_s: float | None = None
    ) -> list[tuple[str, dict[str, Any], bool]]:
        """Nodes live when a gap that ended within ``grace_s`` began: (node_id, capabilities,
        expired now) — submit's last look before it refuses a run (docs/design.md §13).
        ``open_s``: an ended outage not given back yet began that long ago; it counts too."""
        rows = self._rows("gap_fleet", {"grace": grace_s, "open_s": open_s}, row=tuple)
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
        move = decision.step
        params: dict[str, Any] = {
            "run_id": src.run.run_id,
            "version": src.version,
            "node_id": node_id,
            "node_instance": src.node.instance if src.node is not None else "",
            "boundary": sorted(x.node_id for x in src.leases if x.drain == "at-boundary"),
            "run_to": str(decision.run_to) if decision.run_to is not None else None,
            "run_from": [str(decision.run_from)],
            "verdict": str(decision.verdict) if decision.verdict is not None else None,
            "seq": move.seq if move is not None else None,
            "step_to": str(move.state) if move is not None else None,
            "step_from": [str(decision.step_from)],
            "step_ends": move is not None and move.ends,
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
        actions: list[str] | None = None,
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
            "actions": None if actions is None else Jsonb(actions),
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
