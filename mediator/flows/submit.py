"""Submit: the existing run first (R3), parse, match, one of three create paths (design.md §5).

A run that can start now is created RUNNING with its leases (CreateRun, :func:`create_run`); one
that has no room now is created QUEUED holding nothing (R1, R2, R4, :func:`create_queued_run`)
and sweeps once (R17, wake 8); one that no node could ever serve is created FAILED/rejected
(R1, :func:`create_rejected_run`). Each is one statement (issue 13); what an assignment takes
(``run_acquires``, ``lease_rows``) is shared with promotion (R12) in :mod:`mediator.flows.fleet`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from mediator.core import contract as contract_mod
from mediator.core import limits
from mediator.core.errors import ContractError, NodeTaken, TooMany
from mediator.core.match import ALL_BUSY, TOO_WIDE, Assignment, Reject, match, search_budget
from mediator.core.rows import FleetNode, Run
from mediator.core.states import RunState, StepState, Verdict, run_transition, step_transition
from mediator.flows import gaps, reads
from mediator.flows.after import Change
from mediator.flows.fleet import lease_rows, run_acquires, view
from mediator.flows.wake import Wake
from mediator.store.tx import SubmitRead

if TYPE_CHECKING:
    from mediator.flows.context import Context


class Outcome(StrEnum):
    """What a submit did (docs/design.md §5). The flows say what happened; a caller that wants a
    number makes one (the HTTP API: 201, 202, 200, 200, 422 in this order)."""

    STARTED = "started"  # created RUNNING with its leases
    QUEUED = "queued"  # created QUEUED, holding nothing (R1, R2, R4)
    EXISTING = "existing"  # the run_id exists: its run, nothing written (R3)
    DRY_RUN = "dry_run"  # what the match would do now; nothing written
    REJECTED = "rejected"  # created FAILED/rejected: no node could ever serve it (R1)


@dataclass(frozen=True)
class Submission:
    """What ``submit`` answers: its outcome and the run as committed (or the dry-run body)."""

    outcome: Outcome
    run: Run | None
    dry_run: dict[str, Any] | None = None

    def body(self) -> dict[str, Any]:
        if self.dry_run is not None:
            return self.dry_run
        assert self.run is not None
        return self.run.to_dict()


@dataclass(frozen=True)
class _NewRun:
    """A submitted run on its way into the database: what every submit path writes."""

    run_id: str
    parsed: contract_mod.Contract
    doc: dict[str, Any]
    needs: dict[str, dict[str, Any]]
    key: str
    submitter: str


def _too_wide(res: Assignment | Reject) -> bool:
    return isinstance(res, Reject) and res.code == TOO_WIDE


# ---- submit (docs/design.md §5) ------------------------------------------------------------------
def submit(
    ctx: Context,
    contract: dict[str, Any],
    principal: str | None = "cli",
    dry_run: bool = False,
    *,
    capped: bool = False,
) -> Submission:
    """Submit a run: started (RUNNING), queued, existing (R3) or dry run, rejected (FAILED).

    ``capped``: the principal's queued work is capped (docs/security.md "Fair under floods"):
    a run that would be queued past ``max_queued_runs_per_principal`` QUEUED runs, or in a new
    needs class past ``max_queued_classes_per_principal``, is refused. The HTTP API caps every
    caller; in-process callers (the simulator, tools) are the operator's own code.

    Raises:
        ContractError: the contract is malformed (400); nothing is written.
        UnknownAction: a step's plugin ``uses`` is offered by no live node able to fill its role
            (422, docs/design.md §4 "Actions"); nothing is written.
        TooMany: ``capped`` and a cap is reached (429 with Retry-After); nothing is written.
    """
    # R3, NFR-I7: an existing run_id is answered with its run before anything else counts —
    # its contract's checks included. The existence check rides on the fleet read (one read per
    # submit, issue 13); parsing writes and reads nothing, so parsing first changes no answer:
    # a contract that does not parse is answered by the existing run all the same.
    given = contract.get("run_id") if isinstance(contract, dict) else None
    if not (isinstance(given, str) and limits.valid_run_id(given)):
        given = None
    try:
        parsed = contract_mod.parse(contract)  # R5: structure checked synchronously
    except ContractError:
        existing = reads.read_run(ctx, given) if given is not None else None
        if existing is not None:
            return Submission(Outcome.EXISTING, existing)
        raise
    needs = {role: dict(n) for role, n in parsed.roles.items()}
    key = contract_mod.needs_key(needs)
    max_width = ctx.config.max_width
    too_costly = search_budget(needs, max_width)  # the width search's budget (§4, security.md)
    if too_costly is not None:
        existing = reads.read_run(ctx, given) if given is not None else None
        if existing is not None:
            return Submission(Outcome.EXISTING, existing)  # R3 first, as for a bad contract
        raise ContractError(too_costly, field="roles", code="width_search_too_large")
    gaps.settle(ctx)  # a stall that just ended is given back before the fleet is read (§13)
    counted = principal or "" if capped and not dry_run else None
    with ctx.store.autocommit() as tx:  # only nodes that might serve it; the caps' counts
        read = tx.submit_read(needs, given, counted, key)
    exists, fleet = read.exists, read.fleet
    if exists:
        assert given is not None
        existing = reads.read_run(ctx, given)
        if existing is not None:
            return Submission(Outcome.EXISTING, existing)

    # docs/design.md §4 "Actions": a plugin `uses` that no live node able to fill the step's
    # role offers is refused now (422, nothing written) rather than failing on the node after
    # the caller left — unless such a node expired only inside a recent gap (§13).
    unoffered = contract_mod.unoffered_action(parsed, ((n.capabilities, n.actions) for n in fleet))
    if unoffered is not None and gaps.may_return(ctx, needs) is None:
        raise unoffered

    if dry_run:
        adverts, busy, _ = view(fleet)
        # NFR-I6: unavailable = busy only, so the answer does not change when nodes drain.
        dry = match(needs, adverts, busy, max_width)
        if isinstance(dry, Assignment):
            body = {"dry_run": True, "assigned": dict(dry.roles), "width": dry.width}
        else:
            body = {"dry_run": True, "reject": dry.as_dict()}
        return Submission(Outcome.DRY_RUN, None, body)

    run_id = parsed.run_id or ctx.new_run_id()
    doc = dict(parsed.doc)
    doc["run_id"] = run_id
    submitter = principal or ""

    new = _NewRun(run_id, parsed, doc, needs, key, submitter)
    if ctx.after_fleet_read is not None:
        ctx.after_fleet_read(run_id)
    adverts, busy, draining = view(fleet)
    res: Assignment | Reject | None = match(needs, adverts, busy | draining, max_width)
    if isinstance(res, Reject) and res.code in (ALL_BUSY, TOO_WIDE):
        # R1, R10, design.md §4 "Width, exactly": the matcher's TOO_WIDE is exact — no
        # assignment of the available nodes fits. The run is refused only if no assignment
        # of every live node (busy or not) fits either; otherwise it waits in the queue until
        # the nodes of such an assignment are released, and its wait reason names them. And
        # the converse: a run that is ALL_BUSY now but fits no assignment of every live node
        # could never be promoted, so it is refused now rather than after nodes free up.
        # Either way the answer does not depend on which nodes happen to be busy.
        free = match(needs, adverts, set(), max_width)
        res = free if _too_wide(free) else None

    if isinstance(res, Assignment):
        try:
            run = create_run(ctx, new, res, fleet)
        except NodeTaken:
            res = None  # R2: the same as ALL_BUSY; the transaction rolled back whole
        else:
            if run is None:
                return Submission(Outcome.EXISTING, reads.require_run(ctx, run_id))
            ctx.after.open_record(run_id, doc)
            return Submission(Outcome.STARTED, run)

    # Time you can trust (docs/design.md §13): never refused for good while a node able to
    # serve the run expired only inside a recent stall, clock jump or outage — queued instead.
    waiting = gaps.may_return(ctx, needs) if isinstance(res, Reject) else None
    if waiting is not None:
        res = None

    if res is None:  # ALL_BUSY (R1), NodeTaken (R2), or TOO_WIDE only for now (R10)
        if counted is not None:
            _within_caps(ctx, read)
        run = create_queued_run(ctx, new)
        if run is None:
            return Submission(Outcome.EXISTING, reads.require_run(ctx, run_id))
        ctx.after.open_record(run_id, doc)
        if waiting is not None:
            run = replace(run, wait_reason=waiting)
        if ctx.missed_wake_guard:
            # R17 (ours): a release that committed between our fleet read and this insert
            # swept before the row was visible; sweep once more so the run does not wait
            # beside a free node. The answer still shows the run as committed. The sweep
            # stops at its first read when no waiting class could use the nodes free then
            # (docs/design.md R17 "The guard's first read").
            ctx.after(wake=Wake.QUEUED_SUBMIT, guard=True)
        return Submission(Outcome.QUEUED, run)

    # NO_CANDIDATE, or TOO_WIDE even with every node free: permanent (R1) → FAILED, rejected.
    assert isinstance(res, Reject)  # an Assignment returned above, None was queued
    run = create_rejected_run(ctx, new, res)
    if run is None:
        return Submission(Outcome.EXISTING, reads.require_run(ctx, run_id))
    ctx.after.open_record(run_id, doc)
    ctx.after([Change(run_id, settled=RunState.FAILED)])
    return Submission(Outcome.REJECTED, run)


RETRY_AFTER_S = 10  # what a capped principal is told to wait (docs/security.md)


def _within_caps(ctx: Context, read: SubmitRead) -> None:
    """Fair under floods (docs/security.md): refuse a run that would queue past its principal's
    caps. The counts come from the submit's fleet read; submits racing each other may pass it
    together, so a principal can overshoot a cap by its submits in flight, never by more."""
    runs_cap = ctx.config.max_queued_runs_per_principal
    classes_cap = ctx.config.max_queued_classes_per_principal
    if read.queued >= runs_cap:
        raise TooMany(
            f"You have {read.queued} runs QUEUED, the most one principal may queue "
            f"(max_queued_runs_per_principal {runs_cap}); retry when some have started.",
            retry_after=RETRY_AFTER_S,
        )
    if not read.has_class and read.classes >= classes_cap:
        raise TooMany(
            f"Your QUEUED runs already span {read.classes} distinct needs classes, the most one "
            f"principal may queue (max_queued_classes_per_principal {classes_cap}); queue runs "
            "whose roles need the same as a queued run, or retry when some have started.",
            field="roles",
            retry_after=RETRY_AFTER_S,
        )


def step_rows(
    parsed: contract_mod.Contract,
    state: str,
    assigned: dict[str, str] | None,
    chosen: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    return [
        {
            "seq": s.seq,
            "name": s.name,
            "kind": s.kind,
            "role": s.role,
            "uses": s.uses,
            "with": dict(s.with_),
            "after": list(s.after),
            "ask": s.ask,
            "state": state,
            "node_id": (assigned or {}).get(s.role, "") if s.kind == "exec" else "",
            "chosen": (chosen or {}).get(s.role) if s.kind == "exec" else None,
        }
        for s in parsed.steps
    ]


def create_run(ctx: Context, new: _NewRun, res: Assignment, fleet: list[FleetNode]) -> Run | None:
    """CreateRun in R12's order — leases, runAcquires, raiseAsks, events — as one statement
    (issue 13); None if the run_id exists (R3). NodeTaken (R2) leaves nothing written."""
    assigned = dict(res.roles)
    by_id = {n.node_id: n for n in fleet}
    leases = lease_rows(assigned, by_id)
    events = [
        {"kind": "submitted", "data": {"state": "RUNNING", "assigned": assigned}},
        *({"node_id": x["node_id"], "kind": "lease_granted", "data": {}} for x in leases),
    ]
    return create(
        ctx,
        new,
        RunState.RUNNING,
        StepState.PENDING,
        events,
        assigned=assigned,
        chosen=run_acquires(assigned, new.needs, by_id),
        leases=leases,
        raise_asks=any(s.kind == "ask" for s in new.parsed.steps),
    )


def create(
    ctx: Context,
    new: _NewRun,
    state: RunState,
    step_state: StepState,
    events: list[dict[str, Any]],
    *,
    verdict: Verdict | None = None,
    assigned: dict[str, str] | None = None,
    chosen: dict[str, dict[str, Any]] | None = None,
    reject: dict[str, Any] | None = None,
    leases: list[dict[str, str]] | None = None,
    raise_asks: bool = False,
) -> Run | None:
    """A submit's write as one autocommit statement (issue 13): needs class, run, steps,
    leases, events; the run as committed, or None if the run_id exists (R3). NodeTaken
    (R2) leaves nothing written. ``state`` and ``step_state`` are edges from no row.

    With ``raise_asks`` (a RUNNING run whose contract has ask steps) raiseAsks follows in the
    same transaction: an ask step is raised PENDING → ASKED, never inserted ASKED (the state
    table has no such edge), and a statement cannot update the rows it inserts. The asks are
    published after the commit (R12)."""
    run_transition(None, state)
    step_transition(None, step_state)
    write: dict[str, Any] = {
        "run": {
            "run_id": new.run_id,
            "work_id": new.parsed.work_id,
            "state": state,
            "verdict": verdict,
            "contract": new.doc,
            "needs_key": new.key,
            "assigned": assigned,
            "reject": reject,
            "submitter": new.submitter,
        },
        "needs": new.needs,
        "steps": step_rows(new.parsed, step_state, assigned, chosen),
        "leases": leases or [],
        "events": events,
        "ttl_s": ctx.config.lease_ttl_seconds,
    }
    if not raise_asks:
        with ctx.store.autocommit() as tx:
            return tx.create_run(**write)
    with ctx.store.tx() as tx:
        run = tx.create_run(**write)
        asks = tx.raise_asks(new.run_id) if run is not None else []
    if run is None or not asks:
        return run
    # The answer is the run as committed: the raised steps as raiseAsks left them.
    raised = {a.seq: a.raised_at for a in asks}
    steps = tuple(
        replace(s, state=step_transition(s.state, StepState.ASKED), started_at=raised[s.seq])
        if s.seq in raised
        else s
        for s in run.steps
    )
    ctx.after([Change(new.run_id, asks=asks)])
    return replace(run, steps=steps)


def create_queued_run(ctx: Context, new: _NewRun) -> Run | None:
    """CreateQueuedRun: QUEUED, every step PENDING with node_id '', nothing held (R4, R5).
    The answer is the run exactly as committed."""
    events = [{"kind": "submitted", "data": {"state": "QUEUED"}}]
    return create(ctx, new, RunState.QUEUED, StepState.PENDING, events)


def create_rejected_run(ctx: Context, new: _NewRun, res: Reject) -> Run | None:
    """R1: no node could ever serve it (or too wide at t=0) → FAILED/rejected, steps SKIPPED."""
    reject = res.as_dict()
    events = [{"kind": "rejected", "data": {"reject": reject}}]
    return create(
        ctx,
        new,
        RunState.FAILED,
        StepState.SKIPPED,
        events,
        verdict=Verdict.REJECTED,
        reject=reject,
    )
