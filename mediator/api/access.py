"""The access log: one line per request (method, path, status, milliseconds to the response's
start), as a pure ASGI middleware.

It was a ``@app.middleware("http")`` function, which Starlette runs through
``BaseHTTPMiddleware``: a task group, memory streams and a second Request object for every
request, the largest share of the framework's time per submit in the P1 profile
(docs/performance.md). This one only wraps ``send``; with INFO off it is one attribute lookup.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("mediator.api")


class AccessLog:
    """Pure ASGI: log ``METHOD path status N.Nms`` when the response starts."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def logged(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                log.info(
                    "%s %s %d %.1fms",
                    scope.get("method", ""),
                    scope.get("path", ""),
                    message["status"],
                    (time.perf_counter() - started) * 1e3,
                )
            await send(message)

        await self.app(scope, receive, logged)
