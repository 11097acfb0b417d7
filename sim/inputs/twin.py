"""A lab's own twin as a scenario (docs/design.md §20, "Replaying a twin"): `load(DIR)` reads a
folder `python -m sim twin export` wrote and returns a `Scenario` whose fleet is the lab's nodes
(one node group per capability class, each node under its own id) and whose arrivals are the
recorded runs (`Recorded`); `plan_parts` is what `sim.inputs.workload.materialize` makes the
`Plan` every broker runs of.

Why a scenario and not a separate engine: a twin is then what-if-able with everything a scenario
has — `with_overrides`/`--set` on a group's `count` (add or remove nodes of a class), scripted
`fleet.events` (take nodes dark for an interval), `settings` (`max_width`, TTLs, wake 7), the
arrivals' `scale` — and `sim.run`, `sim.plan` and the per-class plan take it as any other.

**What makes a replay exact.** The policy decides when something wakes it; so the replay must
submit each run, end each attempt and answer each ask at the recorded instant, and change the
fleet when it changed:

- a run is submitted at its recorded `submit_s`; a run rejected at submit, or cancelled while
  still queued, is left out (never promoted, and under R6 a run that never fits holds back
  nobody);
- the simulated daemon claims a step the instant it may (the run started, an earlier result or an
  answer came), so an attempt's *replay duration* is from that instant — the latest start, result
  or answer of its run not after the recorded claim — to its recorded result: the lab's claim
  latency is folded in and every result lands at its recorded instant. An attempt with no result
  in the window (lost with its node, or still going) lasts past the window;
- an ask is answered its recorded delay after it could be raised (same rule);
- the fleet's history becomes fleet events: `drain_set`/`drain_lifted` → `drain`/`undrain`,
  `restarted` → `restart`, `capabilities_changed` → `caps`, `appeared` and `returned` →
  `return` (a node first seen later starts dark), and an expiry at `E` (an `expired` row, or a
  `returned` row's `gone_at`) → `vanish` one µs after the later of `E − advert_ttl_seconds`
  (its last advert) and the node's last claim or result before `E`, so the replay's advert
  expires at `E` too;
- a run cancelled while running ends at its cancel instant: its attempt in flight then fails, and
  an ask open then is answered not ok.

**The window's edges.** `from_s` (`Recorded.from_s`; 0 is the export's `--since`) is the replay's
start, and the state the history shows there is its initial state: runs queued then are submitted
at 0 in their queue order; runs running then are submitted first and *pinned* to the nodes they
held (each such node advertises the extra capability `twin.node` = its id, which their needs
ask for), with the steps already done left out and their attempts in flight lasting to their
recorded result; the fleet is as the history says (absent nodes start dark, drains hold). Runs
still going at the window's end stop with it (`horizon_s`).

What a replay cannot know, and so takes from its scenario: the Mediator's settings (TTLs,
`max_width`, `wake_on_return`) and the nodes' heartbeat interval — pass the lab's to `load`. The
reaper runs on the replay's grid (every `renew_seconds` from 0): where the lab's reaper passes fell
elsewhere, a release by the reaper can land at another instant.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from sim.inputs.scenarios import (
    Exponential,
    Fleet,
    FleetEvent,
    Lognormal,
    NodeGroup,
    NodeSpec,
    Poisson,
    Recorded,
    Scenario,
    ScenarioError,
    Settings,
    StepSpec,
    Template,
    Workload,
)

#: The export formats a replay reads (`sim.brokers.twin.FORMAT` writes the newest).
FORMATS = ("mediator-twin/2",)
#: The capability a node running a run at the replay's start advertises, so that run is pinned.
PIN = "twin.node"
#: A stream number for the arrivals' scaling draws (beside `sim.inputs.workload`'s five).
SCALE = 5

US = 1_000_000


class TwinError(ScenarioError):
    """A folder that is not a replayable twin (one line naming what is wrong)."""


def _us(x: float) -> int:
    return round(x * US)


def manifest(path: str | Path) -> dict[str, Any]:
    """The twin's ``twin.json``, its format checked."""
    folder = Path(path)
    try:
        m: dict[str, Any] = json.loads((folder / "twin.json").read_text())
    except FileNotFoundError:
        raise TwinError(
            f"{folder}: no twin.json (write one with `python -m sim twin export`)"
        ) from None
    except (OSError, ValueError) as exc:
        raise TwinError(f"{folder}/twin.json: not readable ({exc.__class__.__name__})") from None
    if m.get("format") not in FORMATS:
        raise TwinError(
            f"{folder}/twin.json: format {m.get('format')!r}; this replay reads {FORMATS} "
            "(export the window again)"
        )
    return m


