"""Import boundaries (seed 003 §8, architecture.md): a walk over the source that fails on a
violation.

Every ``.py`` file under a rule's source folder is parsed for imports only (tests included, as the
seed asks: a test importing the store would need a database). The panel is not Python: it is
static files under ``mediator/api/ui`` (seed 003 §8.1, "화면은 정적 파일이다"), so its rule reads
the references of its ``.js``, ``.html`` and ``.css`` files instead – every module and stylesheet
it loads is one of its own files, nothing comes from another host, and only ``api.js`` talks to
the server, over HTTP.

A checker that finds nothing to check must not pass (issue 12 §6: the panel's rule used to check
0 ``.py`` files and count as passed). Each rule reports ``N checked · M skipped`` (M: files under
its folders that are not of its kind) in the run's summary, and a rule that checked no file fails.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import BOUNDARIES

ROOT = Path(__file__).resolve().parents[2]

IO_MODULES = (
    "psycopg", "psycopg_pool", "pg8000", "socket", "subprocess", "http", "urllib", "httpx",
    "os", "pathlib", "io", "time", "datetime", "random", "secrets", "shutil", "tempfile",
    "sqlite3", "asyncio", "threading", "multiprocessing", "logging",
    "mediator.store", "mediator.records", "mediator.pg", "mediator.flows",
    "mediator.api", "mediator.clock", "mediator.cli", "mediator.enode",
)  # fmt: skip


@dataclass(frozen=True)
class Rule:
    name: str
    sources: tuple[str, ...]  # files or folders, relative to the project root
    forbidden: tuple[str, ...] = ()  # module prefixes that must not be imported
    # exact module names a forbidden prefix would catch but that are allowed (a type, not a call)
    allowed: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()  # files a pattern in `sources` matches but the rule skips
    allowed_mediator: tuple[str, ...] | None = None  # if set: the only mediator modules allowed
    static: bool = False  # the panel's static files instead of Python imports
    network_module: str = "api.js"  # static rules: the one file that may talk to the server


RULES = (
    Rule("the panel is static files that reach the Mediator only over HTTP, through api.js",
         ("mediator/api/ui",), static=True),
    Rule("the ticket queue does not import the Mediator's store, API or orchestration",
         ("mediator/tickets",), ("mediator.store", "mediator.api", "mediator.flows",
                                 "mediator.pg", "psycopg"),
         allowed=("mediator.api.guard", "mediator.api.guard.Guard",
                  "mediator.api.guard.LOOPBACK_HOSTS", "mediator.api.guard.bounded_h11")),
    # ^ plain HTTP refusals and bounds, no Mediator inside (issue 25 §1, §4)
    Rule("enode does not import the panel, the store or the API internals", ("mediator/enode",),
         ("mediator.api", "mediator.store", "mediator.flows", "psycopg")),
    # rows type their timestamps as datetime values; reading the clock is refused by
    # test_the_pure_core_reads_no_clock below
    Rule("the pure core imports nothing that does I/O", ("mediator/core",), IO_MODULES,
         allowed=("datetime", "datetime.datetime")),
    Rule("sim drives the Mediator only through its public interface", ("sim",),
         ("psycopg",), allowed_mediator=("mediator", "mediator.pg", "mediator.databases",
                                         "mediator.core")),
    # issue 13: the launcher starts and stops a cluster; database SQL goes through the store
    # (mediator/databases.py), which may import the launcher, never the reverse
    Rule("the launcher pg.py does not import the store", ("mediator/pg.py",),
         ("mediator.store", "mediator.flows", "mediator.databases", "psycopg")),
    Rule("sim's reference model does not import mediator", ("sim/model.py",), ("mediator",)),
    # issue 13 "Dissolve the mixin": the flows are functions of an explicit context; none calls
    # back up into the Mediator facade, and none talks to the driver (only the store's connector
    # does); selected by pattern, so a new flow module is checked the day it is added
    Rule("the flows do not call back into their facade nor import psycopg",
         ("mediator/flows/*.py",), ("mediator.flows.facade", "psycopg", "psycopg_pool"),
         excluded=("mediator/flows/__init__.py", "mediator/flows/facade.py")),
    # issue 26 §3: the store is split along its seam; the connection side is the one module that
    # speaks to the driver, the query methods (store/tx.py) and everything else do not
    Rule("psycopg is imported only by the store's connector", ("mediator",),
         ("psycopg", "psycopg_pool"), excluded=("mediator/store/connector.py",)),
    # issue 14 §1: statistics know nothing of the simulator (no analysis <-> model cycle), and the
    # shared event core imports neither engine
    Rule("sim's statistics import no part of the simulator", ("sim/analysis.py",), ("sim",)),
    Rule("sim's event core imports neither engine nor mediator", ("sim/core.py",),
         ("sim", "mediator")),
    # issue 14 §1: the fleet loop and the measurement serve both brokers, so they import neither
    Rule("sim's fleet loop and measurement import neither broker nor mediator",
         ("sim/fleet.py", "sim/driver.py", "sim/measure.py"),
         ("mediator", "sim.engine", "sim.model", "sim.result")),
)  # fmt: skip


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Absolute module names imported by ``path`` (relative imports resolved)."""
    tree = ast.parse(path.read_text("utf-8"), str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _matches(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


STATIC_KINDS = (".js", ".html", ".css")
# What a browser loads or calls: ES module specifiers, script/stylesheet sources, CSS imports/urls.
_JS_IMPORT = re.compile(
    r"""(?:^|[;\s])(?:import|export)\b[^;'"]*?\bfrom\s*["']([^"']+)["']"""
    r"""|(?:^|[;\s])import\s*\(?\s*["']([^"']+)["']""",
    re.M,
)
_HTML_LOAD = re.compile(
    r"""<(?:script|link|img|iframe)\b[^>]*?\b(?:src|href)\s*=\s*["']([^"']*)["']""", re.I
)
_CSS_LOAD = re.compile(r"""@import\s+["']([^"']+)["']|url\(\s*["']?([^"')]+)""")
_NETWORK = re.compile(r"\b(?:fetch|XMLHttpRequest|EventSource|WebSocket|sendBeacon)\s*\(")


def sources_of(rule: Rule, root: Path) -> tuple[list[Path], list[Path]]:
    """The files a rule checks, and the files under its folders it skips (not of its kind)."""
    kinds = STATIC_KINDS if rule.static else (".py",)
    checked: list[Path] = []
    skipped: list[Path] = []
    for src in rule.sources:
        base = root / src
        if any(ch in src for ch in "*?["):
            files = sorted(root.glob(src))
        else:
            files = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        for f in files:
            if f.is_dir() or "__pycache__" in f.parts:
                continue
            if f.relative_to(root).as_posix() in rule.excluded:
                skipped.append(f)
                continue
            (checked if f.suffix in kinds else skipped).append(f)
    return checked, skipped


def static_violations(rule: Rule, files: list[Path]) -> list[str]:
    """The panel's files load only each other, from no other host, and only one calls the server."""
    out = []
    for f in files:
        text = f.read_text("utf-8")
        if f.suffix == ".js":
            loads = [a or b for a, b in _JS_IMPORT.findall(text)]
        elif f.suffix == ".html":
            # Only what the page loads; an <a href> to another site is a link a person follows.
            loads = [m for m in _HTML_LOAD.findall(text) if not m.startswith(("#", "data:"))]
        else:
            loads = [a or b for a, b in _CSS_LOAD.findall(text) if not (a or b).startswith("data:")]
        for target in loads:
            local = not re.match(r"^(?:[a-z]+:)?//", target, re.I) and not target.startswith("/")
            if not local or not (f.parent / target).resolve().is_file():
                out.append(f"{f.relative_to(ROOT)} loads {target} (not a panel file)")
            elif not (f.parent / target).resolve().is_relative_to(f.parent.resolve()):
                out.append(f"{f.relative_to(ROOT)} loads {target} from outside the panel")
        if f.suffix == ".js" and f.name != rule.network_module and _NETWORK.search(text):
            out.append(f"{f.relative_to(ROOT)} talks to the server; only {rule.network_module} may")
    return out


def violations(rule: Rule) -> list[str]:
    files, _ = sources_of(rule, ROOT)
    if rule.static:
        return static_violations(rule, files)
    out = []
    for f in files:
        for line, module in imports_of(f):
            bad = module not in rule.allowed and any(_matches(module, p) for p in rule.forbidden)
            if rule.allowed_mediator is not None and _matches(module, "mediator"):
                # `from mediator import Mediator` yields "mediator" and "mediator.Mediator";
                # only real submodules count, which are files or folders under mediator/.
                sub = module.split(".")
                is_module = len(sub) > 1 and (
                    (ROOT / "mediator" / sub[1]).with_suffix(".py").exists()
                    or (ROOT / "mediator" / sub[1]).is_dir()
                )
                name = ".".join(sub[:2]) if is_module else "mediator"
                bad = bad or name not in rule.allowed_mediator
            if bad:
                out.append(f"{f.relative_to(ROOT)}:{line} imports {module}")
    return out


def summary(rule: Rule) -> str:
    """``N checked · M skipped`` for one rule (issue 12 §6)."""
    checked, skipped = sources_of(rule, ROOT)
    return f"{len(checked)} checked · {len(skipped)} skipped  {rule.name}"


def check(rule: Rule) -> None:
    """Issue 12 §6: a rule that matched no file fails instead of passing vacuously."""
    checked, _ = sources_of(rule, ROOT)
    assert checked, f"{rule.name}: matched no file under {rule.sources}; the rule checks nothing"
    assert violations(rule) == []


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_import_boundary(rule):
    BOUNDARIES.append(summary(rule))
    check(rule)


def test_a_rule_that_matches_no_file_fails():
    """The old panel rule read ``.py`` files in a folder of ``.js``, ``.html`` and ``.css``."""
    old_panel = Rule("old panel rule", ("mediator/api/ui",), ("mediator.store",))
    checked, skipped = sources_of(old_panel, ROOT)
    assert checked == [] and len(skipped) >= 3
    with pytest.raises(AssertionError, match="matched no file"):
        check(old_panel)


def test_every_rule_checks_at_least_one_file_today():
    counts = {rule.name: len(sources_of(rule, ROOT)[0]) for rule in RULES}
    assert all(n >= 1 for n in counts.values()), counts
    assert summary(RULES[0]).startswith(f"{counts[RULES[0].name]} checked · 0 skipped")


def test_the_panel_rule_sees_its_violations(tmp_path):
    """Not a tautology either: a CDN script, a reach outside the folder, a stray fetch."""
    ui = tmp_path / "mediator" / "api" / "ui"
    ui.mkdir(parents=True)
    (ui / "api.js").write_text("export const get = (p) => fetch(p);\n")
    (ui / "ok.js").write_text('import { get } from "./api.js";\n')
    (ui / "bad.js").write_text(
        'import { x } from "https://cdn.example/x.js";\nimport "../../store/db.py";\n'
        "fetch('/v1/runs');\n"
    )
    (ui / "index.html").write_text(
        '<script src="https://cdn.example/y.js"></script>\n'
        '<a href="http://elsewhere/">a link is fine</a>\n'
    )
    globals()["ROOT"], saved = tmp_path, ROOT
    try:
        assert violations(RULES[0]) == [
            "mediator/api/ui/bad.js loads https://cdn.example/x.js (not a panel file)",
            "mediator/api/ui/bad.js loads ../../store/db.py (not a panel file)",
            "mediator/api/ui/bad.js talks to the server; only api.js may",
            "mediator/api/ui/index.html loads https://cdn.example/y.js (not a panel file)",
        ]
    finally:
        globals()["ROOT"] = saved


def test_the_checker_sees_a_violation(tmp_path):
    """The checker is not a tautology: a planted forbidden import is reported."""
    bad = tmp_path / "mediator" / "enode"
    bad.mkdir(parents=True)
    (bad / "daemon.py").write_text("from mediator.store import db\nimport json\n")
    globals()["ROOT"], saved = tmp_path, ROOT
    try:
        assert violations(RULES[2]) == [
            "mediator/enode/daemon.py:1 imports mediator.store",
            "mediator/enode/daemon.py:1 imports mediator.store.db",
        ]
    finally:
        globals()["ROOT"] = saved


def _rule(name_start: str) -> Rule:
    return next(r for r in RULES if r.name.startswith(name_start))


def test_a_new_flow_module_is_checked_by_pattern(tmp_path):
    """The flows rule once listed its modules by name, so a planted ``import psycopg`` in
    ``flows/claimed.py`` passed; a pattern checks every flow but the facade."""
    flows = tmp_path / "mediator" / "flows"
    flows.mkdir(parents=True)
    (flows / "claimed.py").write_text("import psycopg\n")
    (flows / "brand_new.py").write_text("from mediator.flows.facade import Mediator\n")
    (flows / "facade.py").write_text("import psycopg\n")  # excluded: the facade may
    globals()["ROOT"], saved = tmp_path, ROOT
    try:
        assert violations(_rule("the flows do not call back")) == [
            "mediator/flows/brand_new.py:1 imports mediator.flows.facade",
            "mediator/flows/brand_new.py:1 imports mediator.flows.facade.Mediator",
            "mediator/flows/claimed.py:1 imports psycopg",
        ]
    finally:
        globals()["ROOT"] = saved


def test_every_flow_module_but_the_facade_is_checked_today():
    checked, _ = sources_of(_rule("the flows do not call back"), ROOT)
    names = {f.name for f in checked}
    on_disk = {f.name for f in (ROOT / "mediator" / "flows").glob("*.py")}
    assert names == on_disk - {"__init__.py", "facade.py"}


_CLOCK_CALLS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter", "random"}


def test_the_pure_core_reads_no_clock():
    """The core may type a timestamp (``datetime`` is allowed as an import), never read one."""
    found = []
    for f in sorted((ROOT / "mediator" / "core").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text("utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _CLOCK_CALLS
            ):
                found.append(f"{f.name}:{node.lineno} calls .{node.func.attr}()")
    assert found == []


def test_only_the_connector_may_import_the_driver(tmp_path):
    """issue 26 §3: store/db.py was both the connection side and some 60 query methods; split,
    the rule can say which one speaks to psycopg — a query module that imports it is caught."""
    store = tmp_path / "mediator" / "store"
    store.mkdir(parents=True)
    (store / "connector.py").write_text("import psycopg\nfrom psycopg_pool import ConnectionPool\n")
    (store / "tx.py").write_text("from psycopg.types.json import Jsonb\n")
    globals()["ROOT"], saved = tmp_path, ROOT
    try:
        assert violations(_rule("psycopg is imported only")) == [
            "mediator/store/tx.py:1 imports psycopg.types.json",
            "mediator/store/tx.py:1 imports psycopg.types.json.Jsonb",
        ]
    finally:
        globals()["ROOT"] = saved
