"""Contracts: what a run asks for, checked once.

A contract names *roles* (each with the capabilities it needs; one node fills each role) and *steps*
(exec steps run on their role's node, ask steps put a question to a person). ``parse`` (the seeds'
``NeedsOf``) decides whether a document is a contract at all, doing every structural check
synchronously at submit (R5): a run that was answered 201 or 202 must never die later of a malformed
contract, because at promotion time there is no caller left to tell (docs/design.md §4).

Whether a node can serve a role is the capability rule (``mediator.core.capabilities``); the size
limits and text checks every input passes are in ``mediator.core.limits``. It is pure — no I/O, no
clock — so submit, the promotion sweep and the tests all share it.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from mediator.core.capabilities import is_scalar, satisfies
from mediator.core.errors import ContractError, UnknownAction
from mediator.core.limits import (
    ID_RE,
    MAX_BODY_DEPTH,
    MAX_DEPTH,
    MAX_ID,
    MAX_KEY,
    MAX_NEEDS,
    MAX_ROLES,
    MAX_STEPS,
    MAX_WORK_ID,
    check_json,
    check_value_length,
    depth_over,
    field_path,
    valid_id,
)

_ROLE_RE: Final = ID_RE
_MAX_WORK_ID: Final = MAX_WORK_ID
_MAX_STEP_NAME: Final = MAX_KEY
_TOP_KEYS: Final = ("run_id", "work_id", "roles", "steps")
_EXEC: Final = "exec"
_ASK: Final = "ask"
_DEFAULT_USES: Final = "shell"
_STEP_KEYS: Final = ("name", "kind", "role", "uses", "with", "after", "ask")
# The enode's built-in actions and the ``with`` keys each takes (mediator/enode/actions.py). A
# plugin can never take a built-in's name, so these are known to the Mediator exactly and are
# checked at submit (docs/design.md §4, §19); any other ``uses`` is a plugin the Mediator cannot
# check here.
BUILTIN_ACTIONS: Final = {"shell": ("cmd", "timeout"), "sleep": ("seconds",), "fail": ("message",)}
_SHOWN: Final = 40  # characters of a bad value an error message repeats


@dataclass(frozen=True)
class StepSpec:
    """One step as the contract declares it (the submit-time row of ``steps``, R5).

    Attributes:
        seq: 0-based position in the contract's ``steps`` list; the row's key with ``run_id``.
        name: Unique within the contract; what ``after`` refers to.
        kind: ``"exec"`` or ``"ask"``.
        role: The role whose node runs an exec step; ``""`` for ask steps.
        uses: The action an exec step runs (``"shell"`` when omitted); ``""`` for ask steps.
        with_: The action's arguments, the step's ``with`` object (``{}`` when absent).
        after: Names of the steps that must be PASSED before this one may start.
        ask: The question of an ask step; ``""`` for exec steps.
    """

    seq: int
    name: str
    kind: str
    role: str
    uses: str
    with_: Mapping[str, Any]
    after: tuple[str, ...]
    ask: str


@dataclass(frozen=True)
class Contract:
    """A contract that passed every structural check of docs/design.md §4.

    Attributes:
        run_id: The client's idempotency key (R3), or ``None`` when the Mediator must generate one.
        work_id: Groups runs (e.g. a ticket hash); ``""`` when absent.
        roles: ``{role: needs}``; ``{}`` for a contract made only of ask steps.
        steps: In contract order, ``steps[i].seq == i``.
        doc: The document as submitted, to be stored as-is.
    """

    run_id: str | None
    work_id: str
    roles: Mapping[str, Mapping[str, Any]]
    steps: tuple[StepSpec, ...]
    doc: Mapping[str, Any]


def parse(doc: object) -> Contract:
    """Validate a contract document and return it parsed (``NeedsOf``'s structural half, R5).

    Checks run in document order and the first problem found is raised, so the same document
    always yields the same error. Unknown keys are errors at every level (amendments round 2,
    issue 15 §3): a typo such as ``"afer"`` or ``"max_widht"`` would otherwise silently drop a
    dependency or a setting; the error names the closest known key. Every size and depth limit
    (``LIMITS``) is checked here, before anything is written (issue 11 §4).

    Args:
        doc: The decoded JSON document (a ``dict`` from ``json.loads`` or a notebook).

    Returns:
        The parsed contract; ``doc`` is kept by reference, not copied.

    Raises:
        ContractError: The document is not a contract; ``field`` names the offending path, e.g.
            ``"steps[2].after"`` or ``"roles.dut.board"``.
    """
    if not isinstance(doc, Mapping):
        raise ContractError(
            'The contract must be a JSON object with "roles" and "steps".', field=None
        )
    _check_keys(doc, _TOP_KEYS, "", "a contract key")
    _check_with_depth(doc)
    check_json(doc, max_depth=MAX_BODY_DEPTH)
    run_id = _parse_run_id(doc)
    work_id = _parse_work_id(doc)
    roles = _parse_roles(doc)
    steps = _parse_steps(doc, roles)
    _check_after_names(steps)
    _check_acyclic(steps)
    _check_roles_used(roles, steps)
    return Contract(run_id=run_id, work_id=work_id, roles=roles, steps=steps, doc=doc)


def needs_of(doc: object) -> dict[str, dict[str, Any]]:
    """Return ``{role: needs}`` of a contract document after validating all of it (R5).

    Args:
        doc: The decoded JSON document.

    Returns:
        Fresh dictionaries the caller may keep or change.

    Raises:
        ContractError: As ``parse``.
    """
    return {role: dict(needs) for role, needs in parse(doc).roles.items()}


def needs_key(needs_by_role: Mapping[str, Mapping[str, Any]]) -> str:
    """Return the canonical hash of a run's needs by role (the ``runs.needs_key`` column).

    Identical demands get identical keys whatever their key order, so the promotion sweep can
    remember an ALL_BUSY or NO_CANDIDATE answer per key (docs/design.md §4, P2). Role names are part
    of the key because the matcher takes roles in name order. JSON types are kept (``true`` and
    ``1`` differ); ``1`` and ``1.0`` also get different keys although they match alike, which only
    costs the sweep a cache miss, never a wrong answer.

    Args:
        needs_by_role: ``{role: needs}`` as ``needs_of`` returns it.

    Returns:
        64 lowercase hex digits (SHA-256).
    """
    canonical = json.dumps(
        {role: dict(needs) for role, needs in needs_by_role.items()},
        sort_keys=True,
        separators=(",", ":"),
        allow_nan=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def dependants(steps: Sequence[StepSpec], failed: str) -> set[str]:
    """Return every step that depends on ``failed``, directly or through other steps.

    These become SKIPPED when ``failed`` fails (docs/design.md §9): they can no longer run.

    Args:
        steps: The run's steps.
        failed: The name of the step that failed.

    Returns:
        Step names, ``failed`` itself excluded; empty when nothing waits for it.
    """
    waiting_on: dict[str, list[str]] = {}
    for step in steps:
        for name in step.after:
            waiting_on.setdefault(name, []).append(step.name)
    found: set[str] = set()
    todo = deque([failed])
    while todo:
        for name in waiting_on.get(todo.popleft(), ()):
            if name not in found:
                found.add(name)
                todo.append(name)
    found.discard(failed)
    return found


def _show(value: object) -> str:
    """A value as JSON for an error message, cut short: messages echo input, never all of it."""
    text = json.dumps(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def _check_keys(doc: Mapping[str, Any], known: Sequence[str], at: str, what: str) -> None:
    """Unknown keys are a 400 naming the key and the closest known one (issue 15 §3)."""
    for key in doc:
        if key not in known:
            field = field_path(at, key) if isinstance(key, str) else at or None
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f'did you mean "{close[0]}"?' if close else f"use {', '.join(known)}."
            raise ContractError(f"{field} is not {what}; {hint}", field=field)


def _check_with_depth(doc: Mapping[str, Any]) -> None:
    """Issue 11 §4: a step's ``with`` nests at most MAX_DEPTH levels, checked before anything
    else walks it (a 600-deep ``with`` once committed a run that nothing could read back)."""
    steps = doc.get("steps")
    if not isinstance(steps, list | tuple):
        return
    for seq, step in enumerate(steps[: MAX_STEPS + 1]):
        if isinstance(step, Mapping) and depth_over(step.get("with"), MAX_DEPTH):
            field = f"steps[{seq}].with"
            raise ContractError(
                f"{field} is nested too deep: at most {MAX_DEPTH} levels are allowed.",
                field=field,
                code="too_deep",
            )


def _parse_run_id(doc: Mapping[str, Any]) -> str | None:
    # null counts as absent: clients that always send the key may leave it empty (R3 then
    # does not apply and the Mediator generates the id).
    run_id = doc.get("run_id")
    if run_id is None:
        return None
    if not valid_id(run_id):
        raise ContractError(
            f"run_id must be 1 to {MAX_ID} characters from A-Z a-z 0-9 . _ - and must not "
            f"start with '.', got {_show(run_id)}.",
            field="run_id",
        )
    return str(run_id)


def _parse_work_id(doc: Mapping[str, Any]) -> str:
    work_id = doc.get("work_id")
    if work_id is None:
        return ""
    if not isinstance(work_id, str) or len(work_id) > _MAX_WORK_ID:
        raise ContractError(
            f"work_id must be a string of at most {_MAX_WORK_ID} characters.", field="work_id"
        )
    return work_id


def _parse_roles(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    if "roles" not in doc:
        raise ContractError(
            'The contract has no "roles"; give an object of role names to needs ({} if every '
            "step is an ask).",
            field="roles",
        )
    raw = doc["roles"]
    if not isinstance(raw, Mapping):
        raise ContractError(
            'roles must be an object of role names to needs, e.g. {"dut": {"board": "stm32f4"}}.',
            field="roles",
        )
    if len(raw) > MAX_ROLES:
        raise ContractError(
            f"roles has {len(raw)} entries; at most {MAX_ROLES} are allowed.", field="roles"
        )
    roles: dict[str, dict[str, Any]] = {}
    for role, needs in raw.items():
        path = field_path("roles", role)
        if not _ROLE_RE.fullmatch(role):
            raise ContractError(
                f"{path}: a role name must be 1 to {MAX_ID} characters from A-Z a-z 0-9 . _ - "
                "and must not start with '.'.",
                field=path,
            )
        if not isinstance(needs, Mapping):
            raise ContractError(
                f"{path} must be an object of capability names to required values.", field=path
            )
        if len(needs) > MAX_NEEDS:
            raise ContractError(
                f"{path} has {len(needs)} needs; at most {MAX_NEEDS} are allowed.", field=path
            )
        for key, want in needs.items():
            need_path = field_path(path, key)
            if not key or len(key) > MAX_KEY:
                raise ContractError(
                    f"{need_path}: a capability name must be 1 to {MAX_KEY} characters.",
                    field=need_path,
                )
            if not is_scalar(want):
                raise ContractError(
                    f"{need_path} must be a string, number or boolean (true: present and "
                    f"truthy), not {_show(want)}.",
                    field=need_path,
                )
            check_value_length(want, need_path, None)
        roles[role] = dict(needs)
    return roles


def _parse_steps(doc: Mapping[str, Any], roles: Mapping[str, Any]) -> tuple[StepSpec, ...]:
    raw = doc.get("steps")
    if not isinstance(raw, list | tuple) or not raw:
        raise ContractError('The contract needs a non-empty "steps" list.', field="steps")
    if len(raw) > MAX_STEPS:
        raise ContractError(
            f"The contract has {len(raw)} steps; at most {MAX_STEPS} are allowed.", field="steps"
        )
    seen: dict[str, int] = {}
    steps = []
    for seq, item in enumerate(raw):
        step = _parse_step(seq, item, roles)
        if step.name in seen:
            raise ContractError(
                f"steps[{seq}].name {_show(step.name)} is already the name of "
                f"steps[{seen[step.name]}]; step names must be unique.",
                field=f"steps[{seq}].name",
            )
        seen[step.name] = seq
        steps.append(step)
    return tuple(steps)


def _parse_step(seq: int, item: object, roles: Mapping[str, Any]) -> StepSpec:
    at = f"steps[{seq}]"
    if not isinstance(item, Mapping):
        raise ContractError(f"{at} must be an object with at least a name.", field=at)
    _check_keys(item, _STEP_KEYS, at, "a step key")
    name = item.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > _MAX_STEP_NAME:
        raise ContractError(
            f"{at}.name must be a non-empty string of at most {_MAX_STEP_NAME} characters.",
            field=f"{at}.name",
        )
    kind = item.get("kind", _EXEC)
    if kind == _EXEC:
        return _parse_exec(seq, name, item, roles)
    if kind == _ASK:
        return _parse_ask(seq, name, item)
    raise ContractError(
        f'{at}.kind must be "exec" or "ask", not {_show(kind)}.', field=f"{at}.kind"
    )


def _parse_exec(seq: int, name: str, item: Mapping[str, Any], roles: Mapping[str, Any]) -> StepSpec:
    at = f"steps[{seq}]"
    if "ask" in item:
        raise ContractError(
            f'{at}.ask is a question but the step is an exec step; add "kind": "ask" or '
            'remove "ask".',
            field=f"{at}.ask",
        )
    role = item.get("role")
    if not isinstance(role, str) or role not in roles:
        known = ", ".join(sorted(roles)) or "none declared"
        raise ContractError(
            f"{at}.role must name one of the contract's roles ({known}); an exec step runs on "
            "its role's node.",
            field=f"{at}.role",
        )
    uses = item.get("uses", _DEFAULT_USES)
    if not isinstance(uses, str) or not uses or len(uses) > MAX_KEY:
        raise ContractError(
            f'{at}.uses must be an action name such as "shell", at most {MAX_KEY} characters.',
            field=f"{at}.uses",
        )
    with_ = item.get("with", {})
    if not isinstance(with_, Mapping):
        raise ContractError(
            f"{at}.with must be an object of the action's arguments.", field=f"{at}.with"
        )
    _check_action(at, uses, with_)
    return StepSpec(
        seq=seq,
        name=name,
        kind=_EXEC,
        role=role,
        uses=uses,
        with_=dict(with_),
        after=_parse_after(at, item),
        ask="",
    )


def _near_builtin(uses: str) -> str | None:
    """The built-in ``uses`` is one edit (or a change of case) away from, if it is not one.

    ``"shel"``, ``"Shell"`` or ``"slepe"`` would otherwise be taken for a plugin, accepted, and
    fail on the node long after the caller left (issue 29). Plugin names that close to a
    built-in's are refused for the same reason (docs/design.md §19).
    """
    if uses in BUILTIN_ACTIONS:
        return None
    for name in BUILTIN_ACTIONS:
        if uses.lower() == name or _one_edit(uses.lower(), name):
            return name
    return None


def _one_edit(a: str, b: str) -> bool:
    """Whether ``a`` becomes ``b`` by one insertion, deletion, substitution or neighbour swap."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and a[diff[0]] == b[diff[1]]
            and a[diff[1]] == b[diff[0]]
        )
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return any(long_[:i] + long_[i + 1 :] == short for i in range(len(long_)))


