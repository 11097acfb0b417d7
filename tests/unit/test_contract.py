"""Worked examples for mediator.core.contract: structural validation at submit (R5) and need
matching.

Every structural check of docs/design.md §4 has an example that breaks exactly one thing and asserts
the ``field`` the error names: the HTTP layer returns that field to the person who must fix it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mediator.core import capabilities, contract, limits
from mediator.core.contract import StepSpec
from mediator.core.errors import ContractError
from mediator.core.limits import MAX_STEPS


def example() -> dict[str, Any]:
    """The contract of docs/design.md §4 (with a concrete run_id and work_id)."""
    return {
        "run_id": "hil-2024.06_01",
        "work_id": "ticket-4e3415b7",
        "roles": {"dut": {"board": "stm32f4"}, "bench": {"scope": True}},
        "steps": [
            {"name": "flash", "role": "dut", "uses": "shell", "with": {"cmd": "make flash"}},
            {
                "name": "probe",
                "kind": "ask",
                "ask": "Clip the probe on TP3, then answer ok",
                "after": ["flash"],
            },
            {
                "name": "measure",
                "role": "bench",
                "uses": "shell",
                "with": {"cmd": "scope-capture"},
                "after": ["probe"],
            },
            {
                "name": "verify",
                "role": "dut",
                "uses": "shell",
                "with": {"cmd": "pytest hil/"},
                "after": ["measure"],
            },
        ],
    }


def error_of(doc: object) -> ContractError:
    with pytest.raises(ContractError) as caught:
        contract.parse(doc)
    return caught.value


# --- the example parses ---------------------------------------------------------------------------


def test_example_contract_of_section_5_parses_to_roles_and_steps() -> None:
    """R5: the spec's own example passes every structural check, field by field."""
    doc = example()
    parsed = contract.parse(doc)
    assert parsed.run_id == "hil-2024.06_01"
    assert parsed.work_id == "ticket-4e3415b7"
    assert parsed.roles == {"dut": {"board": "stm32f4"}, "bench": {"scope": True}}
    assert parsed.doc is doc
    assert parsed.steps == (
        StepSpec(0, "flash", "exec", "dut", "shell", {"cmd": "make flash"}, (), ""),
        StepSpec(
            1, "probe", "ask", "", "", {}, ("flash",), "Clip the probe on TP3, then answer ok"
        ),
        StepSpec(2, "measure", "exec", "bench", "shell", {"cmd": "scope-capture"}, ("probe",), ""),
        StepSpec(3, "verify", "exec", "dut", "shell", {"cmd": "pytest hil/"}, ("measure",), ""),
    )


def test_defaults_kind_exec_uses_shell_with_empty_after_empty() -> None:
    parsed = contract.parse(
        {"roles": {"r": {}}, "steps": [{"name": "s", "role": "r", "with": {"cmd": "true"}}]}
    )
    assert parsed.run_id is None
    assert parsed.work_id == ""
    assert parsed.steps == (StepSpec(0, "s", "exec", "r", "shell", {"cmd": "true"}, (), ""),)
    # A plugin's `with` defaults to {}: only the built-ins' arguments are known at submit.
    plugin = contract.parse(
        {"roles": {"r": {}}, "steps": [{"name": "s", "role": "r", "uses": "x"}]}
    )
    assert plugin.steps == (StepSpec(0, "s", "exec", "r", "x", {}, (), ""),)


def test_null_run_id_and_work_id_count_as_absent() -> None:
    parsed = contract.parse(
        {
            "run_id": None,
            "work_id": None,
            "roles": {},
            "steps": [{"name": "a", "kind": "ask", "ask": "?"}],
        }
    )
    assert (parsed.run_id, parsed.work_id) == (None, "")


def test_ask_only_contract_has_no_roles() -> None:
    parsed = contract.parse({"roles": {}, "steps": [{"name": "a", "kind": "ask", "ask": "Ready?"}]})
    assert parsed.roles == {}
    assert (
        contract.needs_of({"roles": {}, "steps": [{"name": "a", "kind": "ask", "ask": "?"}]}) == {}
    )


def test_unknown_top_level_keys_are_refused_naming_the_closest_known_key() -> None:
    """Issue 15 §3, amendments round 2: a misspelt "max_widht" was silently dropped."""
    doc = example()
    doc["max_widht"] = 2
    e = refused(doc, "max_widht")
    assert "run_id, work_id, roles, steps" in e.message
    doc = example()
    doc["work_idd"] = "x"
    assert 'did you mean "work_id"?' in refused(doc, "work_idd").message


