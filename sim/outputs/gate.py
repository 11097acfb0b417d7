"""The scheduler gate for CI (issue 16): record the real Mediator's scheduling decisions once, then
prove on every change that they are still the same — or say exactly where they stopped being so.

The simulator is deterministic: the same scenario and seed give the same decisions, row for row,
in any process. So a gate can be exact instead of statistical. ``python -m sim baseline`` records,
per scenario and seed, the ordered decisions (instant, run, how, role → node), their digest, the
summary with its intervals and a manifest; ``python -m sim check`` re-runs the recorded scenarios
on the real Mediator and compares:

- exact mode (the default): the decisions must be identical; otherwise the report names the
  *first divergence* — the instant, the run, what the baseline did, what happened now, the queue
  at that instant — and how many decisions differ after it. The runs counted by verdict must be
  the same too (docs/design.md §20: how runs end moves no start);
- drift mode (``--tolerance F``), for intended changes: which metrics (mean/p95/p99 wait,
  utilisation, stuck time) moved beyond the baseline's intervals widened by ``F`` × the value.

Exit status: 0 same, 1 changed (or an invariant I1–I7 was violated), 2 could not run (a baseline
that is missing, corrupted, of another format or project version, or whose workload no longer
materializes to the same runs — then the inputs changed, not the scheduler).

The gate reads only ``Result.decisions()``, ``Result.queued_before()``, ``summary()`` and
``violations`` (``sim.platform.measure``), so the engine behind them may be restructured freely.

Baseline layout (text, small, diff-friendly; re-recording an unchanged tree changes no byte)::

    DIR/<scenario>/seed-<seed>/decisions.csv   at_s,run_id,how,roles,queued — one decision a line
    DIR/<scenario>/seed-<seed>/summary.json    summary() with its intervals
    DIR/<scenario>/seed-<seed>/manifest.json   format, project version, scale, seed, scenario
                                               parameters, digests of decisions and workload
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import platform
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from sim.brokers.entry import run
from sim.inputs.scenarios import Scenario, parse_set
from sim.inputs.workload import materialize
from sim.outputs.report import CASES
from sim.parallel import spawn_pool
from sim.platform.measure import plain

FORMAT = 1
DECISIONS, SUMMARY, MANIFEST = "decisions.csv", "summary.json", "manifest.json"
HEADER = ("at_s", "run_id", "how", "roles", "queued")
# The first line of every Markdown summary: how a CI job finds its own earlier comment to edit.
MARKER = "<!-- scheduler-gate -->"
# Wall-clock figures vary from run to run; a baseline keeps only what the seed determines.
_UNSTABLE = ("virtual_s_per_wall_s",)
# Drift mode: (summary key, interval key, label).
METRICS = (
    ("wait_mean_s", "wait_mean_ci", "mean wait (s)"),
    ("wait_p95_s", "wait_p95_ci", "p95 wait (s)"),
    ("wait_p99_s", "wait_p99_ci", "p99 wait (s)"),
    ("utilization", None, "utilisation"),
    ("stuck_s", None, "stuck time (s)"),
)


class BaselineError(Exception):
    """The gate could not run: a baseline missing, corrupted or from another version (exit 2)."""


class Decision(NamedTuple):
    """One scheduling decision: run ``run_id`` started at ``at_us`` (virtual µs) — ``how`` is
    ``created`` (at submit) or ``promoted`` (by a sweep) — on ``roles`` (``role=node …``);
    ``queued`` runs were QUEUED at that moment (informative, not compared)."""

    at_us: int
    run_id: str
    how: str
    roles: str
    queued: int

    @property
    def key(self) -> tuple[int, str, str, str]:
        return self.at_us, self.run_id, self.how, self.roles

    def describe(self) -> str:
        return f"{self.run_id} {self.how} at {seconds(self.at_us)} s on {self.roles or '-'}"


def seconds(at_us: int) -> str:
    """Whole microseconds as exact decimal seconds: 300000001 → ``300.000001``."""
    sign = "-" if at_us < 0 else ""
    whole, frac = divmod(abs(at_us), 1_000_000)
    return f"{sign}{whole}.{frac:06d}"


def _parse_seconds(text: str) -> int:
    sign = -1 if text.startswith("-") else 1
    whole, _, frac = text.lstrip("-").partition(".")
    if not whole.isdigit() or (frac and not frac.isdigit()) or len(frac) > 6:
        raise ValueError(f"not a time in seconds: {text!r}")
    return sign * (int(whole) * 1_000_000 + int(frac.ljust(6, "0") or 0))


# ---- decisions as text --------------------------------------------------------------------------


def decisions_of(result: Any) -> list[Decision]:
    """The ``SimResult.decisions()`` table as ``Decision`` rows (times rounded to whole µs)."""
    df = result.decisions()
    return [
        Decision(round(float(at) * 1_000_000), str(run), str(how), str(roles), int(q))
        for at, run, how, roles, q in df[list(HEADER)].itertuples(index=False, name=None)
    ]


def decisions_csv(rows: Iterable[Decision]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(HEADER)
    for d in rows:
        w.writerow((seconds(d.at_us), d.run_id, d.how, d.roles, d.queued))
    return buf.getvalue()


def parse_decisions(text: str) -> list[Decision]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if tuple(header or ()) != HEADER:
        raise ValueError(f"expected the header {','.join(HEADER)}, found {header}")
    rows = []
    for n, rec in enumerate(reader, start=2):
        if len(rec) != len(HEADER):
            raise ValueError(f"line {n}: {len(rec)} fields, expected {len(HEADER)}")
        try:
            rows.append(Decision(_parse_seconds(rec[0]), rec[1], rec[2], rec[3], int(rec[4])))
        except ValueError as exc:
            raise ValueError(f"line {n}: {exc}") from None
    return rows


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def workload_digest(plan: Any) -> str:
    """A digest of everything the scheduler is given: nodes, arrivals (instants, contracts,
    pre-sampled step outcomes and answers) and fleet events. Equal digests mean a change in the
    decisions comes from the scheduler, not from the simulator's sampling."""
    h = hashlib.sha256()
    for n in plan.nodes:
        h.update(json.dumps([n.node_id, n.label, n.capabilities], sort_keys=True).encode())
    for a in plan.arrivals:
        h.update(json.dumps([a.at_s, a.run_id, a.template, a.contract, a.step_outcomes,
                             a.ask_answers], sort_keys=True).encode())  # fmt: skip
    for e in plan.fleet_events:
        # A field added later with a None default (``capabilities``, for wake 9's ``caps``
        # events) leaves the digest of the events that do not use it unchanged.
        fields = {k: v for k, v in dataclasses.asdict(e).items() if v is not None}
        h.update(json.dumps(fields, sort_keys=True).encode())
    return h.hexdigest()


