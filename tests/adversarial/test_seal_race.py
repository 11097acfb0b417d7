"""Issue 11 §7: concurrent seals never collide.

The staging folder was ``.staging-{pid}-{id(self)}``: the same for every thread of a process, so
one sealer's cleanup deleted another's files (``FileNotFoundError``, a 500 after commit). Each seal
now stages in a folder of its own; many threads sealing the same and different runs at once all
finish, exactly one of them seals each run (I6), and every sealed record verifies.
"""

from __future__ import annotations

import threading
from collections import Counter

from mediator.records import Records

THREADS = 16
RUNS = 6


def _seal(records: Records, run_id: str) -> bool:
    return records.seal(
        run_id,
        contract={"run_id": run_id},
        state="PASSED",
        verdict="passed",
        ended_at="2031-03-01T12:00:00+00:00",
        events=[{"kind": "submitted", "run_id": run_id}],
        step_logs=[(0, "build", "ok\n"), (1, "test/../x", "fine\n")],
    )


def test_many_threads_sealing_at_once_all_finish_and_each_run_is_sealed_once(tmp_path):
    shared = Records(tmp_path / "records")
    start = threading.Barrier(THREADS)
    sealed: Counter[str] = Counter()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        # Half the threads share one Records object (the old collision); half bring their own.
        records = shared if i % 2 else Records(tmp_path / "records")
        start.wait(timeout=30)
        for n in range(RUNS):
            run_id = f"run-{(n + i) % RUNS}"
            try:
                if _seal(records, run_id):
                    with lock:
                        sealed[run_id] += 1
            except BaseException as exc:  # any failure at all is the finding
                with lock:
                    errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert sealed == Counter({f"run-{n}": 1 for n in range(RUNS)})
    for n in range(RUNS):
        check = shared.verify(f"run-{n}")
        assert check.ok, check
    # No staging folder is left behind.
    leftovers = [p for p in (tmp_path / "records").rglob(".staging*")]
    assert leftovers == []


def test_verify_reports_a_planted_symlink_and_never_follows_it(tmp_path):
    """docs/security.md "Paths": a link in a sealed record is tampering, not a file to hash."""
    records = Records(tmp_path / "records")
    assert _seal(records, "r1")
    secret = tmp_path / "secret.txt"
    secret.write_text("not part of any record\n")
    folder = tmp_path / "records" / "r1"
    (folder / "extra.log").symlink_to(secret)
    log = folder / "steps" / "0000-build.log"
    log.unlink()
    log.symlink_to(secret)
    check = records.verify("r1")
    assert (check.changed, check.extra) == (("steps/0000-build.log",), ("extra.log",))
    assert records.read_file("r1", "steps/0000-build.log") is None
    assert records.verify("..").sealed is False
