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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from mediator.core.errors import MediatorError

DEFAULT_URL = "http://127.0.0.1:8640"
DEFAULT_TIMEOUT = 30.0
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


@dataclass(frozen=True)
class Reply:
    """A successful answer whose status matters to the caller (submit: 200/201/202/422)."""

    status: int
    body: Any


def _segment(value: object) -> str:
    """One path segment, escaped, so an id can never add a ``/`` or a query to the route."""
    return quote(str(value), safe="")


class Client:
    """The Mediator's HTTP API as Python methods.

    Args:
        url: Base URL of the Mediator, e.g. ``http://127.0.0.1:8640``.
        token: Bearer token; ``None`` or ``""`` sends no ``Authorization`` header (dev mode).
        timeout: Seconds to wait for a connection and for each answer.
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
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
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
        try:
            resp = self._http.request(method, path, json=json, params=query or None)
        except httpx.TransportError as exc:
            raise Unreachable(self.url, _reason(exc)) from None
        body = _decode(resp)
        if resp.status_code in tuple(ok):
            return Reply(resp.status_code, body)
        raise _error(resp, body)

    def _get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params).body

    def _post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body).body

    # ---- node routes (1-4) ---------------------------------------------------------------------

    def advert(
        self,
        node_id: str,
        capabilities: Mapping[str, Any],
        instance: str,
        *,
        label: str = "",
        drain: str = "",
    ) -> float:
        """Advertise a node (route 1) and return the ``advert_ttl_seconds`` the server asks for."""
        body = self._post(
            "/v1/nodes",
            {
                "node_id": node_id,
                "label": label,
                "capabilities": dict(capabilities),
                "instance": instance,
                "policy": {"drain": drain},
            },
        )
        return float(body["advert_ttl_seconds"])

    def work(self, node_id: str) -> list[dict[str, Any]]:
        """The claimable steps of a node (route 2)."""
        return list(self._get(f"/v1/nodes/{_segment(node_id)}/work")["steps"])

    def claim(self, run_id: str, seq: int, node_id: str, instance: str) -> dict[str, Any]:
        """Claim a step (route 3); returns the step as CLAIMED, with its new ``attempt``."""
        return dict(
            self._post(
                f"/v1/runs/{_segment(run_id)}/steps/{int(seq)}/claim",
                {"node_id": node_id, "instance": instance},
            )
        )

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
        """Submit a contract (route 5). 200, 201, 202 and 422 are replies, not errors."""
        return self.request(
            "POST",
            "/v1/runs",
            json=contract,
            params={"dry_run": "true"} if dry_run else None,
            ok=(200, 201, 202, 422),
        )

    def list_runs(
        self,
        *,
        state: str | None = None,
        work_id: str | None = None,
        since: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """List runs (route 6): ``{observed_at, runs}``, newest first."""
        return dict(self._get("/v1/runs", state=state, work_id=work_id, since=since, limit=limit))

    def get_run(self, run_id: str) -> dict[str, Any]:
        """One run with its steps (route 7)."""
        return dict(self._get(f"/v1/runs/{_segment(run_id)}"))

    def cancel(self, run_id: str) -> dict[str, Any]:
        """Cancel a run (route 8); cancelling a terminal run is a no-op that returns it."""
        return dict(self._post(f"/v1/runs/{_segment(run_id)}/cancel"))

    def record(self, run_id: str) -> dict[str, Any]:
        """A run's record manifest (route 9): ``seal.json`` once sealed, else the files so far."""
        return dict(self._get(f"/v1/runs/{_segment(run_id)}/record"))

    def record_text(self, run_id: str, name: str) -> str:
        """One file of a run's record as text (route 10), e.g. ``steps/0000-flash.log``."""
        path = f"/v1/runs/{_segment(run_id)}/record/" + "/".join(map(_segment, name.split("/")))
        try:
            resp = self._http.request("GET", path)
        except httpx.TransportError as exc:
            raise Unreachable(self.url, _reason(exc)) from None
        if resp.status_code != 200:
            raise _error(resp, _decode(resp))
        return resp.content.decode("utf-8", "replace")

    def nodes(self) -> dict[str, Any]:
        """The live fleet (route 11): ``{observed_at, nodes}``."""
        return dict(self._get("/v1/nodes"))

    def asks(self) -> list[dict[str, Any]]:
        """Open asks (route 12)."""
        return list(self._get("/v1/asks")["asks"])

    def answer(self, ask_id: int | str, answer: str, *, ok: bool = True) -> dict[str, Any]:
        """Answer an ask (route 13); the reply is shaped like a step result's."""
        return dict(self._post(f"/v1/asks/{_segment(ask_id)}/answer", {"answer": answer, "ok": ok}))


def _decode(resp: httpx.Response) -> Any:
    if not resp.content:
        return None
    try:
        return resp.json()
    except ValueError:
        return None


def _error(resp: httpx.Response, body: Any) -> ApiError:
    status = resp.status_code
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and isinstance(err.get("code"), str):
        return ApiError(
            status,
            err["code"],
            str(err.get("message") or resp.reason_phrase),
            field=err.get("field") if isinstance(err.get("field"), str) else None,
            body=body,
        )
    text = " ".join(resp.text.split())[:_SHOWN_TEXT] or resp.reason_phrase
    return ApiError(status, f"http_{status}", text, body=body)


def _reason(exc: httpx.TransportError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    # e.g. "[Errno 111] Connection refused": the OS's words say whether to start the server or
    # fix the address.
    return str(exc) or type(exc).__name__
