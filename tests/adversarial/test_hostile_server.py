"""Issue 25 §8–9: a server — or whatever answers in its place — cannot take over the operator's
terminal, nor make ``runctl`` or ``enode`` hang, grow without bound or die with a traceback
(docs/security.md "Clients and terminals").

The server here is hostile on purpose: a real HTTP server on loopback (tests/adversarial/
hostile.py) that answers with control sequences in every field, HTML, malformed bodies, wrong
shapes, a TTL of 1e-9 or -5, 400 MB bodies, bodies that trickle forever and 60,000 runs.
"""

from __future__ import annotations

import io
import json
import re
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mediator.cli import runctl
from mediator.client import (
    MAX_ADVERT_TTL,
    MAX_RESPONSE_BYTES,
    MIN_ADVERT_TTL,
    BadAnswer,
    Client,
    printable,
)
from tests.adversarial.hostile import (
    Hostile,
    chunked_huge,
    declared_huge,
    endless,
    html_answer,
    json_answer,
    serve,
    serve_trickled_headers,
)
from tests.e2e.servers import Process

# What a terminal obeys: C0 (but the newline that ends a line), DEL, C1, bidi/format characters.
OBEYED = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
EVIL = "\x1b]0;owned\x07\x1b[2J\rfake\u202eevil\x9b31m\x7f\u2066x\x85y\x1cz"
NOW = "2026-12-01T10:00:00+00:00"


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    h = Hostile()
    server, thread = serve(h)
    yield h
    server.shutdown()
    server.server_close()
    thread.join(10)


def runctl_run(hostile: Hostile, *argv: str, timeout: float = 30.0) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with Client(hostile.url, timeout=timeout) as client:
        code = runctl.main(list(argv), client=client, stdout=out, stderr=err, sleep=lambda s: None)
    return code, out.getvalue(), err.getvalue()


def evil_run(run_id: str = "r-" + EVIL) -> dict[str, Any]:
    return {
        "run_id": run_id, "state": "RUNNING", "verdict": EVIL, "work_id": EVIL,
        "created_at": NOW, "started_at": NOW, "assigned": {EVIL: EVIL},
        "current": [{"node": EVIL, "step": EVIL, "attempt": 2}],
        "wait_reason": {"code": EVIL, "message": EVIL, "busy": [EVIL]},
        "steps": [{"seq": 0, "name": EVIL, "state": "CLAIMED", "node_id": EVIL, "attempt": 1}],
    }  # fmt: skip


def test_runctl_escapes_control_characters_from_the_server(hostile: Hostile) -> None:
    """Issue 25 §8: ESC/OSC, CR, C1 and RTL overrides in labels, work ids, questions and step
    names reached the operator's terminal raw. Every command, text and JSON, prints them
    escaped — and the JSON is still the same JSON."""
    run = evil_run()
    ask = {"ask_id": 1, "run_id": run["run_id"], "seq": 0, "question": EVIL}
    node = {"node_id": EVIL, "label": EVIL, "drain": EVIL, "expires_at": EVIL,
            "capabilities": {EVIL: EVIL}, "lease": {"run_id": EVIL}}  # fmt: skip
    hostile.routes.update({
        "/v1/runs": json_answer(json.dumps({"observed_at": NOW, "runs": [run]})),
        "/v1/asks": json_answer(json.dumps({"asks": [ask]})),
        "/v1/nodes": json_answer(json.dumps({"observed_at": NOW, "nodes": [node]})),
        "/v1/runs/x": json_answer(json.dumps({**run, "run_id": "x", "state": "PASSED"})),
        "POST /v1/runs/x/cancel": json_answer(json.dumps(run)),
        "POST /v1/asks/1/answer": json_answer(json.dumps({"step_state": EVIL, "settled": EVIL})),
        "/v1/runs/gone": json_answer(json.dumps(
            {"error": {"code": "unknown_run", "message": EVIL, "field": EVIL}}), 404),
    })  # fmt: skip
    commands = [
        ("list",), ("list", "-o", "wide"), ("asks",), ("nodes",), ("status", "x"),
        ("watch", "x"), ("cancel", "x"), ("answer", "1", "yes"), ("status", "gone"),
        ("--json", "list"), ("--json", "asks"), ("--json", "nodes"), ("--json", "status", "x"),
        ("--json", "watch", "x"), ("--json", "status", "gone"),
    ]  # fmt: skip
    for argv in commands:
        code, out, err = runctl_run(hostile, *argv)
        assert OBEYED.search(out + err) is None, (argv, out + err)
        assert "Traceback" not in err, err
        if argv[0] == "--json" and code == 0 and argv[1] != "watch":
            assert json.dumps(EVIL)[1:-1] in json.dumps(json.loads(out))  # the same data
        elif argv[0] != "--json":
            shown = out + err
            assert "\\x1b]0;owned\\x07" in shown or "\\x1b" in shown, (argv, shown)
    assert printable(EVIL) == (
        "\\x1b]0;owned\\x07\\x1b[2J\\x0dfake\\u202eevil\\x9b31m\\x7f\\u2066x\\x85y\\x1cz"
    )


