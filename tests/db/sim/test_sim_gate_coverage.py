"""The gate covers the rules it guards (issue 24, item 2): a rule broken on purpose — a *plant* of
``sim.outputs.coverage`` — changes the decisions of a committed baseline case, and the gate says
where.

Before the ``rules`` case was recorded, the matcher's folding choice for a multi-role contract,
one attempt fewer for a retried step and the drain kinds (swapped, or at-boundary acting
gracefully) passed ``python -m sim check --baseline sim-baseline`` as unchanged (exit 0): no case
exercised them (partial release was caught, by ``mixed``). Each test here fails on a tree whose
``sim-baseline/`` lacks that case. The expected first divergences are read from the committed
``decisions.csv`` (the baseline's decision for that run), so they document what each rule
decides in the case.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sim.outputs import coverage, gate

pytestmark = [
    pytest.mark.db,
    pytest.mark.slow,
]  # scripts/test --fast leaves it out: simulations on the real Mediator

ROOT = Path(__file__).resolve().parents[3]
BASELINE = ROOT / "sim-baseline"
RULES = BASELINE / "rules" / "seed-1"


@pytest.fixture(scope="module")
def server_url(cluster: Any) -> str:
    return str(cluster.url("postgres"))


def job(server_url: str, case: Path = RULES) -> Any:
    return gate.Job(gate.load_case(case), [], None, server_url)


# plant → (the run of the first divergence, the instant in seconds)
NAMED = {
    # §4 step 4: dut needs a board, host a host; b000 serves both and a000 only dut. Counting
    # the later roles a candidate serves folds the run onto one b node; ignoring the count takes
    # a000 (the lower id) for dut and makes the run two nodes wide.
    "match-ignores-folding": ("r0000008", "523.935296"),
    # §9: the retried `test` step of a fold run ends FAILED one attempt early, freeing its node.
    "attempts-minus-one": ("r0000111", "4751.699390"),
    # R15: a pair run's l000 is free once `prep` passed; without partial release a solo run
    # waits for the pair's `soak` on r000 to end.
    "no-partial-release": ("r0000012", "638.051905"),
    # §10: b000 drains at-boundary at 2,900 s for 60 s; the fold run on it ends at its step
    # boundary, so b000 is free at the undrain (2,960 s) and a queued run starts there. Acting
    # gracefully instead, the run goes on and b000 is still busy at 2,960 s. (The plant that
    # swaps both kinds is caught too, but by a crash: the node, told graceful, claims a step
    # the Mediator refuses as draining at the boundary.)
    "drain-at-boundary-graceful": ("r0000059", "2960.000000"),
    # wake 4: b001's daemon restarts at 4,230 s mid-run; the lost run frees it at that advert
    # and a queued fold run starts there at once.
    "wake-4-off": ("r0000096", "4230.000000"),
}


def test_the_rules_case_passes_unplanted(server_url: str) -> None:
    """The control: with no plant the case is unchanged (else every plant below proves nothing)."""
    o = gate.check_case(job(server_url))
    assert o.status == "pass", o.text()


@pytest.mark.parametrize("plant_id", sorted(NAMED))
def test_each_named_rule_broken_makes_check_fail_with_the_first_divergence_named(
    plant_id: str, server_url: str
) -> None:
    """Issue 24: matcher choice for a multi-role contract, retry attempts, partial release and
    drain kinds each change the ``rules`` case's decisions; the gate names where."""
    run_id, at = NAMED[plant_id]
    o = coverage.check_planted(plant_id, job(server_url))
    assert o.status == "fail"
    d = o.divergence
    assert d is not None, o.text()
    assert (d.run_id, gate.seconds(d.at_us)) == (run_id, at), o.text()
    assert f"first divergence at {at} s, run {run_id}" in o.headline()
    # the baseline's own record says what the unbroken rule decided for that run
    assert d.run_baseline is not None and d.run_baseline.run_id == run_id
    # the planted run stopped there: nothing after the divergence was simulated
    assert d.partial and "the run stopped there" in o.headline()


def test_a_planted_run_stopped_at_its_divergence_names_the_whole_runs_divergence(
    server_url: str,
) -> None:
    """``sim coverage`` stops a planted run once its first divergence is settled
    (``gate.Settled``); the reference is the same plant run to the end (``gate.check_case``
    as ``sim check`` runs it): the same divergence, from fewer decisions."""
    from sim.outputs.coverage import plant

    stopped = coverage.check_planted("attempts-minus-one", job(server_url))
    with plant("attempts-minus-one").apply():
        whole = gate.check_case(job(server_url))
    assert stopped.status == whole.status == "fail"
    s, w = stopped.divergence, whole.divergence
    assert s is not None and w is not None
    assert (s.index, s.at_us, s.run_id, s.baseline) == (w.index, w.at_us, w.run_id, w.baseline)
    assert s.partial and not w.partial
    assert stopped.decisions < whole.decisions
    assert "the run stopped at this divergence" in stopped.text()
    assert "from there on" in whole.text() and "from there on" not in stopped.text()


