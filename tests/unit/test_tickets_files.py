"""The queue trusts no file (issue 12 §8): symlinks, names that leave the folder, malformed files.

Each test plants what an attacker or an accident could leave in a shared queue folder and checks
that nothing outside the folder is read, shown or written, and that nothing malformed reaches a
worker. The policy is written up in docs/tickets.md ("Files the queue refuses") and
docs/security.md ("Ticket files"). The multi-process version is in
tests/e2e/test_tickets_races.py::test_eight_processes_dispatch_each_valid_ticket_once_among_traps.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from mediator.tickets import claim as claiming
from mediator.tickets.board.server import create_app
from mediator.tickets.claim import claim
from mediator.tickets.cli import main
from mediator.tickets.files import MAX_TEXT_CHARS, MAX_TICKET_BYTES
from mediator.tickets.names import Lane
from mediator.tickets.reclaim import reclaim_stale
from mediator.tickets.store import QueueDir, create_ticket, read_snapshot
from mediator.tickets.worker import Worker, WorkerConfig

NOW = 1_741_000_000.0
SECRET = "---\ntitle: the tokens file\nkind: ticket\n---\ntoken=s3cr3t-token-do-not-show\n"


def page_client(app: Any, **kw: Any) -> TestClient:
    """A client as the board's page is one: its writes carry the page's CSRF token."""
    return TestClient(app, headers={"X-CSRF-Token": app.state.csrf}, **kw)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the queue that a planted symlink points at; it must never change."""
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "tokens.md"
    path.write_text(SECRET)
    os.utime(path, (1_000_000_000, 1_000_000_000))
    return path


@pytest.fixture
def queue(tmp_path: Path) -> QueueDir:
    root = tmp_path / "queue"
    root.mkdir()
    return QueueDir(root)


def untouched(path: Path) -> bool:
    stat = path.stat()
    return path.read_text() == SECRET and stat.st_mtime == 1_000_000_000


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_worker(queue: QueueDir) -> list[str]:
    """A worker until idle; every session appends a line to the ticket it was given."""
    script = 'echo "session was here" >> "$1"'
    worker = Worker(WorkerConfig(queue, ("sh", "-c", script, "s", "{path}"), exit_when_idle=True))
    return [result.hash for result in worker.run()]


# ---- symlinks: never followed, reported, skipped ---------------------------------------------


