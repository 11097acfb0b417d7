"""The Mediator's panel (docs/panel.md) in a real headless Chromium, against a live server.

Each test starts ``mediator serve --dev`` on its own database (``start_server``) and plays the
nodes itself over HTTP – adverts, claims and results with httpx – so the page sees exactly what a
lab would show it. The page is opened with ``?refresh=300`` (the panel's 5 s shortened), and every
change is observed without reloading, through Playwright conditions with bounded timeouts; nothing
sleeps. The countdown test drives the page's clock with Playwright's fake clock instead.

Screenshots go to the test's temporary folder, or to ``$MEDIATOR_SCREENSHOTS`` when
``docs/screenshots/make.py`` runs these tests to refresh the pictures in ``docs/panel.md``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.e2e.servers import READY, Process, Server, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

REFRESH_MS = 300
LAPTOP = {"width": 1366, "height": 768}


class Lab:
    """A live server and the nodes of a small lab, driven over HTTP as ``enode`` would."""

    def __init__(self, url: str, http: httpx.Client, shots: Path) -> None:
        self.url = url
        self.http = http
        self.shots = shots

    def advert(self, node_id: str, label: str = "", drain: str = "", **caps: Any) -> None:
        body = {"node_id": node_id, "label": label, "capabilities": caps, "instance": "i1",
                "policy": {"drain": drain}}  # fmt: skip
        self.http.post("/v1/nodes", json=body).raise_for_status()

    def submit(self, contract: dict[str, Any]) -> int:
        """Submits a contract; returns the HTTP status (201 RUNNING, 202 QUEUED, 422 FAILED)."""
        return self.http.post("/v1/runs", json=contract).status_code

    def run(self, run_id: str) -> dict[str, Any]:
        r = self.http.get(f"/v1/runs/{run_id}")
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]

    def states(self, run_id: str) -> dict[str, str]:
        return {s["name"]: s["state"] for s in self.run(run_id)["steps"]}

    def work(self, node_id: str) -> list[str]:
        steps = self.http.get(f"/v1/nodes/{node_id}/work").json()["steps"]
        return [s["name"] for s in steps]

    def claim(self, node_id: str, run_id: str, step: str) -> int:
        """Claims a claimable step of ``node_id``; returns its attempt."""
        steps = self.http.get(f"/v1/nodes/{node_id}/work").json()["steps"]
        seq = next(s["seq"] for s in steps if (s["run_id"], s["name"]) == (run_id, step))
        r = self.http.post(f"/v1/runs/{run_id}/steps/{seq}/claim", json={"node_id": node_id})
        r.raise_for_status()
        return int(r.json()["attempt"])

    def finish(self, node_id: str, run_id: str, step: str, outcome: str = "pass") -> None:
        """Claims a step (unless already claimed) and reports its result."""
        current = {s["name"]: s for s in self.run(run_id)["steps"]}[step]
        if current["state"] == "CLAIMED":
            seq, attempt = current["seq"], current["attempt"]
        else:
            attempt = self.claim(node_id, run_id, step)
            seq = current["seq"]
        body = {"node_id": node_id, "attempt": attempt, "outcome": outcome, "log": f"{step} ok\n"}
        self.http.post(f"/v1/runs/{run_id}/steps/{seq}/result", json=body).raise_for_status()

    def panel(self, route: str = "#/", refresh: int = REFRESH_MS, **settings: str) -> str:
        return f"{self.url}/?{urlencode({'refresh': refresh, **settings})}{route}"

    def screenshot(self, page: Page, name: str) -> None:
        page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)


def stop(server: Server) -> None:
    """Stops the server and closes its output pipe once the reader thread has hit end of file
    (``Process.stop`` leaves the pipe open, which ``filterwarnings = error`` turns into an error).
    """
    server.process.stop()
    with contextlib.suppress(RuntimeError):  # wait_for raises it at end of output: all read
        server.process.wait_for(re.compile(r"(?!)"), timeout=5)
    if server.process.proc.stdout is not None:
        server.process.proc.stdout.close()


@pytest.fixture
def lab(dsn: str, tmp_path: Path) -> Iterator[Lab]:
    server = start_server(dsn, tmp_path)
    shots = Path(os.environ.get("MEDIATOR_SCREENSHOTS") or tmp_path)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            yield Lab(server.url, http, shots)
    finally:
        stop(server)


def chain(run_id: str, *names: str, work_id: str = "", **needs: Any) -> dict[str, Any]:
    """A one-role contract (role ``dut``) whose steps run one after the other."""
    steps = [{"name": n, "role": "dut", "with": {"cmd": "true"}} for n in names]
    for before, step in itertools.pairwise(steps):
        step["after"] = [before["name"]]
    roles = {"dut": needs or {"board": "x"}}
    return {"run_id": run_id, "work_id": work_id, "roles": roles, "steps": steps}


def test_the_queued_chip_shows_the_queued_run_as_a_row_and_no_card_holds_it(lab, page):
    """Seed 000 §6: S1's QUEUED chip shows a real row (position, wait reason), on no node card."""
    lab.advert("X", label="bench X", board="x", usb=True)
    lab.advert("Y", label="bench Y", drain="graceful", board="x")
    lab.advert("Z", label="scope Z", board="z")
    assert lab.submit(chain("smoke", "selftest", board="z")) == 201
    lab.finish("Z", "smoke", "selftest")
    assert lab.submit(chain("flash-1", "flash", "verify", work_id="ticket-41")) == 201
    assert lab.submit(chain("flash-2", "flash", "verify", work_id="ticket-42")) == 202  # X, Y
    assert lab.submit(chain("nowhere", "flash", board="q")) == 422
    lab.claim("X", "flash-1", "flash")
    page.set_viewport_size(LAPTOP)
    page.goto(lab.panel())

    rows = page.locator("tr.run-row")
    expect(rows).to_have_count(4)
    queued = page.locator('tr.run-row[data-run="flash-2"]')
    expect(queued.locator(".queue-pos")).to_have_text("#1 in queue")
    expect(page.locator("[data-node] [data-lease]")).to_have_text(["flash-1"])
    expect(page.locator('tr.run-row[data-run="flash-1"] td.current')).to_have_text("X: flash")
    lab.screenshot(page, "s1-fleet-and-runs")

    for chip, shown in [("QUEUED", "flash-2"), ("RUNNING", "flash-1"), ("PASSED", "smoke"),
                        ("FAILED", "nowhere")]:  # fmt: skip
        page.locator(f'[data-chip="{chip}"]').click()
        expect(rows).to_have_count(1)
        expect(rows).to_have_attribute("data-run", shown)
        expect(rows).to_have_attribute("data-state", chip)

    page.locator('[data-chip="QUEUED"]').click()
    expect(queued.locator(".queue-pos")).to_have_text("#1 in queue")
    expect(queued.locator(".wait-code")).to_have_text("ALL_BUSY")
    expect(queued.locator(".wait-nodes")).to_have_text("busy: X · draining: Y")
    # It holds no node: the only lease on any card is the running run's, and Y is idle.
    expect(page.locator("[data-node] [data-lease]")).to_have_text(["flash-1"])
    expect(page.locator('[data-node="Y"] .lease')).to_have_text("idle")
    expect(page.locator('[data-node="Y"] .drain')).to_have_text("draining (graceful)")

    # flash-1 ends over HTTP; without a reload the panel shows flash-2 leaving the queue for X.
    lab.finish("X", "flash-1", "flash")
    lab.finish("X", "flash-1", "verify")
    expect(rows).to_have_count(0)
    expect(page.locator("#runs")).to_have_text("No QUEUED run.")
    expect(page.locator("[data-node] [data-lease]")).to_have_text(["flash-2"])
    expect(page.locator('[data-node="X"] [data-lease]')).to_have_text("flash-2")


