"""The board in a real headless Chromium (seed 001; tickets.md §3–4).

Every test starts ``tickets board`` as its own process on a fresh queue folder, with the refresh
interval shortened from 5 s to 0.2 s so a change to the files shows up within a bounded wait, and
drives the page through Playwright. Waits are on page conditions (``expect`` / ``wait_for``), never
sleeps.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

import mediator.tickets
from mediator.tickets.frontmatter import Document
from mediator.tickets.model import format_epoch
from mediator.tickets.names import Lane
from mediator.tickets.store import QueueDir, create_ticket, read_snapshot

pytestmark = pytest.mark.browser

REPO = Path(mediator.tickets.__file__).resolve().parents[2]
REFRESH_SECONDS = 0.2
DAY = 86400.0
ORANGE = "rgb(232, 113, 10)"  # --deps in board.css: the orange deps tag


@dataclass(frozen=True)
class Seeded:
    """The hashes of the example queue every test starts from."""

    normal: str
    blocked: str
    ask_detail: str
    ask_card: str
    ask_bell: str
    assigned: str
    low: str
    running: str
    finished: str


def edit(queue: QueueDir, ticket_hash: str, lane: Lane = Lane.QUEUED, **keys: str | int) -> None:
    path = queue.path(ticket_hash, lane)
    doc = Document.parse(path.read_text())
    for key, value in keys.items():
        doc = doc.set(key, value)
    path.write_text(doc.render())


def move(queue: QueueDir, ticket_hash: str, source: Lane, target: Lane) -> None:
    os.rename(queue.path(ticket_hash, source), queue.path(ticket_hash, target))


def seed(queue: QueueDir) -> Seeded:
    """Nine tickets: one of each kind the board draws differently."""
    three_days_ago = format_epoch(time.time() - 3 * DAY - 3600)

    def asking(title: str, day: int) -> str:
        h = create_ticket(queue, title, created=f"2025-01-{day:02d}T00:00:00Z")
        edit(queue, h, awaiting_answer_since=three_days_ago, question=f"{title}?")
        return h

    normal = create_ticket(queue, "Normal work", created="2025-01-01T00:00:00Z")
    blocked = create_ticket(
        queue, "Needs the normal work", priority=4, deps=(normal,), created="2025-01-02T00:00:00Z"
    )
    ask_detail = asking("Ask in detail", 3)
    ask_card = asking("Ask on card", 4)
    ask_bell = asking("Ask in bell", 5)
    assigned = create_ticket(queue, "Copied by hand")
    edit(queue, assigned, session_id="typed-by-hand")
    low = create_ticket(queue, "Low priority", priority=1)
    running = create_ticket(queue, "Running now")
    move(queue, running, Lane.QUEUED, Lane.IN_PROGRESS)
    edit(
        queue, running, Lane.IN_PROGRESS, session_id="w1-1", heartbeat_at=format_epoch(time.time())
    )
    finished = create_ticket(queue, "Finished")
    move(queue, finished, Lane.QUEUED, Lane.DONE)
    return Seeded(normal, blocked, ask_detail, ask_card, ask_bell, assigned, low, running, finished)


@dataclass(frozen=True)
class Board:
    url: str
    queue: QueueDir
    tickets: Seeded


StartBoard = Callable[..., Board]


@pytest.fixture
def start_board(tmp_path: Path) -> Iterator[StartBoard]:
    """Starts ``tickets board --port 0`` on a seeded queue; stops it after the test."""
    processes: list[subprocess.Popen[str]] = []

    def start(**environ: str) -> Board:
        folder = tmp_path / f"queue{len(processes)}"
        folder.mkdir()
        queue = QueueDir.from_env(folder, environ)
        seeded = seed(queue)
        env = {**os.environ, **environ, "PYTHONPATH": str(REPO)}
        process = subprocess.Popen(
            [sys.executable, "-m", "mediator.tickets", "board", "--queue", str(folder),
             "--port", "0", "--refresh-seconds", str(REFRESH_SECONDS)],
            env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        processes.append(process)
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 20.0)
        assert ready, "the board did not start within 20 s"
        line = process.stdout.readline()
        match = re.fullmatch(r"board: (http://\S+)\n", line)
        assert match, f"unexpected first line {line!r}"
        return Board(match[1], queue, seeded)

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=20)
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture
def board(start_board: StartBoard) -> Board:
    return start_board()


def answer_files(queue: QueueDir, ticket_hash: str | None = None) -> list[Document]:
    return [
        Document.parse((queue.root / a.file_name).read_text())
        for a in read_snapshot(queue).answers
        if ticket_hash is None or a.ticket == ticket_hash
    ]


def card(page: Page, ticket_hash: str) -> object:
    return page.locator(f'.card[data-hash="{ticket_hash}"]')


def lane_hashes(page: Page, lane: str) -> list[str]:
    return page.locator(f'.lane[data-lane="{lane}"] .card').evaluate_all(
        "cards => cards.map(card => card.dataset.hash)"
    )


def test_three_lanes_are_drawn_from_the_file_suffixes_with_no_drag_handles(
    page: Page, board: Board
) -> None:
    t = board.tickets
    page.goto(board.url)
    expect(page.locator(".lane")).to_have_count(3)
    expect(page.locator(".lane h2")).to_have_text(
        [re.compile(f"^{name} ") for name in ("queued", "in progress", "done")]
    )
    expect(card(page, t.normal)).to_be_visible()
    # Dispatch order; "normal" ranks 4, inherited from "blocked", which needs it (tickets.md §4).
    assert lane_hashes(page, "queued") == [
        t.normal,
        t.blocked,
        t.ask_detail,
        t.ask_card,
        t.ask_bell,
        t.low,
    ]
    assert lane_hashes(page, "in progress") == [t.running]
    assert lane_hashes(page, "done") == [t.finished]
    assert page.locator(f'.lane .card[data-hash="{t.assigned}"]').count() == 0  # in no lane
    assert page.locator("[draggable=true]").count() == 0
    assert page.evaluate("[...document.querySelectorAll('.card')].some(c => c.draggable)") is False

    # A worker's rename is all it takes for the card to change lanes (seed 001).
    move(board.queue, t.normal, Lane.QUEUED, Lane.IN_PROGRESS)
    expect(
        page.locator(f'.lane[data-lane="in progress"] .card[data-hash="{t.normal}"]')
    ).to_be_visible()


def test_other_suffix_settings_draw_the_same_lanes(page: Page, start_board: StartBoard) -> None:
    board = start_board(TICKET_INPROGRESS=".doing", TICKET_DONE=".closed")
    assert board.queue.path(board.tickets.running, Lane.IN_PROGRESS).name.endswith(".doing.md")
    page.goto(board.url)
    expect(
        page.locator(f'.lane[data-lane="in progress"] .card[data-hash="{board.tickets.running}"]')
    ).to_be_visible()
    expect(
        page.locator(f'.lane[data-lane="done"] .card[data-hash="{board.tickets.finished}"]')
    ).to_be_visible()


def test_cards_carry_the_deps_tag_the_answer_badge_and_the_priority_meter(
    page: Page, board: Board
) -> None:
    t = board.tickets
    page.goto(board.url)
    tag = page.locator(f'.card[data-hash="{t.blocked}"] .tag.deps')
    expect(tag).to_have_text(f"deps {t.normal}")
    expect(tag).to_have_css("background-color", ORANGE)
    expect(page.locator(f'.card[data-hash="{t.ask_card}"] .badge.answer')).to_have_text(
        "answer waiting · 3d"
    )
    expect(page.locator(f'.card[data-hash="{t.low}"] .meter .bar.on')).to_have_count(1)
    expect(page.locator(f'.card[data-hash="{t.blocked}"] .meter .bar.on')).to_have_count(4)
    expect(page.locator(f'.card[data-hash="{t.low}"] .marks > *')).to_have_count(
        0
    )  # gated: no badge

    # Blocked, the card keeps its place above the priority-3 cards (seed 001: pushing it down
    # would make the cards above it falsely look "next").
    assert lane_hashes(page, "queued")[:3] == [t.normal, t.blocked, t.ask_detail]
    # The dependency is done: the tag goes by itself.
    move(board.queue, t.normal, Lane.QUEUED, Lane.DONE)
    expect(tag).to_have_count(0)
    assert lane_hashes(page, "queued")[:2] == [t.blocked, t.ask_detail]


def test_the_status_filter_has_six_choices_for_three_lanes(page: Page, board: Board) -> None:
    t = board.tickets
    page.goto(board.url)
    choices = page.locator("#status-filter option:not([value=''])")
    expect(choices).to_have_text(
        ["queued", "in progress", "done", "deps waiting", "answer waiting", "assigned"]
    )

    def visible_for(status: str) -> list[str]:
        page.select_option("#status-filter", status)
        return page.locator(".card:visible").evaluate_all("cards => cards.map(c => c.dataset.hash)")

    assert visible_for("deps waiting") == [t.blocked]
    assert visible_for("answer waiting") == [t.ask_detail, t.ask_card, t.ask_bell]
    assert visible_for("queued") == [t.normal, t.low]
    assert visible_for("in progress") == [t.running]
    assert visible_for("done") == [t.finished]
    assert visible_for("assigned") == [t.assigned]  # drawn apart from the lanes
    assert len(visible_for("")) == 8


def test_the_total_says_how_many_are_undispatched_and_the_bell_lists_them(
    page: Page, board: Board
) -> None:
    t = board.tickets
    page.goto(board.url)
    expect(page.locator("#totals")).to_have_text("9 tickets (1 undispatched, see the bell)")
    expect(page.locator("#bell-count")).to_have_text("4")  # one assigned, three questions
    page.click("#bell-button")
    expect(page.locator("#bell-stuck-title")).to_have_text("1 tickets nobody picks up")
    row = page.locator(f'#bell-stuck li[data-hash="{t.assigned}"]')
    expect(row).to_contain_text("assigned to session typed-by-hand")
    expect(row.locator("button")).to_have_text(["unassign"])  # and no dismiss, no "mark read"
    expect(page.locator("#bell-answers li")).to_have_count(3)

    # The bell is in the header, so it is there on the ticket detail screen too.
    page.goto(f"{board.url}#/ticket/{t.normal}")
    expect(page.locator("#detail-title")).to_have_text("Normal work")
    expect(page.locator("#bell-count")).to_have_text("4")


def test_invalid_files_are_shown_with_their_reason_and_a_symlink_is_never_followed(
    page: Page, board: Board, tmp_path: Path
) -> None:
    """Issue 12 §8: the "invalid" state is visible on the board and in the bell, with its reason."""
    victim = tmp_path / "tokens.md"
    victim.write_text("---\ntitle: the tokens file\n---\ntoken=s3cr3t\n")
    (board.queue.root / "bbbbbbbbbbb2.md").symlink_to(victim)
    (board.queue.root / "aaaaaaaaaaa1.md").write_bytes(b"")
    page.goto(board.url)
    expect(page.locator("#totals")).to_have_text(
        "9 tickets (1 undispatched, see the bell) · 2 invalid files (see the bell)"
    )
    rows = page.locator("#invalid li")
    expect(rows).to_have_text(
        [
            "aaaaaaaaaaa1.md invalid: empty",
            "bbbbbbbbbbb2.md invalid: a symbolic link (never followed)",
        ]
    )
    expect(page.locator("#bell-count")).to_have_text("6")  # 4 as before, and the two files
    page.click("#bell-button")
    expect(page.locator("#bell-invalid-title")).to_have_text("2 invalid files nobody picks up")
    expect(page.locator("#bell-invalid li")).to_have_count(2)
    assert "s3cr3t" not in page.content() and "tokens file" not in page.content()

    (board.queue.root / "aaaaaaaaaaa1.md").unlink()  # a person removes it: it leaves by itself
    expect(rows).to_have_count(1)


def test_unassign_from_the_bell_removes_only_the_session_id(page: Page, board: Board) -> None:
    t = board.tickets
    path = board.queue.path(t.assigned, Lane.QUEUED)
    before = path.read_text()
    page.goto(board.url)
    page.click("#bell-button")
    page.locator(f'#bell-stuck li[data-hash="{t.assigned}"] button.unassign').click()
    expect(page.locator(f'#bell-stuck li[data-hash="{t.assigned}"]')).to_have_count(0)
    expect(page.locator("#bell-stuck-title")).to_be_hidden()
    expect(page.locator("#totals")).to_have_text("9 tickets")
    expect(
        page.locator(f'.lane[data-lane="queued"] .card[data-hash="{t.assigned}"]')
    ).to_be_visible()
    assert path.read_text() == before.replace("session_id: typed-by-hand\n", "")


def sent_once(board: Board, ticket_hash: str, text: str) -> None:
    """Exactly one answer file exists in the whole queue, for this ticket, with this text."""
    [answer] = answer_files(board.queue)
    assert (answer.get("kind"), answer.get("ticket"), answer.body) == (
        "answer",
        ticket_hash,
        f"{text}\n",
    )


def test_answer_from_the_ticket_detail(page: Page, board: Board) -> None:
    """The progress-log box's input stands in answer mode while a question waits (seed 001)."""
    h = board.tickets.ask_detail
    page.goto(f"{board.url}#/ticket/{h}")
    form = page.locator('#log-box.answer-mode form.answer-form[data-place="detail"]')
    expect(form.locator(".question")).to_have_text("Ask in detail?")
    form.locator("textarea").fill("Use the blue one")
    form.locator("input[name=by]").fill("mina")
    form.locator("button[type=submit]").click()
    expect(page.locator("#log-box")).not_to_have_class(re.compile("answer-mode"))
    expect(page.locator("#detail-answers li")).to_have_count(1)
    sent_once(board, h, "Use the blue one")
    assert answer_files(board.queue)[0].get("answered_by") == "mina"
    page.goto(board.url)
    expect(page.locator(f'.card[data-hash="{h}"]')).to_have_attribute("data-status", "queued")


