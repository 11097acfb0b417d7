"""Routes 12 and 13: the open asks, and a person's answer (docs/design.md §11)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from mediator.api.deps import Caller, Client, Med
from mediator.api.responses import FastJSON
from mediator.api.schemas import V1, AnswerBody, AskId, Asks, StepResult, answers

router = APIRouter(tags=["asks"])


# 12 -- open asks
@router.get("/v1/asks", response_model=None, responses=answers({200: Asks}, *V1))
def list_asks(med: Med, p: Caller) -> Response:
    return FastJSON({"asks": [a.to_dict() for a in med.asks()]})


# 13 -- answer
@router.post(
    "/v1/asks/{ask_id}/answer",
    response_model=None,
    responses=answers({200: StepResult}, 400, 403, 404, 409, 413, *V1),
)
def post_answer(ask_id: AskId, body: AnswerBody, med: Med, p: Client) -> Response:
    return FastJSON(med.answer(ask_id, body.answer, body.ok, principal=p.name).to_dict())