def rows(path: str | Path, table: str) -> Iterator[dict[str, str]]:
    """One table's rows as strings, in the export's order."""
    with (Path(path) / f"{table}.csv").open(newline="") as f:
        yield from csv.DictReader(f)


def aliases(path: str | Path) -> dict[str, str]:
    """The ids a pseudonymized twin's nodes are replayed under: ``<order>.<pseudonym>``, so they
    sort as the lab's own ids did (the matcher breaks ties by id, docs/design.md §4); ``{}`` for a
    twin with the lab's own ids."""
    folder = Path(path)
    if not manifest(folder).get("pseudonymized"):
        return {}
    order = {r["node_id"]: int(r["order"]) for r in rows(folder, "nodes")}
    width = len(str(max(len(order) - 1, 0)))
    return {n: f"{i:0{width}d}.{n}" for n, i in order.items()}


def plain_id(node: str) -> str:
    """A replayed node's id as the twin names it (see `aliases`)."""
    head, dot, rest = node.partition(".")
    return rest if dot and head.isdigit() else node


def _f(text: str) -> float | None:
    return float(text) if text != "" else None


def _json(text: str) -> Any:
    return json.loads(text) if text else None


# ---- the fleet -------------------------------------------------------------------------------


@dataclass
class _Node:
    present: bool
    drain: str
    caps: dict[str, Any]


def _canonical(caps: dict[str, Any]) -> str:
    return json.dumps(caps, sort_keys=True, separators=(",", ":"))


def _fleet(path: Path, from_s: float) -> tuple[dict[str, _Node], list[dict[str, Any]]]:
    """The fleet at `from_s` (each node's state) and the history rows after it (times as read)."""
    alias = aliases(path)
    nodes: dict[str, _Node] = {}
    for r in rows(path, "fleet_at_since"):
        nodes[alias.get(r["node_id"], r["node_id"])] = _Node(
            r["present"] == "true", r["drain"], _json(r["capabilities"]) or {}
        )
    later: list[dict[str, Any]] = []
    for r in rows(path, "fleet_events"):
        r["node_id"] = alias.get(r["node_id"], r["node_id"])
        ev = {**r, "at_s": float(r["at_s"]), "gone_s": _f(r["gone_s"]),
              "capabilities": _json(r["capabilities"])}  # fmt: skip
        if ev["at_s"] > from_s:
            later.append(ev)
            continue
        node = nodes.setdefault(r["node_id"], _Node(False, "", {}))
        kind = ev["kind"]
        node.present = kind != "expired"
        node.drain = ev["drain"]
        if ev["capabilities"] is not None:
            node.caps = ev["capabilities"]
    # An expiry before `from_s` that no row up to then shows: a later `returned` says when.
    for ev in later:
        if ev["kind"] == "returned" and ev["gone_s"] is not None and ev["gone_s"] <= from_s:
            gone = nodes.get(ev["node_id"])
            if gone is not None:
                gone.present = False
    for ev in later:  # a node first seen later: its capabilities as it first advertised them
        if ev["node_id"] not in nodes:
            nodes[ev["node_id"]] = _Node(False, "", ev["capabilities"] or {})
    return nodes, later


def _class_label(caps: dict[str, Any]) -> str:
    text = ",".join(f"{k}={v}" for k, v in sorted(caps.items())) or "any"
    keep = "".join(c if c.isalnum() or c in "=,._-" else "_" for c in text)
    return keep[:40]


# ---- loading ---------------------------------------------------------------------------------


