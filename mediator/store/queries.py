"""Load the named SQL blocks of ``queries.sql`` once into a dict (procrastinate's pattern).

Call sites read ``QUERIES["fetch_job"]``: the SQL stays in a file a reviewer can read, lint and
run by hand, and a misspelt name fails at import time of the caller's first use, not silently.
"""

from __future__ import annotations

import re
from importlib import resources

_HEADER = re.compile(r"^-- ([a-z_][a-z0-9_]*) --$")


def parse(text: str) -> dict[str, str]:
    """Split ``text`` into ``{name: sql}`` at lines ``-- name --``.

    Comment lines inside a block are dropped (they document the block, not the server's work);
    text before the first header is the file's preamble and is ignored. A name defined twice is
    an error, since the second would silently win.
    """
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        m = _HEADER.match(line.strip())
        if m:
            name = m.group(1)
            if name in blocks:
                raise ValueError(f"query {name!r} is defined twice")
            current = blocks[name] = []
        elif current is not None and not line.lstrip().startswith("--"):
            current.append(line)
    out = {name: "\n".join(lines).strip() for name, lines in blocks.items()}
    empty = [name for name, sql in out.items() if not sql]
    if empty:
        raise ValueError(f"query {empty[0]!r} has no SQL")
    return out


def load(filename: str = "queries.sql") -> dict[str, str]:
    return parse(resources.files("mediator.store").joinpath(filename).read_text("utf-8"))


def schema_sql() -> str:
    return resources.files("mediator.store").joinpath("schema.sql").read_text("utf-8")


QUERIES = load()