def _check_action(at: str, uses: str, with_: Mapping[str, Any]) -> None:
    """A built-in's ``with`` is checked here as the node would (docs/design.md §4): a step the
    node would fail at once for a missing or wrong argument is a 400 at submit, naming the field."""
    near = _near_builtin(uses)
    if near is not None:
        raise ContractError(
            f'{at}.uses {_show(uses)} is not an action; did you mean "{near}"?',
            field=f"{at}.uses",
            code="unknown_action",
        )
    known = BUILTIN_ACTIONS.get(uses)
    if known is None:
        return
    _check_keys(with_, known, f"{at}.with", f"an argument of the {uses} action")
    if uses == "shell":
        cmd = with_.get("cmd")
        good = (isinstance(cmd, str) and cmd.strip()) or (
            isinstance(cmd, list | tuple) and cmd and all(isinstance(c, str) for c in cmd)
        )
        if not good:
            what = "has no" if cmd is None else "has a bad"
            raise ContractError(
                f"{at}.with.cmd: the shell action {what} command; give a string for /bin/sh -c "
                f'or a list of strings (argv), e.g. "with": {{"cmd": "make test"}}.',
                field=f"{at}.with.cmd",
            )
        _check_seconds(at, with_, "timeout", required=False)
    elif uses == "sleep":
        _check_seconds(at, with_, "seconds", required=True)
    elif uses == "fail":
        message = with_.get("message")
        if message is not None and not isinstance(message, str):
            raise ContractError(f"{at}.with.message must be a string.", field=f"{at}.with.message")


