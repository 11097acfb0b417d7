"""The lab's own twin (docs/design.md §20): a window of a running Mediator's database, exported as
tables a simulation can replay — `export`, and ``python -m sim twin export``.

What a lab's Mediator holds answers "how long would people have waited with two more boards?" for
that lab: its runs (submit instant, needs by role, steps, attempts with claim and result instants,
asks with their answer delays, cancels) and, from ``fleet_history`` (docs/design.md §12), its
fleet (which node was there with which capabilities, when it restarted, drained or went). The
export reads one consistent, read-only snapshot (``mediator.databases.read_snapshot``) through
server-side cursors, a batch at a time, so a month of a busy lab is written in bounded memory.

The window ``[since, until)`` is cut explicitly. Every instant is in seconds from ``since``; a run
submitted before ``since`` and not ended by then is in the export with a negative ``submit_s`` and
``at_since`` saying where it stood (``queued`` or ``running``); a run or attempt still going at
``until`` has no end and ``at_until`` says where it stood. The fleet at ``since`` is its own table
(``fleet_at_since.csv``), rebuilt from the history rows up to then.

``pseudonymize`` replaces run, node and work ids by stable pseudonyms: HMAC-SHA256 of the id under
a key, ``r-``/``n-``/``w-`` and 16 hex digits. The same key gives the same pseudonym in every table
and every export (two months exported under one key join); without a key the export draws one at
random and keeps it nowhere. Node labels are dropped and ask texts never leave the database
(only their instants and ``ok``); capabilities are kept — a replay matches on them.

The replay's side is `sim.inputs.twin` (re-exported here: ``sim.twin.load(DIR)`` and the what-ifs
``with_nodes``, ``dark``, ``scaled``); `simulate_lab` simulates a lab on the real Mediator and keeps
its database, for a twin the project generates itself (the tests, notebook 05).
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from mediator.core.errors import MediatorError
from mediator.databases import Snapshot, read_snapshot
from sim.inputs.scenarios import Scenario
from sim.inputs.twin import (  # the replay's side: sim.twin.load(DIR), its what-ifs
    dark,
    group_of,
    lab_day,
    load,
    recorded_decisions,
    scaled,
    with_nodes,
)
from sim.platform.measure import Result

__all__ = [
    "FORMAT",
    "KEY_ENV",
    "LabDay",
    "Pseudonyms",
    "TwinError",
    "TwinExport",
    "dark",
    "export",
    "group_of",
    "lab_day",
    "load",
    "recorded_decisions",
    "scaled",
    "simulate_lab",
    "with_nodes",
]

#: Bumped when a table's columns change; a replay refuses a format it does not know.
FORMAT = "mediator-twin/2"  # 2: runs.assigned (role → node), what a replay compares

#: The environment variable the CLI reads a pseudonymization key from (never a flag's value, so
#: the key stays out of shell history and process listings).
KEY_ENV = "SIM_TWIN_KEY"


class TwinError(ValueError):
    """A twin export the caller asked wrongly (a window that ends before it starts)."""


@dataclass
class Pseudonyms:
    """Stable pseudonyms: ``r-``, ``n-`` or ``w-`` and the first 16 hex digits of
    HMAC-SHA256(key, kind + ":" + id); identity when ``key`` is None."""

    key: bytes | None
    _memo: dict[tuple[str, str], str] = field(default_factory=dict)

    def __call__(self, kind: str, value: str | None) -> str | None:
        if self.key is None or not value:
            return value
        hit = self._memo.get((kind, value))
        if hit is None:
            digest = hmac.new(self.key, f"{kind}:{value}".encode(), hashlib.sha256).hexdigest()
            hit = f"{kind[0]}-{digest[:16]}"
            if kind != "run":  # nodes and work ids are few; runs are not (bounded memory)
                self._memo[kind, value] = hit
        return hit


@dataclass(frozen=True)
class TwinExport:
    """What `export` wrote: the folder, its manifest, and each table's row count."""

    out: Path
    manifest: dict[str, Any]
    rows: dict[str, int]


def _s(column: str) -> str:
    """An instant as seconds from the window's start."""
    return f"extract(epoch FROM ({column} - %(since)s::timestamptz))::float8"


