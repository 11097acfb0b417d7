"""Contracts: what a run asks for, checked once, and the rule that says whether a node can serve it.

A contract names *roles* (each with the capabilities it needs; one node fills each role) and *steps*
(exec steps run on their role's node, ask steps put a question to a person). This module is the
single place that decides two things (docs/design.md §4):

* whether a document is a contract at all. ``parse`` (the seeds' ``NeedsOf``) does every structural
  check synchronously at submit (R5): a run that was answered 201 or 202 must never die later of a
  malformed contract, because at promotion time there is no caller left to tell.
* whether a node's advertised capabilities satisfy a role's needs (``satisfies``), with JSON types
  kept, so ``true`` never equals ``1``.

It is pure — no I/O, no clock — so submit, the promotion sweep and the tests all share it.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from mediator.errors import ContractError

# ---- limits (docs/security.md lists each with its value; a test keeps the two in step) --------
MAX_ID: Final = 64  # run_id, node_id, role names
MAX_STEPS: Final = 1000
MAX_ROLES: Final = 64
MAX_NEEDS: Final = 64  # needs of one role
MAX_CAPABILITIES: Final = 256  # capabilities of one advert
MAX_LIST: Final = 256  # members of one capability list
MAX_KEY: Final = 128  # a capability or need name, a step name, an action name
MAX_VALUE: Final = 1024  # a string need or capability value
MAX_WORK_ID: Final = 200
MAX_TEXT: Final = 10_000  # any other string: a `with` value or key, a question, an answer
MAX_DEPTH: Final = 32  # nesting inside a step's `with` (the `with` object is level 1)
MAX_BODY_DEPTH: Final = 64  # nesting of any JSON document the API decodes
MAX_NUMBER_CHARS: Final = 40  # characters of one JSON number (a 5,000-digit integer is refused)
LIMITS: Final = {
    "MAX_ID": MAX_ID, "MAX_STEPS": MAX_STEPS, "MAX_ROLES": MAX_ROLES, "MAX_NEEDS": MAX_NEEDS,
    "MAX_CAPABILITIES": MAX_CAPABILITIES, "MAX_LIST": MAX_LIST, "MAX_KEY": MAX_KEY,
    "MAX_VALUE": MAX_VALUE, "MAX_WORK_ID": MAX_WORK_ID, "MAX_TEXT": MAX_TEXT,
    "MAX_DEPTH": MAX_DEPTH, "MAX_BODY_DEPTH": MAX_BODY_DEPTH,
    "MAX_NUMBER_CHARS": MAX_NUMBER_CHARS,
}  # fmt: skip

# Ids become folder names (records) and appear in URLs: letters, digits, `.`, `_`, `-`, but never
# a leading `.` — so never `.` or `..`, and never a hidden file (issue 11 §1, docs/security.md).
ID_RE: Final = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{MAX_ID - 1}}}")
RUN_ID_RE: Final = ID_RE
# Role names share the id alphabet: they appear in `assigned`, in events and in field paths.
_ROLE_RE: Final = ID_RE
_MAX_WORK_ID: Final = MAX_WORK_ID
_MAX_STEP_NAME: Final = MAX_KEY
_TOP_KEYS: Final = ("run_id", "work_id", "roles", "steps")
_EXEC: Final = "exec"
_ASK: Final = "ask"
_DEFAULT_USES: Final = "shell"
_STEP_KEYS: Final = ("name", "kind", "role", "uses", "with", "after", "ask")
# Keys written bare in a field path; anything else is quoted, so "roles.a.b" is never ambiguous.
_PLAIN_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")
_MISSING: Final = object()
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
    _check_json(doc, max_depth=MAX_BODY_DEPTH)
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


def satisfies(needs: Mapping[str, Any], caps: Mapping[str, Any]) -> bool:
    """Say whether capabilities meet every need of one role (docs/design.md §4).

    A need ``true`` asks for the capability to be present and truthy. Any other need must equal
    the capability, or be a member of it when the capability is a list. Equality keeps JSON
    types: a boolean never equals a number or a string (``1`` does not match ``true``, ``"1"``
    does not match ``1``); integers and floats compare as numbers (``1`` matches ``1.0``).

    Args:
        needs: The role's needs, ``{key: scalar}``.
        caps: A node's capabilities, ``{key: scalar or list of scalars}``.

    Returns:
        ``True`` when every need is met; ``True`` for empty needs.
    """
    return all(
        _satisfier(want, caps.get(key, _MISSING)) is not _MISSING for key, want in needs.items()
    )


def matched(needs: Mapping[str, Any], caps: Mapping[str, Any]) -> dict[str, Any]:
    """Return what satisfied each need, for ``steps.chosen.matched`` (FR-3: what hardware ran it).

    For a need ``true`` that is the capability's value itself; for a list capability, the member
    that equalled the need (in the node's own JSON type, e.g. ``1.0`` for a need ``1``).

    Args:
        needs: The role's needs.
        caps: The chosen node's capabilities.

    Returns:
        ``{need key: capability value}``. A need the capabilities no longer meet (the node sent a
        different advert between matching and this call) is left out rather than invented.
    """
    found: dict[str, Any] = {}
    for key, want in needs.items():
        value = _satisfier(want, caps.get(key, _MISSING))
        if value is not _MISSING:
            found[key] = value
    return found


def validate_capabilities(caps: object, field: str = "capabilities") -> dict[str, Any]:
    """Check a node's advertised capabilities: a JSON object of scalars and lists of scalars.

    Malformed adverts are refused when they arrive, so the matcher never has to guess.

    Args:
        caps: The decoded ``capabilities`` value of an advert.
        field: The path to report errors under.

    Returns:
        A fresh ``dict`` (tuples become lists, as JSON would store them).

    Raises:
        ContractError: With code ``invalid_capabilities`` and the offending ``field``.
    """
    code = "invalid_capabilities"
    if not isinstance(caps, Mapping):
        raise ContractError(
            f"{field} must be a JSON object of capability names to values.", field=field, code=code
        )
    _check_json(caps, field, code=code, max_depth=MAX_DEPTH)
    if len(caps) > MAX_CAPABILITIES:
        raise ContractError(
            f"{field} has {len(caps)} entries; at most {MAX_CAPABILITIES} are allowed.",
            field=field,
            code=code,
        )
    clean: dict[str, Any] = {}
    for key, value in caps.items():
        path = _child(field, key)
        if not key or len(key) > MAX_KEY:
            raise ContractError(
                f"{path}: a capability name must be 1 to {MAX_KEY} characters.",
                field=path,
                code=code,
            )
        if isinstance(value, list | tuple):
            if len(value) > MAX_LIST:
                raise ContractError(
                    f"{path} lists {len(value)} values; at most {MAX_LIST} are allowed.",
                    field=path,
                    code=code,
                )
            for i, item in enumerate(value):
                if not _is_scalar(item):
                    raise ContractError(
                        f"{path}[{i}] must be a string, number or boolean; a capability list "
                        "holds scalars only.",
                        field=f"{path}[{i}]",
                        code=code,
                    )
                _check_value_length(item, f"{path}[{i}]", code)
            clean[key] = list(value)
        elif _is_scalar(value):
            _check_value_length(value, path, code)
            clean[key] = value
        else:
            raise ContractError(
                f"{path} must be a string, number, boolean or a list of those.",
                field=path,
                code=code,
            )
    return clean


def valid_id(value: object) -> bool:
    """Say whether ``value`` can be an id (``run_id``, ``node_id``, a role name).

    1 to 64 of ``A-Z a-z 0-9 . _ -``, not starting with ``.``: an id becomes a folder name, so
    ``.``, ``..`` and hidden names are refused (issue 11 §1, docs/security.md).

    Args:
        value: Anything; only a matching ``str`` passes.

    Returns:
        ``True`` for a usable id.
    """
    return isinstance(value, str) and ID_RE.fullmatch(value) is not None


def valid_run_id(value: object) -> bool:
    """``valid_id`` under the name the flows use for run and node ids."""
    return valid_id(value)


def check_text(value: object, field: str, limit: int = MAX_TEXT) -> None:
    """Refuse a request string that cannot be stored: NUL, a lone surrogate, or over ``limit``.

    For the text fields that are not part of a contract (an advert's label and instance, an
    answer): 400 naming ``field`` instead of a 500 from the database (issue 11 §3).

    Raises:
        ContractError: Naming ``field``.
    """
    if not isinstance(value, str):
        raise ContractError(f"{field} must be a string.", field=field)
    if len(value) > limit:
        raise ContractError(f"{field} must be at most {limit} characters.", field=field)
    _check_text(value, field, None)


def check_texts(**fields: object) -> None:
    """``check_text``'s NUL and surrogate test for each string given by name (lengths and types
    stay with the caller): an advert's label and instance, for instance."""
    for field, value in fields.items():
        if isinstance(value, str):
            _check_text(value, field, None)