def load(
    path: str | Path,
    *,
    settings: Settings | None = None,
    advert_interval_s: float | None = None,
    from_s: float = 0.0,
    scale: float = 1.0,
    seed: int = 0,
    name: str | None = None,
) -> Scenario:
    """The twin in folder ``path`` as a `Scenario` (see the module docstring).

    Args:
        path: a folder ``python -m sim twin export`` wrote.
        settings: the lab's Mediator settings (default: the Mediator's defaults).
        advert_interval_s: the lab's heartbeat interval (default: a third of the advert TTL, what
            the Mediator tells nodes).
        from_s: replay from this second of the window (its state there is the initial state).
        scale: scale the arrivals (1: as recorded).
        seed: the seed of the scaling draws (unused at scale 1).
        name: the scenario's name (default ``twin:<folder name>``).
    """
    folder = Path(path)
    m = manifest(folder)
    window = float(m["window_s"])
    if not 0 <= from_s < window:
        raise TwinError(f"from_s {from_s} must be within the window [0, {window})")
    st = settings or Settings()
    interval = advert_interval_s if advert_interval_s is not None else st.advert_ttl_seconds / 3
    nodes, _ = _fleet(folder, from_s)
    by_class: dict[str, list[str]] = defaultdict(list)
    caps_of: dict[str, dict[str, Any]] = {}
    for node_id in sorted(nodes):
        key = _canonical(nodes[node_id].caps)
        by_class[key].append(node_id)
        caps_of[key] = nodes[node_id].caps
    groups = tuple(
        NodeGroup(
            count=len(ids),
            capabilities=caps_of[key],
            names=tuple(ids),
            id_prefix=f"{_class_label(caps_of[key])}+",
        )
        for key, ids in sorted(by_class.items())
    )
    if not groups:
        raise TwinError(f"{folder}: the twin has no node")
    return Scenario(
        name=name or f"twin:{folder.name}",
        fleet=Fleet(groups=groups, advert_interval_s=interval),
        workload=Workload(Recorded(str(folder), from_s, scale), _templates(folder)),
        settings=st,
        horizon_s=window - from_s,
        seed=seed,
        description=f"the lab's recorded window {m['since']} .. {m['until']}",
    )


def _needs_name(needs: dict[str, Any]) -> str:
    """A template's name for one needs class: its roles and their needs, readably."""
    parts = []
    for role, want in sorted(needs.items()):
        inner = ",".join(f"{k}={v}" for k, v in sorted(want.items()))
        parts.append(f"{role}[{inner}]")
    return " ".join(parts) or "no roles"


def _templates(folder: Path) -> tuple[Template, ...]:
    """One template per needs class of the recorded runs (weights: their counts) — what the
    per-class plan reads to see which runs a node group serves; the runs themselves come from the
    tables."""
    counts: dict[str, int] = defaultdict(int)
    for r in rows(folder, "runs"):
        if not r["reject"]:
            counts[r["needs"]] += 1
    out = []
    for text, n in sorted(counts.items()):
        needs = json.loads(text)
        steps = tuple(StepSpec(name=f"on-{role}", role=role) for role in sorted(needs))
        if not steps:
            continue
        out.append(Template(_needs_name(needs), needs, steps, weight=float(n)))
    return tuple(out) or (
        Template("no runs", {"dut": {}}, (StepSpec("on-dut", role="dut"),), weight=1.0),
    )


# ---- materializing ---------------------------------------------------------------------------


@dataclass
class _Run:
    index: int
    row: dict[str, str]
    steps: list[dict[str, str]] = field(default_factory=list)
    attempts: list[dict[str, str]] = field(default_factory=list)
    asks: list[dict[str, str]] = field(default_factory=list)


def _runs(folder: Path) -> list[_Run]:
    alias = aliases(folder)
    runs: dict[str, _Run] = {}
    for i, r in enumerate(rows(folder, "runs")):
        if alias and r["assigned"]:
            r["assigned"] = json.dumps(
                {k: alias.get(v, v) for k, v in json.loads(r["assigned"]).items()}
            )
        runs[r["run_id"]] = _Run(i, r)
    for table, attr in (("steps", "steps"), ("attempts", "attempts"), ("asks", "asks")):
        for r in rows(folder, table):
            if "node_id" in r:
                r["node_id"] = alias.get(r["node_id"], r["node_id"])
            run = runs.get(r["run_id"])
            if run is not None:
                getattr(run, attr).append(r)
    return list(runs.values())


