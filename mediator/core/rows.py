"""Rows as the rest of the code sees them: frozen dataclasses, filled by the store.

The store builds them from its result rows (as psycopg's ``class_row`` would, with each
statement's column names read once); flows, the HTTP API and the simulator pass them around
instead of dicts, so a misspelt field is an AttributeError, not a silent ``None``.
``to_dict`` gives the JSON shape of docs/design.md §19 (timestamps as ISO 8601).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return value.to_dict() if hasattr(value, "to_dict") else dataclasses.asdict(value)
    return value


#: The events vocabulary (docs/design.md §13, schema.sql's CHECK): every kind some flow emits, and
#: nothing else. A queued submit is ``submitted`` with ``data.state = "QUEUED"``, a promotion
#: ``promoted``; there is no separate ``queued`` kind (issue 12 §7).
EVENT_KINDS = (
    "submitted",
    "rejected",
    "promoted",
    "lease_granted",
    "lease_released",
    "claimed",
    "result",
    "ask_raised",
    "ask_answered",
    "settled",
    "cancelled",
)

#: The fleet's history vocabulary (docs/design.md §12, schema.sql's CHECK on fleet_history.kind):
#: what the advert upsert and the reaper record about a node, one row per change.
FLEET_HISTORY_KINDS = (
    "appeared",
    "restarted",
    "drain_set",
    "drain_lifted",
    "capabilities_changed",
    "returned",
    "expired",
)


class _Row:
    def to_dict(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


@dataclass(frozen=True)
class Step(_Row):
    """One step of a run (docs/design.md §19)."""

    seq: int
    name: str
    kind: str
    role: str
    uses: str
    with_: dict[str, Any]
    after: list[str]
    ask: str
    state: str
    node_id: str
    instance: str
    attempt: int
    chosen: dict[str, Any] | None
    started_at: datetime | None
    ended_at: datetime | None
    run_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["with"] = d.pop("with_")
        return d


@dataclass(frozen=True)
class Run(_Row):
    """A run and its steps (design.md §19). ``queue_position``/``wait_reason`` only while QUEUED."""

    run_id: str
    work_id: str
    state: str
    verdict: str | None
    assigned: dict[str, str] | None
    reject: dict[str, Any] | None
    submitter: str
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    sealed: bool
    steps: tuple[Step, ...] = ()
    queue_position: int | None = None
    wait_reason: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        # Absent, not null, when they do not apply (docs/design.md §7: a 202 body has neither
        # assigned nor reject; queue_position and wait_reason exist only while QUEUED).
        d = super().to_dict()
        for key in ("assigned", "reject", "queue_position", "wait_reason"):
            if d[key] is None:
                d.pop(key)
        d.pop("sealed")
        return d


@dataclass(frozen=True)
class RunSummary(_Row):
    """A row of ``GET /v1/runs`` (seed 003 §4): ``current`` lists the run's CLAIMED steps."""

    run_id: str
    state: str
    verdict: str | None
    work_id: str
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    assigned: dict[str, str] | None
    reject: dict[str, Any] | None
    current: list[dict[str, Any]] = field(default_factory=list)
    # While QUEUED only, computed for the whole page at once (issue 15 §4); absent otherwise.
    queue_position: int | None = None
    wait_reason: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        for key in ("queue_position", "wait_reason"):
            if d[key] is None:
                d.pop(key)
        return d


@dataclass(frozen=True)
class Lease(_Row):
    run_id: str
    not_after: datetime


@dataclass(frozen=True)
class Node(_Row):
    """A live node as ``GET /v1/nodes`` shows it (seed 003 §3). Never principal or nonce."""

    node_id: str
    label: str
    instance: str
    capabilities: dict[str, Any]
    seen_at: datetime
    expires_at: datetime
    drain: str
    actions: list[str] | None  # what its daemon offers (docs/design.md §4); None: not said
    lease: Lease | None


@dataclass(frozen=True)
class Fleet(_Row):
    """A ``list_nodes`` answer with the instant it was observed at (seed 003 §3.2)."""

    observed_at: datetime
    nodes: tuple[Node, ...]
    # Paging (docs/design.md §19): the ``after`` of the next page, None on the last one.
    next: str | None = None


