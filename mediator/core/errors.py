"""The Mediator's own exceptions.

Every layer above the store sees only these, never a driver type (style: psycopg is imported in one
module, which maps its errors here). Each carries a stable snake_case ``code`` and, where a request
field is to blame, the ``field`` path, so the HTTP layer can answer ``{"error": {code, message,
field}}`` without knowing where the error came from.
"""

from __future__ import annotations


class MediatorError(Exception):
    """Base class. ``status`` is the HTTP status the API answers with."""

    status = 500
    code = "internal"

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code

    def as_dict(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "field": self.field}


class ContractError(MediatorError):
    """A malformed contract or request body (R5: found synchronously at submit). HTTP 400."""

    status = 400
    code = "invalid_contract"


class UnknownAction(MediatorError):
    """A step's ``uses`` that no live node able to fill its role offers (docs/design.md §4
    "Actions"). HTTP 422, like every "no node can serve this contract"; nothing is written, so
    the same submit succeeds once such a node advertises."""

    status = 422
    code = "unknown_action"


class ConfigError(MediatorError):
    """A configuration value that cannot work (docs/design.md §16), naming the setting."""

    status = 400
    code = "invalid_config"


class NotFound(MediatorError):
    """An unknown run, step, node or ask. HTTP 404."""

    status = 404
    code = "not_found"


class Forbidden(MediatorError):
    """The caller may not act on this (another node's step, a stranger's cancel). HTTP 403."""

    status = 403
    code = "forbidden"


class Conflict(MediatorError):
    """The object's state does not allow the request (stale instance or attempt). HTTP 409."""

    status = 409
    code = "conflict"


class TooMany(MediatorError):
    """A per-principal cap on queued work is reached (docs/security.md "Fair under floods"):
    HTTP 429 with ``Retry-After`` (``retry_after`` seconds)."""

    status = 429
    code = "too_many_queued"

    def __init__(self, message: str, *, retry_after: int, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.retry_after = retry_after


class NodeTaken(MediatorError):
    """A lease insert hit a node another transaction holds (R2, R9): treat the node as busy."""

    status = 409
    code = "node_taken"


class DuplicateRun(MediatorError):
    """A run insert hit an existing ``run_id`` (R3): re-read and answer 200."""

    status = 200
    code = "duplicate_run"


class StoreUnavailable(MediatorError):
    """The database cannot be reached or the connection broke. HTTP 503."""

    status = 503
    code = "unavailable"


class StoreBusy(StoreUnavailable):
    """The database answered, but a lock wait, a deadlock or a serialization conflict ended the
    transaction (docs/design.md §13). HTTP 503 as for an outage — the caller tries again — but
    it is no outage: nothing waits for a reconnect, and no time is given back to nodes for it."""


class PostgresNotInstalled(MediatorError):
    """The embedded launcher found no PostgreSQL server binaries."""

    code = "postgres_not_installed"


class DataDirInUse(MediatorError):
    """Another process serves the embedded cluster's data directory already."""

    code = "data_dir_in_use"
