"""Asks: a person answers a question step (docs/design.md §11).

Asks are raised inside the transactions that make them due (submit, promote, a result:
:func:`mediator.flows.steps.progress`) and pushed after commit (R12). An answer moves its step to
PASSED or FAILED and then goes on exactly as a result does: dependants, partial release, settle,
wake 1. The open asks are read in :mod:`mediator.flows.reads`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mediator.core import contract as contract_mod
from mediator.core.errors import Conflict, ContractError, NotFound
from mediator.core.states import RunState, StepState, step_transition
from mediator.flows.steps import OPEN, ReportResult, ev, locked, progress
from mediator.flows.wake import Wake

if TYPE_CHECKING:
    from mediator.flows.context import Context


def answer(
    ctx: Context,
    ask_id: int,
    answer: str,
    ok: bool = True,
    principal: str | None = None,
) -> ReportResult:
    """Answer an ask: its step → PASSED (ok) or FAILED, then as a result (settle, wake 1)."""
    if not isinstance(ask_id, int) or isinstance(ask_id, bool):
        raise ContractError("ask_id must be a whole number.", field="ask_id")
    if not isinstance(answer, str) or len(answer) > 10_000:
        raise ContractError("answer must be text of at most 10000 characters.", field="answer")
    if not isinstance(ok, bool):
        raise ContractError("ok must be true or false.", field="ok")
    events: list[dict[str, Any]] = []
    with ctx.store.tx() as tx:
        found = tx.get_ask(ask_id)
        if found is None:
            raise NotFound(f"No ask with ask_id {ask_id}.", code="unknown_ask")
        run, steps, step = locked(tx, found.run_id, found.seq)
        ask = tx.lock_ask(ask_id)
        if ask is None or ask.closed or step.state != StepState.ASKED:
            raise Conflict(f"Ask {ask_id} is no longer open.", code="ask_closed")
        if run.state != RunState.RUNNING:
            raise Conflict(f"Run {run.run_id} has ended.", code="run_ended")
        state = StepState.PASSED if ok else StepState.FAILED
        tx.finish_step(run.run_id, step.seq, step_transition(step.state, state), answer)
        tx.answer_ask(ask_id, answer, ok, principal or "")
        events.append(ev(run.run_id, "ask_answered", ask_id=ask_id, seq=step.seq, ok=ok))
        if not ok:
            skip = contract_mod.dependants(steps, step.name)  # type: ignore[arg-type]
            tx.skip_steps(run.run_id, [s.seq for s in steps if s.name in skip and s.state in OPEN])
        change = progress(tx, run, events)
        tx.insert_events(events)
    ctx.after([change], Wake.ANSWER)  # wake 1
    return ReportResult(change.settled, False, tuple(change.released), state)