def test_a_node_card_shows_its_lease_and_a_countdown_from_observed_at(lab, page):
    """Seed 003 §3.2: remaining = expires_at − observed_at, counted down locally, never < 0.

    The page's clock is set 25 years off and driven by hand: the countdown must not read it
    except to count down, and no refresh happens within the test (refresh = 1 h).
    """
    lab.advert("X", label="bench X", board="x")
    assert lab.submit(chain("flash-1", "flash")) == 201
    page.clock.install(time=datetime(2001, 1, 1, tzinfo=UTC))
    page.goto(lab.panel(refresh=3_600_000))

    card = page.locator('[data-node="X"]')
    expect(card.locator("[data-lease]")).to_have_text("flash-1")
    countdown = card.locator(".countdown")
    expect(countdown).to_have_text(re.compile(r"^\d+ s$"))
    start = int(countdown.get_attribute("data-seconds") or "-1")
    assert 0 < start <= 30  # the advert TTL is 30 s

    page.clock.run_for(5_000)
    page.wait_for_function(
        "([el, most]) => Number(el.dataset.seconds) <= most",
        arg=[countdown.element_handle(), start - 5],
    )
    page.clock.fast_forward(120_000)  # long past expires_at: clamped at zero
    expect(countdown).to_have_text("0 s")
    expect(countdown).to_have_class(re.compile(r"\bexpired\b"))


