"""The exact width search's cost (docs/design.md §4 "Width, exactly"; docs/performance.md).

The matcher searches exactly only when its greedy choice is wider than ``max_width``. This times
one ``match`` call on random fleets where that happens: ``roles`` roles, ``nodes`` nodes each
serving ``served`` random roles (every node different — the hard case; identical nodes are tried
once), every node free. Pure CPU, no database. ``states`` is the number of states the search
works on (``narrowest(asked=)``), a cost that does not drift with the machine's load.

Run: ``.venv/bin/python bench/bench_width.py [--big]`` (``--big`` adds the 64-role cases, which
take minutes: the search is exponential in the worst case).
"""

from __future__ import annotations

import argparse
import random
import time

from mediator.core.match import Advert, AdvertIndex, Assignment, match, narrowest

SMALL = [(8, 200, 2, 4), (12, 200, 3, 4), (16, 200, 4, 4), (16, 500, 3, 8), (20, 200, 4, 8),
         (24, 100, 4, 6), (40, 100, 8, 6), (64, 100, 8, 4), (64, 100, 20, 4)]  # fmt: skip
BIG = [(64, 100, 12, 8), (64, 100, 10, 10), (64, 200, 12, 8)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--big", action="store_true", help="add the 64-role worst cases")
    args = ap.parse_args()
    rng = random.Random(1)
    print("roles nodes served max_width  answer        seconds    states")
    for n_roles, n_nodes, served, max_width in SMALL + (BIG if args.big else []):
        roles = [f"r{i:02d}" for i in range(n_roles)]
        needs = {r: {r: True} for r in roles}
        adverts = [
            Advert(f"n{i:03d}", dict.fromkeys(rng.sample(roles, served), True))
            for i in range(n_nodes)
        ]
        t0 = time.perf_counter()
        res = match(needs, adverts, set(), max_width)
        dt = time.perf_counter() - t0
        answer = f"width {res.width}" if isinstance(res, Assignment) else res.code
        index, asked = AdvertIndex(adverts), list[tuple[int, int]]()
        narrowest(roles, [index.serving(needs[r]) for r in roles], set(), max_width, asked)
        print(f"{n_roles:5d} {n_nodes:5d} {served:6d} {max_width:9d}  {answer:12s} {dt:8.3f}"
              f"  {len(asked):8,d}")  # fmt: skip


if __name__ == "__main__":
    main()
