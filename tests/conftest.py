"""Session fixtures: one PostgreSQL cluster, a schema template, a database per test.

docs/architecture.md: the store is always tested against a real PostgreSQL. The cluster starts once
(about a second on tmpfs); the schema is loaded once into a template database; every test that
asks for ``dsn`` gets its own ``CREATE DATABASE … TEMPLATE`` copy (~15 ms), so tests never see
each other's rows and can run in any order.

``MEDIATOR_TEST_DATABASE_URL`` points the session at an existing server instead (its user must be
allowed to create databases).

``scripts/test`` runs the suite on two pytest-xdist workers (docs/performance.md, "The test
suite"): each worker is its own pytest session with its own cluster, and what a test adds to a
session-wide summary (the import boundaries, the adversarial figures) travels back to the
controller, which prints it. Hypothesis runs under the profile named by ``HYPOTHESIS_PROFILE``:
``ci`` (the default, and what ``scripts/test`` runs) keeps every test's example count, ``dev``
(``scripts/test --fast``) runs a fifth of them.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from mediator.pg import EmbeddedPostgres
from mediator.store.connector import admin_execute, load_schema

# The scheduler gate's fixture ``sim_check`` (issue 16 §4), loaded here rather than by an entry
# point so that pytest-cov measures sim from its first import.
pytest_plugins = ["sim.outputs.pytest_plugin"]

# ---- hypothesis profiles ----------------------------------------------------------------------
# ci: hypothesis' defaults and every test's own example count, unchanged. dev: a fifth of each, for
# the edit-test loop (scripts/test --fast). A test that sets its own count writes examples(n).
settings.register_profile("ci", settings.get_profile("default"))
settings.register_profile("dev", max_examples=20)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# ---- servers the tests start -----------------------------------------------------------------
# ``mediator serve`` defaults to a worker process per CPU, each a Python process of its own with
# its imports (and, under coverage, its own tracer). A test that is not about the workers needs
# one: the servers the tests start get one worker unless a test says otherwise (``--workers N``
# on the command line wins over this variable; tests/e2e/test_serve_workers.py and the stall
# tests with two workers say so). 16 % less CPU for the e2e and adversarial tiers.
os.environ.setdefault("MEDIATOR_WORKERS", "1")


def examples(n: int) -> int:
    """A test's example count ``n`` scaled to the loaded profile: ``n`` under ``ci`` (whose
    default is 100 examples), ``n // 5`` but at least 5 under ``dev``."""
    per_hundred = settings().max_examples
    return n if per_hundred >= 100 else max(5, n * per_hundred // 100)


_counter = itertools.count()


class Cluster:
    def __init__(self) -> None:
        # The schema template, one per pytest session: sessions that share one server through
        # ``MEDIATOR_TEST_DATABASE_URL`` (bench/bench_mutation.py judges mutants side by side on
        # one cluster) must not drop each other's template while another clones it.
        self.template = f"mediator_template_{os.getpid()}"
        url = os.environ.get("MEDIATOR_TEST_DATABASE_URL")
        self.embedded: EmbeddedPostgres | None = None
        if url:
            self._admin = url
            self._base = url.rsplit("/", 1)[0]
        else:
            self.embedded = EmbeddedPostgres(database="postgres")
            self._admin = self.embedded.dsn("postgres")
        admin_execute(self._admin, f'DROP DATABASE IF EXISTS "{self.template}"')
        admin_execute(self._admin, f'CREATE DATABASE "{self.template}"')
        load_schema(self.dsn(self.template))

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
            self._admin, f'CREATE DATABASE "{name}" TEMPLATE "{self.template}" STRATEGY FILE_COPY'
        )
        return name

    def drop(self, name: str) -> None:
        admin_execute(self._admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        if self.embedded is not None:
            self.embedded.stop()
        else:
            admin_execute(self._admin, f'DROP DATABASE IF EXISTS "{self.template}"')


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


# ---- session-wide summaries -------------------------------------------------------------------
# Import-boundary rules whose source folder does not exist yet are reported here as "not checked"
# (docs/architecture.md): never counted as passed, and not a skip or a warning.
# tests/unit/test_boundaries.py: one "N checked · M skipped" line per rule (issue 12 §6).
BOUNDARIES: list[str] = []
# The adversarial tier's figures: attack class → Counter(tried, clean, unsafe)
# (tests/adversarial/conftest.py judges every answer; docs/security.md records them).
FIGURES: dict[str, Counter[str]] = {}


def summaries() -> dict[str, Any]:
    """This process's share of the session-wide summaries, as plain data."""
    return {"boundaries": list(BOUNDARIES), "figures": {k: dict(v) for k, v in FIGURES.items()}}


def merge_summaries(share: dict[str, Any]) -> None:
    """Add one xdist worker's share (from :func:`summaries`) to the controller's."""
    BOUNDARIES.extend(share.get("boundaries", []))
    for kind, counts in share.get("figures", {}).items():
        FIGURES.setdefault(kind, Counter()).update(counts)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist, on the controller: a worker finished; take its share of the summaries."""
    merge_summaries(getattr(node, "workeroutput", {}).get("summaries", {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    if BOUNDARIES:
        terminalreporter.section("import boundaries")
        for line in sorted(BOUNDARIES, key=lambda line: line.split("  ", 1)[-1]):
            terminalreporter.write_line(line)
    if FIGURES:
        terminalreporter.section("adversarial suite: cases tried / refused cleanly / unsafe")
        for kind in sorted(FIGURES):
            f = FIGURES[kind]
            terminalreporter.write_line(
                f"{kind:<12} {f['tried']:>5} tried  {f['clean']:>5} clean  {f['unsafe']:>3} unsafe"
            )
        if os.environ.get("MEDIATOR_ADVERSARIAL_FIGURES"):
            Path(os.environ["MEDIATOR_ADVERSARIAL_FIGURES"]).write_text(
                json.dumps({k: dict(v) for k, v in FIGURES.items()}, indent=2, sort_keys=True)
            )
    skipped = terminalreporter.stats.get("skipped", [])
    if skipped and os.environ.get("MEDIATOR_NO_SKIPS"):
        terminalreporter.section("skipped tests are failures here")
        terminalreporter.write_line(f"{len(skipped)} test(s) skipped; CI must run them all.")


def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    if _is_worker(session.config):
        session.config.workeroutput["summaries"] = summaries()
        return  # the controller counts the skips of every worker
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped and os.environ.get("MEDIATOR_NO_SKIPS") and exitstatus == 0:
        session.exitstatus = 1


# The suite's longest tests, started first: under two xdist workers a long test collected last
# runs alone at the end while the other worker idles (docs/performance.md "Test suite time").
# Only the order changes; every test still runs.
LONG_FIRST = (
    "tests/unit/sim/test_sim_coverage.py",
    "tests/db/sim/test_sim_gate_coverage.py",
    "tests/e2e/test_openapi.py",
)


def pytest_collection_modifyitems(session, config, items):  # type: ignore[no-untyped-def]
    items.sort(key=lambda item: not item.nodeid.startswith(LONG_FIRST))  # stable: order kept
