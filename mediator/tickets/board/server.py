"""The board's HTTP server: the static page plus a small JSON API over the queue folder.

FastAPI and uvicorn, because the Mediator's own API uses them (one stack to know). Every request
reads the folder afresh – the files are the only truth (seed 001: "해결됨" is never recorded
separately) – and the page re-reads ``/api/board`` every ``refresh_seconds`` (5 s by default,
shorter in tests). The three writes a person can make go through ``store``: an answer, unassign,
and retry.
"""

from __future__ import annotations

import html
import secrets
import socket
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel

from mediator.api.guard import LOOPBACK_HOSTS, Guard, bounded_h11
from mediator.tickets import store, view
from mediator.tickets.files import BadInput, NotATicketFile
from mediator.tickets.frontmatter import Document, render_value
from mediator.tickets.rules import DEFAULT_MAX_FAILURES
from mediator.tickets.store import QueueDir, Refused

STATIC = Path(__file__).parent
_FILES = {"board.css": "text/css", "board.js": "text/javascript"}


class AnswerBody(BaseModel):
    """The answer form: the text, and who answers."""

    text: str
    by: str = ""


def create_app(
    queue: QueueDir,
    *,
    refresh_seconds: float = 5.0,
    max_failures: int = DEFAULT_MAX_FAILURES,
    clock: Callable[[], float] = time.time,
    hosts: Collection[str] | None = None,
    csrf: str | None = None,
) -> FastAPI:
    """The board application for one queue folder.

    Args:
        queue: The folder to show.
        refresh_seconds: How often the page re-reads the queue (seed 001: every 5 s).
        max_failures: Failed sessions after which the bell lists a ticket.
        clock: Epoch seconds; answer badges count days from it.
        hosts: The ``Host`` names the board answers to (``None``: any; :func:`serve` gives
            loopback and the bound address).
        csrf: The token every write must carry in ``X-CSRF-Token`` (default: a fresh random
            one, in ``app.state.csrf``). The page gets it inside its HTML, which no other
            origin can read (docs/security.md "Browsers and local pages").
    """
    app = FastAPI(title="tickets board", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.csrf = csrf or secrets.token_urlsafe(32)
    app.add_middleware(Guard, hosts=hosts, csrf=app.state.csrf)  # issue 25 §1
    page = (
        (STATIC / "index.html")
        .read_text("utf-8")
        .replace(
            "<head>",
            f'<head>\n  <meta name="csrf-token" content="{html.escape(app.state.csrf)}">',
            1,
        )
    )

    @app.exception_handler(Refused)
    async def refused(_: Any, error: Refused) -> JSONResponse:
        return JSONResponse({"error": str(error)}, status_code=409)

    @app.exception_handler(BadInput)
    async def bad_input(_: Any, error: BadInput) -> JSONResponse:
        # issue 12 §8: a name that would leave the queue folder, or text over the limit, is bad
        # input named by its field – a 400, never a traceback.
        return JSONResponse({"error": str(error)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def bad_body(_: Any, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ())[1:]) or "body"
        return JSONResponse({"error": f"{where}: {first.get('msg', 'invalid')}"}, status_code=400)

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return Response(page, media_type="text/html", headers={"Cache-Control": "no-store"})

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return Response(status_code=204)  # no icon, and no 404 in the browser's console

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> FileResponse:
        if name not in _FILES:
            raise HTTPException(404, "no such file")
        return FileResponse(STATIC / name, media_type=_FILES[name])

    @app.get("/api/board")
    def board() -> dict[str, Any]:
        snapshot = store.read_snapshot(queue)
        data = view.board(snapshot.judge(max_failures), now=clock(), invalid=snapshot.invalid)
        data["refresh_ms"] = round(refresh_seconds * 1000)
        return data

    @app.get("/api/help")
    def help_table() -> list[dict[str, Any]]:
        return view.help_table()

    @app.get("/api/tickets/{ticket_hash}", response_model=None)
    def detail(ticket_hash: str) -> dict[str, Any] | JSONResponse:
        snapshot = store.read_snapshot(queue)
        try:
            verdict = store.find(snapshot, ticket_hash)
        except Refused as error:
            return JSONResponse({"error": str(error)}, status_code=404)
        try:
            data = store.read_ticket_bytes(queue, verdict.ticket.file_name)
        except (FileNotFoundError, NotATicketFile):
            # Renamed or replaced since the listing; never read through a symlink (issue 12 §8).
            raise HTTPException(404, f"ticket {ticket_hash} just changed; reload") from None
        doc = Document.parse(store.decode(data))
        answers = [a for a in snapshot.answers if a.ticket == ticket_hash]
        return {
            "card": view.card(verdict, now=clock()),
            "fields": [[key, _shown(doc, key)] for key in doc.key_order()],
            "body": doc.body,
            "answers": [
                {"file": a.file_name, "by": a.answered_by, "text": a.text} for a in answers
            ],
        }

    @app.post("/api/tickets/{ticket_hash}/answer", status_code=201)
    def answer(ticket_hash: str, body: AnswerBody) -> dict[str, str]:
        path = store.answer(queue, ticket_hash, body.text, body.by.strip() or "board", now=clock())
        return {"file": path.name}

    @app.post("/api/tickets/{ticket_hash}/unassign")
    def unassign(ticket_hash: str) -> dict[str, str]:
        store.unassign(queue, ticket_hash)
        return {"hash": ticket_hash}

    @app.post("/api/tickets/{ticket_hash}/retry")
    def retry(ticket_hash: str) -> dict[str, str]:
        store.clear_failures(queue, ticket_hash)
        return {"hash": ticket_hash}

    return app


def _shown(doc: Document, key: str) -> str:
    value = doc.get(key)
    return "" if value is None else value if isinstance(value, str) else render_value(value)


def serve(
    queue: QueueDir,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    refresh_seconds: float = 5.0,
    max_failures: int = DEFAULT_MAX_FAILURES,
) -> int:
    """Serves the board until interrupted; prints ``board: <url>`` once it accepts connections.

    The socket is bound here, before uvicorn starts, so ``port=0`` can pick a free port and the
    printed line names the real one (tests start the board this way).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    bound_port = sock.getsockname()[1]
    hosts = LOOPBACK_HOSTS | {host.strip("[]").lower()}
    app = create_app(queue, refresh_seconds=refresh_seconds, max_failures=max_failures, hosts=hosts)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, http=bounded_h11())
    )
    shown = f"[{host}]" if ":" in host else host
    print(f"board: http://{shown}:{bound_port}/", flush=True, file=sys.stdout)
    server.run(sockets=[sock])
    return 0