def test_answer_from_the_card_dialog(page: Page, board: Board) -> None:
    h = board.tickets.ask_card
    page.goto(board.url)
    page.locator(f'.card[data-hash="{h}"]').click()
    dialog = page.locator("#card-dialog")
    expect(dialog).to_be_visible()
    form = dialog.locator('form.answer-form[data-place="card"]')
    expect(form.locator(".question")).to_have_text("Ask on card?")
    form.locator("textarea").fill("Tuesday")
    form.locator("button[type=submit]").click()
    expect(dialog).to_be_hidden()
    expect(page.locator(f'.card[data-hash="{h}"] .badge.answer')).to_have_count(0)
    sent_once(board, h, "Tuesday")


def test_answer_from_the_bell(page: Page, board: Board) -> None:
    h = board.tickets.ask_bell
    page.goto(board.url)
    page.click("#bell-button")
    item = page.locator(f'#bell-answers li[data-hash="{h}"]')
    expect(item).to_contain_text("Ask in bell? (3d)")
    item.locator("a.answer-link").click()
    form = page.locator('#answer-dialog form.answer-form[data-place="bell"]')
    form.locator("textarea").fill("No")
    form.locator("button[type=submit]").click()
    expect(item).to_have_count(0)  # the lock is gone: the bell's item disappears by itself
    expect(page.locator("#bell-count")).to_have_text("3")
    sent_once(board, h, "No")