@dataclass(frozen=True)
class RunList(_Row):
    observed_at: datetime
    runs: tuple[RunSummary, ...]
    # Lab-wide ``{queued, running}``, not filtered like ``runs`` (issue 15 §5).
    counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetNode:
    """A live node as the matcher's caller reads it: LiveAdverts + BusyNodes + DrainingNodes."""

    node_id: str
    capabilities: dict[str, Any]
    instance: str
    drain: str
    busy: bool
    # The actions its daemon offers (docs/design.md §4 "Actions"); None: not said, any.
    actions: frozenset[str] | None = None


@dataclass(frozen=True)
class QueuedRun:
    """A row of ListQueued: the needs_key, not the contract (loaded lazily, P2)."""

    run_id: str
    needs_key: str
    created_at: datetime


@dataclass(frozen=True)
class AdvertResult:
    """What UpsertAdvert returns: the previous values from the row as locked (docs/design.md §8)."""

    prev_drain: str
    prev_instance: str
    prev_live: bool
    inserted: bool
    expires_at: datetime
    caps_changed: bool = False  # wake 9: the advert's capabilities differ from the stored ones


@dataclass(frozen=True)
class ClaimRefusal:
    """Why a guarded claim matched nothing (issue 13): read only on that path."""

    run_state: str
    step_seq: int | None
    step_node: str | None
    step_state: str | None
    step_kind: str | None
    node_instance: str
    node_drain: str
    after_passed: bool | None


@dataclass(frozen=True)
class Ask(_Row):
    ask_id: int
    run_id: str
    seq: int
    question: str
    raised_at: datetime


# ---- rows the store reads for the flows (issue 13: frozen rows for every read, no dicts) ----


@dataclass(frozen=True)
class LiveAdvert:
    """A live node's advert, as LiveAdverts reads it (seed 003 §2)."""

    node_id: str
    capabilities: dict[str, Any]
    instance: str
    drain: str


@dataclass(frozen=True)
class QueuedDetail:
    """A QUEUED run of a ``GET /v1/runs`` page: its queue position and needs (issue 15 §4)."""

    run_id: str
    position: int
    needs: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class SealSource:
    """Everything a record's seal is generated from (docs/design.md §12): read by seal_source,
    or returned by the result that settled the run (issue 13)."""

    state: str
    verdict: str | None
    ended_at: datetime | None
    contract: dict[str, Any]
    events: list[dict[str, Any]]
    logs: list[list[Any]]


@dataclass(frozen=True)
class NodeState:
    """The row of the node a result or claim comes from: its current daemon instance, its drain
    policy and whether its advert is live."""

    node_id: str
    instance: str
    drain: str
    live: bool


@dataclass(frozen=True)
class RunLease:
    """A lease of a run, with the leased node's drain policy (the at-boundary check needs it)."""

    node_id: str
    instance: str
    drain: str


@dataclass(frozen=True)
class NodeLease:
    """A lease a node holds: which run, under which daemon instance it was granted."""

    run_id: str
    instance: str


@dataclass(frozen=True)
class AskStatus:
    """An ask as ``answer`` checks it: whose step it is and whether it is closed."""

    ask_id: int
    run_id: str
    seq: int
    closed: bool


@dataclass(frozen=True)
class Event(_Row):
    """A row of the events table (docs/design.md §13): ``/v1/events`` streams them."""

    id: int
    at: datetime
    run_id: str
    node_id: str
    kind: str
    data: dict[str, Any]


@dataclass(frozen=True)
class ResultSource:
    """What a result decides from, read in one statement without locks (issue 13): the run, its
    version (the guard of the write that follows), its steps, the reporting node's row (None: no
    such node) and the run's leases."""

    run: Run
    version: int
    steps: tuple[Step, ...]
    node: NodeState | None
    leases: tuple[RunLease, ...]


@dataclass(frozen=True)
class Applied:
    """What ``apply_result`` did. ``matched`` False: the run changed since it was read (its
    version moved) and nothing was written — read again and decide again. ``seal``: the
    record's source when the result settled the run."""

    matched: bool
    released: tuple[str, ...] = ()
    asks: tuple[Ask, ...] = ()
    seal: SealSource | None = None
