"""Fixtures for tests on the real database: a Mediator per test on its own database, a manual
virtual clock set years away from the wall clock (so a query that reads the wall clock shows up
as a wrong answer), and small builders that keep tests reading like worked examples."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import uvicorn

from mediator import Config, Mediator
from mediator.api import create_app
from mediator.api.auth import Tokens

EPOCH = datetime(2031, 3, 1, 12, 0, 0, tzinfo=UTC)


class ManualClock:
    """Virtual time that moves only when a test says so."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def config() -> Config:
    return Config()


@pytest.fixture
def med(dsn: str, clock: ManualClock, config: Config, tmp_path: Any) -> Iterator[Mediator]:
    m = Mediator.connect(dsn, config=config, clock=clock, records_root=str(tmp_path / "records"))
    yield m
    m.close()


def contract(
    run_id: str | None = None, steps: int = 1, **needs_by_role: dict[str, Any]
) -> dict[str, Any]:
    """One exec step per role (``steps`` each): ``contract("a", dut={"board": "x"})``."""
    roles = needs_by_role or {"dut": {"board": "x"}}
    doc: dict[str, Any] = {
        "roles": roles,
        "steps": [
            {"name": f"{role}-{i}", "role": role, "uses": "shell", "with": {"cmd": "true"}}
            for role in roles
            for i in range(steps)
        ],
    }
    if run_id is not None:
        doc["run_id"] = run_id
    return doc


def advert(
    med: Mediator, node_id: str, instance: str = "i1", drain: str = "", **caps: Any
) -> float:
    return med.advert(node_id, caps or {"board": "x"}, instance, label=node_id, drain=drain)


@pytest.fixture
def serve(med: Mediator) -> Iterator[Any]:
    """``serve(tokens=None) -> url``: the real app on a loopback port, stopped after the test."""
    running: list[tuple[uvicorn.Server, threading.Thread, socket.socket]] = []

    def start(tokens: Tokens | None = None) -> str:
        sock = socket.create_server(("127.0.0.1", 0))
        server = uvicorn.Server(
            uvicorn.Config(create_app(med, tokens), log_level="warning", lifespan="on")
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        running.append((server, thread, sock))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for server, thread, sock in running:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