def test_needs_of_returns_fresh_copies_of_the_needs_by_role() -> None:
    doc = example()
    needs = contract.needs_of(doc)
    assert needs == {"dut": {"board": "stm32f4"}, "bench": {"scope": True}}
    needs["dut"]["board"] = "changed"
    assert doc["roles"]["dut"]["board"] == "stm32f4"


def test_maximum_sized_contract_is_accepted() -> None:
    """R5: exactly MAX_STEPS steps in one chain is fine (and deeper than Python's recursion)."""
    steps = [
        {"name": f"s{i}", "role": "r", "after": [f"s{i - 1}"] if i else [], "with": {"cmd": "true"}}
        for i in range(MAX_STEPS)
    ]
    parsed = contract.parse({"roles": {"r": {}}, "steps": steps})
    assert len(parsed.steps) == MAX_STEPS
    assert parsed.steps[-1].after == (f"s{MAX_STEPS - 2}",)


# --- every structural check names its field (R5) --------------------------------------------------


def mutate(change: Any) -> dict[str, Any]:
    doc = example()
    change(doc)
    return doc


def set_step(i: int, key: str, value: Any) -> Any:
    return lambda d: d["steps"][i].__setitem__(key, value)


def del_step_key(i: int, key: str) -> Any:
    return lambda d: d["steps"][i].pop(key)


STRUCTURAL = [
    # (id, change to the example, field named)
    ("run_id not a string", lambda d: d.__setitem__("run_id", 42), "run_id"),
    ("run_id empty", lambda d: d.__setitem__("run_id", ""), "run_id"),
    ("run_id with a slash", lambda d: d.__setitem__("run_id", "a/b"), "run_id"),
    ("run_id with a space", lambda d: d.__setitem__("run_id", "a b"), "run_id"),
    ("run_id 65 chars", lambda d: d.__setitem__("run_id", "x" * 65), "run_id"),
    ("work_id not a string", lambda d: d.__setitem__("work_id", 7), "work_id"),
    ("work_id 201 chars", lambda d: d.__setitem__("work_id", "w" * 201), "work_id"),
    ("roles missing", lambda d: d.pop("roles"), "roles"),
    ("roles a list", lambda d: d.__setitem__("roles", ["dut"]), "roles"),
    ("role name with space", lambda d: d["roles"].__setitem__("my role", {}), 'roles["my role"]'),
    ("role name too long", lambda d: d["roles"].__setitem__("r" * 65, {}), "roles." + "r" * 65),
    ("needs not an object", lambda d: d["roles"].__setitem__("dut", "stm32f4"), "roles.dut"),
    ("need value null", lambda d: d["roles"]["dut"].__setitem__("board", None), "roles.dut.board"),
    ("need value list", lambda d: d["roles"]["dut"].__setitem__("board", ["a"]), "roles.dut.board"),
    ("need value object", lambda d: d["roles"]["dut"].__setitem__("board", {}), "roles.dut.board"),
    ("need key empty", lambda d: d["roles"]["dut"].__setitem__("", 1), 'roles.dut[""]'),
    ("steps missing", lambda d: d.pop("steps"), "steps"),
    ("steps an object", lambda d: d.__setitem__("steps", {"flash": {}}), "steps"),
    ("steps empty", lambda d: d.__setitem__("steps", []), "steps"),
    ("step not an object", lambda d: d["steps"].__setitem__(1, "probe"), "steps[1]"),
    ("step key typo afer", lambda d: d["steps"][3].__setitem__("afer", ["x"]), "steps[3].afer"),
    ("step key unknown", lambda d: d["steps"][0].__setitem__("timeout", 5), "steps[0].timeout"),
    ("name missing", del_step_key(2, "name"), "steps[2].name"),
    ("name not a string", set_step(2, "name", 3), "steps[2].name"),
    ("name empty", set_step(2, "name", ""), "steps[2].name"),
    ("name blank", set_step(2, "name", "   "), "steps[2].name"),
    ("name 129 chars", set_step(2, "name", "n" * 129), "steps[2].name"),
    ("duplicate name", set_step(3, "name", "flash"), "steps[3].name"),
    ("unknown kind", set_step(0, "kind", "python"), "steps[0].kind"),
    ("kind not a string", set_step(0, "kind", 1), "steps[0].kind"),
    ("after a string", set_step(2, "after", "probe"), "steps[2].after"),
    ("after holds a number", set_step(2, "after", [1]), "steps[2].after"),
    ("after unknown step", set_step(2, "after", ["prob"]), "steps[2].after"),
    ("after itself", set_step(2, "after", ["measure"]), "steps[2].after"),
    ("exec without role", del_step_key(0, "role"), "steps[0].role"),
    ("exec role unknown", set_step(0, "role", "scope"), "steps[0].role"),
    ("exec role not a string", set_step(0, "role", ["dut"]), "steps[0].role"),
    ("exec uses not a string", set_step(0, "uses", 1), "steps[0].uses"),
    ("exec uses empty", set_step(0, "uses", ""), "steps[0].uses"),
    ("exec with a list", set_step(0, "with", ["make"]), "steps[0].with"),
    ("exec with a string", set_step(0, "with", "make flash"), "steps[0].with"),
    ("exec with a question", set_step(0, "ask", "sure?"), "steps[0].ask"),
    ("ask with a role", set_step(1, "role", "dut"), "steps[1].role"),
    ("ask with uses", set_step(1, "uses", "shell"), "steps[1].uses"),
    ("ask with with", set_step(1, "with", {}), "steps[1].with"),
    ("ask without question", del_step_key(1, "ask"), "steps[1].ask"),
    ("ask question empty", set_step(1, "ask", ""), "steps[1].ask"),
    ("ask question not a string", set_step(1, "ask", True), "steps[1].ask"),
    ("role no step uses", lambda d: d["roles"].__setitem__("spare", {}), "roles.spare"),
    (
        "NaN inside with",
        lambda d: d["steps"][0]["with"].__setitem__("t", float("nan")),
        "steps[0].with.t",
    ),
    ("set inside with", lambda d: d["steps"][0]["with"].__setitem__("t", {1}), "steps[0].with.t"),
    (
        "NUL in a command",
        lambda d: d["steps"][0]["with"].__setitem__("cmd", "a\x00b"),
        "steps[0].with.cmd",
    ),
    ("lone surrogate", lambda d: d["steps"][0].__setitem__("name", "\ud800"), "steps[0].name"),
    ("non-string key", lambda d: d["steps"][0]["with"].__setitem__(1, "x"), "steps[0].with"),
]