def _check_seconds(at: str, with_: Mapping[str, Any], key: str, *, required: bool) -> None:
    value = with_.get(key)
    if value is None and not required:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ContractError(
            f"{at}.with.{key} must be a number of seconds >= 0, not {_show(value)}.",
            field=f"{at}.with.{key}",
        )


def _parse_ask(seq: int, name: str, item: Mapping[str, Any]) -> StepSpec:
    at = f"steps[{seq}]"
    # An ask runs on no node: a role would widen the run for nothing, and uses/with would be
    # silently ignored, so all three are refused rather than dropped.
    for key in ("role", "uses", "with"):
        if key in item:
            raise ContractError(
                f'{at}.{key}: an ask step runs on no node, so it takes no "{key}".',
                field=f"{at}.{key}",
            )
    question = item.get("ask")
    if not isinstance(question, str) or not question.strip():
        raise ContractError(f"{at}.ask must be the question to put to a person.", field=f"{at}.ask")
    return StepSpec(
        seq=seq,
        name=name,
        kind=_ASK,
        role="",
        uses="",
        with_={},
        after=_parse_after(at, item),
        ask=question,
    )


def _parse_after(at: str, item: Mapping[str, Any]) -> tuple[str, ...]:
    after = item.get("after", [])
    if (
        not isinstance(after, list | tuple)
        or len(after) > MAX_STEPS
        or not all(isinstance(n, str) for n in after)
    ):
        raise ContractError(
            f"{at}.after must be a list of at most {MAX_STEPS} step names.", field=f"{at}.after"
        )
    return tuple(after)