def test_the_board_rereads_the_files_without_a_reload(page: Page, board: Board) -> None:
    page.goto(board.url)
    expect(page.locator(".card").first).to_be_visible()
    page.evaluate("window.notReloaded = true")
    refreshes = int(page.locator("body").get_attribute("data-refreshes") or "0")
    fresh = create_ticket(board.queue, "Written while the page is open")
    expect(page.locator(f'.card[data-hash="{fresh}"]')).to_be_visible()
    expect(page.locator("#totals")).to_have_text("10 tickets (1 undispatched, see the bell)")
    assert page.evaluate("window.notReloaded") is True
    assert int(page.locator("body").get_attribute("data-refreshes") or "0") > refreshes


def folder(queue: QueueDir) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(queue.root.iterdir())}


def test_everything_comes_from_the_board_server_and_the_help_shows_the_fields(
    page: Page, board: Board
) -> None:
    """No CDN, no network; and looking at the board writes nothing (seed 001: the app only reads
    the files – it keeps no "resolved" flag or any other second truth)."""
    before = folder(board.queue)
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(board.url)
    expect(page.locator(".card").first).to_be_visible()
    page.click("#help-button")
    expect(page.locator("#help-table tbody tr")).to_have_count(6)
    expect(page.locator("#help-table")).to_contain_text("session_id, claimed_at, heartbeat_at")
    expect(page.locator("#help-table")).to_contain_text("the worker (engine)")
    page.locator("#help-dialog button").click()
    expect(page.locator("#help-dialog")).to_be_hidden()
    page.goto(f"{board.url}#/ticket/{board.tickets.ask_detail}")
    expect(page.locator("#log-box.answer-mode")).to_be_visible()
    page.click("#bell-button")
    expect(page.locator("#bell-answers li")).to_have_count(3)
    assert requested and all(url.startswith(board.url) for url in requested)
    assert folder(board.queue) == before
