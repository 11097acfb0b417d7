"""runctl against the real API (design.md §19): every command's output, exit status and ``--json``.

The server is the real FastAPI app on a per-test database, served by uvicorn in a thread on a
loopback socket bound by the test. Nodes are enode daemons driven one ``tick()`` at a time in this
thread; ``watch`` and ``submit --wait`` get a ``sleep`` that ticks the node, so a run advances
exactly between two polls and nothing really sleeps.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from mediator import Config, Mediator
from mediator.api.auth import Tokens
from mediator.cli import runctl
from mediator.client import Client
from mediator.enode.daemon import Daemon

pytestmark = pytest.mark.db


@pytest.fixture
def med(dsn: str, tmp_path: Any) -> Iterator[Mediator]:
    m = Mediator.connect(dsn, config=Config(), records_root=str(tmp_path / "records"))
    yield m
    m.close()


@pytest.fixture
def url(serve: Any) -> str:
    return str(serve())


@pytest.fixture
def nodes(url: str) -> Iterator[Any]:
    """``nodes(node_id, **caps) -> Daemon``: an enode on its own client, advertised once."""
    clients: list[Client] = []

    def start(node_id: str, **caps: Any) -> Daemon:
        clients.append(Client(url))
        d = Daemon(clients[-1], node_id, caps, sleep=lambda s: None)
        d.tick()
        return d

    yield start
    for c in clients:
        c.close()


class Runctl:
    """``runctl(*argv)`` in-process against ``url``: returns the exit status, keeps the output."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.out = ""
        self.err = ""

    def __call__(self, *argv: str, **kw: Any) -> int:
        out, err = io.StringIO(), io.StringIO()
        code = runctl.main(["--url", self.url, *argv], stdout=out, stderr=err, **kw)
        self.out, self.err = out.getvalue(), err.getvalue()
        return code

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()

    @property
    def body(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def cli(url: str) -> Runctl:
    return Runctl(url)


def write(tmp_path: Any, name: str, run_id: str, **needs: Any) -> str:
    path = tmp_path / f"{name}.json"
    doc = {
        "run_id": run_id,
        "roles": {"dut": needs or {"board": "x"}},
        "steps": [{"name": "build", "role": "dut", "with": {"cmd": "true"}}],
    }
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_checkpoint_in_process(cli, nodes, tmp_path):
    """design.md §19's checkpoint, with the node ticked by hand where the real one would poll."""
    node = nodes("a", board="x")
    assert cli("submit", write(tmp_path, "a", "run-a")) == 0
    assert cli.lines == ["201 · RUNNING", "run-a"]
    assert cli("submit", write(tmp_path, "b", "run-b")) == 0
    assert cli.lines == ["202 · QUEUED", "run-b"]
    assert cli("status", "run-b") == 0
    assert cli.lines[:4] == [
        "QUEUED",
        "run       run-b",
        "position  1",
        'waiting   ALL_BUSY: Every node that can serve role "dut" is busy or draining (a); the '
        "run waits until one is released.",
    ]
    assert node.tick() is True  # a's last result POST returns
    assert cli("status", "run-b") == 0
    assert cli.lines[0] == "RUNNING"  # wake is synchronous: no sleep, no retry
    assert cli("submit", write(tmp_path, "c", "run-c", board="nope")) == 3
    assert cli.lines == [
        "422 · FAILED",
        "run-c",
        'NO_CANDIDATE: No live node can serve role "dut" (needs {"board": "nope"}); change the '
        "contract or bring such a node online.",
    ]


def test_json_prints_the_body_and_keeps_the_exit_status(cli, nodes, tmp_path, med):
    nodes("a", board="x")
    assert cli("--json", "submit", write(tmp_path, "a", "run-a")) == 0
    assert cli.body == json.loads(json.dumps(med.get_run("run-a").to_dict()))
    assert cli("submit", write(tmp_path, "a", "run-a"), "--json") == 0  # R3: the same run again
    assert (cli.body["run_id"], cli.body["state"]) == ("run-a", "RUNNING")
    assert cli("submit", write(tmp_path, "c", "run-c", board="nope"), "--json") == 3
    assert (cli.body["state"], cli.body["reject"]["code"]) == ("FAILED", "NO_CANDIDATE")
    assert cli("status", "nope", "--json") == runctl.EXIT_UNKNOWN_RUN
    assert cli.body == {"error": {"code": "unknown_run", "message": "No run with run_id 'nope'.",
                                  "field": None}}  # fmt: skip


def test_a_resubmit_answers_200_with_the_stored_run(cli, nodes, tmp_path):
    nodes("a", board="x")
    path = write(tmp_path, "a", "run-a")
    cli("submit", path)
    assert cli("submit", path) == 0
    assert cli.lines == ["200 · RUNNING", "run-a"]


def test_errors_print_one_line_and_exit_1(cli, tmp_path):
    assert cli("status", "nope") == runctl.EXIT_UNKNOWN_RUN
    assert (cli.out, cli.err) == ("", "runctl: 404 unknown_run: No run with run_id 'nope'.\n")
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"roles": {}, "steps": [{"name": "x", "role": "dut", "with": {"cmd": "true"}}]}'
    )
    assert cli("submit", str(bad)) == 1
    assert cli.err.startswith("runctl: 400 ")
    assert "(field steps[0].role)" in cli.err


