"""Databases on a PostgreSQL server: create one (empty, a copy of a template, or with the schema
loaded) and drop one — what the simulator and the tests need to give each run its own database.

These used to live in the launcher ``mediator/pg.py``, which then had to import the store lazily.
The launcher only starts and stops a cluster; SQL goes through the store (issue 13: "the launcher
pg.py no longer imports the store"). The store may import the launcher, never the reverse;
``tests/unit/test_boundaries.py`` holds that line.
"""

from __future__ import annotations

from mediator.store.connector import Snapshot, admin_execute, load_schema, read_snapshot

# The lab's twin (docs/design.md §20) reads a Mediator database through read_snapshot: one
# consistent, read-only snapshot, streamed in batches, refused on another schema version.
__all__ = ["Snapshot", "create_database", "create_schema_database", "drop_database",
           "read_snapshot"]  # fmt: skip


def _safe(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise ValueError(f"unsafe database name {name!r}")
    return name


def create_database(admin_dsn: str, name: str, template: str | None = None) -> None:
    """``CREATE DATABASE name`` on the server of ``admin_dsn`` (a fresh database per simulation),
    empty or a copy of ``template`` (a schema-loaded database on the same server)."""
    copy = f' TEMPLATE "{_safe(template)}"' if template else ""
    admin_execute(admin_dsn, f'CREATE DATABASE "{_safe(name)}"{copy}')


def create_schema_database(admin_dsn: str, name: str) -> None:
    """A new database with the Mediator's schema loaded, e.g. a template that simulation tasks
    copy (issue 14 §8)."""
    create_database(admin_dsn, name)
    load_schema(admin_dsn.rsplit("/", 1)[0] + "/" + name)


def drop_database(admin_dsn: str, name: str) -> None:
    """``DROP DATABASE IF EXISTS name WITH (FORCE)``: connections still open are ended."""
    admin_execute(admin_dsn, f'DROP DATABASE IF EXISTS "{_safe(name)}" WITH (FORCE)')
