"""Does the scheduler gate cover every rule? (issue 24): break each rule on purpose and see which
recorded case notices.

A gate that passes a scheduling change gives the reviewer confidence it has not earned. So each
rule of docs/design.md that decides *who runs where and when* has a **plant** here: a one-line
breakage of the real Mediator (the matcher takes another node, a retried step gets one attempt
fewer, partial release is off, the drain kinds are swapped, wake N never sweeps, …), applied by
monkeypatching inside the process that runs a case — the product's code is never edited.
``python -m sim coverage --baseline DIR`` runs every plant against the baseline's cases
(``sim.outputs.gate.check_case``), and prints a table: rule → the case that caught the plant,
with its first divergence → or "not exercised". Exit 1 when a rule is not exercised (unless
``--allow``-ed, for documented exceptions), 2 when the gate could not run.

Per plant the cases run cheapest first and stop at the first that diverges (``--all-cases``:
every case, to list all that catch it); plants run side by side in ``--jobs`` processes.
Where each plant's rule lives: docs/architecture.md "Where each rule lives"; the table's
meaning: README "The scheduler gate".
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import dataclasses
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.outputs.gate import (
    BaselineError,
    Job,
    Outcome,
    check_case,
    find_cases,
    load_case,
    seconds,
)
from sim.parallel import spawn_pool
from sim.platform.core import EventQueue, to_us


@dataclass(frozen=True)
class Plant:
    """One rule broken on purpose: ``rule`` (a docs/design.md id or name), what the breakage
    does, and ``apply`` — a context manager that installs it in this process."""

    id: str
    rule: str
    what: str
    apply: Callable[[], contextlib.AbstractContextManager[None]]


@contextlib.contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    """``target.name = value`` for the duration (the product's module or class, in this
    process only)."""
    missing = object()
    old = vars(target).get(name, missing)  # a builtin (``min``) is not the module's own
    setattr(target, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(target, name)
        else:
            setattr(target, name, old)


# ---- the plants ---------------------------------------------------------------------------------
# Each is the smallest change that breaks its rule; all patch the name where it is *looked up*
# (``mediator.flows.steps.decide_result``, not ``mediator.core.progress.decide_result``).


def _no_fold_count() -> contextlib.AbstractContextManager[None]:
    """§4 step 4: a candidate's count of later roles it serves is ignored (node_id only)."""
    import mediator.core.match as m

    return _patched(m, "_count_serving", lambda _node, _later: 0)


def _last_candidate() -> contextlib.AbstractContextManager[None]:
    """§4 step 4: among equally good candidates the matcher takes the highest node_id."""
    import mediator.core.match as m

    def pick(items: Any, **kwargs: Any) -> Any:
        if kwargs:  # the exact width search's own min(..., key=...): untouched
            return builtins.min(items, **kwargs)
        ranked = list(items)
        best = min(t[0] for t in ranked)
        return max(t for t in ranked if t[0] == best)

    return _patched(m, "min", pick)  # the module-level name step 4 calls


def _no_reuse() -> contextlib.AbstractContextManager[None]:
    """§4 step 3: a role some chosen node serves is not folded onto it; step 4 picks afresh
    (the width is still counted per choice)."""
    import mediator.core.match as m

    def first(items: Any, *default: Any) -> Any:
        if default:  # step 3's next(..., None) over the chosen nodes: "none serves it"
            return default[0]
        return builtins.next(items)  # the exact search's own next(...): untouched

    return _patched(m, "next", first)


def _exact_order_flipped() -> contextlib.AbstractContextManager[None]:
    """§4 "Width, exactly": the exact search tries, per role, the candidates serving *fewer*
    later roles first (step 4's order turned round; ties still by node_id), so among narrowest
    assignments that tie it returns another."""
    import mediator.core.match as m

    def flipped(items: Any, *, key: Any = None, reverse: bool = False) -> Any:
        if key is not None and isinstance(items, types.GeneratorType):  # the order per role
            return builtins.sorted(items, key=lambda x: (-key(x)[0], *key(x)[1:]), reverse=reverse)
        return builtins.sorted(items, key=key, reverse=reverse)

    return _patched(m, "sorted", flipped)


def _greedy_width() -> contextlib.AbstractContextManager[None]:
    """§4 "Width, exactly": no exact search; a greedy choice wider than max_width is TOO_WIDE."""
    import mediator.core.match as m

    return _patched(m, "narrowest", lambda *_a, **_k: None)


