"""Every request is checked here before any route sees it (performance.md, issue 11 §3, §4, §11).

:class:`BodyLimit` is a pure ASGI middleware that, for each HTTP request:

* refuses a path or query parameter holding NUL or bytes that are not UTF-8 (400 naming it);
* reads the body up to ``max_body`` bytes — a declared ``Content-Length`` over it, or a chunked
  body that crosses it, is a 413 at once, never buffered whole;
* decodes an API body with :func:`decode` — strict JSON: UTF-8 only, nesting at most
  ``MAX_BODY_DEPTH`` (a body deeper than the parser can go is caught as the RecursionError the C
  parser raises cleanly, so none escapes; anything shallower is measured, see :func:`decode`),
  numbers at most ``MAX_NUMBER_CHARS`` characters, no NaN or Infinity, no duplicate keys, no NUL
  or lone surrogate in any string except a result's ``log`` (which the flows escape) — and
  answers 400 naming the limit or the field;
* hands the route the very bytes it checked.

The routes then parse the body again (FastAPI does); that second parse is safe because the first
one bounded it. Limits and their values: ``mediator.core.contract.LIMITS``, docs/security.md.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote_to_bytes

from mediator.core.limits import MAX_BODY_DEPTH, MAX_NUMBER_CHARS, MAX_TEXT

Scope = dict[str, Any]

# Fields stored with escaping rather than refused (docs/security.md, "Text").
_ESCAPED = {"log"}
_RESULT_ROUTE = re.compile(r"/v1/runs/[^/]+/steps/[^/]+/result")


class BadRequest(Exception):
    """A request refused before routing: 400 with ``code``, ``message`` and ``field``."""

    def __init__(self, message: str, field: str | None = None, code: str = "invalid_request"):
        super().__init__(message)
        self.message, self.field, self.code = message, field, code


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as decoded, duplicates kept, until :func:`_build` checks it."""


def decode(raw: bytes, escaped: frozenset[str] | set[str] = frozenset()) -> Any:
    """Strict JSON for request bodies. Raises :class:`BadRequest` naming the limit or field.

    Two paths with one meaning (docs/performance.md "JSON"). The fast one lets the C parser
    build plain dicts, checks duplicates as each object closes and numbers as they are read, and
    measures the depth by peeling bracket pairs in C (:func:`_depth`): no walk over the tree.
    A NUL or a lone surrogate can only come from a ``\\u`` escape (raw control characters are
    not JSON, and the bytes were UTF-8), so a body holding ``\\u0000`` or a surrogate escape,
    or one whose duplicate key must be named with its path, takes the exact path: pairs kept,
    then :func:`_build` walks it.

    Args:
        raw: The body.
        escaped: Top-level keys whose strings may hold NUL or lone surrogates (stored escaped).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("The body is not UTF-8 text.") from None
    if _SUSPECT.search(text) is None:
        try:
            tree = _parse(text, _unique)
        except _Duplicate:
            pass  # name it with its path: the exact path below
        else:
            if _depth(raw) > MAX_BODY_DEPTH:
                raise _too_deep()
            return tree
    return _build(_parse(text, _Pairs), "", escaped)


# A \u escape that can make a NUL or a surrogate (paired or not): the exact path decides.
_SUSPECT = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
# The depth scan works on the bytes: quotes, backslashes and brackets never occur inside a
# UTF-8 multi-byte sequence.
_ESCAPE = re.compile(rb"\\.", re.S)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_INNERMOST = re.compile(rb"\[\]|\{\}")


class _Duplicate(Exception):
    """An object repeated a key: decode again on the exact path to name it."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Duplicate
    return out


