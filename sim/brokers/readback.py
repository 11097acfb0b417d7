"""The real Mediator's simulation, measured from its database: `read_result`.

The ``Result`` it builds has the same tables as the reference model's (``sim.platform.measure``:
so the same summary, analysis and differential comparison apply), read from the Mediator's
database read-only after the run — ``runs``, ``promotions``, ``events``, ``queue``, ``leases`` —
plus what only a run against the real database can show: ``violations`` (I1–I7 checked by SQL
during and after the run) and a ``manifest`` (seed, scenario hash, versions).
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from typing import Any, TypeAlias

import pandas as pd

import mediator
from mediator import Mediator
from mediator.databases import drop_database
from sim.brokers.mediator import EPOCH, EngineOutput, simulate
from sim.inputs.scenarios import Scenario
from sim.inputs.workload import Plan
from sim.platform.core import US
from sim.platform.measure import Result, frame, nodes_frame

_T0 = EPOCH.isoformat()


def _seconds(column: str) -> str:
    return f"extract(epoch FROM ({column} - timestamptz '{_T0}'))::float8"


def _nodes_text(assigned: dict[str, str] | None) -> str:
    return ",".join(sorted(set((assigned or {}).values())))


def _roles_text(assigned: dict[str, str] | None) -> str:
    """``{"dut": "b1", "bench": "s1"}`` → ``"bench=s1 dut=b1"`` (roles sorted; a role name never
    holds ``=`` or a space: the contract's role grammar is ``[A-Za-z0-9._-]``)."""
    return " ".join(f"{role}={node}" for role, node in sorted((assigned or {}).items()))


def _started(kind: str, data: dict[str, Any]) -> str | None:
    """How an event started a run — ``created`` (a submit answered 201) or ``promoted`` (by a
    sweep) — or None: the two kinds of row of the decisions table."""
    if kind == "submitted" and data.get("state") == "RUNNING":
        return "created"
    return "promoted" if kind == "promoted" else None


#: A decision as the gate keys it: (at in whole µs, run_id, how, roles).
DecisionKey: TypeAlias = tuple[int, str, str, str]


def decisions_since(med: Mediator, after_id: int) -> tuple[list[DecisionKey], int]:
    """The decisions of events after ``after_id``, in the order of ``read_result``'s decisions
    table, and the last event id read: a watch reads a running simulation's decisions as they
    are made (``run_mediator``'s ``until``). One indexed read of the new events."""
    rows = med.query(
        f"""SELECT id, {_seconds("at")} AS at_s, kind, run_id, data FROM events
            WHERE id > %(after)s AND kind IN ('submitted', 'promoted') ORDER BY id""",
        {"after": after_id},
    )
    out = []
    for e in rows:
        after_id = e["id"]
        data = e["data"] or {}
        how = _started(e["kind"], data)
        if how is not None:
            at_us = round(float(e["at_s"]) * US)
            out.append((at_us, e["run_id"], how, _roles_text(data.get("assigned"))))
    return out, after_id


def read_result(plan: Plan, out: EngineOutput, med: Mediator) -> Result:
    """Build the tables from the Mediator's database (read-only)."""
    sc = plan.scenario
    rows = med.query(
        f"""SELECT run_id, work_id, state, verdict, assigned, reject,
                   {_seconds("created_at")} AS created_at,
                   {_seconds("started_at")} AS started_at,
                   {_seconds("ended_at")} AS ended_at
            FROM runs ORDER BY run_id"""
    )
    columns = ["run_id", "work_id", "state", "verdict", "assigned", "reject", "created_at",
               "started_at", "ended_at"]  # fmt: skip
    runs = pd.DataFrame(rows, columns=columns)
    order = {a.run_id: i for i, a in enumerate(plan.arrivals)}
    runs = runs.assign(_i=runs["run_id"].map(order)).sort_values("_i").reset_index(drop=True)
    runs_df = pd.DataFrame(
        {
            "run_id": runs["run_id"],
            "template": runs["work_id"],
            "created_at": runs["created_at"].astype(float),
            "started_at": runs["started_at"].astype(float),
            "ended_at": runs["ended_at"].astype(float),
            "wait_s": (runs["started_at"] - runs["created_at"]).astype(float),
            "run_s": (runs["ended_at"] - runs["started_at"]).astype(float),
            "state": runs["state"],
            "verdict": runs["verdict"],
            "width": [len(set((a or {}).values())) for a in runs["assigned"]],
            "nodes": [_nodes_text(a) for a in runs["assigned"]],
            "reject": [(r or {}).get("code") for r in runs["reject"]],
            "warmup": runs["_i"].to_numpy() < sc.warmup_runs,
            "source_id": [plan.source_ids[i] if plan.source_ids else None for i in runs["_i"]],
        }
    )
    events = med.query(
        f"""SELECT id, {_seconds("at")} AS at_s, kind, run_id, node_id, data
            FROM events ORDER BY id"""
    )
    promos = []
    event_rows = []
    queued_at: dict[str, float] = {}
    qlen: list[tuple[int, int]] = [(0, 0)]
    n_queued = 0
    grants: dict[tuple[str, str], float] = {}
    lease_rows: list[tuple[str, str, int, int]] = []
    for e in events:
        t = e["at_s"]
        kind, run_id, node_id, data = e["kind"], e["run_id"], e["node_id"], e["data"] or {}
        event_rows.append((round(t * US), kind, run_id, node_id, json.dumps(data, sort_keys=True)))
        how = _started(kind, data)
        if how is not None:
            assigned = data.get("assigned")
            promos.append((t, run_id, _nodes_text(assigned), how, _roles_text(assigned),
                           n_queued))  # fmt: skip
        if kind == "submitted" and data.get("state") == "QUEUED":
            queued_at[run_id] = t
            n_queued += 1
            qlen.append((round(t * US), n_queued))
        elif kind in ("promoted", "settled") and run_id in queued_at:
            del queued_at[run_id]
            n_queued -= 1
            qlen.append((round(t * US), n_queued))
        if kind == "lease_granted":
            grants[(node_id, run_id)] = t
        elif kind == "lease_released" and (node_id, run_id) in grants:
            lease_rows.append(
                (node_id, run_id, round(grants.pop((node_id, run_id)) * US), round(t * US))
            )
    lease_rows += [(n, r, round(g * US), -1) for (n, r), g in grants.items()]
    promotions = pd.DataFrame(promos, columns=["at_s", "run_id", "nodes", "how", "roles", "queued"])
    queue = frame(qlen, ("at_s", "length"), ("at_s",))
    stuck = frame(out.stuck_rows, ("run_id", "start_s", "end_s", "open"), ("start_s", "end_s"))
    stuck.insert(3, "duration_s", stuck["end_s"] - stuck["start_s"])
    leases = frame(lease_rows, ("node_id", "run_id", "granted_at", "released_at"),
                   ("granted_at", "released_at"))  # fmt: skip
    counts = dict(out.counts)
    counts["reaper_ticks"] = int(out.end_us // max(1, round(sc.settings.renew_seconds * US)))
    version = med.query("SELECT current_setting('server_version') AS v")[0]["v"]

    manifest = {
        "scenario": sc.name,
        "scenario_hash": sc.scenario_hash(),
        "seed": sc.seed,
        "runs": len(plan.arrivals),
        "engine": "mediator",
        "mediator_version": mediator.__version__,
        "postgresql_version": version,
        "python_version": platform.python_version(),
        "virtual_epoch": _T0,
        "wall_s": out.wall_s,
    }
    if out.stopped:  # a watch stopped it: the tables cover the run up to here
        manifest["stopped_at_s"] = out.end_us / US
    return Result(
        runs=runs_df,
        promotions=promotions,
        event_rows=event_rows,
        queue=queue,
        stuck=stuck,
        leases=leases,
        counts=counts,
        end_s=out.end_us / US,
        scenario_hash=sc.scenario_hash(),
        wall_s=out.wall_s,
        nodes=nodes_frame(plan),
        violations=list(out.violations),
        manifest=manifest,
        mediator_s=out.mediator_s,
        scenario=sc,
    )


def run_mediator(
    scenario: Scenario | Plan,
    database_url: str | None = None,
    progress: bool | Callable[[int], None] = True,
    *,
    template: str | None = None,
    drop: bool = False,
    until: Callable[[list[DecisionKey], int], bool] | None = None,
) -> Result:
    """Simulate ``scenario`` on the real Mediator and a fresh PostgreSQL database; what
    ``sim.run(scenario, broker="mediator")`` calls (see ``sim.brokers.entry.run`` for the
    arguments). The result's ``violations`` must be empty."""
    watch = None
    if until is not None:
        last = 0

        def watch(med: Mediator, now_us: int) -> bool:
            nonlocal last
            made, last = decisions_since(med, last)
            return until(made, now_us)

    plan, out, med, _records = simulate(
        scenario, database_url, progress, template=template, watch=watch
    )
    dsn = med.database_url
    try:
        return read_result(plan, out, med)
    finally:
        med.close()
        if drop and database_url:
            drop_database(database_url, dsn.rsplit("/", 1)[1].split("?")[0])
