"""What a route depends on: who is calling, the role it needs, and the app's Mediator.

Authorization is decided here from the caller's principal and role (docs/design.md §14); the
token rules themselves are :mod:`mediator.api.auth`'s. A route names what it needs in its
signature — ``p: Client`` (a client's token, or an admin's), ``p: NodeCaller`` (a node's own
token), ``p: Caller`` (any valid token) — and FastAPI resolves it before the route runs, so an
unauthorized request is refused before its body is read. The checks are ``async``: they read no
database and must not cost a worker thread. A node acting for a node id is checked in the route
(:func:`as_node`), once the id is known: it reads who the node belongs to.
"""

from __future__ import annotations

import os
from typing import Annotated

from fastapi import Depends, Request

from mediator.api.auth import Principal, Tokens
from mediator.api.events import EventFeed
from mediator.api.metrics import Metrics
from mediator.api.schemas import Auth
from mediator.api.waits import WorkWaits
from mediator.core import limits
from mediator.core.errors import Forbidden, NotFound
from mediator.flows import Mediator

PID = str(os.getpid())  # a spawned worker imports this module anew
WORKER = {"X-Mediator-Worker": PID}  # which worker process answered (serve --workers, issue 13)


async def _med(request: Request) -> Mediator:
    med: Mediator = request.app.state.med
    return med


async def _feed(request: Request) -> EventFeed:
    feed: EventFeed = request.app.state.feed
    return feed


async def _waits(request: Request) -> WorkWaits:
    waits: WorkWaits = request.app.state.waits
    return waits


async def _metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


Med = Annotated[Mediator, Depends(_med)]
Feed = Annotated[EventFeed, Depends(_feed)]
Waits = Annotated[WorkWaits, Depends(_waits)]
MetricsOf = Annotated[Metrics, Depends(_metrics)]


async def caller(request: Request, authorization: Auth = None) -> Principal:
    """The principal of the request's bearer token (401 for none or an unknown one)."""
    tokens: Tokens = request.app.state.tokens
    return tokens.resolve(authorization)


Caller = Annotated[Principal, Depends(caller)]


def require(p: Principal, *roles: str) -> None:
    """403 unless the caller has one of ``roles`` (an admin and the development mode have all)."""
    if not (p.dev or p.admin or p.role in roles):
        raise Forbidden(f"This route needs the {' or '.join(roles)} role.", code="wrong_role")


async def client(p: Caller) -> Principal:
    require(p, "client")
    return p


async def node(p: Caller) -> Principal:
    """Node routes need a node token: an admin may cancel and answer but never act as a node
    (issue 11 §11, docs/security.md "Threat model")."""
    if not (p.dev or p.role == "node"):
        raise Forbidden("This route needs a node's own token.", code="wrong_role")
    return p


Client = Annotated[Principal, Depends(client)]
NodeCaller = Annotated[Principal, Depends(node)]


def as_node(med: Mediator, p: Principal, node_id: str) -> None:
    """A node acts only for itself: the principal bound at its first advert (§9). A malformed
    id is 400 ``invalid_node_id`` first, as the flows answer it (issue 29), not "unknown node"."""
    limits.check_node_id(node_id)
    if p.dev:
        return
    owner = med.node_principal(node_id)
    if owner is None:
        raise NotFound(f"No node {node_id!r}; advertise first.", code="unknown_node")
    if owner != p.name:
        raise Forbidden(f"Node {node_id} belongs to another principal.", code="not_your_node")