def test_a_dry_run_creates_nothing(cli, nodes, tmp_path, med):
    nodes("a", board="x")
    assert cli("submit", write(tmp_path, "a", "run-a"), "--dry-run") == 0
    assert cli.lines == ["200 · DRY RUN", "assigned  dut=a", "width     1"]
    assert med.list_runs().runs == ()


def test_a_dry_run_of_a_contract_that_would_be_refused_exits_3(cli, nodes, tmp_path, med):
    """issue 29: it exited 0, so `runctl submit --dry-run` could not gate a script. A dry run
    that would only queue (ALL_BUSY) stays 0, as its submit's 202 does."""
    nodes("a", board="x")
    assert cli("submit", write(tmp_path, "z", "run-z", board="z"), "--dry-run") == 3
    assert cli.lines[0] == "200 · DRY RUN" and "NO_CANDIDATE" in cli.lines[1]
    assert cli("submit", write(tmp_path, "z", "run-z", board="z")) == 3  # as the submit itself
    assert cli("submit", write(tmp_path, "a", "run-a")) == 0
    assert cli("submit", write(tmp_path, "b", "run-b"), "--dry-run") == 0
    assert "ALL_BUSY" in cli.lines[1]


def test_list_and_nodes_show_the_fleet_and_the_runs(cli, nodes, tmp_path, med):
    nodes("a", board="x")
    cli("submit", write(tmp_path, "a", "run-a"))
    cli("submit", write(tmp_path, "b", "run-b"))
    assert cli("list") == 0
    assert [line.split()[:2] for line in cli.lines] == [
        ["ID", "STATE"],
        ["run-b", "QUEUED"],
        ["run-a", "RUNNING"],
    ]
    assert cli("list", "--state", "QUEUED", "--json") == 0
    assert [r["run_id"] for r in cli.body["runs"]] == ["run-b"]
    assert cli("nodes") == 0
    head = ["NODE", "LABEL", "DRAIN", "LEASE", "EXPIRES", "CAPABILITIES", "ACTIONS"]
    assert cli.lines[0].split() == head
    assert cli.lines[1].split()[:3] == ["a", "-", "run-a"]
    assert cli.lines[1].endswith('{"board":"x"}  fail,shell,sleep')  # what its daemon offers


def test_cancel_ends_a_run(cli, nodes, tmp_path):
    nodes("a", board="x")
    cli("submit", write(tmp_path, "a", "run-a"))
    assert cli("cancel", "run-a") == 0
    assert cli.lines == ["200 · FAILED", "run-a", "verdict   cancelled"]


