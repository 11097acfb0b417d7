"""What the HTTP API reads and answers, as models the OpenAPI document is derived from.

Request bodies are validated by their models (a wrong type is a 400 naming the field). The rules
the flows enforce with their own messages (ids, lengths, drain policies, outcomes: docs/security.md)
are declared on the fields for the document only (``json_schema_extra``), so a generated client
knows them without the server answering them twice. Response models document the shapes of
``mediator/core/rows.py``'s ``to_dict``; routes return those dicts as they are (no response
validation on the hot path), and ``tests/e2e/test_openapi.py`` holds the two to each other.
Objects are open (a field added later is not a broken promise); a key a response may leave out
is declared with :func:`absent`, never as null.

:func:`answers` builds a route's ``responses=``: its success bodies and the error statuses it can
give, each with the one error shape of docs/design.md and the reason below.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Header, Query
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field, JsonValue, WithJsonSchema
from pydantic.config import JsonDict

from mediator.core.limits import MAX_ACTIONS, MAX_KEY

MAX_INT = 2**31 - 1  # seq, attempt, ask_id are PostgreSQL integers: larger is a 400, not a 500
MAX_EVENT_ID = 2**63 - 1  # events.id is a bigint
# The id rule of mediator/core/limits.py (valid_run_id), without a leading dot (docs/security.md:
# ".", ".." and hidden names are refused); the same for node ids.
ID_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$"
ID_RULE: JsonDict = {"pattern": ID_PATTERN, "maxLength": 64}
DRAIN_POLICIES: list[JsonValue] = ["", "graceful", "at-boundary"]
OUTCOMES: list[JsonValue] = ["pass", "fail", "retry"]


def _drop_default(schema: JsonDict) -> None:
    schema.pop("default", None)


def absent(**rules: Any) -> Any:
    """A key a response may leave out (never null): not required, no default in the document."""
    return Field(None, json_schema_extra=_drop_default, **rules)


# ---- path, query and header parameters --------------------------------------------------------
# FastAPI resolves annotations by name at import time: these aliases live at module level.
Auth = Annotated[str | None, Header(alias="Authorization")]
# A run id is checked by the flows (400 naming run_id, 404 when unknown); the rule is stated here.
RunId = Annotated[str, PathParam(json_schema_extra=ID_RULE)]
NodeId = Annotated[str, PathParam(pattern=ID_PATTERN, max_length=64)]
Seq = Annotated[int, PathParam(ge=0, le=MAX_INT)]
AskId = Annotated[int, PathParam(ge=1, le=MAX_INT)]
RecordFile = Annotated[str, PathParam(min_length=1, max_length=1024)]
# issue 15 §1: `state=` (empty) means every state, as a form leaves it.
RunStateFilter = Annotated[
    Literal["", "QUEUED", "RUNNING", "PASSED", "FAILED"],
    Query(description="Only runs in this state; empty or absent: every state."),
]
# Absent is not a value a client sends: the document gives each optional parameter its own type
# (WithJsonSchema), not "or null".
_WORK_ID = "Only runs of this work_id."
_SINCE = "Only runs created after this instant (RFC 3339, with its offset)."
_AFTER = "Replay the events after this id (as Last-Event-ID does)."
_LAST_EVENT_ID = "The last event id the client saw; empty counts as absent (SSE)."
WorkIdFilter = Annotated[
    str | None,
    Query(max_length=200, description=_WORK_ID),
    WithJsonSchema({"type": "string", "maxLength": 200, "description": _WORK_ID}),
]
SinceFilter = Annotated[
    str | None,
    Query(description=_SINCE),
    WithJsonSchema({"type": "string", "format": "date-time", "description": _SINCE}),
]
AfterEvent = Annotated[
    int | None,
    Query(ge=0, le=MAX_EVENT_ID, description=_AFTER),
    WithJsonSchema(
        {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID, "description": _AFTER}
    ),
]
EventLimit = Annotated[
    int | None,
    Query(ge=1, le=1_000_000),
    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 1_000_000}),
]
_WAIT = (
    "Hold the answer up to this many seconds while the node has no claimable step, answering as "
    "soon as it may have one (a long poll). Capped by the server; the X-Mediator-Wait header of "
    "the answer says how long it would hold (0: it answered at once, e.g. over its cap of held "
    "polls). Absent: answer at once."
)
WorkWait = Annotated[
    float | None,
    Query(ge=0, allow_inf_nan=False, description=_WAIT),
    WithJsonSchema({"type": "number", "minimum": 0, "description": _WAIT}),
]
LastEventId = Annotated[
    str | None,
    Header(alias="Last-Event-ID", description=_LAST_EVENT_ID),
    WithJsonSchema({"type": "string", "pattern": r"^[0-9]{0,18}$", "description": _LAST_EVENT_ID}),
]


# ---- request bodies ---------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


_SCALAR: list[JsonValue] = [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]
_CAPABILITIES: JsonDict = {
    "description": "Capability names to a scalar or a list of scalars (docs/design.md).",
    "propertyNames": {"minLength": 1},
    "additionalProperties": {"anyOf": [*_SCALAR, {"type": "array", "items": {"anyOf": _SCALAR}}]},
}


class Policy(_Body):
    drain: str = Field(default="", json_schema_extra={"enum": DRAIN_POLICIES})


class AdvertBody(_Body):
    node_id: str = Field(json_schema_extra=ID_RULE)
    label: str = Field(default="", json_schema_extra={"maxLength": 200})
    capabilities: dict[str, Any] = Field(json_schema_extra=_CAPABILITIES)
    instance: str = Field(json_schema_extra={"minLength": 1, "maxLength": 128})
    policy: Policy = Field(default_factory=Policy)
    # list[Any]: the flow checks each name and answers `actions[i]` (docs/design.md §15).
    actions: list[Any] | None = Field(
        default=None,
        description="The actions this node's daemon offers, built-ins and plugins (docs/design.md "
        '§4 "Actions"): a submit refuses a `uses` no node able to fill its role offers. '
        "Absent: not said, any `uses` may run here.",
        json_schema_extra={
            "maxItems": MAX_ACTIONS,
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_KEY},
        },
    )


class ClaimBody(_Body):
    node_id: str = Field(json_schema_extra=ID_RULE)
    instance: str | None = None


class ResultBody(_Body):
    node_id: str = Field(json_schema_extra=ID_RULE)
    instance: str | None = None
    attempt: int = Field(ge=1, le=MAX_INT)
    outcome: str = Field(json_schema_extra={"enum": OUTCOMES})
    log: str = ""


class AnswerBody(_Body):
    answer: str = ""
    ok: bool = True


# ---- responses (the shapes of mediator/core/rows.py's to_dict) ------------------------------
def _untitled(schema: JsonDict) -> None:
    """A property's title would only repeat its name."""
    props = schema.get("properties")
    for prop in props.values() if isinstance(props, dict) else ():
        if isinstance(prop, dict):
            prop.pop("title", None)


