"""A small HTTP client for the Mediator's API (design.md §19), shared by ``runctl`` and ``enode``.

Both programs talk to the Mediator over HTTP only (architecture.md: the node daemon must not
import the store or the API internals), so the wire details live here once: the base URL, the
bearer token,
JSON bodies, and the error body ``{"error": {code, message, field}}`` turned into an
:class:`ApiError` that carries the HTTP status with the server's code, message and field. A server
that cannot be reached at all is an :class:`Unreachable`, so callers can print one line instead of
a traceback and a daemon can retry later.

Each route has a method named after it. Most return the decoded JSON body and raise on any other
status than the one the route answers on success; ``submit`` returns a :class:`Reply` because its
200, 201, 202 and 422 are all answers a caller must tell apart (docs/design.md §5).
"""

from __future__ import annotations

import contextvars
import itertools
import json as _json
import math
import os
import re
import select
import ssl
import stat
import time
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpcore
import httpx

from mediator.core.errors import MediatorError

DEFAULT_URL = "http://127.0.0.1:8640"
DEFAULT_TIMEOUT = 30.0  # one request, whole: connection, answer and body (issue 25 §9)
# The largest answer read (issue 25 §9: a 400 MB body took a client to 1.26 GB). The biggest
# real ones — a page of 1,000 runs, a run with 1,000 steps — are a few MB.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
# An advert TTL from the server is clamped to this range before the node adverts every TTL/3
# (issue 25 §9: a TTL of 1e-9 made ~200 adverts a second; a negative one as many).
MIN_ADVERT_TTL = 1.0
MAX_ADVERT_TTL = 3600.0
MAX_LISTED = 1000  # runs in one list answer: the API's own page limit
# Error text from a server that did not answer with our error shape (a proxy, a crash page) is
# cut to this many characters: enough to recognise, never a page of HTML on a terminal.
_SHOWN_TEXT = 200


class ApiError(MediatorError):
    """The server answered with an error status.

    Attributes:
        status: The HTTP status (400, 401, 403, 404, 409, 413, 503, …).
        code: The server's snake_case code, e.g. ``run_ended``; ``http_<status>`` when the body
            was not the API's error shape.
        message: The server's sentence for a person.
        field: The request field to blame (``steps[2].after``) or ``None``.
        body: The decoded body (``None`` if it was not JSON), for ``--json`` output.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message, field=field, code=code)
        self.status = status
        self.body = body

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        return f"{self.status} {self.code}: {self.message}{where}"


class Unreachable(ApiError):
    """No HTTP answer at all: connection refused, DNS failure, timeout. ``status`` is 0."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(0, "unreachable", f"cannot reach the Mediator at {url}: {reason}")

    def __str__(self) -> str:
        return self.message


# What must never reach a terminal raw from a server (issue 25 §8): C0 controls (ESC starts
# colour, cursor and OSC sequences — window titles, hyperlinks, clipboard writes; CR overwrites a
# line), DEL, C1 controls (0x9b is a one-byte CSI), and the Unicode format characters that
# reorder or hide text (bidi embeddings, overrides and isolates, marks, line separators).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


