"""Issue 11 §3: NUL and lone surrogates in any text field are a 400 naming the field, never a 500.

Per field: every id, name, label and question refuses them (400, the field named); a step's log —
output of a program, which may legitimately hold binary junk — is stored with NUL written as
U+2400 (␀) and each lone surrogate as U+FFFD (docs/security.md, "Text"). Path segments, query
parameters and headers refuse them too.
"""

from __future__ import annotations

import json

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

JUNK = {"nul": "a\x00b", "surrogate": "a\udc00b", "high": "\ud800", "both": "\x00\udfff"}


def raw(doc: object) -> str:
    """JSON text with the junk as escapes (\\u0000, \\udc00): what a client actually sends."""
    return json.dumps(doc)


@pytest.mark.parametrize("junk", JUNK.values(), ids=JUNK.keys())
@pytest.mark.parametrize(
    ("field", "advert"),
    [
        ("node_id", lambda j: {"node_id": j}),
        ("label", lambda j: {"label": j}),
        ("instance", lambda j: {"instance": j}),
        ("capabilities", lambda j: {"capabilities": {j: True}}),
        ("capabilities.kit", lambda j: {"capabilities": {"kit": j}}),
        ("capabilities.kit[0]", lambda j: {"capabilities": {"kit": [j]}}),
        ("policy.drain", lambda j: {"policy": {"drain": j}}),
    ],
)
def test_junk_in_an_advert_is_a_400_naming_the_field(lab: Lab, junk, field, advert):
    body = {"node_id": unique("n"), "capabilities": {"kit": "x"}, "instance": "i1", **advert(junk)}
    before = lab.counts()
    r = lab.http.attack("text", "POST", "/v1/nodes", raw(body), who="node")
    assert r.status == 400 and r.error["field"] == field, r.error
    assert lab.counts() == before


CONTRACT_FIELDS = [
    ("work_id", lambda c, j: c.update(work_id=j)),
    ("roles", lambda c, j: c.update(roles={j: {"kit": c["roles"]["dut"]["kit"]}})),
    ("roles.dut", lambda c, j: c["roles"]["dut"].update({j: True})),
    ("roles.dut.kit", lambda c, j: c["roles"]["dut"].update(kit=j)),
    ("steps[0].name", lambda c, j: c["steps"][0].update(name=j)),
    ("steps[0].uses", lambda c, j: c["steps"][0].update(uses=j)),
    ("steps[0].with.cmd", lambda c, j: c["steps"][0]["with"].update(cmd=j)),
    ("steps[0].with", lambda c, j: c["steps"][0]["with"].update({j: 1})),
    ("steps[0].after[0]", lambda c, j: c["steps"][0].update(after=[j])),
    ("steps[1].ask", lambda c, j: c["steps"].append({"name": "q", "kind": "ask", "ask": j})),
]


@pytest.mark.parametrize("junk", JUNK.values(), ids=JUNK.keys())
@pytest.mark.parametrize(("field", "spoil"), CONTRACT_FIELDS, ids=[f for f, _ in CONTRACT_FIELDS])
def test_junk_in_a_contract_is_a_400_naming_the_field(lab: Lab, junk, field, spoil):
    node = unique("n")
    advertise(lab, node)
    doc = contract(unique("r"), node)
    spoil(doc, junk)
    before = lab.counts()
    r = lab.http.attack("text", "POST", "/v1/runs", raw(doc))
    assert r.status == 400, r.body
    assert r.error["field"] is not None and r.error["field"].startswith(field.split(".")[0])
    assert lab.counts() == before
    free_node_gets_work(lab, node)


@pytest.mark.parametrize("junk", JUNK.values(), ids=JUNK.keys())
def test_a_log_with_junk_is_stored_escaped_and_the_node_goes_on(lab: Lab, junk):
    """The finding: ``printf 'a\\000b'`` made every result POST a 500 and wedged the node."""
    node, run, attempt = claimed_step(lab)
    body = {"node_id": node, "instance": "i1", "attempt": attempt, "outcome": "pass", "log": junk}
    r = lab.http.send("POST", f"/v1/runs/{run}/steps/0/result", raw(body), who="node")
    assert r.status == 200, r.body
    assert ok(lab.http.send("GET", f"/v1/runs/{run}")).json()["state"] == "PASSED"
    stored = ok(lab.http.send("GET", f"/v1/runs/{run}/record/steps/0000-flash.log")).body
    expected = "".join(
        "\u2400" if ch == "\x00" else "\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in junk
    )
    assert stored.decode("utf-8") == expected
    free_node_gets_work(lab, node)


@pytest.mark.parametrize("junk", JUNK.values(), ids=JUNK.keys())
def test_junk_in_ids_of_a_result_or_claim_is_a_400(lab: Lab, junk):
    node, run, attempt = claimed_step(lab)
    before = lab.counts()
    for key in ("node_id", "instance", "outcome"):
        body = {"node_id": node, "instance": "i1", "attempt": attempt, "outcome": "pass"}
        body[key] = junk
        r = lab.http.attack("text", "POST", f"/v1/runs/{run}/steps/0/result", raw(body), who="node")
        assert (r.status, r.error["field"]) == (400, key)
        r = lab.http.attack(
            "text", "POST", f"/v1/runs/{run}/steps/0/claim", raw({"node_id": node, key: junk}),
            who="node",
        )  # fmt: skip
        assert r.status == 400 and r.error["field"] in ("node_id", "instance", "outcome")
    assert lab.counts() == before


@pytest.mark.parametrize("junk", JUNK.values(), ids=JUNK.keys())
def test_junk_in_an_answer_is_a_400(lab: Lab, junk):
    r = lab.http.attack("text", "POST", "/v1/asks/1/answer", raw({"answer": junk, "ok": True}))
    assert (r.status, r.error["field"]) == (400, "answer")


@pytest.mark.parametrize(
    "path",
    [
        "/v1/runs/a%00b", "/v1/runs/a%00b/record", "/v1/runs/ok/record/a%00b",
        "/v1/runs/a%00b/cancel", "/v1/nodes/a%00b/work", "/v1/runs/a%00b/steps/0/claim",
        "/v1/runs/%ed%b0%80", "/v1/nodes/%ed%b0%80/work", "/v1/nodes/%ff%fe/work",
        "/v1/runs?work_id=%00", "/v1/runs?state=%00", "/v1/runs?since=%00", "/v1/runs?limit=%00",
        "/v1/runs?work_id=%ed%b0%80", "/v1/runs?work_id=a%00&state=RUNNING", "/v1/events?after=%00",
        "/v1/events?limit=%00", "/v1/runs/%00/steps/0/result", "/v1/asks/%00/answer",
    ],
)  # fmt: skip
def test_junk_in_path_segments_and_query_parameters_is_refused(lab: Lab, path: str):
    method = "POST" if path.rsplit("/", 1)[-1] in ("cancel", "claim", "result", "answer") else "GET"
    body = {"node_id": "x"} if method == "POST" else None
    r = lab.http.attack("text", method, path, body, who="admin" if "cancel" in path else "node")
    assert r.status in (400, 403, 404), r.status


@pytest.mark.parametrize("value", ["1\x00", "\x00", "12\x002", "\xed\xb0\x80", "x", "1e3"])
def test_junk_in_last_event_id_is_a_400(lab: Lab, value: str):
    r = lab.http.attack("text", "GET", "/v1/events", headers={"Last-Event-ID": value})
    assert r.status == 400