def test_a_long_lease_id_stays_inside_its_node_card(lab, page):
    """Issue 29 (panel): a run id of the full 64 characters, one unbreakable word, ran out of
    its node card over the next one; it wraps inside the card."""
    run_id = "r" * 64
    lab.advert("X", board="x")
    assert lab.submit(chain(run_id, "flash")) == 201
    page.set_viewport_size(LAPTOP)
    page.goto(lab.panel(refresh=3_600_000))
    card = page.locator('[data-node="X"]')
    expect(card.locator("[data-lease]")).to_have_text(run_id)
    outer, link = card.bounding_box(), card.locator("[data-lease]").bounding_box()
    assert outer is not None and link is not None
    assert link["x"] + link["width"] <= outer["x"] + outer["width"] + 0.5, (outer, link)


def test_the_tickets_board_link_shows_only_when_a_board_is_configured(lab, page):
    """Issue 29 (panel): the link pointed at port 8650, where nothing listens by default."""
    page.goto(lab.panel())
    expect(page.locator("[data-count]").first).to_be_visible()
    expect(page.locator("#tickets-link")).to_be_hidden()
    page.goto(lab.panel(board="http://127.0.0.1:9/"))
    expect(page.locator("#tickets-link")).to_be_visible()
    expect(page.locator("#tickets-link")).to_have_attribute("href", "http://127.0.0.1:9/")


def test_s2_draws_a_queued_runs_graph_and_fills_it_in_once_running(lab, page):
    """panel.md: steps exist from submit (R5), so S2 draws the graph while the run is QUEUED."""
    lab.advert("X", label="bench X", board="x")
    assert lab.submit(chain("flash-1", "flash")) == 201
    diamond = {"run_id": "release", "roles": {"dut": {"board": "x"}}, "steps": [
        {"name": "prep", "role": "dut", "with": {"cmd": "true"}},
        {"name": "build", "role": "dut", "after": ["prep"], "with": {"cmd": "true"}},
        {"name": "docs", "role": "dut", "after": ["prep"], "with": {"cmd": "true"}},
        {"name": "sign-off", "kind": "ask", "ask": "Ship it?", "after": ["build", "docs"]},
        {"name": "ship", "role": "dut", "after": ["sign-off"], "with": {"cmd": "true"}},
    ]}  # fmt: skip
    assert lab.submit(diamond) == 202
    page.goto(lab.panel(board="http://127.0.0.1:9/"))
    expect(page.locator("#tickets-link")).to_have_attribute("href", "http://127.0.0.1:9/")

    page.locator('tr.run-row[data-run="release"] td.where').click()  # a row click opens S2
    expect(page).to_have_url(re.compile(r"#/runs/release$"))
    expect(page.locator("#run-state")).to_have_text("QUEUED")
    expect(page.locator(".queue-banner .queue-pos")).to_have_text("#1 in queue")
    boxes = page.locator("svg.graph g.step")
    expect(boxes).to_have_count(5)
    depth = {b.get_attribute("data-step"): int(b.get_attribute("data-depth") or -1)
             for b in boxes.all()}  # fmt: skip
    assert depth == {"prep": 0, "build": 1, "docs": 1, "sign-off": 2, "ship": 3}
    assert {b.get_attribute("data-state") for b in boxes.all()} == {"PENDING"}
    edges = {(e.get_attribute("data-from"), e.get_attribute("data-to"))
             for e in page.locator("svg.graph path.edge").all()}  # fmt: skip
    assert edges == {("prep", "build"), ("prep", "docs"), ("build", "sign-off"),
                     ("docs", "sign-off"), ("sign-off", "ship")}  # fmt: skip
    left = {name: (page.locator(f'g.step[data-step="{name}"]').bounding_box() or {})["x"]
            for name in depth}  # fmt: skip
    assert left["prep"] < left["build"] == left["docs"] < left["sign-off"] < left["ship"]
    expect(page.locator(".record a#record-link")).to_have_attribute(
        "href", "v1/runs/release/record"
    )

    # The run is promoted when flash-1 ends; its steps get X, then an attempt when claimed.
    lab.finish("X", "flash-1", "flash")
    expect(page.locator("#run-state")).to_have_text("RUNNING")
    expect(page.locator(".queue-banner")).to_be_hidden()
    prep = page.locator('g.step[data-step="prep"]')
    expect(prep).to_have_attribute("data-node", "X")
    lab.claim("X", "release", "prep")
    expect(prep).to_have_attribute("data-state", "CLAIMED")
    expect(prep).to_have_attribute("data-attempt", "1")
    expect(prep).to_contain_text("on X · attempt 1")
    expect(prep).to_contain_text("chosen board=x")
    expect(page.locator('.steps tr[data-seq="0"] td.chosen')).to_have_text("X · board=x")


