"""No ambient authority: what a web page in the operator's browser cannot make a server do
(issue 25 §1; docs/security.md "Browsers and local pages").

A page on any site can make the browser send a request to ``127.0.0.1``: a form POST, or a
``fetch`` with ``text/plain`` — "simple" requests the browser sends without asking first. Against
``mediator serve --dev`` (no tokens) such a request used to submit a run whose ``shell`` step an
``enode`` then ran; a DNS-rebinding page (``evil.example`` resolving to 127.0.0.1) could also read
the answers. :class:`Guard` is a pure ASGI middleware in front of the routes that refuses:

* a ``Host`` that is not one the server serves, when ``hosts`` is given (``--dev`` and the tickets
  board: loopback names only) — 400 ``host_not_allowed``: a rebinding page's requests carry its
  own name;
* with ``hosts`` given, a request that changes something (any method but GET, HEAD, OPTIONS)
  from another origin: an
  ``Origin`` header (browsers send it on every cross-origin POST, forms and ``no-cors`` fetches
  included) whose host and port are not the request's ``Host``, the opaque origin ``null``, or
  ``Sec-Fetch-Site: cross-site`` — 403 ``cross_origin``. This is what keeps a *bodyless* POST
  (cancel) from being a cross-site hole too;
* a body that is not ``application/json`` — 415 ``unsupported_media_type``, for every route with a
  body. A page cannot send ``application/json`` to another origin without the browser asking the
  server first (a CORS preflight), which this server never grants;
* with ``csrf`` given (the board), a write without the header ``X-CSRF-Token`` holding that token
  — 403 ``csrf``. The board's page receives the token inside its HTML, which only a same-origin
  page can read.

Requests from programs (curl, runctl, enode) send no ``Origin`` and are not affected, except that
their bodies must say ``Content-Type: application/json``.

The slow-body bound of row 4 lives here too: a body that does not arrive within
``body_timeout_s`` is answered 408 and its connection closed, so a client trickling a body cannot
hold a connection and a worker task for ever (docs/security.md "Connections").
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import logging
import resource
import time
from collections import Counter
from collections.abc import Collection
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from mediator.api.limits import answer

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
BODY_TIMEOUT_S = 30.0  # the whole body of one request, from the end of its headers
CSRF_HEADER = "X-CSRF-Token"


def host_name(value: str) -> str:
    """The host part of a ``Host`` header or an origin's authority, lower-case, without port or
    IPv6 brackets: ``[::1]:8640`` → ``::1``, ``LocalHost:80`` → ``localhost``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        return value.partition(":")[0]
    return value


