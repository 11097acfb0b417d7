"""bench/bench_peers.py's pure parts: its options and the table it prints (docs/performance.md
"Beside its peers"). The bench itself is not run by any test: it starts Slurm and labgrid."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _bench() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "bench_peers.py"
    spec = importlib.util.spec_from_file_location("bench_peers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_peers"] = module
    spec.loader.exec_module(module)
    return module


bench = _bench()


def test_the_full_run_measures_every_depth_and_the_quick_one_is_small() -> None:
    full = bench.parse_args([])
    assert (full.depths, full.samples, full.submits, full.idle) == ([0, 1000, 10000], 5, 200, 30.0)
    assert full.peers == ["mediator", "slurm", "labgrid"]
    quick = bench.parse_args(["--quick"])
    assert (quick.depths, quick.samples, quick.submits, quick.idle) == ([0, 100], 2, 40, 5.0)


def test_an_option_given_with_quick_wins_over_quick() -> None:
    args = bench.parse_args(["--quick", "--depths", "0", "--samples", "7"])
    assert (args.depths, args.samples, args.submits) == ([0], 7, 40)


def test_the_mediator_is_always_measured_it_is_every_ratio_s_baseline() -> None:
    assert bench.parse_args(["--peers", "slurm"]).peers == ["mediator", "slurm"]


def test_an_unknown_peer_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--peers", "kubernetes"])
    assert "kubernetes" in capsys.readouterr().err


def test_the_table_says_how_many_times_better_the_mediator_is_either_way() -> None:
    """Latency: the peer's time over the Mediator's; throughput: the Mediator's rate over the
    peer's. Above 1 the Mediator is ahead; a peer with no figure shows a dash."""
    rows = [
        ("release → next start", "depth 0, load 3.0", {"mediator": 0.08, "slurm": 2.4}),
        ("submits/s, 4 client(s)", "depth 0, load 3.0", {"mediator": 100.0, "slurm": 200.0}),
        ("idle CPU, % of a core", "load 3.0", {"mediator": 0.4, "slurm": 0.2}),
    ]
    table = bench.render_table(rows, ["mediator", "slurm", "labgrid"], {"submits/s, 4 client(s)"})
    assert table.splitlines() == [
        "| figure | load | mediator | slurm | labgrid |",
        "|---|---|---|---|---|",
        "| release → next start | depth 0, load 3.0 | 80 ms | 2,400 ms (M 30.00×) | — |",
        "| submits/s, 4 client(s) | depth 0, load 3.0 | 100 | 200 (M 0.50×) | — |",
        "| idle CPU, % of a core | load 3.0 | 0.40 % | 0.20 % (M 0.50×) | — |",
    ]


def test_a_figure_below_ten_milliseconds_keeps_a_decimal() -> None:
    rows = [("submit → start, idle node", "depth 0", {"mediator": 0.0123, "labgrid": 0.0037})]
    table = bench.render_table(rows, ["mediator", "labgrid"], set())
    assert table.splitlines()[-1] == (
        "| submit → start, idle node | depth 0 | 12 ms | 3.7 ms (M 0.30×) |"
    )


def test_what_the_throughput_clients_submit_is_a_contract_the_mediator_accepts() -> None:
    """Submitted 200 times per figure: a contract the Mediator refuses made every throughput
    figure "a client failed" (its step once had no command)."""
    from mediator.core.contract import parse

    contract = parse(bench.QUEUED_CONTRACT)
    assert [s.name for s in contract.steps] == ["s"]
