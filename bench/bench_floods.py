"""Fair under floods (docs/performance.md, docs/security.md): what one principal's flood of
distinct needs classes costs everyone else's calls.

Two arms on the same server in the same run, each on a fresh load: Q queued runs each in its own
needs class (the flood: run i needs two roles served by board ``b{i % 10}``), and Q queued runs all
in one class (the control). Ten busy nodes b0..b9 hold the queue back; node ``w`` is free for the
measured work and ``idle`` is free and serves no queued run, so every wake sweeps for real. Per
repetition, through the public Python API on the wall clock (as ``mediator serve`` runs):

* submit a one-step run on ``w`` → 201 (its fleet read, its write);
* its step's result → the run settles and frees ``w``: wake 1 sweeps the whole queue;
* an advert of ``idle`` with new capabilities → wake 9 sweeps the whole queue.

The queue is bulk-loaded by SQL in the shape submit's queue path writes (as bench_sweep.py does).
The arms alternate, ``--rounds`` times each (a fresh load every time), so a machine whose load
drifts during the run weighs on both alike. Figures are medians over every round's calls; the
goal is flood ÷ control ≤ 2 for each call.

Run: ``.venv/bin/python bench/bench_floods.py [--queued 5000] [--reps 40] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from mediator import Config, Mediator, Outcome
from mediator.pg import EmbeddedPostgres

BOARDS = 10


def load(med: Mediator, queued: int, flood: bool) -> None:
    """Ten busy nodes, ``w`` and ``idle`` free; ``queued`` runs, each in its own class (flood)
    or all in one (control), in FIFO order."""
    with med.store.pool.connection() as conn, conn.transaction():
        conn.execute("TRUNCATE events, asks, leases, steps, runs, needs_classes, nodes CASCADE")
        conn.execute(
            """INSERT INTO nodes (node_id, label, capabilities, instance, seen_at, expires_at)
               SELECT 'b' || k, 'b' || k, jsonb_build_object('board', 'b' || k), 'i',
                      now(), now() + interval '1 day' FROM generate_series(0, %s) k
               UNION ALL SELECT n, n, jsonb_build_object('board', n), 'i', now(),
                      now() + interval '1 day' FROM unnest(ARRAY['w', 'idle']) n""",
            (BOARDS - 1,),
        )
        last = str(BOARDS - 1)
        conn.execute("""INSERT INTO needs_classes VALUES ('blocker', '{"dut": {"board": "b0"}}')""")
        conn.execute(
            """INSERT INTO runs (run_id, state, contract, needs_key, created_at, started_at)
               SELECT 'blk' || k, 'RUNNING', '{}', 'blocker', now(), now()
               FROM generate_series(0, %s) k""",
            (last,),
        )
        conn.execute(
            """INSERT INTO leases (node_id, run_id, instance, granted_at, not_after)
               SELECT 'b' || k, 'blk' || k, 'i', now(), now() + interval '1 day'
               FROM generate_series(0, %s) k""",
            (last,),
        )
        key = "format('flood-%%s', i)" if flood else "'same'"
        conn.execute(
            f"""WITH c AS (
                    SELECT i, {key} AS key,
                           jsonb_build_object(
                               'dut', jsonb_build_object('board', 'b' || (i %% {BOARDS})),
                               CASE WHEN %(flood)s THEN 'r' || i ELSE 'aux' END,
                               jsonb_build_object('board', 'b' || (i %% {BOARDS}))) AS needs
                    FROM generate_series(0, %(q)s - 1) i
                ), k AS (
                    INSERT INTO needs_classes (needs_key, needs)
                    SELECT DISTINCT ON (key) key, needs FROM c ORDER BY key, i
                ), r AS (
                    INSERT INTO runs (run_id, state, contract, needs_key, submitter, created_at)
                    SELECT format('q%%06s', i), 'QUEUED', jsonb_build_object('roles', needs),
                           key, 'flooder', timestamptz '2030-01-01' + i * interval '1 ms'
                    FROM c
                )
                INSERT INTO steps (run_id, seq, name, kind, role, uses, state)
                SELECT format('q%%06s', i), 0, 'test', 'exec', 'dut', 'shell', 'PENDING' FROM c""",
            {"flood": flood, "q": queued},
        )
        conn.execute("ANALYZE")


def one_step() -> dict[str, object]:
    return {
        "roles": {"dut": {"board": "w"}},
        "steps": [{"name": "t", "role": "dut", "uses": "shell", "with": {"cmd": "true"}}],
    }


def measure(med: Mediator, reps: int) -> dict[str, list[float]]:
    """Milliseconds of each submit, result and advert (each followed by its wake)."""
    samples: dict[str, list[float]] = {"submit": [], "result": [], "advert": []}
    med.wake_queued()  # the first sweep after the load: every class once, not measured
    for i in range(reps + 3):
        t = time.perf_counter()
        sub = med.submit(one_step())
        t_submit = time.perf_counter() - t
        assert sub.outcome == Outcome.STARTED and sub.run is not None
        run_id = sub.run.run_id
        step = next(s for s in med.work("w") if s.run_id == run_id)
        claimed = med.claim(run_id, step.seq, "w")
        t = time.perf_counter()
        med.report(run_id, step.seq, "w", claimed.attempt, "pass")
        t_result = time.perf_counter() - t
        t = time.perf_counter()
        med.advert("idle", {"board": "idle", "round": i}, "i")  # new capabilities: wake 9
        t_advert = time.perf_counter() - t
        if i >= 3:  # warm-up: prepared statements, caches
            samples["submit"].append(t_submit * 1e3)
            samples["result"].append(t_result * 1e3)
            samples["advert"].append(t_advert * 1e3)
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queued", type=int, default=5_000)
    ap.add_argument("--reps", type=int, default=40, help="measured calls per arm and round")
    ap.add_argument("--rounds", type=int, default=3, help="times each arm runs, alternating")
    args = ap.parse_args()
    arms = {"control": False, "flood": True}
    samples: dict[str, dict[str, list[float]]] = {arm: {} for arm in arms}
    with EmbeddedPostgres() as pg:
        med = Mediator.connect(pg.dsn(), Config(), startup_wake=False)
        try:
            for _ in range(args.rounds):
                for arm, flood in arms.items():
                    load(med, args.queued, flood)
                    for call, ms in measure(med, args.reps).items():
                        samples[arm].setdefault(call, []).extend(ms)
        finally:
            med.close()
    control = {k: statistics.median(v) for k, v in samples["control"].items()}
    flood_ = {k: statistics.median(v) for k, v in samples["flood"].items()}
    print(f"{args.queued:,} queued runs; medians over {args.rounds} × {args.reps} calls per arm"
          " (ms), arms alternating")  # fmt: skip
    print(f"{'call':8s} {'control':>9s} {'flood':>9s} {'ratio':>7s}  (goal ≤ 2)")
    for call in ("submit", "result", "advert"):
        ratio = flood_[call] / control[call]
        print(f"{call:8s} {control[call]:9.2f} {flood_[call]:9.2f} {ratio:7.2f}")


if __name__ == "__main__":
    main()
