"""Scenarios: what a simulation is made of (design.md §20) — a fleet, a workload and Mediator
settings.

A scenario is plain data. It says *what* to simulate; `sim.inputs.workload.materialize` turns it and
its seed into the exact, pre-sampled list of arrivals and fleet events, and both the reference model
(`sim.brokers.model`) and the real-Mediator engine consume that same plan. Keeping the description
free of random state is what makes "same scenario and seed → same result" hold across engines.

Everything here is a frozen dataclass, so a notebook can tweak a scenario with
`dataclasses.replace` (or `Scenario.with_overrides({"settings.max_width": 2})` for dotted paths,
which is what `python -m sim run --set key=value` needs), and everything round-trips through TOML
(`Scenario.from_toml`, `Scenario.to_toml`) and plain dicts (`to_dict`). `scenario_hash()` is a
stable digest of the dict form, for manifests.

The built-in scenarios of design.md §20 are functions returning a `Scenario`; `SCENARIOS` maps their
names to them for `python -m sim list`. Their heartbeat settings follow design.md §20: coarse advert
intervals where nothing vanishes (adverts stay a small share of the Mediator calls), fine ones only
where vanishing nodes are the subject.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import numbers
import re
import tomllib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeAlias

import numpy as np

from mediator import Config, ConfigError
from sim.analysis import runs_for_load

# ---------------------------------------------------------------------------------------------
# Distributions (step durations, answer delays)
# ---------------------------------------------------------------------------------------------


class ScenarioError(ValueError):
    """A scenario that cannot be simulated; the message is one line that names the field
    (issue 14 §3: say what is wrong at construction, not deep inside numpy)."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ScenarioError(message)


@dataclass(frozen=True)
class Constant:
    """Always `value` seconds."""

    value: float
    tag: ClassVar[str] = "constant"

    def __post_init__(self) -> None:
        _check(self.value >= 0, f"constant duration {self.value} must be >= 0")

    @property
    def mean(self) -> float:
        """The distribution's mean."""
        return float(self.value)

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        """Draw `size` values (the generator is not advanced: a constant needs no randomness)."""
        return np.full(size, float(self.value))


@dataclass(frozen=True)
class Exponential:
    """Exponential with the given mean (the M of M/M/c)."""

    mean: float
    tag: ClassVar[str] = "exponential"

    def __post_init__(self) -> None:
        _check(self.mean > 0, f"exponential mean {self.mean} must be > 0")

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        """Draw `size` values."""
        return rng.exponential(self.mean, size)


@dataclass(frozen=True)
class Lognormal:
    """Lognormal with the given mean and log-space standard deviation `sigma` (heavy tails)."""

    mean: float
    sigma: float = 1.0
    tag: ClassVar[str] = "lognormal"

    def __post_init__(self) -> None:
        _check(self.mean > 0 and self.sigma >= 0, f"lognormal mean {self.mean} must be > 0 "
               f"and sigma {self.sigma} >= 0")  # fmt: skip

    @classmethod
    def with_cv(cls, mean: float, cv: float) -> Lognormal:
        """The lognormal with this mean and coefficient of variation (sd / mean):
        sigma = sqrt(ln(1 + cv^2))."""
        _check(cv >= 0, f"cv {cv} must be >= 0")
        return cls(mean, math.sqrt(math.log1p(cv * cv)))

    @property
    def cv(self) -> float:
        """Coefficient of variation, sqrt(exp(sigma^2) - 1)."""
        return math.sqrt(math.expm1(self.sigma**2))

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        """Draw `size` values; mu is chosen so the mean is `mean`."""
        mu = math.log(self.mean) - self.sigma**2 / 2
        return rng.lognormal(mu, self.sigma, size)


@dataclass(frozen=True)
class Empirical:
    """Resample uniformly from observed `values` (e.g. run times from a trace)."""

    values: tuple[float, ...]
    tag: ClassVar[str] = "empirical"

    @property
    def mean(self) -> float:
        """The mean of the observed values."""
        return float(np.mean(self.values))

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        """Draw `size` values with replacement."""
        return rng.choice(np.asarray(self.values, dtype=float), size)


Dist: TypeAlias = Constant | Exponential | Lognormal | Empirical
_DISTS: dict[str, type[Any]] = {c.tag: c for c in (Constant, Exponential, Lognormal, Empirical)}

# ---------------------------------------------------------------------------------------------
# Fleet
# ---------------------------------------------------------------------------------------------

FLEET_EVENT_KINDS = ("vanish", "return", "drain", "undrain", "restart", "caps", "cancel")
DRAIN_POLICIES = ("graceful", "at-boundary")


@dataclass(frozen=True)
class NodeSpec:
    """One concrete node of a fleet, as `Fleet.nodes()` expands the groups."""

    node_id: str
    label: str
    capabilities: dict[str, Any]


@dataclass(frozen=True)
class NodeGroup:
    """`count` identical nodes.

    Node ids are `f"{id_prefix}{i:03d}"` for i = 0..count-1 (zero-padded wider if needed, so that
    string order, which the matcher uses, is numeric order); `label` is a format string that may
    use `{i}` and `{node_id}`. `names`, when given, are the ids of the group's first nodes (a
    lab's twin keeps its nodes' own ids, docs/design.md §20): a `count` below their number keeps
    the first `count` of them, one above adds nodes named by the prefix.
    """

    count: int
    capabilities: dict[str, Any]
    label: str = "{node_id}"
    id_prefix: str = "n"
    names: tuple[str, ...] | None = None  # None: left out of the dict form (hashes unchanged)

    def __post_init__(self) -> None:
        _check(
            isinstance(self.count, int) and self.count >= 1,
            f"node group {self.id_prefix!r}: count {self.count!r} must be a whole number >= 1",
        )

    def node_ids(self) -> list[str]:
        """The ids of this group's nodes, in order."""
        width = max(3, len(str(max(self.count - 1, 0))))
        named = list((self.names or ())[: self.count])
        return named + [f"{self.id_prefix}{i:0{width}d}" for i in range(len(named), self.count)]


@dataclass(frozen=True)
class FleetEvent:
    """A scripted change to one node at `at_s` (seconds of virtual time).

    kinds: `vanish` (the machine goes dark: adverts stop, a step in flight is lost), `return`
    (it boots again with a fresh daemon instance), `drain` (the daemon advertises `policy`),
    `undrain` (it advertises no policy), `restart` (the daemon restarts at once with a fresh
    instance; a step in flight is lost), `caps` (the daemon advertises `capabilities` from now
    on — at once if it is up, wake 9), `cancel` (an operator cancels the run the node holds a
    lease for, if any: wake 2; the daemon itself is untouched and a step in flight still reports,
    answered `run_ended`). `policy` only matters for `drain`, `capabilities` only for `caps`.
    """

    at_s: float
    node_id: str
    kind: str
    policy: str = "graceful"
    capabilities: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in FLEET_EVENT_KINDS:
            raise ScenarioError(f"fleet event kind {self.kind!r} not in {FLEET_EVENT_KINDS}")
        if self.policy not in DRAIN_POLICIES:
            raise ScenarioError(f"drain policy {self.policy!r} not in {DRAIN_POLICIES}")
        if (self.kind == "caps") != (self.capabilities is not None):
            raise ScenarioError("fleet event: `capabilities` goes with kind 'caps', and only there")


