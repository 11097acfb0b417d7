"""The matcher: which live nodes fill a contract's roles, or why none can now (docs/design.md §4).

Submit, the dry run and the promotion sweep all ask the same question — given the roles' needs, the
live adverts and the nodes that are unavailable (busy ∪ draining, FR-11: the caller forms the union,
the matcher knows nothing of drain) — and must get the same answer for the same input (ADR-014
decision 3). So this module is a pure function over plain data: no I/O, no clock, no randomness, and
every tie is broken by ``node_id``.

The three refusals mean different things to the caller (R1): ``NO_CANDIDATE`` and ``TOO_WIDE`` at
submit are permanent (422, FAILED), ``ALL_BUSY`` is temporary (202, QUEUED). At promotion a
``TOO_WIDE`` leaves the run queued (R10): the width depends on which nodes happen to be free.

Width, exactly (docs/design.md §4): the greedy choice is kept when it fits ``max_width``; when it
does not, :func:`narrowest` searches every choice of available nodes for the narrowest, so
``TOO_WIDE`` means *no* assignment of those nodes fits — not that the greedy one did not.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Final

from mediator.core.capabilities import satisfies
from mediator.core.limits import MAX_SEARCH_NEEDS

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


def need_signature(needs: Mapping[str, Any]) -> frozenset[tuple[str, tuple[str, object]]]:
    """One role's needs as a hashable value, JSON types kept (``true`` is not ``1``): equal
    signatures are satisfied by the same adverts. TypeError for a value that is not hashable."""
    return frozenset((key, _tag(want)) for key, want in needs.items())


class AdvertIndex:
    """Live adverts indexed once by capability value, for many matches against one snapshot.

    A promotion sweep matches every waiting needs class against the same fleet; scanning every
    advert for every role costs classes × nodes ``satisfies`` calls (2,500 for P2's 50 classes
    and 51 nodes — most of a sweep's time). The inverted index answers a role's candidate set
    with one set lookup per need instead, and agrees with ``satisfies`` exactly (a property test
    holds it to that). Pure: built from plain data, no I/O.
    """

    def __init__(self, adverts: Iterable[Advert]) -> None:
        self.nodes: set[str] = set()  # every advert's node_id: what empty needs are met by
        self._equal: dict[tuple[str, tuple[str, object]], set[str]] = {}
        self._truthy: dict[str, set[str]] = {}
        self._cache: dict[str, frozenset[str]] = {}
        for advert in adverts:
            if advert.node_id in self.nodes:
                raise ValueError(f"two adverts for node {advert.node_id!r}")
            self.nodes.add(advert.node_id)
            for key, have in advert.capabilities.items():
                if have:
                    self._truthy.setdefault(key, set()).add(advert.node_id)
                members = have if isinstance(have, list | tuple) else (have,)
                for item in members:
                    self._equal.setdefault((key, _tag(item)), set()).add(advert.node_id)

    def serving(self, needs: Mapping[str, Any]) -> frozenset[str]:
        """``C_r``: the ids of the adverts whose capabilities satisfy ``needs``. Equal needs, in
        any key order, get the one answer computed first (the same object): a sweep's classes and
        a contract's roles that ask alike cost one lookup."""
        ck = json.dumps(needs, sort_keys=True)
        found = self._cache.get(ck)
        if found is None:
            sets = [
                self._truthy.get(key, set())
                if want is True
                else self._equal.get((key, _tag(want)), set())
                for key, want in needs.items()
            ]
            found = frozenset(set.intersection(*sets)) if sets else frozenset(self.nodes)
            self._cache[ck] = found
        return found


Signature = frozenset[tuple[str, tuple[str, object]]]


def _anchor(needs: Mapping[str, Any]) -> tuple[object, ...]:
    """The one index entry every advert satisfying ``needs`` hits (ClassIndex): the equality of
    the first key (in name order) that asks for a value, else the truthiness of the first key,
    else everything (empty needs are met by every advert)."""
    valued = [key for key, want in needs.items() if want is not True]
    if valued:
        key = min(valued)
        return ("=", key, _tag(needs[key]))
    return ("t", min(needs)) if needs else ("*",)


class ClassIndex:
    """Needs classes indexed by what can serve them (docs/design.md §6 "Sweeps remember").

    A sweep must re-match the waiting classes that a node whose capabilities or availability
    changed can serve, and only those. Asking that of every waiting class costs as much as the
    classes waiting (a flood queues thousands); this index answers it in time proportional to
    the classes found: each distinct role need is filed under one entry that any advert meeting
    it must hit (:func:`_anchor`), and each candidate need is then checked with ``satisfies``,
    so the answer equals checking every class (a property test holds it to that). Pure: plain
    data, no I/O.
    """

    def __init__(self) -> None:
        self._roles: dict[str, tuple[Signature, ...]] = {}  # class → its roles' distinct needs
        self._classes: dict[Signature, set[str]] = {}  # a need → the classes asking it
        self._need: dict[Signature, Mapping[str, Any]] = {}  # a need → one copy of it
        self._filed: dict[tuple[object, ...], set[Signature]] = {}  # an anchor → needs
        self._loose: set[str] = set()  # classes whose needs have no signature: always touched

    def __len__(self) -> int:
        return len(self._roles) + len(self._loose)

    def add(self, key: str, needs_by_role: Mapping[str, Mapping[str, Any]]) -> None:
        """File class ``key`` (again: replaced)."""
        self.remove(key)
        try:
            sigs = tuple({need_signature(n): n for n in needs_by_role.values()}.items())
        except TypeError:  # a need value that is not hashable: re-matched on every change
            self._loose.add(key)
            return
        for sig, need in sigs:
            if sig not in self._need:
                self._need[sig] = need
                self._filed.setdefault(_anchor(need), set()).add(sig)
            self._classes.setdefault(sig, set()).add(key)
        self._roles[key] = tuple(sig for sig, _ in sigs)

    def remove(self, key: str) -> None:
        """Forget class ``key`` (nothing if unknown); a need no class asks any more goes too."""
        self._loose.discard(key)
        for sig in self._roles.pop(key, ()):
            keys = self._classes[sig]
            keys.discard(key)
            if not keys:
                del self._classes[sig]
                anchor = _anchor(self._need.pop(sig))
                filed = self._filed[anchor]
                filed.discard(sig)
                if not filed:
                    del self._filed[anchor]

    def touched(self, changed: Iterable[Mapping[str, Any]]) -> set[str]:
        """The classes some role of which one of ``changed`` (capabilities) satisfies."""
        hit: set[Signature] = set()
        everything = self._filed.get(("*",), set())
        for caps in changed:
            found = set(everything)
            for key, have in caps.items():
                if have:
                    found |= self._filed.get(("t", key), set())
                for item in have if isinstance(have, list | tuple) else (have,):
                    found |= self._filed.get(("=", key, _tag(item)), set())
            hit.update(sig for sig in found - hit if satisfies(self._need[sig], caps))
        out = set(self._loose)
        for sig in hit:
            out |= self._classes[sig]
        return out


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
    5. More distinct nodes than ``max_width``: the exact search (:func:`narrowest`) over the
       same available nodes takes the narrowest assignment instead, ties broken in the order
       step 4 tries nodes; ``TOO_WIDE`` only if none fits ``max_width`` (docs/design.md §4
       "Width, exactly": greedy alone is not monotone in which nodes are busy).

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
    # One index, then a set lookup per need: a submit or dry run of many roles on a large
    # fleet costs nodes × capabilities once, not roles × nodes ``satisfies`` calls (issue 25:
    # 64 roles on 5,000 nodes took 1.5 s), and roles with equal needs share one answer.
    index = adverts if isinstance(adverts, AdvertIndex) else AdvertIndex(adverts)
    blocked = unavailable if isinstance(unavailable, AbstractSet) else frozenset(unavailable)
    serves = [index.serving(needs_by_role[role]) for role in roles]
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
        exact = narrowest(roles, serves, blocked, max_width)
        return _too_wide(len(used), max_width) if exact is None else exact
    return Assignment(roles=chosen, width=len(used))


def narrowest(
    roles: Sequence[str],
    serves: Sequence[AbstractSet[str]],
    unavailable: AbstractSet[str],
    max_width: int,
    asked: list[tuple[int, int]] | None = None,
) -> Assignment | None:
    """The narrowest assignment of available nodes within ``max_width``, or None if none fits.

    A set of nodes can serve a contract when every role has a serving node in it, and an
    assignment's width is the size of that set, so the question is a minimum set cover — small
    here: the width is capped (``max_width``) and the roles are few.

    Whether ``left`` more nodes can cover the roles not yet covered is decided by ``fits``, in
    any order: it branches on the uncovered role with the fewest kinds of available candidate
    (a kind: the set of roles a node serves; the first role in name order among equals), trying
    its kinds serving more roles first, then by that set read as a number (role ``i`` is bit
    ``i``). A state stops when a lower bound on what is left — the fewest nodes whose largest
    gains add up to the uncovered roles — exceeds ``left``; a kind whose uncovered roles an
    earlier kind also covers is skipped (whatever completes it would have completed the earlier
    one, which failed); and a state (covered roles, nodes left) shown not to complete is not
    searched again. Widths are tried from that lower bound up (iterative deepening), and the
    first that fits is the narrowest.

    At that width the assignment is built the way the greedy matcher goes (roles in name order;
    a role some chosen node serves folds onto the earliest such; otherwise step 4's order —
    more roles from this one onward served first, then ``node_id``): the first role not yet
    covered takes the first candidate in that order after which ``fits`` says the rest can still
    be covered, skipping, as above, one whose uncovered roles an earlier candidate covers. So
    among the narrowest assignments it returns the first that order reaches, and the greedy one
    itself when it is the narrowest.

    The cost is exponential in the worst case (set cover is NP-hard); it stays small because
    the covered-roles states number at most 2^roles and roles that have the same candidates are
    covered together. docs/performance.md "The exact width search" has figures.

    Args:
        roles: Role names in name order.
        serves: ``C_r`` per role, aligned with ``roles``.
        unavailable: Nodes that must not be chosen.
        max_width: The widest assignment accepted.
        asked: When given, every state ``fits`` works on (not answered at once: all covered,
            or known to fail), ``(covered roles as bits, nodes left)``, is appended in order —
            the search's cost as a count that does not drift with the machine (tests hold the
            pruning to it).

    Returns:
        The assignment, or None when every assignment of available nodes is wider (or a role has
        no available node at all).
    """
    n = len(roles)
    if n == 0:
        return Assignment(roles={}, width=0)
    mask: dict[str, int] = {}  # node → the roles it serves, as bits in name order
    for i, able in enumerate(serves):
        for node in able:
            if node not in unavailable:
                mask[node] = mask.get(node, 0) | (1 << i)
    full = (1 << n) - 1
    order: list[list[str]] = []  # step 4's order per role: serves more later roles, then id
    for i in range(n):
        later = (full >> i) << i
        order.append(sorted(
            (x for x in serves[i] if x in mask),
            key=lambda x: (-(mask[x] & later).bit_count(), x),
        ))  # fmt: skip
        if not order[i]:
            return None  # a role no available node serves: ALL_BUSY, not a width question
    masks = list(set(mask.values()))
    by_role = [sorted({mask[x] for x in order[i]}, key=lambda m: (-m.bit_count(), m))
               for i in range(n)]  # fmt: skip
    failed: set[tuple[int, int]] = set()  # (covered, nodes still allowed) known to fail

    def bound(uncovered: int) -> int:
        """Fewest nodes that could cover ``uncovered``: the largest gains, added up (they do
        add up: every role has an available node)."""
        want = uncovered.bit_count()
        gains = accumulate(sorted(((m & uncovered).bit_count() for m in masks), reverse=True))
        return next(k for k, total in enumerate(gains, 1) if total >= want)

    def fits(covered: int, left: int) -> bool:
        """Whether ``left`` more nodes can cover the rest, in any order. What fails is
        remembered in ``failed``."""
        if covered == full:
            return True
        if (covered, left) in failed:
            return False
        if asked is not None:
            asked.append((covered, left))
        uncovered = full & ~covered
        if bound(uncovered) > left:
            failed.add((covered, left))
            return False
        role = min((i for i in range(n) if uncovered >> i & 1), key=lambda i: len(by_role[i]))
        tried: list[int] = []
        for m in by_role[role]:
            gain = m & uncovered
            if any(gain & t == gain for t in tried):
                continue
            tried.append(gain)
            if fits(covered | m, left - 1):
                return True
        failed.add((covered, left))
        return False

    def search(covered: int, chosen: list[str], width: int) -> list[str]:
        """The ordered descent, entered only where ``fits`` said the rest can be covered within
        ``width``: so some candidate of the first uncovered role fits (any cover of the rest
        holds one), and one skipped is covered by an earlier candidate that did not fit."""
        if covered == full:
            return chosen
        uncovered = full & ~covered
        first = (uncovered & -uncovered).bit_length() - 1  # the first uncovered role
        tried: list[int] = []
        for node in order[first]:
            gain = mask[node] & uncovered
            if any(gain & t == gain for t in tried):
                continue  # an earlier candidate covered these roles and more, and failed
            tried.append(gain)
            if fits(covered | mask[node], width - len(chosen) - 1):
                return search(covered | mask[node], [*chosen, node], width)
        raise AssertionError("fits() promised a cover")  # pragma: no mutate

    for width in range(bound(full), max_width + 1):
        if fits(0, width):  # the narrowest width: the ordered descent finds its first cover
            nodes = search(0, [], width)
            assigned = {
                role: next(x for x in nodes if mask[x] >> i & 1) for i, role in enumerate(roles)
            }
            return Assignment(roles=assigned, width=len(nodes))
    return None


def search_budget(needs_by_role: Mapping[str, Mapping[str, Any]], max_width: int) -> str | None:
    """Why the exact width search could exceed its budget for this contract, or None.

    Roles with equal needs have equal ``C_r`` and fold onto one node (step 3), so the greedy
    width is at most the number of distinct needs ``d``: with ``d <= max_width`` the search never
    runs. Otherwise its states — the covered roles, as unions of equal-needs groups, and the
    nodes left — number at most ``2^d × (max_width + 1)``, so ``d`` is capped at
    ``MAX_SEARCH_NEEDS`` (docs/design.md §4 "Width, exactly"; docs/security.md). A contract
    within the budget keeps the exact ``TOO_WIDE``; one beyond it is refused before any match.
    """
    distinct = len({json.dumps(dict(n), sort_keys=True) for n in needs_by_role.values()})
    if distinct <= max_width or distinct <= MAX_SEARCH_NEEDS:
        return None
    return (
        f"The roles have {distinct} distinct needs, more than max_width ({max_width}): finding "
        f"whether they fit max_width could take too long past {MAX_SEARCH_NEEDS} distinct needs "
        "(MAX_SEARCH_NEEDS). Give roles that can share a node the same needs, or use fewer roles."
    )


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
            f"No choice of nodes fills the run's roles with at most {max_width} distinct nodes "
            f"(max_width; the matcher's choice needed {width}); use fewer roles or ask the "
            "operator to raise max_width."
        ),
    )