# ---- which scenarios --------------------------------------------------------------------------


def builtin_cases(scale: str = "ci") -> dict[str, Callable[[], Any]]:
    """The built-in scenarios (``sim.outputs.report.CASES``) at ``ci`` or ``full`` scale."""
    if scale not in ("ci", "full"):
        raise BaselineError(f"scale must be ci or full, not {scale!r}")
    return {name: (ci if scale == "ci" else full) for name, (full, ci) in CASES.items()}


def resolve(names: Sequence[str], scale: str, seeds: Sequence[int] = ()) -> list[tuple[str, Any]]:
    """(case name, Scenario) for each name × seed: built-in names, or ``.toml`` scenario files
    (the case is the file's stem). No seeds: each scenario's own seed."""
    known = builtin_cases(scale)
    out = []
    for name in names or list(known):
        if name.endswith(".toml"):
            path = Path(name)
            if not path.is_file():
                raise BaselineError(f"no scenario file {name}")
            case, sc = path.stem, Scenario.from_toml(path)
        elif name in known:
            case, sc = name, known[name]()
        else:
            raise BaselineError(f"unknown scenario {name!r}; built-in: {', '.join(known)}")
        for seed in seeds or [sc.seed]:
            out.append((case, sc if seed == sc.seed else sc.with_overrides({"seed": seed})))
    return out


def case_dir(root: Path, case: str, seed: int) -> Path:
    return root / case / f"seed-{seed}"


# ---- recording --------------------------------------------------------------------------------


def project_version() -> str:
    """The project version a baseline is recorded with (a baseline of another one is refused)."""
    import mediator  # the database stack, imported when a baseline is read or written

    return str(mediator.__version__)


def summary_json(result: Any) -> str:
    """The text of a case's ``summary.json``: ``summary()`` without its wall-clock figures, keys
    sorted — what the seed alone determines, so recording it again changes no byte."""
    summary = {k: v for k, v in plain(result.summary(digits=None)).items() if k not in _UNSTABLE}
    return json.dumps(summary, indent=2, sort_keys=True) + "\n"


