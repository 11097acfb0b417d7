"""The FastAPI application: a small factory around the routers of ``mediator/api/routes``.

Routes translate HTTP to calls on :class:`mediator.Mediator` and back (docs/design.md §19);
who may call what is :mod:`mediator.api.deps`'s, the one error shape :mod:`mediator.api.errors`',
the document :mod:`mediator.api.openapi`'s. The factory only puts them together: the app's state
(the Mediator, the token table, the event feed, the held work polls, the metrics), the error
handlers, the middleware, the routers and the panel.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from mediator.api import errors, openapi
from mediator.api.access import AccessLog
from mediator.api.auth import Tokens
from mediator.api.events import EventFeed
from mediator.api.guard import LOOPBACK_HOSTS, Guard
from mediator.api.limits import BodyLimit
from mediator.api.metrics import Metrics, RequestMetrics
from mediator.api.routes import ROUTERS
from mediator.api.waits import WorkWaits
from mediator.flows import Mediator

MAX_BODY = 1 << 20  # 1 MiB: a 1,000-step contract fits with room to spare
UI_DIR = Path(__file__).with_name("ui")

# FastAPI's built-in OpenTelemetry (newer releases) asks on every request whether a tracer is
# configured; none is, so it is switched off where the release has it (P1 profile).
_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


def create_app(med: Mediator, tokens: Tokens | None = None, *, max_body: int = MAX_BODY) -> FastAPI:
    """Build the API around one Mediator. ``tokens=None`` is the development mode."""
    tokens = tokens or Tokens(None)
    feed = EventFeed(
        med,
        keepalive_s=med.config.events_keepalive_seconds,
        max_streams=med.config.events_max_streams,
        max_per_principal=med.config.events_max_streams_per_principal,
    )
    metrics = Metrics(med)
    feed.on_open_streams = metrics.instruments.streams.set
    feed.on_out_of_order = metrics.instruments.out_of_order.inc
    waits = WorkWaits(
        med,
        feed,
        max_wait_s=med.config.work_wait_max_seconds,
        max_held=med.config.work_max_waits,
        max_per_principal=med.config.work_max_waits_per_principal,
    )
    waits.on_held = metrics.instruments.held_polls.set
    waits.on_answer = lambda how: metrics.instruments.polls.labels(how).inc()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        feed.stop()

    app = FastAPI(
        **_NO_TELEMETRY,
        lifespan=lifespan,
        title="Mediator",
        version="0.1.0",
        description="A lab job broker over PostgreSQL (docs/design.md).",
        docs_url=None,
        redoc_url=None,
    )
    # What the routes depend on (mediator/api/deps.py).
    app.state.med = med
    app.state.tokens = tokens
    app.state.feed = feed
    app.state.waits = waits
    app.state.metrics = metrics
    openapi.install(app)  # the document as the server behaves (issue 15 §1)
    errors.install(app)

    # ---- middleware: every request passes these before any route, the last added first ----
    app.add_middleware(BodyLimit, max_body=max_body)
    app.add_middleware(Guard, hosts=LOOPBACK_HOSTS if tokens.dev else None)  # issue 25 §1
    app.add_middleware(RequestMetrics, instruments=metrics.instruments)  # BodyLimit's 4xx too
    app.add_middleware(AccessLog)  # outermost: it sees every refusal too

    for router in ROUTERS:
        # The router's routes become the app's own, as include_router did before FastAPI kept an
        # included router as one entry that resolves its routes again on every request (some 250
        # Python calls a request, measured); these routers add no prefix or dependency to copy.
        app.router.routes.extend(router.routes)
    # 18 -- the panel (static files; it talks to this API over HTTP like any client)
    if UI_DIR.is_dir():
        app.mount("/", StaticFiles(directory=str(UI_DIR), html=True), name="panel")
    return app
