"""The HTTP API in-process (the real FastAPI app on the real database, through Starlette's
TestClient): the route table, error bodies, auth, and the HTTP-level tests of docs/design.md §7.
The same checks with real processes are in tests/e2e."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from mediator.api import create_app
from mediator.api.auth import Tokens
from tests.db.conftest import contract

EXPECTED_ROUTES = {
    ("POST", "/v1/nodes"),
    ("GET", "/v1/nodes/{node_id}/work"),
    ("POST", "/v1/runs/{run_id}/steps/{seq}/claim"),
    ("POST", "/v1/runs/{run_id}/steps/{seq}/result"),
    ("POST", "/v1/runs"),
    ("GET", "/v1/runs"),
    ("GET", "/v1/runs/{run_id}"),
    ("POST", "/v1/runs/{run_id}/cancel"),
    ("GET", "/v1/runs/{run_id}/record"),
    ("GET", "/v1/runs/{run_id}/record/{file:path}"),
    ("GET", "/v1/nodes"),
    ("GET", "/v1/asks"),
    ("POST", "/v1/asks/{ask_id}/answer"),
    ("GET", "/v1/events"),
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
}


@pytest.fixture
def client(med):
    with TestClient(create_app(med), base_url="http://127.0.0.1") as c:
        yield c


@pytest.fixture
def tokens_file(tmp_path):
    p = tmp_path / "tokens.toml"
    p.write_text(
        "\n".join(
            f'[[token]]\ntoken = "{t}"\nprincipal = "{p}"\nrole = "{r}"\n'
            for t, p, r in [
                ("tn1-0123456789abcdef", "node-one", "node"),
                ("tn2-0123456789abcdef", "node-two", "node"),
                ("tc1-0123456789abcdef", "alice", "client"),
                ("tc2-0123456789abcdef", "mallory", "client"),
                ("tad-0123456789abcdef", "root", "admin"),
            ]
        )
    )
    p.chmod(0o600)  # a tokens file must be private (docs/security.md)
    return str(p)


@pytest.fixture
def authed(med, tokens_file):
    with TestClient(create_app(med, Tokens.load(tokens_file)), base_url="http://127.0.0.1") as c:
        yield c


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def node(client, node_id="X", drain="", headers=None, **caps):
    body = {"node_id": node_id, "capabilities": caps or {"board": "x"}, "instance": "i1",
            "policy": {"drain": drain}}  # fmt: skip
    return client.post("/v1/nodes", json=body, headers=headers or {})


def finish(client, run_id, node_id="X", headers=None):
    steps = client.get(f"/v1/nodes/{node_id}/work", headers=headers or {}).json()["steps"]
    s = next(s for s in steps if s["run_id"] == run_id)
    base = f"/v1/runs/{run_id}/steps/{s['seq']}"
    claimed = client.post(f"{base}/claim", json={"node_id": node_id}, headers=headers or {}).json()
    return client.post(
        f"{base}/result",
        json={"node_id": node_id, "attempt": claimed["attempt"], "outcome": "pass", "log": "ok"},
        headers=headers or {},
    )


def test_the_route_table_is_the_18_routes_of_api_md(med):
    """design.md §19: a route that disappears or changes fails here (design.md §7: 18 routes)."""
    app = create_app(med)
    routes = {
        (m, r.path)
        for r in app.routes
        for m in getattr(r, "methods", None) or ()
        if m != "HEAD" and r.path not in ("/docs", "/redoc")
    }
    assert routes == EXPECTED_ROUTES
    mounts = [r.path for r in app.routes if not getattr(r, "methods", None)]
    assert mounts == [""] or mounts == ["/"]  # 18: the panel's static files at /


def test_openapi_document_lists_the_api(client):
    paths = client.get("/openapi.json").json()["paths"]
    expected = {p.replace("{file:path}", "{file}") for _, p in EXPECTED_ROUTES}
    assert expected - {"/openapi.json"} == set(paths)


# ---- docs/design.md §7, internal/api ----


def test_409_situation_gives_202_queued_without_assigned_or_reject(client):
    node(client)
    assert client.post("/v1/runs", json=contract("a")).status_code == 201
    r = client.post("/v1/runs", json=contract("b"))
    assert r.status_code == 202
    body = r.json()
    assert body["state"] == "QUEUED" and "assigned" not in body and "reject" not in body


def test_422_situation_stays_422_failed(client):
    node(client)
    r = client.post("/v1/runs", json=contract("c", dut={"board": "none"}))
    assert (r.status_code, r.json()["state"], r.json()["reject"]["code"]) == (
        422,
        "FAILED",
        "NO_CANDIDATE",
    )
    assert client.get("/v1/runs/c").json()["state"] == "FAILED"


def test_resubmitting_a_queued_run_is_200_with_the_existing_run(client):
    node(client)
    client.post("/v1/runs", json=contract("a"))
    client.post("/v1/runs", json=contract("b"))
    r = client.post("/v1/runs", json=contract("b"))
    assert (r.status_code, r.json()["state"], r.json()["run_id"]) == (200, "QUEUED", "b")


def test_dry_run_is_unchanged_with_a_draining_node(client):
    node(client)
    before = client.post("/v1/runs?dry_run=true", json=contract("d"))
    node(client, drain="graceful")
    after = client.post("/v1/runs?dry_run=true", json=contract("d"))
    assert before.status_code == after.status_code == 200
    assert before.json() == after.json() == {"dry_run": True, "assigned": {"dut": "X"}, "width": 1}


def test_list_runs_state_queued_shows_the_row(client):
    node(client)
    client.post("/v1/runs", json=contract("a"))
    client.post("/v1/runs", json=contract("b"))
    body = client.get("/v1/runs?state=QUEUED").json()
    assert [r["run_id"] for r in body["runs"]] == ["b"]
    assert "observed_at" in body
    one = client.get("/v1/runs/b").json()
    assert one["queue_position"] == 1 and one["wait_reason"]["code"] == "ALL_BUSY"
    assert one["wait_reason"]["busy"] == ["X"]


def test_a_result_promotes_the_waiting_run(client):
    node(client)
    client.post("/v1/runs", json=contract("a"))
    client.post("/v1/runs", json=contract("b"))
    r = finish(client, "a")
    assert r.status_code == 200 and r.json()["settled"] == "PASSED"
    assert client.get("/v1/runs/b").json()["state"] == "RUNNING"


def test_a_cancel_promotes_the_waiting_run(client):
    node(client)
    client.post("/v1/runs", json=contract("a"))
    client.post("/v1/runs", json=contract("b"))
    assert client.post("/v1/runs/a/cancel").json()["verdict"] == "cancelled"
    assert client.get("/v1/runs/b").json()["state"] == "RUNNING"


# ---- errors ----


def test_validation_errors_are_400_naming_the_field_never_422(client):
    bad = contract("x")
    bad["steps"][0]["after"] = ["ghost"]
    r = client.post("/v1/runs", json=bad)
    assert r.status_code == 400
    assert r.json()["error"]["field"] == "steps[0].after"
    r = client.post("/v1/runs", content=b"{oops", headers={"content-type": "application/json"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_contract")
    r = client.post("/v1/nodes", json={"node_id": "X", "instance": "i"})
    assert (r.status_code, r.json()["error"]["field"]) == (400, "capabilities")
    r = client.get("/v1/runs?limit=5000")
    assert (r.status_code, r.json()["error"]["field"]) == (400, "limit")
    r = client.post(
        "/v1/nodes", json={"node_id": "X", "capabilities": {"a": {"b": 1}}, "instance": "i"}
    )
    assert r.status_code == 400 and r.json()["error"]["field"].startswith("capabilities")


def test_unknown_things_are_404_and_oversized_bodies_413(client):
    r = client.get("/v1/runs/nope")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "unknown_run")
    assert client.get("/v1/nowhere").status_code == 404
    big = json.dumps({"roles": {}, "steps": [], "pad": "x" * (2 << 20)})
    r = client.post("/v1/runs", content=big, headers={"content-type": "application/json"})
    assert (r.status_code, r.json()["error"]["code"]) == (413, "body_too_large")


def test_no_error_carries_internal_text(client):
    """SECURITY-15: no paths, stack traces or SQL in any error."""
    responses = [
        client.post("/v1/runs", content=b"[1,2", headers={"content-type": "application/json"}),
        client.get("/v1/runs?since=not-a-time"),
        client.post("/v1/runs/nope/steps/0/claim", json={"node_id": "X"}),
        client.get("/v1/runs/nope/record/../../etc/passwd"),
    ]
    for r in responses:
        text = r.text.lower()
        assert r.status_code < 500
        for leak in (
            "traceback",
            "select ",
            "insert ",
            "psycopg",
            "/work/",
            ".py",
            "site-packages",
        ):
            assert leak not in text, (r.status_code, text)


def test_record_routes_serve_the_sealed_record_and_refuse_traversal(client, med):
    node(client)
    client.post("/v1/runs", json=contract("a"))
    finish(client, "a")
    manifest = client.get("/v1/runs/a/record").json()
    assert manifest["sealed"] is True and "contract.json" in manifest["sha256"]
    assert client.get("/v1/runs/a/record/contract.json").json()["run_id"] == "a"
    for evil in ("../a/contract.json", "..%2F..%2Fetc%2Fpasswd", "%2e%2e/%2e%2e/etc/passwd",
                 "steps/../../../../etc/passwd"):  # fmt: skip
        assert client.get(f"/v1/runs/a/record/{evil}").status_code == 404


# ---- auth (docs/design.md §14) ----


def test_no_token_is_401_and_unknown_token_is_401(authed):
    assert authed.get("/v1/runs").status_code == 401
    assert authed.get("/v1/runs", headers=bearer("guess")).status_code == 401
    assert authed.get("/v1/runs", headers=bearer("tc1-0123456789abcdef")).status_code == 200


def test_a_node_acting_for_another_node_is_403(authed):
    assert node(authed, "N1", headers=bearer("tn1-0123456789abcdef")).status_code == 200
    r = node(authed, "N1", headers=bearer("tn2-0123456789abcdef"))  # taking over N1's identity
    assert (r.status_code, r.json()["error"]["code"]) == (403, "not_your_node")
    assert (
        authed.get("/v1/nodes/N1/work", headers=bearer("tn2-0123456789abcdef")).status_code == 403
    )
    assert (
        authed.get("/v1/nodes/N1/work", headers=bearer("tn1-0123456789abcdef")).status_code == 200
    )


def test_cancel_by_a_stranger_is_403_by_the_submitter_or_an_admin_200(authed):
    node(authed, "N1", headers=bearer("tn1-0123456789abcdef"))
    assert (
        authed.post(
            "/v1/runs", json=contract("a"), headers=bearer("tc1-0123456789abcdef")
        ).status_code
        == 201
    )
    assert (
        authed.post("/v1/runs/a/cancel", headers=bearer("tc2-0123456789abcdef")).status_code == 403
    )
    assert (
        authed.post("/v1/runs/a/cancel", headers=bearer("tad-0123456789abcdef")).status_code == 200
    )
    authed.post("/v1/runs", json=contract("b"), headers=bearer("tc1-0123456789abcdef"))
    assert (
        authed.post("/v1/runs/b/cancel", headers=bearer("tc1-0123456789abcdef")).status_code == 200
    )


def test_roles_nodes_cannot_submit_and_clients_cannot_advertise(authed):
    assert (
        authed.post(
            "/v1/runs", json=contract("a"), headers=bearer("tn1-0123456789abcdef")
        ).status_code
        == 403
    )
    assert node(authed, "N9", headers=bearer("tc1-0123456789abcdef")).status_code == 403


def test_the_caller_is_checked_before_the_request_is_read(authed):
    """docs/security.md: who calls and with which role is a dependency of the route
    (mediator/api/deps.py), resolved before the body and parameters are validated — a caller
    without a valid token learns nothing about what the route would accept."""
    junk = {"node_id": 5, "capabilities": []}
    assert authed.post("/v1/nodes", json=junk).status_code == 401
    assert (
        authed.post("/v1/nodes", json=junk, headers=bearer("tc1-0123456789abcdef")).status_code
        == 403
    )
    assert (
        authed.post("/v1/nodes", json=junk, headers=bearer("tn1-0123456789abcdef")).status_code
        == 400
    )
    assert authed.get("/v1/runs?limit=0").status_code == 401
    assert authed.get("/v1/runs?limit=0", headers=bearer("tc1-0123456789abcdef")).status_code == 400


def test_a_router_is_an_app_of_its_own(med):
    """issue 26 §2: routes live in routers (mediator/api/routes), what they depend on in
    mediator/api/deps.py: one router serves alone, without the factory."""
    from fastapi import FastAPI

    from mediator.api.routes import runs
    from tests.db.conftest import advert

    app = FastAPI()
    app.state.med, app.state.tokens = med, Tokens(None)
    app.include_router(runs.router)
    advert(med, "X")
    with TestClient(app) as alone:
        assert alone.post("/v1/runs", json=contract("a")).status_code == 201
        assert alone.post("/v1/runs", json=contract("b")).status_code == 202
        assert alone.post("/v1/runs", json=contract("a")).status_code == 200
        assert alone.get("/v1/runs/b").json()["queue_position"] == 1
        assert alone.get("/v1/asks").status_code == 404  # not this router's


# ---- events, metrics, health ----


def test_events_stream_replays_committed_transitions_in_order(client):
    node(client)
    client.post("/v1/runs", json=contract("a"))
    with client.stream("GET", "/v1/events?after=0&limit=2") as s:
        lines = [line for line in s.iter_lines() if line.startswith(("id:", "event:"))]
    assert lines == ["id: 1", "event: submitted", "id: 2", "event: lease_granted"]
    with client.stream("GET", "/v1/events?limit=1", headers={"Last-Event-ID": "1"}) as s:
        ids = [line for line in s.iter_lines() if line.startswith("id:")]
    assert ids == ["id: 2"]


def test_metrics_report_queue_depth_runs_by_state_waits_and_sweeps(client):
    node(client)
    client.post("/v1/runs", json=contract("a"))
    client.post("/v1/runs", json=contract("b"))
    text = client.get("/metrics").text
    assert "mediator_queue_depth 1.0" in text
    assert 'mediator_runs{state="RUNNING"} 1.0' in text
    assert "mediator_queue_wait_seconds_bucket" in text
    assert "mediator_sweep_duration_seconds_count" in text


def test_healthz(client):
    assert client.get("/healthz").json() == {
        "status": "ok",
        "database": "ok",
        "unsealed": 0,
        "unopened": 0,
    }


# ---- issue 15 §4: the list carries each queued run's position and wait reason -------------------


def _count_statements(monkeypatch):
    """Count the named statements the store runs (a spy on Tx._rows, which every query passes)."""
    from mediator.store.tx import Tx

    seen: list[str] = []
    real = Tx._rows

    def counting(self, name, params=None, row=None):
        seen.append(name)
        return real(self, name, params, row)

    monkeypatch.setattr(Tx, "_rows", counting)
    return seen


def test_the_list_gives_each_queued_run_its_position_and_reason_in_constant_statements(
    client, med, monkeypatch
):
    # issue 15 §4: X holds "a"; b, c, d wait for it; e needs a board nobody has (queued as
    # NO_CAPABLE would be 422, so it asks for X's board too) — the list itself says where each
    # waits and why, exactly as GET /v1/runs/{id} does, for one query per page, not per row.
    client.post("/v1/nodes", json={"node_id": "X", "capabilities": {"board": "x"}, "instance": "i"})
    for run_id in "abcd":
        client.post("/v1/runs", json=contract(run_id))
    seen = _count_statements(monkeypatch)
    body = client.get("/v1/runs").json()
    listed = {r["run_id"]: r for r in body["runs"]}
    assert "queue_position" not in listed["a"] and "wait_reason" not in listed["a"]
    for pos, run_id in enumerate("bcd", start=1):
        one = client.get(f"/v1/runs/{run_id}").json()
        assert listed[run_id]["queue_position"] == one["queue_position"] == pos
        assert listed[run_id]["wait_reason"] == one["wait_reason"]
        assert one["wait_reason"]["code"] == "ALL_BUSY" and one["wait_reason"]["busy"] == ["X"]
    assert body["counts"] == {"queued": 3, "running": 1}
    list_statements = seen[: seen.index("get_run")]
    # observed_at, the page, the counts, the queued rows' details, their candidates' fleet
    assert list_statements == [
        "observed_at", "list_runs", "run_counts", "queued_details", "fleet_for"
    ]  # fmt: skip
    one_run = seen[seen.index("get_run") :][:5]
    assert one_run == ["get_run", "run_steps", "queue_position", "live_contract", "fleet_for"]
    # before: the panel asked GET /v1/runs/{id} per queued row — 3 rows × 5 statements more.


def test_a_page_without_queued_runs_reads_no_queue_details(client, monkeypatch):
    client.post("/v1/nodes", json={"node_id": "X", "capabilities": {"board": "x"}, "instance": "i"})
    client.post("/v1/runs", json=contract("a"))
    seen = _count_statements(monkeypatch)
    assert client.get("/v1/runs").json()["counts"] == {"queued": 0, "running": 1}
    assert seen == ["observed_at", "list_runs", "run_counts"]


# ---- issue 15 §1: the OpenAPI document says what the server does -------------------------------


def test_the_document_declares_400_with_the_error_shape_never_the_framework_s_422(client):
    doc = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in json.dumps(doc)
    error = {"$ref": "#/components/schemas/Error"}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            codes = set(op["responses"])
            params = [p for p in op.get("parameters", []) if p["name"] != "Authorization"]
            if params or op.get("requestBody"):
                assert "400" in codes, where
            if method == "post":
                assert "413" in codes, where
            if path.startswith("/v1/"):
                assert "401" in codes, where
            for code, response in op["responses"].items():
                if code.startswith(("4", "5")) and code != "422" and path != "/healthz":
                    assert response["content"]["application/json"]["schema"] == error, where
            assert ("422" in codes) == (where == "POST /v1/runs"), where
    failed = doc["paths"]["/v1/runs"]["post"]["responses"]["422"]
    assert "no node" in failed["description"]  # the FAILED run itself, not a validation error
    assert failed["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Run"}
    listed = doc["components"]["schemas"]["RunSummary"]["properties"]
    assert listed["queue_position"] == {"type": "integer", "minimum": 1}


def test_the_document_gives_parameters_their_enums_formats_and_bounds(client):
    doc = client.get("/openapi.json").json()
    params = {p["name"]: p["schema"] for p in doc["paths"]["/v1/runs"]["get"]["parameters"]}
    assert params["state"]["enum"] == ["", "QUEUED", "RUNNING", "PASSED", "FAILED"]
    assert params["since"] == {**params["since"], "type": "string", "format": "date-time"}
    assert (params["limit"]["minimum"], params["limit"]["maximum"]) == (1, 1000)
    events = {p["name"]: p["schema"] for p in doc["paths"]["/v1/events"]["get"]["parameters"]}
    assert events["Last-Event-ID"]["pattern"] == "^[0-9]{0,18}$"
    body = doc["components"]["schemas"]
    assert body["Policy"]["properties"]["drain"]["enum"] == ["", "graceful", "at-boundary"]
    assert body["ResultBody"]["properties"]["outcome"]["enum"] == ["pass", "fail", "retry"]
    contract_schema = doc["paths"]["/v1/runs"]["post"]["requestBody"]["content"]
    assert contract_schema["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Contract"
    }
    assert body["Contract"]["required"] == ["roles", "steps"]


def test_the_server_keeps_to_the_parameters_the_document_gives(client):
    node(client)
    client.post("/v1/runs", json=contract("a"))
    # an empty state is no filter, as a form leaves it
    assert [r["run_id"] for r in client.get("/v1/runs?state=").json()["runs"]] == ["a"]
    # since is an RFC 3339 instant: not a number of seconds, not a local time
    for bad in ("0.5", "0", "2026-12-01", "2026-12-01T10:00:00", "yesterday"):
        r = client.get("/v1/runs", params={"since": bad})
        assert (r.status_code, r.json()["error"]["field"]) == (400, "since"), bad
    assert client.get("/v1/runs", params={"since": "2000-01-01T00:00:00Z"}).json()["runs"]
    assert not client.get("/v1/runs", params={"since": "2999-01-01T00:00:00+02:00"}).json()["runs"]
    r = client.get("/v1/runs?state=queued")  # the API's states are upper case (runctl folds)
    assert (r.status_code, r.json()["error"]["field"]) == (400, "state")
    for path in ("/v1/runs/a/steps/-1/claim", "/v1/runs/a/steps/2147483648/claim"):
        r = client.post(path, json={"node_id": "X"})
        assert (r.status_code, r.json()["error"]["field"]) == (400, "seq")
    r = client.get("/v1/nodes/.hidden/work")
    assert (r.status_code, r.json()["error"]["field"]) == (400, "node_id")


def test_an_empty_last_event_id_is_no_id(client):
    # issue 15 §1: EventSource sends the header empty before the first id; it means "absent"
    node(client)
    client.post("/v1/runs", json=contract("a"))
    with client.stream("GET", "/v1/events?after=1&limit=1", headers={"Last-Event-ID": ""}) as s:
        ids = [line for line in s.iter_lines() if line.startswith("id:")]
    assert ids == ["id: 2"]
    r = client.get("/v1/events", headers={"Last-Event-ID": "-3"})
    assert (r.status_code, r.json()["error"]["field"]) == (400, "Last-Event-ID")


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("TRACE", "/v1/runs", "GET, HEAD, POST"),  # two routes on one path
        ("PUT", "/v1/nodes", "GET, HEAD, POST"),
        ("DELETE", "/v1/runs/a", "GET, HEAD"),
        ("OPTIONS", "/v1/runs/a/cancel", "POST"),
        ("GET", "/v1/asks/1/answer", "POST"),
        ("POST", "/index.html", "GET, HEAD"),  # the panel's static files
    ],
)
def test_every_405_says_which_methods_are_allowed(client, method, path, allow):
    # RFC 9110 §15.5.6; before, the panel's mount at "/" answered for every API path, bare
    r = client.request(method, path)
    assert r.status_code == 405
    assert r.headers["allow"] == allow
    assert r.json()["error"]["code"] == "method_not_allowed"


def test_a_record_file_name_the_file_system_refuses_is_404_or_400_never_500(client):
    # issue 15 §1 (found by schemathesis): a 300-character name made the record route answer 500
    client.post("/v1/nodes", json={"node_id": "X", "capabilities": {"board": "x"}, "instance": "i"})
    client.post("/v1/runs", json=contract("a"))
    r = client.get("/v1/runs/a/record/" + "x" * 300)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "no_such_file")
    r = client.get("/v1/runs/a/record/" + "x" * 1025)
    assert (r.status_code, r.json()["error"]["field"]) == (400, "file")


def test_an_integer_beyond_64_bits_is_answered_exactly(client):
    """The routes answer with orjson (mediator/api/responses.py), which writes no integer beyond
    64 bits; JSON has no such limit and jsonb keeps it, so such a value is written by json."""
    big = 2**70 + 1
    assert node(client, "X", board="x", serial=big).status_code == 200
    answer = client.get("/v1/nodes")
    assert answer.status_code == 200 and f'"serial":{big}' in answer.text
    assert answer.json()["nodes"][0]["capabilities"]["serial"] == big
    doc = contract("big")
    # a lab's own action (a built-in checks its arguments); a submit answered 500 here: orjson
    # refused the 201 body
    doc["steps"][0]["uses"], doc["steps"][0]["with"] = "lab-probe", {"n": big}
    submitted = client.post("/v1/runs", json=doc)
    assert submitted.status_code == 201 and submitted.json()["steps"][0]["with"]["n"] == big