def _fewer_attempts() -> contextlib.AbstractContextManager[None]:
    """§9 retries: a retried step gets one attempt fewer than ``max_attempts``."""
    import mediator.flows.steps as steps

    real = vars(steps)["decide_result"]  # imported there from mediator.core.progress

    def decide(*args: Any, max_attempts: int, **kwargs: Any) -> Any:
        return real(*args, max_attempts=max_attempts - 1, **kwargs)

    return _patched(steps, "decide_result", decide)


def _verdict_flipped() -> contextlib.AbstractContextManager[None]:
    """SettleIfDone (§9): a run whose every step passed ends FAILED, and one with a failed step
    PASSED — the verdict, which moves no start."""
    import mediator.core.progress as progress
    import mediator.core.states as states
    from mediator.core.states import RunState, Verdict

    real = states.settle_verdict  # what progress calls, by its own name (patched there)

    def flipped(step_states: Any) -> Any:
        d = real(step_states)
        if d is None:
            return d
        return (RunState.FAILED, Verdict.FAIL) if d[1] == Verdict.PASS else (
            RunState.PASSED, Verdict.PASS)  # fmt: skip

    return _patched(progress, "settle_verdict", flipped)


def _no_partial_release() -> contextlib.AbstractContextManager[None]:
    """R15 / applyRelease: a node whose steps in the run are done keeps its lease till the end."""
    import mediator.core.progress as progress

    real = progress.progress

    def no_partial(*args: Any, **kwargs: Any) -> Any:
        d = real(*args, **kwargs)
        return dataclasses.replace(d, release=()) if d.release_reason == "partial" else d

    return _patched(progress, "progress", no_partial)


def _drain_kinds_swapped() -> contextlib.AbstractContextManager[None]:
    """§10: a graceful drain acts at the step boundary and an at-boundary one gracefully."""
    import mediator.flows.advert as advert

    real = advert.advert
    swap = {"graceful": "at-boundary", "at-boundary": "graceful"}

    def swapped(*args: Any, **kwargs: Any) -> Any:
        if "drain" in kwargs:
            kwargs["drain"] = swap.get(kwargs["drain"], kwargs["drain"])
        elif len(args) > 5:
            args = (*args[:5], swap.get(args[5], args[5]), *args[6:])
        return real(*args, **kwargs)

    return _patched(advert, "advert", swapped)


@contextlib.contextmanager
def _at_boundary_as_graceful() -> Iterator[None]:
    """§10: an at-boundary drain never ends a run at its step boundary (it acts gracefully)."""
    import mediator.core.progress as progress
    import mediator.flows.advert as advert

    with contextlib.ExitStack() as stack:
        for module in (progress, advert):  # advert.py imported the name from progress
            stack.enter_context(_patched(module, "drained_at_boundary", lambda *_a: False))
        yield


def _no_restart_detection() -> contextlib.AbstractContextManager[None]:
    """§10: a new daemon instance is not noticed; its old leases and steps stay."""
    import mediator.flows.advert as advert

    real = advert.advert_effects

    def effects(ctx: Any, node_id: str, instance: str, drain: str) -> bool:
        return real(ctx, node_id, instance, drain) if drain == "at-boundary" else False

    return _patched(advert, "advert_effects", effects)


def _lifo_sweep() -> contextlib.AbstractContextManager[None]:
    """R6 / I7: the sweep walks the queue's head newest first instead of in arrival order."""
    import mediator.flows.sweep as sweep

    real = sweep.sweep

    def lifo(ctx: Any, first: Any = None, guard: bool = False) -> Any:
        if first is None:
            with ctx.store.autocommit() as tx:
                first = tx.sweep_head(sweep.HEAD_PAGE, since=ctx.sweep_memo.mark, guard=guard)
        if len(first.head) < sweep.HEAD_PAGE:  # a full head pages on from its last run: keep it
            first = first._replace(head=list(reversed(first.head)))
        return real(ctx, first, guard)

    return _patched(sweep, "sweep", lifo)


def _refused_when_busy() -> contextlib.AbstractContextManager[None]:
    """R1: a submit that is TOO_WIDE only because nodes are busy is refused (422) instead of
    queued — the second look, every live node counted free, is skipped."""
    import mediator.flows.submit as submit

    real = vars(submit)["match"]  # imported there from mediator.core.match
    seen: list[Any] = []

    def look(needs: Any, adverts: Any, unavailable: Any, max_width: int) -> Any:
        res = real(needs, adverts, unavailable, max_width)
        first = seen[-1] if seen else None
        seen[:] = [res]
        if not unavailable and getattr(first, "code", None) == "TOO_WIDE":
            return first  # the second look answers what the first said: refused for good
        return res

    return _patched(submit, "match", look)


