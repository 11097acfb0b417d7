"""Routes 15 and 16: ``/healthz`` and ``/metrics``, for operators (docs/design.md §19)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from mediator.api.deps import WORKER, Feed, Med, MetricsOf
from mediator.api.schemas import Health
from mediator.core.errors import MediatorError

router = APIRouter(tags=["ops"])


# 15 -- health: 503 within about a second while the database is out of reach (a bounded ping);
# record work waiting for a retry is shown, not treated as ill health (issue 11 §5).
@router.get(
    "/healthz",
    response_model=None,
    responses={
        200: {"model": Health},
        503: {"model": Health, "description": "The database or the event listener is down."},
    },
)
def healthz(med: Med, feed: Feed) -> JSONResponse:
    try:
        med.ping()
        backlog = med.record_backlog()
    except MediatorError:
        return JSONResponse({"status": "unavailable", "database": "unreachable"}, 503)
    if feed.listener_state in ("failing", "dead"):  # streams get no events (issue 25 §4)
        state = {"status": "unavailable", "database": "ok", "events": feed.listener_state}
        return JSONResponse(state, 503, headers=WORKER)
    return JSONResponse({"status": "ok", "database": "ok", **backlog}, headers=WORKER)


# 16 -- metrics: the whole server's, whichever worker answers
@router.get("/metrics", response_class=PlainTextResponse)
def get_metrics(metrics: MetricsOf) -> Response:
    body, content_type = metrics.render()
    return Response(body, media_type=content_type, headers=WORKER)
