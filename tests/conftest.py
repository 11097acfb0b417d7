"""Session fixtures: one PostgreSQL cluster, a schema template, a database per test.

docs/architecture.md: the store is always tested against a real PostgreSQL. The cluster starts once
(about a second on tmpfs); the schema is loaded once into a template database; every test that
asks for ``dsn`` gets its own ``CREATE DATABASE … TEMPLATE`` copy (~15 ms), so tests never see
each other's rows and can run in any order.

``MEDIATOR_TEST_DATABASE_URL`` points the session at an existing server instead (its user must be
allowed to create databases).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from mediator.pg import EmbeddedPostgres
from mediator.store.connector import admin_execute, load_schema

# The scheduler gate's fixture ``sim_check`` (issue 16 §4), loaded here rather than by an entry
# point so that pytest-cov measures sim from its first import.
pytest_plugins = ["sim.outputs.pytest_plugin"]

TEMPLATE = "mediator_template"
_counter = itertools.count()


class Cluster:
    def __init__(self) -> None:
        url = os.environ.get("MEDIATOR_TEST_DATABASE_URL")
        self.embedded: EmbeddedPostgres | None = None
        if url:
            self._admin = url
            self._base = url.rsplit("/", 1)[0]
        else:
            self.embedded = EmbeddedPostgres(database="postgres")
            self._admin = self.embedded.dsn("postgres")
        admin_execute(self._admin, f'DROP DATABASE IF EXISTS "{TEMPLATE}"')
        admin_execute(self._admin, f'CREATE DATABASE "{TEMPLATE}"')
        load_schema(self.dsn(TEMPLATE))

    def dsn(self, database: str) -> str:
        if self.embedded is not None:
            return self.embedded.dsn(database)
        return f"{self._base}/{database}"

    def url(self, database: str) -> str:
        if self.embedded is not None:
            return self.embedded.url(database)
        return f"{self._base}/{database}"

    def fresh_database(self) -> str:
        name = f"t{os.getpid()}_{next(_counter)}"
        admin_execute(
            self._admin, f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}" STRATEGY FILE_COPY'
        )
        return name

    def drop(self, name: str) -> None:
        admin_execute(self._admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        if self.embedded is not None:
            self.embedded.stop()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.stop()


@pytest.fixture
def dsn(cluster: Cluster) -> Iterator[str]:
    """A fresh database with the schema loaded, dropped after the test."""
    name = cluster.fresh_database()
    yield cluster.dsn(name)
    cluster.drop(name)


# ---- session-wide rules ------------------------------------------------------------------------
# Import-boundary rules whose source folder does not exist yet are reported here as "not checked"
# (docs/architecture.md): never counted as passed, and not a skip or a warning.
# tests/unit/test_boundaries.py: one "N checked · M skipped" line per rule (issue 12 §6).
BOUNDARIES: list[str] = []


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    if BOUNDARIES:
        terminalreporter.section("import boundaries")
        for line in BOUNDARIES:
            terminalreporter.write_line(line)
    skipped = terminalreporter.stats.get("skipped", [])
    if skipped and os.environ.get("MEDIATOR_NO_SKIPS"):
        terminalreporter.section("skipped tests are failures here")
        terminalreporter.write_line(f"{len(skipped)} test(s) skipped; CI must run them all.")


def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped and os.environ.get("MEDIATOR_NO_SKIPS") and exitstatus == 0:
        session.exitstatus = 1
