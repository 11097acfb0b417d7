"""docs/design.md §4 "Actions" on the real database: adverts say which actions a node offers,
and a submit refuses a plugin ``uses`` that no live node able to fill the step's role offers
(issue 29 §3) — 422 ``unknown_action`` naming ``steps[i].uses``, nothing written.

The reference here is a brute force over the fleet written out by hand: for each step, the
nodes whose capabilities meet its role's needs, and whether one of them offers its ``uses``
(or did not say what it offers)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from mediator import ContractError, Outcome
from mediator.api import create_app
from mediator.core.errors import UnknownAction

pytestmark = pytest.mark.db


def exec_step(name: str, role: str, uses: str) -> dict[str, Any]:
    with_ = {"cmd": "true"} if uses == "shell" else {"anything": [1, 2]}
    return {"name": name, "role": role, "uses": uses, "with": with_}


def doc(run_id: str, *steps: dict[str, Any], **roles: dict[str, Any]) -> dict[str, Any]:
    return {"run_id": run_id, "roles": roles, "steps": list(steps)}


def test_a_plugin_no_able_node_offers_is_refused_and_nothing_is_written(med):
    """Per role, not per fleet: the flasher on the nrf52 node does not make the stm32 role's
    flash step runnable. The error names the step's field and what the able nodes offer."""
    med.advert("stm", {"board": "stm32"}, "i1", actions=["shell", "sleep", "fail"])
    med.advert("nrf", {"board": "nrf52"}, "i1", actions=["shell", "sleep", "fail", "flash"])
    contract = doc("r1", exec_step("build", "dut", "shell"), exec_step("burn", "dut", "flash"),
                   dut={"board": "stm32"})  # fmt: skip
    for dry_run in (False, True):
        with pytest.raises(UnknownAction) as info:
            med.submit(contract, dry_run=dry_run)
        err = info.value
        assert (err.status, err.code, err.field) == (422, "unknown_action", "steps[1].uses")
        assert '"flash"' in err.message and "fail, shell, sleep" in err.message
    with pytest.raises(Exception, match="r1"):
        med.get_run("r1")  # nothing written: the same run_id may be submitted again
    # The same submit once an stm32 node offers it: started.
    med.advert("stm2", {"board": "stm32"}, "i1", actions=["flash", "shell"])
    assert med.submit(contract).outcome == Outcome.STARTED


def test_a_node_that_does_not_say_may_run_any_plugin(med):
    """Compatibility: an advert without ``actions`` (an older daemon, the simulator's in-process
    nodes) says nothing, so a plugin ``uses`` is not refused for its role — the node decides, as
    before. Built-ins are on every node, advertised or not."""
    med.advert("old", {"board": "x"}, "i1")  # no actions
    assert med.submit(doc("a", exec_step("s", "dut", "sim"), dut={"board": "x"})).outcome == (
        Outcome.STARTED
    )
    med.advert("new", {"board": "y"}, "i1", actions=["frob"])  # no shell listed
    sub = med.submit(doc("b", exec_step("s", "dut", "shell"), dut={"board": "y"}))
    assert sub.outcome == Outcome.STARTED


def test_a_role_no_node_can_fill_is_the_matchers_no_candidate_not_unknown_action(med):
    """The check speaks only of nodes able to fill the role; with none, the run is refused as
    before (NO_CANDIDATE, FAILED), whatever its ``uses``."""
    med.advert("n", {"board": "x"}, "i1", actions=["shell"])
    sub = med.submit(doc("c", exec_step("s", "dut", "frob"), dut={"board": "none"}))
    assert (sub.outcome, sub.run.reject["code"]) == (Outcome.REJECTED, "NO_CANDIDATE")


@pytest.mark.parametrize("seed", range(6))
def test_refusals_match_a_brute_force_over_random_fleets(med, seed):
    """Random fleets of boards and offered actions (some nodes saying nothing), random two-role
    contracts: the submit refuses exactly when the brute force finds a step none of its role's
    able nodes offers, and names the first such step."""
    import random

    rng = random.Random(seed)
    boards, plugins = ["a", "b", "c"], ["p", "q", "r"]
    fleet = []
    for i in range(rng.randint(1, 5)):
        caps = {"board": rng.choice(boards)}
        acts = None if rng.random() < 0.2 else ["shell", *rng.sample(plugins, rng.randint(0, 2))]
        fleet.append((caps, acts))
        med.advert(f"n{seed}-{i}", caps, "i1", actions=acts)
    for k in range(8):
        roles = {"r1": {"board": rng.choice(boards)}, "r2": {"board": rng.choice(boards)}}
        steps = [exec_step(f"s{j}", rng.choice(["r1", "r2"]), rng.choice([*plugins, "shell"]))
                 for j in range(3)]  # fmt: skip
        for role in roles:  # every role used by a step, or the contract is malformed
            if not any(s["role"] == role for s in steps):
                steps.append(exec_step(f"x{role}", role, "shell"))
        expected = None
        for j, s in enumerate(steps):
            able = [a for caps, a in fleet if caps["board"] == roles[s["role"]]["board"]]
            if s["uses"] != "shell" and able and all(a is not None and s["uses"] not in a
                                                     for a in able):  # fmt: skip
                expected = f"steps[{j}].uses"
                break
        try:
            med.submit(doc(f"s{seed}-{k}", *steps, **roles), dry_run=True)
            got = None
        except UnknownAction as exc:
            got = exc.field
        assert got == expected, (fleet, roles, steps)


def test_over_http_the_advert_takes_actions_and_the_refusal_is_422(med):
    with TestClient(create_app(med), base_url="http://127.0.0.1") as http:
        body = {"node_id": "n", "capabilities": {"board": "x"}, "instance": "i1",
                "actions": ["shell", "flash", "shell"]}  # fmt: skip
        assert http.post("/v1/nodes", json=body).status_code == 200
        http.post("/v1/nodes", json={"node_id": "old", "capabilities": {}, "instance": "i1"})
        shown = {n["node_id"]: n["actions"] for n in http.get("/v1/nodes").json()["nodes"]}
        assert shown == {"n": ["flash", "shell"], "old": None}  # sorted, once; null: not said
        for bad, field in (("flash", "actions"), ([""], "actions[0]"), ([7], "actions[0]"),
                           (["x" * 129], "actions[0]")):  # fmt: skip
            r = http.post("/v1/nodes", json={**body, "actions": bad})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["field"] == field, r.text
        r = http.post("/v1/runs", json=doc("h", exec_step("go", "dut", "frob"), dut={"board": "x"}))
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "unknown_action"
        assert r.json()["error"]["field"] == "steps[0].uses"
        assert http.get("/v1/runs/h").status_code == 404
        r = http.post(
            "/v1/runs", json=doc("h", exec_step("go", "dut", "flash"), dut={"board": "x"})
        )
        assert r.status_code == 201, r.text


def test_a_contract_error_still_comes_first(med):
    """A malformed contract is a 400 before the fleet is looked at."""
    med.advert("n", {"board": "x"}, "i1", actions=["shell"])
    with pytest.raises(ContractError) as info:
        med.submit(doc("e", exec_step("go", "dut", "shel"), dut={"board": "x"}))
    assert info.value.status == 400
