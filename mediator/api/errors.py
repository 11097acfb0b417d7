"""Every error the API gives, in one shape: ``{"error": {code, message, field}}``.

Validation is 400 naming the field (never the framework's default 422, which here means "no node
can serve this contract"); a wrong method is 405 with ``Allow`` (RFC 9110 §15.5.6); anything
unexpected is a logged 500 that carries no internal path, stack trace or SQL (SECURITY-15).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Route

from mediator.core.errors import MediatorError

log = logging.getLogger("mediator.api")


def error(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "field": field}}, status)


def route_methods(routes: Iterable[BaseRoute], path: str) -> set[str]:
    """The methods of every route whose path matches ``path`` (``/v1/runs`` is two routes, GET
    and POST), HEAD wherever GET is; empty when no API route has this path."""
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.path_regex.match(path):
            methods |= set(route.methods or ())
    if "GET" in methods:
        methods.add("HEAD")
    return methods


def _known_fields(request: Request, parents: list[str]) -> list[str]:
    """The field names of the body model at ``parents`` (for "did you mean", issue 15 §3)."""
    route = request.scope.get("route")
    info = getattr(getattr(route, "body_field", None), "field_info", None)
    model: Any = getattr(info, "annotation", None)
    for name in parents:
        fields = getattr(model, "model_fields", {})
        model = fields[name].annotation if name in fields else None
    return list(getattr(model, "model_fields", {}))


def mediator_error(request: Request, exc: MediatorError) -> JSONResponse:
    if exc.status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, exc.message)
    answer = JSONResponse({"error": exc.as_dict()}, exc.status)
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:  # 429: a per-principal cap (docs/security.md)
        answer.headers["Retry-After"] = str(retry_after)
    return answer


def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
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
        return error(400, "unknown_field", f"{field} is not a known field; {hint}", field)
    if loc == ["node_id"] or (loc == ["after"] and request.url.path == "/v1/nodes"):
        # A node's name — in a path, a body or the fleet's cursor — as the flows answer it
        # (issue 29): one code wherever a node id is malformed, not a request shape.
        return error(400, "invalid_node_id", f"{where}{msg}.", field)
    return error(400, "invalid_request", f"{where}{msg}.", field)


def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    # RFC 9110 §15.5.6: a 405 lists the methods the resource has. The panel's mount at "/"
    # matches every path, so a wrong method on an API path reaches it and comes back as its
    # 404 or bare 405: the API's routes decide (the static files know only GET and HEAD).
    methods = route_methods(request.app.routes, request.url.path)
    if exc.status_code in (404, 405) and methods and request.method not in methods:
        exc = StarletteHTTPException(405)
    elif exc.status_code == 405:
        methods = {"GET", "HEAD"}
    codes = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
    message = {404: "No such route.", 405: "Method not allowed on this route."}.get(
        exc.status_code, "The request was refused."
    )
    response = error(exc.status_code, codes.get(exc.status_code, "http_error"), message)
    if exc.status_code == 405:
        response.headers["Allow"] = ", ".join(sorted(methods))
    return response


def unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error in %s %s", request.method, request.url.path)
    return error(500, "internal", "An internal error occurred; it has been logged.")


def install(app: FastAPI) -> None:
    """Answer every error in the one shape."""
    app.add_exception_handler(MediatorError, mediator_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, unexpected)
