"""``/v1/events`` delivers every committed event exactly once, in (tx, id) order, with the
transaction id compared as a number (docs/design.md §19 route 14; issue 24).

The reader's order is xid8's. Text order agrees with it until transaction ids change length:
``'10000' < '9999'``. So the test drives the cluster's transaction counter across a power of ten
while writers race, one transaction stays open and holds the horizon back, and some writers roll
back. A model — the committed events, sorted by (transaction id as a number, id) — says what every
reader must see; the readers are the store's ``events_since`` paged small while the writes happen,
two live SSE streams of the real server, and a ``Last-Event-ID: 0`` replay afterwards. Each must
deliver exactly the model's ids, in the model's order: nothing skipped, nothing twice.

On the old query (``ORDER BY tx`` meaning the text column) the store reader skips events, and the
streams skip some and repeat others.
"""

from __future__ import annotations

import random
import re
import socket
import threading
import time
from typing import Any

import httpx
import psycopg
import pytest

from mediator import Config
from mediator.api import events as events_mod
from tests.db.test_event_streams import Stream, port_of

INSERT = "INSERT INTO events (at, run_id, kind) VALUES (now(), %s, 'submitted') RETURNING id"
MARGIN = 60  # transaction ids left below the power of ten when the writers start
DEADLINE_S = 60.0


@pytest.fixture
def config() -> Config:
    return Config(events_keepalive_seconds=0.5)


def current_xid(conn: psycopg.Connection[Any]) -> int:
    """The next transaction id, roughly: this autocommit statement takes one and ends."""
    row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
    assert row is not None
    return int(row[0])


