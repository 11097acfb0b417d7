"""enode's loop, one ``tick()`` at a time, against the real API (docs/design.md §19).

The server is the real FastAPI app on a per-test database, served by uvicorn in a thread on a
loopback socket the test binds itself (so it accepts connections before the thread is even
scheduled: no waiting for a ready flag). The daemon runs in the test's thread with a fake clock and
a fake sleep, so advert pacing is exact and nothing sleeps. Its HTTP goes through :class:`Wire`, the
real network plus a record of every request and, on demand, an injected connection failure.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from mediator import Config, Mediator
from mediator import Outcome as Submitted
from mediator.api.auth import Tokens
from mediator.client import Client
from mediator.core.errors import UnknownAction
from mediator.enode.actions import BUILTINS, Outcome, Retry
from mediator.enode.daemon import Daemon, DaemonError

pytestmark = pytest.mark.db

BOARD = {"board": "x"}


# ---- the server, the wire, the clock ------------------------------------------------------------


@pytest.fixture
def med(dsn: str, tmp_path: Any) -> Iterator[Mediator]:
    m = Mediator.connect(dsn, config=Config(), records_root=str(tmp_path / "records"))
    yield m
    m.close()


class Clock:
    """Fake monotonic time; ``sleep`` advances it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Wire(httpx.BaseTransport):
    """The real network, with a record of every request and a connection failure on demand."""

    def __init__(self, clock: Clock) -> None:
        self.inner = httpx.HTTPTransport()
        self.clock = clock
        self.sent: list[str] = []
        self.at: list[tuple[float, str]] = []
        self._faults: list[str] = []
        self._lost: list[str] = []
        self.meanwhile: Callable[[str], None] = lambda what: None

    def drop_next(self, pattern: str) -> None:
        """The next request whose ``METHOD /path`` matches ``pattern`` gets no answer."""
        self._faults.append(pattern)

    def lose_answer_next(self, pattern: str) -> None:
        """The next request whose ``METHOD /path`` matches ``pattern`` reaches the server and is
        served, and its answer is lost on the way back."""
        self._lost.append(pattern)

    def take(self) -> list[str]:
        sent, self.sent = self.sent, []
        return sent

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        what = f"{request.method} {request.url.path}"
        self.sent.append(what)
        self.at.append((self.clock.now, what))
        self.meanwhile(what)
        for pattern in self._faults:
            if re.fullmatch(pattern, what):
                self._faults.remove(pattern)
                raise httpx.ConnectError("injected: no answer", request=request)
        for pattern in self._lost:
            if re.fullmatch(pattern, what):
                self._lost.remove(pattern)
                answer = self.inner.handle_request(request)
                answer.read()  # served whole: whatever it committed, it committed
                answer.close()
                raise httpx.ReadError("injected: the answer was lost", request=request)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def wire(clock: Clock) -> Wire:
    return Wire(clock)


@pytest.fixture
def url(serve: Any) -> str:
    return str(serve())


@pytest.fixture
def node(url: str, wire: Wire, clock: Clock) -> Iterator[Daemon]:
    """Node ``n1`` serving ``board: x`` with the built-in actions, through ``wire``."""
    with Client(url, transport=wire) as client:
        yield Daemon(client, "n1", BOARD, label="bench 1", clock=clock, sleep=clock.sleep)


