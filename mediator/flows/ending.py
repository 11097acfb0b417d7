"""Ending runs early: cancel and the reaper (docs/design.md §10).

Cancel ends a QUEUED or RUNNING run as FAILED/cancelled and always wakes (wake 2). The reaper
releases expired leases, ends their RUNNING runs as FAILED/lost, seals what a crash or a failing
records folder left unsealed, retries records that could not be opened, and wakes only if it
released something (R14, wake 3). Both end runs with :func:`mediator.flows.steps.end`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mediator.core.errors import Forbidden, NotFound
from mediator.core.rows import Run
from mediator.core.states import TERMINAL_RUN, RunState, Verdict
from mediator.flows import reads
from mediator.flows.after import Change
from mediator.flows.steps import end, ev
from mediator.flows.wake import Wake

if TYPE_CHECKING:
    from mediator.flows.context import Context


@dataclass
class ReapReport:
    """One reaper pass: leases it released, runs it ended as lost, records it sealed."""

    released: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    sealed: list[str] = field(default_factory=list)
    woke: bool = False


# ---- cancel (docs/design.md §10) -----------------------------------------------------------------
def cancel(ctx: Context, run_id: str, principal: str | None = None, *, admin: bool = False) -> Run:
    """QUEUED or RUNNING → FAILED/cancelled; a terminal run is a no-op. Always wakes (wake 2).

    ``principal=None`` is an in-process caller (trusted); otherwise only the submitter or an
    admin may cancel (403).
    """
    changed = False
    with ctx.store.tx() as tx:
        run = tx.get_run(run_id, lock=True)
        if run is None:
            raise NotFound(f"No run with run_id {run_id!r}.", code="unknown_run")
        if principal is not None and not admin and principal != run.submitter:
            raise Forbidden(
                "Only the submitter or an admin may cancel this run.", code="not_your_run"
            )
        if run.state not in TERMINAL_RUN:
            events = [ev(run_id, "cancelled", by=principal or "")]
            steps = tx.lock_steps(run_id)
            end(tx, run, steps, Verdict.CANCELLED, events)
            tx.insert_events(events)
            changed = True
    # wake 2: always, after sealing what the cancel settled
    ctx.after([Change(run_id, settled=RunState.FAILED)] if changed else [], Wake.CANCEL)
    return reads.get_run(ctx, run_id)


# ---- reaper (docs/design.md §10) -----------------------------------------------------------------
def reap(ctx: Context) -> ReapReport:
    """One reaper pass: expired leases released, their RUNNING runs FAILED/lost, unsealed
    terminal runs sealed. Wakes only if it released something (R14, wake 3)."""
    report = ReapReport()
    if ctx.store.reconnecting():
        # The database is back from an outage, or about to be, and the outage is not given
        # back to adverts and leases yet (docs/design.md §13, wake 5): every lease it expired
        # would be reaped for it. The next pass, after the give-back, reaps what is really gone.
        return report
    if ctx.timekeeper is not None:
        # Time you can trust (docs/design.md §13): a stall that just ended, or a jump of the
        # database's clock since the last pass, is given back before anything is reaped for it.
        ctx.timekeeper.settle()
        if ctx.timekeeper.pending_s() is not None:
            return report  # a stall not given back yet (its give-back failed): as above
        ctx.timekeeper.read_clock()
    with ctx.store.autocommit() as tx:
        candidates = tx.expired_lease_runs()
    changes = []
    for run_id in candidates:
        events: list[dict[str, Any]] = []
        with ctx.store.tx() as tx:
            run = tx.get_run(run_id, lock=True)
            if run is None:
                continue
            steps = tx.lock_steps(run_id)
            expired = tx.delete_expired_leases(run_id)  # re-checked under the run lock
            if not expired:
                continue
            events += [ev(run_id, "lease_released", n, reason="expired") for n in expired]
            released = list(expired)
            if run.state == RunState.RUNNING:
                released += end(tx, run, steps, Verdict.LOST, events, gone=expired)
                report.lost.append(run_id)
                changes.append(Change(run_id, settled=RunState.FAILED))
            tx.insert_events(events)
        report.released += released
    ctx.after(changes)
    # Record work left over (a crash between commit and seal, or a records folder that
    # refused a write) never stops the wake below: each seal is isolated (issue 11 §6).
    report.sealed = ctx.after.seal_unsealed()
    ctx.after.retry_unopened()
    if report.released:
        report.woke = True
        ctx.after(wake=Wake.REAP)  # wake 3
    return report