def escape_log(text: str) -> str:
    """A step's output made storable: NUL → U+2400 (␀), each lone surrogate → U+FFFD.

    Logs are a program's output and may legitimately hold binary junk, so they are stored, not
    refused (amendments round 2; docs/security.md, "Text"). Other text is left exactly as sent.
    """
    if "\x00" not in text and (text.isascii() or _encodes(text)):
        return text
    return "".join(
        "\u2400" if ch == "\x00" else "\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in text
    )


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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


def _satisfier(want: object, have: object) -> object:
    """Return the capability value that meets one need, or ``_MISSING`` when none does."""
    if have is _MISSING:
        return _MISSING
    if want is True:
        return have if have else _MISSING
    if isinstance(have, list | tuple):
        return next((item for item in have if _same(want, item)), _MISSING)
    return have if _same(want, have) else _MISSING


def _same(want: object, have: object) -> bool:
    """JSON equality: booleans only equal booleans, numbers compare numerically (§5)."""
    # bool is a subclass of int in Python, so it must be singled out before the number case.
    if isinstance(want, bool) or isinstance(have, bool):
        return isinstance(want, bool) and isinstance(have, bool) and want == have
    if isinstance(want, int | float) and isinstance(have, int | float):
        return want == have
    return isinstance(want, str) and isinstance(have, str) and want == have