def contract(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Steps on role ``dut`` (needs ``board: x``); a step is ``shell: true`` unless it says."""
    return {
        "roles": {"dut": BOARD},
        "steps": [{"role": "dut", "with": {"cmd": "true"}, **s} for s in steps],
        **extra,
    }


def log_of(url: str, run_id: str, seq: int, name: str) -> str:
    """A step's log as the sealed record keeps it."""
    resp = httpx.get(f"{url}/v1/runs/{run_id}/record/steps/{seq:04d}-{name}.log")
    assert resp.status_code == 200, resp.text
    return resp.text


# ---- the happy path ---------------------------------------------------------------------------


def test_a_tick_adverts_polls_claims_runs_and_reports(node, med, wire, url):
    assert node.tick() is False  # nothing to do yet, but the node is now live
    assert wire.take() == ["POST /v1/nodes", "GET /v1/nodes/n1/work"]
    assert node.advert_ttl == 30.0
    (live,) = med.list_nodes().nodes
    assert (live.node_id, live.label, live.instance, live.capabilities) == (
        "n1", "bench 1", node.instance, BOARD,
    )  # fmt: skip

    sub = med.submit(contract({"name": "hello", "uses": "shell", "with": {"cmd": "echo hi"}}))
    assert sub.outcome == Submitted.STARTED
    run_id = sub.run.run_id

    assert node.tick() is True
    assert wire.take() == [
        "GET /v1/nodes/n1/work",
        f"POST /v1/runs/{run_id}/steps/0/claim",
        f"POST /v1/runs/{run_id}/steps/0/result",
    ]
    run = med.get_run(run_id)
    assert (run.state, run.steps[0].state, run.steps[0].attempt) == ("PASSED", "PASSED", 1)
    assert run.steps[0].chosen["instance"] == node.instance
    assert log_of(url, run_id, 0, "hello") == "hi\n"


def test_each_start_is_a_fresh_instance(url, clock):
    with Client(url) as client:
        a = Daemon(client, "n1", BOARD, clock=clock, sleep=clock.sleep)
        b = Daemon(client, "n1", BOARD, clock=clock, sleep=clock.sleep)
    assert re.fullmatch(r"[0-9a-f]{32}", a.instance)
    assert a.instance != b.instance


def test_adverts_come_every_third_of_the_ttl_and_during_a_long_step(node, med, wire, clock):
    node.tick()  # t=0: advert; the server's advert_ttl is 30 s, so every 10 s
    clock.now = 9.9
    node.tick()
    clock.now = 10.0
    node.tick()
    med.submit(contract({"name": "soak", "uses": "sleep", "with": {"seconds": 25}}))
    node.tick()  # the step runs from t=10 to t=35 in fake time
    adverts = [t for t, what in wire.at if what == "POST /v1/nodes"]
    assert adverts == [0.0, 10.0, 20.0, 30.0]
    assert clock.now == 35.0
    assert med.list_runs().runs[0].state == "PASSED"


# ---- outcomes ---------------------------------------------------------------------------------


def test_a_retry_puts_the_step_back_and_the_next_tick_runs_attempt_2(url, med, clock):
    attempts = []

    def flaky(with_, ctx):
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise Retry("the board did not answer")
        return Outcome("pass", "ok on attempt 2\n")

    with Client(url) as client:
        node = Daemon(client, "n1", BOARD, actions={**BUILTINS, "flaky": flaky}, clock=clock)
        node.tick()
        run_id = med.submit(contract({"name": "boot", "uses": "flaky"})).run.run_id
        assert node.tick() is True
        step = med.get_run(run_id).steps[0]
        assert (step.state, step.attempt) == ("PENDING", 1)  # R15: a rollback, not a failure
        assert node.tick() is True
    run = med.get_run(run_id)
    assert (run.state, run.steps[0].attempt, attempts) == ("PASSED", 2, [1, 2])
    # the server keeps every attempt's log, in order
    assert log_of(url, run_id, 0, "boot") == "the board did not answer\nok on attempt 2\n"


def test_a_broken_action_or_an_unknown_one_fails_its_step_not_the_daemon(url, med, clock):
    def broken(with_, ctx):
        raise RuntimeError("the probe is unplugged")

    with Client(url) as client:
        node = Daemon(client, "n1", BOARD, actions={**BUILTINS, "probe": broken}, clock=clock)
        node.tick()
        a = med.submit(contract({"name": "probe", "uses": "probe"})).run.run_id
        node.tick()
        # The node advertises what it offers, so a `uses` it lacks is refused at submit
        # (docs/design.md §4 "Actions")...
        with pytest.raises(UnknownAction, match="fail, probe, shell, sleep"):
            med.submit(contract({"name": "flash", "uses": "flash"}))
        # ...and one whose advert did not say (an older daemon) is failed on the node, by name.
        med.advert("n1", BOARD, node.instance)
        b = med.submit(contract({"name": "flash", "uses": "flash"})).run.run_id
        node.tick()
    assert [med.get_run(r).state for r in (a, b)] == ["FAILED", "FAILED"]
    assert log_of(url, a, 0, "probe").endswith("RuntimeError: the probe is unplugged\n")
    assert log_of(url, b, 0, "flash") == "unknown action 'flash'; this node has: fail, probe, " + (
        "shell, sleep\n"
    )


def test_a_run_cancelled_mid_step_is_dropped_at_its_result(url, med, wire, clock):
    def cancel_meanwhile(with_, ctx):
        med.cancel(ctx.run_id)  # someone cancels while the node is still working
        return Outcome("pass", "done anyway\n")

    with Client(url, transport=wire) as client:
        node = Daemon(client, "n1", BOARD, actions={"work": cancel_meanwhile}, clock=clock)
        node.tick()
        run_id = med.submit(contract({"name": "w", "uses": "work"})).run.run_id
        assert med.list_nodes().nodes[0].lease is not None  # I2's exception: kept until the result
        assert node.tick() is True  # the result is answered 409 run_ended: nothing to send again
        assert node.tick() is False
    run = med.get_run(run_id)
    assert (run.state, run.verdict) == ("FAILED", "cancelled")
    assert med.list_nodes().nodes[0].lease is None  # the late result freed the node
    assert wire.sent[-1] == "GET /v1/nodes/n1/work"


# ---- a server that does not answer ------------------------------------------------------------


def test_an_unanswered_result_is_sent_again_before_any_new_claim(node, med, wire):
    node.tick()
    run_id = med.submit(contract({"name": "s", "with": {"cmd": "true"}})).run.run_id
    wire.take()
    wire.drop_next(r"POST /v1/runs/.*/result")
    assert node.tick() is True
    assert med.get_run(run_id).steps[0].state == "CLAIMED"
    assert node.tick() is False
    assert wire.take() == [
        "GET /v1/nodes/n1/work",
        f"POST /v1/runs/{run_id}/steps/0/claim",
        f"POST /v1/runs/{run_id}/steps/0/result",  # no answer
        f"POST /v1/runs/{run_id}/steps/0/result",  # sent again, first thing in the next tick
        "GET /v1/nodes/n1/work",
    ]
    assert med.get_run(run_id).state == "PASSED"


def test_a_claim_whose_answer_was_lost_is_found_taken_and_run(node, med, wire):
    """design.md §9 "A lost answer": the claim committed, its answer never came. No poll offers
    the step again (it is not PENDING); the node reads the run, finds the step CLAIMED under its
    own instance, and runs it — else the run would stay RUNNING while the node advertises."""
    node.tick()
    run_id = med.submit(contract({"name": "s", "with": {"cmd": "echo ran"}})).run.run_id
    wire.take()
    wire.lose_answer_next(r"POST /v1/runs/.*/claim")
    assert node.tick() is False
    step = med.get_run(run_id).steps[0]
    assert (step.state, step.instance, step.attempt) == ("CLAIMED", node.instance, 1)
    assert med.work("n1") == []  # the gap: nothing offers it again
    assert node.tick() is True
    assert wire.take() == [
        "GET /v1/nodes/n1/work",
        f"POST /v1/runs/{run_id}/steps/0/claim",  # committed, answer lost
        f"GET /v1/runs/{run_id}",  # first thing in the next tick: was it taken?
        f"POST /v1/runs/{run_id}/steps/0/result",  # attempt 1, the claim's own
    ]
    run = med.get_run(run_id)
    assert (run.state, run.steps[0].attempt) == ("PASSED", 1)
    assert med.list_nodes().nodes[0].lease is None
    assert node.tick() is False
    assert wire.take() == ["GET /v1/nodes/n1/work"]  # settled: no second look


def test_a_step_claimed_under_another_instance_is_not_run_by_this_one(node, med, wire):
    """Only a step CLAIMED under this daemon's own instance is its own after a lost answer: one
    another instance of the node id holds (a second daemon started with the same id) is left
    alone — running it would run the step twice."""
    node.tick()
    run_id = med.submit(contract({"name": "s"})).run.run_id
    wire.lose_answer_next(r"POST /v1/runs/.*/claim")
    node.tick()
    with med.store.autocommit() as tx:  # the other daemon's claim, in place of this one's
        tx.conn.execute("UPDATE steps SET instance = 'another' WHERE run_id = %s", (run_id,))
    wire.take()
    assert node.tick() is False
    assert wire.take() == [f"GET /v1/runs/{run_id}", "GET /v1/nodes/n1/work"]
    step = med.get_run(run_id).steps[0]
    assert (step.state, step.instance) == ("CLAIMED", "another")


def test_a_claim_that_never_arrived_is_claimed_again_from_the_next_poll(node, med, wire):
    node.tick()
    run_id = med.submit(contract({"name": "s"})).run.run_id
    wire.take()
    wire.drop_next(r"POST /v1/runs/.*/claim")
    assert node.tick() is False
    assert med.get_run(run_id).steps[0].state == "PENDING"
    assert node.tick() is True
    assert wire.take() == [
        "GET /v1/nodes/n1/work",
        f"POST /v1/runs/{run_id}/steps/0/claim",  # never arrived
        f"GET /v1/runs/{run_id}",  # PENDING: not taken
        "GET /v1/nodes/n1/work",
        f"POST /v1/runs/{run_id}/steps/0/claim",
        f"POST /v1/runs/{run_id}/steps/0/result",
    ]
    assert med.get_run(run_id).state == "PASSED"


def test_a_lost_claim_of_a_run_cancelled_meanwhile_is_reported_unrun_and_frees_the_node(
    url, med, wire, clock
):
    """The run ended while the claim's answer was lost: the node keeps its lease (I2's
    exception) until the step's result, so the step is reported at once, without running."""
    ran: list[str] = []

    def work(with_: Any, ctx: Any) -> Outcome:
        ran.append(ctx.run_id)
        return Outcome("pass", "")

    with Client(url, transport=wire) as client:
        node = Daemon(client, "n1", BOARD, actions={"work": work}, clock=clock, sleep=clock.sleep)
        node.tick()
        run_id = med.submit(contract({"name": "w", "uses": "work"})).run.run_id
        wire.lose_answer_next(r"POST /v1/runs/.*/claim")
        assert node.tick() is False
        med.cancel(run_id)
        assert med.list_nodes().nodes[0].lease is not None  # kept for the CLAIMED step
        wire.take()
        assert node.tick() is False
        assert wire.take() == [
            f"GET /v1/runs/{run_id}",
            f"POST /v1/runs/{run_id}/steps/0/result",  # answered 409 run_ended
            "GET /v1/nodes/n1/work",
        ]
    assert ran == []
    assert med.list_nodes().nodes[0].lease is None
    run = med.get_run(run_id)
    assert (run.state, run.verdict, run.steps[0].state) == ("FAILED", "cancelled", "FAILED")


def test_a_claim_check_without_an_answer_is_asked_again(node, med, wire):
    node.tick()
    run_id = med.submit(contract({"name": "s"})).run.run_id
    wire.lose_answer_next(r"POST /v1/runs/.*/claim")
    node.tick()
    wire.take()
    wire.drop_next(r"GET /v1/runs/.*")
    assert node.tick() is False
    assert node.tick() is True
    assert wire.take() == [
        f"GET /v1/runs/{run_id}",  # no answer
        f"GET /v1/runs/{run_id}",
        f"POST /v1/runs/{run_id}/steps/0/result",
    ]
    assert med.get_run(run_id).state == "PASSED"


def test_a_server_that_is_down_is_retried_and_logged_once(clock, caplog):
    caplog.set_level(logging.INFO, "mediator.enode")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}") as client:
        node = Daemon(client, "n1", BOARD, clock=clock, sleep=clock.sleep)
        assert node.tick() is False
        clock.now += 1.0
        assert node.tick() is False
    assert not node.finished
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        f"advert failed: cannot reach the Mediator at http://127.0.0.1:{port}"
    )