# A run belongs to the window if it was submitted before `until` and had not ended by `since`.
_RUNS_IN = "r.created_at < %(until)s AND (r.ended_at IS NULL OR r.ended_at > %(since)s)"

QUERIES: dict[str, str] = {
    "runs": f"""
        SELECT r.run_id, r.work_id, nc.needs AS needs,
               {_s("r.created_at")} AS submit_s,
               CASE WHEN r.started_at <= %(until)s THEN {_s("r.started_at")} END AS started_s,
               CASE WHEN r.ended_at <= %(until)s THEN {_s("r.ended_at")} END AS ended_s,
               CASE WHEN r.ended_at <= %(until)s THEN r.verdict END AS verdict,
               CASE WHEN r.created_at >= %(since)s THEN 'new'
                    WHEN r.started_at IS NULL OR r.started_at > %(since)s THEN 'queued'
                    ELSE 'running' END AS at_since,
               CASE WHEN r.ended_at <= %(until)s THEN 'ended'
                    WHEN r.started_at IS NULL OR r.started_at > %(until)s THEN 'queued'
                    ELSE 'running' END AS at_until,
               (SELECT {_s("min(e.at)")} FROM events e
                WHERE e.run_id = r.run_id AND e.kind = 'cancelled' AND e.at < %(until)s)
                   AS cancelled_s,
               r.reject ->> 'code' AS reject,
               CASE WHEN r.started_at < %(until)s THEN r.assigned END AS assigned
        FROM runs r JOIN needs_classes nc ON nc.needs_key = r.needs_key
        WHERE {_RUNS_IN}
        ORDER BY r.created_at, r.run_id""",
    "steps": f"""
        SELECT s.run_id, s.seq, s.name, s.kind, s.role, s.uses, s.after
        FROM runs r JOIN steps s ON s.run_id = r.run_id
        WHERE {_RUNS_IN}
        ORDER BY r.created_at, r.run_id, s.seq""",
    # One row per attempt: its claim paired with the result of the same (seq, attempt).
    "attempts": f"""
        SELECT c.run_id, (c.data ->> 'seq')::int AS seq, (c.data ->> 'attempt')::int AS attempt,
               c.node_id, {_s("c.at")} AS claimed_s,
               CASE WHEN res.at < %(until)s THEN {_s("res.at")} END AS result_s,
               CASE WHEN res.at < %(until)s THEN res.data ->> 'outcome' END AS outcome
        FROM runs r
        JOIN events c ON c.run_id = r.run_id AND c.kind = 'claimed' AND c.at < %(until)s
        LEFT JOIN LATERAL (
            SELECT e.at, e.data FROM events e
            WHERE e.run_id = c.run_id AND e.kind = 'result'
              AND e.data -> 'seq' = c.data -> 'seq' AND e.data -> 'attempt' = c.data -> 'attempt'
            ORDER BY e.id LIMIT 1) res ON true
        WHERE {_RUNS_IN}
        ORDER BY r.created_at, r.run_id, c.id""",
    "asks": f"""
        SELECT a.run_id, a.seq, {_s("a.raised_at")} AS raised_s,
               CASE WHEN a.answered_at < %(until)s THEN {_s("a.answered_at")} END AS answered_s,
               CASE WHEN a.answered_at < %(until)s
                    THEN extract(epoch FROM (a.answered_at - a.raised_at))::float8 END
                   AS answer_delay_s,
               CASE WHEN a.answered_at < %(until)s THEN a.ok END AS ok
        FROM runs r JOIN asks a ON a.run_id = r.run_id
        WHERE {_RUNS_IN} AND a.raised_at < %(until)s
        ORDER BY r.created_at, r.run_id, a.seq""",
    # The fleet at `since`: each node's last history row up to then. A node is absent if that row
    # is `expired`, or if its next row is a `returned` whose gone_at is not after `since` (an
    # expiry no reaper pass noticed before the node came back).
    "fleet_at_since": """
        SELECT h.node_id, h.data ->> 'instance' AS instance, h.data ->> 'drain' AS drain,
               h.data -> 'capabilities' AS capabilities,
               h.kind <> 'expired' AND NOT coalesce(
                   nxt.kind = 'returned' AND (nxt.data ->> 'gone_at')::timestamptz <= %(since)s,
                   false) AS present
        FROM (SELECT DISTINCT ON (node_id) * FROM fleet_history
              WHERE at <= %(since)s ORDER BY node_id, at DESC, id DESC) h
        LEFT JOIN LATERAL (
            SELECT n.kind, n.data FROM fleet_history n
            WHERE n.node_id = h.node_id AND n.at > %(since)s
            ORDER BY n.at, n.id LIMIT 1) nxt ON true
        ORDER BY h.node_id""",
    "fleet_events": f"""
        SELECT {_s("at")} AS at_s, node_id, kind, data ->> 'instance' AS instance,
               data ->> 'drain' AS drain, data -> 'capabilities' AS capabilities,
               CASE WHEN kind = 'returned'
                    THEN {_s("(data ->> 'gone_at')::timestamptz")} END AS gone_s
        FROM fleet_history
        WHERE at > %(since)s AND at < %(until)s
        ORDER BY at, id""",
}