@pytest.mark.parametrize(
    ("change", "field"), [(c, f) for _, c, f in STRUCTURAL], ids=[i for i, _, _ in STRUCTURAL]
)
def test_structural_error_names_the_field(change: Any, field: str) -> None:
    """R5: each malformed contract is a ContractError (400) naming the offending field."""
    err = error_of(mutate(change))
    assert err.field == field
    assert err.code == "invalid_contract"
    assert err.status == 400
    # One sentence a person can act on, and it says where.
    assert err.message.endswith((".", "?"))
    assert field in err.message


@pytest.mark.parametrize("doc", [None, [], "contract", 3], ids=["null", "list", "string", "number"])
def test_document_that_is_not_an_object(doc: object) -> None:
    err = error_of(doc)
    assert err.field is None
    assert "JSON object" in err.message


def test_more_than_max_steps() -> None:
    """R5: 1,001 steps are refused at submit, field "steps"."""
    steps = [{"name": f"s{i}", "role": "r"} for i in range(MAX_STEPS + 1)]
    err = error_of({"roles": {"r": {}}, "steps": steps})
    assert err.field == "steps"
    assert "1001" in err.message


def test_cycle_reports_the_step_whose_after_closes_it() -> None:
    """R5: a -> b -> c -> a is found while walking from a; c's after closes it."""
    doc = {
        "roles": {"r": {}},
        "steps": [
            {"name": "a", "role": "r", "after": ["b"], "with": {"cmd": "true"}},
            {"name": "b", "role": "r", "after": ["c"], "with": {"cmd": "true"}},
            {"name": "c", "role": "r", "after": ["a"], "with": {"cmd": "true"}},
        ],
    }
    err = error_of(doc)
    assert err.field == "steps[2].after"
    assert '"a" waits for "b" waits for "c" waits for "a"' in err.message


def test_cycle_downstream_of_an_acyclic_prefix() -> None:
    doc = {
        "roles": {"r": {}},
        "steps": [
            {"name": "start", "role": "r", "with": {"cmd": "true"}},
            {"name": "x", "role": "r", "after": ["start", "y"], "with": {"cmd": "true"}},
            {"name": "y", "role": "r", "after": ["x"], "with": {"cmd": "true"}},
            {"name": "z", "role": "r", "after": ["start"], "with": {"cmd": "true"}},
        ],
    }
    err = error_of(doc)
    assert err.field == "steps[2].after"
    assert '"x" waits for "y" waits for "x"' in err.message


