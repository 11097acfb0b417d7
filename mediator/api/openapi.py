"""The OpenAPI document as a generated client can trust it (issue 15 §1).

FastAPI derives the document from the routes, but what it derives is not what the server does: it
declares its default ``422 Validation Error`` on every route with parameters, while this server
answers malformed input with 400 and keeps 422 for "no node can serve this contract"; it knows
nothing of the statuses the Mediator raises (401/403 from tokens, 404, 409, 413 from the body
limit, 503 while the database is away), and request fields it sees as bare strings carry rules the
server enforces (ids, drain policies, outcomes). This module rewrites the derived document once,
from the table below, so that

- every status a route can give is listed, each error with the one error shape of docs/design.md;
- every parameter and body field carries its enum, format and bounds;
- the default 422 and its schemas are gone.

``tests/e2e/test_openapi.py`` runs schemathesis with every check against a live server to hold the
document and the server to each other.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.routing import BaseRoute, Route

# The id rule of mediator/core/contract.py (valid_run_id), without a leading dot (docs/security.md:
# ".", ".." and hidden names are refused); the same for node ids.
ID_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$"
RUN_STATES = ["QUEUED", "RUNNING", "PASSED", "FAILED"]
DRAIN_POLICIES = ["", "graceful", "at-boundary"]
OUTCOMES = ["pass", "fail", "retry"]
MAX_EVENT_ID = 2**63 - 1  # events.id is a bigint

ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "description": "Every error answer: never a stack trace, SQL or internal path.",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "field"],
            "additionalProperties": False,
            "properties": {
                "code": {"type": "string", "description": "snake_case, e.g. unknown_run"},
                "message": {"type": "string", "description": "one sentence a person can act on"},
                "field": {
                    "anyOf": [{"type": "string"}, {"type": "null"}],
                    "description": 'the request field to blame, e.g. "steps[2].after"',
                },
            },
        }
    },
}

WHY: dict[int, str] = {
    400: "Malformed request: the message and `field` name what to fix.",
    401: "No bearer token, or one the server does not know (not in --dev mode).",
    403: "The token's role or principal may not do this.",
    404: "No such run, step, node, ask or record file.",
    409: "The state forbids it now (step not claimable, stale attempt, run ended, …).",
    413: "The request body is larger than the server's limit.",
    422: "FAILED: no node in the fleet can ever serve this contract (not a validation error).",
    503: "The Mediator cannot reach its database; try again.",
}

# (method, path) -> the error statuses it can give, beyond its success statuses. 401 is listed
# on every /v1 route: only a --dev server never gives it. 400 wherever parameters or a body
# come in, 413 wherever a body does.
ERRORS: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/nodes"): (400, 401, 403, 413, 503),
    ("get", "/v1/nodes/{node_id}/work"): (400, 401, 403, 404, 503),
    ("post", "/v1/runs/{run_id}/steps/{seq}/claim"): (400, 401, 403, 404, 409, 413, 503),
    ("post", "/v1/runs/{run_id}/steps/{seq}/result"): (400, 401, 403, 404, 409, 413, 503),
    ("post", "/v1/runs"): (400, 401, 403, 413, 503),  # and 422 with the FAILED run (BODIES)
    ("get", "/v1/runs"): (400, 401, 503),
    ("get", "/v1/runs/{run_id}"): (400, 401, 404, 503),
    ("post", "/v1/runs/{run_id}/cancel"): (400, 401, 403, 404, 409, 413, 503),
    ("get", "/v1/runs/{run_id}/record"): (400, 401, 404, 503),
    ("get", "/v1/runs/{run_id}/record/{file}"): (400, 401, 404, 503),
    ("get", "/v1/nodes"): (401, 503),
    ("get", "/v1/asks"): (401, 503),
    ("post", "/v1/asks/{ask_id}/answer"): (400, 401, 403, 404, 409, 413, 503),
    ("get", "/v1/events"): (400, 401, 503),
    ("get", "/metrics"): (),
    ("get", "/healthz"): (),
}

PARAMETERS: dict[str, dict[str, Any]] = {
    # name -> schema, for path and query parameters wherever they appear
    "run_id": {"type": "string", "pattern": ID_PATTERN, "maxLength": 64},
    "node_id": {"type": "string", "pattern": ID_PATTERN, "maxLength": 64},
    "seq": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
    "ask_id": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
    "file": {"type": "string", "minLength": 1, "maxLength": 1024},
    "state": {
        "type": "string",
        "enum": ["", *RUN_STATES],
        "description": "Only runs in this state; empty or absent: every state.",
    },
    "work_id": {"type": "string", "maxLength": 200, "description": "Only runs of this work_id."},
    "since": {
        "type": "string",
        "format": "date-time",
        "description": "Only runs created after this instant (RFC 3339, with its offset).",
    },
    "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
    "dry_run": {"type": "boolean", "default": False},
    "after": {
        "type": "integer",
        "minimum": 0,
        "maximum": MAX_EVENT_ID,
        "description": "Replay the events after this id (as Last-Event-ID does).",
    },
    "Last-Event-ID": {
        "type": "string",
        "pattern": r"^[0-9]{0,18}$",
        "description": "The last event id the client saw; empty counts as absent (SSE).",
    },
}
# Only /v1/events has a limit of its own (events to send before the stream ends).
EVENTS_LIMIT = {"type": "integer", "minimum": 1, "maximum": 1_000_000}

SCALAR = {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}
CAPABILITIES = {
    "type": "object",
    "description": "Capability names to a scalar or a list of scalars (docs/design.md).",
    "propertyNames": {"minLength": 1},
    "additionalProperties": {"anyOf": [*SCALAR["anyOf"], {"type": "array", "items": SCALAR}]},
}
NEEDS = {
    "type": "object",
    "description": "Capability names to the value a node must advertise (true: any value).",
    "propertyNames": {"minLength": 1},
    "additionalProperties": SCALAR,
}
STEP = {
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
CONTRACT = {
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
        "roles": {"type": "object", "additionalProperties": NEEDS},
        "steps": {"type": "array", "minItems": 1, "maxItems": 1000, "items": STEP},
    },
}
# Body models (defined in app.py) -> fields -> the rules the server enforces on them.
BODY_FIELDS: dict[str, dict[str, dict[str, Any]]] = {
    "AdvertBody": {
        "node_id": PARAMETERS["node_id"],
        "label": {"type": "string", "maxLength": 200, "default": ""},
        "capabilities": CAPABILITIES,
        "instance": {"type": "string", "minLength": 1, "maxLength": 128},
    },
    "Policy": {"drain": {"type": "string", "enum": DRAIN_POLICIES, "default": ""}},
    "ClaimBody": {"node_id": PARAMETERS["node_id"]},
    "ResultBody": {
        "node_id": PARAMETERS["node_id"],
        "attempt": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
        "outcome": {"type": "string", "enum": OUTCOMES},
        "log": {"type": "string", "default": ""},
    },
}


# ---- response bodies (the shapes of mediator/core/rows.py's to_dict) ----------------------------
# Open objects (no additionalProperties: false): a field added later is not a broken promise.
TIME = {"type": "string", "format": "date-time"}
MAYBE_TIME = {"type": ["string", "null"], "format": "date-time"}
STRING_LIST = {"type": "array", "items": {"type": "string"}}
RESPONSES: dict[str, dict[str, Any]] = {
    "Reason": {
        "type": "object",
        "description": "Why a run waits or was refused: the matcher's reject (docs/design.md).",
        "required": ["code", "message"],
        "properties": {
            "code": {"type": "string", "description": "e.g. ALL_BUSY, TOO_WIDE, PROMOTABLE"},
            "message": {"type": "string"},
            "role": {"type": "string"},
            "candidates": STRING_LIST,
            "busy": STRING_LIST,
            "draining": STRING_LIST,
        },
    },
    "Step": {
        "type": "object",
        "required": [
            "seq",
            "name",
            "kind",
            "role",
            "uses",
            "with",
            "after",
            "ask",
            "state",
            "node_id",
            "instance",
            "attempt",
            "chosen",
            "started_at",
            "ended_at",
        ],
        "properties": {
            "run_id": {"type": "string"},
            "seq": {"type": "integer", "minimum": 0},
            "name": {"type": "string"},
            "kind": {"type": "string", "enum": ["exec", "ask"]},
            "role": {"type": "string"},
            "uses": {"type": "string"},
            "with": {"type": "object"},
            "after": STRING_LIST,
            "ask": {"type": "string"},
            "state": {
                "type": "string",
                "enum": ["PENDING", "CLAIMED", "ASKED", "PASSED", "FAILED", "SKIPPED"],
            },
            "node_id": {"type": "string", "description": "empty until the run is placed"},
            "instance": {"type": "string"},
            "attempt": {"type": "integer", "minimum": 0},
            "chosen": {
                "type": ["object", "null"],
                "description": "what the match chose for the step (FR-3)",
            },
            "started_at": MAYBE_TIME,
            "ended_at": MAYBE_TIME,
        },
    },
    "Run": {
        "type": "object",
        "description": "A run with its steps; queue_position and wait_reason only while QUEUED.",
        "required": [
            "run_id",
            "work_id",
            "state",
            "verdict",
            "created_at",
            "started_at",
            "ended_at",
            "steps",
        ],
        "properties": {
            "run_id": {"type": "string"},
            "work_id": {"type": "string"},
            "state": {"type": "string", "enum": RUN_STATES},
            "verdict": {
                "type": ["string", "null"],
                "enum": ["pass", "fail", "rejected", "cancelled", "lost", "drained", None],
            },
            "assigned": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "role -> node, once placed",
            },
            "reject": {"$ref": "#/components/schemas/Reason"},
            "submitter": {"type": "string"},
            "created_at": TIME,
            "started_at": MAYBE_TIME,
            "ended_at": MAYBE_TIME,
            "steps": {"type": "array", "items": {"$ref": "#/components/schemas/Step"}},
            "queue_position": {"type": "integer", "minimum": 1},
            "wait_reason": {"$ref": "#/components/schemas/Reason"},
        },
    },
    "DryRun": {
        "type": "object",
        "description": "?dry_run=true: what the match would do now; nothing is created.",
        "required": ["dry_run"],
        "properties": {
            "dry_run": {"type": "boolean", "enum": [True]},
            "assigned": {"type": "object", "additionalProperties": {"type": "string"}},
            "width": {"type": "integer", "minimum": 0},
            "reject": {"$ref": "#/components/schemas/Reason"},
        },
    },
    "RunList": {
        "type": "object",
        "required": ["observed_at", "runs"],
        "properties": {
            "observed_at": TIME,
            "runs": {"type": "array", "items": {"$ref": "#/components/schemas/RunSummary"}},
            "counts": {
                "type": "object",
                "description": "Lab-wide, not filtered like runs (issue 15 §5).",
                "properties": {
                    "queued": {"type": "integer", "minimum": 0},
                    "running": {"type": "integer", "minimum": 0},
                },
            },
        },
    },
    "RunSummary": {
        "type": "object",
        "description": "A row of the list: current lists the CLAIMED steps; while QUEUED, the "
        "queue_position and wait_reason GET /v1/runs/{run_id} would give (issue 15 §4).",
        "required": [
            "run_id",
            "state",
            "verdict",
            "work_id",
            "created_at",
            "started_at",
            "ended_at",
            "assigned",
            "reject",
            "current",
        ],
        "properties": {
            "run_id": {"type": "string"},
            "state": {"type": "string", "enum": RUN_STATES},
            "verdict": {"type": ["string", "null"]},
            "work_id": {"type": "string"},
            "created_at": TIME,
            "started_at": MAYBE_TIME,
            "ended_at": MAYBE_TIME,
            "assigned": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
            "reject": {"anyOf": [{"$ref": "#/components/schemas/Reason"}, {"type": "null"}]},
            "current": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["node", "step", "attempt", "started_at"],
                    "properties": {
                        "node": {"type": "string"},
                        "step": {"type": "string"},
                        "attempt": {"type": "integer"},
                        "started_at": MAYBE_TIME,
                    },
                },
            },
            "queue_position": {"type": "integer", "minimum": 1},
            "wait_reason": {"$ref": "#/components/schemas/Reason"},
        },
    },
    "Fleet": {
        "type": "object",
        "required": ["observed_at", "nodes"],
        "properties": {
            "observed_at": TIME,
            "nodes": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": [
                        "node_id",
                        "label",
                        "instance",
                        "capabilities",
                        "seen_at",
                        "expires_at",
                        "drain",
                        "lease",
                    ],
                    "properties": {
                        "node_id": {"type": "string"},
                        "label": {"type": "string"},
                        "instance": {"type": "string"},
                        "capabilities": {"type": "object"},
                        "seen_at": TIME,
                        "expires_at": TIME,
                        "drain": {"type": "string", "enum": DRAIN_POLICIES},
                        "lease": {
                            "anyOf": [
                                {"type": "null"},
                                {
                                    "type": "object",
                                    "required": ["run_id", "not_after"],
                                    "properties": {"run_id": {"type": "string"}, "not_after": TIME},
                                },
                            ]
                        },
                    },
                },
            },
        },
    },
    "Asks": {
        "type": "object",
        "required": ["asks"],
        "properties": {
            "asks": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["ask_id", "run_id", "seq", "question", "raised_at"],
                    "properties": {
                        "ask_id": {"type": "integer"},
                        "run_id": {"type": "string"},
                        "seq": {"type": "integer"},
                        "question": {"type": "string"},
                        "raised_at": TIME,
                    },
                },
            }
        },
    },
    "StepResult": {
        "type": "object",
        "required": ["settled", "rolled", "released", "step_state"],
        "properties": {
            "settled": {"type": "string", "description": "the run's end state, or empty"},
            "rolled": {"type": "boolean"},
            "released": STRING_LIST,
            "step_state": {"type": "string"},
        },
    },
    "Work": {
        "type": "object",
        "required": ["steps"],
        "properties": {"steps": {"type": "array", "items": {"$ref": "#/components/schemas/Step"}}},
    },
    "Health": {
        "type": "object",
        "description": "ok, or unavailable while the database is out of reach (503).",
        "required": ["status", "database"],
        "properties": {
            "status": {"type": "string", "enum": ["ok", "unavailable"]},
            "database": {"type": "string", "enum": ["ok", "unreachable"]},
            "unsealed": {"type": "integer", "minimum": 0},
            "unopened": {"type": "integer", "minimum": 0},
        },
    },
    "AdvertAnswer": {
        "type": "object",
        "required": ["advert_ttl_seconds"],
        "properties": {"advert_ttl_seconds": {"type": "number", "exclusiveMinimum": 0}},
    },
}
# (method, path) -> status -> the schema of its JSON body
BODIES: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("post", "/v1/nodes"): {"200": {"$ref": "#/components/schemas/AdvertAnswer"}},
    ("get", "/v1/nodes/{node_id}/work"): {"200": {"$ref": "#/components/schemas/Work"}},
    ("post", "/v1/runs/{run_id}/steps/{seq}/claim"): {"200": {"$ref": "#/components/schemas/Step"}},
    ("post", "/v1/runs/{run_id}/steps/{seq}/result"): {
        "200": {"$ref": "#/components/schemas/StepResult"}
    },
    ("post", "/v1/runs"): {
        "200": {
            "anyOf": [{"$ref": "#/components/schemas/Run"}, {"$ref": "#/components/schemas/DryRun"}]
        },
        "201": {"$ref": "#/components/schemas/Run"},
        "202": {"$ref": "#/components/schemas/Run"},
        "422": {"$ref": "#/components/schemas/Run"},
    },
    ("get", "/v1/runs"): {"200": {"$ref": "#/components/schemas/RunList"}},
    ("get", "/v1/runs/{run_id}"): {"200": {"$ref": "#/components/schemas/Run"}},
    ("post", "/v1/runs/{run_id}/cancel"): {"200": {"$ref": "#/components/schemas/Run"}},
    ("get", "/v1/nodes"): {"200": {"$ref": "#/components/schemas/Fleet"}},
    ("get", "/v1/asks"): {"200": {"$ref": "#/components/schemas/Asks"}},
    ("get", "/healthz"): {
        "200": {"$ref": "#/components/schemas/Health"},
        "503": {"$ref": "#/components/schemas/Health"},
    },
    ("post", "/v1/asks/{ask_id}/answer"): {"200": {"$ref": "#/components/schemas/StepResult"}},
}
SUCCESS = {
    "503": "The database is out of reach.",
    "200": "OK",
    "201": "RUNNING: placed at once",
    "202": "QUEUED: it waits for a node (queue_position, wait_reason)",
}


STRINGS = (
    "\n\nEvery string in a request is UTF-8 text without NUL (U+0000) and without lone "
    "surrogates: neither can be stored, and either is refused with 400 (docs/security.md)."
)


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


def install(app: FastAPI) -> None:
    """Serve the corrected document at ``/openapi.json`` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                description=(app.description or "") + STRINGS,
                routes=app.routes,
            )
            app.openapi_schema = correct(doc)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def correct(doc: dict[str, Any]) -> dict[str, Any]:
    """The derived document with the statuses, parameters and bodies the server really has."""
    doc = copy.deepcopy(doc)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Error"] = ERROR_SCHEMA
    schemas["Contract"] = CONTRACT
    schemas.update(copy.deepcopy(RESPONSES))
    for model, fields in BODY_FIELDS.items():
        props = schemas.get(model, {}).get("properties", {})
        for name, rule in fields.items():
            if name in props:
                title = props[name].get("title")
                props[name] = {**rule, **({"title": title} if title else {})}
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            _correct_operation(method, path, op)
    return doc


def _correct_operation(method: str, path: str, op: dict[str, Any]) -> None:
    responses = op.setdefault("responses", {})
    default_422 = responses.get("422", {})
    if "HTTPValidationError" in str(default_422):
        del responses["422"]
    for status_code, schema in BODIES.get((method, path), {}).items():
        default = SUCCESS.get(status_code) or WHY[int(status_code)]
        answer = responses.setdefault(status_code, {"description": default})
        if status_code == "422":  # the FAILED run itself, not the framework's validation error
            answer["description"] = WHY[422]
        answer["content"] = {"application/json": {"schema": schema}}
    for status in ERRORS.get((method, path), ()):
        responses[str(status)] = {
            "description": WHY[status],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    for param in op.get("parameters", []):
        name = param["name"]
        if path == "/v1/events" and name == "limit":
            rule: dict[str, Any] | None = EVENTS_LIMIT
        else:
            rule = PARAMETERS.get(name)
        if rule is not None:
            param["schema"] = dict(rule)
            if "description" in rule:
                param["description"] = rule["description"]
    if (method, path) == ("post", "/v1/runs"):
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Contract"}}},
        }