def _too_wide_fails_at_promotion() -> contextlib.AbstractContextManager[None]:
    """R10: a queued run the sweep finds TOO_WIDE is ended (as if refused) instead of left
    queued."""
    import mediator.flows.ending as ending
    import mediator.flows.sweep as sweep

    real = sweep.sweep

    def failing(ctx: Any, first: Any = None, guard: bool = False) -> Any:
        report = real(ctx, first, guard)
        for run_id in report.too_wide:
            ending.cancel(ctx, run_id)
        return report

    return _patched(sweep, "sweep", failing)


def _head_only() -> contextlib.AbstractContextManager[None]:
    """R6: the sweep stops at the queue's first run (head-of-line blocking) instead of visiting
    the whole queue in arrival order."""
    import mediator.flows.sweep as sweep

    real = sweep.sweep

    def head_only(ctx: Any, first: Any = None, guard: bool = False) -> Any:
        if first is None:
            with ctx.store.autocommit() as tx:
                first = tx.sweep_head(sweep.HEAD_PAGE, since=ctx.sweep_memo.mark, guard=guard)
        # a head shorter than a page is the whole queue to the sweep: it pages no further
        return real(ctx, first._replace(head=list(first.head)[:1]), guard)

    return _patched(sweep, "sweep", head_only)


def _no_second_page() -> contextlib.AbstractContextManager[None]:
    """R6: past a full head (HEAD_PAGE runs) none of which can move, the sweep reads no further
    page: a run queued behind them waits until the head drains."""
    from mediator.store.tx import Tx

    return _patched(Tx, "queued_page", lambda *_a, **_k: [])


@contextlib.contextmanager
def _one_page_past_the_head() -> Iterator[None]:
    """R6: past a full head the sweep reads one page and no more, however full that page was
    of runs that cannot move."""
    import mediator.flows.sweep as sweep
    from mediator.store.tx import Tx

    real_sweep, real_page = sweep.sweep, Tx.queued_page
    pages: list[int] = [0]

    def sweeping(ctx: Any, first: Any = None, guard: bool = False) -> Any:
        pages[0] = 0
        return real_sweep(ctx, first, guard)

    def page(self: Any, *args: Any, **kwargs: Any) -> Any:
        pages[0] += 1
        return real_page(self, *args, **kwargs) if pages[0] == 1 else []

    with _patched(sweep, "sweep", sweeping), _patched(Tx, "queued_page", page):
        yield


def _page_skips_a_tie() -> contextlib.AbstractContextManager[None]:
    """R6 / I7: the page past the head starts after the head's last instant, so a run queued at
    that same instant (after it by run_id, the FIFO tie) is skipped."""
    from mediator.store.tx import Tx

    real: Any = Tx.queued_page  # called with after_id None, which its signature does not allow

    def past_the_instant(self: Any, keys: Any, after_at: Any, _after_id: Any, limit: int) -> Any:
        return real(self, keys, after_at, None, limit)  # (at, NULL): no row at `at` compares

    return _patched(Tx, "queued_page", past_the_instant)


@contextlib.contextmanager
def _memo_forgets_returning() -> Iterator[None]:
    """§6 "Sweeps remember": a class that left the queue is never learnt again; its runs queued
    later are never walked (until the memo is reset)."""
    from mediator.flows.sweep import SweepMemo

    real_add, real_drop = SweepMemo._add, SweepMemo._drop

    def gone(memo: Any) -> set[str]:
        return vars(memo).setdefault("_planted_gone", set())  # type: ignore[no-any-return]

    def add(self: Any, key: str, needs: Any) -> None:
        if key not in gone(self):
            real_add(self, key, needs)

    def drop(self: Any, key: str) -> None:
        if key in self._needs:
            gone(self).add(key)
        real_drop(self, key)

    with _patched(SweepMemo, "_add", add), _patched(SweepMemo, "_drop", drop):
        yield


def _promote_params(
    change: Callable[[dict[str, Any]], None],
) -> contextlib.AbstractContextManager[None]:
    """The promotion's one statement (``Tx.promote``) run with ``change`` applied to its
    parameters."""
    from mediator.store.tx import Tx

    real = Tx._leasing

    def leasing(self: Any, name: str, params: dict[str, Any]) -> Any:
        if name == "promote":
            params = dict(params)
            change(params)
        return real(self, name, params)

    return _patched(Tx, "_leasing", leasing)


def _short_promoted_ttl() -> contextlib.AbstractContextManager[None]:
    """R11: promoted leases last half as long as submitted ones."""

    def half(params: dict[str, Any]) -> None:
        params["ttl"] = params["ttl"] / 2

    return _promote_params(half)