def test_answering_an_ask_in_s2_moves_the_run_on(lab, page):
    """An open ask is answered in place; the API then has the ask step PASSED, the next one free."""
    lab.advert("X", label="bench X", board="x")
    lab.advert("S", label="scope S", scope=True)
    contract = {"run_id": "bringup-7", "work_id": "ticket-41", "roles": {
        "dut": {"board": "x"}, "scope": {"scope": True}}, "steps": [
        {"name": "flash", "role": "dut", "with": {"cmd": "make flash"}},
        {"name": "probe", "kind": "ask", "ask": "Is the probe clipped to TP3?", "after": ["flash"]},
        {"name": "verify", "role": "dut", "after": ["probe"], "with": {"cmd": "true"}},
        {"name": "capture", "role": "scope", "after": ["probe"], "with": {"cmd": "true"}},
        {"name": "calibrate", "role": "scope", "with": {"cmd": "true"}},
        {"name": "report", "role": "dut", "after": ["verify", "capture"], "with": {"cmd": "true"}},
    ]}  # fmt: skip
    assert lab.submit(contract) == 201
    lab.finish("X", "bringup-7", "flash")
    lab.claim("S", "bringup-7", "calibrate")
    page.set_viewport_size(LAPTOP)
    page.goto(lab.panel("#/runs/bringup-7"))

    form = page.locator("form.ask")
    expect(form).to_have_count(1)
    expect(form.locator(".question")).to_have_text("Is the probe clipped to TP3?")
    expect(page.locator('g.step[data-step="probe"]')).to_have_attribute("data-state", "ASKED")
    expect(page.locator('g.step[data-step="calibrate"]')).to_have_attribute("data-state", "CLAIMED")
    form.locator("input").fill("clipped, reads 3.3 V")
    lab.screenshot(page, "s2-run-with-an-ask")

    form.get_by_role("button", name="OK", exact=True).click()
    expect(page.locator("form.ask")).to_have_count(0)
    expect(page.locator('g.step[data-step="probe"]')).to_have_attribute("data-state", "PASSED")
    states = lab.states("bringup-7")
    assert (states["flash"], states["probe"], states["verify"]) == ("PASSED", "PASSED", "PENDING")
    assert lab.work("X") == ["verify"]
    assert lab.http.get("/v1/asks").json()["asks"] == []

    # "Not OK" fails the step and, with it, the run (docs/design.md §2).
    lab.advert("Q", label="bench Q", board="q")
    refusal = {"run_id": "go-no-go", "roles": {"dut": {"board": "q"}}, "steps": [
        {"name": "go?", "kind": "ask", "ask": "Power on the rig?"},
        {"name": "run", "role": "dut", "after": ["go?"], "with": {"cmd": "true"}},
    ]}  # fmt: skip
    assert lab.submit(refusal) == 201
    page.goto(lab.panel("#/runs/go-no-go"))
    page.locator("form.ask").get_by_role("button", name="Not OK").click()
    expect(page.locator("#run-state")).to_have_text("FAILED")
    assert lab.states("go-no-go") == {"go?": "FAILED", "run": "SKIPPED"}
    expect(page.locator("#record-link")).to_have_text("Sealed record")


