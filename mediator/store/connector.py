"""The connection side of the store: the only module that imports psycopg.

It owns the connection pool, its transactions and the reconnect watcher, runs a named query of
``queries.sql`` on a kept cursor (:class:`Statements`), turns rows into the frozen dataclasses of
``mediator.core.rows`` and driver errors into ``mediator.core.errors`` (procrastinate's connector
pattern), so the query methods (:mod:`mediator.store.tx`), the flows, the API and the simulator
never see a driver type.

Every named query reads time as ``mediator_now(%(now)s)`` and every statement carries the clock's
instant as its ``now`` parameter (docs/design.md §13; NULL without a clock: the server's ``now()``):
that is how the simulator's virtual time reaches SQL without a ``set_config`` round trip of its
own (issue 13). Only ``read_only`` analytics still set ``mediator.now`` for hand-written SQL.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Generic, TypeVar

import orjson
import psycopg
import psycopg.errors
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb, set_json_dumps, set_json_loads
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from mediator.core.errors import MediatorError, NodeTaken, StoreBusy, StoreUnavailable
from mediator.core.states import run_transition, step_transition
from mediator.store.queries import QUERIES, schema_sql

__all__ = [
    "Connector",
    "Jsonb",
    "Statements",
    "admin_execute",
    "check_edges",
    "load_schema",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 10
_SCHEMA_LOCK = 0x6D656469  # advisory lock id: one process loads the schema, the others wait

Clock = Callable[[], datetime]
S = TypeVar("S")


# jsonb in and out with orjson (issue 13: a simulated run loads some 30 jsonb values; orjson is
# several times json's speed, bench/bench_json.py) — but only where it means the same. orjson reads
# an integer beyond 64 bits as a rounded float and writes no integer beyond 64 bits; jsonb keeps
# them exact, so text with a run of 19 digits is read by json, and a value orjson refuses is
# written by json. Everything else reaching jsonb was checked by the contract parser (no NaN,
# no set, no NUL: docs/security.md), where the two agree.
_LONG_DIGITS = re.compile(rb"\d{19}")


def json_loads(data: bytes | bytearray | memoryview | str) -> Any:
    # psycopg hands a memoryview over its result: the scan and orjson read it in place (a copy
    # per value cost more than the scan); only json needs bytes.
    raw = data.encode() if isinstance(data, str) else data
    if _LONG_DIGITS.search(raw) is None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # json's own error (or its answer) then
    return json.loads(bytes(raw))


def _json_dumps(obj: Any) -> bytes | str:
    try:
        return orjson.dumps(obj)
    except TypeError:  # JSONEncodeError too: an integer beyond 64 bits, a key that is no str
        return json.dumps(obj)


#: Operational errors of a database that answered: contention, not an outage (StoreBusy).
_CONTENTION = (
    psycopg.errors.LockNotAvailable,  # lock_timeout
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
    psycopg.errors.TransactionRollback,
)


def _map_error(exc: psycopg.Error | PoolTimeout) -> MediatorError:
    """Driver error → our own; never leaks SQL or server text to the caller (SECURITY-15)."""
    if isinstance(exc, _CONTENTION):
        return StoreBusy("The database is busy; try again shortly.")
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        return StoreUnavailable("The database is unavailable; try again shortly.")
    err = MediatorError("The request could not be completed because of a storage error.")
    err.__cause__ = exc
    return err


def check_edges(params: dict[str, Any]) -> None:
    """The state table decides (issue 13): a statement's state targets are parameters named
    ``…_to`` (``run_to`` for ``runs.state``, any other for ``steps.state``), each guarded in its
    SQL by ``state = ANY(%(…_from)s)`` — or, with no ``…_from``, written by an INSERT (from no
    row). Every such pair must be edges of ``mediator.core.states``; a ``None`` target writes no
    state.
    ``tests/unit/test_state_sql.py`` proves the SQL side keeps to this convention.

    Raises:
        InvalidTransition: a target that is not an edge from one of its sources.
    """
    for key, to in params.items():
        if not key.endswith("_to") or to is None:
            continue
        check = run_transition if key.startswith("run") else step_transition
        for frm in params.get(key[:-3] + "_from") or [None]:
            check(frm, to)


# One cursor per connection and statement (issue 13, docs/performance.md): a cursor keeps its
# adaptation state (psycopg's Transformer, with the loaders it made for each column type) only
# while it runs the same query again, so a fresh cursor per statement — or one cursor taking
# turns between statements — made it all anew every time: about 20 µs per statement of a
# simulated run. The cursors live on their connection (so they go with it: a cache keyed by the
# connection elsewhere would keep it alive through each cursor's reference to it), and each
# result is freed as soon as its rows are read, so a cursor holds no rows between two runs of its
# statement.
class _Connection(psycopg.Connection[Any]):
    """The pool's connections: psycopg's, with the store's kept cursors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statement_cursors: dict[tuple[str, Any], psycopg.Cursor[Any]] = {}