@dataclass(frozen=True)
class RandomEvents:
    """A random fleet process, realised per node by `sim.inputs.workload` from the fleet stream.

    `kind="vanish"`: each node alternates up ~ Exp(mean_up_s) and dark ~ Exp(mean_down_s)
    (vanish/return pairs). `kind="restart"`: the daemon restarts at Exp(mean_up_s) intervals.
    `nodes` empty means every node of the fleet.
    """

    kind: str = "vanish"
    mean_up_s: float = 3600.0
    mean_down_s: float = 300.0
    nodes: tuple[str, ...] = ()
    start_s: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("vanish", "restart"):
            raise ScenarioError(
                f"random fleet process kind {self.kind!r} not in ('vanish', 'restart')"
            )


@dataclass(frozen=True)
class Fleet:
    """Node groups, their heartbeat interval, how long a node takes to claim, and what happens to
    them over time.

    `claim_latency_s` is the fleet's, not the Mediator's: a node told "claimable" claims at once
    with 0, else that many seconds later (`sim.platform.driver`).
    """

    groups: tuple[NodeGroup, ...]
    advert_interval_s: float = 10.0
    events: tuple[FleetEvent, ...] = ()
    random: tuple[RandomEvents, ...] = ()
    claim_latency_s: float = 0.0

    def __post_init__(self) -> None:
        lat = self.claim_latency_s
        _check(
            isinstance(lat, numbers.Real) and not isinstance(lat, bool | np.bool_),
            f"fleet.claim_latency_s is a number, not {lat!r}",
        )
        _check(
            math.isfinite(lat) and lat >= 0,
            f"fleet.claim_latency_s {lat!r} must be a finite number of seconds >= 0",
        )

    def nodes(self) -> list[NodeSpec]:
        """Every node, in node_id order; raises if two groups produce the same id."""
        out: dict[str, NodeSpec] = {}
        for group in self.groups:
            for i, node_id in enumerate(group.node_ids()):
                if node_id in out:
                    raise ScenarioError(
                        f"duplicate node_id {node_id!r}: give groups distinct prefixes"
                    )
                label = group.label.format(i=i, node_id=node_id)
                out[node_id] = NodeSpec(node_id, label, dict(group.capabilities))
        return [out[k] for k in sorted(out)]


# ---------------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Poisson:
    """Poisson arrivals at `rate` per second."""

    rate: float
    tag: ClassVar[str] = "poisson"

    def __post_init__(self) -> None:
        _check(self.rate > 0, f"arrival rate {self.rate} must be > 0 (runs per second)")


@dataclass(frozen=True)
class Piecewise:
    """Poisson arrivals with a piecewise-constant rate: `points` = ((t_s, rate), ...).

    The rate of a point holds until the next point; the last one holds for ever, or, with
    `period_s`, the whole pattern repeats every `period_s` seconds (a daily cycle).
    """

    points: tuple[tuple[float, float], ...]
    period_s: float | None = None
    tag: ClassVar[str] = "piecewise"


@dataclass(frozen=True)
class Burst:
    """Poisson arrivals at `rate` plus `count` extra arrivals spread uniformly over
    [at_s, at_s + spread_s] (all at `at_s` when the spread is 0)."""

    rate: float
    at_s: float
    count: int
    spread_s: float = 0.0
    tag: ClassVar[str] = "burst"

    def __post_init__(self) -> None:
        _check(self.rate > 0, f"arrival rate {self.rate} must be > 0 (runs per second)")
        _check(self.count >= 0 and self.spread_s >= 0, "burst count and spread_s must be >= 0")


@dataclass(frozen=True)
class Trace:
    """Replay a trace file (docs/design.md §20): `format` "swf" or "csv"; `path` None = the shipped
    NASA Ames iPSC/860 log. Submit times are multiplied by `time_scale`, run times by
    `duration_scale`; each row becomes a run of the workload's first template, whose single exec
    step takes the row's run time (a CSV `needs` column overrides the template's needs). A trace's
    own ids (a CSV's `run_id`, an SWF job number) become `source_id` in the results; the plan's
    run_ids are renumbered, because they must sort in arrival order (FIFO ties, R6)."""

    path: str | None = None
    format: str = "swf"
    time_scale: float = 1.0
    duration_scale: float = 1.0
    tag: ClassVar[str] = "trace"


@dataclass(frozen=True)
class Scripted:
    """Explicit arrivals: `items` = ((at_s, template_name), ...) — for worked examples."""

    items: tuple[tuple[float, str], ...]
    tag: ClassVar[str] = "scripted"


@dataclass(frozen=True)
class Recorded:
    """Replay a lab's own exported history (`python -m sim twin export`; docs/design.md §20,
    "Replaying a twin"): the runs of folder `path` at their recorded instants, each attempt
    taking its recorded time and outcome, each ask its recorded answer delay, and the fleet's
    recorded changes (`sim.inputs.twin`).

    `from_s` replays from that second of the window on: the state the history shows there (runs
    queued, runs running on their nodes, the fleet) is the initial state. `scale` scales the
    arrivals: below 1 each run is kept with that probability, above 1 shifted copies of the
    recorded stream are added (seeded); 1 replays exactly."""

    path: str
    from_s: float = 0.0
    scale: float = 1.0
    tag: ClassVar[str] = "twin"

    def __post_init__(self) -> None:
        _check(self.scale > 0, f"twin arrivals scale {self.scale} must be > 0")
        _check(self.from_s >= 0, f"twin from_s {self.from_s} must be >= 0")


ArrivalProcess: TypeAlias = Poisson | Piecewise | Burst | Trace | Scripted | Recorded
_PROCESSES: dict[str, type[Any]] = {
    c.tag: c for c in (Poisson, Piecewise, Burst, Trace, Scripted, Recorded)
}


