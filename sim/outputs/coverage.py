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

    def lifo(ctx: Any, first: Any = None) -> Any:
        if first is None:
            with ctx.store.autocommit() as tx:
                first = tx.sweep_head(sweep.HEAD_PAGE, since=ctx.sweep_memo.mark)
        if len(first.head) < sweep.HEAD_PAGE:  # a full head pages on from its last run: keep it
            first = first._replace(head=list(reversed(first.head)))
        return real(ctx, first)

    return _patched(sweep, "sweep", lifo)


def _wake_off(number: int) -> Callable[[], contextlib.AbstractContextManager[None]]:
    def apply() -> contextlib.AbstractContextManager[None]:
        """Wake ``number`` never sweeps (docs/design.md §8, the wake points)."""
        from mediator.flows.after import AfterCommit

        real = AfterCommit.wake_safely

        def wake_safely(self: Any, why: Any, *, head: Any = None) -> Any:
            return None if why.number == number else real(self, why, head=head)

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
    Plant("width-greedy-only", "TOO_WIDE exact (R1, R10)",
          "no exact width search: a wide greedy choice is TOO_WIDE", _greedy_width),
    Plant("attempts-minus-one", "retries / max_attempts (§9)",
          "a retried step gets one attempt fewer", _fewer_attempts),
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
    *(Plant(f"wake-{n}-off", rule, f"{why} never sweeps", _wake_off(n))
      for n, (why, rule) in _WAKES.items()),
)  # fmt: skip
# Plants no case can catch, and why (docs/design.md §20): allowed by the command unless --strict.
EXCEPTIONS = {
    "wake-2-off": "the simulator never cancels a run",
    "wake-5-off": "the simulator never restarts the Mediator nor loses its database",
}
NOTHING = Plant("nothing", "(none: a control)", "breaks nothing", _nothing)
_BY_ID = {p.id: p for p in (*PLANTS, NOTHING)}


def plant(plant_id: str) -> Plant:
    try:
        return _BY_ID[plant_id]
    except KeyError:
        raise BaselineError(f"unknown plant {plant_id!r}; known: {', '.join(_BY_ID)}") from None


# ---- running ------------------------------------------------------------------------------------


def check_planted(plant_id: str, job: Job) -> Outcome:
    """``gate.check_case`` with the plant installed (in this process, for this case only)."""
    with plant(plant_id).apply():
        return check_case(job)


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
        missed = [m for m in self.missed() if m not in self.allow]
        verdict = {0: "every rule exercised", 1: f"NOT EXERCISED: {', '.join(missed)}",
                   2: "COULD NOT RUN"}[self.exit_code]  # fmt: skip
        lines.append(f"{verdict} (exit {self.exit_code})")
        return "\n".join(lines)


def _caught_by(o: Outcome) -> str:
    d = o.divergence
    if o.error:
        return f"{o.name}: the run crashed ({o.error[:80]})"
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