MALFORMED = {
    "html": html_answer(),
    "html-500": html_answer(502),
    "not json": json_answer("{'runs': ["),
    "a list": json_answer("[1, 2, 3]"),
    "runs not a list": json_answer('{"runs": "all of them"}'),
    "run not an object": json_answer('{"runs": [42]}'),
    "deep": json_answer("[" * 100_000 + "]" * 100_000),
    "wrong types": json_answer(json.dumps({"runs": [{"run_id": "r", "state": "QUEUED",
                                                     "wait_reason": "busy", "current": 5}]})),
}  # fmt: skip


@pytest.mark.parametrize("kind", MALFORMED)
def test_runctl_says_one_line_for_an_answer_no_mediator_gives(hostile: Hostile, kind: str) -> None:
    """Issue 25 §9: HTML or a malformed body was a traceback."""
    hostile.routes["/v1/runs"] = MALFORMED[kind]
    code, out, err = runctl_run(hostile, "list")
    assert code in (runctl.EXIT_ERROR, runctl.EXIT_UNREACHABLE), (code, out, err)
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("runctl: "), err
    assert "<html" not in err.lower() or kind.startswith("html")


HUGE = {"declared": declared_huge, "chunked": chunked_huge, "endless": endless()}


@pytest.mark.parametrize("kind", HUGE)
def test_a_huge_answer_is_cut_at_the_limit(hostile: Hostile, kind: str) -> None:
    """Issue 25 §9: a 400 MB body took a client to 1.26 GB. Now at most MAX_RESPONSE_BYTES is
    read: memory stays within a few times that, and the server sees the client hang up."""
    hostile.routes["/v1/runs"] = HUGE[kind]
    tracemalloc.start()
    try:
        with Client(hostile.url) as client, pytest.raises(BadAnswer) as refused:
            client.list_runs()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "answer" in str(refused.value) and "Traceback" not in str(refused.value)
    assert peak < 4 * MAX_RESPONSE_BYTES, peak
    assert hostile.sent < 400 * 1024 * 1024


def test_a_trickled_answer_ends_at_the_request_deadline(hostile: Hostile) -> None:
    """Issue 25 §9: runctl waited 151 s on an answer that trickled: one deadline per request
    now bounds it, however the bytes arrive (here: 2 s, a chunk every 50 ms, for ever)."""
    hostile.routes["/v1/runs"] = endless(b" ", every=0.05)
    started = time.monotonic()
    code, _, err = runctl_run(hostile, "list", timeout=2.0)
    took = time.monotonic() - started
    assert code == runctl.EXIT_UNREACHABLE and "did not end within 2 s" in err, err
    assert took < 30, took  # the deadline, not the 30 s of a single read's timeout, ended it


def test_trickled_headers_end_at_the_request_deadline() -> None:
    """Issue 25 §9: the deadline covered only the body; a server that trickled its status line
    and headers a byte every 50 ms kept each read under httpx's per-read timeout and so held a
    request for as long as it liked (here a minute; for ever if it wished). Now every socket
    read waits only for what is left of the request's deadline (2 s): runctl and enode alike."""
    url, close = serve_trickled_headers()
    try:
        out, err = io.StringIO(), io.StringIO()
        started = time.monotonic()
        with Client(url, timeout=2.0) as client:
            code = runctl.main(["list"], client=client, stdout=out, stderr=err)
            took = time.monotonic() - started
            assert code == runctl.EXIT_UNREACHABLE, (code, err.getvalue())
            assert "did not end within 2 s" in err.getvalue(), err.getvalue()
            assert took < 30, took  # the deadline ended it, not the server's minute
            with pytest.raises(BadAnswer, match="did not end within 2 s"):
                client.work("n1")  # enode's poll: the same client, the same bound
    finally:
        close()


