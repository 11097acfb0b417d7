"""``enode``: the node daemon that serves a Mediator over HTTP (docs/design.md §19).

It advertises a node's capabilities, polls its work, claims steps, runs them through actions and
reports the results. It never imports the store or the API (architecture.md); an action plugin needs
only :class:`Context`, :class:`Outcome` and :class:`Retry` from here.
"""

from __future__ import annotations

from mediator.enode.actions import Context, Outcome, Retry
from mediator.enode.daemon import Daemon

__all__ = ["Context", "Daemon", "Outcome", "Retry"]
