"""Adverts: a node's heartbeat, restart detection and drains (docs/design.md §7.5, §10).

An advert upserts the node and renews its leases in one statement (issue 13). Only when the node
restarted (a new instance) or drains at the step boundary does it look at the node's runs
(:func:`advert_effects`): work lost under an old instance ends its run (FAILED/lost), a drained
node the run still needs ends it (FAILED/drained). It wakes the queue only when something that
frees capacity happened (wakes 4, 6, 7, 9); a steady heartbeat never sweeps (R14).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from mediator.core import limits
from mediator.core.capabilities import validate_capabilities
from mediator.core.errors import ContractError, Forbidden
from mediator.core.progress import drained_at_boundary
from mediator.core.states import TERMINAL_RUN, RunState, StepState, Verdict
from mediator.flows.after import Change
from mediator.flows.steps import end, release
from mediator.flows.wake import Wake

if TYPE_CHECKING:
    from mediator.flows.context import Context

DRAIN_POLICIES = ("", "graceful", "at-boundary")


# ---- adverts -------------------------------------------------------------------------------------
def advert(
    ctx: Context,
    node_id: str,
    capabilities: dict[str, Any],
    instance: str,
    label: str = "",
    drain: str = "",
    principal: str | None = None,
    actions: list[str] | None = None,
) -> float:
    """A node's heartbeat: upsert, renew its lease; wakes only when capacity may have appeared
    — a restart or at-boundary drain released a node (4), a drain lifted (6), the node returned
    (7), its capabilities changed (9); a steady heartbeat never sweeps (R14). Returns
    ``advert_ttl_seconds`` so nodes pace themselves. ``actions``: what the node's daemon offers
    (None: it did not say, so any ``uses`` may run there; docs/design.md §4 "Actions")."""
    limits.check_node_id(node_id)  # 400 invalid_node_id: the node's own name (issue 29)
    caps = validate_capabilities(capabilities)
    limits.check_texts(label=label, instance=instance)  # NUL, surrogates: 400
    if not isinstance(instance, str) or not instance or len(instance) > 128:
        raise ContractError(
            "instance must be a non-empty string of at most 128 characters.", field="instance"
        )
    if not isinstance(label, str) or len(label) > 200:
        raise ContractError("label must be a string of at most 200 characters.", field="label")
    actions = limits.check_actions(actions)
    if drain not in DRAIN_POLICIES:
        raise ContractError("drain must be '', 'graceful' or 'at-boundary'.", field="policy.drain")
    ttl = ctx.config.advert_ttl_seconds
    lease_ttl = ctx.config.lease_ttl_seconds
    tk = ctx.timekeeper
    with ctx.store.autocommit() as tx:  # one statement: upsert and lease renewal (issue 13)
        mono = tk.monotonic() if tk is not None else 0.0  # with a connection: just before it
        prev = tx.upsert_advert(
            node_id, label, principal or "", caps, instance, drain, ttl, lease_ttl, actions
        )
    if prev is None:
        raise Forbidden(f"Node {node_id} belongs to another principal.", code="not_your_node")
    if tk is not None:
        # The new expiry is the database's clock plus the TTL: a reading of that clock for free,
        # so a jump of it is noticed at the first heartbeat after it (docs/design.md §13).
        tk.observe(prev.expires_at - timedelta(seconds=ttl), mono)
    released = False
    if not prev.inserted and (prev.prev_instance != instance or drain == "at-boundary"):
        # (a node advertising for the first time holds no lease to check)
        # Restart detection and at-boundary drains (§7.5); wake 4 if they released a node.
        released = advert_effects(ctx, node_id, instance, drain)
    released_drain = prev.prev_drain != "" and drain == ""
    # Wake 7 (ours): the node was absent (never seen counts) or expired before this advert.
    returned = ctx.config.wake_on_return and not prev.prev_live
    # Wake 9: capabilities differ from the stored ones — capacity can appear that way too
    # (a node that gains a capability is the vanished node's window by another door).
    changed = not prev.inserted and prev.caps_changed
    # Wake 4 (restart/drain settled a run), 6 (drain released), 7, 9 — one sweep for all of
    # them, named by the first that holds. A steady heartbeat (same policy, same capabilities)
    # does none of these: never sweeps (R14).
    wake = (
        Wake.ADVERT_RELEASED if released
        else Wake.DRAIN_LIFTED if released_drain
        else Wake.NODE_RETURNED if returned
        else Wake.CAPABILITIES_CHANGED if changed
        else None
    )  # fmt: skip
    if wake is not None:
        ctx.after(wake=wake)
    return ttl


# ---- advert side effects (restart detection, at-boundary drain) ----------------------------------
def advert_effects(ctx: Context, node_id: str, instance: str, drain: str) -> bool:
    """Restart detection and at-boundary drain for a node's leases; True if anything was
    released (wake 4)."""
    with ctx.store.autocommit() as tx:
        leases = tx.node_leases(node_id)
    released_any = False
    changes = []
    for lease in leases:
        restarted = lease.instance != instance
        if not restarted and drain != "at-boundary":
            continue
        events: list[dict[str, Any]] = []
        with ctx.store.tx() as tx:
            run = tx.get_run(lease.run_id, lock=True)
            if run is None:
                continue
            steps = tx.lock_steps(run.run_id)
            current = {r.node_id: r for r in tx.run_leases(run.run_id)}.get(node_id)
            if current is None:
                continue
            mine = [s for s in steps if s.node_id == node_id]
            released: list[str] = []
            if current.instance != instance:
                old = current.instance
                ran = any(s.attempt > 0 and s.instance == old for s in mine)
                if run.state in TERMINAL_RUN:
                    # A late lease kept for a CLAIMED step whose daemon is gone.
                    tx.skip_steps(run.run_id, [s.seq for s in mine if s.state == StepState.CLAIMED])
                    released = release(tx, run.run_id, [node_id], "restart", events)
                elif ran:
                    # Something ran under the old instance: that work is lost (wake 4).
                    released = end(tx, run, steps, Verdict.LOST, events, gone=[node_id])
                    changes.append(Change(run.run_id, settled=RunState.FAILED))
                else:
                    # Nothing ran there yet: the lease follows the new daemon (ours).
                    tx.rebind_lease(node_id, run.run_id, instance, ctx.config.lease_ttl_seconds)
            elif (
                drain == "at-boundary"
                and run.state == RunState.RUNNING
                # only if the run still needs the node (one it no longer needs was released
                # by applyRelease when its last step ended): the amended rule
                and drained_at_boundary(node_id, steps)
            ):
                released = end(tx, run, steps, Verdict.DRAINED, events)
                changes.append(Change(run.run_id, settled=RunState.FAILED))
            tx.insert_events(events)
        released_any = released_any or bool(released)
    ctx.after(changes)
    return released_any
