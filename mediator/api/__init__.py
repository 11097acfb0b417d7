"""The HTTP API (docs/design.md §19): translates requests and responses, nothing more.

Every route calls :class:`mediator.Mediator`; no flow is re-implemented here. ``create_app`` is
imported on first use, so :mod:`mediator.api.guard` (which the tickets board uses too) can be
imported without the application, its store and its flows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mediator.api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from mediator.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
