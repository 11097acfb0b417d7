"""The capability rule: whether a node's advertised capabilities satisfy a role's needs.

One rule shared by submit, the promotion sweep, the matcher and the reference model's tests
(docs/design.md §4): JSON types are kept, so ``true`` never equals ``1``; a list capability is
met by any of its members. Also the shape an advert's capabilities must have. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from mediator.core.errors import ContractError
from mediator.core.limits import (
    MAX_CAPABILITIES,
    MAX_DEPTH,
    MAX_KEY,
    MAX_LIST,
    check_json,
    check_value_length,
    field_path,
)

_MISSING: Final = object()


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
    check_json(caps, field, code=code, max_depth=MAX_DEPTH)
    if len(caps) > MAX_CAPABILITIES:
        raise ContractError(
            f"{field} has {len(caps)} entries; at most {MAX_CAPABILITIES} are allowed.",
            field=field,
            code=code,
        )
    clean: dict[str, Any] = {}
    for key, value in caps.items():
        path = field_path(field, key)
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
                if not is_scalar(item):
                    raise ContractError(
                        f"{path}[{i}] must be a string, number or boolean; a capability list "
                        "holds scalars only.",
                        field=f"{path}[{i}]",
                        code=code,
                    )
                check_value_length(item, f"{path}[{i}]", code)
            clean[key] = list(value)
        elif is_scalar(value):
            check_value_length(value, path, code)
            clean[key] = value
        else:
            raise ContractError(
                f"{path} must be a string, number, boolean or a list of those.",
                field=path,
                code=code,
            )
    return clean


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


def is_scalar(value: object) -> bool:
    """A JSON scalar other than null (null never describes hardware)."""
    return isinstance(value, str | int | float)