def test_a_node_the_server_refuses_for_good_exits_1(serve, tmp_path, clock):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[token]]\ntoken = "tn1-0123456789abcdef"\nprincipal = "lab"\nrole = "node"\n'
    )
    tokens.chmod(0o600)  # a tokens file must be private (docs/security.md)
    url = serve(Tokens.load(str(tokens)))
    with Client(url, token="wrong") as client:
        node = Daemon(client, "n1", BOARD, clock=clock, sleep=clock.sleep)
        with pytest.raises(DaemonError, match="the Mediator refused node n1: 401 unauthorized"):
            node.tick()
        assert node.finished
    with Client(url, token="wrong") as client:
        assert Daemon(client, "n1", BOARD, clock=clock, sleep=clock.sleep).run() == 1
    with Client(url, token="tn1-0123456789abcdef") as client:
        assert Daemon(client, "n1", BOARD, clock=clock, sleep=clock.sleep).tick() is False


# ---- drain and stop ---------------------------------------------------------------------------


def test_stop_drains_gracefully_and_finishes_the_held_run_first(node, med):
    node.tick()
    first = med.submit(
        contract({"name": "a", "with": {"cmd": "true"}}, {"name": "b", "after": ["a"]})
    ).run.run_id
    assert node.tick() is True  # step a
    node.stop()  # SIGTERM
    waiting = med.submit(contract({"name": "c"})).run
    assert waiting.state == "QUEUED"  # the node is busy with the first run
    assert node.tick() is True  # step b: the held run finishes
    assert med.get_run(first).state == "PASSED"
    assert med.list_nodes().nodes[0].drain == "graceful"
    assert node.tick() is False
    assert node.finished
    assert med.get_run(waiting.run_id).state == "QUEUED"  # drained: no new run started here


