"""``GET /v1/events`` under attack (issue 11 §2): idle streams hold no worker thread, say
``: keepalive`` on time, are released when their client vanishes, and are capped in total and per
principal (503 with Retry-After) — while the rest of the API keeps answering.

Every test runs the real app in a real uvicorn on a loopback port (the ``serve`` fixture) on the
real database. Streams are raw sockets, so a test can hold hundreds cheaply and can kill one the
way a crashed browser does (RST, no close handshake). "Released" is observed through the
``mediator_event_streams`` gauge of ``/metrics``, polled with a deadline — never a sleep.
"""

from __future__ import annotations

import re
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from mediator import Config
from mediator.api.auth import Tokens
from tests.db.conftest import contract

KEEPALIVE = 0.5  # seconds; production default 15 (docs/security.md "Event streams")
IDLE_STREAMS = 200


@pytest.fixture
def config() -> Config:
    # Overrides tests/db/conftest.py's: short keepalive, caps above the 200 of the idle test.
    return Config(
        events_keepalive_seconds=KEEPALIVE,
        events_max_streams=IDLE_STREAMS + 50,
        events_max_streams_per_principal=IDLE_STREAMS + 50,
    )


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


class Stream:
    """One SSE client on a raw socket."""

    def __init__(self, port: int, token: str | None = None, query: str = "") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.sock.sendall(
            f"GET /v1/events{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
            f"{auth}\r\n".encode()
        )
        self.data = b""

    def read_until(self, marker: bytes, timeout: float = 30.0) -> bytes:
        # A deadline of its own: keepalives keep recv from ever timing out on a live stream.
        deadline = time.monotonic() + timeout
        while marker not in self.data:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {marker!r} within {timeout} s: {self.data[-300:]!r}")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed before {marker!r}: {self.data!r}")
            self.data += chunk
        return self.data

    def read_some(self) -> bytes:
        """What has arrived so far, waiting at most a moment for more (a poll, not a sync)."""
        self.sock.settimeout(0.05)
        try:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed: {self.data!r}")
            self.data += chunk
        except TimeoutError:
            pass
        finally:
            self.sock.settimeout(10)
        return self.data

    def status(self) -> int:
        head = self.read_until(b"\r\n")
        return int(head.split(b" ", 2)[1])

    def kill(self) -> None:
        """Vanish the way a crashed client does: RST, no close handshake."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def streams() -> Iterator[list[Stream]]:
    held: list[Stream] = []
    yield held
    for s in held:
        s.close()


def open_streams(port: int, n: int, held: list[Stream], token: str | None = None) -> list[Stream]:
    new = [Stream(port, token) for _ in range(n)]
    held.extend(new)
    for s in new:
        s.read_until(b": connected\n\n")  # admitted and streaming
    return new


def gauge(http: httpx.Client) -> int:
    text = http.get("/metrics").text
    m = re.search(r"^mediator_event_streams (\S+)$", text, re.M)
    assert m, "no mediator_event_streams gauge in /metrics"
    return int(float(m.group(1)))


def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s (last: {value!r})")
        time.sleep(0.05)


# ---- the API keeps answering --------------------------------------------------------------------
def test_two_hundred_idle_streams_leave_healthz_and_the_run_list_answering(serve, streams, med):
    # issue 11 §2: 45 idle streams used to hang every route; 200 must not.
    url = serve()
    med.advert("X", {"board": "x"}, "i1")
    med.submit(contract("a"))
    open_streams(port_of(url), IDLE_STREAMS, streams)
    with httpx.Client(base_url=url, timeout=10) as http:
        assert gauge(http) == IDLE_STREAMS
        for _ in range(20):
            assert http.get("/healthz").status_code == 200
            runs = http.get("/v1/runs")
            assert runs.status_code == 200 and runs.json()["runs"][0]["run_id"] == "a"
        # A commit reaches every idle stream (one shared LISTEN, fanned out in the process).
        med.submit(contract("b"))
        for s in streams:
            s.read_until(b'"run_id": "b"')


def test_an_idle_stream_says_keepalive_and_a_live_one_gets_events(serve, streams, med):
    url = serve()
    (idle,) = open_streams(port_of(url), 1, streams)
    idle.read_until(b": keepalive\n\n")  # nothing happened, the comment came anyway
    med.advert("X", {"board": "x"}, "i1")
    med.submit(contract("a"))
    idle.read_until(b"event: submitted\n")
    idle.read_until(b"event: lease_granted\n")


# ---- vanished clients ----------------------------------------------------------------------
def test_clients_that_vanish_without_closing_are_released_within_a_keepalive(serve, streams):
    url = serve()
    held = open_streams(port_of(url), 30, streams)
    with httpx.Client(base_url=url, timeout=10) as http:
        assert gauge(http) == 30
        for s in held[:20]:
            s.kill()  # RST: the browser crashed
        for s in held[20:25]:
            s.close()  # FIN without reading on
        eventually(lambda: gauge(http) == 5, timeout=10 * KEEPALIVE)
        assert http.get("/v1/runs").status_code == 200


# ---- caps ------------------------------------------------------------------------------------
TOKENS = {
    "ta-0123456789abcdef": "alice",
    "tb-0123456789abcdef": "bob",
    "tc-0123456789abcdef": "carol",
}


@pytest.fixture
def tokens(tmp_path: Any) -> Tokens:
    p = tmp_path / "tokens.toml"
    p.write_text(
        "".join(
            f'[[token]]\ntoken = "{t}"\nprincipal = "{name}"\nrole = "client"\n'
            for t, name in TOKENS.items()
        )
    )
    p.chmod(0o600)  # a tokens file must be private (docs/security.md)
    return Tokens.load(str(p))


class TestCaps:
    @pytest.fixture
    def config(self) -> Config:
        return Config(
            events_keepalive_seconds=KEEPALIVE,
            events_max_streams=10,
            events_max_streams_per_principal=4,
        )

    def test_the_caps_answer_503_with_retry_after_and_ten_times_the_cap_is_refused_cleanly(
        self, serve, streams, tokens
    ):
        url = serve(tokens)
        port = port_of(url)
        admitted = open_streams(port, 4, streams, "ta-0123456789abcdef")
        fifth = Stream(port, "ta-0123456789abcdef")
        streams.append(fifth)
        assert fifth.status() == 503  # per principal: alice holds her 4
        head = fifth.read_until(b"}")
        assert b"retry-after: 10" in head.lower()
        assert b'"too_many_streams"' in head and b"4 event streams" in head

        admitted += open_streams(port, 4, streams, "tb-0123456789abcdef")
        admitted += open_streams(
            port, 2, streams, "tc-0123456789abcdef"
        )  # 10 in all: the total cap
        over = Stream(port, "tc-0123456789abcdef")
        streams.append(over)
        assert over.status() == 503
        assert b"10 event streams" in over.read_until(b"}")

        # 10x the cap: every one refused cleanly, and the API still answers.
        refused = [Stream(port, list(TOKENS)[i % 3]) for i in range(100)]
        streams.extend(refused)
        assert [s.status() for s in refused] == [503] * 100
        with httpx.Client(
            base_url=url, timeout=10, headers={"Authorization": "Bearer ta-0123456789abcdef"}
        ) as http:
            assert http.get("/v1/runs").status_code == 200
            assert gauge(http) == 10
            for s in admitted:
                s.close()
            eventually(lambda: gauge(http) == 0, timeout=10 * KEEPALIVE)
        open_streams(port, 4, streams, "ta-0123456789abcdef")  # the places came back


# ---- replay, then live: no event skipped or repeated -----------------------------------------
def test_a_replay_from_an_old_id_hands_over_to_the_live_buffer_without_gaps(
    serve, streams, med, monkeypatch
):
    # Tiny pages and buffer, so the replay reads the table in several pages and the shared
    # buffer has already dropped the oldest rows when the late stream starts.
    monkeypatch.setattr("mediator.api.events.PAGE", 3)
    monkeypatch.setattr("mediator.api.events.BUFFER", 4)
    url = serve()
    port = port_of(url)
    (early,) = open_streams(port, 1, streams)  # starts the pump
    med.advert("X", {"board": "x"}, "i1")
    for i in range(6):
        med.submit(contract(f"r{i}"))  # RUNNING, then QUEUED behind it
    with med.store.tx() as tx:
        last = tx.last_event_id()
    early.read_until(f"id: {last}\n".encode())  # the buffer has moved past the first rows
    late = Stream(port, query="?after=1")
    streams.append(late)
    late.read_until(f"id: {last}\n".encode())
    med.submit(contract("live"))
    late.read_until(b'"run_id": "live"')
    ids = [int(m) for m in re.findall(rb"^id: (\d+)$", late.data, re.M)]
    assert ids == list(range(2, ids[-1] + 1))  # every id after 1, once, in order


# ---- an event that commits after a bigger id is not skipped (issue 13 §6) ----------------------
def test_an_event_whose_smaller_id_commits_later_still_reaches_a_stream(serve, streams, med):
    # Two writers race. B takes its transaction id first; A then inserts event "early" (the smaller
    # event id, the bigger transaction id); B inserts "late" and commits while A is still open. A
    # stream that reads by id alone sends "late", moves past it, and never sees "early" once A
    # commits. Streams read in (tx, id) order below the oldest open transaction instead.
    import psycopg

    url = serve()
    (stream,) = open_streams(port_of(url), 1, streams)
    insert = "INSERT INTO events (at, run_id, kind) VALUES (now(), %s, 'submitted') RETURNING id"
    with (
        psycopg.connect(med.database_url) as a,
        psycopg.connect(med.database_url) as b,
    ):
        b.execute("SELECT pg_current_xact_id()")  # B's transaction id is the older one
        early = a.execute(insert, ("early",)).fetchone()
        late = b.execute(insert, ("late",)).fetchone()
        assert early is not None and late is not None and early[0] < late[0]
        b.commit()  # NOTIFY: the pump reads now, while A is still open
        keepalives = stream.data.count(b": keepalive")
        # Either the stream sent "late" (reading by id) or held it back (reading below the
        # horizon) and said keepalive at least once since: the pump has read while A was open.
        eventually(
            lambda: (
                b'"run_id": "late"' in stream.read_some()
                or stream.data.count(b": keepalive") > keepalives
            )
        )
        a.commit()
    stream.read_until(b'"run_id": "early"')
    stream.read_until(b'"run_id": "late"')
    frames = re.findall(rb'"run_id": "(early|late)"', stream.data)
    assert sorted(frames) == [b"early", b"late"]  # each once