def test_a_plant_that_breaks_nothing_is_listed_as_not_exercised(server_url: str) -> None:
    """The coverage table says "not exercised" for a plant no case notices (exit 1), and a
    documented exception (``--allow``) turns that into exit 0 while still listing it."""
    report = coverage.coverage(BASELINE, ["nothing"], names=["capabilities"],
                               database_url=server_url)  # fmt: skip
    assert report.exit_code == 1, report.text()
    [(_rule, plant_id, _what, verdict)] = report.rows()
    assert plant_id == "nothing" and verdict.startswith("NOT EXERCISED"), verdict
    assert "NOT EXERCISED: nothing (exit 1)" in report.text()
    allowed = coverage.coverage(BASELINE, ["nothing"], names=["capabilities"], allow=["nothing"],
                                database_url=server_url)  # fmt: skip
    assert allowed.exit_code == 0 and "NOT EXERCISED (allowed)" in allowed.text()


def test_the_table_names_the_case_that_caught_a_plant(server_url: str) -> None:
    """Wake 9 off (docs/design.md, wake points) is caught by the capabilities case at 100 s;
    the table says so, and the run stops at the first case that caught it."""
    report = coverage.coverage(BASELINE, ["wake-9-off"], names=["capabilities"],
                               database_url=server_url)  # fmt: skip
    assert report.exit_code == 0, report.text()
    [(_rule, _id, _what, verdict)] = report.rows()
    assert verdict == "capabilities[seed=0]: first divergence at 100.000000 s, run r0000001"