COLUMNS: dict[str, list[str]] = {
    "runs": ["run_id", "work_id", "needs", "submit_s", "started_s", "ended_s", "verdict",
             "at_since", "at_until", "cancelled_s", "reject", "assigned"],
    "steps": ["run_id", "seq", "name", "kind", "role", "uses", "after"],
    "attempts": ["run_id", "seq", "attempt", "node_id", "claimed_s", "result_s", "outcome"],
    "asks": ["run_id", "seq", "raised_s", "answered_s", "answer_delay_s", "ok"],
    "fleet_at_since": ["node_id", "instance", "drain", "capabilities", "present"],
    "fleet_events": ["at_s", "node_id", "kind", "instance", "drain", "capabilities", "gone_s"],
    "nodes": ["node_id", "order"],
}  # fmt: skip

_COUNT = {
    "runs": f"SELECT count(*) AS n FROM runs r WHERE {_RUNS_IN}",
    "fleet_events": (
        "SELECT count(*) AS n FROM fleet_history WHERE at > %(since)s AND at < %(until)s"
    ),
}

_IDS = {"run_id": "run", "node_id": "node", "work_id": "work"}


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(round(value, 6))
    return value


def _write(
    path: Path, columns: list[str], rows: Iterable[dict[str, Any]], names: Pseudonyms,
    tick: Callable[[], None], seen: set[str],
) -> int:  # fmt: skip
    n = 0
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(columns)
        for row in rows:
            if row.get("node_id"):
                seen.add(row["node_id"])
            for col, kind in _IDS.items():
                if col in row:
                    row[col] = names(kind, row[col])
            if row.get("assigned"):  # {role: node}: the nodes under their pseudonyms too
                seen.update(row["assigned"].values())
                row["assigned"] = {r: names("node", n) for r, n in row["assigned"].items()}
            w.writerow([_cell(row[c]) for c in columns])
            n += 1
            tick()
    return n


def _parse_instant(value: datetime | str, name: str) -> datetime:
    if isinstance(value, datetime):
        t = value
    else:
        try:
            t = datetime.fromisoformat(value)
        except ValueError:
            raise TwinError(f"{name} must be an ISO 8601 instant, e.g. 2026-11-01T00:00Z") from None
    if t.tzinfo is None:
        raise TwinError(f"{name} needs a time zone (e.g. a trailing Z for UTC)")
    return t


