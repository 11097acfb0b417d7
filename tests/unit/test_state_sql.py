"""issue 13, "the state table decides": every state the SQL writes is an edge of
mediator.core.states.

The test reads ``mediator/store/queries.sql`` (and the functions of ``schema.sql``) the way a
reviewer would: for every ``UPDATE runs|steps … SET state = …`` and every ``INSERT INTO
runs|steps (… state …)`` it finds the target and the guard on the row's current state, and checks
them against ``RUN_TRANSITIONS`` / ``STEP_TRANSITIONS``:

* a literal target (``SET state = 'CLAIMED'``) needs a literal guard in the same statement
  (``AND s.state = 'PENDING'``), and every guard → target must be an edge; an INSERT's literal
  target must be an edge from no row;
* a parameter target must be named ``%(…_to)s`` (``run_to`` for runs, any other name for steps)
  and, in an UPDATE, be guarded by ``state = ANY(%(…_from)s)`` with the same prefix. The store
  fills both from the table (``run_sources``/``step_sources``) and ``check_edges`` refuses any
  pair that is not an edge before the statement is sent — tested below too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from mediator.core.states import (
    RUN_TRANSITIONS,
    STEP_TRANSITIONS,
    InvalidTransition,
    RunState,
    StepState,
    run_sources,
    step_sources,
)
from mediator.store.connector import check_edges
from mediator.store.queries import load, schema_sql

TABLES = {"runs": RUN_TRANSITIONS, "steps": STEP_TRANSITIONS}
STATES = {"runs": {s.value for s in RunState}, "steps": {s.value for s in StepState}}
_PARAM = re.compile(r"%\((\w+)\)s")
_END = re.compile(r"\bRETURNING\b|\n\),\s*\w+\s+AS\s*\(|\n\)\s*\n|\Z")


@dataclass(frozen=True)
class Write:
    """One state write found in the SQL: which block, table, target and guards."""

    block: str
    table: str
    target: str  # the SQL expression written to `state`
    guards: tuple[str, ...]  # literal states the row must be in (UPDATE), empty for INSERT
    guard_params: tuple[str, ...]  # %(…)s parameters the row's state is compared with
    insert: bool


def split_top(text: str) -> list[str]:
    """``text`` split at commas outside parentheses."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return out


def _statement(sql: str, start: int) -> str:
    """From ``start`` to the end of that statement or CTE member."""
    m = _END.search(sql, start)
    return sql[start : m.start() if m else len(sql)]


