"""Issue 25 §4: the event listener (one LISTEN thread per process) died for good on ``EMFILE``
inside the driver's connect — new streams then got only keepalives while ``/healthz`` said ok.
It now survives any failure (logged, retried with backoff), is started again by the next stream
if it ever ends, and ``/healthz`` answers 503 naming it while streams get no events
(docs/security.md "Connections")."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mediator import Config
from tests.db.conftest import contract
from tests.db.test_event_streams import Stream, eventually, port_of


@pytest.fixture
def config() -> Config:
    return Config(events_keepalive_seconds=0.5)


@pytest.fixture
def streams() -> Iterator[list[Stream]]:
    held: list[Stream] = []
    yield held
    for s in held:
        s.close()


class Faults:
    """``store.notifications`` failing as told, then the real one."""

    def __init__(self, med: Any) -> None:
        self.real = med.store.notifications
        self.failures: list[BaseException] = []
        med.store.notifications = self

    def __call__(self, channel: str, timeout: float) -> Iterator[None]:
        if self.failures:
            raise self.failures.pop(0)
        return self.real(channel, timeout)  # type: ignore[no-any-return]


def health(http: httpx.Client) -> tuple[int, str | None]:
    r = http.get("/healthz")
    return r.status_code, r.json().get("events")


def test_the_listener_survives_emfile_and_healthz_says_so_meanwhile(
    serve: Any, med: Any, streams: list[Stream]
) -> None:
    faults = Faults(med)
    faults.failures = [OSError(errno.EMFILE, "Too many open files")] * 3
    url = serve()
    with httpx.Client(base_url=url, timeout=10) as http:
        assert health(http) == (200, None)  # no stream yet: nothing to listen for
        stream = Stream(port_of(url))
        streams.append(stream)
        stream.read_until(b": connected\n\n")
        assert eventually(lambda: health(http) == (503, "failing"))
        assert eventually(lambda: health(http) == (200, None), timeout=30)  # it recovered
        med.advert("X", {"board": "x"}, "i1")
        med.submit(contract("after-emfile"))
        stream.read_until(b'"run_id": "after-emfile"')


# The "kill" is a BaseException ending the thread; pytest reports any such end of a thread.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_listener_that_ended_is_started_again_by_the_next_stream(
    serve: Any, med: Any, streams: list[Stream]
) -> None:
    faults = Faults(med)
    faults.failures = [SystemExit("killed")]  # not an Exception: ends the thread, as a kill
    url = serve()
    with httpx.Client(base_url=url, timeout=10) as http:
        first = Stream(port_of(url))
        streams.append(first)
        first.read_until(b": connected\n\n")
        assert eventually(lambda: health(http) == (503, "dead"))
        second = Stream(port_of(url))  # admitted: pokes the listener back to life
        streams.append(second)
        second.read_until(b": connected\n\n")
        assert eventually(lambda: health(http) == (200, None))
        med.advert("X", {"board": "x"}, "i1")
        med.submit(contract("after-restart"))
        for s in (first, second):
            s.read_until(b'"run_id": "after-restart"')