def test_sixty_thousand_runs_are_cut_to_the_page(hostile: Hostile) -> None:
    """Issue 25 §9: a server that ignores ``limit`` and sends 60,000 runs; runctl printed for
    minutes. The client keeps the page asked for, and short ids are linear in the runs."""
    runs = [{"run_id": f"20261201T000000{i:06d}-{i:08x}", "state": "QUEUED", "created_at": NOW}
            for i in range(60_000)]  # fmt: skip
    hostile.routes["/v1/runs"] = json_answer(json.dumps({"observed_at": NOW, "runs": runs}))
    code, out, err = runctl_run(hostile, "list", "--limit", "50")
    assert (code, err) == (0, "")
    assert len(out.splitlines()) == 51  # the header and the 50 asked for
    ids = runctl.short_ids([r["run_id"] for r in runs])
    assert len(set(ids.values())) == 60_000


@pytest.mark.parametrize(
    ("ttl", "want"),
    [(1e-9, MIN_ADVERT_TTL), (-5, MIN_ADVERT_TTL), (0, MIN_ADVERT_TTL), (1e12, MAX_ADVERT_TTL),
     (30, 30.0)],
)  # fmt: skip
def test_an_advert_ttl_is_clamped(hostile: Hostile, ttl: float, want: float) -> None:
    hostile.routes["/v1/nodes"] = json_answer(json.dumps({"advert_ttl_seconds": ttl}))
    with Client(hostile.url) as client:
        assert client.advert("n1", {}, "i1") == want


@pytest.mark.parametrize("ttl", ['"soon"', "null", "true", "NaN", "Infinity", "[1]"])
def test_an_advert_ttl_that_is_no_number_is_a_bad_answer(hostile: Hostile, ttl: str) -> None:
    hostile.routes["/v1/nodes"] = json_answer(f'{{"advert_ttl_seconds": {ttl}}}')
    with Client(hostile.url) as client, pytest.raises(BadAnswer):
        client.advert("n1", {}, "i1")


def enode(hostile: Hostile, tmp_path: Path, *extra: str) -> Process:
    caps = tmp_path / "caps.json"
    caps.write_text('{"board": "x"}')
    return Process.start(
        [sys.executable, "-m", "mediator.enode.main", "--url", hostile.url, "--node-id", "n1",
         "--caps", str(caps), "--keep-dir", str(tmp_path / "keep"), "--stop-grace", "2", *extra],
        env={"MEDIATOR_TOKEN": "", "MEDIATOR_TOKEN_FILE": ""},
    )  # fmt: skip


def wait_until(check: Any, what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_enode_adverts_at_a_sane_rate_whatever_ttl_it_is_told(
    hostile: Hostile, tmp_path: Path
) -> None:
    """Issue 25 §9: told a TTL of 1e-9, a node adverted ~200 times a second. Clamped to 1 s it
    adverts every ⅓ s while it polls for work every 0.05 s: far fewer adverts than polls."""
    hostile.routes["POST /v1/nodes"] = json_answer('{"advert_ttl_seconds": 1e-9}')
    hostile.routes["/v1/nodes/n1/work"] = json_answer('{"steps": []}')
    hostile.routes["GET /v1/nodes"] = json_answer('{"nodes": []}')
    node = enode(hostile, tmp_path, "--poll", "0.05")
    try:
        wait_until(lambda: hostile.seen["GET /v1/nodes/n1/work"] >= 40, "40 work polls")
        adverts, polls = hostile.seen["POST /v1/nodes"], hostile.seen["GET /v1/nodes/n1/work"]
    finally:
        assert node.stop() == 0
    assert 2 * adverts <= polls + 4, (adverts, polls)
    assert "Traceback" not in "".join(node.output)


@pytest.mark.parametrize("kind", ["html", "garbage work", "huge"])
def test_enode_survives_a_server_that_is_no_mediator(
    hostile: Hostile, tmp_path: Path, kind: str
) -> None:
    """Issue 25 §9: HTML or a malformed body made enode exit 1 with a traceback; a 400 MB body
    grew it past a gigabyte. It now logs one line per failure, retries, keeps its memory, and
    stops cleanly."""
    if kind == "html":
        hostile.routes["*"] = html_answer()
    elif kind == "garbage work":
        hostile.routes["POST /v1/nodes"] = json_answer('{"advert_ttl_seconds": 30}')
        hostile.routes["/v1/nodes/n1/work"] = json_answer('{"steps": [{"run_id": 5}]}')
        hostile.routes["GET /v1/nodes"] = json_answer('{"nodes": [{"node_id": "n1", "lease": 7}]}')
    else:
        hostile.routes["*"] = chunked_huge
    node = enode(hostile, tmp_path, "--poll", "0.05")
    try:
        key = "GET /v1/nodes/n1/work" if kind == "garbage work" else "POST /v1/nodes"
        wait_until(lambda: hostile.seen[key] >= 3, f"three requests {key}")
        assert node.proc.poll() is None  # still serving
        status = Path(f"/proc/{node.proc.pid}/status").read_text()
        peak_kb = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]
    finally:
        code = node.stop()
    text = "".join(node.output)
    assert code == 0 and "Traceback" not in text, text[-2000:]
    assert "did not answer as a Mediator" in text
    assert peak_kb < 200 * 1024, peak_kb  # the interpreter and httpx, plus at most 16 MiB


