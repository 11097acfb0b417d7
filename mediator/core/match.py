"""The matcher: which live nodes fill a contract's roles, or why none can now (docs/design.md §4).

Submit, the dry run and the promotion sweep all ask the same question — given the roles' needs, the
live adverts and the nodes that are unavailable (busy ∪ draining, FR-11: the caller forms the union,
the matcher knows nothing of drain) — and must get the same answer for the same input (ADR-014
decision 3). So this module is a pure function over plain data: no I/O, no clock, no randomness, and
every tie is broken by ``node_id``.

The three refusals mean different things to the caller (R1): ``NO_CANDIDATE`` and ``TOO_WIDE`` at
submit are permanent (422, FAILED), ``ALL_BUSY`` is temporary (202, QUEUED). At promotion a
``TOO_WIDE`` leaves the run queued (R10): the width depends on which nodes happen to be free.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Final

from mediator.core.capabilities import satisfies

NO_CANDIDATE: Final = "NO_CANDIDATE"
ALL_BUSY: Final = "ALL_BUSY"
TOO_WIDE: Final = "TOO_WIDE"

# How many candidate ids an ALL_BUSY message spells out; the full list is in ``candidates``.
_NAMED_IN_MESSAGE: Final = 5


@dataclass(frozen=True)
class Advert:
    """A live node as the matcher sees it.

    Attributes:
        node_id: The node's identity (unique among the adverts of one call).
        capabilities: What it advertises, ``{key: scalar or list of scalars}``.
    """

    node_id: str
    capabilities: Mapping[str, Any]


@dataclass(frozen=True)
class Assignment:
    """A successful match.

    Attributes:
        roles: ``{role: node_id}`` for every role of the contract.
        width: The number of distinct nodes used (several roles may fold onto one node).
    """

    roles: Mapping[str, str]
    width: int

    def nodes(self) -> tuple[str, ...]:
        """Return the distinct node ids, sorted — the order leases are inserted in (§7)."""
        return tuple(sorted(set(self.roles.values())))


@dataclass(frozen=True)
class Reject:
    """Why a contract cannot be matched now (stored in ``runs.reject``, returned by the API).

    Attributes:
        code: ``NO_CANDIDATE``, ``ALL_BUSY`` or ``TOO_WIDE``.
        role: The role that failed; ``None`` for ``TOO_WIDE``, which is about the whole run.
        candidates: For ``ALL_BUSY``, the sorted node ids that could serve ``role`` but are all
            unavailable; ``()`` otherwise.
        width: For ``TOO_WIDE``, the number of distinct nodes the match needed; ``None`` otherwise.
        message: One sentence for a person.
    """

    code: str
    role: str | None
    candidates: tuple[str, ...]
    width: int | None
    message: str

    def as_dict(self) -> dict[str, Any]:
        """Return the stored and returned form, with only the keys that apply to ``code``.

        Returns:
            ``{"code", "role", "message"}`` for NO_CANDIDATE, plus ``"candidates"`` for
            ALL_BUSY; ``{"code", "width", "message"}`` for TOO_WIDE.
        """
        out: dict[str, Any] = {"code": self.code}
        if self.code == TOO_WIDE:
            out["width"] = self.width
        else:
            out["role"] = self.role
        if self.code == ALL_BUSY:
            out["candidates"] = list(self.candidates)
        out["message"] = self.message
        return out


def _tag(value: object) -> tuple[str, object]:
    """A hashable key with JSON types kept: ``True`` and ``1`` must not collide (§5)."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)  # 1 and 1.0 hash and compare equal, as satisfies() wants
    return ("s", value)


class AdvertIndex:
    """Live adverts indexed once by capability value, for many matches against one snapshot.

    A promotion sweep matches every waiting needs class against the same fleet; scanning every
    advert for every role costs classes × nodes ``satisfies`` calls (2,500 for P2's 50 classes
    and 51 nodes — most of a sweep's time). The inverted index answers a role's candidate set
    with one set lookup per need instead, and agrees with ``satisfies`` exactly (a property test
    holds it to that). Pure: built from plain data, no I/O.
    """

    def __init__(self, adverts: Iterable[Advert]) -> None:
        self.fleet: dict[str, Mapping[str, Any]] = {}
        self._equal: dict[tuple[str, tuple[str, object]], set[str]] = {}
        self._truthy: dict[str, set[str]] = {}
        self._cache: dict[str, frozenset[str]] = {}
        for advert in adverts:
            if advert.node_id in self.fleet:
                raise ValueError(f"two adverts for node {advert.node_id!r}")
            self.fleet[advert.node_id] = advert.capabilities
            for key, have in advert.capabilities.items():
                if have:
                    self._truthy.setdefault(key, set()).add(advert.node_id)
                members = have if isinstance(have, list | tuple) else (have,)
                for item in members:
                    self._equal.setdefault((key, _tag(item)), set()).add(advert.node_id)

    def serving(self, needs: Mapping[str, Any]) -> frozenset[str]:
        """``C_r``: the ids of the adverts whose capabilities satisfy ``needs``."""
        ck = json.dumps(needs, sort_keys=True)
        found = self._cache.get(ck)
        if found is None:
            sets = [
                self._truthy.get(key, set())
                if want is True
                else self._equal.get((key, _tag(want)), set())
                for key, want in needs.items()
            ]
            found = frozenset(set.intersection(*sets)) if sets else frozenset(self.fleet)
            self._cache[ck] = found
        return found


