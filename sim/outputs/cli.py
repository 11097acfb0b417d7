"""``python -m sim``: list scenarios, run one, or produce the report (docs/design.md §20).

    python -m sim list
    python -m sim show SCENARIO [--set key=value ...]
    python -m sim run SCENARIO [--set key=value ...] [--broker mediator|model] [--out DIR]
    python -m sim plan SCENARIO --sizes 3,4,5 --wait 600 [--quantile 0.95] [...]
    python -m sim report [--out reports/] [--scale full|ci]
    python -m sim report --twin DIR [--out reports/lab] [--wait S] [--set key=value ...]
    python -m sim baseline --out DIR [SCENARIO ...]     (the CI gate: sim.outputs.gate)
    python -m sim check --baseline DIR [--tolerance F] [--junit FILE] [--markdown FILE]
    python -m sim twin export --database-url URL --since T --until T --out DIR [--pseudonymize]
    python -m sim twin replay DIR [--broker model|mediator] [--set key=value ...]
    python -m sim twin audit DIR [--broker model|mediator] [--set key=value ...]

A twin's folder is a scenario wherever one is taken (``run DIR``, ``plan DIR``).

``--set`` takes the names Python takes — a built-in scenario's parameters (``runs=10``,
``arrival_rate=0.2``, ``service="lognormal"``), which rebuild it so derived fields follow — and
dotted paths into the scenario (``settings.wake_on_return=false``); ``show`` lists both with
their values and meanings. A wrong name or value is one line naming it, not a traceback.

``run`` prints the summary and writes CSV tables, PNG charts, ``summary.json`` and
``manifest.json`` into ``--out``. ``report`` is the main job: every built-in scenario on the real
Mediator (embedded PostgreSQL), the model beside it where a comparison helps, charts, and a summary
table on the terminal; see ``sim.outputs.report``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped, unused-ignore]

from sim.brokers.entry import BROKERS, run
from sim.brokers.twin import KEY_ENV, cli_export
from sim.inputs import twin
from sim.inputs.scenarios import (
    ALIASES,
    SCENARIOS,
    Poisson,
    Scenario,
    ScenarioError,
    explain,
    parse_set,
)
from sim.outputs.audit import add_parsers as add_twin_parsers
from sim.outputs.coverage import add_parsers as add_coverage_parsers  # the gate's rule coverage
from sim.outputs.gate import add_parsers as add_gate_parsers  # baseline, check: the CI gate
from sim.outputs.report import main_job
from sim.outputs.twinreport import twin_report
from sim.studies.plan import CONFIRM_RUNS, plan


def _scenario(name: str, sets: list[str]) -> Scenario:
    """A built-in scenario (its Python parameters from ``--set`` passed to its builder) or a
    TOML file, with the remaining ``--set`` paths applied."""
    path = Path(name)
    pairs = [parse_set(a) for a in sets]
    if (path / "twin.json").is_file():  # a lab's exported twin (sim.inputs.twin)
        sc = twin.load(path)
    elif path.suffix == ".toml" and path.exists():
        sc = Scenario.from_toml(path)
    elif name in SCENARIOS:
        params = inspect.signature(SCENARIOS[name]).parameters
        kwargs = {k: v for k, v in pairs if k in params}
        pairs = [(k, v) for k, v in pairs if k not in params]
        try:
            sc = SCENARIOS[name](**kwargs)
        except TypeError as e:  # a value of the wrong type for a parameter
            raise ScenarioError(f"{name}: {e}") from None
    else:
        raise ScenarioError(f"unknown scenario {name!r}; try `python -m sim list`")
    return sc.with_overrides(dict(pairs)) if pairs else sc


def offered_load(sc: Scenario) -> float | None:
    """ρ = λ·E[S]/c where it is plain: Poisson arrivals, one group of identical nodes, and every
    template on one role (so a run holds one node for the sum of its exec steps' mean durations);
    None otherwise."""
    wl, groups = sc.workload, sc.fleet.groups
    if not isinstance(wl.arrivals, Poisson) or len(groups) != 1:
        return None
    if any(len(t.roles) != 1 for t in wl.templates):
        return None
    total = sum(t.weight for t in wl.templates)
    service = sum(
        t.weight / total * sum(s.duration.mean for s in t.steps if s.kind == "exec")
        for t in wl.templates
    )
    return float(wl.arrivals.rate * service / groups[0].count)


def overload_warning(sc: Scenario) -> str | None:
    """issue 29 §8: an overloaded queue is said as such, not only as "run too short"."""
    rho = offered_load(sc)
    if rho is None or rho < 1:
        return None
    return (
        f"offered load ≥ 1: the queue never drains (ρ = {rho:.3g}); waits grow with the run's "
        "length and have no steady value"
    )


def _print_summary(summary: dict[str, Any]) -> None:
    for key, value in summary.items():
        if key == "warnings":
            continue  # printed on stderr by the caller
        if isinstance(value, float):
            print(f"  {key:22s} {value:,.4g}")
        elif hasattr(value, "_asdict") or hasattr(value, "__dataclass_fields__"):
            d = value._asdict() if hasattr(value, "_asdict") else vars(value)
            print(f"  {key:22s} " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in d.items()))  # fmt: skip
        else:
            print(f"  {key:22s} {value}")


def cmd_show(args: argparse.Namespace) -> int:
    sc = _scenario(args.scenario, args.set or [])
    if args.scenario in SCENARIOS:
        fn = SCENARIOS[args.scenario]
        print(f"{args.scenario}: {sc.description}")
        print("\nPython parameters (--set NAME=VALUE rebuilds the scenario):")
        for p in inspect.signature(fn).parameters.values():
            print(f"  {p.name:28s} default {p.default!r}")
    print("\nEvery key (--set PATH=VALUE), its value and meaning:")
    for path, value, meaning in explain(sc):
        print(f"  {path:44s} {json.dumps(value, default=str):24s} {meaning}")
    short = ", ".join(ALIASES)
    print(f"\nShort names for paths: {short}")
    overload = overload_warning(sc)
    if overload:
        print(f"warning: {overload}", file=sys.stderr)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    for name, fn in SCENARIOS.items():
        sc = fn()
        print(f"{name:14s} {sc.description or (fn.__doc__ or '').splitlines()[0]}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    sc = _scenario(args.scenario, args.set or [])
    overload = overload_warning(sc)
    if overload:
        print(f"warning: {overload}", file=sys.stderr)
    result = run(sc, args.broker, database_url=args.database_url, progress=not args.quiet)
    print(f"{sc.name} (seed {sc.seed}, {len(result.runs)} runs, engine {args.broker})")
    summary = result.summary()
    _print_summary(summary)
    for w in summary.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    print(f"  {'violations':22s} {len(result.violations)}")
    if args.out:
        out = Path(args.out)
        result.save(out)
        print(f"wrote {out}/")
    return 1 if result.violations else 0


def _confirm_runs(text: str) -> int | None:
    """``--confirm-runs``: a positive count, or ``all`` (None: the whole workload)."""
    if text.strip().lower() == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of runs or 'all', got {text!r}"
        ) from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 run, got {n}")
    return n


def cmd_plan(args: argparse.Namespace) -> int:
    sc = _scenario(args.scenario, args.set or [])
    sizes = [int(x) for x in args.sizes.split(",")]
    target = {"quantile": args.quantile, "wait_s": args.wait}
    group: int | str = int(args.group) if str(args.group).isdigit() else args.group
    result = plan(
        sc, target, sizes, args.replications, broker=args.broker, group=group,
        per_class=args.per_class, confirm_replications=args.confirm_replications,
        confirm_runs=args.confirm_runs, batches=args.batches, scheduler=args.scheduler,
        database_url=args.database_url, progress=not args.quiet,
    )  # fmt: skip
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(result.to_frame().to_string(index=False))
    print(result.headline())
    print(result.confirmation_note)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result.to_html(out / "plan.html")
        result.plot(path=out / "plan.png")
        print(f"wrote {out}/")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    if args.twin:  # the report for one lab, from its exported twin (sim.outputs.twinreport)
        sc = _scenario(args.twin, args.set or [])
        target = {"quantile": args.quantile, "wait_s": args.wait}
        done = twin_report(sc, Path(args.out), target=target, growth=args.growth)
        print(done.headline())
        print(f"wrote {done.path}")
        return 0
    return main_job(Path(args.out), scale=args.scale, database_url=args.database_url)


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows every option's default (issue 15 §2) and keeps descriptions as written; a help text
    that says its default in words keeps only those (issue 29: "(default: an embedded one)
    (default: None)")."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if "(default:" in (action.help or ""):
            return action.help
        # A required option has no default, and None is Python's word, not the user's: argparse
        # printed "(default: None)" after both (issue 29).
        if action.required and action.option_strings:
            return f"{action.help} (required)"
        if action.default is None and action.option_strings:
            return f"{action.help} (default: none)"
        return super()._get_help_string(action)


def _parser(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    """A subcommand parser with the house settings: no prefix matching, defaults in --help.
    Other modules add subcommands the same way (`sim.outputs.cli.build_parser` returns the root)."""
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=help, allow_abbrev=False, formatter_class=_Help
    )
    return p


SET_HELP = ("override a setting: a Python parameter of the scenario (runs=10, arrival_rate=0.2) "
            "or a dotted path (settings.wake_on_return=false); repeatable")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m sim",
        description="The fleet simulator.",
        allow_abbrev=False,
        formatter_class=_Help,
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _parser(sub, "list", "the built-in scenarios").set_defaults(func=cmd_list)
    sh = _parser(sub, "show", "every key of a scenario with its value and meaning")
    sh.add_argument("scenario", help="a built-in name or a .toml file")
    sh.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
    sh.set_defaults(func=cmd_show)
    r = _parser(sub, "run", "run one scenario")
    r.add_argument("scenario", help="a built-in name or a .toml file")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
    r.add_argument(
        "--broker",
        "--engine",  # the old name, kept for one release
        choices=BROKERS,
        default="mediator",
        help="the real Mediator on PostgreSQL, or the in-memory reference model",
    )
    r.add_argument("--out", help="write tables, charts and the summary here")
    r.add_argument(
        "--database-url",
        help="PostgreSQL server to create the run's database on (default: an embedded one)",
    )
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_run)
    p = _parser(sub, "plan", "capacity planning: the smallest fleet meeting a target")
    p.add_argument("scenario", help="a built-in name or a .toml file")
    p.add_argument("--sizes", required=True, help="fleet sizes to try, e.g. 2,3,4,5")
    p.add_argument("--quantile", type=float, default=0.95, help="the target's wait quantile")
    p.add_argument("--wait", type=float, required=True, help="the target wait in seconds")
    p.add_argument(
        "--replications",
        type=int,
        default=None,
        help="replications per size (default: 1 for a trace, which has no randomness, else 5)",
    )
    p.add_argument("--group", default="0", help="the node group to resize (index or id prefix)")
    p.add_argument(
        "--per-class",
        action="store_true",
        help="size every node group (capability class) separately",
    )
    p.add_argument(
        "--broker",
        "--engine",  # the old name, kept for one release
        choices=BROKERS,
        default="model",
        help="the grid's broker",
    )
    p.add_argument(
        "--confirm-replications",
        type=int,
        default=None,
        help="replications of the recommended size and its neighbours on the real "
        "Mediator (default: as many as the grid, at most 2; 0: no confirmation)",
    )
    p.add_argument(
        "--confirm-runs",
        type=_confirm_runs,
        default=CONFIRM_RUNS,
        metavar="N|all",
        help=f"runs each confirmation simulation replays on the real Mediator (default "
        f"{CONFIRM_RUNS:,}, the first ones; 'all': the whole workload). The confirmation is "
        "most of a plan's time: --confirm-replications 0 skips it",
    )
    p.add_argument(
        "--batches",
        type=int,
        default=10,
        help="batches for the interval when there is one distinct replication",
    )
    p.add_argument(
        "--scheduler",
        default=None,
        help="a Dask scheduler address (tcp://host:8786) to run the simulations on",
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)
    p.add_argument("--out", help="write plan.html and plan.png here")
    p.add_argument(
        "--database-url",
        help="PostgreSQL server for the Mediator's databases (default: an embedded one)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_plan)
    rep = _parser(sub, "report", "the main job: every scenario, charts, a summary table")
    rep.add_argument("--out", default="reports", help="the report's folder")
    rep.add_argument("--twin", metavar="DIR", help="the report for one lab: its exported twin")
    rep.add_argument("--wait", type=float, default=600.0, help="(--twin) the target wait, s")
    rep.add_argument("--quantile", type=float, default=0.95, help="(--twin) the target quantile")
    rep.add_argument("--growth", type=float, default=1.5, help="(--twin) the grown load's factor")
    rep.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="(--twin) the lab's settings, e.g. settings.advert_ttl_seconds=30",
    )
    rep.add_argument(
        "--scale",
        choices=("full", "ci"),
        default="full",
        help="full size, or small enough for the tests",
    )
    rep.add_argument("--database-url", help="PostgreSQL server (default: an embedded one)")
    rep.set_defaults(func=cmd_report)

    add_gate_parsers(sub)
    tw = _parser(sub, "twin", "the lab's own twin: a window of a Mediator database as tables")
    tw_sub = tw.add_subparsers(dest="twin_command", required=True, metavar="TWIN_COMMAND")
    ex = _parser(tw_sub, "export", "export [--since, --until) of a Mediator database (read-only)")
    ex.add_argument("--database-url", required=True, help="the lab's Mediator database")
    ex.add_argument("--since", required=True, help="the window's start, ISO 8601 with a zone")
    ex.add_argument("--until", required=True, help="the window's end, ISO 8601 with a zone")
    ex.add_argument("--out", required=True, help="the folder for twin.json and the CSV tables")
    ex.add_argument(
        "--pseudonymize",
        action="store_true",
        help=f"replace run, node and work ids by HMAC-SHA256 pseudonyms under the key in "
        f"${KEY_ENV} (stable across exports), or a random key kept nowhere",
    )
    ex.add_argument("--quiet", action="store_true", help="no progress bar")
    ex.set_defaults(func=cli_export)
    add_twin_parsers(tw_sub, SET_HELP)  # replay, audit
    add_coverage_parsers(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except (ScenarioError, ValueError, KeyError) as e:
        # A wrong name or value is one line, not a traceback (issue 14 §3).
        print(f"python -m sim {args.command}: error: {e}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