@contextlib.contextmanager
def _no_asks_at_promotion() -> Iterator[None]:
    """R12: a promotion raises none of the run's due asks (submit still does)."""
    import mediator.store.connector as connector

    real = connector.check_edges

    def none(params: dict[str, Any]) -> None:
        params["ask_from"] = ["-"]  # no ask step is in that state: none is raised

    def check(params: dict[str, Any]) -> None:  # "-" is no state: leave the ask edge unchecked
        real({k: v for k, v in params.items() if not k.startswith("ask_")})

    with _promote_params(none), _patched(connector, "check_edges", check):
        yield


def _not_ok_skips_nothing() -> contextlib.AbstractContextManager[None]:
    """§11: an ask answered not-ok fails its step but skips none of the steps after it."""
    import types

    import mediator.flows.asks as asks

    return _patched(asks, "contract_mod", types.SimpleNamespace(dependants=lambda *_a: set()))


def _answer_no_wake() -> contextlib.AbstractContextManager[None]:
    """Wake 1 at an ask's answer: the answer that freed a node never sweeps."""
    from mediator.flows.after import AfterCommit
    from mediator.flows.wake import Wake

    real = AfterCommit.wake_safely

    def wake_safely(self: Any, why: Any, *, head: Any = None, guard: bool = False) -> Any:
        return None if why is Wake.ANSWER else real(self, why, head=head, guard=guard)

    return _patched(AfterCommit, "wake_safely", wake_safely)


def _cancel_frees_claimed() -> contextlib.AbstractContextManager[None]:
    """§10 cancel (I2's exception): a node still running a CLAIMED step of the cancelled run is
    released at once, not at that step's result."""
    import mediator.flows.ending as ending
    from mediator.core.states import Verdict

    real = vars(ending)["end"]  # imported there from mediator.flows.steps

    def end(tx: Any, run: Any, steps: Any, verdict: Any, events: Any, *, gone: Any = ()) -> Any:
        if verdict == Verdict.CANCELLED:
            gone = [s.node_id for s in steps if s.node_id]
        return real(tx, run, steps, verdict, events, gone=gone)

    return _patched(ending, "end", end)


def _reaper_off() -> contextlib.AbstractContextManager[None]:
    """§10 the reaper: a pass releases no expired lease (its run is never lost)."""
    import mediator.flows.ending as ending

    return _patched(ending, "reap", lambda _ctx: ending.ReapReport())


def _reaper_always_wakes() -> contextlib.AbstractContextManager[None]:
    """R14: every reaper pass sweeps, released something or not (a timer's wake)."""
    import mediator.flows.ending as ending
    from mediator.flows.wake import Wake

    real = ending.reap

    def reap(ctx: Any) -> Any:
        report = real(ctx)
        if not report.woke:
            ctx.after(wake=Wake.REAP)
        return report

    return _patched(ending, "reap", reap)