def candidates(needs: Mapping[str, Any], adverts: Iterable[Advert]) -> list[str]:
    """Return the ids of the adverts whose capabilities satisfy ``needs``, sorted.

    Args:
        needs: One role's needs.
        adverts: Live adverts.

    Returns:
        Sorted node ids (``C_r`` of docs/design.md §4).
    """
    return sorted(a.node_id for a in adverts if satisfies(needs, a.capabilities))


def match(
    needs_by_role: Mapping[str, Mapping[str, Any]],
    adverts: Iterable[Advert] | AdvertIndex,
    unavailable: Collection[str],
    max_width: int,
) -> Assignment | Reject:
    """Fill every role with a live, available node, or say why that cannot be done now.

    The algorithm of docs/design.md §4:

    1. Roles are taken in name order; ``C_r`` is the set of adverts satisfying role ``r``'s needs.
    2. A role with an empty ``C_r`` gives ``NO_CANDIDATE``. Every ``C_r`` is computed first (step 4
       needs them anyway), so the first empty one in name order is reported even when an earlier
       role is merely busy: otherwise a contract no fleet can serve would be queued behind a busy
       role and wait forever, which is exactly what R1 keeps out of the queue.
    3. If a node already chosen for an earlier role is in ``C_r``, the earliest chosen is reused
       (folding; chosen nodes are available by construction).
    4. Otherwise the first available node of ``C_r`` is taken, ordering by how many of the roles
       from ``r`` onward it can serve (more first, so later roles can fold onto it), then by
       ``node_id`` (ADR-014 decision 3: ties broken by id, so advert order never matters). None
       available gives ``ALL_BUSY`` with ``candidates = C_r``.
    5. More distinct nodes than ``max_width`` gives ``TOO_WIDE``.

    Cost is one ``satisfies`` per (role, advert) plus, per role, one pass over its available
    candidates counting the later roles each serves: about 10 × 100 checks for a fleet of a
    hundred nodes and ten roles, with no sorting of whole candidate lists.

    Args:
        needs_by_role: ``{role: needs}``; ``{}`` for a contract made only of ask steps.
        adverts: The live adverts, each ``node_id`` at most once, or an ``AdvertIndex`` of them
            (the sweep builds one per fleet snapshot; the answer is the same either way).
        unavailable: Node ids that must not be newly chosen (busy ∪ draining at submit and in the
            sweep; busy only for a dry run, NFR-I6).
        max_width: The server's width cap.

    Returns:
        An ``Assignment``, or a ``Reject`` saying which rule failed.

    Raises:
        ValueError: Two adverts carry the same ``node_id``; the answer would depend on their order.
    """
    roles = sorted(needs_by_role)
    if not roles:
        return Assignment(roles={}, width=0)
    index = adverts if isinstance(adverts, AdvertIndex) else None
    blocked = unavailable if isinstance(unavailable, AbstractSet) else frozenset(unavailable)
    if index is not None:
        serves = [index.serving(needs_by_role[role]) for role in roles]
    else:
        fleet: dict[str, Mapping[str, Any]] = {}
        for advert in adverts:  # type: ignore[union-attr]
            if advert.node_id in fleet:
                raise ValueError(f"two adverts for node {advert.node_id!r}")
            fleet[advert.node_id] = advert.capabilities
        serves = [
            frozenset(node for node, caps in fleet.items() if satisfies(needs_by_role[role], caps))
            for role in roles
        ]
    for role, able in zip(roles, serves, strict=True):
        if not able:
            return _no_candidate(role, needs_by_role[role])

    chosen: dict[str, str] = {}
    used: list[str] = []  # distinct nodes in the order they were first chosen
    for i, role in enumerate(roles):
        able = serves[i]
        node = next((n for n in used if n in able), None)
        if node is None:
            free = [n for n in able if n not in blocked]
            if not free:
                return _all_busy(role, able)
            later = serves[i:]
            node = min((-_count_serving(n, later), n) for n in free)[1]
            used.append(node)
        chosen[role] = node

    if len(used) > max_width:
        return _too_wide(len(used), max_width)
    return Assignment(roles=chosen, width=len(used))


def _count_serving(node: str, roles_serving: Sequence[AbstractSet[str]]) -> int:
    return sum(node in able for able in roles_serving)


def _no_candidate(role: str, needs: Mapping[str, Any]) -> Reject:
    wanted = json.dumps(dict(needs), sort_keys=True)
    return Reject(
        code=NO_CANDIDATE,
        role=role,
        candidates=(),
        width=None,
        message=(
            f'No live node can serve role "{role}" (needs {wanted}); change the contract or '
            "bring such a node online."
        ),
    )


def _all_busy(role: str, able: AbstractSet[str]) -> Reject:
    ids = tuple(sorted(able))
    named = ", ".join(ids[:_NAMED_IN_MESSAGE])
    if len(ids) > _NAMED_IN_MESSAGE:
        named += f" and {len(ids) - _NAMED_IN_MESSAGE} more"
    return Reject(
        code=ALL_BUSY,
        role=role,
        candidates=ids,
        width=None,
        message=(
            f'Every node that can serve role "{role}" is busy or draining ({named}); the run '
            "waits until one is released."
        ),
    )


def _too_wide(width: int, max_width: int) -> Reject:
    return Reject(
        code=TOO_WIDE,
        role=None,
        candidates=(),
        width=width,
        message=(
            f"The run needs {width} distinct nodes but this server allows at most {max_width} "
            "(max_width); use fewer roles or ask the operator to raise max_width."
        ),
    )
