"""Reads: runs, nodes, asks, analytics queries (docs/design.md §19; seed 003 §3–4).

A queued run is read with its ``queue_position`` and ``wait_reason`` (the reject a dry match
against the fleet gives now). Lists read ``observed_at`` first, then the rows (seed 003 §3.2).
Nothing here writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mediator.core import limits
from mediator.core.errors import ContractError, NotFound
from mediator.core.match import TOO_WIDE, Assignment, Reject, match
from mediator.core.rows import Ask, Fleet, FleetNode, Run, RunList
from mediator.core.states import RunState
from mediator.flows.fleet import view

if TYPE_CHECKING:
    from mediator.flows.context import Context

RUN_STATES = frozenset(s.value for s in RunState)


def read_run(ctx: Context, run_id: str) -> Run | None:
    with ctx.store.autocommit() as tx:
        run = tx.get_run(run_id)
        if run is None:
            return None
        steps = tuple(tx.steps(run_id))
        if run.state != RunState.QUEUED:
            return Run(**{**run.__dict__, "steps": steps})
        position = tx.queue_position(run_id)
        contract = tx.live_contract(run_id) or {}
        needs = {r: dict(n) for r, n in (contract.get("roles") or {}).items()}
        fleet = tx.fleet_for(needs)  # the wait reason needs only this run's candidates
    reason = wait_reason(ctx, needs, fleet)
    return Run(
        **{**run.__dict__, "steps": steps, "queue_position": position, "wait_reason": reason}
    )


def wait_reason(
    ctx: Context, needs: dict[str, dict[str, Any]], fleet: Iterable[FleetNode]
) -> dict[str, Any]:
    """A queued run's ``wait_reason``: the reject a dry match against the fleet gives now."""
    adverts, busy, draining = view(fleet)
    res = match(needs, adverts, busy | draining, ctx.config.max_width)
    if not isinstance(res, Reject):
        return {
            "code": "PROMOTABLE",
            "message": "A matching node is free now; the next wake promotes this run.",
        }
    reason = res.as_dict()
    cands = set(reason.get("candidates") or ())
    if res.code == TOO_WIDE:
        # Width, exactly (design.md §4): no assignment of the free nodes fits max_width, but
        # one of every live node does (else submit refused it) — the run waits for the nodes
        # of that one which are busy or draining now, and the reason names them.
        able = match(needs, adverts, (), ctx.config.max_width)
        if isinstance(able, Assignment):
            cands = set(able.nodes())
            waits = sorted(cands & (busy | draining))
            named = ", ".join(waits[:5]) + (f" and {len(waits) - 5} more" if len(waits) > 5 else "")
            reason["message"] = (
                f"Within max_width {ctx.config.max_width} the run needs nodes that are busy or "
                f"draining now ({named}); it waits until they are released."
            )
    reason["busy"] = sorted(cands & busy)
    reason["draining"] = sorted(cands & draining)
    return reason


def require_run(ctx: Context, run_id: str) -> Run:
    run = read_run(ctx, run_id)
    if run is None:
        raise NotFound(f"No run with run_id {run_id!r}.", code="unknown_run")
    return run


def get_run(ctx: Context, run_id: str) -> Run:
    """The run with its steps (and ``queue_position``/``wait_reason`` while QUEUED)."""
    if not isinstance(run_id, str) or not limits.valid_run_id(run_id):
        raise NotFound(f"No run with run_id {run_id!r}.", code="unknown_run")
    return require_run(ctx, run_id)


def list_runs(
    ctx: Context,
    state: str | None = None,
    work_id: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
) -> RunList:
    """Runs newest first (seed 003 §4), with ``observed_at`` read first."""
    if state is not None and state not in RUN_STATES:
        raise ContractError(f"state must be one of {', '.join(sorted(RUN_STATES))}.", field="state")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 1000:
        raise ContractError("limit must be a whole number from 1 to 1000.", field="limit")
    if since is not None and not isinstance(since, datetime):
        raise ContractError("since must be a timestamp.", field="since")
    with ctx.store.autocommit() as tx:  # observed_at first, then the rows (seed 003 §3.2)
        observed = tx.observed_at()
        rows = tx.list_runs(state, work_id, since, limit)
        by_state = tx.run_counts()  # the panel's header (issue 15 §5), lab-wide
        queued = [r.run_id for r in rows if r.state == RunState.QUEUED]
        # Issue 15 §4: position and needs of the whole page in one statement, then one
        # fleet read for all their candidates — never a statement per queued row.
        details = {d.run_id: d for d in tx.queued_details(queued)} if queued else {}
        merged = {f"{i}.{role}": dict(need) for i, d in enumerate(details.values())
                  for role, need in d.needs.items()}  # fmt: skip
        fleet = tx.fleet_for(merged) if details else []
    if details:
        rows = [
            dataclasses.replace(
                r,
                queue_position=details[r.run_id].position,
                wait_reason=wait_reason(ctx, details[r.run_id].needs, fleet),
            )
            if r.run_id in details
            else r
            for r in rows
        ]
    counts = {s.lower(): by_state.get(s, 0) for s in (RunState.QUEUED, RunState.RUNNING)}
    return RunList(observed, tuple(rows), counts)


def list_nodes(ctx: Context, after: str = "", limit: int | None = None) -> Fleet:
    """Live nodes with their lease (seed 003 §3), ``observed_at`` read before the rows.

    Paged like the runs (docs/design.md §19): at most ``limit`` nodes (None: all) in node_id
    order past ``after``; ``next`` is the ``after`` of the next page when this one is full.
    """
    if limit is not None and (
        not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 1000
    ):
        raise ContractError("limit must be a whole number from 1 to 1000.", field="limit")
    if after != "":
        limits.check_node_id(after, "after")  # a node_id cursor: invalid_node_id (issue 29)
    tk = ctx.timekeeper
    if tk is not None:
        tk.settle()  # a stall that just ended is given back first (docs/design.md §13)
    with ctx.store.autocommit() as tx:  # observed_at first, then the rows (seed 003 §3.2)
        mono = tk.monotonic() if tk is not None else 0.0  # with a connection: just before it
        observed = tx.observed_at()
        nodes = tx.list_nodes(after, limit)
    if tk is not None and tk.observe(observed, mono) > 0:
        # The database's clock jumped and the jump was given back just now: the fleet does not
        # look empty for it (docs/design.md §13). Read again.
        with ctx.store.autocommit() as tx:
            observed = tx.observed_at()
            nodes = tx.list_nodes(after, limit)
    full = limit is not None and len(nodes) == limit
    return Fleet(observed, tuple(nodes), nodes[-1].node_id if full else None)


def node_principal(ctx: Context, node_id: str) -> str | None:
    """The principal a node is bound to (None: unknown node) — for authorization only."""
    with ctx.store.autocommit() as tx:
        return tx.node_principal(node_id)


def query(ctx: Context, sql: str, params: Any = None) -> list[dict[str, Any]]:
    """A read-only SQL query (rows as dicts) for analytics: the simulator and notebooks read
    runs, steps and events this way; a write raises MediatorError."""
    return ctx.store.read_only(sql, params)


def ping(ctx: Context) -> bool:
    """The database answers (``/healthz``), within about a second either way."""
    return ctx.store.ping()


def asks(ctx: Context) -> list[Ask]:
    """Open asks, oldest first."""
    with ctx.store.autocommit() as tx:
        return tx.open_asks()
