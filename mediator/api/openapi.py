"""The OpenAPI document: derived from the routes, plus the little they cannot say (issue 15 §1).

Each route declares its parameters' bounds, its body, its response models and every status it can
give (``responses=``, :func:`mediator.api.schemas.answers`); FastAPI derives the document from
them. Three things it cannot derive are added here, once, when the document is first built:

- FastAPI declares its default ``422 Validation Error`` on every route with parameters; this server
  answers malformed input with 400 (declared at each route) and keeps 422 for "no node can serve
  this contract", so the default and its schemas are removed;
- the submit route reads its body itself (the contract's rules are ``mediator/core/contract.py``'s,
  and its errors name the field as those rules do), so the ``Contract`` schema it refers to is
  written here;
- the note on strings that holds for every request.

``tests/e2e/test_openapi.py`` runs schemathesis with every check against a live server to hold the
document and the server to each other.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from mediator.api.schemas import ID_PATTERN

STRINGS = (
    "\n\nEvery string in a request is UTF-8 text without NUL (U+0000) and without lone "
    "surrogates: neither can be stored, and either is refused with 400 (docs/security.md)."
)

_SCALAR = {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}
_NEEDS = {
    "type": "object",
    "description": "Capability names to the value a node must advertise (true: any value).",
    "propertyNames": {"minLength": 1},
    "additionalProperties": _SCALAR,
}
_STEP = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 128},
        "kind": {"type": "string", "enum": ["exec", "ask"], "default": "exec"},
        "role": {"type": "string", "description": "A key of roles (exec steps)."},
        "uses": {"type": "string", "description": "The node action, e.g. shell, sleep, fail."},
        "with": {"type": "object", "description": "The action's arguments."},
        "after": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Names of earlier steps this one waits for (no cycles).",
        },
        "ask": {"type": "string", "description": "The question of an ask step."},
    },
}
CONTRACT: dict[str, Any] = {
    "title": "Contract",
    "type": "object",
    "description": (
        "A run contract (docs/design.md). Beyond this schema the server checks what JSON Schema "
        "cannot say — every step's role is a key of roles, every role is used, after names "
        "earlier steps and makes no cycle — and answers 400 naming the field if not. A body "
        "whose run_id names an existing run is answered 200 with that run before anything else "
        "in it is read (R3: resubmitting is idempotent)."
    ),
    "required": ["roles", "steps"],
    "additionalProperties": False,
    "properties": {
        "run_id": {
            "anyOf": [{"type": "string", "pattern": ID_PATTERN, "maxLength": 64}, {"type": "null"}],
            "description": "Your id for the run (resubmitting it answers 200); null: generated.",
        },
        "work_id": {"type": "string", "maxLength": 200},
        "roles": {"type": "object", "additionalProperties": _NEEDS},
        "steps": {"type": "array", "minItems": 1, "maxItems": 1000, "items": _STEP},
    },
}
_FRAMEWORK_422 = "#/components/schemas/HTTPValidationError"


def install(app: FastAPI) -> None:
    """Serve the document at ``/openapi.json`` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                description=(app.description or "") + STRINGS,
                routes=app.routes,
            )
            app.openapi_schema = complete(doc)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def complete(doc: dict[str, Any]) -> dict[str, Any]:
    """The derived document without the framework's 422 and with the contract's schema."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Contract"] = CONTRACT
    for item in doc.get("paths", {}).values():
        for op in item.values():
            responses = op.get("responses", {})
            if _FRAMEWORK_422 in str(responses.get("422", {})):
                del responses["422"]
    return doc