def _state_at(run: _Run, t: float) -> str | None:
    """Where the run stood at `t` for the replay: ``running``, ``queued``, ``new``, or None (not
    replayed: rejected, ended by then, or cancelled before it ever started)."""
    r = run.row
    if r["reject"]:
        return None
    ended, started, cancelled = _f(r["ended_s"]), _f(r["started_s"]), _f(r["cancelled_s"])
    if ended is not None and ended <= t:
        return None
    if cancelled is not None and (started is None or started > cancelled):
        return None
    if float(r["submit_s"]) >= t:
        return "new"
    if started is not None and started < t:
        return "running"
    return "queued"


def _outcome(text: str) -> str:
    return text if text in ("pass", "fail", "retry") else "fail"


def _typical(runs: list[_Run]) -> dict[tuple[str, str], int]:
    """The median recorded time (µs) of each step — by needs class and step name: an attempt
    from claim to result, an ask from raised to answered — for what the window's end cut."""
    spans: dict[tuple[str, str], list[int]] = defaultdict(list)
    for run in runs:
        cls = run.row["needs"]
        names = {int(s["seq"]): s["name"] for s in run.steps}
        for a in run.attempts:
            if (x := _f(a["result_s"])) is not None:
                spans[cls, names.get(int(a["seq"]), "")].append(_us(x - float(a["claimed_s"])))
        for a in run.asks:
            if (x := _f(a["answered_s"])) is not None:
                spans[cls, names.get(int(a["seq"]), "")].append(_us(x - float(a["raised_s"])))
    return {k: int(np.median(v)) for k, v in spans.items()}