@pytest.mark.parametrize("held", ["25", "nan", "-1", "soon"])
def test_enode_does_not_spin_on_a_server_that_claims_to_hold_its_poll_but_answers_at_once(
    hostile: Hostile, tmp_path: Path, held: str
) -> None:
    """docs/design.md §19 "The wake of a waiting node": after an empty held answer the node asks
    again at once — unless the answer came back well before its time, which no Mediator holding
    the poll does. A server that says ``X-Mediator-Wait: 25`` (or nonsense) and answers at once
    is polled at ``--poll`` pace, not in a tight loop: with adverts every second (TTL 3 s) and
    ``--poll 0.5``, a few polls per advert."""
    hostile.routes["POST /v1/nodes"] = json_answer('{"advert_ttl_seconds": 3}')
    hostile.routes["/v1/nodes/n1/work"] = lambda: (
        200, {"Content-Type": "application/json", "X-Mediator-Wait": held}, b'{"steps": []}'
    )  # fmt: skip
    hostile.routes["GET /v1/nodes"] = json_answer('{"nodes": []}')
    node = enode(hostile, tmp_path, "--poll", "0.5")
    try:
        wait_until(lambda: hostile.seen["POST /v1/nodes"] >= 3, "three adverts")
        adverts, polls = hostile.seen["POST /v1/nodes"], hostile.seen["GET /v1/nodes/n1/work"]
    finally:
        assert node.stop() == 0
    assert polls <= 5 * adverts, (adverts, polls)
    assert "Traceback" not in "".join(node.output)


@pytest.mark.parametrize(
    "step",
    [
        {"seq": 0, "state": "CLAIMED", "attempt": "1"},
        {"seq": 0, "state": "CLAIMED", "attempt": True},
        {"seq": 0, "state": "CLAIMED", "attempt": 1, "with": ["rm", "-rf"]},
        {"seq": 0, "state": "CLAIMED", "attempt": 1, "uses": 7},
    ],
)
def test_the_claim_check_takes_no_step_a_mediator_would_not_give(
    hostile: Hostile, step: dict[str, Any]
) -> None:
    """docs/design.md §9 "A lost answer": the step enode would run after a lost claim's answer
    comes from a read of its run; one with no attempt number or a malformed action is no
    answer (retried later), never a step to run or a crash."""
    run = {"run_id": "r", "state": "RUNNING", "steps": [step]}
    hostile.routes["GET /v1/runs/r"] = json_answer(json.dumps(run))
    with Client(hostile.url) as client, pytest.raises(BadAnswer):
        client.run_step("r", 0)


def test_the_claim_check_reads_the_run_state_and_its_step(hostile: Hostile) -> None:
    step = {"seq": 1, "state": "CLAIMED", "attempt": 2, "uses": "shell", "with": {"cmd": "true"}}
    run = {"run_id": "r", "state": "FAILED", "steps": [{"seq": 0}, step]}
    hostile.routes["GET /v1/runs/r"] = json_answer(json.dumps(run))
    with Client(hostile.url) as client:
        assert client.run_step("r", 1) == ("FAILED", {**step, "run_id": "r"})
        assert client.run_step("r", 2) == ("FAILED", None)