def test_diamond_is_not_a_cycle() -> None:
    doc = {
        "roles": {"r": {}},
        "steps": [
            {"name": "top", "role": "r", "with": {"cmd": "true"}},
            {"name": "left", "role": "r", "after": ["top"], "with": {"cmd": "true"}},
            {"name": "right", "role": "r", "after": ["top"], "with": {"cmd": "true"}},
            {
                "name": "bottom",
                "role": "r",
                "after": ["left", "right", "top"],
                "with": {"cmd": "true"},
            },
        ],
    }
    assert [s.name for s in contract.parse(doc).steps] == ["top", "left", "right", "bottom"]


def test_after_may_name_a_step_listed_later() -> None:
    """Only the graph matters, not the list order: b waits for a, which is written after it."""
    doc = {
        "roles": {"r": {}},
        "steps": [
            {"name": "b", "role": "r", "after": ["a"], "with": {"cmd": "true"}},
            {"name": "a", "role": "r", "with": {"cmd": "true"}},
        ],
    }
    assert [(s.seq, s.name, s.after) for s in contract.parse(doc).steps] == [
        (0, "b", ("a",)),
        (1, "a", ()),
    ]


def test_unknown_step_key_suggests_the_close_match() -> None:
    err = error_of(mutate(lambda d: d["steps"][3].__setitem__("afer", ["measure"])))
    assert 'did you mean "after"?' in err.message


def test_duplicate_name_message_points_at_the_first_holder() -> None:
    err = error_of(mutate(set_step(3, "name", "flash")))
    assert "steps[0]" in err.message


def test_first_problem_in_document_order_is_reported() -> None:
    """Same document, same error: the earliest field wins."""
    doc = mutate(
        lambda d: (d.__setitem__("run_id", "bad id"), d["steps"][0].__setitem__("kind", "x"))
    )
    assert error_of(doc).field == "run_id"


def test_dict_key_with_a_dot_is_quoted_in_the_field_path() -> None:
    doc = {
        "roles": {"a.b": {"x": None}},
        "steps": [{"name": "s", "role": "a.b", "with": {"cmd": "true"}}],
    }
    assert error_of(doc).field == 'roles["a.b"].x'


def test_tuples_count_as_json_arrays() -> None:
    """Notebook callers may write tuples; json.dumps stores them as arrays, so they are accepted."""
    doc = {
        "roles": {"r": {}},
        "steps": (
            {"name": "a", "role": "r", "with": {"cmd": "true"}},
            {"name": "b", "role": "r", "after": ("a",), "with": {"cmd": "true"}},
        ),
    }
    assert contract.parse(doc).steps[1].after == ("a",)


# --- needs_key ------------------------------------------------------------------------------------


def test_needs_key_ignores_key_order() -> None:
    """Identical demands group under one key whatever order the client wrote them in (P2 cache)."""
    a: dict[str, dict[str, Any]] = {
        "dut": {"board": "stm32f4", "usb": True},
        "bench": {"scope": True},
    }
    b: dict[str, dict[str, Any]] = {
        "bench": {"scope": True},
        "dut": {"usb": True, "board": "stm32f4"},
    }
    assert contract.needs_key(a) == contract.needs_key(b)
    assert len(contract.needs_key(a)) == 64
    assert int(contract.needs_key(a), 16) >= 0


def test_needs_key_keeps_json_types() -> None:
    assert contract.needs_key({"r": {"k": True}}) != contract.needs_key({"r": {"k": 1}})
    assert contract.needs_key({"r": {"k": "1"}}) != contract.needs_key({"r": {"k": 1}})


def test_needs_key_includes_role_names() -> None:
    """The matcher takes roles in name order, so the same needs under other names is another key."""
    assert contract.needs_key({"a": {"k": 1}}) != contract.needs_key({"b": {"k": 1}})


def test_needs_key_of_no_roles_is_stable() -> None:
    assert contract.needs_key({}) == contract.needs_key({})
    assert contract.needs_key({}) != contract.needs_key({"r": {}})


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=4),
        st.one_of(st.booleans(), st.integers(), st.text(max_size=4)),
    )
)
def test_needs_key_is_independent_of_insertion_order(needs: dict[str, Any]) -> None:
    reversed_needs = dict(reversed(list(needs.items())))
    assert contract.needs_key({"r": needs}) == contract.needs_key({"r": reversed_needs})


