"""Routes 5–8: submit a run, list runs, one run, cancel (docs/design.md §5, §19).

The flows say what a submit did (:class:`~mediator.flows.submit.Outcome`); the HTTP status is
this module's choice (:data:`SUBMIT_STATUS`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from mediator.api.deps import Caller, Client, Med
from mediator.api.limits import BadRequest, decode
from mediator.api.responses import FastJSON
from mediator.api.schemas import (
    V1,
    DryRun,
    Run,
    RunId,
    RunList,
    RunStateFilter,
    SinceFilter,
    WorkIdFilter,
    answers,
)
from mediator.core.errors import ContractError
from mediator.flows import Outcome

router = APIRouter(tags=["runs"])

SUBMIT_STATUS = {
    Outcome.STARTED: 201,
    Outcome.QUEUED: 202,
    Outcome.EXISTING: 200,
    Outcome.DRY_RUN: 200,
    Outcome.REJECTED: 422,
}
REJECTED = "FAILED: no node in the fleet can ever serve this contract (not a validation error)."
# The contract is parsed by mediator/core/contract.py, not by a model (its errors name the field
# as the contract's rules do): the route reads the body itself, and the document's Contract
# schema is mediator/api/openapi.py's.
CONTRACT_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Contract"}}},
    }
}


def _instant(text: str | None, field: str) -> datetime | None:
    """An RFC 3339 date-time with its offset (``2026-12-01T01:02:03Z``), else 400."""
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text.upper())
    except ValueError:
        value = None
    if value is None or value.tzinfo is None or "T" not in text.upper():
        raise ContractError(
            f"{field} must be an RFC 3339 date-time with an offset, e.g. 2026-12-01T09:30:00Z.",
            field=field,
        )
    return value


# 5 -- submit
@router.post(
    "/v1/runs",
    response_model=None,
    responses=answers(
        {200: Run | DryRun, 201: Run, 202: Run, 422: Run},
        400, 403, 413, 429, *V1,
        s201="RUNNING", s202="QUEUED", s422=REJECTED,
    ),
    openapi_extra=CONTRACT_BODY,
)  # fmt: skip
async def post_run(request: Request, med: Med, p: Client, dry_run: bool = False) -> Response:
    # BodyLimit decoded and checked the body already (depth, numbers, duplicates, text).
    doc = getattr(request.state, "json_body", None)
    if doc is None:
        raw = await request.body()
        try:
            doc = decode(raw) if raw else None
        except BadRequest as exc:
            raise ContractError(exc.message, field=exc.field, code=exc.code) from None
    if not isinstance(doc, dict):
        raise ContractError("The contract must be a JSON object.", field=None)
    sub = await run_in_threadpool(med.submit, doc, p.name, dry_run, capped=True)
    return FastJSON(sub.body(), SUBMIT_STATUS[sub.outcome])  # Run.to_dict is JSON-ready already


# 6 -- list runs
@router.get("/v1/runs", response_model=None, responses=answers({200: RunList}, 400, *V1))
def list_runs(
    med: Med,
    p: Caller,
    state: RunStateFilter = "",
    work_id: WorkIdFilter = None,
    since: SinceFilter = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    # issue 15 §1: `state=` (empty) means every state, as a form leaves it; `since` is an
    # RFC 3339 instant with its offset — not a number of seconds, not a local time.
    return FastJSON(
        med.list_runs(state or None, work_id, _instant(since, "since"), limit).to_dict()
    )


# 7 -- one run
@router.get("/v1/runs/{run_id}", response_model=None, responses=answers({200: Run}, 400, 404, *V1))
def get_run(run_id: RunId, med: Med, p: Caller) -> Response:
    return FastJSON(med.get_run(run_id).to_dict())


# 8 -- cancel
@router.post(
    "/v1/runs/{run_id}/cancel",
    response_model=None,
    responses=answers({200: Run}, 400, 403, 404, 409, 413, *V1),
)
def post_cancel(run_id: RunId, med: Med, p: Client) -> Response:
    principal = None if p.dev else p.name
    return FastJSON(med.cancel(run_id, principal, admin=p.admin).to_dict())
