"""Workload traces: reading them, and the FIFO multi-server recursion they are checked against.

design.md §20: a real trace is the most honest arrival process and service-time distribution there
is. Two formats are read — the Standard Workload Format (SWF) of the Parallel Workloads Archive,
in which the shipped NASA Ames iPSC/860 1993 log comes, and a small CSV (`submit_s, run_id,
duration_s`, optional `needs`). With no claim latency, one-role runs and identical nodes the
Mediator is a FIFO multi-server queue, so replaying a trace must give exactly the waits of
`fifo_waits` (Kiefer–Wolfowitz): that equality is a test of both the model and the real engine.
"""

from __future__ import annotations

import gzip
import heapq
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd  # type: ignore[import-untyped, unused-ignore]

#: The shipped trace (see sim/inputs/data/README.md for its provenance).
NASA_TRACE = Path(__file__).with_name("data") / "NASA-iPSC-1993-3.1-cln.swf.gz"

#: The 18 SWF fields, in file order (Feitelson's definitions; -1 in the file means unknown).
SWF_FIELDS = (
    "job",  # 1 job number
    "submit_s",  # 2 submit time, seconds from the log's start
    "wait_s",  # 3 wait time in the queue
    "run_s",  # 4 run time (wall clock)
    "procs",  # 5 allocated processors
    "cpu_s",  # 6 average CPU time used per processor
    "mem_kb",  # 7 used memory per processor
    "req_procs",  # 8 requested processors
    "req_time_s",  # 9 requested (estimated) run time
    "req_mem_kb",  # 10 requested memory per processor
    "status",  # 11 1 completed, 0 failed, 5 cancelled
    "user",  # 12 user id
    "group",  # 13 group id
    "app",  # 14 executable (application) number
    "queue",  # 15 queue number
    "partition",  # 16 partition number
    "preceding_job",  # 17 preceding job number
    "think_time_s",  # 18 think time from the preceding job
)


# `; Key: value` — one space after the `;`; indented lines continue the previous value.
_SWF_META = re.compile(r"^; ?([A-Za-z]+):(.*)$")


def read_swf(path: str | Path | None = None) -> pd.DataFrame:
    """Read a Standard Workload Format file (plain or `.gz`).

    Args:
        path: the file; None reads the shipped NASA Ames iPSC/860 1993 log.

    Returns:
        One row per job with the 18 SWF fields as columns (`SWF_FIELDS`), `-1` replaced by a
        missing value (nullable `Int64`/`Float64` columns), sorted by submit time (stable, so the
        file order breaks ties). Jobs whose submit time or run time is unknown or negative are
        dropped: a replay needs both, and inventing them would change the workload. `attrs`
        holds `header` (the `;` lines, verbatim), `meta` (their `Key: value` pairs), `path`,
        `jobs_in_file` and `dropped`.
    """
    path = NASA_TRACE if path is None else Path(path)
    raw = path.read_bytes()
    text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
    header = [ln for ln in text.splitlines() if ln.startswith(";")]
    df = pd.read_csv(
        io.StringIO(text),
        comment=";",
        sep=r"\s+",
        header=None,
        names=list(SWF_FIELDS),
        dtype=float,
    )
    jobs_in_file = len(df)
    df = df.mask(df == -1)
    keep = df["submit_s"].ge(0) & df["run_s"].ge(0)
    df = df[keep].sort_values("submit_s", kind="stable").reset_index(drop=True)
    df = df.astype(
        {c: "Int64" if (df[c].dropna() % 1 == 0).all() else "Float64" for c in df.columns}
    )
    meta: dict[str, str] = {}
    for ln in header:
        m = _SWF_META.match(ln)
        if m:  # a repeated key (Note, Queue) keeps every value, one per line
            key, value = m.group(1), m.group(2).strip()
            meta[key] = f"{meta[key]}\n{value}" if key in meta else value
    df.attrs.update(
        header=header,
        meta=meta,
        path=str(path),
        jobs_in_file=jobs_in_file,
        dropped=jobs_in_file - len(df),
    )
    return df


def read_csv_trace(path: str | Path) -> pd.DataFrame:
    """Read a CSV trace with columns `submit_s, run_id, duration_s` and optional `needs`.

    `needs` is JSON: either one role's needs (`{"board": "stm32f4"}`) or needs by role
    (`{"dut": {...}, "bench": {...}}`); it is parsed into dicts (None where empty). Rows are
    sorted by `submit_s` (stable); rows with a negative or missing submit time or duration are
    dropped, as in `read_swf`.
    """
    df = pd.read_csv(path, dtype={"run_id": str})
    missing = {"submit_s", "run_id", "duration_s"} - set(df.columns)
    if missing:
        raise ValueError(f"{path}: missing column(s) {sorted(missing)}")
    n = len(df)
    df = df[df["submit_s"].ge(0) & df["duration_s"].ge(0)]
    if "needs" in df.columns:
        df = df.assign(needs=[_parse_needs(v) for v in df["needs"]])
    df = df.sort_values("submit_s", kind="stable").reset_index(drop=True)
    df.attrs.update(path=str(path), jobs_in_file=n, dropped=n - len(df))
    return df


def _parse_needs(value: Any) -> dict[str, Any] | None:
    if value is None or (isinstance(value, float) and np.isnan(value)) or value == "":
        return None
    needs = json.loads(value)
    if not isinstance(needs, dict):
        raise ValueError(f"needs must be a JSON object, got {value!r}")
    return needs


def fifo_waits(
    arrivals: Sequence[float] | npt.ArrayLike,
    durations: Sequence[float] | npt.ArrayLike,
    c: int,
) -> npt.NDArray[np.float64]:
    """Waits of a FIFO queue with `c` identical servers (the Kiefer–Wolfowitz recursion).

    Job i (in the given order, which must be arrival order) starts at
    max(arrival_i, the earliest time a server is free) and holds that server for duration_i.
    A heap of the c server-free times makes it O(n log c).

    Args:
        arrivals: arrival times, non-decreasing.
        durations: service times, same length.
        c: number of servers (>= 1).

    Returns:
        The waits (start − arrival), as float64.
    """
    a = np.asarray(arrivals, dtype=float)
    d = np.asarray(durations, dtype=float)
    if a.shape != d.shape or a.ndim != 1:
        raise ValueError("arrivals and durations must be 1-d and of equal length")
    if c < 1:
        raise ValueError("c must be at least 1")
    if a.size and np.any(np.diff(a) < 0):
        raise ValueError("arrivals must be in non-decreasing (FIFO) order")
    free = [-np.inf] * c
    start = np.empty_like(a)
    for i, (ai, di) in enumerate(zip(a.tolist(), d.tolist(), strict=True)):
        s = max(ai, free[0])
        heapq.heapreplace(free, s + di)
        start[i] = s
    waits: npt.NDArray[np.float64] = start - a
    return waits