def burn_to(conn: psycopg.Connection[Any], target: int) -> int:
    """Use up transaction ids until the counter is just below ``target``: each subtransaction
    that writes takes an id of its own, so one DO block burns thousands (a temporary table, so
    nothing is left behind). Returns the counter's value."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS burn (x int)")
    while True:
        now = current_xid(conn)
        left = target - now - 1
        if left <= 0:
            return now
        conn.execute(
            f"""DO $$ BEGIN
                  FOR i IN 1..{min(left, 200_000)} LOOP
                    BEGIN INSERT INTO burn VALUES (i); EXCEPTION WHEN others THEN NULL; END;
                  END LOOP;
                END $$"""
        )
        conn.execute("TRUNCATE burn")


def next_boundary(xid: int) -> int:
    """The first power of ten far enough above ``xid`` to start the writers below it."""
    power = 10
    while power - MARGIN <= xid + 10:
        power *= 10
    return power


def sse_ids(data: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"^id: (\d+)$", data, re.M)]


def test_every_committed_event_reaches_every_reader_once_in_numeric_tx_order(
    serve, med, monkeypatch
):
    # Small pages and buffer, so readers page many times and a stream falls behind the buffer.
    monkeypatch.setattr(events_mod, "PAGE", 5)
    monkeypatch.setattr(events_mod, "BUFFER", 8)
    rng = random.Random(24)
    url = serve()
    port = port_of(url)
    live = [Stream(port), Stream(port)]
    try:
        for s in live:
            s.read_until(b": connected\n\n")  # both start from now: before the first event

        with psycopg.connect(med.database_url, autocommit=True) as admin:
            boundary = next_boundary(current_xid(admin))
            burn_to(admin, boundary - MARGIN)

        # The store-level reader pages through events_since while the writes happen.
        store_seen: list[int] = []
        writing_done = threading.Event()
        reader_error: list[BaseException] = []

        def store_reader() -> None:
            place = (0, 0)
            try:
                while True:
                    with med.store.tx() as tx:
                        rows = tx.events_since(place[0], place[1], 3)
                    for tx_id, event in rows:
                        store_seen.append(event.id)
                        place = (tx_id, event.id)
                    if not rows:
                        if writing_done.is_set():
                            return
                        writing_done.wait(0.005)  # a poll's pause, not a synchronisation
            except BaseException as e:  # reported by the test thread
                reader_error.append(e)

        # The long-open transaction: takes its id below the boundary, writes, and stays open
        # while the others cross it, so no reader may pass it until it commits.
        hold = psycopg.connect(med.database_url)
        hold.execute(INSERT, ("hold",))

        def writer(k: int, seed: int) -> None:
            r = random.Random(seed)
            with psycopg.connect(med.database_url) as conn:
                for j in range(12):
                    for m in range(r.randint(1, 3)):
                        conn.execute(INSERT, (f"w{k}-{j}-{m}",))
                    if r.random() < 0.2:
                        conn.rollback()  # never delivered
                    else:
                        conn.commit()
                    for _ in range(r.randint(0, 4)):  # burn ids between writes: cross the power
                        conn.execute("SELECT pg_current_xact_id()")
                        conn.commit()

        reader = threading.Thread(target=store_reader)
        reader.start()
        writers = [
            threading.Thread(target=writer, args=(k, rng.randrange(1 << 30))) for k in range(4)
        ]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        hold.commit()
        hold.close()
        with psycopg.connect(med.database_url, autocommit=True) as conn:
            for i in range(10):  # a few more, well past the power of ten
                conn.execute(INSERT, (f"after-{i}",))
            rows = conn.execute("SELECT id, tx::text FROM events").fetchall()
            last = conn.execute(INSERT, ("end",)).fetchone()
        assert last is not None
        writing_done.set()

        # The model: every committed event, in (transaction id as a number, id) order.
        txs = [int(tx) for _, tx in rows]
        assert min(txs) < boundary <= max(txs), "the writes did not cross the power of ten"
        expected = [i for i, _ in sorted(rows, key=lambda r: (int(r[1]), r[0]))]
        assert len(expected) > 50

        # What each reader delivered; every one must be the model's list, then the end marker.
        want = [*expected, last[0]]
        seen: dict[str, Any] = {}
        # Store-level: the reader that paged during the writes, then a fresh one from scratch.
        reader.join(DEADLINE_S)
        assert not reader.is_alive() and not reader_error, reader_error
        seen["events_since, paged during the writes"] = store_seen
        fresh: list[int] = []
        place = (0, 0)
        while True:
            with med.store.tx() as tx:
                page = tx.events_since(place[0], place[1], 7)
            if not page:
                break
            fresh += [e.id for _, e in page]
            place = (page[-1][0], page[-1][1].id)
        seen["events_since, paged afterwards"] = fresh

        # SSE: the two live streams, and a replay from the start after everything committed.
        # Each is read until the end marker, then until it says keepalive, which it does only
        # after keepalive_s with nothing to send — a stream re-sending frames never gets there.
        replay = ReplayStream(port, last_event_id=0)
        for name, s in [("SSE live 1", live[0]), ("SSE live 2", live[1]), ("replay", replay)]:
            try:
                s.read_until(f"id: {last[0]}\n".encode(), timeout=DEADLINE_S)
                read_past(s, len(s.data), b": keepalive\n\n")
                seen[name] = sse_ids(s.data)
            except (AssertionError, ConnectionError) as e:
                seen[name] = f"{len(sse_ids(s.data))} frames, no end: {e}"[:200]
        assert seen == dict.fromkeys(seen, want)
        # The bound's counter exists and, the order holding, never counted a row.
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert re.search(r"^mediator_event_rows_out_of_order_total 0\.0$", metrics, re.M)
        replay.close()
    finally:
        for s in live:
            s.close()


class ReplayStream(Stream):
    """A stream that resumes after ``Last-Event-ID`` (0: from the very first event)."""

    def __init__(self, port: int, last_event_id: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(
            b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
            + f"Last-Event-ID: {last_event_id}\r\n\r\n".encode()
        )
        self.data = b""


def read_past(s: Stream, offset: int, marker: bytes) -> None:
    """Read until ``marker`` appears at or after ``offset`` of what the stream has sent."""
    deadline = time.monotonic() + DEADLINE_S
    while marker not in s.data[offset:]:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {marker!r} within {DEADLINE_S} s: {s.data[-300:]!r}")
        chunk = s.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before {marker!r}")
        s.data += chunk