class Guard:
    """Pure ASGI: the refusals of the module docstring, before any route or body is read.

    Args:
        app: The application to guard.
        hosts: Host names served (``None``: any ``Host``). ``--dev``: :data:`LOOPBACK_HOSTS`.
        csrf: A token every write must carry in ``X-CSRF-Token`` (``None``: no such check).
        body_timeout_s: Seconds the whole body may take to arrive.
    """

    def __init__(
        self,
        app: Any,
        *,
        hosts: Collection[str] | None = None,
        csrf: str | None = None,
        body_timeout_s: float = BODY_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.hosts = None if hosts is None else frozenset(h.lower() for h in hosts)
        self.csrf = csrf.encode() if csrf else None
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers") or ():
            headers.setdefault(k, v)  # the first of a repeated header: what the routes see
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await answer(send, *refusal)
            return
        if scope.get("method") in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        await self._timed(scope, receive, send)

    def _refusal(
        self, scope: dict[str, Any], headers: dict[bytes, bytes]
    ) -> tuple[int, str, str, str] | None:
        host = headers.get(b"host", b"").decode("latin-1")
        if self.hosts is not None and host_name(host) not in self.hosts:
            return (
                400,
                "host_not_allowed",
                "This server answers only to "
                + ", ".join(sorted(self.hosts))
                + " in the Host header (a page on another name cannot reach it).",
                "Host",
            )
        if scope.get("method") in SAFE_METHODS:
            return None
        has_body = (
            headers.get(b"content-length", b"0").strip() not in (b"0", b"")
            or b"transfer-encoding" in headers
        )
        kind = headers.get(b"content-type")
        if (has_body or kind is not None) and not _is_json(kind):
            shown = (kind or b"none").decode("latin-1")[:80]
            return (
                415,
                "unsupported_media_type",
                f"Request bodies must be JSON with Content-Type: application/json, not {shown}.",
                "Content-Type",
            )
        if self.hosts is None:
            # With tokens nothing is ambient: a page has no token to send (and a proxy in front
            # may rewrite Host, so Origin could not be compared with it anyway).
            return self._csrf_refusal(headers)
        origin = headers.get(b"origin")
        if origin is not None and not self._same_origin(origin.decode("latin-1"), host):
            return (
                403,
                "cross_origin",
                "Requests that change something are refused from another origin "
                "(Origin does not match Host).",
                "Origin",
            )
        if headers.get(b"sec-fetch-site", b"").lower() == b"cross-site":
            return (403, "cross_origin", "Cross-site requests are refused.", "Sec-Fetch-Site")
        return self._csrf_refusal(headers)

    def _csrf_refusal(self, headers: dict[bytes, bytes]) -> tuple[int, str, str, str] | None:
        if self.csrf is not None:
            given = headers.get(CSRF_HEADER.lower().encode(), b"")
            if not hmac.compare_digest(given, self.csrf):
                return (
                    403,
                    "csrf",
                    f"Writes need the page's {CSRF_HEADER} header; reload the page.",
                    CSRF_HEADER,
                )
        return None

    def _same_origin(self, origin: str, host: str) -> bool:
        scheme, sep, authority = origin.partition("://")
        if not sep or scheme not in ("http", "https") or authority.lower() != host.lower():
            return False
        return self.hosts is None or host_name(authority) in self.hosts

    async def _timed(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Run the app with a deadline on the whole body: past it, answer 408 (unless a response
        has started) and tell the app the client is gone; the server then closes the
        connection, since the rest of the body was never read."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        state = {"started": False, "timed_out": False, "whole": False}

        async def timed() -> Any:
            if state["timed_out"]:
                return {"type": "http.disconnect"}
            if state["whole"]:
                return await receive()  # the body is in: later reads wait for a disconnect
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
                if message["type"] != "http.request" or not message.get("more_body", False):
                    state["whole"] = True
                return message
            except TimeoutError:
                state["timed_out"] = True
                if not state["started"]:
                    state["started"] = True
                    await answer(
                        send,
                        408,
                        "body_timeout",
                        f"The request body did not arrive within {self.body_timeout_s:g} s.",
                        None,
                    )
                return {"type": "http.disconnect"}

        async def sending(message: dict[str, Any]) -> None:
            if state["timed_out"]:
                return  # answered 408 already
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        await self.app(scope, timed, sending)


def _is_json(kind: bytes | None) -> bool:
    if kind is None:
        return False
    media = kind.split(b";", 1)[0].strip().lower()
    return media == b"application/json"


# ---- connections (issue 25 §4; docs/security.md "Connections") ---------------------------------
# ~20,000 slow or half-open connections were never closed: at the file-descriptor limit the API
# stopped answering, asyncio logged a traceback per failed accept (106 MB in a minute), and the
# event listener died on EMFILE. Each serving process now holds at most MAX_CONNECTIONS (or
# half its descriptor limit, whichever is lower), closes a connection that has not sent a whole
# request head within HEADER_TIMEOUT_S of opening or of its last answer, and logs each kind of
# event-loop error at most once per LOOP_ERROR_EVERY_S.
MAX_CONNECTIONS = 1024
HEADER_TIMEOUT_S = 10.0
LOOP_ERROR_EVERY_S = 10.0

log = logging.getLogger("mediator.api")


def connection_cap(most: int = MAX_CONNECTIONS) -> int:
    """How many connections one process may hold: ``most``, or half the descriptors this
    process may open if that is lower (the rest: the database pool, the listener, records)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return most
    return max(8, min(most, soft // 2))


class BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with a cap on connections and a deadline on request heads.

    When a connection beyond the cap arrives, the connection that has waited longest without a
    request in progress (a half-open or slow-header one, or an idle keep-alive) is dropped to
    make room — so slow clients can fill the cap but cannot keep others out; if every
    connection is busy with a request, the new one is closed instead.
    """

    max_connections = MAX_CONNECTIONS
    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._waiting_since = self.loop.time()
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()
        if len(self.connections) > self.max_connections:
            victim = self._longest_waiting()
            (victim or self).transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if not self._between_requests():
            self._disarm()  # a request head arrived: the body's deadline is Guard's

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._waiting_since = self.loop.time()
        self._arm()

    def _between_requests(self) -> bool:
        cycle = self.cycle
        return cycle is None or cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_deadline)

    def _disarm(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_deadline(self) -> None:
        self._head_timer = None
        if self._between_requests() and not self.transport.is_closing():
            self.transport.abort()

    def _longest_waiting(self) -> BoundedH11 | None:
        idle = [
            c
            for c in self.connections
            if c is not self and isinstance(c, BoundedH11) and c._between_requests()
        ]
        return min(idle, key=lambda c: c._waiting_since, default=None)


def accept_backlog(cap: int) -> int:
    """uvicorn's ``backlog``: the listen queue, and how many connections asyncio accepts in
    one go. A connection is counted (and one dropped to make room) only two turns of the event
    loop after its accept, and a dropped one closes a turn later, so bursts may exceed the cap
    by about three times this: an eighth of the cap, at most 128, keeps that within the other
    half of the descriptors."""
    return max(8, min(128, cap // 8))


def bounded_h11(
    max_connections: int | None = None, header_timeout_s: float = HEADER_TIMEOUT_S
) -> type[BoundedH11]:
    """The protocol class to give uvicorn (``Config(http=...)``) with this process's cap and
    request-head deadline (the setting ``request_head_timeout_seconds``)."""
    cap = connection_cap() if max_connections is None else max_connections
    attrs = {"max_connections": cap, "header_timeout_s": header_timeout_s}
    return type("BoundedH11", (BoundedH11,), attrs)


def quiet_loop_errors(loop: asyncio.AbstractEventLoop, every_s: float = LOOP_ERROR_EVERY_S) -> None:
    """Log each kind of event-loop error (by its message) at most once per ``every_s``, the
    first with its traceback, then a count of the ones left out: at the descriptor limit
    asyncio reported every failed ``accept`` with a traceback, 229,375 of them in a minute."""
    last: dict[str, float] = {}
    left_out: Counter[str] = Counter()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        kind = str(context.get("message", "event loop error"))[:80]
        now = time.monotonic()
        if now - last.get(kind, -every_s) < every_s:
            left_out[kind] += 1
            return
        last[kind] = now
        more = left_out.pop(kind, 0)
        exc = context.get("exception")
        extra = f" ({more} more like it in the last {every_s:g} s)" if more else ""
        if more or kind in _SEEN or _out_of_resources(exc):
            log.error("%s: %r%s", kind, exc, extra)
        else:
            _SEEN.add(kind)
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


_SEEN: set[str] = set()
# An accept that failed for want of descriptors or memory is the load, not a bug: no traceback.
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def _out_of_resources(exc: object) -> bool:
    return isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRNOS
