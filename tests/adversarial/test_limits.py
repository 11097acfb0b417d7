"""Issue 11 §4 and §11: depth and size limits hold while validating, before anything is written.

The findings: a step ``with`` nested 600 deep was answered 500 *after* the run was saved RUNNING
holding the node's lease, and from then on the node could never get work; a body nested 1,000 deep
let a RecursionError escape; a 50 MB chunked body, 5,000-digit integers and deep adverts got a
vague 400. Every limit is in docs/security.md with its value; each is tried here at 10× or more.
"""

from __future__ import annotations

import json

import pytest

from mediator.core import limits
from tests.adversarial.conftest import (
    Lab,
    advertise,
    contract,
    free_node_gets_work,
    judge,
    unique,
)

pytestmark = [pytest.mark.e2e]


def nested(depth: int, leaf: object = 1, key: str | None = "k") -> object:
    doc = leaf
    for _ in range(depth):
        doc = {key: doc} if key is not None else [doc]
    return doc


def test_a_with_nested_600_deep_is_refused_and_the_node_still_gets_work(lab: Lab):
    """The finding exactly: 400 naming the limit, nothing committed, the node usable after."""
    node = unique("n")
    advertise(lab, node)
    before = lab.counts()
    doc = contract(unique("r"), node)
    doc["steps"][0]["uses"] = "blob"  # a plugin: only a built-in's `with` is checked
    doc["steps"][0]["with"] = nested(600)
    r = lab.http.attack("limits", "POST", "/v1/runs", doc)
    assert r.status == 400 and "deep" in r.error["message"], r.error
    assert lab.counts() == before
    free_node_gets_work(lab, node)


@pytest.mark.parametrize("depth", [limits.MAX_BODY_DEPTH + 1, 1_000, 100_000])
@pytest.mark.parametrize("route", ["/v1/runs", "/v1/nodes", "/v1/asks/1/answer"])
def test_deep_bodies_are_a_400_naming_the_depth_limit(lab: Lab, route: str, depth: int):
    before = lab.counts()
    text = "[" * depth + "]" * depth
    body = {"/v1/runs": '{"roles": {}, "steps": %s}',
            "/v1/nodes": '{"node_id": "d", "instance": "i", "capabilities": {"k": %s}}',
            "/v1/asks/1/answer": '{"answer": %s}'}[route] % text  # fmt: skip
    r = lab.http.attack("limits", "POST", route, body, who="node" if "nodes" in route else "client")
    assert r.status == 400, r.body
    assert str(limits.MAX_BODY_DEPTH) in r.error["message"], r.error
    assert lab.counts() == before


def test_a_with_one_level_past_the_limit_is_refused_naming_it(lab: Lab):
    node = unique("n")
    advertise(lab, node)
    doc = contract(unique("r"), node)
    doc["steps"][0]["uses"] = "blob"  # a plugin: only a built-in's `with` is checked
    doc["steps"][0]["with"] = nested(limits.MAX_DEPTH + 1)  # the with object itself is level 1
    r = lab.http.attack("limits", "POST", "/v1/runs", doc)
    assert r.status == 400 and r.error["field"].startswith("steps[0].with"), r.error
    assert str(limits.MAX_DEPTH) in r.error["message"]
    doc["steps"][0]["with"] = nested(limits.MAX_DEPTH)
    assert lab.http.send("POST", "/v1/runs", doc).status == 201


def test_capabilities_nested_past_the_limit_are_refused(lab: Lab):
    body = {"node_id": unique("n"), "instance": "i", "capabilities": {"k": nested(40, key=None)}}
    r = lab.http.attack("limits", "POST", "/v1/nodes", body, who="node")
    assert r.status == 400 and r.error["field"].startswith("capabilities")


@pytest.mark.parametrize("digits", [limits.MAX_NUMBER_CHARS + 1, 5_000, 100_000])
@pytest.mark.parametrize("where", ["contract", "advert", "result", "seq", "ask_id"])
def test_huge_numbers_are_a_400_naming_the_limit(lab: Lab, digits: int, where: str):
    number = "9" * digits
    node = unique("n")
    requests = {
        "contract": ("POST", "/v1/runs", '{"run_id": "h", "roles": {"dut": {"kit": N}}, '
                     '"steps": [{"name": "s", "role": "dut", "with": {"cmd": "true"}}]}', "client"),
        "advert": ("POST", "/v1/nodes", '{"node_id": "NODE", "instance": "i", '
                   '"capabilities": {"cores": N}}'.replace("NODE", node), "node"),
        "result": ("POST", "/v1/runs/h/steps/0/result", '{"node_id": "x", "attempt": N, '
                   '"outcome": "pass"}', "node"),
        "seq": ("POST", f"/v1/runs/h/steps/{number}/claim", '{"node_id": "x"}', "node"),
        "ask_id": ("POST", f"/v1/asks/{number}/answer", '{"answer": "y"}', "client"),
    }  # fmt: skip
    method, path, body, who = requests[where]
    body = body.replace(": N", ": " + number)
    before = lab.counts()
    r = lab.http.attack("limits", method, path, body, who=who)
    assert r.status in (400, 404), r.body
    assert lab.counts() == before