def _arrival_parts(
    run: _Run,
    t0: float,
    window: float,
    pinned: bool,
    max_attempts: int,
    typical: dict[tuple[str, str], int],
) -> tuple[dict[str, Any], tuple[tuple[Attempt, ...], ...], tuple[Answer | None, ...], str]:
    """The contract (run_id not set), attempts and answers of one run replayed from `t0`, and
    its template's name. What the window's end cut (an attempt still going, a step not reached,
    an ask not answered) lasts past the end: its typical time, or to 1 µs past the end when that
    is longer — so a replay of the window as recorded never ends it inside the window, and a
    shifted copy (`Recorded.scale`) takes about what such a step takes."""
    r = run.row
    needs: dict[str, dict[str, Any]] = json.loads(r["needs"])
    template = _needs_name(needs)
    assigned: dict[str, str] = _json(r["assigned"]) or {}
    started = _f(r["started_s"])
    cancel = _f(r["cancelled_s"]) if started is not None else None
    past_end = _us(window) + 1  # 1 µs past the window's end (window seconds, in µs)
    # The instants that let a daemon claim (or a person see an ask): the run's start, every
    # result and every answer — in the lab's record.
    touches = sorted(
        {_us(max(started if started is not None else t0, t0))}
        | {_us(x) for a in run.attempts if (x := _f(a["result_s"])) is not None}
        | {_us(x) for a in run.asks if (x := _f(a["answered_s"])) is not None}
    )

    def ready(at_us: int) -> int:
        best = touches[0]
        for x in touches:
            if x > at_us:
                break
            best = x
        return max(best, _us(t0))

    by_seq: dict[int, list[dict[str, str]]] = defaultdict(list)
    for a in run.attempts:
        by_seq[int(a["seq"])].append(a)
    asks = {int(a["seq"]): a for a in run.asks}
    done: set[str] = set()
    if pinned:  # steps finished before t0 are not replayed
        for s in run.steps:
            seq = int(s["seq"])
            if s["kind"] == "ask":
                answered = _f(asks[seq]["answered_s"]) if seq in asks else None
                if answered is not None and answered <= t0:
                    done.add(s["name"])
            elif any(
                (x := _f(a["result_s"])) is not None and x <= t0 and a["outcome"] == "pass"
                for a in by_seq.get(seq, [])
            ):
                done.add(s["name"])
        for role, node in assigned.items():
            needs[role] = {**needs[role], PIN: node}
    steps: list[dict[str, Any]] = []
    outcomes: list[tuple[Attempt, ...]] = []
    answers: list[Answer | None] = []
    for s in run.steps:
        if s["name"] in done:
            continue
        seq = int(s["seq"])
        after = [x for x in (_json(s["after"]) or []) if x not in done]
        if s["kind"] == "ask":
            step: dict[str, Any] = {"name": s["name"], "kind": "ask", "ask": "(recorded ask)"}
            ask = asks.get(seq)
            raised = _f(ask["raised_s"]) if ask else None
            answered = _f(ask["answered_s"]) if ask else None
            ok = bool(ask and ask["ok"] == "true")
            if cancel is not None and (answered is None or answered > cancel):
                answered, ok = cancel, False
            typ = typical.get((r["needs"], s["name"]), 0)
            if raised is not None and answered is not None:
                answers.append(Answer((_us(answered) - ready(_us(raised))) / US, ok))
            else:
                since = ready(_us(raised)) if raised is not None else touches[-1]
                answers.append(Answer(max(past_end - since, typ) / US, True))
            outcomes.append(())
        else:
            step = {"name": s["name"], "role": s["role"], "uses": "sim", "with": {}}
            typ = typical.get((r["needs"], s["name"]), 0)
            tried: list[Attempt] = []
            for a in sorted(by_seq.get(seq, []), key=lambda a: int(a["attempt"])):
                claimed, result = float(a["claimed_s"]), _f(a["result_s"])
                if result is not None and result <= t0:
                    continue  # an attempt over before the replay starts
                if cancel is not None and claimed >= cancel:
                    break
                outcome = _outcome(a["outcome"])
                if cancel is not None and (result is None or result > cancel):
                    result, outcome = cancel, "fail"
                start = ready(_us(claimed))
                end = _us(result) if result is not None else max(past_end, start + typ)
                tried.append(Attempt((end - start) / US, outcome))
            if not tried:
                if cancel is not None:  # never claimed before the cancel: it fails there
                    start = ready(_us(cancel))
                    tried.append(Attempt((_us(cancel) - start) / US, "fail"))
                else:  # never claimed in the window
                    tried.append(Attempt(max(past_end - touches[-1], typ) / US, "pass"))
            while len(tried) < max_attempts:  # a replay that diverges may try more often
                tried.append(tried[-1])
            outcomes.append(tuple(tried))
            answers.append(None)
        if after:
            step["after"] = after
        steps.append(step)
    # A role none of whose steps is left had its node released already (R15): not replayed.
    used = {st["role"] for st in steps if "role" in st}
    needs = {role: want for role, want in needs.items() if role in used or not pinned}
    contract = {"work_id": r["work_id"], "roles": needs, "steps": steps}
    return contract, tuple(outcomes), tuple(answers), template


def _fleet_events(
    folder: Path, t0: float, runs: list[_Run], ids: set[str], ttl: float
) -> tuple[dict[str, _Node], list[FleetEvent]]:
    """The fleet at `t0` and its recorded changes after it, as fleet events (times from t0)."""
    nodes, later = _fleet(folder, t0)
    # Each node's claims and results, for when it went dark (see the module docstring).
    activity: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        for a in run.attempts:
            activity[a["node_id"]].append(float(a["claimed_s"]))
            if (x := _f(a["result_s"])) is not None:
                activity[a["node_id"]].append(x)
    out: list[tuple[float, int, FleetEvent]] = []
    up = {n: node.present for n, node in nodes.items()}
    for n, node in sorted(nodes.items()):
        if n not in ids:
            continue
        if not node.present:
            out.append((0.0, 0, FleetEvent(0.0, n, "vanish")))
        if node.drain:
            out.append((0.0, 1, FleetEvent(0.0, n, "drain", policy=node.drain)))

    def vanish(n: str, gone: float) -> None:
        if not up.get(n, False) or gone <= t0:
            up[n] = False
            return
        last = max([x for x in activity.get(n, ()) if x < gone] + [gone - ttl])
        at = max(_us(last - t0) + 1, 1) / US
        out.append((at, 0, FleetEvent(at, n, "vanish")))
        up[n] = False

    seen_return: set[tuple[str, float]] = set()
    for ev in later:
        n, kind, at = ev["node_id"], ev["kind"], round(ev["at_s"] - t0, 6)
        if n not in ids:
            continue
        if kind == "expired":
            vanish(n, ev["at_s"])
        elif kind in ("appeared", "returned"):
            if ev["gone_s"] is not None:
                vanish(n, ev["gone_s"])
            if not up.get(n, False):
                out.append((at, 2, FleetEvent(at, n, "return")))
                seen_return.add((n, at))
                up[n] = True
        elif kind == "restarted" and (n, at) not in seen_return:
            out.append((at, 3, FleetEvent(at, n, "restart")))
        elif kind == "drain_set":
            out.append((at, 4, FleetEvent(at, n, "drain", policy=ev["drain"] or "graceful")))
        elif kind == "drain_lifted":
            out.append((at, 4, FleetEvent(at, n, "undrain")))
        elif kind == "capabilities_changed" and ev["capabilities"] is not None:
            out.append((at, 5, FleetEvent(at, n, "caps", capabilities=ev["capabilities"])))
    out.sort(key=lambda x: (x[0], x[1]))
    return nodes, [e for _, _, e in out]