def record(
    root: str | Path,
    names: Sequence[str] = (),
    *,
    scale: str = "ci",
    seeds: Sequence[int] = (),
    database_url: str | None = None,
    echo: Callable[[str], None] = lambda _: None,
) -> list[Path]:
    """Run each scenario on the real Mediator and write its baseline under ``root``.

    Refuses (``BaselineError``) to record a run that violated an invariant: a baseline must be a
    state worth keeping.
    """
    root = Path(root)
    written = []
    for case, sc in resolve(names, scale, seeds):
        started = time.perf_counter()
        plan = materialize(sc)
        result = run(plan, "mediator", database_url=database_url, progress=False)
        if result.violations:
            raise BaselineError(f"{case} seed {sc.seed}: invariants violated, not recorded: "
                                f"{result.violations[:3]}")  # fmt: skip
        rows = decisions_of(result)
        text = decisions_csv(rows)
        manifest = {
            "format": FORMAT,
            "what": "sim gate baseline (issue 16): python -m sim check --baseline DIR",
            "case": case,
            "seed": sc.seed,
            "scale": scale,
            "project_version": project_version(),
            "decisions": len(rows),
            "decisions_sha256": digest(text),
            "workload_sha256": workload_digest(plan),
            "scenario_hash": sc.scenario_hash(),
            # deterministic, so the file stays byte-identical; orders parallel checks
            "mediator_calls": int(sum(getattr(result, "counts", {}).get(k, 0) for k in
                                      ("submit", "advert", "claim", "report", "answer", "reap"))),
            "recorded_with": {
                "postgresql": getattr(result, "manifest", {}).get("postgresql_version"),
                "python": platform.python_version(),
                "numpy": np.__version__,
            },
            "scenario": sc.to_dict(),
        }  # fmt: skip
        d = case_dir(root, case, sc.seed)
        d.mkdir(parents=True, exist_ok=True)
        (d / DECISIONS).write_text(text)
        (d / SUMMARY).write_text(summary_json(result))
        (d / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        written.append(d)
        took = time.perf_counter() - started
        echo(f"  recorded {case} seed {sc.seed}: {len(rows)} decisions, sha256 "
             f"{manifest['decisions_sha256'][:12]} ({took:.1f} s)")  # fmt: skip
    return written


# ---- reading a baseline -----------------------------------------------------------------------


@dataclass
class Baseline:
    """One recorded case, validated."""

    case: str
    seed: int
    path: Path
    manifest: dict[str, Any]
    summary: dict[str, Any]
    decisions: list[Decision]


def _fail(path: Path, why: str) -> BaselineError:
    return BaselineError(f"bad baseline {path}: {why}")


def load_case(path: Path, *, ignore_version: bool = False) -> Baseline:
    """Read and check one ``<scenario>/seed-<n>`` directory; ``BaselineError`` says what's wrong."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        summary = json.loads((path / SUMMARY).read_text())
        text = (path / DECISIONS).read_text()
    except FileNotFoundError as exc:
        raise _fail(path, f"{Path(exc.filename).name} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _fail(path, f"not valid JSON/text ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(summary, dict):
        raise _fail(path, "manifest.json and summary.json must hold JSON objects")
    fmt = manifest.get("format")
    if fmt != FORMAT:
        raise _fail(path, f"baseline format {fmt!r}, this gate reads format {FORMAT}; "
                          "record it again with `python -m sim baseline`")  # fmt: skip
    recorded, here = manifest.get("project_version"), project_version()
    if recorded != here and not ignore_version:
        raise BaselineError(
            f"version mismatch: baseline {path} was recorded by version {recorded} of this "
            f"project, and this tree is version {here}. Decisions of another version are no gate "
            "for this one: record the baseline again on the version you mean to compare against "
            "(python -m sim baseline --out DIR), or pass --ignore-version to compare across "
            "versions on purpose."
        )
    missing = [k for k in ("case", "seed", "decisions_sha256", "workload_sha256", "scenario")
               if k not in manifest]  # fmt: skip
    if missing:
        raise _fail(path, f"manifest.json lacks {', '.join(missing)}")
    if digest(text) != manifest["decisions_sha256"]:
        raise _fail(path, f"{DECISIONS} does not match its digest in {MANIFEST} (sha256 "
                          f"{digest(text)[:12]} ≠ {str(manifest['decisions_sha256'])[:12]}): "
                          "edited or truncated; restore it from version control or record "
                          "it again")  # fmt: skip
    try:
        rows = parse_decisions(text)
    except ValueError as exc:
        raise _fail(path, f"{DECISIONS}: {exc}") from None
    return Baseline(str(manifest["case"]), int(manifest["seed"]), path, manifest, summary, rows)


def find_cases(root: Path, names: Sequence[str] = (), seeds: Sequence[int] = ()) -> list[Path]:
    """The ``<scenario>/seed-<n>`` directories under ``root``, filtered by name and seed."""
    if not root.is_dir():
        raise BaselineError(f"no baseline directory {root}; record one with "
                            f"`python -m sim baseline --out {root}`")  # fmt: skip
    found = sorted(p.parent for p in root.glob(f"*/seed-*/{MANIFEST}"))
    stems = {Path(n).stem if n.endswith(".toml") else n for n in names}
    if stems:
        unknown = stems - {p.parent.name for p in found}
        if unknown:
            raise BaselineError(f"no baseline for {', '.join(sorted(unknown))} in {root}; record "
                                f"it with `python -m sim baseline --out {root} "
                                f"{' '.join(sorted(unknown))}`")  # fmt: skip
        found = [p for p in found if p.parent.name in stems]
    if seeds:
        found = [p for p in found if p.name in {f"seed-{s}" for s in seeds}]
    if not found:
        raise BaselineError(f"no baseline cases in {root}"
                            + (f" for seeds {list(seeds)}" if seeds else ""))  # fmt: skip
    return found


# ---- comparing ----------------------------------------------------------------------------------


@dataclass
class Divergence:
    """The first decision where now and the baseline part ways."""

    index: int  # position in both decision lists
    at_us: int  # the instant: the earlier of the two decisions at ``index``
    run_id: str  # the run decided at that instant (the baseline's, when both decided one)
    baseline: Decision | None  # the baseline's decision at ``index``
    now: Decision | None  # this tree's decision at ``index``
    run_now: Decision | None  # what this tree decided for ``run_id``, wherever it came
    run_baseline: Decision | None  # what the baseline decided for ``run_id``
    differ: int  # runs whose decision differs, from the divergence on
    total_baseline: int
    total_now: int
    queue: list[str] = field(default_factory=list)  # QUEUED just before it, now
    # The run stopped at this divergence (``check_case(stop_at_divergence=True)``): ``run_now``,
    # ``differ`` and ``total_now`` count only what was decided by then.
    partial: bool = False

    @property
    def at_s(self) -> float:
        return self.at_us / 1e6

    def text(self) -> str:
        t = seconds(self.at_us)
        b, n = self.baseline, self.now
        lines = [f"first divergence at decision #{self.index}, t = {t} s, run {self.run_id}"]
        lines.append("  baseline: " + (b.describe() if b and b.at_us == self.at_us
                                       else f"nothing decided at {t} s"
                                       + (f"; next: {b.describe()}" if b else "")))  # fmt: skip
        lines.append("  now:      " + (n.describe() if n and n.at_us == self.at_us
                                       else f"nothing decided at {t} s"
                                       + (f"; next: {n.describe()}" if n else "")))  # fmt: skip
        # Where the run went on the other side, unless the two lines above already say it.
        if b is not None and b.run_id == self.run_id and (n is None or self.run_now != n):
            went = (self.run_now.describe() if self.run_now
                    else f"{self.run_id} not started when the run stopped" if self.partial
                    else f"{self.run_id} never started")  # fmt: skip
            lines.append(f"  later, now:      {went}")
        if n is not None and n.run_id == self.run_id and (b is None or self.run_baseline != b):
            went = self.run_baseline.describe() if self.run_baseline else "never started"
            lines.append(f"  in the baseline: {went}")
        shown = " ".join(self.queue[:12]) + (" …" if len(self.queue) > 12 else "")
        qb = f" (baseline: {b.queued})" if b is not None and b.at_us == self.at_us else ""
        lines.append(f"  queue at {t} s, now: {len(self.queue)} run(s){qb}"
                     + (f": {shown}" if self.queue else ""))  # fmt: skip
        if self.partial:
            lines.append("  the run stopped at this divergence: what came after is not compared")
        else:
            lines.append(f"  from there on {self.differ} run(s) decided differently (baseline "
                         f"{self.total_baseline} decisions, now {self.total_now})")  # fmt: skip
        return "\n".join(lines)


class Settled:
    """Is the first divergence of a running simulation from ``base`` settled yet? A watch for
    ``sim.run(..., until=...)``, fed the decisions as they are made and the virtual instant.

    It is settled — and the run may stop, its first divergence being exactly the whole run's —
    when a decision differs from the baseline's at the same position (or comes after the
    baseline's last), or when the clock has passed the instant of the baseline's next decision
    with none made: every later decision comes later still. The decisions before it are then
    all there, which is all ``first_divergence`` reads to place it.
    """

    def __init__(self, base: Sequence[Decision]) -> None:
        self.keys = [d.key for d in base]
        self.matched = 0  # decisions equal to the baseline's so far

    def __call__(self, made: Sequence[tuple[int, str, str, str]], now_us: int) -> bool:
        keys = self.keys
        for key in made:
            if self.matched < len(keys) and tuple(key) == keys[self.matched]:
                self.matched += 1
            else:
                return True
        return self.matched < len(keys) and now_us > keys[self.matched][0]


def first_divergence(base: Sequence[Decision], now: Sequence[Decision]) -> Divergence | None:
    """Compare two decision lists in order; None when identical (``queued`` is not compared)."""
    i = next((k for k, (x, y) in enumerate(zip(base, now, strict=False)) if x.key != y.key),
             min(len(base), len(now)))  # fmt: skip
    if i == len(base) == len(now):
        return None
    b = base[i] if i < len(base) else None
    n = now[i] if i < len(now) else None
    at = min(d.at_us for d in (b, n) if d is not None)
    run_id = b.run_id if b is not None and b.at_us == at else n.run_id  # type: ignore[union-attr]
    by_base = {d.run_id: d.key for d in base[i:]}
    by_now = {d.run_id: d.key for d in now[i:]}
    differ = sum(1 for r in by_base.keys() | by_now.keys() if by_base.get(r) != by_now.get(r))
    return Divergence(
        index=i,
        at_us=at,
        run_id=run_id,
        baseline=b,
        now=n,
        run_now=next((d for d in now if d.run_id == run_id), None),
        run_baseline=next((d for d in base if d.run_id == run_id), None),
        differ=differ,
        total_baseline=len(base),
        total_now=len(now),
    )


class Metric(NamedTuple):
    """One drift-mode row: the baseline value and the band it may move in, the value now."""

    label: str
    baseline: float | None
    low: float | None
    high: float | None
    interval: str  # where the band comes from
    now: float | None
    moved: bool


def _interval(obj: Any) -> tuple[float, float] | None:
    if isinstance(obj, dict):
        lo, hi = obj.get("low", obj.get("lo")), obj.get("high", obj.get("hi"))
        if isinstance(lo, int | float) and isinstance(hi, int | float):
            return float(lo), float(hi)
    return None


def drift(base: dict[str, Any], now: dict[str, Any], tolerance: float) -> list[Metric]:
    """Per metric: moved when the value now lies outside the baseline's 95 % interval widened by
    ``tolerance`` × |baseline value| on each side (no interval recorded: the value ± that)."""
    rows = []
    for key, ci_key, label in METRICS:
        b, n = base.get(key), now.get(key)
        if not isinstance(b, int | float):
            if isinstance(n, int | float):
                rows.append(Metric(label, None, None, None, "not in the baseline", float(n), True))
            continue
        ci = _interval(base.get(ci_key)) if ci_key else None
        lo, hi = ci if ci is not None else (float(b), float(b))
        slack = tolerance * abs(float(b))
        lo, hi = lo - slack, hi + slack
        how = ("95 % interval" if ci else "value") + (f" ± {tolerance:g}×" if tolerance else "")
        value = float(n) if isinstance(n, int | float) else None
        moved = value is None or not (lo - 1e-9 <= value <= hi + 1e-9) or math.isnan(value)
        rows.append(Metric(label, float(b), lo, hi, how, value, moved))
    return rows


def metrics_table(rows: Sequence[Metric], markdown: bool = False) -> str:
    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:,.4g}"

    head = ("metric", "baseline", "allowed band", "now", "")
    body = [(m.label, f(m.baseline), f"[{f(m.low)}, {f(m.high)}] ({m.interval})", f(m.now),
             "MOVED" if m.moved else "ok") for m in rows]  # fmt: skip
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(r[:4]) + (" | **moved** |" if r[4] == "MOVED" else " | ok |")
                for r in body]  # fmt: skip
        return "\n".join(out)
    widths = [max(len(str(r[k])) for r in [head, *body]) for k in range(len(head))]
    return "\n".join("  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))
                     .rstrip() for r in [head, *body])  # fmt: skip


# ---- checking -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    """The gate's verdict on one case."""

    case: str
    seed: int
    status: str  # "pass", "fail" (changed or invariant violated), "error" (could not run)
    mode: str = "exact"
    decisions: int = 0
    digest: str = ""
    divergence: Divergence | None = None
    metrics: list[Metric] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    # Exact mode: the runs counted by verdict, (baseline, now), when they differ — a change in
    # how runs end (SettleIfDone, docs/design.md §9) that moved no start.
    verdicts: tuple[dict[str, int], dict[str, int]] | None = None
    error: str = ""
    wall_s: float = 0.0
    now_decisions: list[Decision] = field(default_factory=list, repr=False)
    baseline_decisions: list[Decision] = field(default_factory=list, repr=False)

    @property
    def name(self) -> str:
        return f"{self.case}[seed={self.seed}]"

    def headline(self) -> str:
        if self.status == "error":
            return f"could not run: {self.error}"
        parts = []
        if self.violations:
            parts.append(f"{len(self.violations)} invariant violation(s): {self.violations[0]}")
        d = self.divergence
        if d is not None:
            after = ("the run stopped there" if d.partial
                     else f"{d.differ} run(s) decided differently")  # fmt: skip
            parts.append(f"first divergence at {seconds(d.at_us)} s, run {d.run_id} "
                         f"(#{d.index}); {after}")  # fmt: skip
        else:
            parts.append(f"{self.decisions} decisions identical (sha256 {self.digest[:12]})")
        if self.verdicts is not None:
            parts.append(self.verdicts_moved())
        if self.mode == "drift":
            moved = [m.label for m in self.metrics if m.moved]
            parts.append(f"moved: {', '.join(moved)}" if moved else "no metric moved")
        return "; ".join(parts)

    def verdicts_moved(self) -> str:
        """How the runs counted by verdict moved (exact mode, when they did)."""
        was, now = self.verdicts or ({}, {})
        return f"runs by verdict {_counts(was)} in the baseline, {_counts(now)} now"

    def text(self, metrics: bool = True) -> str:
        lines = [f"{self.status.upper():5s} {self.name}: {self.headline()}"]
        if self.divergence is not None:
            lines.append(_indent(self.divergence.text()))
        if self.violations:
            lines += [f"  violation: {v}" for v in self.violations[:10]]
        if metrics and (self.mode == "drift" or (self.divergence is not None and self.metrics)):
            lines.append(metrics_table(self.metrics))
        return "\n".join(lines)


def _counts(by: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(by.items())) or "none"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


@dataclass
class _Job:
    base: Baseline
    sets: list[str]
    tolerance: float | None
    database_url: str | None


Job = _Job  # its public name: sim.outputs.coverage builds jobs too


def check_case(job: _Job, *, stop_at_divergence: bool = False) -> Outcome:
    """Re-run one recorded case on the real Mediator and judge it (runs in a worker process when
    the check is parallel: everything in and out is picklable).

    ``stop_at_divergence`` (exact mode; ``sim coverage``'s planted runs): stop the run as soon
    as its first divergence is settled (:class:`Settled`). The divergence is the whole run's;
    what came after it — the runs decided differently, the metrics, the verdicts — is not
    compared."""
    base = job.base
    mode = "exact" if job.tolerance is None else "drift"
    watch = Settled(base.decisions) if stop_at_divergence and mode == "exact" else None
    out = Outcome(base.case, base.seed, "error", mode, baseline_decisions=base.decisions)
    started = time.perf_counter()
    try:
        try:
            sc = Scenario.from_dict(base.manifest["scenario"])
            if job.sets:
                sc = sc.with_sets(job.sets)
        except (TypeError, ValueError, KeyError) as exc:
            raise _fail(base.path, f"its scenario cannot be built by this simulator ({exc}); "
                                   "record the baseline again") from None  # fmt: skip
        plan = materialize(sc)
        if workload_digest(plan) != base.manifest["workload_sha256"]:
            why = (f"--set {' '.join(job.sets)} changed the workload itself"
                   if job.sets else "the simulator's sampling changed")  # fmt: skip
            raise BaselineError(
                f"{base.case} seed {base.seed}: the recorded scenario no longer gives the same "
                f"workload (arrivals, durations, fleet events): {why}. That is not a scheduling "
                "change, and decisions on different inputs cannot be compared; record the "
                "baseline again (python -m sim baseline) if the new workload is intended."
            )
        result = run(plan, "mediator", database_url=job.database_url, progress=False,
                     until=watch)  # fmt: skip
    except BaselineError as exc:
        out.error = str(exc)
        out.wall_s = time.perf_counter() - started
        return out
    rows = decisions_of(result)
    out.now_decisions = rows
    out.decisions = len(rows)
    out.digest = digest(decisions_csv(rows))
    out.violations = list(result.violations)
    div = first_divergence(base.decisions, rows)
    stopped = "stopped_at_s" in result.manifest
    if div is not None:
        div.queue = result.queued_before(div.index, div.at_s)
        div.partial = stopped
    out.divergence = div
    out.wall_s = time.perf_counter() - started
    if stopped:  # at a settled divergence: nothing after it is compared
        if div is None:  # cannot be (Settled); never a pass for a run cut short
            out.status, out.error = "error", "the run stopped before its first divergence"
        else:
            out.status = "fail"
        return out
    summary = plain(result.summary(digits=None))
    out.metrics = drift(base.summary, summary, job.tolerance or 0.0)
    # Exact mode: the same starts, and the runs ending the same ways (a verdict decides nothing
    # about who runs where, so a change of it would pass the decisions alone).
    was, now = base.summary.get("by_verdict"), summary.get("by_verdict")
    if mode == "exact" and isinstance(was, dict) and was != now:
        out.verdicts = (was, now if isinstance(now, dict) else {})
    if mode == "exact":
        ok = div is None and out.verdicts is None
    else:
        ok = not any(m.moved for m in out.metrics)
    out.status = "pass" if ok and not out.violations else "fail"
    out.wall_s = time.perf_counter() - started
    return out


@dataclass
class GateReport:
    """Every case's outcome, and the writers for CI systems."""

    root: Path
    mode: str
    outcomes: list[Outcome]
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)  # the gate itself could not start

    @property
    def exit_code(self) -> int:
        if self.errors or any(o.status == "error" for o in self.outcomes):
            return 2
        return 1 if any(o.status == "fail" for o in self.outcomes) else 0

    def text(self) -> str:
        lines = [f"sim gate ({self.mode} mode) against {self.root}: "
                 f"{len(self.outcomes)} case(s) in {self.wall_s:.1f} s"]  # fmt: skip
        lines += [f"ERROR {e}" for e in self.errors]
        lines += [o.text() for o in self.outcomes]
        n_fail = sum(o.status != "pass" for o in self.outcomes)
        verdict = {0: "same", 1: "CHANGED", 2: "COULD NOT RUN"}[self.exit_code]
        lines.append(f"{verdict}: {len(self.outcomes) - n_fail} passed, {n_fail} failed "
                     f"(exit {self.exit_code})")  # fmt: skip
        return "\n".join(lines)

    def write_junit(self, path: str | Path) -> Path:
        """JUnit XML: one test case per scenario and seed (``failure`` when changed,
        ``error`` when it could not run)."""
        path = Path(path)
        suites = ET.Element("testsuites", name="sim gate")
        suite = ET.SubElement(
            suites, "testsuite", name=f"sim.outputs.gate.{self.mode}",
            tests=str(len(self.outcomes)),
            failures=str(sum(o.status == "fail" for o in self.outcomes)),
            errors=str(sum(o.status == "error" for o in self.outcomes) + len(self.errors)),
            skipped="0", time=f"{self.wall_s:.3f}",
        )  # fmt: skip
        for message in self.errors:
            tc = ET.SubElement(suite, "testcase", classname="sim.outputs.gate", name="baseline")
            ET.SubElement(tc, "error", message=message, type="BaselineError").text = message
        for o in self.outcomes:
            tc = ET.SubElement(suite, "testcase", classname=f"sim.outputs.gate.{self.mode}",
                               name=o.name, time=f"{o.wall_s:.3f}")  # fmt: skip
            if o.status == "fail":
                kind = "InvariantViolated" if o.violations else "SchedulingChanged"
                ET.SubElement(tc, "failure", message=o.headline(), type=kind).text = o.text()
            elif o.status == "error":
                ET.SubElement(tc, "error", message=o.error, type="BaselineError").text = o.error
            ET.SubElement(tc, "system-out").text = o.text()
        path.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
        return path

    def write_markdown(self, path: str | Path, charts_url: str | None = None) -> Path:
        """A summary for a pull-request comment; a PNG chart beside it for each changed case
        (decisions over time, baseline against now).

        The charts are shown inline by a relative link, which a file viewer renders. A CI job
        summary or a pull-request comment cannot show an image stored beside the file, so with
        ``charts_url`` (e.g. the CI run's page, where the charts are kept as an artifact) each
        chart is named and linked there instead. The first line is ``MARKER``, by which a CI job
        finds its own earlier comment to edit rather than post a new one per push."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        icon = {"pass": "✅", "fail": "❌", "error": "⚠️"}
        n_fail = sum(o.status == "fail" for o in self.outcomes)
        n_error = sum(o.status == "error" for o in self.outcomes) + len(self.errors)
        parts = [f"{n_fail} of {len(self.outcomes)} case(s) changed"] if n_fail else []
        parts += [f"{n_error} could not run"] if n_error else []
        title = ", ".join(parts) or "the scheduler's decisions are unchanged"
        lines = [MARKER, f"## Scheduler gate: {title}", "",
                 f"{self.mode.capitalize()} mode against `{self.root}`, "
                 f"{len(self.outcomes)} case(s) on the real Mediator in {self.wall_s:.0f} s.", "",
                 "| | case | decisions | result | wall (s) |", "|---|---|---|---|---|"]  # fmt: skip
        lines += [f"| ⚠️ | baseline | | {e} | |" for e in self.errors]
        for o in self.outcomes:
            lines.append(f"| {icon[o.status]} | `{o.name}` | {o.decisions or ''} | "
                         f"{o.headline().replace('|', '/')} | {o.wall_s:.1f} |")  # fmt: skip
        for o in self.outcomes:
            if o.status == "pass" and o.divergence is None:
                continue
            lines += ["", f"### `{o.name}`", "", "```text", o.text(metrics=False), "```"]
            if o.divergence is not None:
                chart = path.with_name(f"{path.stem}-{o.case}-seed{o.seed}.png")
                decisions_chart(o, chart)
                if charts_url:
                    lines += ["", f"Chart: [`{chart.name}`]({charts_url}) (decisions over time, "
                                  "in the run's artifact)."]  # fmt: skip
                else:
                    lines += ["", f"![{o.name}: decisions over time]({chart.name})"]
            if o.metrics:
                lines += ["", metrics_table(o.metrics, markdown=True)]
        lines += ["", "Refresh the baseline on purpose with `python -m sim baseline --out "
                      f"{self.root}` and commit it (README, \"The scheduler gate\")."]  # fmt: skip
        path.write_text("\n".join(lines) + "\n")
        return path


def decisions_chart(o: Outcome, path: Path) -> Path:
    """Cumulative decisions over virtual time, baseline against now, the divergence marked."""
    from matplotlib.figure import Figure  # no pyplot: no backend, no global state
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(6, 2.6))
    ax = fig.subplots()
    for rows, label, style in ((o.baseline_decisions, "baseline", "-"),
                               (o.now_decisions, "now", "--")):  # fmt: skip
        xs = [0.0] + [d.at_us / 1e6 for d in rows]
        ax.step(xs, range(len(xs)), style, where="post", label=label)
    if o.divergence is not None:
        ax.axvline(o.divergence.at_s, color="#C44E52", lw=1)
        ax.annotate(f"#{o.divergence.index} {o.divergence.run_id}", (o.divergence.at_s, 1),
                    color="#C44E52", fontsize=8)  # fmt: skip
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("decisions")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(o.name, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    return path


def check(
    root: str | Path,
    names: Sequence[str] = (),
    *,
    seeds: Sequence[int] = (),
    tolerance: float | None = None,
    sets: Sequence[str] = (),
    database_url: str | None = None,
    ignore_version: bool = False,
    jobs: int = 1,
    echo: Callable[[str], None] = lambda _: None,
) -> GateReport:
    """Re-run the baseline's cases under ``root`` on the real Mediator and compare.

    Args:
        names, seeds: a subset of the recorded cases (all when empty).
        tolerance: None for exact mode; a fraction for drift mode.
        sets: ``key=value`` overrides applied to every case (``python -m sim run --set``): ask
            what a setting does to the decisions; one that changes the workload is refused.
        jobs: cases run side by side in this many processes (1: in this process).
    """
    root = Path(root)
    mode = "exact" if tolerance is None else "drift"
    started = time.perf_counter()
    report = GateReport(root, mode, [])
    try:
        paths = find_cases(root, names, seeds)
    except BaselineError as exc:
        report.errors.append(str(exc))
        return report
    todo: list[_Job] = []
    for p in paths:
        try:
            todo.append(_Job(load_case(p, ignore_version=ignore_version), list(sets), tolerance,
                             database_url))  # fmt: skip
        except BaselineError as exc:
            seed = p.name.removeprefix("seed-")
            report.outcomes.append(Outcome(p.parent.name, int(seed) if seed.isdigit() else -1,
                                           "error", mode, error=str(exc)))  # fmt: skip
            echo(_progress(report.outcomes[-1]))
    # the costliest first, so parallel workers finish together
    todo.sort(key=lambda j: -int(j.base.manifest.get("mediator_calls", 0)))
    done = report.outcomes
    if jobs > 1 and len(todo) > 1:
        from sim.brokers.mediator import server_url  # the database stack (see project_version)

        url = server_url(database_url)  # one server for every worker (the embedded one if None)
        for j in todo:
            j.database_url = url
        with spawn_pool(min(jobs, len(todo))) as pool:
            futures = [pool.submit(check_case, j) for j in todo]
            for fut in as_completed(futures):
                done.append(fut.result())
                echo(_progress(done[-1]))
    else:
        for j in todo:
            done.append(check_case(j))
            echo(_progress(done[-1]))
    order = {p: k for k, p in enumerate(paths)}
    done.sort(key=lambda o: order.get(case_dir(root, o.case, o.seed), -1))
    report.wall_s = time.perf_counter() - started
    return report


def _progress(o: Outcome) -> str:
    return f"  {o.status:5s} {o.name} ({o.wall_s:.1f} s)"


# ---- the command line (registered by sim.outputs.cli) -----------------------------------------


def add_parsers(sub: Any) -> None:
    """``python -m sim baseline`` and ``python -m sim check``."""
    b = sub.add_parser("baseline", help="record the scheduler's decisions for the gate")
    b.add_argument(
        "scenarios",
        nargs="*",
        metavar="SCENARIO",
        help="built-in names or .toml files (default: every built-in scenario)",
    )
    b.add_argument("--out", required=True, help="the baseline directory (commit it)")
    b.add_argument("--scale", choices=("ci", "full"), default="ci")
    b.add_argument(
        "--seed",
        type=int,
        action="append",
        default=[],
        help="record at this seed (repeatable; default: each scenario's own)",
    )
    b.add_argument("--database-url", help="PostgreSQL server for the runs' databases")
    b.set_defaults(func=cmd_baseline)
    c = sub.add_parser("check", help="re-run the baseline's scenarios and compare decisions")
    c.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="a subset (default: all)")
    c.add_argument("--baseline", required=True, help="the baseline directory")
    c.add_argument("--seed", type=int, action="append", default=[], help="a subset of seeds")
    c.add_argument(
        "--tolerance",
        type=float,
        metavar="F",
        help="drift mode: fail only when a metric leaves its interval ± F × value",
    )
    c.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="run every case with this setting changed (what would it change?)",
    )
    c.add_argument("--junit", metavar="FILE", help="write JUnit XML (one test case per case)")
    c.add_argument("--markdown", metavar="FILE", help="write a pull-request comment (+ charts)")
    c.add_argument(
        "--charts-url",
        metavar="URL",
        help="link the charts at URL (e.g. the CI run's page) instead of showing them inline: "
        "a job summary or a comment cannot show files beside it",
    )
    c.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="cases side by side (default: one per core)",
    )
    c.add_argument(
        "--ignore-version",
        action="store_true",
        help="compare against a baseline of another project version",
    )
    c.add_argument("--database-url", help="PostgreSQL server for the runs' databases")
    c.set_defaults(func=cmd_check)


def cmd_baseline(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        paths = record(args.out, args.scenarios, scale=args.scale, seeds=args.seed,
                       database_url=args.database_url, echo=print)  # fmt: skip
    except BaselineError as exc:
        print(f"sim baseline: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(paths)} case(s) to {args.out}/ in {time.perf_counter() - started:.1f} s")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    if args.tolerance is not None and not args.tolerance >= 0:
        print("sim check: --tolerance must be a fraction ≥ 0, e.g. 0.05", file=sys.stderr)
        return 2
    try:
        for s in args.set:
            parse_set(s)
    except ValueError as exc:
        print(f"sim check: --set: {exc}", file=sys.stderr)
        return 2
    report = check(args.baseline, args.scenarios, seeds=args.seed, tolerance=args.tolerance,
                   sets=args.set, database_url=args.database_url,
                   ignore_version=args.ignore_version, jobs=max(1, args.jobs),
                   echo=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
    print(report.text())
    if args.junit:
        report.write_junit(args.junit)
    if args.markdown:
        report.write_markdown(args.markdown, charts_url=args.charts_url)
    return report.exit_code