@pytest.mark.parametrize("value", ["99999999999", "2147483648", "-1"])
def test_path_and_body_integers_out_of_range_are_refused(lab: Lab, value: str):
    for method, path, body, who in [
        ("POST", f"/v1/runs/h/steps/{value}/claim", {"node_id": "x"}, "node"),
        ("POST", f"/v1/asks/{value}/answer", {"answer": "y"}, "client"),
        ("POST", "/v1/runs/h/steps/0/result",
         '{"node_id": "x", "attempt": VALUE, "outcome": "pass"}'.replace("VALUE", value), "node"),
        ("GET", f"/v1/runs?limit={value}", None, "client"),
    ]:  # fmt: skip
        r = lab.http.attack("limits", method, path, body, who=who)
        assert r.status in (400, 404), (path, r.body)


def test_a_50_mb_chunked_body_is_413(lab: Lab):
    chunk = b"[" + b"0," * (512 * 1024)
    r = lab.http.attack("limits", "POST", "/v1/runs", chunks=iter([chunk] * 50))
    assert (r.status, r.error["code"]) == (413, "body_too_large")
    r = lab.http.attack("limits", "POST", "/v1/nodes", b"{" + b" " * (2 << 20) + b"}", who="node")
    assert r.status == 413


def test_counts_and_lengths_at_ten_times_their_limit_are_refused_naming_the_field(lab: Lab):
    node = unique("n")
    advertise(lab, node)
    before = lab.counts()
    many_steps = contract(unique("r"), node)
    many_steps["steps"] = [{"name": f"s{i}", "role": "dut"} for i in range(10 * limits.MAX_STEPS)]
    many_roles = contract(unique("r"), node)
    many_roles["roles"] = {f"r{i}": {"kit": node} for i in range(10 * limits.MAX_ROLES)}
    many_needs = contract(unique("r"), node)
    many_needs["roles"]["dut"] = {f"k{i}": True for i in range(10 * limits.MAX_NEEDS)}
    long_with = contract(unique("r"), node)
    long_with["steps"][0]["with"] = {"cmd": "x" * (10 * limits.MAX_TEXT)}
    long_need = contract(unique("r"), node)
    long_need["roles"]["dut"]["kit"] = "x" * (10 * limits.MAX_VALUE)
    cases = [
        (many_steps, "steps"),
        (many_roles, "roles"),
        (many_needs, "roles.dut"),
        (contract("r" * 640, node), "run_id"),
        (contract(unique("r"), node, work_id="w" * 2000), "work_id"),
        (long_with, "steps[0].with.cmd"),
        (long_need, "roles.dut.kit"),
    ]
    for doc, field in cases:
        r = lab.http.attack("limits", "POST", "/v1/runs", doc)
        assert r.status in (400, 413), (field, r.body[:200])
        if r.status == 400:
            assert r.error["field"] == field, r.error
    assert lab.counts() == before
    big_caps = {f"c{i}": True for i in range(10 * limits.MAX_CAPABILITIES)}
    for body, field in [
        ({"node_id": node, "instance": "i1", "capabilities": big_caps}, "capabilities"),
        ({"node_id": node, "instance": "i1", "capabilities": {"l": list(range(2560))}},
         "capabilities.l"),
        ({"node_id": node, "instance": "i" * 1280, "capabilities": {}}, "instance"),
        ({"node_id": node, "instance": "i1", "label": "l" * 2000, "capabilities": {}}, "label"),
    ]:  # fmt: skip
        r = lab.http.attack("limits", "POST", "/v1/nodes", body, who="node")
        assert (r.status, r.error["field"]) == (400, field), r.error
    free_node_gets_work(lab, node)


def test_the_limits_are_the_documented_ones():
    """docs/security.md lists every limit with its value; this keeps the two in step."""
    from pathlib import Path

    doc = Path(__file__).parents[2].joinpath("docs", "security.md").read_text("utf-8")
    for name, value in limits.LIMITS.items():
        assert f"`{name}`" in doc and f"{value:,}" in doc, name
    assert json.dumps(limits.LIMITS)


@pytest.mark.parametrize(
    "query",
    [
        "since=0001-01-01T00:00:00-23:59", "since=0001-01-01T00:00:00%2B23:59",
        "since=9999-12-31T23:59:59-23:59", "since=-infinity", "since=infinity", "since=1e308",
        "since=99999999999999999999", "limit=1e3", "limit=%20", "state=running", "state=",
        "work_id=" + "w" * 20_000, "x=" + "%00" * 3, "state=QUEUED&state=RUNNING",
    ],
)  # fmt: skip
def test_odd_query_values_are_answered_without_a_5xx(lab: Lab, query: str):
    r = lab.http.send("GET", f"/v1/runs?{query}")
    judge("limits", r, refused=r.status >= 400)