@dataclass(frozen=True)
class StepSpec:
    """One step of a template, with what the simulator needs to pre-sample it.

    exec steps run on their `role`'s node: every attempt takes a `duration` draw and ends `fail`
    with probability `fail_p`, `retry` with `retry_p`, else `pass`. ask steps are questions to a
    person, answered after an `answer_delay` draw, `ok` with probability `ok_p`.
    """

    name: str
    role: str | None = None
    kind: str = "exec"
    after: tuple[str, ...] = ()
    duration: Dist = Constant(1.0)
    fail_p: float = 0.0
    retry_p: float = 0.0
    ask: str = ""
    answer_delay: Dist = Constant(60.0)
    ok_p: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("exec", "ask"):
            raise ScenarioError(f"step {self.name!r}: kind {self.kind!r} not in ('exec', 'ask')")
        if self.kind == "exec" and not self.role:
            raise ScenarioError(f"exec step {self.name!r} needs a role")
        if self.kind == "ask" and (self.role or not self.ask):
            raise ScenarioError(f"ask step {self.name!r}: no role, and a question in `ask`")
        if min(self.fail_p, self.retry_p) < 0 or self.fail_p + self.retry_p > 1:
            raise ScenarioError(f"step {self.name!r}: fail_p + retry_p must be within [0, 1]")


