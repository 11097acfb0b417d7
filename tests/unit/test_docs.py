"""The design in the repository (issue 15 §7): docs/design.md can be looked up by every id the code
cites, its state tables are the code's tables, and the links between the documents resolve.

Code comments cite rule ids (``# R8:``, ``I1``, ``wake 9``); a newcomer must find each in
docs/design.md. The state tables there are written for people, so a test holds them to
``mediator/core/states.py`` — the module is the truth, and a change to it that the page does not
follow
fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mediator.core.states import RUN_TRANSITIONS, STEP_TRANSITIONS

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
LINKED = ("README.md", "docs/design.md", "docs/architecture.md")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", path.read_text("utf-8"), re.M)}


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[start : end if end != -1 else None]


def _table_moves(section: str) -> set[tuple[str | None, str]]:
    """(from, to) pairs of a markdown table whose first two columns are from and to."""
    moves: set[tuple[str | None, str]] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] in ("from", "") or set(cells[0]) <= {"-"}:
            continue
        sources = [None if cells[0] == "(no row)" else cells[0]]
        for frm in sources:
            for to in cells[1].split("/"):
                moves.add((frm, to.strip()))
    return moves


def _code_moves(table) -> set[tuple[str | None, str]]:  # type: ignore[no-untyped-def]
    return {(None if f is None else str(f), str(t)) for f, tos in table.items() for t in tos}


def test_every_rule_and_invariant_has_its_own_heading():
    """R1–R17 and I1–I7 each have a ``### Rn — …`` heading, so ``# R8:`` is found as "R8 —"."""
    text = DESIGN.read_text("utf-8")
    for rule in [f"R{i}" for i in range(1, 18)] + [f"I{i}" for i in range(1, 8)]:
        assert re.search(rf"^### {rule} — \S", text, re.M), f"no heading for {rule}"


def test_the_wake_table_has_points_one_to_nine():
    table = _section(DESIGN.read_text("utf-8"), "## 8. Wake points")
    rows = re.findall(r"^\| (\d+) \|", table, re.M)
    assert rows == [str(i) for i in range(1, 10)]


def test_every_id_the_code_cites_is_defined():
    """Every ``Rn``, ``In`` and ``wake n`` in mediator/ and sim/ exists in docs/design.md."""
    text = DESIGN.read_text("utf-8")
    defined = set(re.findall(r"^### ([RI]\d+) — ", text, re.M))
    wakes = set(re.findall(r"^\| (\d+) \|", _section(text, "## 8. Wake points"), re.M))
    cited: dict[str, str] = {}
    for path in sorted([*ROOT.glob("mediator/**/*.py"), *ROOT.glob("sim/**/*.py"),
                        *ROOT.glob("mediator/store/*.sql")]):  # fmt: skip
        source = path.read_text("utf-8")
        for rule in re.findall(r"\b([RI]\d{1,2})\b", source):
            cited.setdefault(rule, str(path.relative_to(ROOT)))
        for n in re.findall(r"\b[Ww]ake (?:point )?(\d+)\b", source):
            cited.setdefault(f"wake {n}", str(path.relative_to(ROOT)))
    missing = {
        id_: where
        for id_, where in cited.items()
        if (id_ not in defined if not id_.startswith("wake") else id_.split()[1] not in wakes)
    }
    assert cited and missing == {}


@pytest.mark.parametrize(
    ("heading", "table"),
    [("### Run states", RUN_TRANSITIONS), ("### Step states", STEP_TRANSITIONS)],
    ids=["run", "step"],
)
def test_the_state_tables_are_the_codes_tables(heading, table):
    """mediator/core/states.py is the truth; the page lists exactly its moves."""
    section = _section(DESIGN.read_text("utf-8"), heading)
    assert _table_moves(section) == _code_moves(table)


@pytest.mark.parametrize("doc", LINKED)
def test_links_between_the_documents_resolve(doc):
    """Every relative link (file, and anchor where one is given) points at something that exists."""
    path = ROOT / doc
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text("utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: outside the repository
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
            broken.append(target)
    assert broken == []


def test_the_layer_table_names_every_sim_module_in_its_folder():
    """Issue 26: docs/architecture.md's simulator row lists every module of sim/ under the folder
    (layer) it lives in, so the map cannot fall behind a move."""
    row = next(
        line
        for line in (ROOT / "docs" / "architecture.md").read_text("utf-8").splitlines()
        if line.startswith("| **simulator** |")
    )
    missing = []
    for path in sorted((ROOT / "sim").rglob("*.py")):
        rel = path.relative_to(ROOT / "sim")
        if path.name in ("__init__.py", "__main__.py") or "__pycache__" in rel.parts:
            continue
        if len(rel.parts) == 1:
            ok = f"`sim/{path.name}`" in row
        else:
            start = row.find(f"`sim/{rel.parts[0]}/` —")
            end = row.find("`sim/", start + 1)
            segment = row[start:end] if start >= 0 else ""
            ok = f"`{path.name}`" in segment
        if not ok:
            missing.append(rel.as_posix())
    assert missing == []
