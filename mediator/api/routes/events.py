"""Route 14: ``GET /v1/events``, the server-sent event stream (docs/design.md §19).

Async: an idle stream holds no worker thread (issue 11 §2). The stream itself — one listener per
process, a shared buffer, the caps — is :class:`mediator.api.events.EventFeed`'s.
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import StreamingResponse

from mediator.api.deps import WORKER, Caller, Feed
from mediator.api.errors import error
from mediator.api.events import StreamsFull
from mediator.api.schemas import MAX_EVENT_ID, V1, AfterEvent, EventLimit, LastEventId, answers
from mediator.core.errors import ContractError

router = APIRouter(tags=["events"])
BUSY = "The Mediator cannot reach its database, or too many streams are open (see Retry-After)."


# 14 -- server-sent events
@router.get(
    "/v1/events",
    response_class=StreamingResponse,
    responses=answers({}, 400, *V1, s503=BUSY),
)
async def get_events(
    feed: Feed,
    p: Caller,
    last_event_id: LastEventId = None,
    after: AfterEvent = None,
    limit: EventLimit = None,
) -> Response:
    start = after
    if last_event_id:  # an empty Last-Event-ID is no id at all (issue 15 §1)
        try:
            start = int(last_event_id)
            if not 0 <= start <= MAX_EVENT_ID:
                raise ValueError
        except ValueError:
            raise ContractError(
                "Last-Event-ID must be an event id.", field="Last-Event-ID"
            ) from None
    try:
        ticket = feed.admit(p.name)
    except StreamsFull as full:
        refused = error(503, "too_many_streams", full.message)
        refused.headers["Retry-After"] = str(full.retry_after)
        return refused
    return StreamingResponse(
        feed.stream(ticket, start, limit),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **WORKER},
    )
