"""Replay and audit a lab's twin (docs/design.md §20, "Replaying a twin"; issue 27 §3): did the
broker in production do what its rules say?

``replay`` runs an exported window (`sim.inputs.twin`) on a broker and compares its decisions —
which run started, when, on which nodes — with the ones the lab recorded, the gate's way
(`sim.outputs.gate.first_divergence`). Identical means the lab's broker decided, at every step of
that window, what the policy decides.

``audit`` lists *every* decision where production parted from the policy, not only the first:
after a divergence at instant ``t`` the production's state just after ``t`` is taken as given —
the twin replayed again from ``t`` + 1 µs, whatever ran then running on the nodes it held
(`Recorded.from_s`) — and compared on. Each finding is explained as the gate explains a
divergence: what production did at that instant, what the policy does, the queue then.

A replay can only be as exact as the history: what it cannot know (the lab's settings and
heartbeat interval, when its reaper ran) comes from the scenario, so give ``load`` the lab's.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.brokers.entry import BrokerChoice, run
from sim.inputs.scenarios import Recorded, Scenario
from sim.inputs.twin import load, manifest, plain_id, queue_rank, recorded_decisions, rows
from sim.outputs.gate import Decision, Divergence, first_divergence, seconds
from sim.platform.measure import Result

STARTED = "started"  # a replay started at 0 what the lab started by promotion: one kind


def starting_at(twin: Scenario, from_s: float) -> Scenario:
    """The twin replayed from second ``from_s`` of its window (the state there is the start)."""
    proc = twin.workload.arrivals
    if not isinstance(proc, Recorded):
        raise ValueError(f"scenario {twin.name!r} is not a twin (its arrivals are not recorded)")
    window = float(manifest(proc.path)["window_s"])
    wl = dataclasses.replace(twin.workload, arrivals=dataclasses.replace(proc, from_s=from_s))
    return dataclasses.replace(twin, workload=wl, horizon_s=window - from_s)


def production(twin: Scenario) -> list[Decision]:
    """The lab's recorded decisions from the twin's start on (µs from the window's start)."""
    proc = twin.workload.arrivals
    assert isinstance(proc, Recorded)
    rank = queue_rank(proc.path)
    base = round(proc.from_s * 1_000_000)
    rows = [(base + at, rank[r], r, roles) for at, r, roles in
            recorded_decisions(proc.path, proc.from_s)]  # fmt: skip
    waiting = _lab_queue(proc.path)
    return [Decision(at, r, STARTED, roles, waiting(at)) for at, _k, r, roles in sorted(rows)]


def _lab_queue(folder: str) -> Any:
    """``queued(at_us)``: how many runs the lab had QUEUED just before ``at_us`` (µs from the
    window's start) — submitted before, and neither started, ended nor cancelled before."""
    came, left = [], []
    for r in rows(folder, "runs"):
        if r["reject"]:
            continue
        came.append(round(float(r["submit_s"]) * 1_000_000))
        out = [float(x) for x in (r["started_s"], r["ended_s"], r["cancelled_s"]) if x]
        left.append(round(min(out) * 1_000_000) if out else 2**62)
    came.sort()
    left.sort()
    return lambda at: bisect.bisect_left(came, at) - bisect.bisect_left(left, at)


def replayed(twin: Scenario, result: Result) -> list[Decision]:
    """A replay's decisions under the lab's run ids (µs from the window's start), the runs that
    were already running at the replay's start left out (they are its initial state)."""
    proc = twin.workload.arrivals
    assert isinstance(proc, Recorded)
    rank = queue_rank(proc.path)
    base = round(proc.from_s * 1_000_000)
    horizon = round((twin.horizon_s or 0) * 1_000_000)
    running = _running_at_start(twin)
    source = dict(zip(result.runs["run_id"], result.runs["source_id"], strict=True))
    rows = []
    promotions = result.promotions[["at_s", "run_id", "nodes"]]
    for at_s, run_id, roles in promotions.itertuples(index=False, name=None):
        at = round(float(at_s) * 1_000_000)
        src = str(source.get(run_id, run_id))
        if src in running or at >= horizon:
            continue
        nodes = ",".join(sorted(plain_id(n) for n in str(roles).split(",") if n))
        rows.append((base + at, rank.get(src, len(rank)), src, nodes))
    return [Decision(at, r, STARTED, roles, 0) for at, _k, r, roles in sorted(rows)]


def _running_at_start(twin: Scenario) -> set[str]:
    proc = twin.workload.arrivals
    assert isinstance(proc, Recorded)
    out = set()
    for r in rows(proc.path, "runs"):
        started = float(r["started_s"]) if r["started_s"] else None
        if started is not None and started < proc.from_s:
            out.add(r["run_id"])
    return out


@dataclass
class Replay:
    """One replay of a twin compared with the lab: ``divergence`` None when identical."""

    twin: Scenario
    result: Result
    lab: list[Decision]
    policy: list[Decision]
    divergence: Divergence | None

    @property
    def identical(self) -> bool:
        return self.divergence is None


def replay(twin: Scenario, broker: BrokerChoice = "model", **kwargs: Any) -> Replay:
    """Replay ``twin`` on ``broker`` (as ``sim.run`` takes it) and compare with the lab."""
    result = run(twin, broker, progress=False, **kwargs)
    lab, policy = production(twin), replayed(twin, result)
    div = first_divergence(lab, policy)
    if div is not None:
        div.queue = _queue(twin, result, div.at_us)
    return Replay(twin, result, lab, policy, div)


def _queue(twin: Scenario, result: Result, at_us: int) -> list[str]:
    """The policy's queue just before ``at_us``, in queue order (lab run ids)."""
    proc = twin.workload.arrivals
    assert isinstance(proc, Recorded)
    rel = (at_us - round(proc.from_s * 1_000_000)) / 1_000_000
    runs = result.runs
    waiting = runs[(runs["created_at"] < rel) & ~(runs["started_at"] < rel)
                   & ~(runs["ended_at"] < rel)]  # fmt: skip
    waiting = waiting.sort_values(["created_at", "run_id"])
    return [str(s) for s in waiting["source_id"]]


@dataclass
class Finding:
    """One decision where the lab parted from the policy, explained as the gate explains it
    (``divergence``: times in seconds from the window's start), found by the replay that
    started at ``from_s``."""

    from_s: float
    divergence: Divergence

    @property
    def run_id(self) -> str:
        return self.divergence.run_id

    @property
    def at_s(self) -> float:
        return self.divergence.at_s

    def text(self) -> str:
        return explain(self.divergence)


#: The gate's words (baseline, now) as an audit says them (the lab, the policy).
_WORDS = (
    ("  baseline: ", "  lab:      "), ("  now:      ", "  policy:   "),
    ("  later, now:      ", "  later, policy:   "), ("  in the baseline: ", "  in the lab:      "),
    (", now: ", ", policy: "), ("(baseline: ", "(lab: "), ("(baseline ", "(lab "),
    (" decisions, now ", " decisions, policy "),
)  # fmt: skip


def explain(div: Divergence) -> str:
    """The gate's explanation of a divergence (`Divergence.text`), the lab in the baseline's
    place and the policy in the place of now."""
    text = div.text()
    for old, new in _WORDS:
        text = text.replace(old, new)
    return text


@dataclass
class Audit:
    """Every decision of the window where the lab's broker did not do what the policy does."""

    folder: str
    broker: str
    decisions: int  # the lab's decisions in the window
    findings: list[Finding] = field(default_factory=list)
    replays: int = 0
    truncated: bool = False  # stopped at ``max_findings``

    @property
    def clean(self) -> bool:
        return not self.findings

    def verdict(self) -> str:
        if self.clean:
            return (f"clean: all {self.decisions} decisions of the window are the policy's "
                    f"({self.broker} replay)")  # fmt: skip
        more = " (stopped there)" if self.truncated else ""
        runs = ", ".join(f.run_id for f in self.findings[:8])
        return (f"{len(self.findings)} decision(s) of {self.decisions} differ from the policy"
                f"{more}: {runs}")  # fmt: skip

    def text(self) -> str:
        lines = [f"twin {self.folder}: {self.verdict()}"]
        for i, f in enumerate(self.findings, 1):
            lines.append(f"\n#{i} at {seconds(f.divergence.at_us)} s (replay from {f.from_s} s)")
            lines.append(f.text())
        return "\n".join(lines)


def audit(twin: Scenario, broker: BrokerChoice = "model", max_findings: int = 50) -> Audit:
    """Audit the twin's window (see the module docstring): replay, and after each divergence
    replay again from just after it, until the rest of the window agrees."""
    proc = twin.workload.arrivals
    if not isinstance(proc, Recorded):
        raise ValueError(f"scenario {twin.name!r} is not a twin (its arrivals are not recorded)")
    window = float(manifest(proc.path)["window_s"])
    out = Audit(proc.path, broker if isinstance(broker, str) else "custom",
                len(production(twin)))  # fmt: skip
    at = proc.from_s
    while True:
        rep = replay(starting_at(twin, at), broker)
        out.replays += 1
        if rep.divergence is None:
            return out
        out.findings.append(Finding(at, rep.divergence))
        nxt = (rep.divergence.at_us + 1) / 1_000_000
        if len(out.findings) >= max_findings or nxt >= window:
            out.truncated = len(out.findings) >= max_findings
            return out
        at = nxt


# ---- the command line ----------------------------------------------------------------------------


def twin_scenario(folder: str, sets: Sequence[str] = ()) -> Scenario:
    """A twin folder as a scenario, ``--set`` assignments applied (``settings.advert_ttl_seconds``,
    ``fleet.advert_interval_s``: the lab's settings)."""
    sc = load(folder)
    return sc.with_sets(list(sets)) if sets else sc


def cmd_audit(args: Any) -> int:
    """``python -m sim twin audit DIR``: exit 0 clean, 1 with findings."""
    sc = twin_scenario(args.folder, args.set or [])
    result = audit(sc, args.broker, max_findings=args.max_findings)
    print(result.text())
    return 0 if result.clean else 1


def cmd_replay(args: Any) -> int:
    """``python -m sim twin replay DIR``: exit 0 when the replay reproduces every decision."""
    sc = twin_scenario(args.folder, args.set or [])
    rep = replay(sc, args.broker)
    n = len(rep.lab)
    if rep.divergence is None:
        print(f"twin {args.folder}: the {args.broker} replay reproduces all {n} decisions")
        return 0
    print(f"twin {args.folder}: the {args.broker} replay differs from the lab")
    print(explain(rep.divergence))
    return 1


def add_parsers(tw_sub: Any, set_help: str) -> None:
    for name, func, what in (
        ("audit", cmd_audit, "list every decision where the lab's broker differs from the policy"),
        ("replay", cmd_replay, "replay the window and compare its decisions with the lab's"),
    ):
        p = tw_sub.add_parser(name, help=what, description=what)
        p.add_argument("folder", metavar="DIR", help="a folder `sim twin export` wrote")
        p.add_argument("--broker", choices=("model", "mediator"), default="model")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help=set_help)
        if name == "audit":
            p.add_argument("--max-findings", type=int, default=50)
        p.set_defaults(func=func)