def _check_after_names(steps: Sequence[StepSpec]) -> None:
    names = {step.name for step in steps}
    for step in steps:
        for name in step.after:
            field = f"steps[{step.seq}].after"
            if name == step.name:
                raise ContractError(
                    f"{field} names the step itself; a step cannot wait for its own result.",
                    field=field,
                )
            if name not in names:
                raise ContractError(
                    f"{field} names {_show(name)}, which is not a step of this contract.",
                    field=field,
                )


def _check_acyclic(steps: Sequence[StepSpec]) -> None:
    """Refuse ``after`` cycles: no step on one could ever start, and the run would never settle.

    Depth-first search in step order, iterative because a 1,000-step chain is deeper than
    Python's recursion limit. The step whose ``after`` closes the cycle is the one reported.
    """
    seq_of = {step.name: step.seq for step in steps}
    done: set[int] = set()
    for root in steps:
        if root.seq in done:
            continue
        path = [root.seq]
        on_path = {root.seq}
        pending = [iter(root.after)]
        while pending:
            for name in pending[-1]:
                dep = seq_of[name]
                if dep in on_path:
                    cycle = [*path[path.index(dep) :], dep]
                    chain = " waits for ".join(_show(steps[i].name) for i in cycle)
                    field = f"steps[{path[-1]}].after"
                    raise ContractError(
                        f"{field} closes a cycle ({chain}); no step in it could ever start.",
                        field=field,
                    )
                if dep not in done:
                    path.append(dep)
                    on_path.add(dep)
                    pending.append(iter(steps[dep].after))
                    break
            else:
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                pending.pop()