def test_asks_are_listed_and_answered(cli, tmp_path):
    path = tmp_path / "ask.json"
    path.write_text(json.dumps({"run_id": "run-q", "roles": {}, "steps": [
        {"name": "confirm", "kind": "ask", "ask": "Is the board powered?"}]}))  # fmt: skip
    assert cli("submit", str(path)) == 0
    assert cli.lines == ["201 · RUNNING", "run-q"]
    assert cli("asks") == 0
    assert cli.lines[0].split() == ["ASK", "RUN", "SEQ", "QUESTION"]
    ask_id, run_id, seq, question = cli.lines[1].split(maxsplit=3)
    assert (run_id, seq, question) == ("run-q", "0", "Is the board powered?")
    assert cli("answer", ask_id, "yes, green LED") == 0
    assert cli.lines == ["200 · PASSED", "run settled PASSED"]
    assert cli("asks") == 0
    assert cli.lines == ["(none)"]


def test_an_answer_no_fails_the_ask(cli, tmp_path):
    path = tmp_path / "ask.json"
    path.write_text(json.dumps({"run_id": "run-q", "roles": {}, "steps": [
        {"name": "confirm", "kind": "ask", "ask": "Ship it?"}]}))  # fmt: skip
    cli("submit", str(path))
    cli("asks", "--json")
    (ask,) = cli.body["asks"]
    assert cli("answer", str(ask["ask_id"]), "not today", "--no") == 0
    assert cli.lines == ["200 · FAILED", "run settled FAILED"]


def test_watch_follows_a_run_until_it_ends(cli, nodes, tmp_path):
    node = nodes("a", board="x")
    path = tmp_path / "two.json"
    steps = [
        {"name": "build", "role": "dut", "with": {"cmd": "true"}},
        {"name": "test", "role": "dut", "after": ["build"], "with": {"cmd": "true"}},
    ]
    path.write_text(
        json.dumps({"run_id": "run-w", "roles": {"dut": {"board": "x"}}, "steps": steps})
    )
    cli("submit", str(path))
    assert cli("watch", "run-w", sleep=lambda s: node.tick()) == 0
    assert cli.lines == [
        "RUNNING",
        "  step 0 build: PASSED on a attempt 1",
        "PASSED · pass",
        "  step 1 test: PASSED on a attempt 1",
    ]


def test_submit_wait_exits_with_the_run_s_verdict(cli, nodes, tmp_path):
    node = nodes("a", board="x")
    tick = {"sleep": lambda s: node.tick()}
    assert cli("submit", write(tmp_path, "a", "run-a"), "--wait", **tick) == 0
    assert cli.lines == ["201 · RUNNING", "run-a", "PASSED", "verdict   pass"]
    path = tmp_path / "fail.json"
    steps = [{"name": "x", "role": "dut", "uses": "fail"}]
    path.write_text(
        json.dumps({"run_id": "run-f", "roles": {"dut": {"board": "x"}}, "steps": steps})
    )
    assert cli("submit", str(path), "--wait", **tick) == 1
    assert cli.lines == ["201 · RUNNING", "run-f", "FAILED", "verdict   fail"]
    assert cli("submit", str(path), "--wait", "--json", **tick) == 1
    assert (cli.body["run_id"], cli.body["state"]) == ("run-f", "FAILED")


def test_wait_gives_up_after_its_timeout(cli, nodes, tmp_path):
    nodes("a", board="x")
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds  # the node never works: the run stays RUNNING

    code = cli(
        "submit", write(tmp_path, "a", "run-a"), "--wait", "--interval", "2", "--timeout", "5",
        sleep=sleep, clock=lambda: now[0],
    )  # fmt: skip
    assert code == runctl.EXIT_TIMEOUT == 5  # issue 15 §4: not FAILED's 1
    assert cli.lines == ["201 · RUNNING", "run-a"]
    assert cli.err == "runctl: run run-a is still RUNNING after 5 s\n"
    assert now == [5.0]


def test_the_token_comes_from_the_environment(serve, tmp_path, monkeypatch):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[token]]\ntoken = "tc1-0123456789abcdef"\nprincipal = "alice"\nrole = "client"\n'
    )
    tokens.chmod(0o600)  # a tokens file must be private (docs/security.md)
    cli = Runctl(serve(Tokens.load(str(tokens))))
    assert cli("list") == 1
    assert cli.err.startswith("runctl: 401 unauthorized: ")
    monkeypatch.setenv("MEDIATOR_TOKEN", "tc1-0123456789abcdef")
    assert cli("list") == 0
    assert cli.lines == ["(none)"]