def _depth(raw: bytes) -> int:
    """How deep the JSON document ``raw`` nests arrays and objects (it parsed already).

    All in C: drop escape pairs, keep only quotes and brackets, drop what was inside strings,
    then peel the innermost ``[]`` and ``{}`` pairs away, one layer per pass: the passes are the
    depth. Stops one layer past the limit."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_BODY_DEPTH:
        return 0  # no more brackets than the limit: cannot be deeper
    shape = _ESCAPE.sub(b"", raw) if b"\\" in raw else raw
    shape = b"".join(shape.translate(None, _NOT_STRUCTURE).split(b'"')[::2])  # outside strings
    depth = 0
    while shape and depth <= MAX_BODY_DEPTH:
        shape, peeled = _INNERMOST.subn(b"", shape)
        if not peeled:
            break
        depth += 1
    return depth


def _parse(text: str, hook: Any) -> Any:
    """``json.loads`` with the number checks, ``hook`` building each object."""
    try:
        return json.loads(
            text,
            object_pairs_hook=hook,
            parse_int=_int,
            parse_float=_float,
            parse_constant=_constant,
        )
    except (BadRequest, _Duplicate):
        raise
    except RecursionError:
        # The C parser counts its nesting against the interpreter's recursion limit and raises
        # cleanly; anything that deep is far past MAX_BODY_DEPTH.
        raise _too_deep() from None
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"The body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
        ) from None
    except ValueError:
        raise BadRequest("The body is not valid JSON.") from None


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_NUMBER_CHARS:
        raise BadRequest(
            f"A number in the body has more than {MAX_NUMBER_CHARS} digits.", code="number_too_long"
        )
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise BadRequest(
            f"A number in the body is longer than {MAX_NUMBER_CHARS} characters.",
            code="number_too_long",
        )
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise BadRequest(f"The number {text} is too large to store.", code="number_too_long")
    return value


def _constant(name: str) -> Any:
    raise BadRequest(f"{name} is not a JSON number; send a finite number.")


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _child(path: str, key: str) -> str:
    if _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _bad_text(text: str) -> bool:
    """NUL, or a lone surrogate (which cannot be encoded as UTF-8)."""
    if "\x00" in text:
        return True
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _refuse_text(text: str, field: str) -> BadRequest:
    what = "a NUL character" if "\x00" in text else "an unpaired surrogate, which is not Unicode"
    return BadRequest(
        f"{field or 'The body'} contains {what}; it cannot be stored.",
        field=field or None,
        code="invalid_text",
    )


def _too_deep() -> BadRequest:
    return BadRequest(
        f"The body is nested too deep: at most {MAX_BODY_DEPTH} levels are allowed.",
        code="too_deep",
    )


def _build(node: Any, path: str, escaped: frozenset[str] | set[str], depth: int = 1) -> Any:
    """Plain dicts from ``_Pairs``, refusing duplicate keys, junk text and nesting past the
    limit. Field paths are only spelt out for containers and errors: this walks every value of
    a 1 MiB body."""
    if isinstance(node, _Pairs):
        if depth > MAX_BODY_DEPTH:
            raise _too_deep()
        out: dict[str, Any] = {}
        for key, value in node:
            if _bad_text(key):  # the object holding an unstorable key is named
                raise _refuse_text(key, path)
            if key in out:
                raise BadRequest(
                    f"{_child(path, key)} appears twice in one object; give each key once.",
                    field=_child(path, key),
                    code="duplicate_key",
                )
            if isinstance(value, str):
                if _bad_text(value) and not (path == "" and key in escaped):
                    raise _refuse_text(value, _child(path, key))
                out[key] = value  # an escaped field is stored escaped by the flows
            elif isinstance(value, list | _Pairs):
                out[key] = _build(value, _child(path, key), escaped, depth + 1)
            else:
                out[key] = value
        return out
    if isinstance(node, list):
        if depth > MAX_BODY_DEPTH:
            raise _too_deep()
        items = []
        for i, item in enumerate(node):
            if isinstance(item, str):
                if _bad_text(item):
                    raise _refuse_text(item, f"{path}[{i}]")
                items.append(item)
            elif isinstance(item, list | _Pairs):
                items.append(_build(item, f"{path}[{i}]", escaped, depth + 1))
            else:
                items.append(item)
        return items
    if isinstance(node, str) and _bad_text(node):
        raise _refuse_text(node, path)
    return node


class BodyLimit:
    """Pure ASGI middleware: path, query and body checks before routing (see the module)."""

    def __init__(self, app: Any, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check_url(scope)
        except BadRequest as exc:
            await answer(send, 400, exc.code, exc.message, exc.field)
            return
        if scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before sending its body
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_body:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        path = scope.get("path", "")
        if raw and path.startswith("/v1/") and scope.get("method") == "POST":
            escaped = _ESCAPED if _RESULT_ROUTE.fullmatch(path) else set()
            try:
                # Kept for routes that read the document itself (submit): parsed once.
                scope.setdefault("state", {})["json_body"] = decode(raw, escaped)
            except BadRequest as exc:
                # A submit's body is a contract: its errors keep the contract's code.
                code = exc.code
                if path == "/v1/runs" and code == "invalid_request":
                    code = "invalid_contract"
                await answer(send, 400, code, exc.message, exc.field)
                return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    def _check_url(scope: Scope) -> None:
        if "\x00" in scope.get("path", ""):
            raise BadRequest("The path contains a NUL character.", field="path")
        query: bytes = scope.get("query_string") or b""
        for pair in query.split(b"&"):
            if not pair:
                continue
            key, _, value = pair.partition(b"=")
            name_raw = unquote_to_bytes(key.replace(b"+", b" "))
            name = name_raw.decode("utf-8", "replace")
            for part in (name_raw, unquote_to_bytes(value.replace(b"+", b" "))):
                if b"\x00" in part:
                    raise BadRequest(f"{name} contains a NUL character.", field=name)
                try:
                    text = part.decode("utf-8")
                except UnicodeDecodeError:
                    raise BadRequest(f"{name} is not UTF-8 text.", field=name) from None
                if len(text) > MAX_TEXT:
                    raise BadRequest(f"{name} is longer than {MAX_TEXT} characters.", field=name)

    async def _too_large(self, send: Any) -> None:
        await answer(
            send, 413, "body_too_large", f"The request body is larger than {self.max_body} bytes."
        )


async def answer(send: Any, status: int, code: str, message: str, field: str | None = None) -> None:
    """An ``{"error": {code, message, field}}`` answer sent before any route runs (the one error
    shape, docs/design.md §19), from a middleware: this one's and the guard's."""
    body = json.dumps({"error": {"code": code, "message": message, "field": field}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
