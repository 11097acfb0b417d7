"""Trace readers and the FIFO G/G/c recursion; a trace replay equals it exactly (design.md §20)."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import numpy as np
import pytest

from sim.brokers.model import run_model
from sim.inputs import scenarios as S
from sim.inputs.traces import NASA_TRACE, SWF_FIELDS, fifo_waits, read_csv_trace, read_swf
from sim.inputs.workload import materialize


def test_fifo_waits_one_server_is_lindley() -> None:
    # arrivals 0, 1, 2 with 3 s jobs: starts 0, 3, 6
    assert fifo_waits([0, 1, 2], [3, 3, 3], 1).tolist() == [0, 2, 4]


def test_fifo_waits_two_servers_hand_worked() -> None:
    # t=0 a(5) on s1; t=1 b(2) on s2 (free until 3); t=2 c(1) waits for s2 at 3;
    # t=3 d(4) waits for s2 at 4 (s1 frees at 5); t=10 e(1) free
    w = fifo_waits([0, 1, 2, 3, 10], [5, 2, 1, 4, 1], 2)
    assert w.tolist() == [0, 0, 1, 1, 0]


def test_fifo_waits_zero_durations_and_ties() -> None:
    assert fifo_waits([5, 5, 5], [0, 0, 4], 1).tolist() == [0, 0, 0]
    assert fifo_waits([0, 0, 0], [2, 2, 2], 2).tolist() == [0, 0, 2]


def test_fifo_waits_rejects_unordered_arrivals() -> None:
    with pytest.raises(ValueError, match="FIFO"):
        fifo_waits([2, 1], [1, 1], 1)


def test_read_swf_on_the_shipped_nasa_log() -> None:
    """README header: 18,239 jobs; every one has a known submit and run time, so all are kept."""
    df = read_swf()
    assert Path(df.attrs["path"]) == NASA_TRACE
    assert len(df) == 18_239 and df.attrs["dropped"] == 0
    assert list(df.columns) == list(SWF_FIELDS)
    assert df.attrs["meta"]["MaxJobs"] == "18239"
    assert df.attrs["meta"]["Installation"] == "NASA Ames Research Center"
    assert df["wait_s"].isna().all()  # -1 = unknown throughout this log
    assert df["submit_s"].is_monotonic_increasing
    assert (df["run_s"] == 0).sum() == 173  # zero-length jobs are kept
    assert round(float(df["run_s"].mean())) == 765
    assert float(df["run_s"].median()) == 86.0
    assert int(df["run_s"].max()) == 62_643


def test_read_swf_drops_unknown_times_and_reads_plain_files(tmp_path: Path) -> None:
    rows = [
        "; Version: 2.2",
        "; Note: a first line",
        ";       continued",
        "1 10 -1 5 1 -1 -1 -1 -1 -1 1 1 1 -1 -1 -1 -1 -1",
        "2 0 -1 -1 1 -1 -1 -1 -1 -1 1 1 1 -1 -1 -1 -1 -1",  # unknown run time
        "3 5 -1 7 1 -1 -1 -1 -1 -1 1 1 1 -1 -1 -1 -1 -1",
    ]
    path = tmp_path / "tiny.swf"
    path.write_text("\n".join(rows) + "\n")
    df = read_swf(path)
    assert df["job"].tolist() == [3, 1]  # sorted by submit time
    assert df.attrs["dropped"] == 1 and df.attrs["meta"]["Note"] == "a first line"
    gz = tmp_path / "tiny.swf.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert read_swf(gz)["job"].tolist() == [3, 1]


def test_read_csv_trace_with_needs(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        'submit_s,run_id,duration_s,needs\n3,b,1.5,"{""board"": ""f4""}"\n1,a,2,\n2,c,-1,\n'
    )
    df = read_csv_trace(path)
    assert df["run_id"].tolist() == ["a", "b"]
    assert df["needs"].tolist() == [None, {"board": "f4"}]
    assert df.attrs["dropped"] == 1


@pytest.mark.parametrize("nodes", [2, 4])
def test_nasa_replay_on_identical_nodes_equals_the_fifo_recursion(nodes: int) -> None:
    """docs/design.md §20: with no claim latency and one-role runs the Mediator is FIFO G/G/c."""
    plan = materialize(S.trace(nodes=nodes))
    arrivals = np.array([a.at_s for a in plan.arrivals])
    durations = np.array([a.step_outcomes[0][0].duration_s for a in plan.arrivals])
    result = run_model(plan, record_events=False)
    expected = fifo_waits(arrivals, durations, nodes)
    assert len(result.runs) == 18_239
    np.testing.assert_array_equal(result.runs["wait_s"].to_numpy(), expected)
    assert expected.max() > 0  # the property is not vacuous


def test_csv_replay_with_ties_and_zero_durations_equals_the_recursion(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    submit = np.sort(rng.integers(0, 400, 300))  # many ties
    dur = rng.choice([0, 1, 5, 30, 60], 300)
    path = tmp_path / "trace.csv"
    lines = ["submit_s,run_id,duration_s"] + [
        f"{s},{i},{d}" for i, (s, d) in enumerate(zip(submit, dur, strict=True))
    ]
    path.write_text("\n".join(lines) + "\n")
    result = run_model(S.trace(str(path), nodes=3), record_events=False)
    np.testing.assert_array_equal(
        result.runs["wait_s"].to_numpy(), fifo_waits(submit.astype(float), dur.astype(float), 3)
    )


def test_csv_replay_honours_per_row_needs(tmp_path: Path) -> None:
    """docs/design.md §19: runs need the capability every node has unless the CSV says otherwise."""
    path = tmp_path / "needs.csv"
    path.write_text(
        "submit_s,run_id,duration_s,needs\n"
        "0,a,10,\n"
        '1,b,10,"{""pool"": ""lab""}"\n'
        '2,c,10,"{""gpu"": true}"\n'
        '3,d,10,"{""node"": {""pool"": ""lab""}}"\n'
    )
    plan = materialize(S.trace(str(path), nodes=2))
    assert plan.arrivals[2].contract["roles"] == {"node": {"gpu": True}}
    runs = run_model(plan).runs.set_index("run_id")
    assert runs["verdict"].tolist() == ["pass", "pass", "rejected", "pass"]
    assert runs.loc["r0000003", "wait_s"] == 7.0  # until a frees n000 at 10 (b holds n001)


@pytest.mark.slow  # scripts/test --fast leaves it out
def test_more_nodes_never_make_a_nasa_job_wait_longer() -> None:
    """Common random numbers (design.md §20) make fleet sizes comparable job by job: under FIFO on
    identical nodes no job waits longer when a node is added — what capacity planning relies on."""
    waits = [
        run_model(S.trace(nodes=c), record_events=False).runs["wait_s"].to_numpy()
        for c in (3, 4, 5)
    ]
    for fewer, more in itertools.pairwise(waits):
        assert (more <= fewer).all() and more.mean() < fewer.mean()


def test_a_csv_traces_own_ids_survive_as_source_id(tmp_path: Path) -> None:
    """issue 14 §7: the trace's `run_id` column was renumbered r0000000…; it is kept as
    `source_id` so results join back to the user's data."""
    from sim.brokers.model import run_model
    from sim.inputs import scenarios as S

    csv = tmp_path / "jobs.csv"
    csv.write_text("submit_s,run_id,duration_s\n5,build-17,3\n0,build-9,4\n9,build-23,1\n")
    runs = run_model(S.trace(str(csv), nodes=1)).runs
    assert list(runs["source_id"]) == ["build-9", "build-17", "build-23"]  # by submit time
    assert list(runs["run_id"]) == ["r0000000", "r0000001", "r0000002"]
    swf = run_model(S.trace(runs=3)).runs
    assert list(swf["source_id"]) == ["1", "2", "3"]  # the SWF job numbers
