"""The board's HTTP API, in-process (the page itself: tests/e2e/test_tickets_board.py)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from mediator.tickets.board.server import create_app
from mediator.tickets.frontmatter import Document
from mediator.tickets.names import Lane
from mediator.tickets.store import QueueDir, create_ticket

NOW = 1_741_000_000.0  # 2025-03-03T11:06:40Z


def client_for(queue: QueueDir, refresh_seconds: float = 5.0) -> TestClient:
    """A client as the board's page is one: its writes carry the page's CSRF token."""
    app = create_app(queue, refresh_seconds=refresh_seconds, clock=lambda: NOW)
    return TestClient(app, headers={"X-CSRF-Token": app.state.csrf})


def test_the_page_rereads_every_five_seconds_unless_told_otherwise(tmp_path: Path) -> None:
    queue = QueueDir(tmp_path)
    assert client_for(queue).get("/api/board").json()["refresh_ms"] == 5000
    assert client_for(queue, refresh_seconds=0.25).get("/api/board").json()["refresh_ms"] == 250


def test_the_page_and_its_assets_are_served_locally(tmp_path: Path) -> None:
    client = client_for(QueueDir(tmp_path))
    page = client.get("/")
    assert page.status_code == 200 and "/static/board.js" in page.text
    assert "http" not in page.text.replace("http-equiv", "")  # no CDN, no external link
    assert client.get("/static/board.css").headers["content-type"].startswith("text/css")
    assert client.get("/static/server.py").status_code == 404
    assert client.get("/favicon.ico").status_code == 204


def test_an_answer_creates_one_file_and_only_when_a_question_waits(tmp_path: Path) -> None:
    queue = QueueDir(tmp_path)
    h = create_ticket(queue, "Asks")
    client = client_for(queue)
    refused = client.post(f"/api/tickets/{h}/answer", json={"text": "blue"})
    assert (refused.status_code, refused.json()) == (
        409,
        {"error": f"ticket {h} is not waiting for an answer"},
    )
    path = queue.path(h, Lane.QUEUED)
    doc = Document.parse(path.read_text()).set("awaiting_answer_since", "2025-03-01T00:00:00Z")
    path.write_text(doc.set("question", "Which colour?").render())

    card = client.get("/api/board").json()["lanes"][0]["cards"][0]
    assert card["answer"] == {
        "since": "2025-03-01T00:00:00.000000Z",
        "days": 2,
        "question": "Which colour?",
    }
    sent = client.post(f"/api/tickets/{h}/answer", json={"text": "blue", "by": "mina"})
    assert (sent.status_code, sent.json()) == (201, {"file": f"{h}.answer.1.md"})
    answer = Document.parse((tmp_path / f"{h}.answer.1.md").read_text())
    assert [answer.get(k) for k in ("kind", "ticket", "answered_by")] == ["answer", h, "mina"]
    assert answer.get("answered_at") == "2025-03-03T11:06:40.000000Z"
    assert client.post(f"/api/tickets/{h}/answer", json={"text": "again"}).status_code == 409


def test_unknown_tickets_and_refused_edits(tmp_path: Path) -> None:
    queue = QueueDir(tmp_path)
    h = create_ticket(queue, "Plain")
    client = client_for(queue)
    assert client.get("/api/tickets/nosuch").status_code == 404
    assert client.post(f"/api/tickets/{h}/unassign").status_code == 409  # nothing to unassign
    assert client.post(f"/api/tickets/{h}/retry").status_code == 409
    detail = client.get(f"/api/tickets/{h}").json()
    assert [key for key, _ in detail["fields"]] == ["title", "priority", "deps", "created", "kind"]
