"""Request body size limit: 413 before the body is read into memory (docs/performance.md)."""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]


class BodyLimit:
    """Pure ASGI middleware: refuses bodies over ``max_body`` bytes with 413.

    A declared ``Content-Length`` over the limit is refused at once; a chunked body is counted as
    it streams and refused when it crosses the limit, so neither kind is buffered whole.
    """

    def __init__(self, app: Any, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            await self._refuse(send)
            return
        seen = 0
        refused = False

        async def counting_receive() -> Any:
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    refused = True
                    raise _TooLarge
            return message

        try:
            await self.app(scope, counting_receive, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps(
            {
                "error": {
                    "code": "body_too_large",
                    "message": f"The request body is larger than {self.max_body} bytes.",
                    "field": None,
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass
