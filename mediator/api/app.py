"""The FastAPI application: the 18 routes of docs/design.md §19.

Routes translate HTTP to calls on :class:`mediator.Mediator` and back; authorization is decided
here from the caller's principal and role (docs/design.md §14); everything else is the Mediator's.
Errors are always ``{"error": {code, message, field}}``: validation is 400 (never the framework's
default 422, which here means "no node can serve this contract"), and no response carries an
internal path, a stack trace or SQL (SECURITY-15).
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import logging
import os
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from fastapi import FastAPI, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from mediator.api.access import AccessLog
from mediator.api.auth import Principal, Tokens
from mediator.api.events import EventFeed, StreamsFull
from mediator.api.guard import LOOPBACK_HOSTS, Guard
from mediator.api.limits import BadRequest, BodyLimit, decode
from mediator.api.metrics import Metrics, RequestMetrics
from mediator.api.openapi import ID_PATTERN, MAX_EVENT_ID, route_methods
from mediator.api.openapi import install as install_openapi
from mediator.core.errors import ContractError, Forbidden, MediatorError, NotFound
from mediator.flows import Mediator

log = logging.getLogger("mediator.api")

MAX_BODY = 1 << 20  # 1 MiB: a 1,000-step contract fits with room to spare
MAX_INT = 2**31 - 1  # seq, attempt, ask_id are PostgreSQL integers: larger is a 400, not a 500
UI_DIR = Path(__file__).with_name("ui")
PID = str(os.getpid())  # a spawned worker imports this module anew


# FastAPI's built-in OpenTelemetry (newer releases) asks on every request whether a tracer is
# configured; none is, so it is switched off where the release has it (P1 profile).
_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


class FastJSON(Response):
    """A JSON response encoded by orjson (about 12–15× ``json.dumps``, bench/bench_json.py)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def _error(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "field": field}}, status)


# FastAPI resolves annotations by name at import time: the alias must live at module level.
Auth = Annotated[str | None, Header(alias="Authorization")]
Seq = Annotated[int, PathParam(ge=0, le=MAX_INT)]
AskId = Annotated[int, PathParam(ge=1, le=MAX_INT)]
NodeId = Annotated[str, PathParam(pattern=ID_PATTERN, max_length=64)]
RecordFile = Annotated[str, PathParam(min_length=1, max_length=1024)]


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


def _known_fields(request: Request, parents: list[str]) -> list[str]:
    """The field names of the body model at ``parents`` (for "did you mean", issue 15 §3)."""
    route = request.scope.get("route")
    info = getattr(getattr(route, "body_field", None), "field_info", None)
    model: Any = getattr(info, "annotation", None)
    for name in parents:
        fields = getattr(model, "model_fields", {})
        model = fields[name].annotation if name in fields else None
    return list(getattr(model, "model_fields", {}))


# ---- request bodies ---------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Policy(_Body):
    drain: str = ""


class AdvertBody(_Body):
    node_id: str
    label: str = ""
    capabilities: dict[str, Any]
    instance: str
    policy: Policy = Field(default_factory=Policy)


class ClaimBody(_Body):
    node_id: str
    instance: str | None = None


class ResultBody(_Body):
    node_id: str
    instance: str | None = None
    attempt: Annotated[int, Field(ge=1, le=MAX_INT)]
    outcome: str
    log: str = ""


class AnswerBody(_Body):
    answer: str = ""
    ok: bool = True


