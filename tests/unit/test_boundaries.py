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
    # sim/outputs/coverage.py is the one exception: its plants break a rule on purpose by
    # patching the flows in the process that runs a case (issue 24); it calls none of them
    Rule("sim drives the Mediator only through its public interface", ("sim",),
         ("psycopg",), allowed_mediator=("mediator", "mediator.pg", "mediator.databases",
                                         "mediator.core"),
         excluded=("sim/outputs/coverage.py",)),
    Rule("the gate's plants patch the Mediator, and touch no database themselves",
         ("sim/outputs/coverage.py",), ("psycopg", "mediator.store", "mediator.api"),
         allowed=("mediator.store.tx", "mediator.store.tx.Tx", "mediator.store.connector")),
    # ^ R11/R12 and restart plants replace a statement's parameters or a store method in the
    # process that runs a case; they open no connection and run no statement of their own
    # issue 13: the launcher starts and stops a cluster; database SQL goes through the store
    # (mediator/databases.py), which may import the launcher, never the reverse
    Rule("the launcher pg.py does not import the store", ("mediator/pg.py",),
         ("mediator.store", "mediator.flows", "mediator.databases", "psycopg")),
    # design.md §20: the model is an independent implementation of the policy (the differential
    # test is evidence only then); it imports no part of mediator nor the other broker
    Rule("sim/brokers/model.py imports nothing of mediator nor the real Mediator's broker",
         ("sim/brokers/model.py",),
         ("mediator", "sim.brokers.mediator", "sim.brokers.readback", "sim.brokers.entry")),
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
    # issue 14 §1: statistics know nothing of the simulator (no analysis <-> model cycle); the
    # event core imports neither broker; the fleet loop and the measurement serve every broker.
    # Selected by folder, so a new module is checked the day it is added; the layer order itself
    # is test_each_sim_folder_imports_only_its_own_layer_or_below.
    Rule("sim's statistics import no part of the simulator", ("sim/analysis.py",), ("sim",)),
    Rule("sim's ground level (analysis, plots, parallel, affinity) imports neither a sim layer "
         "nor mediator", ("sim/*.py",),
         ("mediator", "sim.inputs", "sim.platform", "sim.brokers", "sim.studies", "sim.outputs"),
         excluded=("sim/__init__.py", "sim/__main__.py")),
    Rule("sim's event core imports neither broker nor mediator", ("sim/platform/core.py",),
         ("sim", "mediator")),
    Rule("sim/platform/* imports neither broker nor mediator", ("sim/platform/*.py",),
         ("mediator", "sim.brokers", "sim.studies", "sim.outputs")),
    # design.md §20: a scenario's settings are the Mediator's own (names, defaults, ranges and
    # their one check, `Config.validate`), so inputs may import `Config` and nothing else of it
    Rule("sim/inputs/* imports nothing of mediator but its Config, nor of the simulation",
         ("sim/inputs/*.py",),
         ("mediator", "sim.platform", "sim.brokers", "sim.studies", "sim.outputs"),
         allowed=("mediator", "mediator.Config", "mediator.ConfigError")),
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


# ---- sim: one layer per folder (docs/architecture.md, "The simulator's layers") ----------------

# Bottom to top. The ground level is the modules directly in sim/ (the package's facade,
# sim/__init__.py, and `python -m sim`, sim/__main__.py, sit above everything and are not layers).
SIM_LAYERS = ("", "inputs", "platform", "brokers", "studies", "outputs")
SIM_FACADE = ("sim/__init__.py", "sim/__main__.py")


def sim_layer_of(module: str, root: Path) -> int | None:
    """The layer of a ``sim`` module name (None: not a module of sim, e.g. a name imported from
    the facade)."""
    parts = module.split(".")
    if parts[0] != "sim" or len(parts) < 2:
        return None
    if parts[1] in SIM_LAYERS[1:] and (root / "sim" / parts[1]).is_dir():
        return SIM_LAYERS.index(parts[1])
    if (root / "sim" / f"{parts[1]}.py").is_file():
        return 0
    return None