# --- satisfies and matched ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("need", "cap", "ok"),
    [
        (True, True, True),
        (True, "rigol-ds1054", True),
        (True, 2, True),
        (True, ["a"], True),
        (True, False, False),
        (True, 0, False),
        (True, "", False),
        (True, [], False),
        (1, True, False),
        (True, 1, True),  # true means "present and truthy", and 1 is truthy
        (False, 0, False),
        (0, False, False),
        (False, False, True),
        ("1", 1, False),
        (1, "1", False),
        (1, 1, True),
        (1, 1.0, True),
        (2.5, 2.5, True),
        ("stm32f4", "stm32f4", True),
        ("stm32f4", "STM32F4", False),
        ("stm32f4", ["stm32f7", "stm32f4"], True),
        ("stm32f4", ["stm32f7"], False),
        (1, [True, "1"], False),
        (1, [True, 1.0], True),
        (False, [0, "false"], False),
        (False, [0, False], True),
    ],
)
def test_satisfies_keeps_json_types(need: Any, cap: Any, ok: bool) -> None:
    """docs/design.md §4: no bool/int coercion; lists match by membership under the same rule."""
    assert capabilities.satisfies({"k": need}, {"k": cap}) is ok


def test_satisfies_requires_every_need_and_presence() -> None:
    caps = {"board": "stm32f4", "usb": True}
    assert capabilities.satisfies({}, {})
    assert capabilities.satisfies({"board": "stm32f4", "usb": True}, caps)
    assert not capabilities.satisfies({"board": "stm32f4", "scope": True}, caps)
    assert not capabilities.satisfies({"board": "stm32f4", "usb": False}, caps)


def test_matched_records_the_capability_value_that_satisfied_each_need() -> None:
    """FR-3: steps.chosen.matched says what hardware actually ran the step."""
    caps = {"board": ["stm32f7", "stm32f4"], "scope": "rigol-ds1054", "ram": 8.0, "os": "linux"}
    needs = {"board": "stm32f4", "scope": True, "ram": 8}
    assert capabilities.matched(needs, caps) == {
        "board": "stm32f4",
        "scope": "rigol-ds1054",
        "ram": 8.0,
    }


def test_matched_leaves_out_needs_the_capabilities_no_longer_meet() -> None:
    assert capabilities.matched({"board": "a", "usb": True}, {"board": "b", "usb": True}) == {
        "usb": True
    }


scalars = st.one_of(
    st.booleans(), st.integers(-3, 3), st.floats(-3, 3, allow_nan=False), st.text(max_size=2)
)


@given(scalars)
def test_a_scalar_capability_satisfies_the_same_need(value: Any) -> None:
    expected = bool(value) if value is True else True
    assert capabilities.satisfies({"k": value}, {"k": value}) is expected
    assert capabilities.satisfies({"k": value}, {"k": [value]}) is expected


@given(scalars, scalars)
def test_booleans_never_match_other_types(need: Any, cap: Any) -> None:
    if isinstance(need, bool) != isinstance(cap, bool) and need is not True:
        assert not capabilities.satisfies({"k": need}, {"k": cap})


# --- validate_capabilities ------------------------------------------------------------------------


def test_validate_capabilities_accepts_scalars_and_lists_of_scalars() -> None:
    caps = {"board": ("stm32f4", "stm32f7"), "scope": True, "ram": 8, "cpu": 2.5, "os": "linux"}
    assert capabilities.validate_capabilities(caps) == {
        "board": ["stm32f4", "stm32f7"],
        "scope": True,
        "ram": 8,
        "cpu": 2.5,
        "os": "linux",
    }


@pytest.mark.parametrize(
    ("caps", "field"),
    [
        (["board"], "capabilities"),
        ({"board": None}, "capabilities.board"),
        ({"board": {"v": 1}}, "capabilities.board"),
        ({"board": ["a", None]}, "capabilities.board[1]"),
        ({"board": ["a", ["b"]]}, "capabilities.board[1]"),
        ({"": 1}, 'capabilities[""]'),
        ({"t": float("inf")}, "capabilities.t"),
        ({"t": "\x00"}, "capabilities.t"),
    ],
)
def test_validate_capabilities_refuses_malformed_adverts(caps: object, field: str) -> None:
    with pytest.raises(ContractError) as caught:
        capabilities.validate_capabilities(caps)
    assert caught.value.field == field
    assert caught.value.code == "invalid_capabilities"


