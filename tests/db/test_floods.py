"""Fair under floods (docs/security.md "Fair under floods", docs/performance.md): one principal
queueing runs each in its own needs class must not make everyone else's calls slow.

Worked examples over HTTP on the real database: the per-principal caps on QUEUED runs and on
their distinct needs classes answer 429 with Retry-After, count only that principal's QUEUED
runs, and leave other principals alone.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from mediator import Config
from mediator.api import create_app
from mediator.api.auth import Tokens
from tests.db.conftest import contract
from tests.db.test_api import bearer, finish, node

ALICE, BOB = bearer("tc1"), bearer("tc2")


@pytest.fixture
def config() -> Config:
    return Config(max_queued_runs_per_principal=3, max_queued_classes_per_principal=2)


@pytest.fixture
def capped(med, clock, tmp_path):
    p = tmp_path / "tokens.toml"
    p.write_text(
        "\n".join(
            f'[[token]]\ntoken = "{t}"\nprincipal = "{who}"\nrole = "{r}"\n'
            for t, who, r in [
                ("tn1", "lab", "node"),
                ("tc1", "alice", "client"),
                ("tc2", "bob", "client"),
            ]
        )
    )
    with TestClient(create_app(med, Tokens.load(str(p)))) as c:
        c.clock = clock  # type: ignore[attr-defined]
        yield c


def queue(client, headers, board="x"):
    client.clock.advance(1)  # FIFO (R6) is by arrival: one second apart, never a tie
    return client.post("/v1/runs", json=contract(dut={"board": board}), headers=headers)


def test_a_principal_past_its_queued_runs_cap_is_429_with_retry_after_others_unaffected(capped):
    """Cap on QUEUED runs: the 4th queued run of alice is refused; bob still queues; a run that
    starts at once is never refused (the cap counts queued runs only); nothing was written."""
    headers = bearer("tn1")
    assert node(capped, "X", headers=headers, board="x").status_code == 200
    started = queue(capped, ALICE)
    assert started.status_code == 201  # X is leased now; alice's next runs of board x queue
    assert [queue(capped, ALICE).status_code for _ in range(3)] == [202, 202, 202]
    refused = queue(capped, ALICE)
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "10"
    error = refused.json()["error"]
    assert error["code"] == "too_many_queued"
    assert "max_queued_runs_per_principal" in error["message"]
    assert queue(capped, BOB).status_code == 202  # another principal is not affected
    listed = capped.get("/v1/runs?state=QUEUED", headers=ALICE).json()["runs"]
    assert len(listed) == 4  # alice's three and bob's one: the refused run was never written
    # The cap counts QUEUED runs only: when alice's running run ends, one of her queued runs
    # is promoted and she may queue one more.
    assert finish(capped, started.json()["run_id"], "X", headers=headers).status_code == 200
    assert queue(capped, ALICE).status_code == 202
    assert queue(capped, ALICE).status_code == 429


def test_a_principal_past_its_needs_classes_cap_is_429_yet_may_queue_in_its_classes(capped):
    """Cap on distinct needs classes: alice queues in two classes; a third is refused with 429
    naming the roles, a run of a class she already queues is not, and bob may open his own."""
    # No node at all serves boards a/b/c: with no live node the runs would be rejected, so one
    # busy node serves each board.
    headers = bearer("tn1")
    for board in "abc":
        assert node(capped, f"N{board}", headers=headers, board=board).status_code == 200
        assert queue(capped, BOB, board).status_code == 201  # bob keeps every node busy
    assert queue(capped, ALICE, "a").status_code == 202
    assert queue(capped, ALICE, "b").status_code == 202
    third = queue(capped, ALICE, "c")
    assert third.status_code == 429 and third.headers["Retry-After"] == "10"
    assert third.json()["error"]["field"] == "roles"
    assert "max_queued_classes_per_principal" in third.json()["error"]["message"]
    assert queue(capped, ALICE, "a").status_code == 202  # a class she already queues
    assert queue(capped, BOB, "c").status_code == 202  # bob's own classes are his


def test_a_dry_run_and_an_existing_run_id_are_never_capped(capped):
    """A dry run writes nothing, and R3 answers an existing run before anything counts."""
    headers = bearer("tn1")
    assert node(capped, "X", headers=headers, board="x").status_code == 200
    assert queue(capped, ALICE).status_code == 201
    for _ in range(3):
        assert queue(capped, ALICE).status_code == 202
    dry = capped.post("/v1/runs?dry_run=true", json=contract(dut={"board": "x"}), headers=ALICE)
    assert dry.status_code == 200
    queued = capped.get("/v1/runs?state=QUEUED", headers=ALICE).json()["runs"][0]["run_id"]
    again = capped.post("/v1/runs", json=contract(queued, dut={"board": "x"}), headers=ALICE)
    assert again.status_code == 200 and again.json()["state"] == "QUEUED"
