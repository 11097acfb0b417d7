"""Every document a reader is sent to exists in the repository (issue 29 §9).

The notebooks, the report's pages and the docs used to cite ``sim.md §7``, ``api.md §4``,
``mediator.md I3`` and "Seed 000 §5" — documents a clone does not have. A citation is a
``name.md`` followed by a section (``§4``), an invariant or a rule (``I3``, ``R6``), a markdown
link to a ``.md`` file, or a "seed NNN" document; each must name a file of this repository
(docs/ or its root) and, with a section, a section that file has.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CITED = re.compile(r"\b([A-Za-z][\w-]*\.md)\s*(§\s*\d+|I\d\b|R\d+\b)")
LINKED = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")
SEED = re.compile(r"\bseed\s+\d{3}\b(?!\s*[,)=])", re.IGNORECASE)


def _texts() -> list[tuple[str, str]]:
    """(where, text): every notebook cell, every doc, the README, the report's own words."""
    out = []
    for book in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(book.read_text("utf-8"))["cells"]):
            out.append((f"{book.name} cell {i}", "".join(cell["source"])))
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        out.append((str(doc.relative_to(ROOT)), doc.read_text("utf-8")))
    report = ROOT / "sim" / "outputs" / "report.py"
    out.append(("sim/outputs/report.py", report.read_text("utf-8")))
    return out


def _resolve(name: str, where: str) -> Path | None:
    base = ROOT / where if not where.endswith(".ipynb") and "/" in where else ROOT
    for folder in (base.parent if base != ROOT else ROOT, ROOT, ROOT / "docs"):
        path = (folder / name).resolve()
        if path.is_file() and ROOT in path.parents:
            return path
    return None


def _has_section(path: Path, section: str) -> bool:
    text = path.read_text("utf-8")
    section = section.replace(" ", "")
    if section.startswith("§"):
        return re.search(rf"^#+ {re.escape(section[1:])}\.", text, re.M) is not None
    return re.search(rf"^#+ {re.escape(section)}\b", text, re.M) is not None


@pytest.mark.parametrize(("where", "text"), _texts(), ids=lambda v: v if len(v) < 60 else "")
def test_every_cited_document_is_in_the_repository(where: str, text: str) -> None:
    missing = []
    for m in CITED.finditer(text):
        path = _resolve(m.group(1), where)
        if path is None:
            missing.append(f"{m.group(0)} (no {m.group(1)} here)")
        elif not _has_section(path, m.group(2)):
            missing.append(f"{m.group(0)} (no such section in {m.group(1)})")
    for m in LINKED.finditer(text):
        if "://" not in m.group(1) and _resolve(m.group(1), where) is None:
            missing.append(f"link to {m.group(1)}")
    missing += [f"{m.group(0)!r} (a document outside the repository)" for m in SEED.finditer(text)]
    assert not missing, f"{where} cites: " + "; ".join(missing)


def test_the_scan_catches_what_it_is_for() -> None:
    """The patterns find the citations issue 29 reported (and leave file names alone)."""
    text = "(sim.md §7) api.md §4 mediator.md I3 Seed 000 §5 [x](notes/plan.md) `<hash>.wip.md`"
    assert [m.group(1) for m in CITED.finditer(text)] == ["sim.md", "api.md", "mediator.md"]
    assert [m.group(1) for m in LINKED.finditer(text)] == ["notes/plan.md"]
    assert [m.group(0) for m in SEED.finditer(text)] == ["Seed 000"]
    assert _has_section(ROOT / "docs" / "design.md", "§8")
    assert _has_section(ROOT / "docs" / "design.md", "I3")
    assert not _has_section(ROOT / "docs" / "design.md", "§99")