# ---- the app ----------------------------------------------------------------------------------
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
    app.state.med = med
    app.state.feed = feed
    install_openapi(app)  # the document as the server behaves (issue 15 §1)
    app.add_middleware(BodyLimit, max_body=max_body)
    app.add_middleware(Guard, hosts=LOOPBACK_HOSTS if tokens.dev else None)  # issue 25 §1
    app.add_middleware(RequestMetrics, instruments=metrics.instruments)  # BodyLimit's 4xx too
    app.add_middleware(AccessLog)  # outermost: it sees BodyLimit's refusals too

    # -- errors --
    @app.exception_handler(MediatorError)
    def _mediator_error(request: Request, exc: MediatorError) -> JSONResponse:
        if exc.status >= 500:
            log.error("%s %s failed: %s", request.method, request.url.path, exc.message)
        return JSONResponse({"error": exc.as_dict()}, exc.status)

    @app.exception_handler(RequestValidationError)
    def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
        field = ".".join(loc) or None
        msg = first.get("msg", "invalid request")
        where = f"{field}: " if field else ""
        if first.get("type") == "extra_forbidden" and loc:
            # Issue 15 §3: name the unknown field and the closest known one.
            known = _known_fields(request, loc[:-1])
            close = difflib.get_close_matches(loc[-1], known, n=1)
            hint = f'did you mean "{close[0]}"?' if close else f"use {', '.join(known)}."
            return _error(400, "unknown_field", f"{field} is not a known field; {hint}", field)
        return _error(400, "invalid_request", f"{where}{msg}.", field)

    @app.exception_handler(StarletteHTTPException)
    def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # RFC 9110 §15.5.6: a 405 lists the methods the resource has. The panel's mount at "/"
        # matches every path, so a wrong method on an API path reaches it and comes back as its
        # 404 or bare 405: the API's routes decide (the static files know only GET and HEAD).
        methods = route_methods(app.routes, request.url.path)
        if exc.status_code in (404, 405) and methods and request.method not in methods:
            exc = StarletteHTTPException(405)
        elif exc.status_code == 405:
            methods = {"GET", "HEAD"}
        codes = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
        message = {404: "No such route.", 405: "Method not allowed on this route."}.get(
            exc.status_code, "The request was refused."
        )
        response = _error(exc.status_code, codes.get(exc.status_code, "http_error"), message)
        if exc.status_code == 405:
            response.headers["Allow"] = ", ".join(sorted(methods))
        return response

    @app.exception_handler(Exception)
    def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return _error(500, "internal", "An internal error occurred; it has been logged.")

    # -- who is calling --
    def caller(authorization: str | None) -> Principal:
        return tokens.resolve(authorization)

    def require(p: Principal, *roles: str) -> None:
        if not (p.dev or p.admin or p.role in roles):
            raise Forbidden(f"This route needs the {' or '.join(roles)} role.", code="wrong_role")

    def require_node(p: Principal) -> None:
        """Node routes need a node token: an admin may cancel and answer but never act as a
        node (issue 11 §11, docs/security.md "Threat model")."""
        if not (p.dev or p.role == "node"):
            raise Forbidden("This route needs a node's own token.", code="wrong_role")

    def as_node(p: Principal, node_id: str) -> None:
        """A node acts only for itself: the principal bound at its first advert (§9)."""
        require_node(p)
        if p.dev:
            return
        owner = med.node_principal(node_id)
        if owner is None:
            raise NotFound(f"No node {node_id!r}; advertise first.", code="unknown_node")
        if owner != p.name:
            raise Forbidden(f"Node {node_id} belongs to another principal.", code="not_your_node")

    # 1 -- adverts
    @app.post("/v1/nodes", tags=["nodes"])
    def post_advert(body: AdvertBody, authorization: Auth = None) -> dict[str, Any]:
        p = caller(authorization)
        require_node(p)
        ttl = med.advert(
            body.node_id,
            body.capabilities,
            body.instance,
            label=body.label,
            drain=body.policy.drain,
            principal=p.name,
        )
        return {"advert_ttl_seconds": ttl}

    # 2 -- work
    @app.get("/v1/nodes/{node_id}/work", tags=["nodes"])
    def get_work(node_id: NodeId, authorization: Auth = None) -> dict[str, Any]:
        as_node(caller(authorization), node_id)
        return {"steps": [s.to_dict() for s in med.work(node_id)]}

    # 3 -- claim
    @app.post("/v1/runs/{run_id}/steps/{seq}/claim", tags=["nodes"])
    def post_claim(
        run_id: str, seq: Seq, body: ClaimBody, authorization: Auth = None
    ) -> dict[str, Any]:
        as_node(caller(authorization), body.node_id)
        return med.claim(run_id, seq, body.node_id, body.instance).to_dict()

    # 4 -- result
    @app.post("/v1/runs/{run_id}/steps/{seq}/result", tags=["nodes"])
    def post_result(
        run_id: str, seq: Seq, body: ResultBody, authorization: Auth = None
    ) -> dict[str, Any]:
        as_node(caller(authorization), body.node_id)
        r = med.report(
            run_id, seq, body.node_id, body.attempt, body.outcome, body.log, body.instance
        )
        return {
            "settled": r.settled,
            "rolled": r.rolled,
            "released": list(r.released),
            "step_state": r.step_state,
        }

    # 5 -- submit
    @app.post(
        "/v1/runs",
        tags=["runs"],
        responses={201: {"description": "RUNNING"}, 202: {"description": "QUEUED"},
                   422: {"description": "FAILED: no node can ever serve it"}},
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
            "schema": {"type": "object", "description": "The run contract (docs/design.md)"}}}}},
    )  # fmt: skip
    async def post_run(
        request: Request,
        dry_run: bool = False,
        authorization: Auth = None,
    ) -> Response:
        p = caller(authorization)
        require(p, "client")
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
        sub = await run_in_threadpool(med.submit, doc, p.name, dry_run)
        return FastJSON(sub.body(), sub.status)  # Run.to_dict is JSON-ready already

    # 6 -- list runs
    @app.get("/v1/runs", tags=["runs"])
    def list_runs(
        state: Literal["", "QUEUED", "RUNNING", "PASSED", "FAILED"] | None = None,
        work_id: Annotated[str | None, Query(max_length=200)] = None,
        since: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        authorization: Auth = None,
    ) -> dict[str, Any]:
        caller(authorization)
        # issue 15 §1: `state=` (empty) means every state, as a form leaves it; `since` is an
        # RFC 3339 instant with its offset — not a number of seconds, not a local time.
        return med.list_runs(state or None, work_id, _instant(since, "since"), limit).to_dict()

    # 7 -- one run
    @app.get("/v1/runs/{run_id}", tags=["runs"])
    def get_run(run_id: str, authorization: Auth = None) -> dict[str, Any]:
        caller(authorization)
        return med.get_run(run_id).to_dict()

    # 8 -- cancel
    @app.post("/v1/runs/{run_id}/cancel", tags=["runs"])
    def post_cancel(run_id: str, authorization: Auth = None) -> dict[str, Any]:
        p = caller(authorization)
        require(p, "client")
        principal = None if p.dev else p.name
        return med.cancel(run_id, principal, admin=p.admin).to_dict()

    # 9 -- record manifest
    @app.get("/v1/runs/{run_id}/record", tags=["records"])
    def get_record(run_id: str, authorization: Auth = None) -> dict[str, Any]:
        caller(authorization)
        med.get_run(run_id)  # 404 for an unknown run
        manifest = med.records.manifest(run_id)
        if manifest is None:
            raise NotFound(f"Run {run_id} has no record yet.", code="no_record")
        return manifest

    # 10 -- one record file (no path traversal: Records.read_file stays inside the run's folder)
    @app.get("/v1/runs/{run_id}/record/{file:path}", tags=["records"])
    def get_record_file(run_id: str, file: RecordFile, authorization: Auth = None) -> Response:
        caller(authorization)
        med.get_run(run_id)
        try:
            data = med.records.read_file(run_id, file)
        except (OSError, ValueError):  # a name the file system refuses (too long, NUL) is no file
            data = None
        if data is None:
            raise NotFound("No such file in this run's record.", code="no_such_file", field="file")
        kind = "application/json" if file.endswith(".json") else "text/plain; charset=utf-8"
        return Response(data, media_type=kind)

    # 11 -- fleet
    @app.get("/v1/nodes", tags=["nodes"])
    def list_nodes(authorization: Auth = None) -> dict[str, Any]:
        caller(authorization)
        return med.list_nodes().to_dict()

    # 12 -- open asks
    @app.get("/v1/asks", tags=["asks"])
    def list_asks(authorization: Auth = None) -> dict[str, Any]:
        caller(authorization)
        return {"asks": [a.to_dict() for a in med.asks()]}

    # 13 -- answer
    @app.post("/v1/asks/{ask_id}/answer", tags=["asks"])
    def post_answer(ask_id: AskId, body: AnswerBody, authorization: Auth = None) -> dict[str, Any]:
        p = caller(authorization)
        require(p, "client")
        r = med.answer(ask_id, body.answer, body.ok, principal=p.name)
        return {
            "settled": r.settled,
            "rolled": r.rolled,
            "released": list(r.released),
            "step_state": r.step_state,
        }

    # 14 -- server-sent events (async: an idle stream holds no worker thread; issue 11 §2)
    @app.get(
        "/v1/events",
        tags=["events"],
        response_class=StreamingResponse,
        responses={503: {"description": "Too many open event streams; see Retry-After"}},
    )
    async def get_events(
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
        after: Annotated[int | None, Query(ge=0, le=MAX_EVENT_ID)] = None,
        limit: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
        authorization: Auth = None,
    ) -> Response:
        p = caller(authorization)
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
            refused = _error(503, "too_many_streams", full.message)
            refused.headers["Retry-After"] = str(full.retry_after)
            return refused
        return StreamingResponse(
            feed.stream(ticket, start, limit),
            media_type="text/event-stream",
            headers={
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                "X-Mediator-Worker": PID,
            },
        )

    # 15 -- health: 503 within about a second while the database is out of reach (a bounded
    # ping); record work waiting for a retry is shown, not treated as ill health (issue 11 §5).
    @app.get("/healthz", tags=["ops"])
    def healthz() -> JSONResponse:
        try:
            med.ping()
            backlog = med.record_backlog()
        except MediatorError:
            return JSONResponse({"status": "unavailable", "database": "unreachable"}, 503)
        if feed.listener_state in ("failing", "dead"):  # streams get no events (issue 25 §4)
            return JSONResponse(
                {"status": "unavailable", "database": "ok", "events": feed.listener_state}, 503
            )
        # Which worker process answered (mediator serve --workers, issue 13): for operators.
        return JSONResponse(
            {"status": "ok", "database": "ok", **backlog}, headers={"X-Mediator-Worker": PID}
        )

    # 16 -- metrics
    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse)
    def get_metrics() -> Response:
        body, content_type = metrics.render()  # the whole server's, whichever worker answers
        return Response(body, media_type=content_type, headers={"X-Mediator-Worker": PID})

    # 18 -- the panel (static files; it talks to this API over HTTP like any client)
    if UI_DIR.is_dir():
        app.mount("/", StaticFiles(directory=str(UI_DIR), html=True), name="panel")

    return app