def test_a_server_with_tokens_gets_one_through_the_header_form(dsn, tmp_path, page):
    """Without --dev every route wants a bearer token: the panel asks for one on a 401."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[token]]\ntoken = "tc-alice-0123456789abcdef"\nprincipal = "alice"\nrole = "client"\n\n'
        '[[token]]\ntoken = "tn-x-0123456789abcdef"\nprincipal = "bench-x"\nrole = "node"\n'
    )
    tokens.chmod(0o600)  # a tokens file must be private (docs/security.md)
    argv = [sys.executable, "-m", "mediator.cli.main",
            "--data", str(tmp_path / "pg"), "--records", str(tmp_path / "records"),
            "serve", "--host", "127.0.0.1", "--port", "0", "--database-url", dsn,
            "--tokens", str(tokens)]  # fmt: skip
    process = Process.start(argv)
    server = Server(process.wait_for(READY).group(1), process, tmp_path / "records")
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            node = {"node_id": "X", "label": "bench X", "capabilities": {"board": "x"},
                    "instance": "i1"}  # fmt: skip
            headers = {"Authorization": "Bearer tn-x-0123456789abcdef"}
            http.post("/v1/nodes", json=node, headers=headers).raise_for_status()
        page.goto(f"{server.url}/?refresh={REFRESH_MS}")
        form = page.locator("#token-form")
        expect(form).to_be_visible()
        expect(page.locator("#status")).to_contain_text("bearer token")

        form.locator("input").fill("not-a-token")
        form.get_by_role("button", name="Use").click()
        expect(page.locator("#status")).to_contain_text("not known")
        expect(form).to_be_visible()

        form.locator("input").fill("tc-alice-0123456789abcdef")
        form.get_by_role("button", name="Use").click()
        expect(page.locator('[data-node="X"] h3')).to_have_text("bench X")
        expect(form).to_be_hidden()
    finally:
        stop(server)


PHONE = {"width": 360, "height": 740}


def blocked_lab(lab: Lab) -> None:
    """X holds bringup-7, which waits for a person's answer; two runs queue behind it; Y drains,
    Z is idle. What S1 must make plain (issue 15 §5): the ask holds the whole queue."""
    lab.advert("X", label="bench X", board="x")
    lab.advert("Y", label="bench Y", drain="graceful", board="y")
    lab.advert("Z", label="scope Z", scope=True)
    held = {"run_id": "bringup-7", "roles": {"dut": {"board": "x"}}, "steps": [
        {"name": "flash", "role": "dut", "with": {"cmd": "true"}},
        {"name": "probe", "kind": "ask", "ask": "Is the probe clipped to TP3?", "after": ["flash"]},
        {"name": "verify", "role": "dut", "after": ["probe"], "with": {"cmd": "true"}},
    ]}  # fmt: skip
    assert lab.submit(held) == 201
    lab.finish("X", "bringup-7", "flash")
    assert lab.submit(chain("flash-1", "flash", "verify", work_id="ticket-41")) == 202
    assert lab.submit(chain("flash-2", "flash", work_id="ticket-42")) == 202


def test_the_step_table_does_not_scroll_sideways_on_a_360_px_screen(lab, page):
    """Issue 29 (panel): at 360 px the page fitted but a run's step table (eleven columns) was
    a frame that scrolled sideways, its node, chosen hardware and times out of sight. Each step
    is now a block of labelled lines: nothing inside the table is wider than the table, the
    table fits the screen, and every column's value is on screen with its label."""
    blocked_lab(lab)
    page.set_viewport_size(PHONE)
    page.goto(lab.panel("#/runs/bringup-7", refresh=3_600_000))
    expect(page.locator("table.steps tbody tr")).to_have_count(3)
    widths = page.evaluate("""() => [".step-table", "table.steps", "table.steps tbody"].map((s) => {
        const e = document.querySelector(s);
        return [s, e.scrollWidth, e.clientWidth];
    })""")
    for selector, scroll, client in widths:
        assert scroll <= client, (selector, scroll, client)
    row = page.locator('table.steps tr[data-seq="0"]')
    for label, value in (("node", "X"), ("chosen", "X · board=x"), ("state", "PASSED")):
        cell = row.locator(f'td[data-label="{label}"]')
        expect(cell).to_contain_text(value)
        box = cell.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], (
            label, box)  # fmt: skip
    label = row.locator('td[data-label="chosen"]').evaluate(
        "(e) => getComputedStyle(e, '::before').content"
    )
    assert label == '"chosen"', label
    lab.screenshot(page, "s2-steps-on-a-phone")


