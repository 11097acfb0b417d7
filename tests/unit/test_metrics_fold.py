"""The metrics files of a server with workers stay bounded (mediator/api/metrics.py, docs/design.md
§19): a dead worker's counters are folded into archive files under a lock that scrapes share, so
the sums never move, and a server killed before its cleanup has its directory removed by the next
one. Worked examples on real files; the server end to end is tests/e2e/test_serve_workers.py."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from mediator.api.metrics import _LockedFiles, fold_dead
from mediator.cli import main as cli

REQ = mmap_key("mediator_http_requests", "mediator_http_requests_total",
               ["route"], ["/v1/runs"], "HTTP requests.")  # fmt: skip
SUM = mmap_key("mediator_sweep_duration_seconds", "mediator_sweep_duration_seconds_sum",
               [], [], "Sweeps.")  # fmt: skip
LE1 = mmap_key("mediator_sweep_duration_seconds", "mediator_sweep_duration_seconds_bucket",
               ["le"], ["1.0"], "Sweeps.")  # fmt: skip
GAUGE = mmap_key("mediator_event_streams", "mediator_event_streams", [], [], "Streams.")


def _worker_files(path: Path, pid: int, requests: float, streams: float = 0.0) -> None:
    """What one worker leaves: a counter, a histogram's sum and bucket, a live gauge."""
    for kind, key, value in (
        ("counter", REQ, requests),
        ("histogram", SUM, 0.5 * requests),
        ("histogram", LE1, requests),
        ("gauge_livesum", GAUGE, streams),
    ):
        d = MmapedDict(str(path / f"{kind}_{pid}.db"))
        d.write_value(key, d.read_value(key)[0] + value, 0.0)
        d.close()


def _totals(path: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in MultiProcessCollector(None, path=str(path)).collect():
        for s in family.samples:
            if s.name in ("mediator_http_requests_total", "mediator_sweep_duration_seconds_sum",
                          "mediator_event_streams"):  # fmt: skip
                out[s.name] = out.get(s.name, 0.0) + s.value
            elif s.name == "mediator_sweep_duration_seconds_bucket" and s.labels["le"] == "1.0":
                out["le1"] = s.value
    return out


def test_folding_dead_workers_keeps_every_sum_and_leaves_files_for_the_live_ones(
    tmp_path: Path,
) -> None:
    for pid in range(100, 110):
        _worker_files(tmp_path, pid, requests=pid, streams=1)
    before = _totals(tmp_path)
    assert before["mediator_event_streams"] == 10
    for pid in range(100, 109):  # nine die; 109 lives on
        fold_dead(pid, str(tmp_path))
    after = _totals(tmp_path)
    assert after["mediator_http_requests_total"] == before["mediator_http_requests_total"]
    assert (
        after["mediator_sweep_duration_seconds_sum"]
        == before["mediator_sweep_duration_seconds_sum"]
    )
    assert after["le1"] == before["le1"]
    assert after["mediator_event_streams"] == 1  # the live worker's stream only
    names = sorted(p.name for p in tmp_path.glob("*.db"))
    assert names == [
        "counter_109.db", "counter_archive.db", "gauge_livesum_109.db",
        "histogram_109.db", "histogram_archive.db",
    ]  # fmt: skip
    fold_dead(100, str(tmp_path))  # again, or a worker that never counted: nothing changes
    assert _totals(tmp_path) == after


def test_a_scrape_during_folds_never_sees_a_sum_move(tmp_path: Path) -> None:
    """Scrapes read under the shared lock while 300 dead workers are folded one by one: every
    scrape sees the same totals (without the lock a scrape could count a worker twice — in the
    archive and in its own file — or not at all)."""
    n = 300
    for pid in range(1000, 1000 + n):
        _worker_files(tmp_path, pid, requests=1)
    expected = _totals(tmp_path)
    reader = _LockedFiles(str(tmp_path))
    seen: list[float] = []
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set():
            total = sum(
                s.value
                for family in reader.collect()
                for s in family.samples
                if s.name == "mediator_http_requests_total"
            )
            seen.append(total)

    t = threading.Thread(target=scrape)
    t.start()
    try:
        for pid in range(1000, 1000 + n):
            fold_dead(pid, str(tmp_path))
    finally:
        done.set()
        t.join()
    assert seen and set(seen) == {expected["mediator_http_requests_total"]}
    assert len(list(tmp_path.glob("*.db"))) == 2  # the two archives


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_killed_servers_metrics_directory_is_removed_by_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead, alive = _dead_pid(), os.getpid()
    orphan = tmp_path / f"mediator-metrics-{dead}-abc123"
    live = tmp_path / f"mediator-metrics-{alive}-def456"
    target = tmp_path / "not-ours"
    planted = tmp_path / f"mediator-metrics-{_dead_pid()}-sym789"  # a symlink named like ours
    plain = tmp_path / f"mediator-metrics-{_dead_pid()}-file00"  # a file named like ours
    odd = tmp_path / f"mediator-metrics-{dead}"  # not our name's shape
    for d in (orphan, live, target, odd):
        d.mkdir()
        (d / "counter_1.db").write_bytes(b"x")
    planted.symlink_to(target, target_is_directory=True)
    plain.write_text("")
    cli._remove_orphaned_metrics()
    assert not orphan.exists()
    assert (live / "counter_1.db").exists() and (target / "counter_1.db").exists()
    assert planted.is_symlink() and plain.exists() and odd.exists()


def test_the_serving_parent_names_its_directory_after_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(cli.MULTIPROC_ENV, raising=False)
    with cli._metrics_mode(2):
        path = Path(os.environ[cli.MULTIPROC_ENV])
        assert path.parent == tmp_path and path.name.startswith(f"mediator-metrics-{os.getpid()}-")
        assert (path.stat().st_mode & 0o777) == 0o700
    assert not path.exists()