def test_a_symlink_planted_as_a_ticket_is_listed_invalid_and_never_followed(
    queue: QueueDir, victim: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 12 §8, first bullet: ``ln -s victim Q/bbbbbbbbbbb2.md``."""
    (queue.root / "bbbbbbbbbbb2.md").symlink_to(victim)
    real = create_ticket(queue, "a real ticket")

    assert run_worker(queue) == [real]  # the worker took the real ticket and nothing else
    assert untouched(victim)
    assert (queue.root / "bbbbbbbbbbb2.md").is_symlink()

    snapshot = read_snapshot(queue)
    assert [t.hash for t in snapshot.tickets] == [real]
    [bad] = snapshot.invalid
    assert (bad.file_name, bad.hash) == ("bbbbbbbbbbb2.md", "bbbbbbbbbbb2")
    assert "symbolic link" in bad.reason

    code, out, _ = run_cli(capsys, "list", "--queue", str(queue.root))
    assert code == 0 and "s3cr3t" not in out and "tokens file" not in out
    assert "bbbbbbbbbbb2.md  invalid: a symbolic link (never followed)" in out

    client = page_client(create_app(queue, clock=lambda: NOW))
    detail = client.get("/api/tickets/bbbbbbbbbbb2")
    assert detail.status_code == 404 and "s3cr3t" not in detail.text
    assert "symbolic link" in detail.json()["error"]
    board = client.get("/api/board").json()
    assert "s3cr3t" not in str(board)
    assert board["invalid"] == [
        {
            "file": "bbbbbbbbbbb2.md",
            "hash": "bbbbbbbbbbb2",
            "reason": "a symbolic link (never followed)",
        }
    ]
    assert board["bell"]["invalid"] == board["invalid"] and board["bell"]["count"] == 1


@pytest.mark.parametrize("hard_links", [True, False], ids=["hard links", "O_EXCL fallback"])
def test_a_claim_refuses_a_symlink_that_replaced_a_ticket_after_the_listing(
    queue: QueueDir, victim: Path, hard_links: bool
) -> None:
    """The worker listed a real ticket; by the time it claims, the name is a symlink."""
    queue = QueueDir(queue.root, hard_links=hard_links)
    h = create_ticket(queue, "swapped")
    path = queue.path(h, Lane.QUEUED)
    path.unlink()
    path.symlink_to(victim)

    assert claim(queue, h) is None
    assert untouched(victim)
    assert sorted(os.listdir(queue.root)) == [f"{h}.md"] and path.is_symlink()


@pytest.mark.parametrize("hard_links", [True, False], ids=["hard links", "O_EXCL fallback"])
@pytest.mark.parametrize("checked_first", [True, False], ids=["seen early", "swapped in late"])
def test_a_claim_refuses_a_hard_link_to_a_file_outside_the_queue(
    queue: QueueDir,
    victim: Path,
    hard_links: bool,
    checked_first: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second name for an outside file is the same trap without a symlink.

    "swapped in late": the link appears after the claim's lstat check, so the check passes and
    the descriptor's own link count must catch it.
    """
    queue = QueueDir(queue.root, hard_links=hard_links)
    os.link(victim, queue.root / "cccccccccccc.md")
    if not checked_first:
        monkeypatch.setattr(claiming, "_plain_file", lambda _path: True)
    assert claim(queue, "cccccccccccc") is None
    assert untouched(victim)
    assert sorted(os.listdir(queue.root)) == ["cccccccccccc.md"]
    [bad] = read_snapshot(queue).invalid
    assert bad.reason == "has 2 hard links (a ticket file must be its only name)"


def test_the_reclaimer_and_the_repairs_never_follow_a_symlink(
    queue: QueueDir, victim: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (queue.root / "dddddddddddd.wip.md").symlink_to(victim)
    (queue.root / "eeeeeeeeeeee.md").symlink_to(victim)
    assert reclaim_stale(queue, now=NOW * 2) == []
    for command in ("unassign", "retry"):
        code, _, err = run_cli(capsys, command, "eeeeeeeeeeee", "--queue", str(queue.root))
        assert (code, err) == (1, "tickets: eeeeeeeeeeee.md is a symbolic link; not followed\n")
    code, _, err = run_cli(capsys, "answer", "eeeeeeeeeeee", "hi", "--queue", str(queue.root))
    assert code == 1 and "Traceback" not in err
    assert untouched(victim)
    assert (queue.root / "dddddddddddd.wip.md").is_symlink()
    assert (queue.root / "eeeeeeeeeeee.md").is_symlink()


def test_a_symlinked_answer_file_is_invalid_and_never_read(queue: QueueDir, victim: Path) -> None:
    h = create_ticket(queue, "asks")
    (queue.root / f"{h}.answer.1.md").symlink_to(victim)
    snapshot = read_snapshot(queue)
    assert snapshot.answers == ()
    assert [b.file_name for b in snapshot.invalid] == [f"{h}.answer.1.md"]


# ---- names: inside the queue or refused in one line ------------------------------------------


def outside_names(tmp_path: Path) -> list[str]:
    return ["../outside/evil", str(tmp_path / "outside" / "evil"), "a/b", "", ".hidden", "x\0y"]


@pytest.mark.parametrize("command", ["unassign", "retry", "answer"])
def test_every_command_refuses_a_name_outside_the_queue_in_one_line(
    tmp_path: Path, queue: QueueDir, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Issue 12 §8, second bullet: a traceback for ``..``; an absolute hash rewrote a file."""
    evil = tmp_path / "outside" / "evil.md"
    evil.parent.mkdir(exist_ok=True)
    evil.write_text("---\nsession_id: s-1\nfailures: 3\n---\nmine\n")
    before = evil.read_bytes()
    for name in outside_names(tmp_path):
        extra = ["some text"] if command == "answer" else []
        code, out, err = run_cli(capsys, command, name, *extra, "--queue", str(queue.root))
        assert code == 2, (name, err)
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith("tickets: hash: "), err
    assert evil.read_bytes() == before
    assert os.listdir(queue.root) == []


def test_new_refuses_a_dependency_that_is_not_a_ticket_name(
    queue: QueueDir, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        capsys, "new", "--title", "t", "--dep", "../x", "--queue", str(queue.root)
    )
    assert (code, err.count("\n")) == (2, 1) and err.startswith("tickets: --dep: ")
    assert os.listdir(queue.root) == []


def test_every_board_route_refuses_a_name_outside_the_queue(
    tmp_path: Path, queue: QueueDir
) -> None:
    evil = tmp_path / "outside" / "evil.md"
    evil.parent.mkdir(exist_ok=True)
    evil.write_text("---\nsession_id: s-1\nfailures: 3\n---\nmine\n")
    before = evil.read_bytes()
    client = page_client(create_app(queue, clock=lambda: NOW), raise_server_exceptions=False)
    for name in ("..%2Foutside%2Fevil", "%2E%2E", ".hidden", "a%00b", "x" * 200):
        for method, route, body in (
            ("GET", "", None),
            ("POST", "/answer", {"text": "hi"}),
            ("POST", "/unassign", None),
            ("POST", "/retry", None),
        ):
            response = client.request(method, f"/api/tickets/{name}{route}", json=body)
            assert response.status_code in (400, 404), (name, route, response.text)
            assert "Traceback" not in response.text and str(tmp_path) not in response.text
            if response.status_code == 400:
                assert response.json()["error"].startswith("hash: ")
    assert evil.read_bytes() == before
    assert os.listdir(queue.root) == []


# ---- malformed files: the "invalid" state, never a worker's ---------------------------------


def plant_malformed(root: Path) -> dict[str, str]:
    """One file of each kind the queue refuses, and the reason it shows for it."""
    (root / "aaaaaaaaaaa1.md").write_bytes(b"")
    (root / "aaaaaaaaaaa2.md").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (root / "aaaaaaaaaaa3.md").write_text("---\ntitle: never closed\npriority: 5\n")
    (root / "aaaaaaaaaaa4.md").write_bytes(b"---\ntitle: caf\xe9\n---\n")  # Latin-1, not UTF-8
    (root / "aaaaaaaaaaa5.md").write_text("   \n\n")
    big = "---\ntitle: huge\n---\n" + "x" * (10 * MAX_TICKET_BYTES)  # 10x the limit
    (root / "aaaaaaaaaaa6.md").write_text(big)
    (root / "aaaaaaaaaaa7.md").mkdir()
    os.mkfifo(root / "aaaaaaaaaaa8.md")
    (root / "not a hash!.md").write_text("---\ntitle: spaces in the name\n---\n")
    return {
        "aaaaaaaaaaa1.md": "empty",
        "aaaaaaaaaaa2.md": "binary (not UTF-8 text)",
        "aaaaaaaaaaa3.md": "the frontmatter opens with --- but never closes",
        "aaaaaaaaaaa4.md": "binary (not UTF-8 text)",
        "aaaaaaaaaaa5.md": "empty",
        "aaaaaaaaaaa6.md": f"larger than {MAX_TICKET_BYTES} bytes",
        "aaaaaaaaaaa7.md": "not a regular file",
        "aaaaaaaaaaa8.md": "not a regular file",
        "not a hash!.md": "the name is not a ticket hash (letters, digits, - and _)",
    }


def test_malformed_files_are_invalid_with_their_reason_and_never_dispatched(
    queue: QueueDir, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 12 §8, third bullet: binary, empty or unterminated files went to the worker."""
    expected = plant_malformed(queue.root)
    before = {n: os.lstat(queue.root / n).st_mtime_ns for n in expected}

    assert run_worker(queue) == []  # nothing was dispatched
    assert {n: os.lstat(queue.root / n).st_mtime_ns for n in expected} == before

    snapshot = read_snapshot(queue)
    assert snapshot.tickets == ()
    assert {b.file_name: b.reason for b in snapshot.invalid} == expected

    code, out, _ = run_cli(capsys, "list", "--queue", str(queue.root))
    assert code == 0
    for name, reason in expected.items():
        assert f"  {name}  invalid: {reason}" in out
    assert "0 tickets · 9 invalid files (see the bell)" in out

    board = page_client(create_app(queue, clock=lambda: NOW)).get("/api/board").json()
    assert {i["file"]: i["reason"] for i in board["invalid"]} == expected
    assert board["totals"]["invalid"] == 9 and board["bell"]["count"] == 9


def test_a_ticket_made_invalid_after_the_listing_is_not_claimed(queue: QueueDir) -> None:
    h = create_ticket(queue, "truncated by an editor")
    queue.path(h, Lane.QUEUED).write_bytes(b"")
    assert claim(queue, h) is None
    assert os.listdir(queue.root) == [f"{h}.md"]


def test_plain_markdown_without_frontmatter_is_still_a_ticket(queue: QueueDir) -> None:
    """Not everything unusual is invalid: a note with no frontmatter reads its title from line 1."""
    (queue.root / "ffffffffffff.md").write_text("# Resize the figures\n\nAll of them.\n")
    [ticket] = read_snapshot(queue).tickets
    assert (ticket.hash, ticket.title) == ("ffffffffffff", "Resize the figures")
    assert read_snapshot(queue).invalid == ()


# ---- limits: what a person may write is bounded (tested at 10x) ------------------------------


def asking(queue: QueueDir) -> str:
    h = create_ticket(queue, "asks")
    path = queue.path(h, Lane.QUEUED)
    path.write_text(
        path.read_text().replace(
            "kind: ticket",
            "kind: ticket\nquestion: Which?\nawaiting_answer_since: 2025-01-01T00:00:00Z",
        )
    )
    return h


def test_an_answer_ten_times_too_long_is_refused_naming_the_field(
    queue: QueueDir, capsys: pytest.CaptureFixture[str]
) -> None:
    h = asking(queue)
    huge = "y" * (10 * MAX_TEXT_CHARS)
    client = page_client(create_app(queue, clock=lambda: NOW))
    response = client.post(f"/api/tickets/{h}/answer", json={"text": huge})
    assert response.status_code == 400
    assert response.json()["error"].startswith(f"text: longer than {MAX_TEXT_CHARS} characters")
    code, _, err = run_cli(capsys, "answer", h, huge, "--queue", str(queue.root))
    assert (code, err.count("\n")) == (2, 1) and err.startswith("tickets: text: ")
    code, _, err = run_cli(capsys, "new", "--title", huge, "--queue", str(queue.root))
    assert (code, err.count("\n")) == (2, 1) and err.startswith("tickets: --title: ")
    assert sorted(os.listdir(queue.root)) == [f"{h}.md"]  # nothing was written
    ok = client.post(f"/api/tickets/{h}/answer", json={"text": "y" * MAX_TEXT_CHARS})
    assert ok.status_code == 201  # the limit itself is allowed


def test_a_malformed_request_body_is_a_400_naming_the_field(queue: QueueDir) -> None:
    h = asking(queue)
    client = page_client(create_app(queue, clock=lambda: NOW))
    for body in (None, {}, {"text": 5}, [1, 2]):
        response = client.post(f"/api/tickets/{h}/answer", json=body)
        assert response.status_code == 400, body
        assert response.json()["error"].startswith(("body", "text")), response.text


def test_the_question_file_is_read_without_following_a_symlink_and_within_the_limit(
    queue: QueueDir, victim: Path
) -> None:
    linked, huge = create_ticket(queue, "links its question"), create_ticket(queue, "rambles")
    script = (
        f'if [ "$TICKET_HASH" = {linked} ]; then ln -s {victim} "$TICKET_QUESTION_FILE"; '
        f'else head -c {10 * MAX_TEXT_CHARS} /dev/zero | tr "\\0" q > "$TICKET_QUESTION_FILE"; fi; '
        "exit 3"
    )
    worker = Worker(WorkerConfig(queue, ("sh", "-c", script), exit_when_idle=True))
    assert sorted(r.hash for r in worker.run()) == sorted([linked, huge])
    assert untouched(victim)
    tickets = {t.hash: t for t in read_snapshot(queue).tickets}
    assert "s3cr3t" not in (tickets[linked].question or "")
    assert (
        tickets[linked].question
        == "(the session asked but wrote no question to TICKET_QUESTION_FILE)"
    )
    assert len(tickets[huge].question or "") < 2 * MAX_TEXT_CHARS  # cut, and the file stays valid
    assert read_snapshot(queue).invalid == ()
