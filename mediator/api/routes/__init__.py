"""The API's routes (docs/design.md §19), one router per resource.

Each route translates HTTP to one call on :class:`mediator.Mediator` and back, and declares what
it answers (its response models and ``responses=``): the OpenAPI document is derived from these
declarations (:mod:`mediator.api.openapi` adds only what cannot be). Routes are numbered as in
design.md §19; 17 is ``/openapi.json`` and 18 the panel, both the app factory's.
"""

from __future__ import annotations

from fastapi import APIRouter

from mediator.api.routes import asks, events, nodes, ops, records, runs, steps

ROUTERS: tuple[APIRouter, ...] = (
    nodes.router,
    steps.router,
    runs.router,
    records.router,
    asks.router,
    events.router,
    ops.router,
)

__all__ = ["ROUTERS"]
