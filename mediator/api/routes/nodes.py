"""Routes 1, 2, 11: a node's advert (heartbeat), its claimable work, and the fleet."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from mediator.api.deps import WORKER, Caller, Med, NodeCaller, Waits, as_node
from mediator.api.responses import FastJSON
from mediator.api.schemas import (
    ID_PATTERN,
    V1,
    AdvertAnswer,
    AdvertBody,
    Fleet,
    NodeId,
    Work,
    WorkWait,
    answers,
)
from mediator.api.waits import WAIT_HEADER

router = APIRouter(tags=["nodes"])
# The fleet's cursor is a node id, or empty for the first page (a malformed one: invalid_node_id).
AFTER_PATTERN = "^$|" + ID_PATTERN
PAGE = 500  # nodes per page unless `limit` says otherwise (5,000 nodes were 4.5 MB unpaged)


# 1 -- adverts
@router.post(
    "/v1/nodes", response_model=None, responses=answers({200: AdvertAnswer}, 400, 403, 413, *V1)
)
def post_advert(body: AdvertBody, med: Med, p: NodeCaller) -> Response:
    ttl = med.advert(
        body.node_id,
        body.capabilities,
        body.instance,
        label=body.label,
        drain=body.policy.drain,
        principal=p.name,
        actions=body.actions,
    )
    return FastJSON({"advert_ttl_seconds": ttl})


# 2 -- work; with `wait`, a long poll held until the node may have a step (mediator/api/waits.py)
@router.get(
    "/v1/nodes/{node_id}/work",
    response_model=None,
    responses=answers({200: Work}, 400, 403, 404, *V1),
)
async def get_work(
    node_id: NodeId, request: Request, med: Med, waits: Waits, p: NodeCaller, wait: WorkWait = None
) -> Response:
    def read() -> list[dict[str, Any]]:
        as_node(med, p, node_id)
        return [s.to_dict() for s in med.work(node_id)]

    if wait is None:
        return FastJSON({"steps": await run_in_threadpool(read)})
    steps, granted = await waits.poll(node_id, p.name, wait, read, request.receive)
    # Which worker held it (serve --workers): the wake must reach each (docs/design.md §19).
    return FastJSON({"steps": steps}, headers={WAIT_HEADER: f"{granted:g}", **WORKER})


# 11 -- fleet, paged like the runs (docs/design.md §19): follow `next` as `after`
@router.get("/v1/nodes", response_model=None, responses=answers({200: Fleet}, 400, *V1))
def list_nodes(
    med: Med,
    p: Caller,
    after: Annotated[str, Query(max_length=64, pattern=AFTER_PATTERN)] = "",
    limit: Annotated[int, Query(ge=1, le=1000)] = PAGE,
) -> Response:
    return FastJSON(med.list_nodes(after, limit).to_dict())