def export(
    database_url: str,
    since: datetime | str,
    until: datetime | str,
    out: str | os.PathLike[str],
    *,
    pseudonymize: bool = False,
    key: bytes | None = None,
    progress: bool = True,
    batch: int = 2000,
) -> TwinExport:
    """Export ``[since, until)`` of the Mediator database at ``database_url`` into folder ``out``:
    ``twin.json`` (the manifest: window, format, schema version, tables) and one CSV per table
    (``runs``, ``steps``, ``attempts``, ``asks``, ``fleet_at_since``, ``fleet_events``, ``nodes``:
    every node named, with its place in the lab's id order). Read-only;
    a database of another schema version is refused (MediatorError)."""
    t0 = _parse_instant(since, "since")
    t1 = _parse_instant(until, "until")
    if t1 <= t0:
        raise TwinError("until must come after since")
    if pseudonymize and key is None:
        key = secrets.token_bytes(32)
    names = Pseudonyms(key if pseudonymize else None)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    params = {"since": t0, "until": t1}
    rows: dict[str, int] = {}
    seen: set[str] = set()  # the nodes named anywhere (few: kept in memory)
    with read_snapshot(database_url, batch=batch) as snap:
        total = sum(_count(snap, q, params) for q in _COUNT.values())
        with _bar(total, progress) as tick:
            for table, sql in QUERIES.items():
                tick_table = tick if table in _COUNT else _no_tick
                stream: Iterator[dict[str, Any]] = snap.stream(sql, params)
                rows[table] = _write(
                    folder / f"{table}.csv", COLUMNS[table], stream, names, tick_table, seen
                )
        version = snap.one("SELECT version FROM schema_version")
    # Each node's place in the lab's own id order: the matcher breaks ties by node id, so a
    # replay under pseudonyms (which sort otherwise) must keep the lab's order (sim.inputs.twin).
    order = ({"node_id": n, "order": i} for i, n in enumerate(sorted(seen)))
    rows["nodes"] = _write(folder / "nodes.csv", COLUMNS["nodes"], order, names, _no_tick, set())
    tables = {t: {"file": f"{t}.csv", "rows": n, "columns": COLUMNS[t]} for t, n in rows.items()}
    manifest = {
        "format": FORMAT,
        "schema_version": version["version"] if version else None,
        "since": t0.isoformat(),
        "until": t1.isoformat(),
        "window_s": (t1 - t0).total_seconds(),
        "pseudonymized": "hmac-sha256" if pseudonymize else False,
        "tables": tables,
    }
    (folder / "twin.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return TwinExport(folder, manifest, rows)


def _count(snap: Snapshot, sql: str, params: dict[str, Any]) -> int:
    row = snap.one(sql, params)
    return int(row["n"]) if row else 0


def _no_tick() -> None:
    return None


class _bar:
    """A tqdm bar over the runs and fleet rows written (off when ``progress`` is False)."""

    def __init__(self, total: int, progress: bool) -> None:
        self.bar: Any = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc="twin export", unit="row", leave=False)

    def __enter__(self) -> Callable[[], None]:
        bar = self.bar
        return (lambda: bar.update(1)) if bar is not None else _no_tick

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def cli_export(args: Any) -> int:
    """``python -m sim twin export``: the CLI's side of `export` (a refused database or window is
    one line on stderr and exit status 2, never a traceback)."""
    import sys

    key_text = os.environ.get(KEY_ENV)
    try:
        done = export(
            args.database_url, args.since, args.until, args.out,
            pseudonymize=args.pseudonymize, key=key_text.encode() if key_text else None,
            progress=not args.quiet,
        )  # fmt: skip
    except (TwinError, MediatorError) as exc:
        print(f"sim twin export: {exc}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{t} {n}" for t, n in done.rows.items())
    print(f"wrote {done.out}/twin.json ({counts})")
    return 0


@dataclass(frozen=True)
class LabDay:
    """A lab simulated on the real Mediator whose database is kept, for exporting its twin:
    the simulation's `result`, the database's URL, and the window it covers."""

    result: Result
    database_url: str
    since: datetime
    until: datetime


def simulate_lab(
    scenario: Scenario, database_url: str | None = None, progress: bool = False
) -> LabDay:
    """Simulate ``scenario`` on the real Mediator and keep its database (a lab's day the project
    generates itself, to export, replay and audit; the caller drops it when done)."""
    from sim.brokers.mediator import EPOCH, simulate
    from sim.brokers.readback import read_result

    plan, out, med, _records = simulate(scenario, database_url, progress)
    try:
        result = read_result(plan, out, med)
        url = med.database_url
    finally:
        med.close()
    return LabDay(result, url, EPOCH, EPOCH + timedelta(seconds=result.end_s))
