"""The HTTP API (docs/design.md §19): translates requests and responses, nothing more.

Every route calls :class:`mediator.Mediator`; no flow is re-implemented here.
"""

from __future__ import annotations

from mediator.api.app import create_app

__all__ = ["create_app"]
