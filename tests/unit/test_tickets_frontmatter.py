"""Frontmatter edits keep a person's text and unknown keys (tickets.md §2)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mediator.tickets.frontmatter import Document

WRITTEN_BY_A_PERSON = """---
title: Fix the login page   # the old one
priority: 4
deps:
  - 3f2a
  - "b7c1"
# owner: ask Mina first
team: web
links: [https://example.org/a, 'it''s here']
---
The button does nothing on Safari.

## Notes
- tried twice
"""


def test_an_unedited_file_renders_byte_for_byte() -> None:
    assert Document.parse(WRITTEN_BY_A_PERSON).render() == WRITTEN_BY_A_PERSON


def test_values_read_the_way_yaml_reads_them() -> None:
    doc = Document.parse(WRITTEN_BY_A_PERSON)
    assert doc.get("title") == "Fix the login page"
    assert doc.get("priority") == "4"
    assert doc.get_list("deps") == ["3f2a", "b7c1"]
    assert doc.get("links") == ["https://example.org/a", "it's here"]
    assert doc.get("owner") is None  # a comment, not a key
    assert doc.key_order() == ["title", "priority", "deps", "team", "links"]


def test_the_engine_adds_and_strips_its_keys_and_nothing_else_moves() -> None:
    claimed = Document.parse(WRITTEN_BY_A_PERSON).set("session_id", "w1-77").set("priority", 5)
    assert claimed.render() == WRITTEN_BY_A_PERSON.replace("priority: 4", "priority: 5").replace(
        "links: [https://example.org/a, 'it''s here']\n",
        "links: [https://example.org/a, 'it''s here']\nsession_id: w1-77\n",
    )
    assert claimed.remove("session_id").set("priority", 4).render() == WRITTEN_BY_A_PERSON


def test_removing_a_block_list_removes_its_item_lines() -> None:
    without = Document.parse(WRITTEN_BY_A_PERSON).remove("deps").render()
    assert "3f2a" not in without and "b7c1" not in without
    assert without.count("\n") == WRITTEN_BY_A_PERSON.count("\n") - 3


def test_a_file_without_frontmatter_gets_one_and_keeps_its_body() -> None:
    doc = Document.parse("Just a note\n").set("kind", "ticket")
    assert doc.render() == "---\nkind: ticket\n---\nJust a note\n"
    assert doc.with_body("x\n").render() == "---\nkind: ticket\n---\nx\n"


def test_values_that_would_read_differently_are_quoted() -> None:
    doc = Document.parse("---\n---\n")
    rendered = [
        doc.set("k", value).render().splitlines()[1]
        for value in ("yes", "12", "a: b", " pad", "x # y", "", "line\nbreak", "ok text")
    ]
    assert rendered == [
        'k: "yes"',
        'k: "12"',
        'k: "a: b"',
        'k: " pad"',
        'k: "x # y"',
        'k: ""',
        'k: "line\\nbreak"',
        "k: ok text",
    ]


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",))))
def test_any_string_survives_a_set_and_get(value: str) -> None:
    doc = Document.parse(WRITTEN_BY_A_PERSON).set("question", value)
    assert Document.parse(doc.render()).get("question") == value
    assert Document.parse(doc.render()).remove("question").render() == WRITTEN_BY_A_PERSON


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",))), max_size=4))
def test_any_list_of_strings_survives_a_set_and_get(values: list[str]) -> None:
    doc = Document.parse("---\ntitle: t\n---\n").set("deps", values)
    assert Document.parse(doc.render()).get_list("deps") == values