# ---- issue 15 §4: list with squeue's essentials; distinct exit statuses -------------------------

AGE = r"\d+:\d\d"  # squeue's M:SS; the server's clock is the wall clock here


def ask_then_flash(tmp_path: Any, run_id: str) -> str:
    """A run that takes node "a" and then waits for a person before it flashes the board."""
    path = tmp_path / f"{run_id}.json"
    path.write_text(json.dumps({"run_id": run_id, "roles": {"dut": {"board": "x"}}, "steps": [
        {"name": "confirm", "kind": "ask", "ask": "Is the board powered?"},
        {"name": "flash", "role": "dut", "after": ["confirm"], "with": {"cmd": "true"}},
    ]}))  # fmt: skip
    return str(path)


def test_list_shows_position_reason_age_nodes_and_a_run_waiting_for_an_answer(cli, nodes, tmp_path):
    import re

    nodes("a", board="x")
    cli("submit", ask_then_flash(tmp_path, "run-a"))  # holds a, waits for an answer
    cli("submit", write(tmp_path, "b", "run-b"))  # queued behind it
    cli("submit", write(tmp_path, "c", "run-c"))
    assert cli("list") == 0
    ask_id = re.search(r"ask (\d+):", cli.out).group(1)  # type: ignore[union-attr]
    rows = [re.split(r"\s{2,}", line) for line in cli.lines]
    assert rows[0] == ["ID", "STATE", "POS", "REASON", "AGE", "NODES", "CURRENT"]
    assert [r[:4] + r[5:] for r in rows[1:]] == [
        ["run-c", "QUEUED", "2", "ALL_BUSY", "-", "-"],
        ["run-b", "QUEUED", "1", "ALL_BUSY", "-", "-"],
        ["run-a", "RUNNING", "-", "-", "a",
         f"waiting for an answer (ask {ask_id}: Is the board powered?)"],
    ]  # fmt: skip
    assert all(re.fullmatch(AGE, r[4]) for r in rows[1:])
    # any case for --state, as squeue takes it
    assert cli("list", "--state", "queued") == 0
    assert [line.split()[0] for line in cli.lines] == ["ID", "run-c", "run-b"]
    # -o wide: the verdict, roles, the work id, the creation time, and the whole reason
    assert cli("list", "-o", "wide", "--state", "Queued") == 0
    assert re.split(r"\s{2,}", cli.lines[0]) == [
        "ID", "STATE", "VERDICT", "POS", "REASON", "AGE", "NODES", "WORK", "CREATED", "CURRENT"
    ]  # fmt: skip
    assert 'ALL_BUSY: Every node that can serve role "dut" is busy' in cli.lines[2]
    assert cli.lines[2].count(" · busy: a") == 1
    # -o json is --json
    assert cli("list", "-o", "json") == 0
    assert [r.get("queue_position") for r in cli.body["runs"]] == [2, 1, None]


def test_list_shortens_long_ids_to_their_unambiguous_tail_and_status_takes_it(cli, nodes, tmp_path):
    nodes("a", board="x")
    path = tmp_path / "anon.json"
    path.write_text(json.dumps({"roles": {"dut": {"board": "x"}}, "steps": [
        {"name": "build", "role": "dut", "with": {"cmd": "true"}}]}))  # fmt: skip
    cli("submit", str(path))
    first = cli.lines[1]
    cli("submit", str(path))
    second = cli.lines[1]
    assert len(first) == 30 and first[:8] == second[:8]  # they share the timestamp
    assert cli("list") == 0
    shown = [line.split()[0] for line in cli.lines[1:]]
    assert shown == ["…" + second[-8:], "…" + first[-8:]]
    assert cli("status", shown[0]) == 0
    assert cli.lines[1] == f"run       {second}"


