"""``python -m sim``: list scenarios, run one, or produce the report (docs/design.md §20).

    python -m sim list
    python -m sim run SCENARIO [--set key=value ...] [--engine mediator|model] [--out DIR]
    python -m sim report [--out reports/] [--scale full|ci]

``run`` prints the summary and writes CSV tables, PNG charts, ``summary.json`` and
``manifest.json`` into ``--out``. ``report`` is the main job: every built-in scenario on the real
Mediator (embedded PostgreSQL), the model beside it where a comparison helps, charts, and a summary
table on the terminal; see ``sim.report``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sim.scenarios import SCENARIOS, Scenario


def _scenario(name: str, sets: list[str]) -> Scenario:
    path = Path(name)
    if path.suffix == ".toml" and path.exists():
        sc = Scenario.from_toml(path)
    elif name in SCENARIOS:
        sc = SCENARIOS[name]()
    else:
        raise SystemExit(f"sim: unknown scenario {name!r}; try `python -m sim list`")
    return sc.with_sets(sets) if sets else sc


def _print_summary(summary: dict[str, Any]) -> None:
    for key, value in summary.items():
        if isinstance(value, float):
            print(f"  {key:22s} {value:,.4g}")
        elif hasattr(value, "_asdict") or hasattr(value, "__dataclass_fields__"):
            d = value._asdict() if hasattr(value, "_asdict") else vars(value)
            print(f"  {key:22s} " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in d.items()))  # fmt: skip
        else:
            print(f"  {key:22s} {value}")


def cmd_list(args: argparse.Namespace) -> int:
    for name, fn in SCENARIOS.items():
        sc = fn()
        print(f"{name:14s} {sc.description or (fn.__doc__ or '').splitlines()[0]}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    sc = _scenario(args.scenario, args.set or [])
    if args.engine == "model":
        from sim.model import run_model

        result: Any = run_model(sc)
    else:
        from sim.result import run

        result = run(sc, database_url=args.database_url, progress=not args.quiet)
    print(f"{sc.name} (seed {sc.seed}, {len(result.runs)} runs, engine {args.engine})")
    _print_summary(result.summary())
    violations = getattr(result, "violations", [])
    print(f"  {'violations':22s} {len(violations)}")
    if args.out:
        out = Path(args.out)
        if hasattr(result, "save"):
            result.save(out)
        else:
            out.mkdir(parents=True, exist_ok=True)
            for name in ("runs", "promotions", "queue", "stuck", "leases"):
                getattr(result, name).to_csv(out / f"{name}.csv", index=False)
            from sim import plots

            plots.save_all(result, out)
            (out / "summary.json").write_text(json.dumps(result.summary(), default=str, indent=2))
        print(f"wrote {out}/")
    return 1 if violations else 0


def cmd_plan(args: argparse.Namespace) -> int:
    import pandas as pd

    from sim.plan import plan

    sc = _scenario(args.scenario, args.set or [])
    sizes = [int(x) for x in args.sizes.split(",")]
    target = {"quantile": args.quantile, "wait_s": args.wait}
    group: int | str = int(args.group) if str(args.group).isdigit() else args.group
    result = plan(sc, target, sizes, args.replications, engine=args.engine,
                  group=group, database_url=args.database_url)  # fmt: skip
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(result.to_frame().to_string(index=False))
    print(result.headline())
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result.to_html(out / "plan.html")
        result.plot().savefig(out / "plan.png", dpi=110)  # plot() returns the figure
        print(f"wrote {out}/")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from sim.report import main_job

    return main_job(Path(args.out), scale=args.scale, database_url=args.database_url)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sim", description="The fleet simulator.")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the built-in scenarios").set_defaults(func=cmd_list)
    r = sub.add_parser("run", help="run one scenario")
    r.add_argument("scenario", help="a built-in name or a .toml file")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a setting")
    r.add_argument("--engine", choices=("mediator", "model"), default="mediator")
    r.add_argument("--out", help="write tables, charts and the summary here")
    r.add_argument("--database-url", help="PostgreSQL server to create the run's database on")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_run)
    p = sub.add_parser("plan", help="capacity planning: the smallest fleet meeting a target")
    p.add_argument("scenario", help="a built-in name or a .toml file")
    p.add_argument("--sizes", required=True, help="fleet sizes to try, e.g. 2,3,4,5")
    p.add_argument("--quantile", type=float, default=0.95)
    p.add_argument("--wait", type=float, required=True, help="the target wait in seconds")
    p.add_argument("--replications", type=int, default=5)
    p.add_argument("--group", default=0, help="the node group to resize (index or id prefix)")
    p.add_argument("--engine", choices=("model", "mediator"), default="model")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    p.add_argument("--out")
    p.add_argument("--database-url")
    p.set_defaults(func=cmd_plan)
    rep = sub.add_parser("report", help="the main job: every scenario, charts, a summary table")
    rep.add_argument("--out", default="reports")
    rep.add_argument("--scale", choices=("full", "ci"), default="full")
    rep.add_argument("--database-url")
    rep.set_defaults(func=cmd_report)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