def _heartbeat_sweeps() -> contextlib.AbstractContextManager[None]:
    """R14: a steady heartbeat sweeps too (polling in disguise)."""
    import mediator.flows.advert as advert
    from mediator.flows.wake import Wake

    real = advert.advert

    def beat(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        ttl = real(ctx, *args, **kwargs)
        ctx.after(wake=Wake.ADVERT_RELEASED)
        return ttl

    return _patched(advert, "advert", beat)


def _retry_wakes() -> contextlib.AbstractContextManager[None]:
    """R15: a ``retry`` rollback sweeps as a result does."""
    import mediator.flows.steps as steps
    from mediator.flows.wake import Wake

    real = steps.report

    def report(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        res = real(ctx, *args, **kwargs)
        if res.rolled:
            ctx.after(wake=Wake.RESULT)
        return res

    return _patched(steps, "report", report)


def _no_rebind() -> contextlib.AbstractContextManager[None]:
    """§10 restart detection: a lease whose node ran nothing yet under the old daemon is not
    rebound to the new one (the run cannot go on there)."""
    from mediator.store.tx import Tx

    return _patched(Tx, "rebind_lease", lambda *_a, **_k: None)


@contextlib.contextmanager
def _wakes_deferred() -> Iterator[None]:
    """R13: a wake is not synchronous — the sweep it asks for runs at the next submit or advert
    instead of inside the call that caused it."""
    import mediator.flows.advert as advert
    import mediator.flows.submit as submit
    import mediator.flows.sweep as sweep_flow
    from mediator.flows.after import AfterCommit

    pending: list[bool] = []

    def wake_safely(self: Any, why: Any, *, head: Any = None, guard: bool = False) -> Any:
        pending[:] = [True]
        return None

    def later(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(ctx: Any, *args: Any, **kwargs: Any) -> Any:
            if pending:
                pending.clear()
                sweep_flow.wake_queued(ctx)
            return real(ctx, *args, **kwargs)

        return call

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(AfterCommit, "wake_safely", wake_safely))
        stack.enter_context(_patched(advert, "advert", later(advert.advert)))
        stack.enter_context(_patched(submit, "submit", later(submit.submit)))
        yield


def _wake_off(number: int) -> Callable[[], contextlib.AbstractContextManager[None]]:
    def apply() -> contextlib.AbstractContextManager[None]:
        """Wake ``number`` never sweeps (docs/design.md §8, the wake points)."""
        from mediator.flows.after import AfterCommit

        real = AfterCommit.wake_safely

        def wake_safely(self: Any, why: Any, *, head: Any = None, guard: bool = False) -> Any:
            return None if why.number == number else real(self, why, head=head, guard=guard)

        return _patched(AfterCommit, "wake_safely", wake_safely)

    return apply


def _nothing() -> contextlib.AbstractContextManager[None]:
    """A plant that breaks nothing: the table must list it as not exercised."""
    return contextlib.nullcontext()


_WAKES = {
    1: ("a result or an answer", "wake 1"),
    2: ("a cancel", "wake 2"),
    3: ("the reaper releasing a lease", "wake 3 / reaper"),
    4: ("an advert releasing a node (restart, at-boundary drain)", "wake 4"),
    5: ("startup or reconnect", "wake 5"),
    6: ("a drain lifted", "wake 6"),
    7: ("a node returned", "wake 7"),
    8: ("a queued submit", "wake 8 / R17"),
    9: ("capabilities changed", "wake 9"),
}

PLANTS: tuple[Plant, ...] = (
    Plant("match-ignores-folding", "matcher §4 step 4 (folding)",
          "a candidate's count of later roles it serves is ignored", _no_fold_count),
    Plant("match-last-candidate", "matcher §4 step 4 (ties by node_id)",
          "among equal candidates the highest node_id is taken", _last_candidate),
    Plant("match-no-reuse", "matcher §4 step 3 (folding onto a chosen node)",
          "a role a chosen node serves is not folded onto it", _no_reuse),
    Plant("exact-order-flipped", "TOO_WIDE exact: which narrowest assignment (§4)",
          "the exact search tries candidates serving fewer later roles first",
          _exact_order_flipped),
    Plant("width-greedy-only", "TOO_WIDE exact (R1, R10)",
          "no exact width search: a wide greedy choice is TOO_WIDE", _greedy_width),
    Plant("attempts-minus-one", "retries / max_attempts (§9)",
          "a retried step gets one attempt fewer", _fewer_attempts),
    Plant("verdict-flipped", "SettleIfDone (§9: the verdict)",
          "a run whose steps all passed ends FAILED, one with a failure PASSED", _verdict_flipped),
    Plant("no-partial-release", "partial release (R15, applyRelease)",
          "a node done with its steps keeps its lease until the run ends", _no_partial_release),
    Plant("drain-kinds-swapped", "drain, both kinds (§10)",
          "graceful acts at the step boundary, at-boundary gracefully", _drain_kinds_swapped),
    Plant("drain-at-boundary-graceful", "drain, both kinds (§10)",
          "an at-boundary drain acts gracefully", _at_boundary_as_graceful),
    Plant("no-restart-detection", "restart (§10)",
          "a new daemon instance is not noticed", _no_restart_detection),
    Plant("sweep-newest-first", "FIFO (R6, I7)",
          "the sweep walks the queue's head newest first", _lifo_sweep),
    Plant("too-wide-refused-when-busy", "R1 (TOO_WIDE at submit)",
          "TOO_WIDE only because nodes are busy is refused, not queued", _refused_when_busy),
    Plant("too-wide-fails-at-promotion", "R10 (TOO_WIDE at promotion)",
          "a queued run the sweep finds too wide is ended", _too_wide_fails_at_promotion),
    Plant("sweep-head-only", "R6 (the whole queue)",
          "the sweep stops at the queue's first run", _head_only),
    Plant("sweep-no-second-page", "R6 (the whole queue: past a full head)",
          "past a full head that cannot move, no further page is read", _no_second_page),
    Plant("sweep-one-page-past-head", "R6 (the whole queue: page after page)",
          "past a full head one page is read, however full", _one_page_past_the_head),
    Plant("sweep-page-skips-a-tie", "R6 / I7 (FIFO ties across pages)",
          "the page past the head skips a run queued at the head's last instant",
          _page_skips_a_tie),
    Plant("memo-forgets-returning-class", "§6 sweeps remember (a class waiting again)",
          "a class that left the queue is never learnt again", _memo_forgets_returning),
    Plant("promoted-lease-short", "R11 (promoted lease TTL)",
          "promoted leases last half the TTL", _short_promoted_ttl),
    Plant("no-asks-at-promotion", "R12 (asks at promotion)",
          "a promotion raises none of the run's due asks", _no_asks_at_promotion),
    Plant("wakes-deferred", "R13 (a wake is synchronous)",
          "a wake's sweep runs at the next submit or advert", _wakes_deferred),
    Plant("heartbeat-sweeps", "R14 (no timer wakes: adverts)",
          "a steady heartbeat sweeps", _heartbeat_sweeps),
    Plant("reaper-always-sweeps", "R14 (no timer wakes: reaper)",
          "every reaper pass sweeps", _reaper_always_wakes),
    Plant("retry-sweeps", "R15 (a retry does not wake)",
          "a retry rollback sweeps", _retry_wakes),
    Plant("not-ok-skips-nothing", "asks (§11: a not-ok answer)",
          "a not-ok answer skips none of the steps after it", _not_ok_skips_nothing),
    Plant("answer-no-wake", "asks (§8 wake 1: an answer)",
          "an ask's answer never sweeps", _answer_no_wake),
    Plant("cancel-frees-claimed", "cancel (§10, I2's exception)",
          "cancel releases a node still running a claimed step", _cancel_frees_claimed),
    Plant("reaper-off", "reaper (§10)",
          "a reaper pass releases no expired lease", _reaper_off),
    Plant("restart-no-rebind", "restart (§10: rebind)",
          "a lease is not rebound to a restarted daemon that ran nothing yet", _no_rebind),
    *(Plant(f"wake-{n}-off", rule, f"{why} never sweeps", _wake_off(n))
      for n, (why, rule) in _WAKES.items()),
)  # fmt: skip
# Plants no case can catch, and why (docs/design.md §20): allowed by the command unless --strict.
EXCEPTIONS = {
    "wake-5-off": "the simulator never restarts the Mediator nor loses its database",
}
# Rules with no plant: what they decide cannot happen in one simulation process, which makes
# its calls one at a time and never fails a statement. Listed in the table, never run; each is
# pinned by the tests named (docs/design.md §20).
UNEXERCISABLE = {
    "R2 (a lease conflict queues)": "no two submits race: tests/db/test_submit.py",
    "R3 (resubmit is 200)": "the simulator never resubmits an id: tests/db/test_submit.py",
    "R4 (a queued run holds nothing)": "I3 by SQL in every case: a breach fails the gate anyway",
    "R5 (steps exist from submit)": "I3/I4 by SQL in every case; tests/db/test_submit.py",
    "R7 (each promotion its own tx)": "a promotion never fails: tests/db/test_wake.py",
    "R8 (a conditional promotion)": "no two sweeps race: tests/db/test_wake.py",
    "R9 (the lease key decides)": "no two sweeps race (and within one the key decides the same): "
    "tests/db/test_wake.py",
    "R16 (a failed wake)": "a wake never fails: tests/db/test_wake.py",
}
# The case that caught each plant when the baseline was last recorded: tried first, so a
# coverage run that still agrees costs one case per plant (the others run only if it stops
# catching it).
CAUGHT_BY: dict[str, str] = {
    "match-ignores-folding": "rules", "match-last-candidate": "asks", "match-no-reuse": "edges",
    "exact-order-flipped": "edges", "verdict-flipped": "steady",
    "width-greedy-only": "rules", "attempts-minus-one": "rules", "no-partial-release": "mixed",
    "drain-kinds-swapped": "rules", "drain-at-boundary-graceful": "rules",
    "no-restart-detection": "rules", "sweep-newest-first": "asks",
    "too-wide-refused-when-busy": "edges", "too-wide-fails-at-promotion": "edges",
    "sweep-head-only": "edges", "promoted-lease-short": "edges", "no-asks-at-promotion": "edges",
    "sweep-no-second-page": "edges", "sweep-one-page-past-head": "edges",
    "sweep-page-skips-a-tie": "edges",
    "memo-forgets-returning-class": "edges",
    "wakes-deferred": "edges", "heartbeat-sweeps": "edges", "reaper-always-sweeps": "edges",
    "retry-sweeps": "edges", "not-ok-skips-nothing": "edges", "answer-no-wake": "edges",
    "cancel-frees-claimed": "edges", "reaper-off": "edges", "restart-no-rebind": "edges",
    "wake-1-off": "vanished_node_off", "wake-2-off": "edges", "wake-3-off": "edges",
    "wake-4-off": "rules", "wake-6-off": "rules", "wake-7-off": "vanished_node_on",
    "wake-8-off": "vanished_churn_off", "wake-9-off": "capabilities",
}  # fmt: skip
NOTHING = Plant("nothing", "(none: a control)", "breaks nothing", _nothing)
_BY_ID = {p.id: p for p in (*PLANTS, NOTHING)}


def plant(plant_id: str) -> Plant:
    try:
        return _BY_ID[plant_id]
    except KeyError:
        raise BaselineError(f"unknown plant {plant_id!r}; known: {', '.join(_BY_ID)}") from None


# ---- running ------------------------------------------------------------------------------------


def check_planted(plant_id: str, job: Job) -> Outcome:
    """``gate.check_case`` with the plant installed (in this process, for this case only),
    stopped at its first divergence: where the plant was caught is all the table says, and a
    divergence comes anywhere from the first minute to the end of a case (about half of a
    case's time on average, docs/performance.md "The scheduler gate").

    A plant can make a case that ends by itself run forever (the reaper off: a dark node's
    lease is never freed, so its timer never stops), so a planted run without a horizon stops
    at twice the baseline's end (virtual time); a decision past that is a divergence anyway."""
    with plant(plant_id).apply(), _horizon(2 * float(job.base.summary.get("end_s") or 0.0)):
        return check_case(job, stop_at_divergence=True)


@contextlib.contextmanager
def _horizon(end_s: float) -> Iterator[None]:
    """The simulation loop stops at ``end_s`` at the latest (it still stops earlier when
    nothing is left to happen, as unplanted)."""
    real = EventQueue.events

    def events(self: Any, end: int | None = None) -> Any:
        return real(self, end if end is not None or end_s <= 0 else to_us(end_s))

    with _patched(EventQueue, "events", events):
        yield


@dataclass
class Caught:
    """A plant's verdict: the cases run, and those whose decisions changed (or broke I1–I7)."""

    plant: str
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def caught(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "fail"]

    @property
    def errors(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "error"]


def _cover(plant_id: str, jobs: list[Job], all_cases: bool) -> Caught:
    """Run the cases with one plant, cheapest first; stop at the first that catches it."""
    started = time.perf_counter()
    out = Caught(plant_id)
    first = CAUGHT_BY.get(plant_id)  # the case known to catch it: one run when it still does
    jobs = sorted(jobs, key=lambda j: j.base.case != first)
    for job in jobs:
        try:
            o = check_planted(plant_id, job)
        except Exception as exc:  # the broken rule crashed the run: noticed, loudly
            o = Outcome(job.base.case, job.base.seed, "fail", error=f"{type(exc).__name__}: {exc}")
        o.now_decisions, o.baseline_decisions = [], []  # small across processes
        out.outcomes.append(o)
        if o.status != "pass" and not all_cases:
            break
    out.wall_s = time.perf_counter() - started
    return out


@dataclass
class CoverageReport:
    root: Path
    results: list[Caught]
    allow: set[str] = field(default_factory=set)
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    def missed(self) -> list[str]:
        return [c.plant for c in self.results if not c.caught and not c.errors]

    @property
    def exit_code(self) -> int:
        if self.errors or any(c.errors for c in self.results):
            return 2
        return 1 if set(self.missed()) - self.allow else 0

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(rule, plant, what it does, verdict) per plant."""
        out = []
        for c in self.results:
            p = _BY_ID[c.plant]
            if c.errors:
                verdict = f"COULD NOT RUN: {c.errors[0].name}: {c.errors[0].error}"
            elif c.caught:
                verdict = "; ".join(_caught_by(o) for o in c.caught)
            else:
                why = EXCEPTIONS.get(c.plant)
                allowed = ("" if c.plant not in self.allow
                           else f" (allowed: {why})" if why else " (allowed)")  # fmt: skip
                verdict = f"NOT EXERCISED{allowed} ({len(c.outcomes)} case(s) unchanged)"
            out.append((p.rule, p.id, p.what, verdict))
        return out

    def text(self) -> str:
        lines = [f"sim coverage against {self.root}: {len(self.results)} plant(s) in "
                 f"{self.wall_s:.1f} s"]  # fmt: skip
        lines += [f"ERROR {e}" for e in self.errors]
        rows = self.rows()
        w = max((len(r[0]) for r in rows), default=4)
        for rule, pid, _what, verdict in rows:
            lines.append(f"  {rule:<{w}}  {pid:<24} {verdict}")
        lines.append("  no plant (a simulation cannot exercise them; pinned by tests instead):")
        lines += [f"  {rule:<{w}}  {'-':<24} {why}" for rule, why in UNEXERCISABLE.items()]
        missed = [m for m in self.missed() if m not in self.allow]
        verdict = {0: "every rule exercised", 1: f"NOT EXERCISED: {', '.join(missed)}",
                   2: "COULD NOT RUN"}[self.exit_code]  # fmt: skip
        lines.append(f"{verdict} (exit {self.exit_code})")
        return "\n".join(lines)


def _caught_by(o: Outcome) -> str:
    d = o.divergence
    if o.error:
        return f"{o.name}: the run crashed ({o.error[:80]})"
    if d is None and o.verdicts is not None:
        return f"{o.name}: {o.verdicts_moved()}"
    if d is None:
        return f"{o.name}: {len(o.violations)} invariant violation(s): {o.violations[:1]}"
    return f"{o.name}: first divergence at {seconds(d.at_us)} s, run {d.run_id}"


def coverage(
    root: str | Path,
    plants: Sequence[str] = (),
    *,
    names: Sequence[str] = (),
    allow: Sequence[str] = (),
    all_cases: bool = False,
    database_url: str | None = None,
    jobs: int = 1,
    echo: Callable[[str], None] = lambda _: None,
) -> CoverageReport:
    """Run each plant (all of ``PLANTS`` when empty) against the baseline's cases under ``root``
    (``names``: a subset) and say which case caught it."""
    root = Path(root)
    started = time.perf_counter()
    report = CoverageReport(root, [], set(allow))
    try:
        chosen = [plant(p) for p in plants] if plants else list(PLANTS)
        unknown = set(allow) - set(_BY_ID)
        if unknown:
            raise BaselineError(f"--allow: unknown plant(s) {', '.join(sorted(unknown))}")
        todo = [Job(load_case(p), [], None, database_url) for p in find_cases(root, names)]
    except BaselineError as exc:
        report.errors.append(str(exc))
        return report
    # cheapest first: a plant caught early costs little
    todo.sort(key=lambda j: int(j.base.manifest.get("mediator_calls", 0)))
    if jobs > 1 and len(chosen) > 1:
        from sim.brokers.mediator import server_url  # the database stack, as in gate.check

        url = server_url(database_url)
        for j in todo:
            j.database_url = url
        with spawn_pool(min(jobs, len(chosen))) as pool:
            futures = [pool.submit(_cover, p.id, todo, all_cases) for p in chosen]
            for fut in as_completed(futures):
                report.results.append(fut.result())
                echo(_progress(report.results[-1]))
    else:
        for p in chosen:
            report.results.append(_cover(p.id, todo, all_cases))
            echo(_progress(report.results[-1]))
    order = {p.id: k for k, p in enumerate(chosen)}
    report.results.sort(key=lambda c: order[c.plant])
    report.wall_s = time.perf_counter() - started
    return report


def _progress(c: Caught) -> str:
    how = "caught" if c.caught else "error" if c.errors else "missed"
    return f"  {how:6s} {c.plant} ({len(c.outcomes)} case(s), {c.wall_s:.1f} s)"


# ---- the command line (registered by sim.outputs.cli) -------------------------------------------


def add_parsers(sub: Any) -> None:
    """``python -m sim coverage``."""
    c = sub.add_parser("coverage", help="break each scheduling rule on purpose: does the gate see?")
    c.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="a subset of the cases")
    c.add_argument("--baseline", required=True, help="the baseline directory")
    c.add_argument(
        "--plant",
        action="append",
        default=[],
        metavar="ID",
        help="only this plant (repeatable; default: all; --list names them)",
    )
    c.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="ID",
        help="a plant no case needs to catch (besides the documented exceptions)",
    )
    c.add_argument(
        "--strict",
        action="store_true",
        help="do not allow the documented exceptions (wake 2, wake 5) either",
    )
    c.add_argument(
        "--all-cases",
        action="store_true",
        help="run every case per plant, not only up to the first that catches it",
    )
    c.add_argument("--list", action="store_true", help="list the plants and exit")
    c.add_argument("--jobs", type=int, default=1, help="plants side by side")
    c.add_argument("--database-url", help="PostgreSQL server for the runs' databases")
    c.set_defaults(func=cmd_coverage)


def cmd_coverage(args: argparse.Namespace) -> int:
    if args.list:
        for p in (*PLANTS, NOTHING):
            print(f"{p.id:<24} {p.rule:<38} {p.what}")
        return 0
    allow = [*args.allow, *(() if args.strict else EXCEPTIONS)]
    report = coverage(args.baseline, args.plant, names=args.scenarios, allow=allow,
                      all_cases=args.all_cases, database_url=args.database_url,
                      jobs=max(1, args.jobs),
                      echo=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
    print(report.text())
    return report.exit_code