def test_watch_tells_failed_timeout_unknown_run_and_unreachable_apart(cli, nodes, tmp_path):
    node = nodes("a", board="x")
    path = tmp_path / "fail.json"
    steps = [{"name": "x", "role": "dut", "uses": "fail"}]
    path.write_text(
        json.dumps({"run_id": "run-f", "roles": {"dut": {"board": "x"}}, "steps": steps})
    )
    cli("submit", str(path))
    assert cli("watch", "run-f", sleep=lambda s: node.tick()) == runctl.EXIT_ERROR == 1
    cli("submit", write(tmp_path, "a", "run-a"))
    now = [0.0]

    def idle(seconds: float) -> None:
        now[0] += seconds

    assert cli("watch", "run-a", "--timeout", "3", sleep=idle, clock=lambda: now[0]) == 5
    assert cli("watch", "run-nope") == runctl.EXIT_UNKNOWN_RUN == 4
    assert cli.err == "runctl: 404 unknown_run: No run with run_id 'run-nope'.\n"
    dead = Runctl("http://127.0.0.1:9")  # the discard port: nobody listens on loopback
    assert dead("watch", "run-a") == runctl.EXIT_UNREACHABLE == 6
    assert dead.err.startswith("runctl: cannot reach the Mediator at http://127.0.0.1:9")
    assert len({1, 5, 4, 6, runctl.EXIT_USAGE, runctl.EXIT_REJECTED}) == 6


# ---- issue 12 §7: a closed pipe ends runctl quietly ---------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["list"], ["status", "run-a"], ["nodes"], ["asks"], ["list", "-o", "wide"], ["--help"],
     ["status", "run-a", "--json"], ["watch", "run-a", "--timeout", "0.1"]],
)  # fmt: skip
def test_a_closed_pipe_ends_every_command_quietly(url, nodes, tmp_path, argv):
    """``runctl status … | head``: the reader has gone before runctl writes. The read end of the
    pipe is closed before the child starts, so its first write fails every time (no race)."""
    import os
    import subprocess
    import sys

    nodes("a", board="x")
    Runctl(url)("submit", ask_then_flash(tmp_path, "run-a"))
    read, write_end = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mediator.cli.runctl", "--url", url, *argv],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert done.stderr == ""
    # 128 + SIGPIPE, as `yes | head` ends; --help is argparse's, which drops the text and exits 0
    assert done.returncode == (0 if argv == ["--help"] else 141)


def test_status_says_why_a_step_failed_and_logs_prints_the_logs_escaped(cli, nodes, tmp_path):
    """Issue 29: `status` showed only FAILED, the reason sat in the record's log file, and there
    was no `runctl logs`. A failing step's last log lines are under the steps table, a skipped
    step says why, and `logs` prints every log under a header (or one step's), with the
    control characters a hostile log could carry (ESC, CR) escaped."""
    node = nodes("a", board="x")
    steps = [
        {"name": "ok", "role": "dut", "with": {"cmd": "echo fine"}},
        {"name": "x", "role": "dut", "uses": "fail", "with": {"message": "bad\x1b[2Jboard\r"},
         "after": ["ok"]},
        {"name": "later", "role": "dut", "with": {"cmd": "true"}, "after": ["x"]},
    ]  # fmt: skip
    path = tmp_path / "f.json"
    path.write_text(
        json.dumps({"run_id": "run-l", "roles": {"dut": {"board": "x"}}, "steps": steps})
    )
    assert cli("submit", str(path), "--wait", sleep=lambda s: node.tick()) == 1
    assert cli("status", "run-l") == 0
    assert cli.lines[-2:] == [
        "  why 1 x: bad\\x1b[2Jboard\\x0d",
        "  why 2 later: skipped: a step it waits for did not pass",
    ]
    assert cli("logs", "run-l") == 0
    assert cli.lines == [
        "==> 0 ok PASSED <==",
        "fine",
        "==> 1 x FAILED <==",
        "bad\\x1b[2Jboard\\x0d",
        "==> 2 later SKIPPED <==",  # its log is empty: it never ran
    ]
    assert cli("logs", "run-l", "x") == 0
    assert cli.out == "bad\\x1b[2Jboard\\x0d\n"
    assert cli("logs", "run-l", "nope") == 1
