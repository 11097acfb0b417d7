"""Mediator: a lab job broker over PostgreSQL.

The public face (docs/design.md §19)::

    from mediator import Mediator, Config
    med = Mediator.connect()           # embedded PostgreSQL, wall clock
    sub = med.submit(contract)         # sub.outcome: Outcome.STARTED, QUEUED, REJECTED, …

Names are imported on first use (PEP 562): ``enode`` and ``runctl`` import ``mediator.client``
and must not pay for — or depend on — the store and psycopg that ``Mediator`` brings in.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Mediator": "mediator.flows",
    "Outcome": "mediator.flows",
    "Submission": "mediator.flows",
    "WakeReport": "mediator.flows",
    "Config": "mediator.config",
    "Ask": "mediator.core.rows",
    "Fleet": "mediator.core.rows",
    "Node": "mediator.core.rows",
    "Run": "mediator.core.rows",
    "RunList": "mediator.core.rows",
    "RunSummary": "mediator.core.rows",
    "Step": "mediator.core.rows",
    "ConfigError": "mediator.core.errors",
    "Conflict": "mediator.core.errors",
    "ContractError": "mediator.core.errors",
    "DuplicateRun": "mediator.core.errors",
    "Forbidden": "mediator.core.errors",
    "MediatorError": "mediator.core.errors",
    "NodeTaken": "mediator.core.errors",
    "NotFound": "mediator.core.errors",
    "PostgresNotInstalled": "mediator.core.errors",
    "DataDirInUse": "mediator.core.errors",
    "StoreUnavailable": "mediator.core.errors",
}

__all__ = [
    "Ask",
    "Config",
    "ConfigError",
    "Conflict",
    "ContractError",
    "DataDirInUse",
    "DuplicateRun",
    "Fleet",
    "Forbidden",
    "Mediator",
    "MediatorError",
    "Node",
    "NodeTaken",
    "NotFound",
    "Outcome",
    "PostgresNotInstalled",
    "Run",
    "RunList",
    "RunSummary",
    "Step",
    "StoreUnavailable",
    "Submission",
    "WakeReport",
    "__version__",
]

if TYPE_CHECKING:
    from mediator.config import Config
    from mediator.core.errors import (
        ConfigError,
        Conflict,
        ContractError,
        DataDirInUse,
        DuplicateRun,
        Forbidden,
        MediatorError,
        NodeTaken,
        NotFound,
        PostgresNotInstalled,
        StoreUnavailable,
    )
    from mediator.core.rows import Ask, Fleet, Node, Run, RunList, RunSummary, Step
    from mediator.flows import Mediator, Outcome, Submission, WakeReport


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mediator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
