"""What the flows make of a fleet read: the matcher's view of it, and what an assignment takes.

Submit and promote do the same things in the same order (R12): both lease the assigned nodes
(:func:`lease_rows`) and record what hardware serves each role (:func:`run_acquires`, FR-3), so
both take them from here. Nothing here writes or reads the database.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mediator.core import capabilities
from mediator.core.match import Advert
from mediator.core.rows import FleetNode


def view(fleet: Iterable[FleetNode]) -> tuple[list[Advert], set[str], set[str]]:
    """The matcher's view of a fleet read: adverts, busy nodes, draining nodes."""
    nodes = list(fleet)
    adverts = [Advert(n.node_id, n.capabilities) for n in nodes]
    busy = {n.node_id for n in nodes if n.busy}
    draining = {n.node_id for n in nodes if n.drain}
    return adverts, busy, draining


def _chosen(role_needs: dict[str, Any], node: FleetNode) -> dict[str, Any]:
    """runAcquires' record of what hardware serves a role (FR-3)."""
    return {
        "node": node.node_id,
        "instance": node.instance,
        "matched": capabilities.matched(role_needs, node.capabilities),
    }


def run_acquires(
    assigned: dict[str, str], needs: dict[str, dict[str, Any]], by_id: dict[str, FleetNode]
) -> dict[str, dict[str, Any]]:
    """runAcquires (R12, FR-3): what hardware serves each role, for the steps' ``chosen``."""
    return {role: _chosen(needs[role], by_id[node]) for role, node in assigned.items()}


def lease_rows(assigned: dict[str, str], by_id: dict[str, FleetNode]) -> list[dict[str, str]]:
    """The leases of an assignment in node_id order (docs/design.md §9), with each node's
    daemon instance at grant."""
    return [{"node_id": n, "instance": by_id[n].instance} for n in sorted(set(assigned.values()))]
