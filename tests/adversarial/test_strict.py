"""Strict input (amendments round 2; issue 11 §11, issue 15 §3) and who may act as a node.

* Duplicate keys in one JSON object — two roles with one name — used to let the last one win
  silently: now 400 naming the key, in every body the API parses.
* Unknown fields at any level of contracts, adverts and the other bodies: 400 naming the field and
  the closest known name, as Kubernetes' strict field validation does.
* Node routes need the node's own principal: an admin token may cancel and answer, but may not
  advertise, read work, claim or report for a node (docs/security.md, "Tokens").
"""

from __future__ import annotations

import pytest

from tests.adversarial.conftest import (
    Lab,
    advertise,
    claimed_step,
    contract,
    free_node_gets_work,
    ok,
    unique,
)

pytestmark = [pytest.mark.e2e]

DUPLICATES = [
    ("/v1/runs", '{"roles": {"dut": {"kit": "a"}, "dut": {"kit": "b"}}, "steps": []}', "roles.dut"),
    ("/v1/runs", '{"steps": [], "steps": [], "roles": {}}', "steps"),
    ("/v1/runs", '{"roles": {"d": {"kit": "a", "kit": "b"}}, "steps": []}', "roles.d.kit"),
    ("/v1/runs", '{"roles": {}, "steps": [{"name": "a", "name": "b"}]}', "steps[0].name"),
    ("/v1/nodes", '{"node_id": "a", "node_id": "b", "instance": "i", "capabilities": {}}',
     "node_id"),
    ("/v1/nodes", '{"node_id": "a", "instance": "i", "capabilities": {"x": 1, "x": 2}}',
     "capabilities.x"),
    ("/v1/runs/r/steps/0/result",
     '{"node_id": "a", "attempt": 1, "outcome": "fail", "outcome": "pass"}', "outcome"),
    ("/v1/asks/1/answer", '{"answer": "no", "ok": false, "ok": true}', "ok"),
]  # fmt: skip


@pytest.mark.parametrize(("route", "body", "field"), DUPLICATES)
def test_duplicate_keys_are_a_400_naming_the_key(lab: Lab, route, body, field):
    before = lab.counts()
    who = "node" if "nodes" in route or "result" in route else "client"
    r = lab.http.attack("json", "POST", route, body, who=who)
    assert (r.status, r.error["code"], r.error["field"]) == (400, "duplicate_key", field), r.error
    assert lab.counts() == before


@pytest.mark.parametrize(
    "body",
    ['{"roles": {}, "steps": [], "x": NaN}', '{"roles": {"d": {"k": Infinity}}}',
     '{"roles": {"d": {"k": -Infinity}}}', '{"roles": {"d": {"k": 1e999}}}', "[1,2", "{'a': 1}",
     '{"a": 1} {"b": 2}', "\ufeff{}", '{"roles": {}, "steps": []}\x00', b"\xff\xfe{}"],
)  # fmt: skip
def test_json_that_is_not_json_is_a_400(lab: Lab, body):
    before = lab.counts()
    r = lab.http.attack("json", "POST", "/v1/runs", body)
    assert r.status == 400
    assert lab.counts() == before


UNKNOWN = [
    ("/v1/runs", {"max_widht": 2}, "max_widht", None),
    ("/v1/runs", {"step": []}, "step", "steps"),
    ("/v1/runs", {"work_idd": "w"}, "work_idd", "work_id"),
    ("/v1/runs", "step-key", "steps[0].afer", "after"),
    ("/v1/nodes", {"capabilites": {}}, "capabilites", "capabilities"),
    ("/v1/nodes", {"policy": {"drian": "graceful"}}, "policy.drian", "drain"),
    ("/v1/nodes", {"lable": "x"}, "lable", "label"),
    ("/v1/runs/r/steps/0/claim", {"instanse": "i"}, "instanse", "instance"),
    ("/v1/runs/r/steps/0/result", {"outcom": "pass"}, "outcom", "outcome"),
    ("/v1/asks/1/answer", {"okay": True}, "okay", "ok"),
]


@pytest.mark.parametrize(("route", "extra", "field", "hint"), UNKNOWN)
def test_unknown_fields_are_a_400_naming_the_field_and_the_closest_name(
    lab: Lab, route, extra, field, hint
):
    node = unique("n")
    advertise(lab, node)
    base = {
        "/v1/runs": contract(unique("r"), node),
        "/v1/nodes": {"node_id": node, "instance": "i1", "capabilities": {"kit": node}},
        "/v1/runs/r/steps/0/claim": {"node_id": node},
        "/v1/runs/r/steps/0/result": {"node_id": node, "attempt": 1, "outcome": "pass"},
        "/v1/asks/1/answer": {"answer": "yes"},
    }[route]
    if extra == "step-key":
        base["steps"][0]["afer"] = []
    else:
        base.update(extra)
    before = lab.counts()
    who = "client" if route in ("/v1/runs", "/v1/asks/1/answer") else "node"
    r = lab.http.attack("strict", "POST", route, base, who=who)
    assert (r.status, r.error["field"]) == (400, field), r.error
    if hint is not None:
        assert f'"{hint}"' in r.error["message"], r.error
    assert lab.counts() == before
    free_node_gets_work(lab, node)


def test_an_admin_may_not_act_as_a_node_but_may_cancel(lab: Lab):
    """Issue 11 §11 decided: node routes need the node's own principal (docs/security.md)."""
    node, run, attempt = claimed_step(lab)
    before = lab.counts()
    for method, path, body in [
        ("GET", f"/v1/nodes/{node}/work", None),
        ("POST", f"/v1/runs/{run}/steps/0/claim", {"node_id": node}),
        ("POST", f"/v1/runs/{run}/steps/0/result",
         {"node_id": node, "attempt": attempt, "outcome": "fail"}),
        ("POST", "/v1/nodes", {"node_id": node, "instance": "i2", "capabilities": {}}),
    ]:  # fmt: skip
        for who in ("admin", "client", "node2"):
            r = lab.http.attack("auth", method, path, body, who=who)
            assert r.status == 403, (who, path, r.body)
    assert lab.counts() == before
    assert ok(lab.http.send("POST", f"/v1/runs/{run}/cancel", who="admin")).json()["state"] == (
        "FAILED"
    )
    other = unique("n")
    advertise(lab, other)
    free_node_gets_work(lab, other)
