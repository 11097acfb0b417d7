"""Mediator: a lab job broker over PostgreSQL.

The public face (api.md §6)::

    from mediator import Mediator, Config
    med = Mediator.connect()           # embedded PostgreSQL, wall clock
    sub = med.submit(contract)         # sub.status: 201 / 202 / 200 / 422
"""

from __future__ import annotations

from mediator.config import Config
from mediator.errors import (
    ConfigError,
    Conflict,
    ContractError,
    DuplicateRun,
    Forbidden,
    MediatorError,
    NodeTaken,
    NotFound,
    PostgresNotInstalled,
    StoreUnavailable,
)
from mediator.flows import Mediator, Submission, WakeReport
from mediator.rows import Ask, Fleet, Node, Run, RunList, RunSummary, Step

__version__ = "0.1.0"

__all__ = [
    "Ask",
    "Config",
    "ConfigError",
    "Conflict",
    "ContractError",
    "DuplicateRun",
    "Fleet",
    "Forbidden",
    "Mediator",
    "MediatorError",
    "Node",
    "NodeTaken",
    "NotFound",
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