@dataclass(frozen=True)
class Template:
    """A kind of run: roles with their capability needs, steps, and a weight in the mix."""

    name: str
    roles: dict[str, dict[str, Any]]
    steps: tuple[StepSpec, ...]
    weight: float = 1.0

    def __post_init__(self) -> None:
        names = [s.name for s in self.steps]
        if len(set(names)) != len(names):
            raise ScenarioError(f"template {self.name!r}: duplicate step names")
        for s in self.steps:
            if s.role is not None and s.role not in self.roles:
                raise ScenarioError(f"template {self.name!r}: step {s.name!r} uses unknown role")
            for dep in s.after:
                if dep not in names:
                    raise ScenarioError(
                        f"template {self.name!r}: step {s.name!r} after unknown {dep!r}"
                    )
        if set(self.roles) - {s.role for s in self.steps}:
            raise ScenarioError(f"template {self.name!r}: a role no step uses")

    def contract(self, roles: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """The JSON contract (design.md §4) without `run_id`; `work_id` is the template name."""
        steps: list[dict[str, Any]] = []
        for s in self.steps:
            if s.kind == "ask":
                st: dict[str, Any] = {"name": s.name, "kind": "ask", "ask": s.ask}
            else:
                st = {"name": s.name, "role": s.role, "uses": "sim", "with": {}}
            if s.after:
                st["after"] = list(s.after)
            steps.append(st)
        return {
            "work_id": self.name,
            "roles": {r: dict(n) for r, n in (roles or self.roles).items()},
            "steps": steps,
        }


@dataclass(frozen=True)
class Workload:
    """An arrival process and the templates arrivals are drawn from (by weight)."""

    arrivals: ArrivalProcess
    templates: tuple[Template, ...]

    def __post_init__(self) -> None:
        if not self.templates:
            raise ScenarioError("a workload needs at least one template")
        if len({t.name for t in self.templates}) != len(self.templates):
            raise ScenarioError("template names must be distinct")


#: Old names of settings, read for one release (in a scenario file, a manifest, `--set`), each
#: with one `RenamedSetting` line naming the new one: the settings took the Mediator's names
#: (`mediator.Config`), and the claim latency, which describes the fleet, moved to it.
RENAMED: dict[str, str] = {
    "settings.lease_ttl_s": "settings.lease_ttl_seconds",
    "settings.renew_s": "settings.renew_seconds",
    "settings.advert_ttl_s": "settings.advert_ttl_seconds",
    "settings.claim_latency_s": "fleet.claim_latency_s",
}
#: The same for the short names of `ALIASES` (`--set lease_ttl_s=…`).
RENAMED_SHORT: dict[str, str] = {
    "lease_ttl_s": "lease_ttl_seconds",
    "renew_s": "renew_seconds",
    "advert_ttl_s": "advert_ttl_seconds",
}


class RenamedSetting(FutureWarning):
    """A scenario used an old setting name (`RENAMED`); it is read under its new name."""


_WARNED: dict[Any, Any] = {}  # the warnings' registry: each old name once per process


def _renamed(old: str, new: str) -> str:
    """`new`, after one line on stderr saying `old` is its old name (once per process)."""
    # warn_explicit with no source file: the warning is one line (no source line echoed)
    warnings.warn_explicit(
        f"{old} is now {new}; the old name is read until the next release",
        RenamedSetting,
        "scenario",
        0,
        module="sim.inputs.scenarios",
        registry=_WARNED,
    )
    return new


def _upgrade(d: Mapping[str, Any]) -> Mapping[str, Any]:
    """A scenario dict with the old setting names (`RENAMED`) read under their new ones."""
    settings = d.get("settings")
    if not isinstance(settings, Mapping):
        return d
    prefix = "settings."
    old_keys = [k for k in settings if prefix + k in RENAMED]
    if not old_keys:
        return d
    out, settings = dict(d), dict(settings)
    fleet = dict(out.get("fleet") or {})
    for key in old_keys:
        new = RENAMED[prefix + key]
        table, _, name = new.partition(".")
        target = settings if table == "settings" else fleet
        if name in target:
            raise ScenarioError(f"{prefix}{key} and {new} are one setting: keep {new}")
        target[name] = settings.pop(key)
        _renamed(prefix + key, new)
    out["settings"], out["fleet"] = settings, fleet
    return out


@dataclass(frozen=True)
class Settings:
    """The Mediator's settings a simulation runs with (design.md §16): the fields of
    `mediator.Config` that shape scheduling, with its names and defaults, checked by its own
    `Config.validate` (the same ranges, and the same one-line message the server gives).
    `config()` is the Mediator's `Config` for them, built by field name."""

    lease_ttl_seconds: float = 60.0
    renew_seconds: float = 10.0
    advert_ttl_seconds: float = 30.0
    max_width: int = 4
    max_attempts: int = 3
    wake_on_return: bool = True

    def __post_init__(self) -> None:
        # issue 29 §8: `--set settings.wake_on_return=maybe` once reached the Mediator's config
        # and ended in a traceback; a value of the wrong kind is one line naming the setting.
        for f in dataclasses.fields(self):
            value, default = getattr(self, f.name), f.default
            # numpy's scalars count: a notebook may compute a setting
            is_bool = isinstance(value, bool | np.bool_)
            if isinstance(default, bool):
                said = f"settings.{f.name} is true or false, not {value!r}"
                _check(is_bool, said)
            else:
                _check(
                    isinstance(value, numbers.Real) and not is_bool,
                    f"settings.{f.name} is a number, not {value!r}",
                )
            if isinstance(value, np.generic):  # the Mediator takes Python's own numbers
                object.__setattr__(self, f.name, value.item())
        self.config()  # the Mediator's ranges, and its message

    def config(self, **extra: Any) -> Config:
        """The Mediator's `Config` for these settings (every field by its name), plus `extra`
        (`database_url`, …); a value the Mediator refuses is a one-line `ScenarioError` with the
        server's own message."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        try:
            return Config(**values, **extra)
        except ConfigError as e:
            raise ScenarioError(e.message) from None


@dataclass(frozen=True)
class Scenario:
    """Fleet + workload + settings + horizon + seed: everything a simulation needs (design.md §20).

    Arrivals stop after `horizon_runs` runs and/or at `horizon_s`; the simulation itself ends at
    `horizon_s` when given, else once nothing can change any more. The first `warmup_runs` runs are
    flagged in results and left out of statistics.
    """

    name: str
    fleet: Fleet
    workload: Workload
    settings: Settings = field(default_factory=Settings)
    horizon_runs: int | None = None
    horizon_s: float | None = None
    warmup_runs: int = 0
    seed: int = 0
    description: str = ""

    def __post_init__(self) -> None:
        _check(
            self.horizon_runs is None or self.horizon_runs >= 1,
            f"scenario {self.name!r}: runs (horizon_runs) {self.horizon_runs} must be >= 1",
        )
        _check(
            self.horizon_s is None or self.horizon_s > 0,
            f"scenario {self.name!r}: horizon_s {self.horizon_s} must be > 0",
        )
        _check(
            self.warmup_runs >= 0,
            f"scenario {self.name!r}: warmup_runs {self.warmup_runs} must be >= 0",
        )
        _check(self.horizon_runs is None or self.warmup_runs < self.horizon_runs,
               f"scenario {self.name!r}: warmup_runs ({self.warmup_runs}) must be below "
               f"runs ({self.horizon_runs}), or nothing is measured")  # fmt: skip
        st, interval = self.settings, self.fleet.advert_interval_s
        finite = isinstance(self.workload.arrivals, Trace | Scripted | Recorded)
        if self.horizon_runs is None and self.horizon_s is None and not finite:
            raise ScenarioError(f"scenario {self.name!r}: set horizon_runs or horizon_s")
        # A live node must stay live and keep its lease between two of its own adverts,
        # otherwise heartbeats alone would expire nodes and reap healthy runs.
        if not (0 < interval < st.advert_ttl_seconds and interval < st.lease_ttl_seconds):
            raise ScenarioError(
                f"scenario {self.name!r}: advert_interval_s ({interval}) must be below "
                f"advert_ttl_seconds ({st.advert_ttl_seconds}) and lease_ttl_seconds "
                f"({st.lease_ttl_seconds})"
            )
        ids = {n.node_id for n in self.fleet.nodes()}
        for ev in self.fleet.events:
            if ev.node_id not in ids:
                raise ScenarioError(f"fleet event for unknown node {ev.node_id!r}")

    # -- serialisation ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON/TOML-ready dict; `None` values are left out (TOML has no null)."""
        return _to_plain(self)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Scenario:
        """The inverse of `to_dict` (missing keys take their defaults); an unknown or missing
        key is a one-line `ScenarioError`."""
        try:
            return _scenario_from(d)
        except (TypeError, KeyError) as e:
            raise ScenarioError(f"scenario: {e}") from None

    def to_toml(self) -> str:
        """This scenario as TOML text (what `from_toml` reads back to an equal scenario)."""
        return _dump_toml(self.to_dict())

    @classmethod
    def from_toml(cls, source: str | Path) -> Scenario:
        """Load from a TOML file path or from TOML text."""
        if isinstance(source, Path) or ("\n" not in source and Path(source).is_file()):
            source = Path(source).read_text(encoding="utf-8")
        return cls.from_dict(tomllib.loads(source))

    def scenario_hash(self) -> str:
        """A stable digest of the scenario (sha256 of its canonical JSON, 16 hex digits)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def with_sets(self, assignments: list[str]) -> Scenario:
        """A copy with `key=value` assignments applied, as `python -m sim run --set` gives them:
        the value is read as a TOML value (`2`, `false`, `0.5`, `"x"`, `[1, 2]`), and taken as
        a plain string when it is not one (`name=my run`). Keys are dotted paths or the short
        names of `ALIASES` (`runs`, `arrival_rate`, `nodes`, …)."""
        return self.with_overrides(dict(parse_set(a) for a in assignments))

    def with_overrides(self, overrides: Mapping[str, Any]) -> Scenario:
        """A copy with dotted-path values replaced, e.g. `{"settings.wake_on_return": False,
        "fleet.groups.0.count": 5, "seed": 3}` (list items by index), or short names
        (`ALIASES`: `{"runs": 10, "arrival_rate": 0.2}`).

        A path that does not exist is refused with the closest existing one. Derived fields
        follow their inputs: a warm-up that was 10 % of the runs stays 10 % of the new count, and
        a description the builder generated is generated again.
        """
        d = self.to_dict()
        paths = set(_paths(d))
        for key, value in overrides.items():
            path = _resolve(key, d, paths)
            keys = path.split(".")
            node: Any = d
            for k in keys[:-1]:
                node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
            last = keys[-1]
            if isinstance(node, list):
                node[int(last)] = value
            else:
                node[last] = value
        touched = {_resolve(k, d, paths) for k in overrides}
        if (
            "warmup_runs" not in touched
            and self.horizon_runs
            and (self.warmup_runs == self.horizon_runs // 10)
        ):
            runs = d.get("horizon_runs")
            if isinstance(runs, int):
                d["warmup_runs"] = runs // 10
        if "description" not in touched and self.description == describe(self):
            d.pop("description", None)
            out = Scenario.from_dict(d)
            return dataclasses.replace(out, description=describe(out))
        return Scenario.from_dict(d)


#: Short names `--set` and `with_overrides` accept beside dotted paths (the Python names of the
#: built-in scenarios' parameters where they map to one field).
ALIASES: dict[str, str] = {
    "runs": "horizon_runs",
    "arrival_rate": "workload.arrivals.rate",
    "nodes": "fleet.groups.0.count",
    "advert_interval_s": "fleet.advert_interval_s",
    "claim_latency_s": "fleet.claim_latency_s",
    **{f.name: f"settings.{f.name}" for f in dataclasses.fields(Settings)},
}


def _paths(d: Any, prefix: str = "") -> list[str]:
    """Every dotted path of a scenario dict (leaves and inner nodes)."""
    out: list[str] = []
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        path = f"{prefix}{k}"
        out.append(path)
        out.extend(_paths(v, path + "."))
    return out


def _resolve(key: str, d: Mapping[str, Any], paths: set[str]) -> str:
    """A `--set` key → the dotted path it means; a one-line error with a suggestion if none."""
    if key in paths:
        return key
    if key in ALIASES and ALIASES[key] in paths:
        return ALIASES[key]
    if key in RENAMED:  # an old name, read for one release
        return _resolve(_renamed(key, RENAMED[key]), d, paths)
    if key in RENAMED_SHORT:
        return _resolve(_renamed(key, RENAMED_SHORT[key]), d, paths)
    parent = key.rpartition(".")[0]
    if (parent in paths and parent.rpartition(".")[2] in ("capabilities", "roles")) or (
        parent in paths and ".roles." in f".{parent}"
    ):
        return key  # a new key in a free-form table: capabilities, needs
    close = difflib.get_close_matches(key, [*paths, *ALIASES], n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else "; see `python -m sim show SCENARIO`"
    raise ScenarioError(f"unknown setting {key!r}{hint}")


#: What each scenario key means, by its last name (`python -m sim show`).
FIELD_HELP: dict[str, str] = {
    "name": "the scenario's name",
    "horizon_runs": "arrivals stop after this many runs (--set runs=N)",
    "horizon_s": "the simulation ends at this virtual second",
    "warmup_runs": "the first runs, left out of statistics (default 10 % of the runs)",
    "seed": "the random seed (same seed, same result)",
    "description": "what the scenario is (generated for one-class Poisson scenarios)",
    "fleet": "the nodes and what happens to them",
    "advert_interval_s": "seconds between a node's adverts (heartbeats)",
    "events": "scripted fleet events: vanish, return, drain, undrain, restart, caps, cancel",
    "random": "random fleet processes (vanish/return, restarts)",
    "groups": "node groups: count identical nodes each",
    "count": "how many nodes in the group (--set nodes=N for the first group)",
    "capabilities": "what the group's nodes advertise (matched against needs)",
    "label": "display label, may use {i} and {node_id}",
    "id_prefix": "node ids are this prefix and a number",
    "names": "the ids of the group's first nodes (a twin's own node ids)",
    "from_s": "a twin replays from this second of its window (the state there is the start)",
    "scale": "a twin's arrivals are scaled by this (1: as recorded)",
    "at_s": "virtual second it happens",
    "node_id": "which node",
    "kind": "what kind (fleet event, random process or step)",
    "policy": "drain policy: graceful or at-boundary",
    "mean_up_s": "mean seconds a node stays up between vanishes/restarts",
    "mean_down_s": "mean seconds a vanished node stays dark",
    "nodes": "nodes it applies to (empty: all)",
    "start_s": "virtual second it starts",
    "workload": "what arrives",
    "arrivals": "the arrival process",
    "process": "poisson, piecewise, burst, trace, scripted or twin",
    "rate": "arrivals per second (--set arrival_rate=X)",
    "points": "(second, rate) pairs of a piecewise rate",
    "period_s": "the rate pattern repeats with this period",
    "spread_s": "the burst's arrivals spread over this many seconds",
    "path": "the trace file (none: the shipped NASA Ames log)",
    "format": "trace format: swf or csv",
    "time_scale": "submit times are multiplied by this",
    "duration_scale": "run times are multiplied by this",
    "items": "(second, template) pairs of scripted arrivals",
    "templates": "kinds of run, drawn by weight",
    "roles": "each role's capability needs",
    "steps": "the template's steps",
    "role": "the role whose node runs the step",
    "after": "steps this one waits for",
    "duration": "how long an attempt runs",
    "dist": "distribution: constant, exponential, lognormal, empirical",
    "value": "the constant's value in seconds",
    "mean": "the mean in seconds",
    "sigma": "lognormal: standard deviation of log(duration)",
    "values": "observed values to resample",
    "fail_p": "probability an attempt fails",
    "retry_p": "probability an attempt asks for a retry",
    "ask": "the question an ask step puts to a person",
    "answer_delay": "how long a person takes to answer",
    "ok_p": "probability the answer is ok",
    "weight": "the template's share of arrivals (relative)",
    "settings": "the Mediator's settings",
    "lease_ttl_seconds": "a lease expires this long after its node's last renewal",
    "renew_seconds": "the reaper runs every this many seconds",
    "advert_ttl_seconds": "a node is live this long after its last advert",
    "max_width": "most nodes one run may hold",
    "max_attempts": "attempts of a step before it fails",
    "wake_on_return": "wake the queue when a vanished node returns (wake 7)",
    "claim_latency_s": "seconds between a node's lease and its first claim",
}


def explain(sc: Scenario) -> list[tuple[str, Any, str]]:
    """(dotted path, value, meaning) for every leaf of the scenario."""
    out: list[tuple[str, Any, str]] = []

    def walk(v: Any, path: str, meaning: str) -> None:
        if isinstance(v, dict) and v and not path.endswith(("capabilities", "roles")):
            for k, x in v.items():
                here = "its name" if k == "name" and path else FIELD_HELP.get(k, meaning)
                walk(x, f"{path}.{k}" if path else k, here)
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for i, x in enumerate(v):
                walk(x, f"{path}.{i}", meaning)
        else:
            out.append((path, v, meaning))

    walk(sc.to_dict(), "", "")
    return out


def describe(sc: Scenario) -> str:
    """The generated description of a one-class, one-step Poisson scenario in Kendall's
    notation (`M/M/3: lambda=0.2/s, mu=0.1/s`, `M/G/3 (lognormal, cv 2): …`); `""` otherwise."""
    wl, groups = sc.workload, sc.fleet.groups
    if not isinstance(wl.arrivals, Poisson) or len(wl.templates) != 1 or len(groups) != 1:
        return ""
    steps = wl.templates[0].steps
    if len(steps) != 1 or steps[0].kind != "exec":
        return ""
    dur, c, lam = steps[0].duration, groups[0].count, wl.arrivals.rate
    mu = f"{1.0 / dur.mean:.6g}" if dur.mean > 0 else "inf"
    if isinstance(dur, Exponential):
        return f"M/M/{c}: lambda={lam:.6g}/s, mu={mu}/s"
    if isinstance(dur, Constant):
        return f"M/D/{c}: lambda={lam:.6g}/s, mu={mu}/s"
    extra = f", cv {dur.cv:.3g}" if isinstance(dur, Lognormal) else ""
    return f"M/G/{c} ({dur.tag}{extra}): lambda={lam:.6g}/s, mu={mu}/s"


def parse_set(assignment: str) -> tuple[str, Any]:
    """`"settings.max_width=2"` → `("settings.max_width", 2)`; see `Scenario.with_sets`."""
    key, sep, text = assignment.partition("=")
    if not sep or not key.strip():
        raise ScenarioError(f"expected key=value, got {assignment!r}")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    return key.strip(), value


# -- dict conversion ---------------------------------------------------------------------------


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        tag = getattr(type(obj), "tag", None)
        if tag is not None:
            out["dist" if type(obj) in _DISTS.values() else "process"] = tag
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is not None:
                out[f.name] = _to_plain(value)
        return out
    if isinstance(obj, dict):
        return {str(k): _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_to_plain(v) for v in obj]
    return obj


def _dist_from(d: Mapping[str, Any]) -> Dist:
    d = dict(d)
    cls = _DISTS[d.pop("dist")]
    if cls is Empirical:
        d["values"] = tuple(float(v) for v in d["values"])
    return cls(**d)  # type: ignore[no-any-return]


def _process_from(d: Mapping[str, Any]) -> ArrivalProcess:
    d = dict(d)
    cls = _PROCESSES[d.pop("process")]
    if cls is Piecewise:
        d["points"] = tuple((float(t), float(r)) for t, r in d["points"])
    if cls is Scripted:
        d["items"] = tuple((float(t), str(n)) for t, n in d["items"])
    return cls(**d)  # type: ignore[no-any-return]


def _step_from(d: Mapping[str, Any]) -> StepSpec:
    d = dict(d)
    d["after"] = tuple(d.get("after", ()))
    for key in ("duration", "answer_delay"):
        if key in d:
            d[key] = _dist_from(d[key])
    return StepSpec(**d)


def _scenario_from(d: Mapping[str, Any]) -> Scenario:
    d = _upgrade(d)
    fl = dict(d["fleet"])
    fleet = Fleet(
        groups=tuple(
            NodeGroup(**{**g, "names": tuple(g["names"]) if "names" in g else None})
            for g in fl.pop("groups")
        ),
        events=tuple(FleetEvent(**e) for e in fl.pop("events", ())),
        random=tuple(
            RandomEvents(**{**r, "nodes": tuple(r.get("nodes", ()))}) for r in fl.pop("random", ())
        ),
        **fl,
    )
    wl = d["workload"]
    templates = tuple(
        Template(
            name=t["name"],
            roles={r: dict(n) for r, n in t["roles"].items()},
            steps=tuple(_step_from(s) for s in t["steps"]),
            weight=t.get("weight", 1.0),
        )
        for t in wl["templates"]
    )
    workload = Workload(arrivals=_process_from(wl["arrivals"]), templates=templates)
    rest = {k: v for k, v in d.items() if k not in ("fleet", "workload", "settings")}
    return Scenario(
        fleet=fleet, workload=workload, settings=Settings(**d.get("settings", {})), **rest
    )


# -- a small TOML writer (tomllib only reads) -----------------------------------------------------

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k, ensure_ascii=False)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _is_table_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _dump_table(d: Mapping[str, Any], prefix: str, lines: list[str]) -> None:
    for k, v in d.items():
        if not isinstance(v, dict) and not _is_table_list(v):
            lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in d.items():
        name = f"{prefix}.{_key(k)}" if prefix else _key(k)
        if isinstance(v, dict):
            lines.extend(["", f"[{name}]"])
            _dump_table(v, name, lines)
        elif _is_table_list(v):
            for item in v:
                lines.extend(["", f"[[{name}]]"])
                _dump_table(item, name, lines)


def _dump_toml(d: Mapping[str, Any]) -> str:
    lines: list[str] = []
    _dump_table(d, "", lines)
    return "\n".join(lines).strip() + "\n"


# ---------------------------------------------------------------------------------------------
# Built-in scenarios (docs/design.md §20)
# ---------------------------------------------------------------------------------------------

#: Coarse heartbeats (every 30 min) where no node vanishes: adverts stay a few per cent of calls.
COARSE_INTERVAL_S = 1800.0
COARSE_SETTINGS = Settings(lease_ttl_seconds=7200.0, renew_seconds=600.0, advert_ttl_seconds=5400.0)
#: Fine heartbeats (the Mediator defaults) where vanishing or draining nodes are the subject.
FINE_SETTINGS = Settings()


def _one_step(name: str, needs: dict[str, Any], duration: Dist, weight: float = 1.0) -> Template:
    return Template(
        name, {"node": needs}, (StepSpec("run", role="node", duration=duration),), weight
    )


SERVICES = ("exponential", "constant", "lognormal")


def steady(
    nodes: int = 3,
    arrival_rate: float = 0.2,
    service_rate: float = 0.1,
    runs: int | None = None,
    seed: int = 0,
    warmup_runs: int | None = None,
    service: str = "exponential",
    cv: float | None = None,
) -> Scenario:
    """M/M/c (docs/design.md §20): c identical nodes, one-role one-step runs, Poisson arrivals,
    exponential durations — must agree with Erlang C.

    Args:
        nodes: c, identical nodes.
        arrival_rate: lambda, runs per second.
        service_rate: mu, 1 / the mean service time.
        runs: how many runs arrive; None sizes the run for its load
            (`sim.analysis.runs_for_load`: 4,000 up to rho = 0.78, 21,000 at rho = 0.9,
            89,000 at 0.95), long enough for one run's intervals to hold.
        seed: the random seed.
        warmup_runs: runs left out of statistics; default 10 % of `runs`.
        service: the service-time distribution: "exponential" (M/M/c), "constant" (M/D/c) or
            "lognormal" (M/G/c, with coefficient of variation `cv`).
        cv: the service time's coefficient of variation (sd / mean); only lognormal has a free
            one (default 1); exponential is 1 and constant 0 by definition.
    """
    _check(service in SERVICES, f"service {service!r} not in {SERVICES}")
    _check(arrival_rate > 0, f"arrival_rate {arrival_rate} must be > 0 (runs per second)")
    _check(service_rate > 0, f"service_rate {service_rate} must be > 0 (per second)")
    _check(isinstance(nodes, int) and nodes >= 1, f"nodes {nodes!r} must be a whole number >= 1")
    fixed = {"exponential": 1.0, "constant": 0.0}
    if service in fixed and cv is not None and cv != fixed[service]:
        raise ScenarioError(
            f"cv {cv} does not fit service {service!r} (its cv is {fixed[service]:g}); "
            f"use service='lognormal' for another cv"
        )
    mean = 1.0 / service_rate
    duration: Dist
    if service == "exponential":
        duration = Exponential(mean)
    elif service == "constant":
        duration = Constant(mean)
    else:
        duration = Lognormal.with_cv(mean, 1.0 if cv is None else cv)
    if runs is None:
        runs = runs_for_load(arrival_rate / (nodes * service_rate))
    sc = Scenario(
        name="steady",
        fleet=Fleet((NodeGroup(nodes, {"pool": "lab"}),), advert_interval_s=COARSE_INTERVAL_S),
        workload=Workload(Poisson(arrival_rate), (_one_step("job", {"pool": "lab"}, duration),)),
        settings=COARSE_SETTINGS,
        horizon_runs=runs,
        warmup_runs=runs // 10 if warmup_runs is None else warmup_runs,
        seed=seed,
    )
    return dataclasses.replace(sc, description=describe(sc))


def mixed(
    linux: int = 4,
    arm: int = 2,
    boards: int = 1,
    arrival_rate: float = 0.05,
    runs: int = 3000,
    seed: int = 0,
) -> Scenario:
    """Several capability classes and multi-role runs with folding (docs/design.md §20).

    `unit` runs need any linux node, `arm` runs an arm node, `pair` runs two linux roles that fold
    onto one node, and `hil` runs need the scarce board *and* the scope bench (width 2, a chain of
    three steps; the board is loaded to about 60 %). The scope bench is a linux node too, so narrow
    runs keep taking it: a `hil` run waiting for it must never hold them back (R6), and its waits
    measure the starvation window of wide runs (docs/design.md §17).
    """
    groups = (
        NodeGroup(linux, {"os": "linux", "arch": "x86"}, id_prefix="lx"),
        NodeGroup(arm, {"os": "linux", "arch": "arm"}, id_prefix="arm"),
        NodeGroup(boards, {"board": "stm32f4", "usb": True}, id_prefix="brd"),
        NodeGroup(1, {"scope": True, "os": "linux", "arch": "x86"}, id_prefix="scope"),
    )
    hil = Template(
        "hil",
        {"dut": {"board": "stm32f4"}, "bench": {"scope": True}},
        (
            StepSpec("flash", role="dut", duration=Exponential(30.0)),
            StepSpec("measure", role="bench", after=("flash",), duration=Exponential(60.0)),
            StepSpec("verify", role="dut", after=("measure",), duration=Exponential(60.0)),
        ),
        weight=0.08,
    )
    pair = Template(
        "pair",
        {"build": {"os": "linux"}, "test": {"os": "linux"}},
        (
            StepSpec("build", role="build", duration=Exponential(40.0)),
            StepSpec("test", role="test", after=("build",), duration=Exponential(40.0)),
        ),
        weight=0.15,
    )
    templates = (
        _one_step("unit", {"os": "linux"}, Exponential(60.0), weight=0.5),
        _one_step("arm", {"arch": "arm"}, Exponential(90.0), weight=0.2),
        pair,
        hil,
    )
    return Scenario(
        name="mixed",
        fleet=Fleet(groups, advert_interval_s=COARSE_INTERVAL_S),
        workload=Workload(Poisson(arrival_rate), templates),
        settings=COARSE_SETTINGS,
        horizon_runs=runs,
        warmup_runs=runs // 10,
        seed=seed,
        description="capability classes, folding, a scarce board (R6, starvation of wide runs)",
    )


def vanished_node(
    wake_on_return: bool = True,
    seed: int = 0,
    churn: bool = False,
    nodes: int = 6,
    runs: int = 3000,
    arrival_rate: float = 0.01,
    mean_up_s: float = 3600.0,
    mean_down_s: float = 600.0,
) -> Scenario:
    """The vanished-node window of docs/design.md §8 (docs/design.md §20).

    `churn=False` — the scripted window, step by step: run a (t=1) holds node x000 for 1000 s;
    b (t=2) is QUEUED behind it (ALL_BUSY); x000 vanishes at t=100 (its last advert was at 90, so
    it expires at 120 and its lease at 150); the reaper at t=150 finds the lease expired, a is
    lost, the wake finds no live candidate for b; x000 returns at t=300. With `wake_on_return`
    (wake 7) b is promoted at 300; without it b waits for an unrelated event — run c on node
    y000 (t=600, 100 s) whose result at 700 wakes the queue — and is stuck from 300 to 700.

    `churn=True` — a long horizon: `nodes` nodes in pairs of capability classes (each pair loaded
    to about 50 %), Poisson arrivals, and every node vanishing (mean up 1 h) and returning (mean
    down 10 min) at random; measures total stuck time.
    """
    settings = dataclasses.replace(FINE_SETTINGS, wake_on_return=wake_on_return)
    groups: tuple[NodeGroup, ...]
    templates: tuple[Template, ...]
    if not churn:
        groups = (
            NodeGroup(1, {"board": "x"}, id_prefix="x"),
            NodeGroup(1, {"board": "y"}, id_prefix="y"),
        )
        templates = (
            _one_step("on_x", {"board": "x"}, Constant(1000.0)),
            _one_step("on_y", {"board": "y"}, Constant(100.0)),
        )
        return Scenario(
            name="vanished_node",
            fleet=Fleet(
                groups,
                advert_interval_s=10.0,
                events=(FleetEvent(100.0, "x000", "vanish"), FleetEvent(300.0, "x000", "return")),
            ),
            workload=Workload(Scripted(((1.0, "on_x"), (2.0, "on_x"), (600.0, "on_y"))), templates),
            settings=settings,
            horizon_s=2000.0,
            seed=seed,
            description="seed 000 §5: a on X, b queued, X vanishes and is reaped, X returns",
        )
    counts = [2] * (nodes // 2) or [nodes]
    counts[-1] += nodes - sum(counts)
    groups = tuple(NodeGroup(n, {"cls": f"c{k}"}, id_prefix=f"c{k}n") for k, n in enumerate(counts))
    templates = tuple(
        _one_step(f"on_c{k}", {"cls": f"c{k}"}, Exponential(300.0)) for k in range(len(counts))
    )
    return Scenario(
        name="vanished_node",
        fleet=Fleet(
            groups,
            advert_interval_s=10.0,
            random=(RandomEvents("vanish", mean_up_s=mean_up_s, mean_down_s=mean_down_s),),
        ),
        workload=Workload(Poisson(arrival_rate), templates),
        settings=settings,
        horizon_runs=runs,
        seed=seed,
        description="random vanish/return over a long horizon: total stuck time",
    )


def drain(
    nodes: int = 4,
    arrival_rate: float = 0.02,
    runs: int = 1500,
    seed: int = 0,
) -> Scenario:
    """Graceful and at-boundary drains and undrains (docs/design.md §20, wake 6).

    Three-step runs on identical nodes, loaded to about 60 %. n000 drains gracefully at 2,000 s
    (its current run finishes) and undrains at 6,000 s; n001 drains at-boundary at 3,000 s (its
    run stops at the next step boundary: verdict `drained`) and undrains at 9,000 s. A drain
    change is advertised at once, and an at-boundary drain is finished by the node's next result
    (or heartbeat), so 5-minute heartbeats are fine here.
    """
    needs = {"pool": "lab"}
    tpl = Template(
        "three_step",
        {"node": needs},
        tuple(
            StepSpec(n, role="node", after=a, duration=Exponential(40.0))
            for n, a in (("setup", ()), ("test", ("setup",)), ("teardown", ("test",)))
        ),
    )
    events = (
        FleetEvent(2000.0, "n000", "drain", "graceful"),
        FleetEvent(3000.0, "n001", "drain", "at-boundary"),
        FleetEvent(6000.0, "n000", "undrain"),
        FleetEvent(9000.0, "n001", "undrain"),
    )
    return Scenario(
        name="drain",
        fleet=Fleet((NodeGroup(nodes, needs),), advert_interval_s=300.0, events=events),
        workload=Workload(Poisson(arrival_rate), (tpl,)),
        settings=Settings(lease_ttl_seconds=1800.0, renew_seconds=300.0, advert_ttl_seconds=900.0),
        horizon_runs=runs,
        seed=seed,
        description="graceful and at-boundary drains and undrains (wake 6)",
    )


def restart(
    nodes: int = 4,
    arrival_rate: float = 0.02,
    runs: int = 1500,
    mean_restart_s: float = 7200.0,
    seed: int = 0,
) -> Scenario:
    """Daemons restarting mid-run (docs/design.md §20), about every 2 h per node at 60 % load: a run
    whose step ran under the old instance is lost and its leases released (wake 4); a lease with
    nothing run yet is rebound."""
    needs = {"pool": "lab"}
    tpl = Template(
        "two_step",
        {"node": needs},
        (
            StepSpec("build", role="node", duration=Exponential(60.0)),
            StepSpec("test", role="node", after=("build",), duration=Exponential(60.0)),
        ),
    )
    # A restart advertises at once, so detection does not need fine heartbeats.
    return Scenario(
        name="restart",
        fleet=Fleet(
            (NodeGroup(nodes, needs),),
            random=(RandomEvents("restart", mean_up_s=mean_restart_s),),
            advert_interval_s=COARSE_INTERVAL_S,
        ),
        workload=Workload(Poisson(arrival_rate), (tpl,)),
        settings=COARSE_SETTINGS,
        horizon_runs=runs,
        seed=seed,
        description="random daemon restarts: runs lost, leases fenced, queue woken",
    )


def burst(
    nodes: int = 4,
    arrival_rate: float = 0.02,
    service_rate: float = 0.01,
    burst_count: int = 200,
    at_s: float = 20000.0,
    spread_s: float = 600.0,
    runs: int = 1500,
    seed: int = 0,
) -> Scenario:
    """A burst of arrivals on top of a Poisson stream (design.md §20): the queue builds and
    drains."""
    needs = {"pool": "lab"}
    return Scenario(
        name="burst",
        fleet=Fleet((NodeGroup(nodes, needs),), advert_interval_s=COARSE_INTERVAL_S),
        workload=Workload(
            Burst(arrival_rate, at_s, burst_count, spread_s),
            (_one_step("job", needs, Exponential(1.0 / service_rate)),),
        ),
        settings=COARSE_SETTINGS,
        horizon_runs=runs,
        seed=seed,
        description=f"{burst_count} extra arrivals over {spread_s:g} s at t={at_s:g} s",
    )


def asks(
    nodes: int = 3,
    arrival_rate: float = 0.01,
    runs: int = 1000,
    answer_mean_s: float = 120.0,
    ok_p: float = 0.95,
    seed: int = 0,
) -> Scenario:
    """Runs with person-gated steps (design.md §20): the node is held while a person answers."""
    needs = {"pool": "lab"}
    tpl = Template(
        "gated",
        {"dut": needs},
        (
            StepSpec("flash", role="dut", duration=Exponential(30.0)),
            StepSpec(
                "probe",
                kind="ask",
                ask="Clip the probe on TP3, then answer ok",
                after=("flash",),
                answer_delay=Lognormal(answer_mean_s, 1.0),
                ok_p=ok_p,
            ),
            StepSpec("measure", role="dut", after=("probe",), duration=Exponential(60.0)),
        ),
    )
    return Scenario(
        name="asks",
        fleet=Fleet((NodeGroup(nodes, needs),), advert_interval_s=COARSE_INTERVAL_S),
        workload=Workload(Poisson(arrival_rate), (tpl,)),
        settings=COARSE_SETTINGS,
        horizon_runs=runs,
        seed=seed,
        description="person-gated steps hold their node while people answer",
    )


def trace(
    path: str | None = None,
    nodes: int = 4,
    seed: int = 0,
    format: str | None = None,
    time_scale: float = 1.0,
    duration_scale: float = 1.0,
    runs: int | None = None,
) -> Scenario:
    """Replay a trace on `nodes` identical nodes (design.md §20); `path=None` is the shipped NASA
    Ames iPSC/860 1993 log (92 days, 18,239 jobs). Heartbeats come every 4 h and the reaper runs
    hourly, so they stay a small share over such a horizon. With these defaults the Mediator is a
    FIFO multi-server queue and the waits equal `sim.inputs.traces.fifo_waits`."""
    needs = {"pool": "lab"}
    if format is None:
        format = "csv" if path is not None and path.endswith(".csv") else "swf"
    return Scenario(
        name="trace",
        fleet=Fleet((NodeGroup(nodes, needs),), advert_interval_s=14400.0),
        workload=Workload(
            Trace(path, format, time_scale, duration_scale),
            (_one_step("trace", needs, Constant(0.0)),),
        ),
        settings=Settings(
            lease_ttl_seconds=57600.0, renew_seconds=3600.0, advert_ttl_seconds=43200.0
        ),
        horizon_runs=runs,
        seed=seed,
        description="trace replay on identical nodes: FIFO G/G/c",
    )


def capabilities(seed: int = 0) -> Scenario:
    """Capacity that appears through a capability change (issue 12 §2, wake 9).

    s000 has a scope and x000 has none. Run a (t=1) holds s000 for 1,000 s; b (t=2, 100 s)
    needs a scope too and waits (ALL_BUSY). At t=100 the idle x000 advertises a scope as well:
    that advert wakes the queue (wake 9) and b goes onto x000 at once — without wake 9 it would
    wait for a's release at 1001. At t=400 x000 drops the scope again; c (t=500, 100 s) waits
    for a scope; at t=700 x000 regains it and c goes onto x000 at 700.
    """
    scope = {"scope": True}
    return Scenario(
        name="capabilities",
        fleet=Fleet(
            (NodeGroup(1, scope, id_prefix="s"), NodeGroup(1, {"board": "x"}, id_prefix="x")),
            advert_interval_s=10.0,
            events=(
                FleetEvent(100.0, "x000", "caps", capabilities={"board": "x", "scope": True}),
                FleetEvent(400.0, "x000", "caps", capabilities={"board": "x"}),
                FleetEvent(700.0, "x000", "caps", capabilities={"board": "x", "scope": True}),
            ),
        ),
        workload=Workload(
            Scripted(((1.0, "long"), (2.0, "short"), (500.0, "short"))),
            (
                _one_step("long", scope, Constant(1000.0)),
                _one_step("short", scope, Constant(100.0)),
            ),
        ),
        settings=FINE_SETTINGS,
        horizon_s=3000.0,
        seed=seed,
        description="a node gains, loses and regains a capability (wake 9)",
    )


SCENARIOS: dict[str, Callable[..., Scenario]] = {
    "steady": steady,
    "mixed": mixed,
    "vanished_node": vanished_node,
    "drain": drain,
    "restart": restart,
    "burst": burst,
    "asks": asks,
    "trace": trace,
    "capabilities": capabilities,
}
