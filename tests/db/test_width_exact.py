"""Width, exactly, at submit and in the queue (docs/design.md §4–5, R1, R10; issue 24).

TOO_WIDE at submit is refused (422) only when no assignment of the live nodes, busy or not, fits
``max_width``; otherwise the run starts (201) or queues (202), and a queued run waiting for busy
nodes says which. Checked on the issue's counterexample and against a brute force over random
small fleets, on the real database.
"""

from __future__ import annotations

import itertools
import random

from mediator import Config, Mediator, Outcome
from tests.db.conftest import contract

TRIALS = 120


def counterexample(med: Mediator) -> dict:
    """max_width 2; roles a–d need ra–rd; G{ra,rb}, H{ra,rc}, J{rb,rd}. {H, J} covers all."""
    med.advert("G", {"ra": True, "rb": True, "g": True}, "i")
    med.advert("H", {"ra": True, "rc": True}, "i")
    med.advert("J", {"rb": True, "rd": True}, "i")
    return contract("w", **{r: {f"r{r}": True} for r in "abcd"})


def test_the_counterexample_starts_with_every_node_free(dsn, clock, tmp_path):
    """The greedy choice G, H, J is width 3; H and J alone fit: 201, not a permanent 422."""
    with Mediator.connect(dsn, Config(max_width=2), clock, records_root=str(tmp_path)) as med:
        sub = med.submit(counterexample(med))
        assert (sub.outcome, sub.run.state) == (Outcome.STARTED, "RUNNING")
        assert sub.run.assigned == {"a": "H", "b": "J", "c": "H", "d": "J"}


def test_the_counterexample_starts_on_h_and_j_while_g_is_busy(dsn, clock, tmp_path):
    with Mediator.connect(dsn, Config(max_width=2), clock, records_root=str(tmp_path)) as med:
        wide = counterexample(med)
        assert med.submit(contract("on-g", x={"g": True})).outcome == Outcome.STARTED  # G busy
        sub = med.submit(wide)
        assert (sub.outcome, sub.run.assigned) == (
            Outcome.STARTED,
            {"a": "H", "b": "J", "c": "H", "d": "J"},
        )


def test_a_run_waiting_only_for_a_busy_node_names_it(dsn, clock, tmp_path):
    """max_width 1: F serves both roles; P and Q one each. With F busy the free nodes need
    width 2, so the run waits for F — and its wait reason says F, not "use fewer roles"."""
    with Mediator.connect(dsn, Config(max_width=1), clock, records_root=str(tmp_path)) as med:
        med.advert("F", {"p": True, "q": True, "f": True}, "i")
        med.advert("P", {"p": True}, "i")
        med.advert("Q", {"q": True}, "i")
        assert med.submit(contract("on-f", x={"f": True})).outcome == Outcome.STARTED
        assert med.submit(contract("w", a={"p": True}, b={"q": True})).outcome == Outcome.QUEUED
        why = med.get_run("w").wait_reason
        assert (why["code"], why["busy"], why["draining"]) == ("TOO_WIDE", ["F"], [])
        assert "(F)" in why["message"] and "fewer roles" not in why["message"]


def _fits(serves: dict[str, set[str]], nodes: list[str], width: int) -> bool:
    return any(
        all(serves[r] & set(pick) for r in serves)
        for k in range(1, width + 1)
        for pick in itertools.combinations(nodes, k)
    )


def test_submit_is_refused_exactly_when_no_assignment_of_live_nodes_fits(dsn, clock, tmp_path):
    """TRIALS random fleets of 3–6 nodes serving two of 3–5 roles each, some nodes busy,
    max_width 2–3, each in its own capability namespace on one database. 422 iff no set of
    live nodes of at most max_width serves every role; else 201 iff such a set of free nodes
    exists; else 202."""
    rng = random.Random(2024)
    with Mediator.connect(dsn, Config(max_width=3), clock, records_root=str(tmp_path)) as med:
        for t in range(TRIALS):
            max_width = rng.randint(2, 3)
            med.ctx.config = Config(max_width=max_width)
            roles = [f"r{i}" for i in range(rng.randint(3, 5))]
            nodes = [f"t{t}n{i}" for i in range(rng.randint(3, 6))]
            serves: dict[str, set[str]] = {r: set() for r in roles}
            for n in nodes:
                mine = rng.sample(roles, 2)  # two each: where greedy folding goes wrong
                for r in mine:
                    serves[r].add(n)
                med.advert(n, {**{f"t{t}{r}": True for r in mine}, f"t{t}id": n}, "i")
            serves = {r: s for r, s in serves.items() if s}  # a role no node serves: dropped
            busy = set(rng.sample(nodes, rng.randint(0, len(nodes) - 1)))
            for n in sorted(busy):
                assert (
                    med.submit(contract(f"t{t}-on-{n}", x={f"t{t}id": n})).outcome
                    == Outcome.STARTED
                )
            sub = med.submit(contract(f"t{t}", **{r: {f"t{t}{r}": True} for r in serves}))
            free = [n for n in nodes if n not in busy]
            if not _fits(serves, nodes, max_width):
                want = Outcome.REJECTED
            elif _fits(serves, free, max_width):
                want = Outcome.STARTED
            else:
                want = Outcome.QUEUED
            assert sub.outcome == want, (t, serves, busy, max_width, sub.body())
            if want == Outcome.QUEUED:
                why = med.get_run(f"t{t}").wait_reason
                assert why["busy"] and set(why["busy"]) <= busy, why
