"""Held work polls — ``GET /v1/nodes/{node_id}/work?wait=S`` (docs/design.md §19 "The wake of a
waiting node", docs/security.md "Held work polls").

An idle node asks once and the server holds the answer until the node may have a step; the answer
is always the plain poll's. Every test runs the real app in a real uvicorn on a loopback port, on
the real database; polls are raw sockets so a test can hold many and drop them as a crashed node
does. How a held poll ended is read from ``mediator_work_polls_total{answer}`` on ``/metrics`` —
``woken`` (a wake found work) against ``waited`` (the wait ran out) — never from elapsed time.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio.to_thread
import httpx
import pytest
import uvicorn

from mediator import Config, Mediator
from mediator.api import create_app
from mediator.api.auth import Tokens
from mediator.client import Client
from mediator.enode.daemon import Daemon
from tests.db.conftest import contract
from tests.db.test_event_streams import eventually

BOARD = {"board": "x"}


@pytest.fixture
def config() -> Config:
    return Config(work_max_waits=4, work_max_waits_per_principal=2)


@pytest.fixture
def start(med: Mediator) -> Iterator[Callable[..., tuple[str, Any]]]:
    """``start(tokens=None, wrap=None) -> (url, app)``: tests/db/conftest.py's ``serve``, with the
    app at hand (its held polls, its feed) and an optional ASGI wrapper around it."""
    running: list[tuple[Any, uvicorn.Server, threading.Thread, socket.socket]] = []

    def run(tokens: Tokens | None = None, wrap: Any = None) -> tuple[str, Any]:
        app = create_app(med, tokens)
        sock = socket.create_server(("127.0.0.1", 0))
        server = uvicorn.Server(
            uvicorn.Config(wrap(app) if wrap else app, log_level="warning", lifespan="on")
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        running.append((app, server, thread, sock))
        return f"http://127.0.0.1:{sock.getsockname()[1]}", app

    yield run
    for app, server, thread, sock in running:
        app.state.feed.stop()  # as `mediator serve` does first: held polls end at once
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


class Poll:
    """One work poll on a raw socket: sent at once, its answer read when the test asks."""

    def __init__(self, url: str, node_id: str, query: str = "?wait=25", token: str = "") -> None:
        self.sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=60)
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        head = f"GET /v1/nodes/{node_id}/work{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n"
        self.sock.sendall(head.encode())

    def answer(self) -> tuple[int, dict[str, str], Any]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            assert chunk, f"connection closed before an answer: {data!r}"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        while len(body) < int(headers["content-length"]):
            body += self.sock.recv(65536)
        return int(lines[0].split()[1]), headers, json.loads(body)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def polls() -> Iterator[list[Poll]]:
    held: list[Poll] = []
    yield held
    for p in held:
        p.close()


def metric(url: str, name: str, label: str = "") -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    pattern = rf"^{name}{re.escape(label)} (\S+)$" if label else rf"^{name} (\S+)$"
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0


def held(url: str) -> int:
    return int(metric(url, "mediator_work_polls_held"))


def answered(url: str, how: str) -> int:
    return int(metric(url, "mediator_work_polls_total", f'{{answer="{how}"}}'))


# ---- the wake ---------------------------------------------------------------------------------
def test_a_held_poll_is_answered_by_the_wake_when_a_run_for_its_node_starts(
    start: Any, med: Mediator, polls: list[Poll]
) -> None:
    url, _ = start()
    med.advert("X", BOARD, "i1")
    poll = Poll(url, "X")
    polls.append(poll)
    eventually(lambda: held(url) == 1)  # held: X has nothing to claim
    med.submit(contract("a"))  # leases X: its step becomes claimable
    status, headers, body = poll.answer()
    assert status == 200
    assert [(s["run_id"], s["state"]) for s in body["steps"]] == [("a", "PENDING")]
    assert headers["x-mediator-wait"] == "25"
    # The wake answered it, not the end of its wait; and the answer is the plain poll's.
    assert (answered(url, "woken"), answered(url, "waited")) == (1, 0)
    assert body == httpx.get(f"{url}/v1/nodes/X/work", timeout=10).json()
    assert held(url) == 0


def test_a_change_for_another_node_leaves_the_poll_held(
    start: Any, med: Mediator, polls: list[Poll]
) -> None:
    """One wake check for all held polls; only the nodes it finds work for are answered."""
    url, _ = start()
    med.advert("X", BOARD, "i1")
    med.advert("Y", {"board": "y"}, "i1")
    px, py = Poll(url, "X"), Poll(url, "Y")
    polls += [px, py]
    eventually(lambda: held(url) == 2)
    med.submit(contract("for-y", dut={"board": "y"}))
    assert [s["run_id"] for s in py.answer()[2]["steps"]] == ["for-y"]
    assert held(url) == 1  # X still held: the run was not for it
    med.submit(contract("for-x"))
    assert [s["run_id"] for s in px.answer()[2]["steps"]] == ["for-x"]
    assert answered(url, "woken") == 2


def test_a_change_committed_between_the_read_and_the_wait_still_wakes_the_poll(
    start: Any, med: Mediator, polls: list[Poll]
) -> None:
    """The check-then-wait race: the poll registers before it reads, so a commit that lands
    after its (empty) read and whose NOTIFY is fully handled before the poll starts waiting
    still answers it. The interleaving is forced with the ``after_read`` hook: the submit
    commits, the NOTIFY is heard and the wake check has finished — all before the wait."""
    url, app = start()
    waits, feed = app.state.waits, app.state.feed
    med.advert("X", BOARD, "i1")
    # Listening first (the listener reports its start as a change), so the submit's NOTIFY is
    # heard for certain.
    warm = Poll(url, "W")
    polls.append(warm)
    eventually(lambda: waits.heard >= 1)

    async def submit_between_read_and_wait(node_id: str) -> None:
        if node_id != "X":
            return
        heard = asyncio.Event()
        feed.subscribe(heard.set)  # after the waits' own subscriber: its check is started
        await anyio.to_thread.run_sync(med.submit, contract("raced"))
        await heard.wait()
        await waits.settled()

    waits.after_read = submit_between_read_and_wait
    poll = Poll(url, "X")
    polls.append(poll)
    assert [s["run_id"] for s in poll.answer()[2]["steps"]] == ["raced"]
    assert (answered(url, "woken"), answered(url, "waited")) == (1, 0)


# ---- limits (docs/security.md "Held work polls") -----------------------------------------------
NODE_TOKENS = {
    "tna-0123456789abcdef": "alice",
    "tnb-0123456789abcdef": "bob",
    "tnc-0123456789abcdef": "carol",
}


@pytest.fixture
def tokens(tmp_path: Any) -> Tokens:
    p = tmp_path / "tokens.toml"
    p.write_text(
        "".join(
            f'[[token]]\ntoken = "{t}"\nprincipal = "{name}"\nrole = "node"\n'
            for t, name in NODE_TOKENS.items()
        )
    )
    p.chmod(0o600)
    return Tokens.load(str(p))


def test_held_polls_are_capped_per_principal_and_in_total_and_ten_times_the_cap_answers_at_once(
    start: Any, tokens: Tokens, polls: list[Poll]
) -> None:
    """Caps 2 per principal, 4 in all (the fixture's config). A poll past a cap is the plain
    poll, answered at once with ``X-Mediator-Wait: 0`` — never refused; a client that leaves
    frees its place."""
    url, _ = start(tokens)
    ta, tb, tc = NODE_TOKENS
    for token, node in ((ta, "a1"), (tb, "b1"), (tc, "c1")):
        with Client(url, token) as c:
            c.advert(node, BOARD, "i1")

    def hold(token: str, node: str, expect: int) -> Poll:
        p = Poll(url, node, token=token)
        polls.append(p)
        eventually(lambda: held(url) == expect)
        return p

    def at_once(token: str, node: str) -> None:
        p = Poll(url, node, token=token)
        polls.append(p)
        status, headers, body = p.answer()
        assert (status, headers["x-mediator-wait"], body) == (200, "0", {"steps": []})

    kept = [hold(ta, "a1", 1), hold(ta, "a1", 2)]
    at_once(ta, "a1")  # alice holds her 2
    kept += [hold(tb, "b1", 3), hold(tb, "b1", 4)]
    at_once(tc, "c1")  # 4 in all: the total cap
    for i in range(40):  # 10x the total cap: every one answered, at once, as the plain poll
        token, node = list(zip(NODE_TOKENS, ("a1", "b1", "c1"), strict=True))[i % 3]
        at_once(token, node)
    assert held(url) == 4
    assert answered(url, "not_held") == 42
    with httpx.Client(base_url=url, timeout=10, headers={"Authorization": f"Bearer {ta}"}) as h:
        assert h.get("/v1/nodes/a1/work").json() == {"steps": []}  # plain polls still answer
    for p in kept:
        p.close()  # the nodes went away mid-poll
    eventually(lambda: held(url) == 0)
    assert answered(url, "gone") == 4
    hold(tc, "c1", 1)  # the places came back


@pytest.mark.parametrize("wait", ["abc", "-1", "nan", "inf", "1e999", "", "2.5s"])
def test_a_wait_that_is_not_a_number_of_seconds_is_400_naming_it(
    start: Any, med: Mediator, wait: str
) -> None:
    url, _ = start()
    med.advert("X", BOARD, "i1")
    r = httpx.get(f"{url}/v1/nodes/X/work", params={"wait": wait}, timeout=10)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["field"]) == ("invalid_request", "wait")


def test_a_wait_past_the_servers_limit_is_capped_and_a_node_with_work_is_answered_at_once(
    start: Any, med: Mediator
) -> None:
    url, _ = start()
    med.advert("X", BOARD, "i1")
    med.submit(contract("a"))
    r = httpx.get(f"{url}/v1/nodes/X/work", params={"wait": "1e300"}, timeout=10)
    assert r.status_code == 200
    assert r.headers["x-mediator-wait"] == "25"  # work_wait_max_seconds
    assert [s["run_id"] for s in r.json()["steps"]] == ["a"]
    assert answered(url, "ready") == 1
    plain = httpx.get(f"{url}/v1/nodes/X/work", timeout=10)
    assert "x-mediator-wait" not in plain.headers and plain.json() == r.json()


def test_the_servers_stop_answers_held_polls_at_once_and_holds_no_new_one(
    start: Any, med: Mediator, polls: list[Poll]
) -> None:
    """What SIGINT/SIGTERM do first in ``mediator serve`` (feed.stop): shutdown must not wait
    out held polls."""
    url, app = start()
    med.advert("X", BOARD, "i1")
    poll = Poll(url, "X")
    polls.append(poll)
    eventually(lambda: held(url) == 1)
    app.state.feed.stop()
    assert poll.answer()[:3:2] == (200, {"steps": []})
    assert answered(url, "stopped") == 1
    late = Poll(url, "X")
    polls.append(late)
    assert late.answer()[1]["x-mediator-wait"] == "0"


# ---- the node daemon ------------------------------------------------------------------------
class IgnoresWait:
    """The real app behind a shim that drops ``wait`` from every query: a Mediator from before
    long polls, as a node meets it. Counts the polls that asked for a wait."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state = app.state
        self.asked = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and b"wait=" in scope.get("query_string", b""):
            self.asked += 1
            scope = {**scope, "query_string": b""}
        await self.app(scope, receive, send)


def test_the_daemon_polls_at_its_own_pace_against_a_server_that_ignores_wait(
    start: Any, med: Mediator
) -> None:
    shim: list[IgnoresWait] = []
    url, _ = start(wrap=lambda app: shim.append(IgnoresWait(app)) or shim[0])
    idles: list[float] = []

    def idle(seconds: float) -> None:
        idles.append(seconds)
        if len(idles) == 3:
            node.stop()

    with Client(url) as client:
        node = Daemon(client, "n1", BOARD, poll_seconds=0.7, long_poll=20, sleep=idle)
        assert node.run() == 0
    assert shim[0].asked >= 3  # it asked for a wait each time...
    assert idles[:3] == [0.7, 0.7, 0.7]  # ...and, not held, waited its own poll interval


def test_the_daemon_asks_again_at_once_when_the_server_held_its_poll(start: Any, med: Mediator):
    url, app = start()
    app.state.waits.max_wait_s = 0.2  # a short hold, so the test needs no long one
    idles: list[float] = []

    def idle(seconds: float) -> None:
        idles.append(seconds)
        if len(idles) == 3:
            node.stop()

    with Client(url) as client:
        node = Daemon(client, "n1", BOARD, poll_seconds=0.7, long_poll=20, sleep=idle)
        assert node.run() == 0
    assert idles[:2] == [0.0, 0.0]  # held, then answered empty: the next poll at once
    assert answered(url, "waited") >= 2


def test_a_stop_gives_up_the_held_poll_at_once(start: Any, med: Mediator) -> None:
    """SIGTERM (Daemon.stop, as the signal handler calls it) must not wait out a held poll:
    the poll is dropped (the server counts it ``gone``) and the node stops as it did before."""
    url, _ = start()
    result: list[int] = []
    with Client(url) as client:
        node = Daemon(client, "n1", BOARD, long_poll=25)
        thread = threading.Thread(target=lambda: result.append(node.run()))
        thread.start()
        eventually(lambda: held(url) == 1)
        node.stop()
        thread.join(timeout=60)
    assert result == [0]
    assert answered(url, "gone") == 1  # given up by the node, not waited out


def test_a_drain_file_change_gives_up_the_held_poll_and_is_advertised(
    start: Any, med: Mediator, tmp_path: Any
) -> None:
    url, _ = start()
    policy = tmp_path / "drain"
    result: list[int] = []
    with Client(url) as client:
        node = Daemon(client, "n1", BOARD, long_poll=25, drain_file=policy)
        thread = threading.Thread(target=lambda: result.append(node.run()))
        thread.start()
        try:
            eventually(lambda: held(url) == 1)
            policy.write_text("graceful")
            eventually(lambda: med.list_nodes("", 10).nodes[0].drain == "graceful")
            assert answered(url, "gone") == 1  # given up by the node, not waited out
        finally:
            node.stop()
            thread.join(timeout=60)
    assert result == [0]