_NAMES: dict[str, tuple[str, ...]] = {}  # a statement's column names: fixed by its SQL text


def _row_maker(name: str, shape: Any) -> Any:
    """A row factory for statement ``name``: ``dict`` rows, ``tuple`` rows or instances of the
    row class ``shape`` (psycopg's dict_row and class_row, but the column names are read from
    the first result and kept: the same statement always has the same columns)."""

    def factory(cur: psycopg.Cursor[Any]) -> Any:
        names = _NAMES.get(name)
        if names is None:
            res = cur.pgresult
            if res is None or not res.nfields:
                return tuple
            names = _NAMES[name] = tuple((res.fname(i) or b"").decode() for i in range(res.nfields))
        if shape is dict:
            return lambda values: dict(zip(names, values, strict=True))
        if shape is tuple:
            return tuple
        return lambda values: shape(**dict(zip(names, values, strict=True)))

    return factory


def _release(cur: psycopg.Cursor[Any]) -> None:
    """Free the result a cursor still points at (its rows are read): a kept cursor must not hold
    a large run's contract until its statement runs again."""
    res = cur.pgresult
    if res is not None:
        res.clear()


class Statements:
    """One open transaction's statement runner: the named queries of ``queries.sql`` run on the
    connection's kept cursors, with the clock's instant as ``now``. The query methods are
    :class:`mediator.store.tx.Tx`'s, which extends this."""

    def __init__(self, conn: _Connection, now: datetime | None = None) -> None:
        self.conn = conn
        self.now = now  # the clock's instant for every statement of this Tx (None: the server's)

    def _leasing(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Run a statement that inserts leases: a lease's primary key, a deadlock or a lock
        timeout means another run took one of its nodes first (R9, I1) — NodeTaken."""
        try:
            return self._rows(name, params)
        except (
            psycopg.errors.UniqueViolation,
            psycopg.errors.DeadlockDetected,
            psycopg.errors.LockNotAvailable,
        ) as exc:
            raise NodeTaken("A node of this assignment was taken by another run.") from exc

    def _cursor(self, name: str, shape: Any = dict) -> psycopg.Cursor[Any]:
        """This connection's cursor for statement ``name``, made once (see :func:`_row_maker`)."""
        cursors = self.conn.statement_cursors
        cur = cursors.get((name, shape))
        if cur is None:
            cur = cursors[name, shape] = self.conn.cursor(row_factory=_row_maker(name, shape))
        return cur

    def _rows(self, name: str, params: dict[str, Any] | None = None, row: Any = dict) -> list[Any]:
        """Statement ``name``'s rows: dicts, tuples (``row=tuple``) or instances of a row class."""
        check_edges(params or {})
        cur = self._cursor(name, row or dict)
        try:
            cur.execute(QUERIES[name], {**(params or {}), "now": self.now}, prepare=True)
            # pgresult.nfields, not description: description builds a Column per column on
            # every call, and the row factory builds it once more (issue 13: per-statement cost)
            res = cur.pgresult
            return cur.fetchall() if res is not None and res.nfields else []
        finally:
            _release(cur)

    def _one(self, name: str, params: dict[str, Any] | None = None, row: Any = dict) -> Any:
        rows = self._rows(name, params, row)
        return rows[0] if rows else None

    def _exec(self, name: str, params: dict[str, Any] | None = None) -> int:
        check_edges(params or {})
        cur = self._cursor(name, dict)
        try:
            cur.execute(QUERIES[name], {**(params or {}), "now": self.now}, prepare=True)
            return cur.rowcount
        finally:
            _release(cur)


class Connector(Generic[S]):
    """A connection pool with transactions that carry the Mediator's clock; each transaction is
    a ``session(conn, now)`` — for the Mediator's store, a :class:`mediator.store.tx.Tx`.

    Args:
        session: makes a transaction's object from its connection and the clock's instant.
        dsn: libpq connection string or URL.
        clock: when given, every transaction sets ``mediator.now`` to ``clock()`` first.
        max_size: pool size; the simulator needs one connection, the HTTP API one per worker.
        lock_timeout_ms: a short lock wait turns a stuck lease insert into NodeTaken (§7).
        on_backend: called with the server process id of every new connection made over a unix
            socket (so the process is on this machine); the simulator pins it to its own CPU
            (sim/affinity.py). A failure in it is logged and the connection used all the same.
    """

    def __init__(
        self,
        session: Callable[[_Connection, datetime | None], S],
        dsn: str,
        clock: Clock | None = None,
        *,
        max_size: int = 8,
        lock_timeout_ms: int = 2000,
        on_backend: Callable[[int], None] | None = None,
    ) -> None:
        self._session = session
        self.dsn = dsn
        self._on_backend = on_backend
        self.clock = clock
        self._conn_now: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._lock_timeout_ms = lock_timeout_ms
        self._max_size = max_size
        # Outage tracking (wake 5; "outages don't count against nodes", docs/design.md): the
        # monotonic instant of the last statement that reached the database, the instant the
        # database was last reachable before the current outage (None: no outage), and what to
        # call once it answers again — with the outage's length in seconds.
        self._last_ok = time.monotonic()
        self._down_since: float | None = None
        # When the outage whose give-back the reconnect callbacks are running now began
        # (monotonic); None outside that moment (open_outage_s).
        self._giving_back: float | None = None
        self._state = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._probing = False
        self._closing = threading.Event()
        self.on_reconnect: list[Callable[[float], None]] = []
        try:
            self.pool = self._new_pool()
            self.pool.wait(timeout=10)
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreUnavailable(
                "Could not connect to the Mediator's database; check the database URL."
            ) from exc
        self._ensure_schema()

    def _new_pool(self) -> ConnectionPool[_Connection]:
        return ConnectionPool(
            self.dsn,
            min_size=1,
            max_size=self._max_size,
            # A bounded connect (libpq's minimum): an unreachable host fails in seconds.
            kwargs={"autocommit": True, "prepare_threshold": 0, "connect_timeout": 2},
            connection_class=_Connection,
            configure=self._configure,
            open=True,
            # How long a request waits for a connection before it is answered 503: long
            # enough to ride out a burst, short enough that a database outage is reported
            # promptly (docs/performance.md). During a known outage requests wait 1 s at most.
            timeout=5,
            reconnect_timeout=3600,
            name="mediator",
        )

    # ---- outages and reconnects (wake 5, issue 11 §8) ----------------------------------------
    @property
    def down(self) -> bool:
        """True from a failed statement until the watcher reaches the database again."""
        return self._down_since is not None

    def _ok(self) -> None:
        self._last_ok = time.monotonic()

    def _failed(self) -> None:
        """A statement could not reach the database: the outage began when the database was
        last reached (so heartbeats that failed before anyone noticed count as outage too);
        start the watcher that reconnects."""
        with self._state:
            if self._down_since is None:
                self._down_since = self._last_ok
                log.warning("the database is unreachable; reconnecting")
            self._start_watcher()

    def watch(self) -> None:
        """Run the reconnect callbacks as soon as the database answers, even if nothing saw it
        go away: a sweep that failed for a database error asks for this (wake 5)."""
        with self._state:
            if self._down_since is None:
                self._down_since = time.monotonic()
            self._start_watcher()

    def _start_watcher(self) -> None:
        # Under self._state. The watcher clears self._watcher under the same lock when it
        # exits, so an outage noticed while it is finishing is never left without one.
        if self._closing.is_set() or self._watcher is not None:
            return
        self._watcher = threading.Thread(target=self._watch, name="mediator-reconnect", daemon=True)
        self._watcher.start()

    def _reachable(self) -> bool:
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def _watch(self) -> None:
        """Poll the database with direct connections (every 0.1 s; a refused connection costs
        microseconds) until it answers; then replace the pool, whose own reconnect backoff grows
        to tens of seconds during a long outage, so service resumes at once; then tell the
        Mediator how long the outage was. If a callback finds the database gone again, poll
        again."""
        while True:
            while not self._closing.is_set() and not self._reachable():
                self._closing.wait(0.1)
            if self._closing.is_set():
                with self._state:
                    self._watcher = None
                return
            old, self.pool = self.pool, self._new_pool()
            threading.Thread(target=old.close, kwargs={"timeout": 5}, daemon=True).start()
            with self._state:
                since, self._down_since = self._down_since, None
                self._giving_back = since
            self._ok()
            outage = max(0.0, time.monotonic() - since) if since is not None else 0.0
            log.warning("the database answers again (outage of %.1f s)", outage)
            for callback in list(self.on_reconnect):
                try:
                    callback(outage)
                except Exception:
                    log.exception("reconnect callback failed")
            with self._state:
                self._giving_back = None
                if self._down_since is None:
                    self._watcher = None
                    return

    def reconnecting(self) -> bool:
        """True while the watcher is at work (polling, or running the reconnect callbacks)."""
        return self._watcher is not None

    def open_outage_s(self) -> float | None:
        """How long ago the outage began whose give-back is under way now — the database
        answers again and statements run, but adverts and leases do not have the time back yet
        (docs/design.md §13): a submit then must not refuse a run for nodes the outage alone
        expired. None at any other moment."""
        began = self._giving_back
        return None if began is None else max(0.0, time.monotonic() - began)

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        set_json_loads(json_loads, conn)
        set_json_dumps(_json_dumps, conn)
        conn.execute(f"SET lock_timeout = {int(self._lock_timeout_ms)}")
        # Timestamps leave the database as UTC whatever the server's zone (records, /v1/events).
        conn.execute("SET TIME ZONE 'UTC'")
        # A unix socket's host is its directory: the server process is on this machine, so its
        # pid means something here (a TCP peer's pid would name an unrelated local process).
        if self._on_backend is not None and (conn.info.host or "").startswith("/"):
            try:
                self._on_backend(conn.info.backend_pid)
            except Exception:
                log.warning("the new connection's on_backend hook failed", exc_info=True)

    def _ensure_schema(self) -> None:
        with self.pool.connection() as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (_SCHEMA_LOCK,))
            try:
                exists = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
                if not (exists and exists[0]):
                    with conn.transaction():
                        conn.execute(schema_sql().encode(), prepare=False)
                row = conn.execute(QUERIES["schema_version"]).fetchone()
                version = row[0] if row else None
                if version != SCHEMA_VERSION:
                    raise MediatorError(
                        f"The database holds schema version {version}, this Mediator needs "
                        f"{SCHEMA_VERSION}; use a fresh database (no migrations before 1.0)."
                    )
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (_SCHEMA_LOCK,))

    def _instant(self) -> datetime | None:
        """The clock's instant for a Tx's statements (issue 13: a parameter, not a statement)."""
        return self.clock() if self.clock is not None else None

    def _set_clock(self, conn: psycopg.Connection[Any]) -> None:
        """Give the connection the clock's instant before it is used (docs/design.md §13).

        The setting is session-level and re-sent only when the instant changed since this
        connection last saw it: a simulated event runs several transactions at one virtual
        instant, and each would otherwise pay a round trip for the same value. A connection is
        used by one caller at a time, so its setting is the instant of the work it does now.
        """
        if self.clock is None:
            return
        now = self.clock().isoformat()
        if self._conn_now.get(conn) != now:
            conn.execute("SELECT set_config('mediator.now', %s, false)", (now,), prepare=True)
            self._conn_now[conn] = now

    def _timeout(self) -> float | None:
        return 1.0 if self._down_since is not None else None  # None: the pool's own (5 s)

    @contextmanager
    def _connection(self, timeout: float | None = None) -> Iterator[_Connection]:
        """``pool.connection()``, but a pool the reconnect watcher has just replaced is not an
        error: nothing was sent yet, so take the connection from the new one."""
        pool = self.pool
        try:
            conn = pool.getconn(timeout)
        except PoolClosed:
            pool = self.pool
            conn = pool.getconn(timeout)
        try:
            with conn:
                yield conn
        finally:
            pool.putconn(conn)

    def _error(self, exc: psycopg.Error | PoolTimeout) -> MediatorError:
        err = _map_error(exc)
        if isinstance(exc, PoolTimeout):
            # No connection within the wait: a saturated pool, or an outage the pool noticed
            # first. Only an outage starts the watcher; one probe at a time decides which.
            with self._state:
                if self._probing or self._down_since is not None:
                    return err
                self._probing = True
            threading.Thread(target=self._probe, name="mediator-probe", daemon=True).start()
        elif isinstance(err, StoreUnavailable) and not isinstance(err, StoreBusy):
            # (a lock wait, a deadlock: the database answered; treating them as an outage gave
            # the gap back as one, docs/design.md §13)
            self._failed()
        return err

    def _probe(self) -> None:
        try:
            if not self._closing.is_set() and not self._reachable():
                self._failed()
        finally:
            self._probing = False

    @contextmanager
    def tx(self) -> Iterator[S]:
        """A transaction; on any exception it rolls back and the error is re-raised as ours."""
        try:
            with self._connection(self._timeout()) as conn, conn.transaction():
                yield self._session(conn, self._instant())
            self._ok()
        except MediatorError:
            raise
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._error(exc) from exc

    @contextmanager
    def autocommit(self) -> Iterator[S]:
        """Statements without a transaction block: each is its own transaction and snapshot, and
        BEGIN and COMMIT cost nothing. For reads whose statements need not share a snapshot
        (the order of statements is the guarantee, as with observed_at first), and for single
        statements that are atomic on their own."""
        try:
            with self._connection(self._timeout()) as conn:
                yield self._session(conn, self._instant())
            self._ok()
        except MediatorError:
            raise
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._error(exc) from exc

    def ping(self) -> bool:
        """``/healthz``: answers within about a second whether the database is reachable. While
        an outage is known the watcher is the one trying; the answer is then immediate."""
        if self._down_since is not None:
            raise StoreUnavailable("The database is unavailable; try again shortly.")
        try:
            with self._connection(1.0) as conn:
                ok = conn.execute("SELECT 1").fetchone()
            self._ok()
            return bool(ok)
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._error(exc) from exc

    def notifications(self, channel: str, timeout: float) -> Iterator[bool]:
        """Listen on ``channel`` on one dedicated connection (LISTEN holds it) for as long as the
        caller iterates: ``True`` once when listening starts — anything may have been sent while
        no one listened, so a listener re-reads then — and once per NOTIFY; ``False`` after each
        ``timeout`` seconds without one, so the caller can check whether to stop.

        The connection is kept between timeouts: NOTIFYs that arrive while the caller is busy are
        queued by the driver and yielded next, none is lost. (It was opened anew every
        ``timeout``: a backend started every few seconds in each worker, and a gap in which a
        NOTIFY reached no one.) Raises StoreUnavailable if the connection breaks, so the caller
        can reconnect.
        """
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(f"LISTEN {channel}")
                yield True
                while True:
                    heard = False
                    for _ in conn.notifies(timeout=timeout):
                        heard = True
                        yield True
                    if not heard:
                        yield False
        except psycopg.Error as exc:
            raise _map_error(exc) from exc

    def read_only(
        self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Run one query in a READ ONLY transaction: analytics (the simulator, notebooks) read
        the database this way and can never write it (docs/architecture.md)."""
        try:
            with self.pool.connection() as conn:
                self._set_clock(conn)
                with conn.transaction():
                    conn.execute("SET TRANSACTION READ ONLY")
                    cur = conn.cursor(row_factory=dict_row)
                    cur.execute(sql.encode() if params is None else sql, params, prepare=False)
                    rows: list[dict[str, Any]] = cur.fetchall() if cur.description else []
                    cur.close()
                    return rows
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            raise MediatorError("Analytics queries are read-only.") from exc
        except psycopg.Error as exc:
            raise self._error(exc) from exc

    def close(self) -> None:
        self._closing.set()
        w = self._watcher
        if w is not None and w is not threading.current_thread():
            w.join(timeout=10)
        self.pool.close()


def load_schema(dsn: str) -> None:
    """Load schema.sql into an empty database (used to build the tests' template database)."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(schema_sql().encode())


def admin_execute(dsn: str, sql: str) -> None:
    """Run one administrative statement outside a transaction (CREATE/DROP DATABASE)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.encode())


class Snapshot:
    """One READ ONLY, REPEATABLE READ transaction over a Mediator database: every query sees the
    same instant, and :meth:`stream` reads through a server-side cursor ``batch`` rows at a time,
    so an export of a month of a busy lab holds one batch in memory (the lab's twin, docs/design.md
    §20)."""

    def __init__(self, conn: psycopg.Connection[Any], batch: int) -> None:
        self._conn = conn
        self._batch = batch
        self._n = 0

    def one(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        cur = self._conn.cursor(row_factory=dict_row)
        cur.execute(sql, params, prepare=False)
        row: dict[str, Any] | None = cur.fetchone()
        cur.close()
        return row

    def stream(self, sql: str, params: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        self._n += 1
        with self._conn.cursor(f"snapshot_{self._n}", row_factory=dict_row) as cur:
            cur.itersize = self._batch
            cur.execute(sql, params)
            yield from cur


@contextmanager
def read_snapshot(dsn: str, batch: int = 2000) -> Iterator[Snapshot]:
    """A :class:`Snapshot` of the database at ``dsn``, refused with a MediatorError when it holds
    no Mediator schema or another version than this code's (no migrations before 1.0): a reader
    of an older layout would misread it silently."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            set_json_loads(json_loads, conn)
            conn.execute("SET TIME ZONE 'UTC'")
            exists = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
            if not (exists and exists[0]):
                raise MediatorError("That database holds no Mediator schema (no schema_version).")
            row = conn.execute(QUERIES["schema_version"]).fetchone()
            version = row[0] if row else None
            if version != SCHEMA_VERSION:
                raise MediatorError(
                    f"The database holds schema version {version}; this reader needs "
                    f"{SCHEMA_VERSION} (the fleet's history arrived in 7). Export with the "
                    "Mediator release that wrote it, or start from a fresh database."
                )
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                yield Snapshot(conn, batch)
    except psycopg.Error as exc:
        raise MediatorError(f"Cannot read the database: {type(exc).__name__}.") from exc
