"""``mediator serve --workers N`` (issue 13, HTTP): N processes answer on one socket that the
parent bound (port 0 names one port for all of them), and SIGTERM leaves none of them behind.

Which process answered is in ``/healthz``'s ``X-Mediator-Worker`` header. Requests are spread by
the kernel, not by us, so the test keeps several connections open at once and polls — with a
deadline — until two distinct workers have answered."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.servers import start_server

pytestmark = [pytest.mark.e2e, pytest.mark.db]


def _children(pid: int) -> set[int]:
    """Direct children of ``pid`` (from /proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_two_workers_answer_on_one_port_and_sigterm_stops_them_all(dsn, tmp_path):
    server = start_server(dsn, tmp_path, "--workers", "2")
    try:
        parent = server.process.proc.pid
        workers = _children(parent)
        assert len(workers) >= 2, workers  # two workers (and multiprocessing's own helper)
        seen: set[str] = set()
        deadline = time.monotonic() + 30
        clients = [httpx.Client(base_url=server.url, timeout=10) for _ in range(8)]
        try:
            while len(seen) < 2:
                assert time.monotonic() < deadline, f"only {seen} answered"
                for c in clients:  # separate connections: each may land on either worker
                    r = c.get("/healthz")
                    assert r.status_code == 200 and r.json()["status"] == "ok"
                    seen.add(r.headers["X-Mediator-Worker"])
                for c in clients:
                    c.close()
                clients = [httpx.Client(base_url=server.url, timeout=10) for _ in range(8)]
        finally:
            for c in clients:
                c.close()
        assert seen <= {str(p) for p in workers}  # the parent itself does not serve
        assert str(parent) not in seen
        # Both workers serve the same API on the same database: a submit on one, read on another.
        with httpx.Client(base_url=server.url, timeout=10) as http:
            assert http.post("/v1/runs", json=_contract()).status_code == 422  # no node at all
            assert http.get("/v1/runs/w1").json()["state"] == "FAILED"
        assert server.process.stop(timeout=30) == 0
        # The parent joined its workers before it exited; multiprocessing's resource tracker (a
        # child too) ends when it reads EOF from the parent, a moment later: poll, bounded.
        deadline = time.monotonic() + 10
        while [p for p in workers if _alive(p)] and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a condition with a deadline
        assert [p for p in workers if _alive(p)] == []  # no process left behind
        text = "".join(server.process.output)
        assert text.count("serving on") == 1 and "mediator: stopped" in text, text
    finally:
        server.process.stop()


def test_workers_whose_parent_is_killed_outright_stop_rather_than_serve_alone(dsn, tmp_path):
    """A worker checks every second that the parent that started it is still there
    (``orphaned`` in mediator/cli/main.py): killed with SIGKILL, the parent cannot stop its
    workers, so each stops itself — no process serves on without the supervisor and its
    reaper. Polled with a deadline, not slept."""
    server = start_server(dsn, tmp_path, "--workers", "2")
    workers: set[int] = set()
    try:
        parent = server.process.proc.pid
        workers = _children(parent)
        assert len(workers) >= 2, workers
        assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
        server.process.proc.send_signal(signal.SIGKILL)
        server.process.proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while [p for p in workers if _alive(p)] and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a condition with a deadline
        assert [p for p in workers if _alive(p)] == []
        with pytest.raises(httpx.TransportError):  # nothing answers on the port any more
            httpx.get(server.url + "/healthz", timeout=2)
    finally:
        for pid in [p for p in workers if _alive(p)]:  # a failed check leaves none behind
            os.kill(pid, signal.SIGKILL)
        server.process.stop()


def _contract() -> dict[str, object]:
    return {
        "run_id": "w1",
        "roles": {"dut": {"board": "x"}},
        "steps": [{"name": "s", "role": "dut", "uses": "shell", "with": {"cmd": "true"}}],
    }


def test_workers_out_of_range_exit_2_naming_the_setting(tmp_path):
    import subprocess
    import sys

    for value in ("0", "1025"):
        done = subprocess.run(
            [sys.executable, "-m", "mediator.cli.main", "--data", str(tmp_path / "pg"),
             "serve", "--dev", "--workers", value],
            capture_output=True, text=True, timeout=60, env={**os.environ},
        )  # fmt: skip
        assert done.returncode == 2 and "workers" in done.stderr, done.stderr


def _open_stream(url: str) -> tuple[socket.socket, bytes]:
    """A raw ``GET /v1/events`` left open (nothing more is read): the socket and the response's
    head (status line and headers)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        assert chunk, head
        head += chunk
    return s, head


def test_the_stream_caps_hold_for_the_whole_server_not_per_worker(dsn, tmp_path):
    # docs/security.md "Event streams": with N workers each holds cap/N, so 10x the cap in
    # attempts never gets more than the cap admitted across both workers.

    cap = 4
    server = start_server(
        dsn, tmp_path, "--workers", "2",
        env={"MEDIATOR_EVENTS_MAX_STREAMS": str(cap),
             "MEDIATOR_EVENTS_MAX_STREAMS_PER_PRINCIPAL": str(cap)},
    )  # fmt: skip
    held: list[socket.socket] = []
    try:
        statuses = []
        for _ in range(10 * cap):
            s, head = _open_stream(server.url)
            held.append(s)
            statuses.append(int(head.split(b" ", 2)[1]))
        assert set(statuses) == {200, 503}
        assert 1 <= statuses.count(200) <= cap, statuses
        assert server.process.stop(timeout=30) == 0  # open streams end on SIGTERM
    finally:
        for s in held:
            s.close()
        server.process.stop()


# ---- /metrics describes the whole server (review of issue 13's `serve --workers`) ----------------
def _scrape(http: httpx.Client) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """(the worker that answered, every sample of /metrics by name and labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    r = http.get("/metrics")
    assert r.status_code == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }
    return r.headers["X-Mediator-Worker"], samples


def _requests(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    return sum(v for (name, _), v in samples.items() if name == "mediator_http_requests_total")


def _never_back(
    before: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    after: dict[tuple[str, tuple[tuple[str, str], ...]], float],
) -> None:
    """Every counter and histogram sample of ``before`` is still there, and no smaller."""
    for key, value in before.items():
        name = key[0]
        if name.endswith(("_total", "_bucket", "_count", "_sum")):
            assert after.get(key, -1.0) >= value, (key, value, after.get(key))


def test_metrics_sum_every_worker_and_never_go_back_when_one_is_killed(dsn, tmp_path):
    # /metrics with `serve --workers 2`: whichever worker answers, the request counter is the
    # whole server's (exactly the requests this test made), no counter goes backwards from one
    # scrape to the next — not even when a worker is killed and replaced — and the open-streams
    # gauge counts the streams of the live workers only (docs/design.md §19 "Metrics").

    server = start_server(dsn, tmp_path, "--workers", "2")
    made = 0  # every HTTP request this test sent, each answered before the next scrape
    held: socket.socket | None = None

    def fresh() -> httpx.Client:
        return httpx.Client(base_url=server.url, timeout=10)  # a new connection: any worker

    def answered(path: str, until: Callable[[set[str]], bool]) -> set[str]:
        """GET ``path`` on fresh connections until the set of workers that answered satisfies
        ``until`` (polled with a deadline); /metrics answers are checked as they come."""
        nonlocal made
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while not until(seen):
            assert time.monotonic() < deadline, f"only {seen} answered {path}"
            with fresh() as c:
                if path == "/metrics":
                    seen.add(scrape(c))
                else:
                    r = c.get(path)
                    made += 1
                    assert r.status_code == 200
                    seen.add(r.headers["X-Mediator-Worker"])
        return seen

    def two(seen: set[str]) -> bool:
        return len(seen) >= 2

    last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    streams_expected = 0

    def scrape(c: httpx.Client) -> str:
        nonlocal made, last
        worker, samples = _scrape(c)
        assert _requests(samples) == made, (worker, _requests(samples), made)
        assert samples[("mediator_event_streams", ())] == streams_expected, worker
        _never_back(last, samples)
        last = samples
        made += 1  # the scrape itself is counted once its response starts: in the next one
        return worker

    try:
        workers = answered("/healthz", two)
        assert answered("/metrics", two) == workers
        # One event stream, held open on some worker: both workers' scrapes count it once.
        held, head = _open_stream(server.url)
        made += 1
        streaming = next(
            line.split(b":", 1)[1].strip().decode()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"x-mediator-worker:")
        )
        streams_expected = 1
        assert answered("/metrics", two) == workers
        # Kill the worker holding the stream outright: its counts stay, its stream does not.
        os.kill(int(streaming), signal.SIGKILL)
        held.close()
        held = None
        # Until the parent has noticed and buried it (polled, bounded), a scrape may still count
        # the stream; the requests are exact all along: the killed worker's counts stay.
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the killed worker's stream is still counted"
            with fresh() as c:
                _, samples = _scrape(c)
            assert _requests(samples) == made
            _never_back(last, samples)
            last = samples
            made += 1
            if samples[("mediator_event_streams", ())] == 0:
                break
        streams_expected = 0
        # A new worker takes its place; then every scrape, from either, agrees with the count.
        survivor = (workers - {streaming}).pop()
        now = answered("/healthz", lambda seen: bool(seen - {survivor, streaming}))
        newcomer = now - {survivor, streaming}
        answered("/metrics", lambda seen: seen >= {survivor, *newcomer})
        # The killed worker's counts were folded into the archive files and its own files
        # deleted (the stream gauge reads 0 only after that fold): files for live workers only.
        names = sorted(p.name for p in _metrics_dir(survivor).iterdir())
        assert not [n for n in names if n.endswith(f"_{streaming}.db")], names
        assert "counter_archive.db" in names and "histogram_archive.db" in names, names
        assert server.process.stop(timeout=30) == 0
    finally:
        if held is not None:
            held.close()
        server.process.stop()


def test_workers_that_cannot_start_back_off_and_the_server_stops_naming_why(dsn, tmp_path):
    # A restarted worker that cannot start is restarted after a growing wait (0.5 s, 1 s, 2 s...),
    # each failure logged with the worker's exit code and its own reason; once every worker has
    # failed to start Workers.GIVE_UP times in a row, the server stops with status 1 and says why.
    # The real cause here: the database was moved to another schema version under the running
    # server (what a newer Mediator's upgrade would do); a worker checks it when it connects.
    import psycopg

    server = start_server(dsn, tmp_path, "--workers", "2")
    try:
        pids: set[str] = set()
        deadline = time.monotonic() + 60
        while len(pids) < 2:
            assert time.monotonic() < deadline, pids
            with httpx.Client(base_url=server.url, timeout=10) as c:
                pids.add(c.get("/healthz").headers["X-Mediator-Worker"])
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute("UPDATE schema_version SET version = version + 1")
        for pid in pids:
            os.kill(int(pid), signal.SIGKILL)
        assert server.process.proc.wait(timeout=120) == 1
    finally:
        server.process.stop()
    text = "".join(server.process.output)
    for pid in pids:
        assert f"worker {pid} exited (killed by signal 9)" in text, text
    assert "failed at start (exit code 1): The database holds schema version" in text, text
    for wait in ("starting another in 1.0 s", "starting another in 2.0 s"):
        assert wait in text, text  # the wait doubles; no worker is started twice a second
    assert "every worker failed to start 3 times in a row" in text, text
    assert "schema version" in text.rsplit("every worker failed", 1)[1], text
    assert "mediator: stopped" in text, text


def _metrics_dir(worker: str) -> Path:
    """The metrics directory a worker was handed (its environment, as the parent set it)."""
    env = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
    value = next(v for v in env if v.startswith(b"PROMETHEUS_MULTIPROC_DIR="))
    return Path(value.split(b"=", 1)[1].decode())


def test_each_server_keeps_its_metrics_in_a_private_directory_it_removes(dsn, tmp_path):
    # Two servers on one machine never mix their figures: each parent makes its own directory
    # (mode 0700), hands it to its workers, and removes it when it stops.
    import stat

    servers = [start_server(dsn, tmp_path / name, "--workers", "2") for name in ("a", "b")]
    try:
        dirs = []
        for server in servers:
            with httpx.Client(base_url=server.url, timeout=10) as c:
                worker = c.get("/healthz").headers["X-Mediator-Worker"]
            path = _metrics_dir(worker)
            st = path.stat()
            assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid(), path
            assert any(path.glob("counter_*.db")), sorted(path.iterdir())
            dirs.append(path)
        assert dirs[0] != dirs[1]
        for server in servers:
            assert server.process.stop(timeout=30) == 0
        assert not dirs[0].exists() and not dirs[1].exists()
    finally:
        for server in servers:
            server.process.stop()


def test_a_held_work_poll_is_woken_in_whichever_worker_holds_it(dsn, tmp_path):
    """Each worker has its own LISTEN connection and its own held polls (docs/design.md §19
    "The wake of a waiting node"): a run submitted through any worker answers a poll held by
    any other. One keep-alive connection per worker is found with /healthz, then each holds its
    node's long poll on that very connection."""
    server = start_server(dsn, tmp_path, "--workers", "2")
    by_worker: dict[str, httpx.Client] = {}
    try:
        deadline = time.monotonic() + 30
        while len(by_worker) < 2:
            assert time.monotonic() < deadline, f"only {set(by_worker)} answered"
            c = httpx.Client(base_url=server.url, timeout=60)
            worker = c.get("/healthz").headers["X-Mediator-Worker"]
            if worker in by_worker:
                c.close()
            else:
                by_worker[worker] = c
        node_of = {w: f"n{i}" for i, w in enumerate(sorted(by_worker))}
        answers: dict[str, httpx.Response] = {}
        with httpx.Client(base_url=server.url, timeout=10) as http:
            for node in node_of.values():
                advert = {"node_id": node, "label": "", "capabilities": {"board": node},
                          "instance": "i1", "policy": {"drain": ""}}  # fmt: skip
                assert http.post("/v1/nodes", json=advert).status_code == 200

            def hold(worker: str) -> None:
                answers[worker] = by_worker[worker].get(
                    f"/v1/nodes/{node_of[worker]}/work", params={"wait": 25}
                )

            threads = [threading.Thread(target=hold, args=(w,)) for w in by_worker]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 30
            while _metric(http, "mediator_work_polls_held") < 2:  # summed over the workers
                assert time.monotonic() < deadline, "the polls were not held"
                time.sleep(0.05)  # polling a condition with a deadline
            for node in node_of.values():
                step = {"name": "s", "role": "dut", "with": {"cmd": "true"}}
                run = {"run_id": f"for-{node}", "roles": {"dut": {"board": node}}, "steps": [step]}
                assert http.post("/v1/runs", json=run).status_code == 201
            for t in threads:
                t.join(timeout=60)
            for worker, r in answers.items():
                assert r.headers["X-Mediator-Worker"] == worker  # held where it was sent
                assert [s["run_id"] for s in r.json()["steps"]] == [f"for-{node_of[worker]}"]
            assert _metric(http, 'mediator_work_polls_total{answer="woken"}') == 2
            assert _metric(http, 'mediator_work_polls_total{answer="waited"}') == 0
    finally:
        for c in by_worker.values():
            c.close()
        assert server.process.stop(timeout=30) == 0


def _metric(http: httpx.Client, name: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0
