"""The Mediator's store: the connector's pool and transactions, each transaction a :class:`Tx`.

The store is split along its seam (procrastinate's connector and manager): the connection side —
the pool, transactions, the reconnect watcher, driver errors mapped to ours, the only import of
psycopg — is :mod:`mediator.store.connector`; the query methods are :mod:`mediator.store.tx`.
"""

from __future__ import annotations

from collections.abc import Callable

from mediator.store.connector import Clock, Connector
from mediator.store.tx import Tx


class Store(Connector[Tx]):
    """A connection pool whose transactions are :class:`Tx` (see :class:`Connector` for the
    arguments)."""

    def __init__(
        self,
        dsn: str,
        clock: Clock | None = None,
        *,
        max_size: int = 8,
        lock_timeout_ms: int = 2000,
        on_backend: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(
            Tx,
            dsn,
            clock,
            max_size=max_size,
            lock_timeout_ms=lock_timeout_ms,
            on_backend=on_backend,
        )