def _is_scalar(value: object) -> bool:
    """A JSON scalar other than null (null never describes hardware)."""
    return isinstance(value, str | int | float)


def _child(path: str, key: str) -> str:
    """The field path of ``key`` inside ``path``: ``roles.dut`` or ``roles["a.b"]``."""
    if _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _show(value: object) -> str:
    """A value as JSON for an error message, cut short: messages echo input, never all of it."""
    text = json.dumps(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def _check_keys(doc: Mapping[str, Any], known: Sequence[str], at: str, what: str) -> None:
    """Unknown keys are a 400 naming the key and the closest known one (issue 15 §3)."""
    for key in doc:
        if key not in known:
            field = _child(at, key) if isinstance(key, str) else at or None
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f'did you mean "{close[0]}"?' if close else f"use {', '.join(known)}."
            raise ContractError(f"{field} is not {what}; {hint}", field=field)


def _depth_over(value: object, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` containers deep (iterative, early exit)."""
    todo: list[tuple[object, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, Mapping | list | tuple):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, Mapping) else item
            todo.extend((child, depth + 1) for child in children)
    return False


def _check_with_depth(doc: Mapping[str, Any]) -> None:
    """Issue 11 §4: a step's ``with`` nests at most MAX_DEPTH levels, checked before anything
    else walks it (a 600-deep ``with`` once committed a run that nothing could read back)."""
    steps = doc.get("steps")
    if not isinstance(steps, list | tuple):
        return
    for seq, step in enumerate(steps[: MAX_STEPS + 1]):
        if isinstance(step, Mapping) and _depth_over(step.get("with"), MAX_DEPTH):
            field = f"steps[{seq}].with"
            raise ContractError(
                f"{field} is nested too deep: at most {MAX_DEPTH} levels are allowed.",
                field=field,
                code="too_deep",
            )


def _check_value_length(value: object, path: str, code: str | None) -> None:
    if isinstance(value, str) and len(value) > MAX_VALUE:
        raise ContractError(
            f"{path} must be at most {MAX_VALUE} characters.", field=path, code=code
        )


def _check_json(
    value: object, root: str = "", *, code: str | None = None, max_depth: int = MAX_BODY_DEPTH
) -> None:
    """Refuse anything PostgreSQL's ``jsonb`` would not store, before it reaches the store.

    A notebook may pass Python objects (a set, NaN, a string with NUL); caught here they are a 400
    naming the field instead of a 500 from the database. Also refuses strings over MAX_TEXT and
    nesting over ``max_depth``. Walks without recursion so deep nesting cannot overflow the stack.
    """
    todo: list[tuple[object, str, int]] = [(value, root, 1)]
    while todo:
        item, path, depth = todo.pop()
        where = path or "the document"
        if isinstance(item, Mapping | list | tuple) and depth > max_depth:
            raise ContractError(
                f"{where} is nested too deep: at most {max_depth} levels are allowed.",
                field=path or None,
                code=code or "too_deep",
            )
        if item is None or isinstance(item, bool | int):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise ContractError(
                    f"{where} is {item}, which is not a JSON number; use a finite number.",
                    field=path or None,
                    code=code,
                )
        elif isinstance(item, str):
            _check_text(item, path, code)
            if len(item) > MAX_TEXT:
                raise ContractError(
                    f"{where} must be at most {MAX_TEXT} characters.", field=path or None, code=code
                )
        elif isinstance(item, Mapping):
            children: list[tuple[object, str, int]] = []
            for key, child in item.items():
                if not isinstance(key, str):
                    raise ContractError(
                        f"{where} has the key {key!r}; JSON object keys must be strings.",
                        field=path or None,
                        code=code,
                    )
                _check_text(key, path, code)
                if len(key) > MAX_TEXT:
                    raise ContractError(
                        f"{where} has a key longer than {MAX_TEXT} characters.",
                        field=path or None,
                        code=code,
                    )
                children.append((child, _child(path, key), depth + 1))
            # Reversed onto the stack so problems are reported in document order.
            todo.extend(reversed(children))
        elif isinstance(item, list | tuple):
            todo.extend(
                (child, f"{path}[{i}]", depth + 1) for i, child in reversed(list(enumerate(item)))
            )
        else:
            raise ContractError(
                f"{where} is a Python {type(item).__name__}, which is not a JSON value.",
                field=path or None,
                code=code,
            )


def _check_text(text: str, path: str, code: str | None) -> None:
    """PostgreSQL text cannot hold NUL, and lone surrogates cannot be encoded as UTF-8."""
    if "\x00" in text:
        raise ContractError(
            f"{path or 'the document'} contains a NUL character, which cannot be stored.",
            field=path or None,
            code=code,
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ContractError(
                f"{path or 'the document'} contains an unpaired surrogate, which is not valid "
                "Unicode; send UTF-8 text.",
                field=path or None,
                code=code,
            ) from None


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
        path = _child("roles", role)
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
            need_path = _child(path, key)
            if not key or len(key) > MAX_KEY:
                raise ContractError(
                    f"{need_path}: a capability name must be 1 to {MAX_KEY} characters.",
                    field=need_path,
                )
            if not _is_scalar(want):
                raise ContractError(
                    f"{need_path} must be a string, number or boolean (true: present and "
                    f"truthy), not {_show(want)}.",
                    field=need_path,
                )
            _check_value_length(want, need_path, None)
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
            field = _child("roles", role)
            raise ContractError(
                f"{field} is used by no step; remove the role or give it a step.",
                field=field,
            )