def test_a_second_stop_ends_after_the_current_step(node, med):
    node.tick()
    run_id = med.submit(
        contract({"name": "a", "with": {"cmd": "true"}}, {"name": "b", "after": ["a"]})
    ).run.run_id
    node.tick()
    node.stop()
    node.stop()
    assert node.tick() is False
    assert node.finished
    assert [s.state for s in med.get_run(run_id).steps] == ["PASSED", "PENDING"]


def test_a_stop_with_nothing_held_ends_at_the_next_tick(node, med):
    node.tick()
    node.stop()
    assert node.tick() is False
    assert node.finished
    assert med.list_nodes().nodes[0].drain == "graceful"


def test_a_stop_while_an_advert_is_in_flight_is_advertised_next(node, wire):
    """SIGTERM lands while the main thread waits for an advert's answer (a real race: found
    by the process test). The drain it asks for must not be lost when that answer arrives."""
    wire.meanwhile = lambda what: node.stop() if what == "POST /v1/nodes" else None
    node.tick()
    wire.meanwhile = lambda what: None
    assert wire.take() == ["POST /v1/nodes"]  # the draining advert is not known yet: no poll
    node.tick()
    assert wire.take() == ["POST /v1/nodes", "GET /v1/nodes"]
    assert node.finished


def test_run_loops_until_stopped_and_exits_0(url, clock):
    with Client(url) as client:
        node = Daemon(client, "n1", BOARD, clock=clock, sleep=lambda s: node.stop())
        assert node.run() == 0


def test_the_drain_file_and_set_drain_change_the_advertised_policy(url, med, tmp_path, clock):
    policy = tmp_path / "drain"

    def drain() -> str:
        return med.list_nodes().nodes[0].drain

    with Client(url) as client:
        node = Daemon(client, "n1", BOARD, drain_file=policy, clock=clock, sleep=clock.sleep)
        node.tick()
        assert drain() == ""
        run_id = med.submit(contract({"name": "a"})).run.run_id
        policy.write_text("at-boundary\n")
        node.tick()
        assert drain() == "at-boundary"
        # at-boundary with no step CLAIMED: the server ends the held run at once (§7.5)
        assert (med.get_run(run_id).state, med.get_run(run_id).verdict) == ("FAILED", "drained")
        node.set_drain("graceful")  # SIGUSR1
        node.tick()
        assert drain() == "graceful"  # the file has not changed since, so the signal holds
        policy.unlink()
        node.tick()
        assert drain() == ""  # back to the start policy
        policy.write_text("sideways")
        node.tick()
        assert drain() == ""  # not a policy: ignored (and logged)
