"""Routes 3 and 4: a node claims a step and reports its result (docs/design.md §9)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from mediator.api.deps import Med, NodeCaller, as_node
from mediator.api.responses import FastJSON
from mediator.api.schemas import (
    V1,
    ClaimBody,
    ResultBody,
    RunId,
    Seq,
    Step,
    StepResult,
    answers,
)

router = APIRouter(tags=["nodes"])


# 3 -- claim
@router.post(
    "/v1/runs/{run_id}/steps/{seq}/claim",
    response_model=None,
    responses=answers({200: Step}, 400, 403, 404, 409, 413, *V1),
)
def post_claim(run_id: RunId, seq: Seq, body: ClaimBody, med: Med, p: NodeCaller) -> Response:
    as_node(med, p, body.node_id)
    return FastJSON(med.claim(run_id, seq, body.node_id, body.instance).to_dict())


# 4 -- result
@router.post(
    "/v1/runs/{run_id}/steps/{seq}/result",
    response_model=None,
    responses=answers({200: StepResult}, 400, 403, 404, 409, 413, *V1),
)
def post_result(run_id: RunId, seq: Seq, body: ResultBody, med: Med, p: NodeCaller) -> Response:
    as_node(med, p, body.node_id)
    r = med.report(run_id, seq, body.node_id, body.attempt, body.outcome, body.log, body.instance)
    return FastJSON(r.to_dict())
