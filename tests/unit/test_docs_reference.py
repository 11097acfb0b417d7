"""The docs are a reference that stands on its own (docs/performance.md, its opening paragraph).

A reader of a clone has the repository and nothing else: an issue number, a work session, a review
round or a branch name points at nothing they can open, and "before/after" diaries age into
noise. So docs/*.md and README.md name design sections, rules and commands instead, and history
stays in git. docs/performance.md is held to its own shape: every bench script it names exists,
and every bench script in ``bench/`` is named there with its figure.

The one "session" the product has is the ticket queue's (a worker's run of a command on one
ticket, ``session_id``; docs/tickets.md): the word is allowed in docs/tickets.md and under a
heading that names tickets, and nowhere else — and even there never as a diary ("this session",
"session 5").
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PERFORMANCE = ROOT / "docs" / "performance.md"


def _docs() -> list[Path]:
    return [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _blank(match: re.Match[str]) -> str:
    """What a code span or link target leaves behind: its line breaks, so line numbers hold."""
    return "``" + "\n" * match.group().count("\n")


def prose(text: str) -> Iterator[tuple[int, str, str]]:
    """(line number, the heading it sits under, the line) for every line of prose.

    Code is not prose: fenced blocks, indented blocks (four spaces after a blank line, as the
    README shows a command's output) and inline code spans (which may wrap a line) are left out,
    and so are link targets (``(#1-the-domain)`` is an anchor, not issue 1).
    """
    lines: list[str | None] = []
    fence, in_indented, previous_blank = "", False, True
    for line in text.splitlines():
        stripped = line.lstrip()
        if fence or stripped.startswith(("```", "~~~")):
            if not fence:
                fence = stripped[:3]
            elif stripped.startswith(fence):
                fence = ""
            lines.append(None)
            continue
        indented = line.startswith(("    ", "\t")) and bool(stripped)
        in_indented = indented and (previous_blank or in_indented)
        previous_blank = not stripped
        lines.append(None if in_indented else line)
    kept = "\n".join("" if line is None else line for line in lines)
    kept = re.sub(r"`(?:(?!\n[ \t]*\n)[^`])*`", _blank, kept)
    kept = re.sub(r"\]\([^)]*\)", "]()", kept)
    heading = ""
    for number, (line, original) in enumerate(zip(kept.split("\n"), lines, strict=True), 1):
        if original is None:
            continue
        if line.lstrip().startswith("#"):
            heading = line.lstrip().lstrip("#").strip()
        yield number, heading, line


ISSUE = re.compile(
    r"\bissues?\s*(?:#\s*)?\d+"  # issue 13, issues 11 and 12, issue #4
    r"|\b(?:PR|pull request)\s*#?\d+"  # PR 7, pull request #7
    r"|(?<![\w&/#])#\d+\b",  # (#12)
    re.I,
)
ROUND = re.compile(r"\bround[- ]\d", re.I)  # round 2, round-3 amendment
SESSION = re.compile(r"\bsessions?\b", re.I)
DIARY_SESSION = re.compile(
    r"\b(?:this|last|next|previous|earlier|later|same|other|another|today's|yesterday's)\s+"
    r"sessions?\b|\bsessions?\s+\d|\bsession's\s+(?:start|end)",
    re.I,
)
BRANCH = re.compile(r"\bbranch(?:es)?\s+`[^`]+`", re.I)  # branch `http`


def _ticket_context(path: Path, heading: str) -> bool:
    return path.name == "tickets.md" or "ticket" in heading.lower()


def offences(path: Path, text: str) -> list[str]:
    """Every place in one document that points outside the repository or reads as a diary."""
    found: list[str] = []
    where = f"{path.relative_to(ROOT)}"
    for number, raw in enumerate(text.splitlines(), 1):
        for m in BRANCH.finditer(raw):
            found.append(f"{where}:{number}: a branch name: {m.group()!r}")
    for number, heading, line in prose(text):
        for m in ISSUE.finditer(line):
            found.append(f"{where}:{number}: an issue reference: {m.group()!r}")
        for m in ROUND.finditer(line):
            found.append(f"{where}:{number}: a review round: {m.group()!r}")
        for m in DIARY_SESSION.finditer(line):
            found.append(f"{where}:{number}: a work session: {m.group()!r}")
        if not _ticket_context(path, heading):
            for m in SESSION.finditer(line):
                found.append(f"{where}:{number}: 'session' outside the ticket queue: {m.group()!r}")
    return sorted(set(found))


@pytest.mark.parametrize("path", _docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_docs_name_no_issue_session_round_or_branch(path: Path) -> None:
    """Issue numbers, sessions, review rounds and branches mean nothing to a reader of a clone."""
    assert offences(path, path.read_text("utf-8")) == []


def test_the_checks_catch_each_kind_of_reference() -> None:
    """A worked example: each kind is caught; code, anchors and the ticket's session are not."""
    text = "\n".join(
        [
            "# Notes",
            "",
            "Measured in this session (issue 13 §6, see #24) on branch `http`, round 2.",
            "The [domain](#1-the-domain) in `#2` and `issue 7` stays; a pytest session does not.",
            "",
            "    FAIL  run r0000001 (#1)",
            "",
            "```",
            "issue 9, session 3",
            "```",
            "",
            "## Ticket files",
            "",
            "A worker's session holds the ticket (`session_id`); in session 5 it did not.",
        ]
    )
    assert offences(ROOT / "docs" / "x.md", text) == [
        "docs/x.md:14: a work session: 'session 5'",
        "docs/x.md:3: 'session' outside the ticket queue: 'session'",
        "docs/x.md:3: a branch name: 'branch `http`'",
        "docs/x.md:3: a review round: 'round 2'",
        "docs/x.md:3: a work session: 'this session'",
        "docs/x.md:3: an issue reference: '#24'",
        "docs/x.md:3: an issue reference: 'issue 13'",
        "docs/x.md:4: 'session' outside the ticket queue: 'session'",
    ]


def _bench_scripts() -> set[str]:
    return {p.name for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_")}


def test_every_bench_script_named_in_performance_md_exists() -> None:
    """A command that names a script which is gone cannot reproduce its figure."""
    text = PERFORMANCE.read_text("utf-8")
    named = set(re.findall(r"\bbench/(\w+\.py)\b", text))
    named |= {n for n in re.findall(r"\b(bench_\w+\.py|profile_breakdown\.py)\b", text)}
    on_disk = {p.name for p in (ROOT / "bench").glob("*.py")}
    assert sorted(named - on_disk) == []


def test_every_bench_script_has_its_figure_in_performance_md() -> None:
    """A script in bench/ (not a ``_`` helper) whose figure is not recorded measures for no one."""
    text = PERFORMANCE.read_text("utf-8")
    assert sorted(n for n in _bench_scripts() if not re.search(rf"\b{re.escape(n)}\b", text)) == []


def test_performance_md_names_no_commit() -> None:
    """A figure is of the tree it is committed with; an old commit's hash is history (git)."""
    text = PERFORMANCE.read_text("utf-8")
    hashes = [h for h in re.findall(r"`([0-9a-f]{7,40})`", text) if re.search(r"[a-f]", h)]
    assert hashes == []


def test_performance_md_summary_links_resolve() -> None:
    """Each row of the summary table links to the section that holds the figure."""
    text = PERFORMANCE.read_text("utf-8")
    anchors = {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links, "the summary table links to its sections"
    assert sorted(set(links) - anchors) == []
