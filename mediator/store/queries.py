"""Load the named SQL blocks of ``queries.sql`` once into a dict (procrastinate's pattern).

Call sites read ``QUERIES["fetch_job"]``: the SQL stays in a file a reviewer can read, lint and
run by hand, and a misspelt name fails at import time of the caller's first use, not silently.

A block headed ``-- fragment name --`` is not a query: it is SQL that several queries share (the
capability predicate, docs/design.md §4), written once and placed where a query says
``{{name}}``. A fragment is text, resolved here when the file is loaded: PostgreSQL plans the
queries as if it were written out in each (a SQL function with a sub-select would not be inlined,
and would run once per node row).
"""

from __future__ import annotations

import re
from importlib import resources

_HEADER = re.compile(r"^-- (fragment )?([a-z_][a-z0-9_]*) --$")
_USE = re.compile(r"\{\{([a-z_][a-z0-9_]*)\}\}")


def parse(text: str) -> dict[str, str]:
    """Split ``text`` into ``{name: sql}`` at lines ``-- name --``.

    Comment lines inside a block are dropped (they document the block, not the server's work);
    text before the first header is the file's preamble and is ignored. A name defined twice is
    an error, since the second would silently win. ``{{name}}`` in a query is replaced by the
    fragment ``name`` (fragments do not nest); an unknown or unused fragment is an error.
    """
    blocks: dict[str, list[str]] = {}
    fragment_names: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        m = _HEADER.match(line.strip())
        if m:
            name = m.group(2)
            if name in blocks:
                raise ValueError(f"query {name!r} is defined twice")
            current = blocks[name] = []
            if m.group(1):
                fragment_names.append(name)
        elif current is not None and not line.lstrip().startswith("--"):
            current.append(line)
    fragments = {name: "\n".join(blocks.pop(name)) for name in fragment_names}
    for name, sql in fragments.items():
        if not sql.strip():
            raise ValueError(f"fragment {name!r} has no SQL")
        if _USE.search(sql):
            raise ValueError(f"fragment {name!r} uses another fragment")
    used: set[str] = set()

    def place(m: re.Match[str]) -> str:
        if m.group(1) not in fragments:
            raise ValueError(f"unknown fragment {m.group(1)!r}")
        used.add(m.group(1))
        return fragments[m.group(1)]

    out = {name: compact(_USE.sub(place, "\n".join(lines)).split("\n"))
           for name, lines in blocks.items()}  # fmt: skip
    empty = [name for name, sql in out.items() if not sql]
    if empty:
        raise ValueError(f"query {empty[0]!r} has no SQL")
    unused = sorted(set(fragments) - used)
    if unused:
        raise ValueError(f"fragment {unused[0]!r} is used by no query")
    return out


def compact(lines: list[str]) -> str:
    """The block's lines without their indentation and blank lines.

    Why: psycopg caches the conversion of a query's text only up to 4,096 bytes
    (``MAX_CACHED_STATEMENT_LENGTH``); a longer one is re-parsed in Python on every execution,
    which cost the result's write (``apply_result``) about 0.2 ms per call. Indentation is most
    of the difference (docs/performance.md, issue 13). A line that starts or ends inside a
    string literal keeps its spaces, since they are part of the literal's value.
    """
    out: list[str] = []
    quoted = False  # inside a '…' literal at the start of the line
    for line in lines:
        starts_quoted = quoted
        quoted ^= line.count("'") % 2 == 1  # '' inside a literal keeps the parity
        text = line if starts_quoted else line.lstrip()
        text = text if quoted else text.rstrip()
        if text or starts_quoted:
            out.append(text)
    return "\n".join(out).strip()


def load(filename: str = "queries.sql") -> dict[str, str]:
    return parse(resources.files("mediator.store").joinpath(filename).read_text("utf-8"))


def schema_sql() -> str:
    return resources.files("mediator.store").joinpath("schema.sql").read_text("utf-8")


QUERIES = load()