class _Answer(BaseModel):
    model_config = ConfigDict(json_schema_extra=_untitled)


class ErrorDetail(_Answer):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_untitled)

    code: str = Field(description="snake_case, e.g. unknown_run")
    message: str = Field(description="one sentence a person can act on")
    field: str | None = Field(description='the request field to blame, e.g. "steps[2].after"')


class Error(_Answer):
    """Every error answer: never a stack trace, SQL or internal path."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_untitled)

    error: ErrorDetail


class Reason(_Answer):
    """Why a run waits or was refused: the matcher's reject (docs/design.md)."""

    code: str = Field(description="e.g. ALL_BUSY, TOO_WIDE, PROMOTABLE")
    message: str
    role: str = absent()
    candidates: list[str] = absent()
    busy: list[str] = absent()
    draining: list[str] = absent()


class Step(_Answer):
    run_id: str = absent()
    seq: int = Field(ge=0)
    name: str
    kind: Literal["exec", "ask"]
    role: str
    uses: str
    with_: dict[str, Any] = Field(alias="with")
    after: list[str]
    ask: str
    state: Literal["PENDING", "CLAIMED", "ASKED", "PASSED", "FAILED", "SKIPPED"]
    node_id: str = Field(description="empty until the run is placed")
    instance: str
    attempt: int = Field(ge=0)
    chosen: dict[str, Any] | None = Field(description="what the match chose for the step (FR-3)")
    started_at: datetime | None
    ended_at: datetime | None


Verdict = Literal["pass", "fail", "rejected", "cancelled", "lost", "drained"]