def test_validate_capabilities_reports_under_the_given_field() -> None:
    with pytest.raises(ContractError) as caught:
        capabilities.validate_capabilities({"x": None}, field="body.capabilities")
    assert caught.value.field == "body.capabilities.x"


# --- valid_run_id ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["a", "A.b_c-9", "x" * 64, "20240601T120000.000-abc"])
def test_valid_run_ids(value: str) -> None:
    assert limits.valid_run_id(value)


@pytest.mark.parametrize("value", ["", "x" * 65, "a b", "a/b", "é", "a\n", None, 5, ["a"]])
def test_invalid_run_ids(value: object) -> None:
    assert not limits.valid_run_id(value)


# --- dependants -----------------------------------------------------------------------------------


def test_dependants_are_direct_and_transitive() -> None:
    """§7.4: a failed step makes every step depending on it, directly or not, SKIPPED."""
    steps = contract.parse(example()).steps
    assert contract.dependants(steps, "flash") == {"probe", "measure", "verify"}
    assert contract.dependants(steps, "measure") == {"verify"}
    assert contract.dependants(steps, "verify") == set()


def test_dependants_leave_independent_branches_alone() -> None:
    doc = {
        "roles": {"r": {}},
        "steps": [
            {"name": "a", "role": "r", "with": {"cmd": "true"}},
            {"name": "b", "role": "r", "with": {"cmd": "true"}},
            {"name": "a2", "role": "r", "after": ["a"], "with": {"cmd": "true"}},
            {"name": "ab", "role": "r", "after": ["a2", "b"], "with": {"cmd": "true"}},
            {"name": "b2", "role": "r", "after": ["b"], "with": {"cmd": "true"}},
        ],
    }
    steps = contract.parse(doc).steps
    assert contract.dependants(steps, "a") == {"a2", "ab"}
    assert contract.dependants(steps, "b") == {"ab", "b2"}


@given(st.data())
def test_dependants_equal_reachability_over_after(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 8))
    steps = []
    for i in range(n):
        after = data.draw(st.lists(st.integers(0, i - 1), unique=True)) if i else []
        steps.append(
            {
                "name": f"s{i}",
                "role": "r",
                "after": [f"s{j}" for j in after],
                "with": {"cmd": "true"},
            }
        )
    parsed = contract.parse({"roles": {"r": {}}, "steps": steps}).steps
    failed = data.draw(st.integers(0, n - 1))

    def depends_on(i: int, target: int) -> bool:
        return any(
            j == target or depends_on(j, target) for j in (int(a[1:]) for a in steps[i]["after"])
        )

    expected = {f"s{i}" for i in range(n) if depends_on(i, failed)}
    assert contract.dependants(parsed, f"s{failed}") == expected


# --- parse leaves its input alone -----------------------------------------------------------------


def test_parse_leaves_the_document_unchanged() -> None:
    doc = example()
    before = copy.deepcopy(doc)
    contract.parse(doc)
    assert doc == before
    assert json.loads(json.dumps(doc)) == before


def refused(doc: object, field: str) -> ContractError:
    """The contract is refused and the error names ``field``."""
    e = error_of(doc)
    assert e.field == field, (e.field, e.message)
    return e


# ---- issue 11: ids that become paths, text that cannot be stored, depth and size limits --------
@pytest.mark.parametrize("bad", [".", "..", ".hidden", "...", "./a", "a/b", "", "x" * 65, "\x00"])
def test_ids_that_could_be_paths_are_refused(bad: str) -> None:
    """Issue 11 §1: ``.``/``..`` and a leading dot passed the old pattern and became folders."""
    doc = example()
    doc["run_id"] = bad
    refused(doc, "run_id")
    assert not limits.valid_id(bad)
    doc = example()
    doc["roles"][bad] = doc["roles"].pop("dut")
    with pytest.raises(ContractError):
        contract.parse(doc)


@pytest.mark.parametrize("good", ["a", "a.b", "a..b", "-x", "_", "9" * 64, "hil-2024.06_01"])
def test_ordinary_ids_still_pass(good: str) -> None:
    assert limits.valid_id(good)