# The run's pre-sampled outcomes, one definition for both readers: `sim.inputs.workload` (which
# imports this module, so they cannot live there) exports them as its own.
class Attempt(NamedTuple):
    """One pre-sampled attempt of an exec step: how long it runs and what it reports."""

    duration_s: float
    outcome: str  # "pass" | "fail" | "retry"


class Answer(NamedTuple):
    """The pre-sampled human answer to an ask step: after `delay_s`, ok or not."""

    delay_s: float
    ok: bool


class Arrival(NamedTuple):
    """One replayed run, before `sim.inputs.workload` makes it an `Arrival`."""

    at_s: float
    run_id: str
    template: str
    contract: dict[str, Any]
    step_outcomes: tuple[tuple[Attempt, ...], ...]
    ask_answers: tuple[Answer | None, ...]


class Parts(NamedTuple):
    """What `sim.inputs.workload.materialize` makes a twin's `Plan` of."""

    nodes: tuple[NodeSpec, ...]
    arrivals: tuple[Arrival, ...]
    fleet_events: tuple[FleetEvent, ...]
    source_ids: tuple[str, ...]


def plan_parts(scenario: Scenario) -> Parts:
    """The plan of a twin scenario (its arrivals `Recorded`): see the module docstring."""
    proc = scenario.workload.arrivals
    assert isinstance(proc, Recorded)
    folder, t0 = Path(proc.path), proc.from_s
    window = float(manifest(folder)["window_s"])
    st = scenario.settings
    specs = scenario.fleet.nodes()
    ids = {n.node_id for n in specs}
    runs = _runs(folder)
    states = [(run, _state_at(run, t0)) for run in runs]
    kept = [(run, s) for run, s in states if s is not None]
    _, events = _fleet_events(folder, t0, runs, ids, st.advert_ttl_seconds)

    typical = _typical(runs)
    pins: set[str] = set()
    items: list[tuple[Any, ...]] = []
    for run, s in kept:
        pinned = s == "running"
        contract, outcomes, answers, template = _arrival_parts(
            run, t0, window, pinned, st.max_attempts, typical
        )
        if pinned:
            pins.update(str(v[PIN]) for v in contract["roles"].values() if PIN in v)
            key = (0, 0, (_us(float(run.row["started_s"])), run.index))
        elif s == "queued":
            key = (0, 1, (0, run.index))
        else:
            key = (_us(float(run.row["submit_s"]) - t0), 2, (0, run.index))
        items.append((*key, run.row["run_id"], contract, outcomes, answers, template))
    pins = {p for p in pins if p in ids}
    items.sort(key=lambda x: x[:3])
    items = _scaled(items, proc.scale, scenario.seed, window - t0)
    if scenario.horizon_runs is not None:  # a capped workload (a plan's confirmation)
        items = items[: scenario.horizon_runs]

    width = max(7, len(str(max(len(items) - 1, 0))))
    arrivals = []
    sources = []
    for i, (at_us, _g, _o, source, contract, outcomes, answers, template) in enumerate(items):
        run_id = f"r{i:0{width}d}"
        arrivals.append(
            Arrival(at_us / US, run_id, template, {"run_id": run_id, **contract}, outcomes, answers)
        )
        sources.append(source)
    nodes = tuple(
        NodeSpec(n.node_id, n.label, {**n.capabilities, PIN: n.node_id})
        if n.node_id in pins else n
        for n in specs
    )  # fmt: skip
    events = [
        FleetEvent(e.at_s, e.node_id, e.kind, e.policy, {**e.capabilities, PIN: e.node_id})
        if e.kind == "caps" and e.node_id in pins and e.capabilities is not None else e
        for e in events
    ]  # fmt: skip
    # A node holding a pinned run may drain only once that run has it (1 µs in).
    events = [
        FleetEvent(1e-6, e.node_id, e.kind, e.policy)
        if e.at_s == 0 and e.kind == "drain" and e.node_id in pins else e
        for e in events
    ]  # fmt: skip
    scripted = sorted(scenario.fleet.events, key=lambda e: e.at_s)
    fleet = sorted([*events, *scripted], key=lambda e: e.at_s)
    if scenario.fleet.random:
        raise TwinError("a twin replays its recorded fleet; random fleet processes do not apply")
    return Parts(nodes, tuple(arrivals), tuple(fleet), tuple(sources))