def sim_layer_violations(root: Path) -> list[str]:
    """Every import in sim/ that runs from a layer up to a higher one, or into the facade."""
    out = []
    for f in sorted((root / "sim").rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if rel in SIM_FACADE or "__pycache__" in f.parts:
            continue
        parts = f.relative_to(root / "sim").parts
        mine = SIM_LAYERS.index(parts[0]) if len(parts) > 1 else 0
        for line, module in _imports_in(f, root):
            if module == "sim" or not _matches(module, "sim"):
                continue
            layer = sim_layer_of(module, root)
            parent = module.rsplit(".", 1)[0]
            if layer is None and sim_layer_of(parent, root) is not None:
                continue  # `from sim.inputs.scenarios import Scenario`: the name's module counts
            if layer is None:
                out.append(f"{rel}:{line} imports {module} from the facade (import its module)")
            elif layer > mine:
                out.append(f"{rel}:{line} imports {module}: layer {SIM_LAYERS[layer] or 'ground'}"
                           f" is above {SIM_LAYERS[mine] or 'ground'}")  # fmt: skip
    return out


def _imports_in(path: Path, root: Path) -> list[tuple[int, str]]:
    saved = globals()["ROOT"]
    globals()["ROOT"] = root
    try:
        return imports_of(path)
    finally:
        globals()["ROOT"] = saved


def test_each_sim_folder_imports_only_its_own_layer_or_below():
    """Issue 26: sim/ is ground, inputs, platform, brokers, studies, outputs; no arrow back up."""
    files = [f for f in (ROOT / "sim").rglob("*.py") if "__pycache__" not in f.parts]
    BOUNDARIES.append(f"{len(files) - len(SIM_FACADE)} checked · {len(SIM_FACADE)} skipped  "
                      "each sim folder imports only its own layer or below")  # fmt: skip
    folders = {f.relative_to(ROOT / "sim").parts[0] for f in files if f.parent != ROOT / "sim"}
    assert folders == set(SIM_LAYERS[1:]), "a sim folder that is not a layer: add it to SIM_LAYERS"
    assert sim_layer_violations(ROOT) == []


def test_the_layer_check_sees_an_arrow_back_up(tmp_path):
    """Not a tautology: the platform importing a broker, the ground importing an input, and a
    layer importing the facade are each reported."""
    for folder in SIM_LAYERS[1:]:
        (tmp_path / "sim" / folder).mkdir(parents=True)
    (tmp_path / "sim" / "analysis.py").write_text("import math\n")
    (tmp_path / "sim" / "plots.py").write_text("from sim.inputs.scenarios import Scenario\n")
    (tmp_path / "sim" / "inputs" / "scenarios.py").write_text("from sim.analysis import x\n")
    (tmp_path / "sim" / "brokers" / "model.py").write_text("from sim.platform import core\n")
    (tmp_path / "sim" / "platform" / "core.py").write_text("import heapq\n")
    (tmp_path / "sim" / "platform" / "driver.py").write_text(
        "from sim.platform.core import q\n"
        "from sim.brokers.model import Model\n"
        "from sim import run\n"
    )
    assert sim_layer_violations(tmp_path) == [
        "sim/platform/driver.py:2 imports sim.brokers.model: layer brokers is above platform",
        "sim/platform/driver.py:2 imports sim.brokers.model.Model: layer brokers is above platform",
        "sim/platform/driver.py:3 imports sim.run from the facade (import its module)",
        "sim/plots.py:1 imports sim.inputs.scenarios: layer inputs is above ground",
        "sim/plots.py:1 imports sim.inputs.scenarios.Scenario: layer inputs is above ground",
    ]


# Imports a sim module may make inside a function: heavy or optional ones only — matplotlib
# through sim.plots; the database stack (sim.brokers.readback, sim.brokers.mediator) where the
# model, the scenarios and `python -m sim list` must not pay for it; the simulator behind a pytest
# plugin that every test session loads (sim.outputs.gate).
SIM_LAZY_ALLOWED = ("sim.plots", "sim.brokers.readback", "sim.brokers.mediator", "sim.outputs.gate")


def test_sim_imports_its_own_modules_at_the_top():
    """Issue 26: no import of a sim module hides inside a function (they used to, to dodge cycles
    that the layers now rule out), and no file imports another's private name."""
    found = []
    for f in sorted((ROOT / "sim").rglob("*.py")):
        tree = ast.parse(f.read_text("utf-8"))
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = [a.name for a in node.names]
            full = names if isinstance(node, ast.Import) else [f"{node.module}.{n}" for n in names]
            rel = f.relative_to(ROOT).as_posix()
            lazy_ok = all(any(_matches(x, a) for a in SIM_LAZY_ALLOWED) for x in full)
            if id(node) not in top and _matches(full[0], "sim") and not lazy_ok:
                found.append(f"{rel}:{node.lineno} imports {', '.join(full)} inside a function")
            if isinstance(node, ast.ImportFrom) and _matches(node.module or "", "sim"):
                found += [f"{rel}:{node.lineno} imports the private {n} of {node.module}"
                          for n in names if n.startswith("_")]  # fmt: skip
    assert found == []
