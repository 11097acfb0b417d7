"""Capacity per capability class (issue 14 §5): how many nodes of *each* kind?

A fleet with several node kinds (`mixed`: linux, arm, a scarce board, a scope bench) cannot be
sized by one number: per-node utilisation differs widely, and a multi-role run holds nodes of two
kinds at once, so the kinds interact. ``plan_classes`` finds, for every node group, the smallest
count that keeps the target wait quantile for the runs that can use that group — with every
group simulated together on the reference model, so the interaction through multi-role runs is
simulated, not assumed:

1. Start from the largest count of every group (the target is then met, or no plan exists).
2. For each group in turn, try its counts from the smallest up, the other groups as they are;
   keep the smallest count at which the target holds — estimate and upper 95 % bound, over
   independent replications with common random numbers — for the runs of *every* group (so
   shrinking one group may not push another's runs past the target).
3. Repeat the passes until no count changes (shrinking a group can only lengthen waits, so this
   settles within a few passes).

"The runs that can use a group": runs of a template with a role whose needs that group's
capabilities satisfy. Where a group is an M/M/c queue of its own — one template uses it and only
it, one exec step with exponential durations, Poisson arrivals — the Erlang C figures for its
share of the arrivals stand beside the simulated ones.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd  # type: ignore[import-untyped, unused-ignore]

from sim.analysis import Interval, mmc_wait_quantile, mmc_wq, replication_seeds, sectioning
from sim.brokers.entry import run
from sim.brokers.model import satisfies
from sim.inputs.scenarios import Exponential, Poisson, Scenario, ScenarioError


def _pct(q: float) -> str:
    return "p" + f"{q * 100:.6g}"


def class_templates(scenario: Scenario) -> dict[str, list[str]]:
    """Per node group (by ``id_prefix``), the templates with a role that group can serve."""
    out: dict[str, list[str]] = {}
    for g in scenario.fleet.groups:
        out[g.id_prefix] = [
            t.name
            for t in scenario.workload.templates
            if any(satisfies(needs, g.capabilities) for needs in t.roles.values())
        ]
    return out


def class_mmc(scenario: Scenario, prefix: str, count: int) -> tuple[float, float, int] | None:
    """(λ, μ, c) of a group that is an M/M/c queue of its own, else None."""
    uses = class_templates(scenario)
    mine = uses[prefix]
    if len(mine) != 1 or any(mine[0] in ts for p, ts in uses.items() if p != prefix):
        return None
    wl = scenario.workload
    if not isinstance(wl.arrivals, Poisson):
        return None
    tpl = next(t for t in wl.templates if t.name == mine[0])
    steps = tpl.steps
    if len(tpl.roles) != 1 or len(steps) != 1 or not isinstance(steps[0].duration, Exponential):
        return None
    if steps[0].fail_p or steps[0].retry_p or scenario.fleet.events or scenario.fleet.random:
        return None
    share = tpl.weight / sum(t.weight for t in wl.templates)
    return wl.arrivals.rate * share, 1.0 / steps[0].duration.mean, count


def _with_counts(scenario: Scenario, counts: Mapping[str, int]) -> Scenario:
    groups = tuple(dataclasses.replace(g, count=counts[g.id_prefix]) for g in scenario.fleet.groups)
    return dataclasses.replace(scenario, fleet=dataclasses.replace(scenario.fleet, groups=groups))


@dataclass(eq=False)
class ClassPlan:
    """The answer of ``plan_classes`` (``sim.plan(..., per_class=True)``).

    Attributes:
        target: ``{"quantile": q, "wait_s": t}``.
        counts: the recommended count per group (``id_prefix``), or None when even the largest
            counts miss the target.
        per_class: one row per group at the recommended counts: group, capabilities, nodes,
            templates (the runs that can use it), runs, the target quantile's wait with its
            interval, utilization, Erlang C's mean and quantile where the group is M/M/c.
        tried: every fleet simulated on the way (counts, and whether the target held).
        scenario_name: for titles.
    """

    target: dict[str, float]
    counts: dict[str, int] | None
    per_class: pd.DataFrame
    tried: pd.DataFrame = field(repr=False)
    scenario_name: str = ""
    confirmation_note: str = "Per-class plans run on the reference model only."

    @property
    def recommended(self) -> int | None:
        """The total node count of the recommended fleet."""
        return None if self.counts is None else sum(self.counts.values())

    def to_frame(self) -> pd.DataFrame:
        """The per-class table."""
        return self.per_class.copy()

    def headline(self) -> str:
        """One sentence with the answer."""
        q, t = _pct(self.target["quantile"]), self.target["wait_s"]
        if self.counts is None:
            return f"Even the largest counts tried miss the {q} wait target of {t:g} s."
        parts = ", ".join(f"{n} × {g}" for g, n in self.counts.items())
        return (
            f"Per capability class, {parts} ({self.recommended} nodes) is the smallest fleet "
            f"keeping the {q} wait within {t:g} s for the runs each class serves."
        )

    def plot(self) -> Any:
        """Recommended nodes and utilization per class."""
        from sim import plots  # matplotlib, imported when a chart is drawn

        plt = plots.pyplot()  # (headless when no display is set)
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
        f = self.per_class
        a1.bar(f["group"], f["nodes"], color="#4C72B0")
        a1.set_ylabel("recommended nodes")
        a1.yaxis.get_major_locator().set_params(integer=True)
        a2.bar(f["group"], f["utilization"], color="#8172B2")
        a2.set_ylim(0, 1)
        a2.set_ylabel("utilization")
        fig.suptitle(f"Capacity per class: {self.scenario_name}")
        fig.tight_layout()
        return fig

    def to_html(self, path: Any = None) -> str:
        """A small HTML page: the headline and the table."""
        doc = (
            "<!doctype html><meta charset='utf-8'>"
            f"<h1>Capacity per class: {html.escape(self.scenario_name)}</h1>"
            f"<p><b>{html.escape(self.headline())}</b></p>"
            + self.per_class.to_html(index=False, float_format=lambda v: f"{v:,.3g}")
        )
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(doc + "\n")
        return str(doc)


def plan_classes(
    workload: Scenario,
    target: Mapping[str, float],
    fleet_sizes: Iterable[int] | Mapping[str, Iterable[int]],
    replications: int = 5,
    *,
    max_passes: int = 4,
) -> ClassPlan:
    """The smallest count of each node group meeting the target for the runs that use it.

    Args:
        workload: a scenario with one or more node groups.
        target: ``{"quantile": q, "wait_s": t}``.
        fleet_sizes: the counts to try, for every group, or per group ``{id_prefix: counts}``.
        replications: independent replications per fleet (common random numbers).
        max_passes: coordinate-descent passes at most (see the module docstring).
    """
    q, wait_s = float(target["quantile"]), float(target["wait_s"])
    prefixes = [g.id_prefix for g in workload.fleet.groups]
    if isinstance(fleet_sizes, Mapping):
        unknown = set(fleet_sizes) - set(prefixes)
        if unknown:
            raise ScenarioError(f"fleet_sizes: unknown group {sorted(unknown)[0]!r}; "
                                f"the groups are {prefixes}")  # fmt: skip
        sizes = {p: sorted({int(n) for n in fleet_sizes.get(p, [])}) for p in prefixes}
        for g in workload.fleet.groups:
            sizes[g.id_prefix] = sizes[g.id_prefix] or [g.count]
    else:
        common = sorted({int(n) for n in fleet_sizes})
        sizes = {p: common for p in prefixes}
    if any(not s or s[0] < 1 for s in sizes.values()):
        raise ScenarioError("fleet_sizes: every group needs counts >= 1")
    uses = class_templates(workload)
    seeds = replication_seeds(workload.seed, replications)
    cache: dict[tuple[int, ...], list[Any]] = {}
    tried: list[dict[str, Any]] = []

    def simulate(counts: dict[str, int]) -> list[Any]:
        key = tuple(counts[p] for p in prefixes)
        if key not in cache:
            sc = _with_counts(workload, counts)
            cache[key] = [
                run(dataclasses.replace(sc, seed=s), "model", record_events=False) for s in seeds
            ]
        return cache[key]

    def class_waits(results: list[Any], prefix: str) -> tuple[list[np.ndarray], int]:
        waits, unstarted = [], 0
        for r in results:
            runs = r.runs[~r.runs["warmup"] & r.runs["template"].isin(uses[prefix])]
            waits.append(runs["wait_s"].dropna().to_numpy(dtype=float))
            # A run still queued at the end misses the target only if it has waited longer than
            # it already; one submitted later is cut by the horizon (a twin's window), not late.
            late = runs["created_at"] < r.end_s - wait_s
            unstarted += int((runs["wait_s"].isna() & late).sum())
        return waits, unstarted

    def meets(counts: dict[str, int]) -> bool:
        results = simulate(counts)
        ok = True
        for p in prefixes:
            waits, unstarted = class_waits(results, p)
            if not any(w.size for w in waits):
                continue
            iv = _quantile(waits, q)
            ok = ok and unstarted == 0 and max(iv.estimate, iv.high) <= wait_s
        tried.append({**counts, "meets_target": ok})
        return ok

    counts = {p: sizes[p][-1] for p in prefixes}
    if not meets(counts):
        return ClassPlan({"quantile": q, "wait_s": wait_s}, None, _table(workload, counts,
                         simulate(counts), uses, q, class_waits), pd.DataFrame(tried),
                         workload.name)  # fmt: skip
    for _ in range(max_passes):
        changed = False
        for p in prefixes:
            for n in sizes[p]:
                if n >= counts[p]:
                    break
                if meets({**counts, p: n}):
                    counts[p], changed = n, True
                    break
        if not changed:
            break
    table = _table(workload, counts, simulate(counts), uses, q, class_waits)
    return ClassPlan({"quantile": q, "wait_s": wait_s}, dict(counts), table,
                     pd.DataFrame(tried), workload.name)  # fmt: skip


def _quantile(waits: list[np.ndarray], q: float) -> Any:
    samples = [w for w in waits if w.size]
    if len(samples) < 2:
        pooled = np.concatenate(samples) if samples else np.array([0.0])
        est = float(np.quantile(pooled, q))
        return Interval(est, math.nan, math.nan, len(samples), 0.95, "one replication")
    return sectioning(samples, lambda a: float(np.quantile(a, q)),
                      method=f"replications, {len(samples)}")  # fmt: skip


def _table(
    workload: Scenario, counts: dict[str, int], results: list[Any], uses: dict[str, list[str]],
    q: float, class_waits: Any,
) -> pd.DataFrame:  # fmt: skip
    rows = []
    col = f"wait_{_pct(q)}"
    for g in workload.fleet.groups:
        p = g.id_prefix
        waits, unstarted = class_waits(results, p)
        iv = _quantile(waits, q)
        util = np.mean([
            r.utilization().loc[lambda u, p=p: u["node_id"].str.startswith(p), "utilization"].mean()
            for r in results
        ])  # fmt: skip
        row: dict[str, Any] = {
            "group": p,
            "capabilities": ", ".join(f"{k}={v}" for k, v in g.capabilities.items()),
            "nodes": counts[p],
            "templates": ", ".join(uses[p]),
            "runs": int(sum(w.size for w in waits)) + unstarted,
            f"{col}_s": iv.estimate,
            f"{col}_low": max(0.0, iv.low) if math.isfinite(iv.low) else iv.low,
            f"{col}_high": iv.high,
            "interval_method": iv.method,
            "utilization": float(util),
            "erlang_wait_mean_s": math.nan,
            f"erlang_{_pct(q)}_s": math.nan,
        }
        mmc = class_mmc(workload, p, counts[p])
        if mmc is not None and mmc[0] < mmc[2] * mmc[1]:
            lam, mu, c = mmc
            row["erlang_wait_mean_s"] = mmc_wq(lam, mu, c)
            row[f"erlang_{_pct(q)}_s"] = mmc_wait_quantile(lam, mu, c, q)
        rows.append(row)
    return pd.DataFrame(rows)