def nest(depth: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        doc = {"k": doc}
    return doc


def test_a_with_nested_past_the_limit_is_refused_before_anything_walks_it() -> None:
    """Issue 11 §4: a 600-deep ``with`` once committed a run nothing could read back."""
    doc = example()
    doc["steps"][0]["uses"] = "flash"  # a plugin: its `with` is the plugin's to read
    doc["steps"][0]["with"] = nest(limits.MAX_DEPTH)
    contract.parse(doc)
    for depth in (limits.MAX_DEPTH + 1, 600, 50_000):
        doc["steps"][0]["with"] = nest(depth)
        e = refused(doc, "steps[0].with")
        assert str(limits.MAX_DEPTH) in e.message and e.code == "too_deep"


@pytest.mark.parametrize("bad", ["a\x00b", "a\udc00", "\ud800"])
def test_nul_and_lone_surrogates_are_refused_anywhere_in_a_contract(bad: str) -> None:
    for spoil, field in [
        (lambda d: d.update(work_id=bad), "work_id"),
        (lambda d: d["steps"][0].update(name=bad), "steps[0].name"),
        (lambda d: d["steps"][0]["with"].update(cmd=bad), "steps[0].with.cmd"),
        (lambda d: d["roles"]["dut"].update(board=bad), "roles.dut.board"),
    ]:
        doc = example()
        spoil(doc)
        refused(doc, field)


def test_logs_are_escaped_not_refused() -> None:
    """Amendments round 2: logs may hold binary junk; NUL → ␀, lone surrogates → U+FFFD."""
    assert limits.escape_log("plain\n") == "plain\n"
    assert limits.escape_log("a\x00b\udc00c\U0001f600") == "a\u2400b\ufffdc\U0001f600"
    limits.escape_log("\ud800" * 3).encode("utf-8")


@pytest.mark.parametrize(
    ("spoil", "field"),
    [
        (lambda d: d.update(roles={f"r{i}": {} for i in range(10 * limits.MAX_ROLES)}), "roles"),
        (lambda d: d["roles"].update(dut={f"k{i}": 1 for i in range(10 * limits.MAX_NEEDS)}),
         "roles.dut"),
        (lambda d: d["roles"]["dut"].update(board="b" * 10 * limits.MAX_VALUE),
         "roles.dut.board"),
        (lambda d: d["roles"]["dut"].update({"k" * 10 * limits.MAX_KEY: 1}), None),
        (lambda d: d["steps"][0]["with"].update(cmd="c" * 10 * limits.MAX_TEXT),
         "steps[0].with.cmd"),
        (lambda d: d["steps"][0].update(uses="u" * 10 * limits.MAX_KEY), "steps[0].uses"),
        (lambda d: d.update(work_id="w" * 10 * limits.MAX_WORK_ID), "work_id"),
    ],
)  # fmt: skip
def test_every_limit_at_ten_times_its_value_is_refused_naming_the_field(spoil, field) -> None:
    doc = example()
    spoil(doc)
    with pytest.raises(ContractError) as e:
        contract.parse(doc)
    if field is not None:
        assert e.value.field == field, e.value.message


def test_capabilities_have_limits_too() -> None:
    with pytest.raises(ContractError) as e:
        capabilities.validate_capabilities(
            {f"c{i}": 1 for i in range(10 * limits.MAX_CAPABILITIES)}
        )
    assert e.value.field == "capabilities"
    with pytest.raises(ContractError) as e:
        capabilities.validate_capabilities({"l": list(range(10 * limits.MAX_LIST))})
    assert e.value.field == "capabilities.l"
    with pytest.raises(ContractError) as e:
        capabilities.validate_capabilities({"l": [[[1]]]})
    assert e.value.field is not None and e.value.field.startswith("capabilities.l")


def _one_step(**step: object) -> dict[str, object]:
    return {"roles": {"dut": {}}, "steps": [{"name": "s", "role": "dut", **step}]}


@pytest.mark.parametrize(
    ("step", "field"),
    [
        ({}, "steps[0].with.cmd"),  # the README's old example: no uses, no with
        ({"uses": "shell"}, "steps[0].with.cmd"),
        ({"with": {"cmd": ""}}, "steps[0].with.cmd"),
        ({"with": {"cmd": "  "}}, "steps[0].with.cmd"),
        ({"with": {"cmd": []}}, "steps[0].with.cmd"),
        ({"with": {"cmd": ["ls", 1]}}, "steps[0].with.cmd"),
        ({"with": {"cmd": 3}}, "steps[0].with.cmd"),
        ({"with": {"cmd": "x", "timeout": -1}}, "steps[0].with.timeout"),
        ({"with": {"cmd": "x", "timeout": True}}, "steps[0].with.timeout"),
        ({"with": {"cmd": "x", "timeout": "5"}}, "steps[0].with.timeout"),
        ({"with": {"cmd": "x", "timout": 5}}, "steps[0].with.timout"),
        ({"uses": "sleep"}, "steps[0].with.seconds"),
        ({"uses": "sleep", "with": {"seconds": "1"}}, "steps[0].with.seconds"),
        ({"uses": "sleep", "with": {"second": 1}}, "steps[0].with.second"),
        ({"uses": "fail", "with": {"message": 1}}, "steps[0].with.message"),
        ({"uses": "shel", "with": {"cmd": "x"}}, "steps[0].uses"),
        ({"uses": "Shell", "with": {"cmd": "x"}}, "steps[0].uses"),
        ({"uses": "slepe", "with": {"seconds": 1}}, "steps[0].uses"),
        ({"uses": "fial"}, "steps[0].uses"),
    ],
)
def test_a_builtin_action_s_arguments_are_checked_at_submit(step, field) -> None:
    """design.md §4, §19 (issue 29): what the node's built-in would refuse at once is a 400 at
    submit naming the field, never a 202 that fails on the node after the caller left."""
    e = refused(_one_step(**step), field)
    if field == "steps[0].uses":
        assert e.code == "unknown_action" and "did you mean" in e.message


@pytest.mark.parametrize(
    "step",
    [
        {"with": {"cmd": "make test"}},
        {"with": {"cmd": ["ls", "-l"], "timeout": 2.5}},
        {"uses": "sleep", "with": {"seconds": 0}},
        {"uses": "fail"},
        {"uses": "fail", "with": {"message": "boom"}},
        {"uses": "sim", "with": {}},  # the simulator's action: not a built-in, never checked
        {"uses": "flash", "with": {"image": "a.bin", "anything": [1, {"x": None}]}},
        {"uses": "shellcheck"},  # far from every built-in: a plugin's name
    ],
)
def test_good_builtin_steps_and_any_plugin_step_are_accepted(step) -> None:
    contract.parse(_one_step(**step))


def test_near_builtin_matches_exactly_one_edit_by_brute_force() -> None:
    """The typo rule against a reference: edit distance with neighbour swaps, by brute force."""

    def distance(a: str, b: str) -> int:
        d = [
            [max(i, j) if min(i, j) == 0 else 0 for j in range(len(b) + 1)]
            for i in range(len(a) + 1)
        ]
        for i in range(1, len(a) + 1):
            for j in range(1, len(b) + 1):
                d[i][j] = min(
                    d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])
                )
                if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                    d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
        return d[len(a)][len(b)]

    import itertools

    words = {
        "".join(p) for n in range(2, 7) for p in itertools.product("shelpfai", repeat=n) if n <= 4
    }
    words |= {"shell", "shel", "shelll", "sehll", "sleep", "slep", "sleeep", "fail", "fial", "sim"}
    for word in sorted(words):
        expect = next(
            (b for b in contract.BUILTIN_ACTIONS if word != b and distance(word, b) == 1), None
        )
        if word in contract.BUILTIN_ACTIONS:
            expect = None
        assert contract._near_builtin(word) == expect, word


