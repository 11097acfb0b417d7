"""docs/architecture.md describes what is (issue 26 §3): its layer table names every module under
``mediator/``, and its table of import boundaries is the boundary test's rules.

A module added without a place on the map, or a rule changed in ``tests/unit/test_boundaries.py``
and not on the page (or the reverse), fails here. The layer table names a module by its path
(``mediator/records.py``) or, after naming its package (``mediator/store/``), by its path in it
(``tx.py``, ``routes/runs.py``); a package's ``__init__.py`` is on the map with its package.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_boundaries import RULES, Rule

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"


def _table(text: str, header: str) -> list[list[str]]:
    """The rows (cells) of the markdown table whose header row starts with ``header``."""
    lines = text[text.index(header) :].splitlines()
    rows = []
    for line in lines[2:]:  # past the header and the |---| line
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def named_modules(text: str) -> set[str]:
    """Every module path the layer table names (see the module docstring for how)."""
    named: set[str] = set()
    for row in _table(text, "| layer | modules |"):
        base = ""
        for token in re.findall(r"`([^`]+)`", row[1]):
            if token.startswith("mediator/"):
                if token.endswith("/"):
                    base = token
                    named.add(token + "__init__.py")
                elif token.endswith(".py"):
                    named.add(token)
            elif token.endswith(".py") and base and " " not in token:
                named.add(base + token)
    return named


def modules() -> set[str]:
    return {
        p.relative_to(ROOT).as_posix()
        for p in ROOT.glob("mediator/**/*.py")
        if "__pycache__" not in p.parts
    }


def unplaced(on_disk: set[str], named: set[str]) -> list[str]:
    """Modules not on the map; a package's ``__init__.py`` is placed with any module of it."""
    packages = {m.rsplit("/", 1)[0] for m in named}
    return sorted(
        m
        for m in on_disk - named
        if not (m.endswith("/__init__.py") and m.rsplit("/", 1)[0] in packages)
    )


def test_every_mediator_module_has_its_place_in_the_layer_table():
    assert unplaced(modules(), named_modules(PAGE.read_text("utf-8"))) == []


def test_a_module_missing_from_the_layer_table_is_reported():
    """Not a tautology: a planted module and a removed row are both seen."""
    text = PAGE.read_text("utf-8")
    assert unplaced({*modules(), "mediator/flows/brand_new.py"}, named_modules(text)) == [
        "mediator/flows/brand_new.py"
    ]
    without_store = "\n".join(
        line for line in text.splitlines() if not line.startswith("| **store** |")
    )
    missing = unplaced(modules(), named_modules(without_store))
    assert "mediator/store/connector.py" in missing and "mediator/store/tx.py" in missing


def page_rules(text: str) -> dict[str, set[str]]:
    """The boundary table: each rule's name and the source paths its sources cell names."""
    table = _table(text, "| rule (as the test names it) | sources |")
    return {
        name: {
            t.rstrip("/")
            for t in re.findall(r"`([^`]+)`", sources)
            if t.startswith(("mediator", "sim"))
        }
        for name, sources, *_ in table
    }


def code_rules(rules: tuple[Rule, ...] = RULES) -> dict[str, set[str]]:
    return {rule.name: {s.rstrip("/") for s in rule.sources} for rule in rules}


def test_the_boundary_table_is_the_boundary_tests_rules():
    assert page_rules(PAGE.read_text("utf-8")) == code_rules()


def test_a_rule_the_page_does_not_show_is_reported():
    extra = Rule("the store's SQL files are not Python", ("mediator/store/queries.sql",))
    assert page_rules(PAGE.read_text("utf-8")) != code_rules((*RULES, extra))