class Run(_Answer):
    """A run with its steps; queue_position and wait_reason only while QUEUED."""

    run_id: str
    work_id: str
    state: Literal["QUEUED", "RUNNING", "PASSED", "FAILED"]
    verdict: Verdict | None
    assigned: dict[str, str] = absent(description="role -> node, once placed")
    reject: Reason = absent()
    submitter: str = absent()
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    steps: list[Step]
    queue_position: int = absent(ge=1)
    wait_reason: Reason = absent()


class DryRun(_Answer):
    """?dry_run=true: what the match would do now; nothing is created."""

    dry_run: Literal[True]
    assigned: dict[str, str] = absent()
    width: int = absent(ge=0)
    reject: Reason = absent()


class Current(_Answer):
    node: str
    step: str
    attempt: int
    started_at: datetime | None


class RunSummary(_Answer):
    """A row of the list: current lists the CLAIMED steps; while QUEUED, the queue_position and
    wait_reason GET /v1/runs/{run_id} would give (issue 15 §4)."""

    run_id: str
    state: Literal["QUEUED", "RUNNING", "PASSED", "FAILED"]
    verdict: str | None
    work_id: str
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    assigned: dict[str, str] | None
    reject: Reason | None
    current: list[Current]
    queue_position: int = absent(ge=1)
    wait_reason: Reason = absent()


class Counts(_Answer):
    """Lab-wide, not filtered like runs (issue 15 §5)."""

    queued: int = absent(ge=0)
    running: int = absent(ge=0)


class RunList(_Answer):
    observed_at: datetime
    runs: list[RunSummary]
    counts: Counts = absent()


class NodeLease(_Answer):
    run_id: str
    not_after: datetime


class FleetNode(_Answer):
    node_id: str
    label: str
    instance: str
    capabilities: dict[str, Any]
    seen_at: datetime
    expires_at: datetime
    drain: Literal["", "graceful", "at-boundary"]
    actions: list[str] | None = Field(
        description='The actions its daemon offers (docs/design.md §4 "Actions"); null: '
        "its adverts do not say."
    )
    lease: NodeLease | None


class Fleet(_Answer):
    observed_at: datetime
    nodes: list[FleetNode]
    next: str | None = Field(
        description="Pass as `after` for the next page; null on the last page."
    )


class Ask(_Answer):
    ask_id: int
    run_id: str
    seq: int
    question: str
    raised_at: datetime


class Asks(_Answer):
    asks: list[Ask]


class StepResult(_Answer):
    settled: str = Field(description="the run's end state, or empty")
    rolled: bool
    released: list[str]
    step_state: str


class Work(_Answer):
    steps: list[Step]


class Health(_Answer):
    """ok, or unavailable while the database is out of reach or the event listener cannot
    deliver (503; docs/security.md "Connections")."""

    status: Literal["ok", "unavailable"]
    database: Literal["ok", "unreachable"]
    events: Literal["failing", "dead"] = absent()
    unsealed: int = absent(ge=0)
    unopened: int = absent(ge=0)


class AdvertAnswer(_Answer):
    advert_ttl_seconds: float = Field(gt=0)


# ---- a route's responses= -----------------------------------------------------------------
WHY: dict[int, str] = {
    400: "Malformed request: the message and `field` name what to fix.",
    401: "No bearer token, or one the server does not know (not in --dev mode).",
    403: "The token's role or principal may not do this.",
    404: "No such run, step, node, ask or record file.",
    409: "The state forbids it now (step not claimable, stale attempt, run ended, …).",
    413: "The request body is larger than the server's limit.",
    429: "A per-principal cap on queued runs or needs classes is reached; see Retry-After.",
    503: "The Mediator cannot reach its database; try again.",
}
# Every /v1 route can give these: 401 (only a --dev server never does) and 503.
V1 = (401, 503)


def answers(
    ok: dict[int, Any] | None = None, *errors: int, **described: str
) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: ``ok`` maps each success status to its model (or a union of
    models); ``errors`` are the error statuses it can give, each with :class:`Error` and its
    reason; ``described`` (``s201="RUNNING"``) says what a status means on this route."""
    out: dict[int | str, dict[str, Any]] = {}
    for status, model in (ok or {}).items():
        out[status] = {"model": model}
        if f"s{status}" in described:
            out[status]["description"] = described[f"s{status}"]
    for status in sorted(set(errors)):
        out[status] = {"model": Error, "description": described.get(f"s{status}", WHY[status])}
    return out