def test_s1_shows_the_ask_that_blocks_the_lab_and_counts_it_in_the_header(lab, page):
    """Issue 15 §5: before, S1 showed nothing for a run waiting for an answer — empty "steps
    now", no badge, no counts — while it held X and so both queued runs."""
    blocked_lab(lab)
    page.set_viewport_size(LAPTOP)
    page.goto(lab.panel())

    row = page.locator('tr.run-row[data-run="bringup-7"]')
    badge = row.locator(".ask-badge")
    expect(badge).to_have_text("ask waiting for an answer: Is the probe clipped to TP3?")
    expect(row).to_have_class(re.compile(r"\bhas-ask\b"))
    expect(page.locator(".ask-badge")).to_have_count(1)  # only the run that waits has one
    counts = page.locator("#counts")
    expect(counts.locator("[data-count]")).to_have_text([
        "2 queued", "1 running", "1 waiting for an answer", "1 idle node", "1 draining node"
    ])  # fmt: skip
    # the positions come from the list itself (issue 15 §4)
    expect(page.locator('tr.run-row[data-run="flash-1"] .queue-pos')).to_have_text("#1 in queue")
    expect(page.locator('tr.run-row[data-run="flash-2"] .queue-pos')).to_have_text("#2 in queue")
    lab.screenshot(page, "s1-blocked-by-an-ask")

    badge.click()  # the badge leads to S2, where the ask is answered
    expect(page).to_have_url(re.compile(r"#/runs/bringup-7$"))
    expect(counts).to_be_hidden()  # S2 shows one run: the lab's counts would go stale there
    page.locator("form.ask").get_by_role("button", name="OK", exact=True).click()
    expect(page.locator('g.step[data-step="probe"]')).to_have_attribute("data-state", "PASSED")
    page.goto(lab.panel())
    expect(page.locator(".ask-badge")).to_have_count(0)
    expect(counts.locator('[data-count="asks"]')).to_have_text("0 waiting for answers")


def test_s1_reads_positions_and_reasons_from_the_list_not_one_request_per_queued_row(lab, page):
    """Issue 15 §4: every refresh is three requests — nodes, runs, asks — however many runs wait.
    Before, each queued row cost a GET /v1/runs/{id} more (up to 50 a refresh, every 5 s)."""
    blocked_lab(lab)
    for i in range(3, 8):
        assert lab.submit(chain(f"flash-{i}", "flash")) == 202  # seven queued runs in all
    api_paths: list[str] = []
    page.on("request", lambda r: api_paths.append(r.url.split("?")[0].split("/v1/", 1)[1])
            if "/v1/" in r.url else None)  # fmt: skip
    page.goto(lab.panel())
    expect(page.locator("tr.run-row .queue-pos")).to_have_count(7)
    for _ in range(3):  # three more refreshes, each observed as its list request
        with page.expect_request(lambda r: r.url.split("?")[0].endswith("/v1/runs")):
            pass
    lists = api_paths.count("runs")
    assert lists >= 4
    assert set(api_paths) == {"nodes", "runs", "asks"}, api_paths  # no runs/{id}
    assert abs(len(api_paths) - 3 * lists) <= 3  # three a refresh (the last may be in flight)


def test_the_panel_fits_a_360_px_screen(lab, page):
    """Issue 15 §5: on a phone, S1 and S2 scroll down, never sideways (the graph scrolls inside
    its own frame); the counts, the badge and the queue reasons stay readable."""
    blocked_lab(lab)
    page.set_viewport_size(PHONE)
    page.goto(lab.panel(refresh=3_600_000))  # one drawing: boxes measured are not redrawn
    expect(page.locator("#counts [data-count]")).to_have_count(5)
    expect(page.locator(".ask-badge")).to_be_visible()
    expect(page.locator('tr.run-row[data-run="flash-1"] .wait-code')).to_have_text("ALL_BUSY")

    def overflow() -> int:
        return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))

    def wide() -> list[str]:  # what sticks out, to say so when the layout breaks
        return page.evaluate("""() => [...document.querySelectorAll("body *")]
            .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 0.5
                        && !e.closest(".graph-scroll, .step-table"))
            .map((e) => `${e.tagName}.${e.className.baseVal ?? e.className}`)""")

    assert overflow() <= 0, wide()
    for selector in ("#counts", ".ask-badge", '[data-node="X"]', 'tr.run-row[data-run="flash-1"]'):
        box = page.locator(selector).first.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], (
            selector, box)  # fmt: skip
    lab.screenshot(page, "s1-on-a-phone")

    page.goto(lab.panel("#/runs/bringup-7", refresh=3_600_000))
    expect(page.locator("form.ask .question")).to_have_text("Is the probe clipped to TP3?")
    expect(page.locator("svg.graph g.step")).to_have_count(3)
    assert overflow() <= 0, wide()
    box = page.locator("form.ask").bounding_box()
    assert box is not None and box["x"] + box["width"] <= PHONE["width"]
