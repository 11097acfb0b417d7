"""Input limits and the checks every stored string and JSON document passes (docs/security.md).

Ids become folder names and appear in URLs; every string a client sends is stored in PostgreSQL,
which refuses NUL and lone surrogates; every document is walked before it is stored. These checks
are shared by the contract parser, the capability rule and the API, so each limit is written once
and docs/security.md lists each with its value (a test keeps the two in step). Pure: no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Final

from mediator.core.errors import ContractError

# ---- limits (docs/security.md lists each with its value; a test keeps the two in step) --------
MAX_ID: Final = 64  # run_id, node_id, role names
MAX_STEPS: Final = 1000
MAX_ROLES: Final = 64
MAX_NEEDS: Final = 64  # needs of one role
MAX_CAPABILITIES: Final = 256  # capabilities of one advert
MAX_ACTIONS: Final = 256  # action names in one advert's ``actions`` (docs/design.md §4)
MAX_LIST: Final = 256  # members of one capability list
MAX_KEY: Final = 128  # a capability or need name, a step name, an action name
MAX_VALUE: Final = 1024  # a string need or capability value
MAX_WORK_ID: Final = 200
MAX_TEXT: Final = 10_000  # any other string: a `with` value or key, a question, an answer
MAX_DEPTH: Final = 32  # nesting inside a step's `with` (the `with` object is level 1)
MAX_BODY_DEPTH: Final = 64  # nesting of any JSON document the API decodes
MAX_NUMBER_CHARS: Final = 40  # characters of one JSON number (a 5,000-digit integer is refused)
# The exact width search's budget (docs/security.md "Fair under floods", design.md §4): a contract
# with more distinct role needs than max_width may need the search, whose states number at most
# 2^(distinct needs) × (max_width + 1); past this many distinct needs it is refused at submit.
MAX_SEARCH_NEEDS: Final = 16
LIMITS: Final = {
    "MAX_ID": MAX_ID, "MAX_STEPS": MAX_STEPS, "MAX_ROLES": MAX_ROLES, "MAX_NEEDS": MAX_NEEDS,
    "MAX_CAPABILITIES": MAX_CAPABILITIES, "MAX_LIST": MAX_LIST, "MAX_KEY": MAX_KEY,
    "MAX_VALUE": MAX_VALUE, "MAX_WORK_ID": MAX_WORK_ID, "MAX_TEXT": MAX_TEXT,
    "MAX_DEPTH": MAX_DEPTH, "MAX_BODY_DEPTH": MAX_BODY_DEPTH,
    "MAX_NUMBER_CHARS": MAX_NUMBER_CHARS, "MAX_SEARCH_NEEDS": MAX_SEARCH_NEEDS,
    "MAX_ACTIONS": MAX_ACTIONS,
}  # fmt: skip

# Ids become folder names (records) and appear in URLs: letters, digits, `.`, `_`, `-`, but never
# a leading `.` — so never `.` or `..`, and never a hidden file (issue 11 §1, docs/security.md).
ID_RE: Final = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{MAX_ID - 1}}}")
RUN_ID_RE: Final = ID_RE
# Role names share the id alphabet: they appear in `assigned`, in events and in field paths.
# Keys written bare in a field path; anything else is quoted, so "roles.a.b" is never ambiguous.
_PLAIN_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")


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


def check_node_id(value: object, field: str = "node_id") -> None:
    """Refuse a malformed node id wherever one is sent — an advert, a work poll, a claim, a
    result, the fleet's ``after`` cursor — with one code, ``invalid_node_id`` (issue 29: a node's
    operator sent no contract, so not ``invalid_contract``; and a claim or result from a
    malformed id was answered ``not_your_step`` as if such a node could exist).

    Raises:
        ContractError: 400 ``invalid_node_id`` naming ``field``.
    """
    if not valid_id(value):
        raise ContractError(
            f"{field} must be 1-64 characters of letters, digits, '.', '_' or '-', not "
            "'.' or '..' nor starting with '.'.",
            field=field,
            code="invalid_node_id",
        )


def check_actions(value: object, field: str = "actions") -> list[str] | None:
    """An advert's ``actions`` — the names of the actions its daemon offers — sorted and without
    repeats; None (not said) stays None (docs/design.md §4 "Actions").

    Raises:
        ContractError: not a list of at most :data:`MAX_ACTIONS` non-empty strings of at most
            :data:`MAX_KEY` characters, naming the element at fault.
    """
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) > MAX_ACTIONS:
        raise ContractError(f"{field} must be a list of at most {MAX_ACTIONS} action names.",
                            field=field)  # fmt: skip
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name or len(name) > MAX_KEY:
            raise ContractError(
                f"{field}[{i}] must be an action name of 1-{MAX_KEY} characters.",
                field=f"{field}[{i}]",
            )
        check_text(name, f"{field}[{i}]")
    return sorted(set(value))


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
    check_chars(value, field, None)


def check_texts(**fields: object) -> None:
    """``check_text``'s NUL and surrogate test for each string given by name (lengths and types
    stay with the caller): an advert's label and instance, for instance."""
    for field, value in fields.items():
        if isinstance(value, str):
            check_chars(value, field, None)


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


def field_path(path: str, key: str) -> str:
    """The field path of ``key`` inside ``path``: ``roles.dut`` or ``roles["a.b"]``."""
    if _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def depth_over(value: object, limit: int) -> bool:
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


def check_value_length(value: object, path: str, code: str | None) -> None:
    if isinstance(value, str) and len(value) > MAX_VALUE:
        raise ContractError(
            f"{path} must be at most {MAX_VALUE} characters.", field=path, code=code
        )


def check_json(
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
            check_chars(item, path, code)
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
                check_chars(key, path, code)
                if len(key) > MAX_TEXT:
                    raise ContractError(
                        f"{where} has a key longer than {MAX_TEXT} characters.",
                        field=path or None,
                        code=code,
                    )
                children.append((child, field_path(path, key), depth + 1))
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


def check_chars(text: str, path: str, code: str | None) -> None:
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