def _scaled(items: list[Any], scale: float, seed: int, horizon: float) -> list[Any]:
    """The arrivals scaled (see `Recorded`): runs at the replay's start are always kept."""
    if scale == 1:
        return items
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(SCALE,)))
    fresh = [x for x in items if x[1] == 2]
    base = [x for x in items if x[1] != 2]
    copies = math.ceil(scale)
    keep_p = scale / copies
    out = list(base)
    h_us = max(_us(horizon), 1)
    for j in range(copies):
        shift = 0 if j == 0 else int(rng.integers(0, h_us))
        keep = rng.random(len(fresh)) < keep_p
        for x, k in zip(fresh, keep, strict=True):
            if k:
                source = x[3] if j == 0 else f"{x[3]}~{j}"
                out.append(((x[0] + shift) % h_us, 2, x[2], source, *x[4:]))
    out.sort(key=lambda x: x[:3])
    return out


# ---- what-ifs (docs/design.md §20, "What-ifs on a twin") -------------------------------------


def group_of(twin: Scenario, cls: str | dict[str, Any]) -> int:
    """The index of the twin's node group for a capability class: its capabilities (a dict, or
    ``"board=stm32"``-style text, matched against the group's own), or its ``id_prefix``."""
    groups = twin.fleet.groups
    for i, g in enumerate(groups):
        if isinstance(cls, dict):
            if g.capabilities == cls:
                return i
        elif cls in (g.id_prefix, g.id_prefix.rstrip("+"), _class_label(g.capabilities)):
            return i
    known = ", ".join(repr(g.id_prefix.rstrip("+")) for g in groups)
    raise TwinError(f"no node group of class {cls!r}; the twin's classes are {known}")


def with_nodes(twin: Scenario, cls: str | dict[str, Any], delta: int) -> Scenario:
    """The twin with ``delta`` nodes more (or fewer, when negative) of a capability class: new
    nodes advertise the class's capabilities from the start; fewer keeps the first nodes of the
    class (in id order) and drops the rest with their history."""
    i = group_of(twin, cls)
    count = twin.fleet.groups[i].count + delta
    if count < 1:
        raise TwinError(f"class {cls!r} would have {count} nodes; a class keeps at least one")
    return twin.with_overrides({f"fleet.groups.{i}.count": count})


def dark(
    twin: Scenario, nodes: list[str] | tuple[str, ...], from_s: float, to_s: float
) -> Scenario:
    """The twin with ``nodes`` gone dark from ``from_s`` to ``to_s`` (seconds of the replay):
    each vanishes (its step in flight lost, its advert left to expire — the vanished-node
    window) and returns with a fresh daemon."""
    if not 0 <= from_s < to_s:
        raise TwinError(f"a dark interval needs 0 <= from_s < to_s, not {from_s} .. {to_s}")
    events = [*twin.fleet.events]
    for n in nodes:
        events += [FleetEvent(from_s, n, "vanish"), FleetEvent(to_s, n, "return")]
    return twin.with_overrides(
        {"fleet.events": [{"at_s": e.at_s, "node_id": e.node_id, "kind": e.kind,
                           "policy": e.policy} for e in events]}
    )  # fmt: skip