def _guards(where: str, alias: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Literal states and parameters the updated row's own ``state`` is compared with."""
    own = rf"(?:\b{alias}\.|(?<![\w.]))state\s*"
    literals: list[str] = []
    params: list[str] = []
    for m in re.finditer(own + r"=\s*'(\w+)'", where):
        literals.append(m.group(1))
    for m in re.finditer(own + r"IN\s*\(([^)]*)\)", where):
        literals += re.findall(r"'(\w+)'", m.group(1))
    for m in re.finditer(own + r"=\s*ANY\s*\(\s*%\((\w+)\)s", where):
        params.append(m.group(1))
    return tuple(literals), tuple(params)


def writes(name: str, sql: str) -> Iterator[Write]:
    """Every write of ``runs.state`` / ``steps.state`` in one block."""
    for m in re.finditer(r"\bUPDATE\s+(runs|steps)\b(?:\s+(?:AS\s+)?(\w+))?\s+SET\b", sql):
        table, alias = m.group(1), m.group(2) or m.group(1)
        if alias.upper() == "SET":
            alias = table
        body = _statement(sql, m.end())
        where_at = re.search(r"\bWHERE\b", body)
        sets = body[: where_at.start() if where_at else len(body)]
        sets = re.split(r"\bFROM\b", sets)[0]
        where = body[where_at.end() :] if where_at else ""
        for item in split_top(sets):
            col, _, expr = item.partition("=")
            if col.strip().split(".")[-1] == "state":
                guards, params = _guards(where, alias)
                yield Write(name, table, expr.strip(), guards, params, insert=False)
    for m in re.finditer(r"\bINSERT\s+INTO\s+(runs|steps)\s*\(([^)]*)\)", sql):
        table = m.group(1)
        cols = [c.strip().strip('"') for c in m.group(2).split(",")]
        if "state" not in cols:
            continue
        rest = _statement(sql, m.end())
        values = re.match(r"\s*VALUES\s*\((.*)\)", rest, re.S)
        if values:
            exprs = split_top(values.group(1))
        else:
            select = re.match(r"\s*SELECT\b(.*?)\bFROM\b", rest, re.S)
            assert select, f"{name}: cannot read the INSERT's values"
            exprs = split_top(select.group(1))
        assert len(exprs) == len(cols), f"{name}: {len(exprs)} values for {len(cols)} columns"
        yield Write(name, table, exprs[cols.index("state")], (), (), insert=True)


def all_writes() -> list[Write]:
    found = [w for name, sql in load().items() for w in writes(name, sql)]
    bodies = re.findall(r"\$\$(.*?)\$\$", schema_sql(), re.S)
    found += [w for i, body in enumerate(bodies) for w in writes(f"schema function {i}", body)]
    return found


def test_the_sql_writes_states_in_the_blocks_we_expect() -> None:
    # The parser must see the writes, or the test below would pass on nothing.
    by_block = {(w.block, w.table) for w in all_writes()}
    for expected in [
        ("create_run", "runs"),
        ("create_run", "steps"),
        ("claim_step", "steps"),
        ("finish_step", "steps"),
        ("skip_steps", "steps"),
        ("end_run", "runs"),
        ("raise_asks", "steps"),
        ("apply_result", "runs"),
        ("apply_result", "steps"),
        ("promote", "runs"),
        ("promote", "steps"),
    ]:
        assert expected in by_block


@pytest.mark.parametrize("write", all_writes(), ids=lambda w: f"{w.block}:{w.table}:{w.target}")
def test_every_state_the_sql_writes_is_an_edge_of_the_state_table(write: Write) -> None:
    # issue 13: "the state table decides" — a hard-coded transition is checked against it, a
    # parameter one must carry its guard so the store's check_edges covers it.
    table = TABLES[write.table]
    literal = re.fullmatch(r"'(\w+)'(?:::text)?", write.target)
    if literal:
        to = literal.group(1)
        assert to in STATES[write.table], f"{write.block}: {to!r} is not a state"
        sources = list(write.guards) if not write.insert else [None]
        assert sources, f"{write.block}: writes {to} to {write.table} whatever its state"
        for frm in sources:
            assert any(to == t for t in table[frm]), f"{write.block}: {frm} → {to} is no edge"
        return
    params = _PARAM.findall(write.target)
    assert len(params) == 1, f"{write.block}: state target {write.target!r} is not one parameter"
    (param,) = params
    assert param.endswith("_to"), f"{write.block}: state parameter {param} must be named …_to"
    assert (param == "run_to") == (write.table == "runs"), (
        f"{write.block}: {param} on {write.table}"
    )
    stripped = write.target.replace(f"%({param})s", "P").replace("::text", "")
    assert stripped in ("P", "coalesce(P, state)"), f"{write.block}: {write.target!r}"
    if not write.insert:
        assert param[:-3] + "_from" in write.guard_params, (
            f"{write.block}: {param} is written without `state = ANY(%({param[:-3]}_from)s)`"
        )


def test_every_state_literal_the_sql_compares_is_a_state() -> None:
    # A misspelt state in a guard would silently match nothing.
    known = STATES["runs"] | STATES["steps"]
    for name, sql in load().items():
        compared = re.findall(r"\bstate\s*(?:=|<>)\s*'(\w+)'", sql)
        for listed in re.findall(r"\bstate\s+IN\s*\(([^)]*)\)", sql):
            compared += re.findall(r"'(\w+)'", listed)
        for lit in compared:
            assert lit in known, f"{name}: {lit!r} is not a state"


def test_the_store_refuses_a_state_parameter_that_is_not_an_edge() -> None:
    # The runtime half: what the SQL takes as a parameter, check_edges checks against the table.
    check_edges({"run_to": "PASSED", "run_from": ["RUNNING"]})
    check_edges({"run_to": "QUEUED"})  # an INSERT: from no row
    check_edges({"skip_to": "SKIPPED", "skip_from": ["PENDING", "CLAIMED", "ASKED"]})
    check_edges({"run_to": None, "run_from": ["RUNNING"]})  # no state written
    with pytest.raises(InvalidTransition):
        check_edges({"run_to": "PASSED", "run_from": ["QUEUED"]})  # a queued run ran nothing
    with pytest.raises(InvalidTransition):
        check_edges({"step_to": "ASKED"})  # an ask is raised from PENDING, never inserted
    with pytest.raises(InvalidTransition):
        check_edges({"ask_to": "PENDING", "ask_from": ["PASSED"]})


def test_the_sources_of_a_state_are_exactly_the_table_s_edges_into_it() -> None:
    for to in RunState:
        assert set(run_sources(to)) == {f for f, ts in RUN_TRANSITIONS.items() if f and to in ts}
    for step_to in StepState:
        assert set(step_sources(step_to)) == {
            f for f, ts in STEP_TRANSITIONS.items() if f and step_to in ts
        }
    assert run_sources(RunState.PASSED) == (RunState.RUNNING,)
    assert step_sources(StepState.ASKED) == (StepState.PENDING,)


def test_the_parser_catches_a_transition_the_table_does_not_have() -> None:
    # The checker checked: a hard-coded QUEUED → PASSED, an unguarded write, a parameter without
    # its guard — each is found and refused by the same rules as the real blocks.
    bad = (
        "UPDATE runs SET state = 'PASSED', verdict = 'pass'"
        " WHERE run_id = %(run_id)s AND state = 'QUEUED'"
    )
    (w,) = writes("bad", bad)
    assert (w.target, w.guards) == ("'PASSED'", ("QUEUED",))
    assert "PASSED" not in RUN_TRANSITIONS[RunState.QUEUED]
    with pytest.raises(AssertionError, match="is no edge"):
        test_every_state_the_sql_writes_is_an_edge_of_the_state_table(w)
    (w,) = writes("bad", "UPDATE steps SET state = 'SKIPPED' WHERE run_id = %(run_id)s")
    with pytest.raises(AssertionError, match="whatever its state"):
        test_every_state_the_sql_writes_is_an_edge_of_the_state_table(w)
    (w,) = writes("bad", "UPDATE steps s SET state = %(step_to)s WHERE s.run_id = %(run_id)s")
    with pytest.raises(AssertionError, match="without"):
        test_every_state_the_sql_writes_is_an_edge_of_the_state_table(w)
