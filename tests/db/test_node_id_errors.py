"""A bad node id is answered with a node-id code (issue 29): it was ``invalid_contract``, which
sent a node's operator looking for a contract they never sent. 400, naming the field."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from mediator.api import create_app

pytestmark = pytest.mark.db


@pytest.fixture
def client(med):
    with TestClient(create_app(med), base_url="http://127.0.0.1") as c:
        yield c


@pytest.mark.parametrize("bad", [".hidden", "a/b", "x" * 65, ""])
def test_an_advert_with_a_bad_node_id_is_400_invalid_node_id(client, bad):
    body = {"node_id": bad, "capabilities": {"board": "x"}, "instance": "i1"}
    r = client.post("/v1/nodes", json=body)
    assert r.status_code == 400
    assert (r.json()["error"]["code"], r.json()["error"]["field"]) == ("invalid_node_id", "node_id")


@pytest.mark.parametrize("bad", [".hidden", "x" * 65, "a%20b"])
def test_work_for_a_bad_node_id_is_400_invalid_node_id_like_the_advert(client, bad):
    """It answered ``invalid_request``: the same bad name got two codes from two routes."""
    r = client.get(f"/v1/nodes/{bad}/work")
    assert r.status_code == 400
    assert (r.json()["error"]["code"], r.json()["error"]["field"]) == ("invalid_node_id", "node_id")


def _run_with_a_step(client) -> str:
    """A running run whose step 0 is node n1's: a claim or result from a malformed id must be
    refused for its id, not checked against n1's step."""
    client.post(
        "/v1/nodes", json={"node_id": "n1", "capabilities": {"board": "x"}, "instance": "i1"}
    )
    step = {"name": "s", "role": "dut", "uses": "shell", "with": {"cmd": "true"}}
    contract = {"roles": {"dut": {"board": "x"}}, "steps": [step]}
    r = client.post("/v1/runs", json=contract)
    assert r.status_code == 201, r.text
    return str(r.json()["run_id"])


@pytest.mark.parametrize("bad", [".hidden", "a b", "x" * 65, "", 7])
@pytest.mark.parametrize("route", ["claim", "result"])
def test_a_claim_or_result_from_a_bad_node_id_is_400_invalid_node_id(client, bad, route):
    """Issue 29, "a bad node id answers invalid_node_id everywhere": a claim or a result from
    ``"a b"`` or ``""`` was answered 403 ``not_your_step`` (as if such a node could own a step),
    a number ``invalid_request``. One code, naming the field, wherever a node id is sent."""
    run_id = _run_with_a_step(client)
    body = {"node_id": bad, "instance": "i1"}
    if route == "result":
        body |= {"attempt": 1, "outcome": "pass", "log": ""}
    r = client.post(f"/v1/runs/{run_id}/steps/0/{route}", json=body)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["field"]) == ("invalid_node_id", "node_id")


@pytest.mark.parametrize("bad", ["a b", ".hidden", "x" * 65])
def test_the_fleets_after_cursor_is_a_node_id_too(client, bad):
    """``GET /v1/nodes?after=`` pages by node id: a malformed one is ``invalid_node_id`` naming
    ``after`` (it was listed as if valid, or ``invalid_request`` past 64 characters)."""
    r = client.get("/v1/nodes", params={"after": bad})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["field"]) == ("invalid_node_id", "after")
    assert client.get("/v1/nodes", params={"after": "n0"}).status_code == 200


def test_the_facade_refuses_a_bad_node_id_as_the_api_does(med):
    """The flows check it (tools and the simulator call them directly), not only the routes."""
    from mediator.core.errors import ContractError

    for call in (lambda: med.work("a b"), lambda: med.claim("r", 0, ""),
                 lambda: med.report("r", 0, "../x", 1, "pass")):  # fmt: skip
        with pytest.raises(ContractError) as info:
            call()
        assert (info.value.code, info.value.field) == ("invalid_node_id", "node_id")