def scaled(twin: Scenario, factor: float) -> Scenario:
    """The twin with its arrivals scaled by ``factor`` (see `Recorded`)."""
    return twin.with_overrides({"workload.arrivals.scale": factor})


# ---- what the lab decided --------------------------------------------------------------------


def recorded_decisions(path: str | Path, from_s: float = 0.0) -> list[tuple[int, str, str]]:
    """The lab's own decisions from `from_s` to the window's end: (µs from `from_s`, run id,
    its nodes, comma-joined in id order, as `Result.promotions` shows them) for every run started
    then, ordered by instant and queue order — what a replay of the same window must reproduce."""
    folder = Path(path)
    window = float(manifest(folder)["window_s"])
    out = []
    for i, r in enumerate(rows(folder, "runs")):
        started = _f(r["started_s"])
        if r["reject"] or started is None or not from_s <= started < window:
            continue
        roles = ",".join(sorted(set((_json(r["assigned"]) or {}).values())))
        out.append((_us(started - from_s), i, r["run_id"], roles))
    out.sort()
    return [(at, run_id, roles) for at, _i, run_id, roles in out]


def queue_rank(path: str | Path) -> dict[str, int]:
    """Each recorded run's position in the export (its queue order: created_at, run_id)."""
    return {r["run_id"]: i for i, r in enumerate(rows(path, "runs"))}


# ---- a lab day the project generates itself ---------------------------------------------------


def lab_day(hours: float = 8.0, arrival_rate: float = 0.012, seed: int = 0) -> Scenario:
    """A small embedded-test lab, for exporting a twin of it (the notebook, the tests): three
    capability classes — stm32 boards, imx8 boards, linux hosts — runs of three kinds (flash and
    test a stm32, with retries; boot an imx8 and drive it from a host, with a person checking the
    display; build on a host), a stm32 board that vanishes for half an hour, a host drained for an
    hour, an imx8 daemon restart. Poisson arrivals at ``arrival_rate`` per second for ``hours``."""
    stm32, imx8, host = {"board": "stm32"}, {"board": "imx8", "arch": "arm"}, {"host": "linux"}
    templates = (
        Template("stm32 test", {"dut": stm32}, (
            StepSpec("flash", role="dut", duration=Lognormal(60.0, 0.5), retry_p=0.1),
            StepSpec("test", role="dut", after=("flash",), duration=Exponential(240.0),
                     fail_p=0.05),
        ), weight=5.0),
        Template("imx8 hil", {"dut": imx8, "ctl": host}, (
            StepSpec("boot", role="dut", duration=Lognormal(90.0, 0.3)),
            StepSpec("display", kind="ask", ask="Is the splash screen shown?", after=("boot",),
                     answer_delay=Exponential(120.0), ok_p=0.95),
            StepSpec("drive", role="ctl", after=("display",), duration=Exponential(300.0)),
        ), weight=2.0),
        Template("host build", {"host": host}, (
            StepSpec("build", role="host", duration=Lognormal(200.0, 0.8)),
        ), weight=3.0),
    )  # fmt: skip
    end = hours * 3600.0
    events = (
        FleetEvent(0.30 * end, "stm32-002", "vanish"),
        FleetEvent(0.30 * end + 1800.0, "stm32-002", "return"),
        FleetEvent(0.50 * end, "host-000", "drain"),
        FleetEvent(0.50 * end + 3600.0, "host-000", "undrain"),
        FleetEvent(0.70 * end, "imx8-001", "restart"),
    )
    return Scenario(
        name="lab_day",
        fleet=Fleet(
            groups=(
                NodeGroup(4, stm32, id_prefix="stm32-"),
                NodeGroup(2, imx8, id_prefix="imx8-"),
                NodeGroup(3, host, id_prefix="host-"),
            ),
            advert_interval_s=10.0,
            events=events,
        ),
        workload=Workload(Poisson(arrival_rate), templates),
        settings=Settings(),
        horizon_s=end,
        seed=seed,
        description="a lab day: stm32 and imx8 boards, linux hosts, a vanished board",
    )