def test_the_actions_check_reads_each_roles_nodes_once_not_once_per_step(monkeypatch):
    """docs/design.md §4 "Actions": submit asks ``unoffered_action`` on every submit, so its
    cost must not be steps × nodes (1,000 steps over 5,000 nodes would be 5 million capability
    checks). It checks each role's nodes once, and nothing at all when no node says what it
    offers (the simulator's fleets)."""
    from mediator.core import contract as contract_mod

    calls = 0
    real = contract_mod.satisfies

    def counting(needs, caps):
        nonlocal calls
        calls += 1
        return real(needs, caps)

    monkeypatch.setattr(contract_mod, "satisfies", counting)
    steps = [{"name": f"s{i}", "role": "dut" if i % 2 else "bench", "uses": "flash", "with": {}}
             for i in range(1000)]  # fmt: skip
    doc = contract_mod.parse(
        {"roles": {"dut": {"board": "x"}, "bench": {"scope": True}}, "steps": steps}
    )
    silent = [({"board": "x", "scope": True}, None)] * 5000
    assert contract_mod.unoffered_action(doc, silent) is None and calls == 0
    saying = [({"board": "x", "scope": True}, frozenset({"flash"}))] * 5000
    assert contract_mod.unoffered_action(doc, saying) is None
    assert calls == 2 * 5000  # two roles, each over the fleet once
    calls = 0
    lacking = [({"board": "x", "scope": True}, frozenset({"shell"}))] * 5000
    refused = contract_mod.unoffered_action(doc, lacking)
    assert refused is not None and refused.field == "steps[0].uses" and calls == 5000