# Inside json.dumps's text C0 controls occur only as the newlines of its indentation.
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escape_char(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _unsafe(c: str) -> bool:
    # the list above, and every other format or separator character Unicode names (zero-width
    # joiners, soft hyphens, tag characters): none belongs on a terminal unescaped
    return _UNSAFE.match(c) is not None or unicodedata.category(c) in ("Cf", "Zl", "Zp")


def printable(text: str, keep: str = "") -> str:
    """``text`` safe for a terminal: each control or reordering character but those in ``keep``
    shown as its escape (``\\x1b``, ``\\u202e``), everything else as it is. Without ``keep``
    it is for one line of output: a newline inside a value is escaped too, so a value cannot
    forge a line; a step's log is shown with ``keep="\\n\\t"``."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(c if c in keep or not _unsafe(c) else _escape_char(c) for c in text)


def printable_json(text: str) -> str:
    """JSON text (``ensure_ascii=False``) safe for a terminal and still the same JSON: the
    characters :func:`printable` escapes become ``\\uXXXX`` escapes (``json.dumps`` already
    escapes C0 controls inside strings; this adds DEL, C1 and the bidi characters)."""
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class BadAnswer(Unreachable):
    """An answer that is not one a Mediator gives — HTML from a proxy, a malformed or oversized
    body, a field of the wrong type, an answer that would not end. Treated like no answer at
    all (a daemon retries later; ``runctl`` says so in one line): ``status`` 0, code
    ``bad_answer``."""

    def __init__(self, url: str, reason: str) -> None:
        ApiError.__init__(
            self, 0, "bad_answer", f"the server at {url} did not answer as a Mediator: {reason}"
        )


@dataclass(frozen=True)
class Reply:
    """A successful answer whose status matters to the caller (submit: 200/201/202/422)."""

    status: int
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)


def _segment(value: object) -> str:
    """One path segment, escaped, so an id can never add a ``/`` or a query to the route."""
    return quote(str(value), safe="")


# 1,000 pages of 1,000 nodes: far beyond any lab, and a bound on a server that invents cursors.
_MAX_NODE_PAGES = 1000


# The instant (time.monotonic) the request in flight on this thread must be over by: every
# socket operation waits at most until then (issue 25 §9). httpx's own timeout is per read, so
# a server that trickled its status line and headers a byte at a time held a request for ever.
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("deadline", default=None)


@dataclass(frozen=True)
class Interrupt:
    """What ends a request in flight while it waits for its answer (:meth:`Client.work_wait`: a
    node's held poll ends at once on SIGTERM): ``fd`` becoming readable, or ``check()`` returning
    True, asked every ``every`` seconds (a drain file changed)."""

    fd: int
    check: Callable[[], bool] | None = None
    every: float = 1.0


_interrupt: contextvars.ContextVar[Interrupt | None] = contextvars.ContextVar(
    "interrupt", default=None
)


class Interrupted(Exception):
    """The request was given up: its :class:`Interrupt` fired."""


def _left(timeout: float | None) -> float | None:
    """The smaller of an operation's own timeout and the time left before the deadline."""
    deadline = _deadline.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise httpcore.ReadTimeout("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A socket whose every read and write ends by the request's deadline."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        interrupt = _interrupt.get()
        if interrupt is not None:
            self._wait_readable(interrupt, _left(timeout))
        return self._stream.read(max_bytes, _left(timeout))

    def _wait_readable(self, interrupt: Interrupt, timeout: float | None) -> None:
        """Wait until the socket has bytes (then read as usual) or ``interrupt`` fires (then
        :class:`Interrupted`); at ``timeout``, return and let the read time out as usual."""
        sock = self._stream.get_extra_info("socket")
        if sock is None or (isinstance(sock, ssl.SSLSocket) and sock.pending()):
            return  # bytes already decrypted and waiting: select would not see them
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            step = left
            if interrupt.check is not None:
                step = interrupt.every if left is None else min(left, interrupt.every)
            ready, _, _ = select.select([sock, interrupt.fd], [], [], step)
            if sock in ready:
                return
            if interrupt.fd in ready or (interrupt.check is not None and interrupt.check()):
                raise Interrupted("the request was interrupted")
            if left is not None and step is not None and left <= step:
                return

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(timeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, _left(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own sockets, wrapped in :class:`_DeadlineStream`; connecting is bounded too."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        stream = self._backend.connect_tcp(
            host, port, _left(timeout), local_address, socket_options
        )
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        return _DeadlineStream(
            self._backend.connect_unix_socket(path, _left(timeout), socket_options)
        )

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def _transport() -> httpx.HTTPTransport:
    """httpx's transport over :class:`_DeadlineBackend`. httpx takes no network backend, so its
    pool is replaced by the same httpcore pool built with one (tests/adversarial cover it)."""
    transport = httpx.HTTPTransport()
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(), network_backend=_DeadlineBackend()
    )
    return transport


class Client:
    """The Mediator's HTTP API as Python methods.

    Args:
        url: Base URL of the Mediator, e.g. ``http://127.0.0.1:8640``.
        token: Bearer token; ``None`` or ``""`` sends no ``Authorization`` header (dev mode).
        timeout: Seconds one request may take in all — connecting, the answer and its whole
            body (checked as each piece of the body arrives).
        transport: An httpx transport to use instead of the network (tests: an ASGI app).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        # identity: no compressed answer, so MAX_RESPONSE_BYTES bounds what is held, not a
        # compressed size that could inflate a thousandfold.
        headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport or _transport()
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the one place requests are made -------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        ok: Iterable[int] = (200,),
    ) -> Reply:
        """Send one request and decode the answer.

        Args:
            method: HTTP method.
            path: Path under the base URL, starting with ``/``.
            json: Body to send as JSON, or ``None`` for no body.
            params: Query parameters; ``None`` values are left out.
            ok: Statuses that are answers rather than errors.

        Returns:
            The status and decoded JSON body (``None`` for an empty body).

        Raises:
            Unreachable: No HTTP answer.
            ApiError: A status not in ``ok``.
        """
        query = {k: v for k, v in (params or {}).items() if v is not None}
        resp, content = self._fetch(method, path, json=json, params=query or None)
        body = self._decode(content, resp.status_code in tuple(ok))
        if resp.status_code in tuple(ok):
            if not isinstance(body, dict):
                raise BadAnswer(self.url, f"{method} {path} answered {_kind(body)}, not an object")
            return Reply(resp.status_code, body, resp.headers)
        raise _error(resp, content, body)

    def _fetch(self, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, bytes]:
        """One exchange, over by ``self.timeout`` whatever the server does: connecting, sending,
        the status line and headers (each socket read waits only for the time left) and the
        body (:meth:`_read`)."""
        deadline = time.monotonic() + self.timeout
        token = _deadline.set(deadline)
        try:
            with self._http.stream(method, path, **kwargs) as resp:
                content = self._read(resp, deadline)
        except httpx.TimeoutException as exc:
            if time.monotonic() < deadline or isinstance(exc, httpx.ConnectTimeout):
                raise Unreachable(self.url, _reason(exc)) from None
            raise BadAnswer(self.url, f"the answer did not end within {self.timeout:g} s") from None
        except httpx.TransportError as exc:
            raise Unreachable(self.url, _reason(exc)) from None
        finally:
            _deadline.reset(token)
        return resp, content

    def _read(self, resp: httpx.Response, deadline: float) -> bytes:
        """The whole body, at most :data:`MAX_RESPONSE_BYTES`, by ``deadline``."""
        declared = resp.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
            raise BadAnswer(self.url, f"an answer of {int(declared):,} bytes (the limit is "
                            f"{MAX_RESPONSE_BYTES:,})")  # fmt: skip
        chunks: list[bytes] = []
        size = 0
        try:
            raw = resp.iter_raw()
            first = [next(raw, b"")]
        except httpx.StreamConsumed:  # an answer made whole in memory (a test transport)
            raw, first = iter(()), [resp.content]
        for chunk in itertools.chain(first, raw):
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise BadAnswer(self.url, f"an answer over {MAX_RESPONSE_BYTES:,} bytes")
            if time.monotonic() > deadline:
                raise BadAnswer(self.url, f"the answer did not end within {self.timeout:g} s")
            chunks.append(chunk)
        return b"".join(chunks)

    def _decode(self, content: bytes, ok: bool) -> Any:
        if not content:
            return None
        try:
            return _json.loads(content)
        except (ValueError, RecursionError):
            if ok:
                raise BadAnswer(self.url, "the body is not JSON") from None
            return None

    def _get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params).body

    def _post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body).body

    # ---- the shapes the programs rely on (issue 25 §9: a wrong one was a traceback) ------------

    def _list(self, value: Any, field: str) -> list[Any]:
        if not isinstance(value, list):
            raise BadAnswer(self.url, f"{field} is {_kind(value)}, not a list")
        return value

    def _step(self, step: Any, what: str) -> dict[str, Any]:
        ok = (
            isinstance(step, dict)
            and isinstance(step.get("run_id"), str)
            and _is_int(step.get("seq"))
            and isinstance(step.get("with", {}) or {}, dict)
            and all(isinstance(step.get(k, ""), str | None) for k in ("name", "uses", "kind"))
        )
        if not ok:
            raise BadAnswer(self.url, f"{what} is malformed")
        return dict(step)

    def _run(self, run: Any) -> dict[str, Any]:
        if not (isinstance(run, dict) and isinstance(run.get("run_id"), str)):
            raise BadAnswer(self.url, "a run without a run_id")
        steps = run.get("steps")
        if steps is not None and not (
            isinstance(steps, list) and all(isinstance(x, dict) for x in steps)
        ):
            raise BadAnswer(self.url, f"run {run['run_id']!r} has malformed steps")
        return dict(run)

    # ---- node routes (1-4) ---------------------------------------------------------------------

    def advert(
        self,
        node_id: str,
        capabilities: Mapping[str, Any],
        instance: str,
        *,
        label: str = "",
        drain: str = "",
        actions: Iterable[str] | None = None,
    ) -> float:
        """Advertise a node (route 1) and return the ``advert_ttl_seconds`` the server asks for.
        ``actions``: the actions the node offers (docs/design.md §4 "Actions"); None sends none."""
        advert: dict[str, Any] = {
            "node_id": node_id,
            "label": label,
            "capabilities": dict(capabilities),
            "instance": instance,
            "policy": {"drain": drain},
        }
        if actions is not None:
            advert["actions"] = sorted(actions)
        body = self._post("/v1/nodes", advert)
        ttl = body.get("advert_ttl_seconds")
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
            raise BadAnswer(self.url, f"advert_ttl_seconds is {_kind(ttl)}, not a number")
        return min(max(float(ttl), MIN_ADVERT_TTL), MAX_ADVERT_TTL)

    def work(self, node_id: str) -> list[dict[str, Any]]:
        """The claimable steps of a node (route 2)."""
        steps = self._get(f"/v1/nodes/{_segment(node_id)}/work").get("steps")
        return [self._step(s, "a work step") for s in self._list(steps, "steps")]

    def work_wait(
        self, node_id: str, wait: float, interrupt: Interrupt | None = None
    ) -> tuple[list[dict[str, Any]], float | None]:
        """Route 2 as a long poll: the server holds the answer up to ``wait`` seconds while the
        node has nothing to claim (docs/design.md §19 "The wake of a waiting node").

        Args:
            wait: Seconds; kept 5 s inside this client's request timeout.
            interrupt: What gives the request up at once (:class:`Interrupted`; the connection
                is dropped, which frees the server's place).

        Returns:
            The steps, and the seconds the server said it would hold (``X-Mediator-Wait``): 0 if
            it answered at once (over its cap, stopping), None if it ignored ``wait`` (an older
            server).
        """
        wait = max(0.0, min(wait, self.timeout - 5.0))
        token = _interrupt.set(interrupt)
        try:
            reply = self.request("GET", f"/v1/nodes/{_segment(node_id)}/work",
                                 params={"wait": f"{wait:.3f}"})  # fmt: skip
        finally:
            _interrupt.reset(token)
        steps = [self._step(s, "a work step") for s in self._list(reply.body.get("steps"), "steps")]
        granted: float | None = None
        header = reply.headers.get("x-mediator-wait")
        if header is not None:
            try:
                granted = float(header)
            except ValueError:
                granted = None
            if granted is not None and not (math.isfinite(granted) and granted >= 0):
                granted = None
        return steps, granted

    def claim(self, run_id: str, seq: int, node_id: str, instance: str) -> dict[str, Any]:
        """Claim a step (route 3); returns the step as CLAIMED, with its new ``attempt``."""
        claimed = self._post(
            f"/v1/runs/{_segment(run_id)}/steps/{int(seq)}/claim",
            {"node_id": node_id, "instance": instance},
        )
        step = self._step(claimed, "the claimed step")
        if not _is_int(step.get("attempt")):
            raise BadAnswer(self.url, "the claimed step has no attempt number")
        return step

    def report(
        self,
        run_id: str,
        seq: int,
        *,
        node_id: str,
        instance: str,
        attempt: int,
        outcome: str,
        log: str = "",
    ) -> dict[str, Any]:
        """Report a step's result (route 4): ``{settled, rolled, released, step_state}``."""
        return dict(
            self._post(
                f"/v1/runs/{_segment(run_id)}/steps/{int(seq)}/result",
                {
                    "node_id": node_id,
                    "instance": instance,
                    "attempt": attempt,
                    "outcome": outcome,
                    "log": log,
                },
            )
        )

    # ---- client routes -------------------------------------------------------------------------

    def submit(self, contract: Any, *, dry_run: bool = False) -> Reply:
        """Submit a contract (route 5). 200, 201, 202 and a 422 with the FAILED run are replies;
        a 422 that wrote no run — ``unknown_action`` (docs/design.md §4 "Actions") — is an
        :class:`ApiError` like a 400."""
        reply = self.request(
            "POST",
            "/v1/runs",
            json=contract,
            params={"dry_run": "true"} if dry_run else None,
            ok=(200, 201, 202, 422),
        )
        error = reply.body.get("error")
        if reply.status == 422 and isinstance(error, dict):
            raise ApiError(
                422,
                str(error.get("code") or "http_422"),
                str(error.get("message") or ""),
                field=error.get("field") if isinstance(error.get("field"), str) else None,
                body=reply.body,
            )
        return reply

    def list_runs(
        self,
        *,
        state: str | None = None,
        work_id: str | None = None,
        since: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """List runs (route 6): ``{observed_at, runs}``, newest first."""
        body = self._get("/v1/runs", state=state, work_id=work_id, since=since, limit=limit)
        runs = self._list(body.get("runs"), "runs")
        for run in runs:
            self._run(run)
        # Never more than asked for (or the API's page): 60,000 runs once kept runctl busy for
        # minutes (issue 25 §9).
        return {**body, "runs": runs[: min(limit or MAX_LISTED, MAX_LISTED)]}

    def get_run(self, run_id: str) -> dict[str, Any]:
        """One run with its steps (route 7)."""
        return self._run(self._get(f"/v1/runs/{_segment(run_id)}"))

    def run_step(self, run_id: str, seq: int) -> tuple[str, dict[str, Any] | None]:
        """One step of a run, read with its run (route 7): the run's state, and the step as a
        claim or a work poll gives it (``run_id`` included, ``attempt`` an integer) or ``None``
        when the run has no such step."""
        run = self.get_run(run_id)
        step = next((s for s in run.get("steps") or () if s.get("seq") == seq), None)
        if step is None:
            return str(run.get("state")), None
        step = self._step({**step, "run_id": run_id}, f"step {seq} of run {run_id!r}")
        if not _is_int(step.get("attempt")):
            raise BadAnswer(self.url, f"step {seq} of run {run_id!r} has no attempt number")
        return str(run.get("state")), step

    def cancel(self, run_id: str) -> dict[str, Any]:
        """Cancel a run (route 8); cancelling a terminal run is a no-op that returns it."""
        return self._run(self._post(f"/v1/runs/{_segment(run_id)}/cancel"))

    def record(self, run_id: str) -> dict[str, Any]:
        """A run's record manifest (route 9): ``seal.json`` once sealed, else the files so far."""
        return dict(self._get(f"/v1/runs/{_segment(run_id)}/record"))

    def record_text(self, run_id: str, name: str) -> str:
        """One file of a run's record as text (route 10), e.g. ``steps/0000-flash.log``."""
        path = f"/v1/runs/{_segment(run_id)}/record/" + "/".join(map(_segment, name.split("/")))
        resp, content = self._fetch("GET", path)  # bounded like every answer
        if resp.status_code != 200:
            raise _error(resp, content, self._decode(content, False))
        return content.decode("utf-8", "replace")

    def nodes(self) -> dict[str, Any]:
        """The live fleet (route 11): ``{observed_at, nodes}``, every page followed
        (``observed_at`` is the first page's). A lying server cannot keep the client
        paging forever: each page must move the cursor forward, and every node is checked."""
        first = dict(self._get("/v1/nodes?limit=1000"))
        nodes: list[Any] = []
        page: dict[str, Any] = first
        seen: set[str] = set()
        while True:
            for node in self._list(page.get("nodes"), "nodes"):
                if not isinstance(node, dict) or not isinstance(node.get("node_id"), str):
                    raise BadAnswer(self.url, "a node without a node_id")
                lease = node.get("lease")
                if lease is not None and not (
                    isinstance(lease, dict) and isinstance(lease.get("run_id"), str)
                ):
                    raise BadAnswer(self.url, f"node {node['node_id']!r} has a malformed lease")
                nodes.append(node)
            after = page.get("next")
            if not after:
                break
            if not isinstance(after, str) or after in seen or len(seen) >= _MAX_NODE_PAGES:
                raise BadAnswer(self.url, "a nodes page whose next cursor does not move forward")
            seen.add(after)
            page = dict(self._get(f"/v1/nodes?limit=1000&after={quote(after, safe='')}"))
        first["nodes"], first["next"] = nodes, None
        return first

    def asks(self) -> list[dict[str, Any]]:
        """Open asks (route 12)."""
        asks = self._list(self._get("/v1/asks").get("asks"), "asks")
        for ask in asks:
            if not (isinstance(ask, dict) and isinstance(ask.get("question"), str)):
                raise BadAnswer(self.url, "an ask without a question")
        return asks

    def answer(self, ask_id: int | str, answer: str, *, ok: bool = True) -> dict[str, Any]:
        """Answer an ask (route 13); the reply is shaped like a step result's."""
        return dict(self._post(f"/v1/asks/{_segment(ask_id)}/answer", {"answer": answer, "ok": ok}))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(body: Any) -> str:
    return "nothing" if body is None else f"a JSON {type(body).__name__}"


def _error(resp: httpx.Response, content: bytes, body: Any) -> ApiError:
    status = resp.status_code
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and isinstance(err.get("code"), str):
        return ApiError(
            status,
            err["code"],
            str(err.get("message") or resp.reason_phrase)[: _SHOWN_TEXT * 5],
            field=err.get("field") if isinstance(err.get("field"), str) else None,
            body=body,
        )
    text = " ".join(content[: _SHOWN_TEXT * 4].decode("utf-8", "replace").split())[:_SHOWN_TEXT]
    text = text or resp.reason_phrase
    return ApiError(status, f"http_{status}", text, body=body)


def _reason(exc: httpx.TransportError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    # e.g. "[Errno 111] Connection refused": the OS's words say whether to start the server or
    # fix the address.
    return str(exc) or type(exc).__name__


def read_token_file(path: str) -> str:
    """The token in ``path``: its one line, without the line end. The file must be a regular
    file only this account may read or write (like ``ssh`` with a private key). ``enode`` and
    ``runctl`` read ``--token-file`` with it (docs/security.md "Tokens on the command line").

    Raises:
        ValueError: The file cannot be read, is open to other accounts, or holds no token.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"cannot read the token file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"the token file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise ValueError(
                f"the token file {path} is open to other accounts "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); make it private: chmod 600 {path}"
            )
        data = os.read(fd, 4097)
    finally:
        os.close(fd)
    token = data.decode("utf-8", "replace").removesuffix("\n").removesuffix("\r")
    if not token or len(data) > 4096 or any(c in token for c in "\r\n"):
        raise ValueError(f"the token file {path} must hold one token on one line")
    return token
