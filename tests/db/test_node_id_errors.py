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