def test_the_command_allows_the_documented_exceptions_unless_strict(server_url: str) -> None:
    """``python -m sim coverage``: wake 5 (startup, reconnect) cannot happen in a simulation, so
    the command allows it by name and says why (exit 0); ``--strict`` counts it as not exercised
    (exit 1)."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "sim", "coverage", "capabilities", "--baseline", str(BASELINE),
            "--plant", "wake-5-off", "--database-url", server_url]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "NOT EXERCISED (allowed: the simulator never restarts the Mediator nor loses its database)"
    ) in done.stdout
    strict = subprocess.run([*argv, "--strict"], capture_output=True, text=True, cwd=ROOT)
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "NOT EXERCISED: wake-5-off (exit 1)" in strict.stdout


# plant → its first divergence, as the coverage table names it (docs/design.md §20 says what
# each part of the ``edges`` case is for; the others are the ``rules`` case's and older cases')
FIRST = {
    "match-ignores-folding": "first divergence at 523.935296 s, run r0000008",
    "match-last-candidate": "first divergence at 59.654745 s, run r0000000",
    # fold (fx, fy): fy folds onto yb000, chosen for fx, although ya000 (a lower id) serves fy
    "match-no-reuse": "first divergence at 6000.000000 s, run r0000018",
    # exact (ga…ge, max_width 2): greedy is 3 wide; {xc000, xd000} and {xa000, xb000} tie at 2
    "exact-order-flipped": "first divergence at 6100.000000 s, run r0000019",
    "width-greedy-only": "first divergence at 126.601622 s, run r0000001",
    # every start the same; only how the runs ended changed
    "verdict-flipped": "runs by verdict pass 300 in the baseline, fail 300 now",
    "attempts-minus-one": "first divergence at 4751.699390 s, run r0000111",
    "no-partial-release": "first divergence at 381.467588 s, run r0000018",
    # told graceful, the node claims a step the Mediator refuses as draining at the boundary
    "drain-kinds-swapped": "the run crashed (Conflict: Node b001 is draining at the step bound",
    "drain-at-boundary-graceful": "first divergence at 2960.000000 s, run r0000059",
    "no-restart-detection": "first divergence at 3763.140809 s, run r0000089",
    "sweep-newest-first": "first divergence at 1810.402607 s, run r0000014",
    # tri (p, q, r) is TOO_WIDE while m000 {p, q} runs pq, and starts on m000 + r000 at 3,400 s
    "too-wide-refused-when-busy": "first divergence at 3400.000000 s, run r0000011",
    "too-wide-fails-at-promotion": "first divergence at 3400.000000 s, run r0000011",
    # the cancel frees d000 at 1,100 s; d (queued behind c, whose c000 is still busy) starts
    "sweep-head-only": "first divergence at 1100.000000 s, run r0000005",
    # 64 k runs fill the queue's head while k000 runs kl; n (queued at the same instant as the
    # last of them, after it by run_id) starts on page two when n000 frees at 7,110 s
    "sweep-no-second-page": "first divergence at 7110.000000 s, run r0000086",
    "sweep-page-skips-a-tie": "first divergence at 7110.000000 s, run r0000086",
    # n again, queued at 7,150 s behind the head and 64 tri2 runs that are TOO_WIDE while m000
    # runs pql (page two, full): it starts on page three when n000 frees at 7,210 s; its class
    # had left the queue (w's result at 7,130 s sweeps and drops it) and is learnt again
    "sweep-one-page-past-head": "first divergence at 7210.000000 s, run r0000153",
    "memo-forgets-returning-class": "first divergence at 7210.000000 s, run r0000153",
    # vw promoted at 101 s; v000 vanishes at 110 s: its lease ends at 701 s, reaped at 900 s
    "promoted-lease-short": "first divergence at 600.000000 s, run r0000002",
    "no-asks-at-promotion": "first divergence at 2300.000000 s, run r0000008",
    "wakes-deferred": "first divergence at 101.000000 s, run r0000001",
    # u000 is back at 4,850 s without a wake; u2 waits for the retried step's failure at 5,170 s
    "heartbeat-sweeps": "first divergence at 4850.000000 s, run r0000013",
    "reaper-always-sweeps": "first divergence at 5100.000000 s, run r0000013",
    "retry-sweeps": "first divergence at 4970.000000 s, run r0000013",
    "not-ok-skips-nothing": "first divergence at 2340.000000 s, run r0000009",
    "answer-no-wake": "first divergence at 2340.000000 s, run r0000009",
    "cancel-frees-claimed": "first divergence at 1100.000000 s, run r0000005",
    "reaper-off": "first divergence at 900.000000 s, run r0000002",
    # f000 restarted before running anything of ef: unbound, its lease expires and is reaped
    "restart-no-rebind": "first divergence at 4800.000000 s, run r0000015",
    "wake-1-off": "first divergence at 700.000000 s, run r0000001",
    "wake-2-off": "first divergence at 1100.000000 s, run r0000005",
    "wake-3-off": "first divergence at 900.000000 s, run r0000002",
    "wake-4-off": "first divergence at 4230.000000 s, run r0000096",
    "wake-6-off": "first divergence at 1600.000000 s, run r0000037",
    "wake-7-off": "first divergence at 300.000000 s, run r0000001",
    "wake-8-off": "first divergence at 8302.002608 s, run r0000071",
    "wake-9-off": "first divergence at 100.000000 s, run r0000001",
}


def test_every_plant_is_caught_with_its_first_divergence_named(server_url: str) -> None:
    """Issue 24, item 2: every rule that decides who runs where and when, broken on purpose,
    changes the decisions of some committed case — the one ``CAUGHT_BY`` names, at the first
    divergence ``FIRST`` names — and the table says so (exit 0). The one documented exception
    (wake 5) is left out here: it would run every case for nothing. This is ``python -m sim
    coverage --baseline sim-baseline`` in CI, each plant against the case recorded for it."""
    plants = [p.id for p in coverage.PLANTS if p.id not in coverage.EXCEPTIONS]
    assert set(plants) == set(coverage.CAUGHT_BY) == set(FIRST)
    report = coverage.coverage(BASELINE, plants, database_url=server_url, jobs=2)
    assert report.exit_code == 0, report.text()
    verdicts = {pid: verdict for _rule, pid, _what, verdict in report.rows()}
    for pid in plants:
        case = coverage.CAUGHT_BY[pid]
        assert verdicts[pid].startswith(f"{case}["), (pid, verdicts[pid])
        assert FIRST[pid] in verdicts[pid], (pid, verdicts[pid])
    for c in report.results:  # the recorded case still catches it: one case run per plant
        assert len(c.outcomes) == 1, c.plant
    text = report.text()
    for rule in coverage.UNEXERCISABLE:
        assert rule in text


def test_the_edges_case_decides_as_the_reference_model(server_url: str) -> None:
    """The ``edges`` case's cancel (a fleet event: an operator cancels the run a node holds,
    docs/design.md §10) is the simulator's own addition for the gate: the model and the real
    Mediator must promote the same runs at the same instants and end the same runs the same way
    (the differential check of §20), the cancelled one FAILED with its node kept for its claimed
    step until that step's result."""
    import sim
    from sim.inputs.scenarios import Scenario

    plan = sim.materialize(Scenario.from_toml(BASELINE.parent / "sim-baseline" / "edges.toml"))
    result = sim.run(plan, database_url=server_url, progress=False)
    model = sim.run_model(plan)
    assert sim.promotions_diff(model.promotions, result.promotions, tol_s=1e-6) is None
    assert result.violations == []
    runs = result.runs.set_index("run_id")
    assert list(runs["state"]) == list(model.runs.set_index("run_id")["state"])
    assert runs.loc["r0000003", "verdict"] == "cancelled"