def _check_roles_used(roles: Mapping[str, Any], steps: Sequence[StepSpec]) -> None:
    # A role no step uses would still be matched and lease a node that then sits idle for the
    # whole run, and would widen the run toward max_width (R10) for nothing.
    used = {step.role for step in steps}
    for role in roles:
        if role not in used:
            field = field_path("roles", role)
            raise ContractError(
                f"{field} is used by no step; remove the role or give it a step.",
                field=field,
            )


def unoffered_action(
    contract: Contract, nodes: Iterable[tuple[Mapping[str, Any], frozenset[str] | None]]
) -> UnknownAction | None:
    """The first exec step whose plugin ``uses`` no node able to fill its role offers
    (docs/design.md §4 "Actions"), as the error to answer; None when every step's is offered.

    ``nodes`` are the live nodes as ``(capabilities, actions)``; ``actions`` None means the node
    did not say (an older daemon, an in-process node), so it may offer anything. Built-ins are
    on every node. A role no node can fill at all is left to the matcher (``NO_CANDIDATE``).
    """
    fleet = list(nodes)
    if all(acts is None for _, acts in fleet):
        return None  # no node says (the simulator's fleets): nothing to check, nothing to pay
    able_by_role: dict[str, list[frozenset[str] | None]] = {}
    checked: set[tuple[str, str]] = set()
    for step in contract.steps:  # each role's able nodes once: O(roles × nodes), not steps ×
        if step.kind != "exec" or step.uses in BUILTIN_ACTIONS or (step.role, step.uses) in checked:
            continue
        checked.add((step.role, step.uses))
        able = able_by_role.get(step.role)
        if able is None:
            needs = contract.roles[step.role]
            able = able_by_role[step.role] = [a for caps, a in fleet if satisfies(needs, caps)]
        if not able or any(acts is None or step.uses in acts for acts in able):
            continue
        offered = sorted(set().union(*(acts for acts in able if acts is not None)))
        shown = ", ".join(offered[:20]) + (f" and {len(offered) - 20} more" if offered[20:] else "")
        at = f"steps[{step.seq}].uses"
        return UnknownAction(
            f"{at}: no live node that can fill role {_show(step.role)} offers the action "
            f"{_show(step.uses)} (they offer: {shown}); install that plugin on such a node, or "
            "check the name.",
            field=at,
        )
    return None
