"""Issue 25 §1–2: no ambient authority (docs/security.md "Browsers and local pages", "Tokens").

A page open in the developer's browser can make it send "simple" requests — a form POST, a
``fetch`` with ``text/plain`` — to ``127.0.0.1:8640``. Against ``mediator serve --dev`` one such
request submitted a run whose ``shell`` step an enode then ran as root, and a DNS-rebinding page
(``Host: evil.example``) could read the answers. Here the real ``mediator serve --dev`` is sent
exactly what a browser would send for such a page: every one is refused, and no run exists
afterwards — so there is nothing an enode could ever run. The tickets board gets the same
refusals, and its writes need the page's CSRF token.

Tokens (§2): the presented token is compared byte for byte, never stripped, and a tokens file
that holds an empty, short or repeated token, or that other accounts can read, stops the server
at start with one line naming the problem.
"""

from __future__ import annotations

import http.client as http_client
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from mediator.api.auth import Tokens
from mediator.api.guard import LOOPBACK_HOSTS
from mediator.core.errors import ConfigError
from mediator.tickets.board.server import create_app as create_board
from mediator.tickets.store import QueueDir, create_ticket
from tests.adversarial.conftest import TOKENS, Answer, Attacker, Lab, judge
from tests.e2e.servers import Server, start_server

pytestmark = [pytest.mark.e2e]

SHELL_RUN = {
    "roles": {"dut": {"board": "x"}},
    "steps": [{"name": "pwn", "role": "dut", "uses": "shell", "with": {"cmd": "id > /tmp/pwned"}}],
}
EVIL = "http://evil.example"


@pytest.fixture
def dev(dsn: str, tmp_path: Path) -> Iterator[tuple[Server, Attacker]]:
    server = start_server(dsn, tmp_path)  # --dev: the README's "Try it by hand"
    try:
        yield server, Attacker(server.url)
    finally:
        assert server.process.stop() == 0
    assert not any("Traceback" in line for line in server.process.output)


def with_host(http: Attacker, method: str, path: str, host: str, body: str = "") -> Answer:
    """A request whose Host header is ``host`` (what a rebinding page's requests carry)."""
    conn = http_client.HTTPConnection(http.host, http.port, timeout=60)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host)
        if method == "POST":
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body.encode())))
        conn.endheaders(body.encode() if method == "POST" else None)
        r = conn.getresponse()
        return Answer(r.status, r.read(), {k.lower(): v for k, v in r.getheaders()})
    finally:
        conn.close()


def runs(http: Attacker) -> list[Any]:
    answer = http.send("GET", "/v1/runs", who=None)
    assert answer.status == 200, answer.body
    return list(answer.json()["runs"])


def test_a_cross_site_page_cannot_submit_to_a_dev_server(dev: tuple[Server, Attacker]) -> None:
    """Issue 25 §1: what a hostile page can make a browser send is refused; nothing is queued."""
    server, http = dev
    host = server.url.removeprefix("http://")
    body = json.dumps(SHELL_RUN)
    node = {"node_id": "X", "capabilities": {"board": "x"}, "instance": "i1"}
    assert http.send("POST", "/v1/nodes", node, who=None).status == 200  # a node is waiting
    attempts = [
        # fetch(url, {method: "POST", body: JSON.stringify(run)}): text/plain, no preflight
        ({"Content-Type": "text/plain;charset=UTF-8", "Origin": EVIL}, body, 415),
        # the same without Origin (an old browser, a redirect): the media type alone refuses it
        ({"Content-Type": "text/plain"}, body, 415),
        # <form enctype="text/plain"> with one field named so that the body is the JSON
        ({"Content-Type": "text/plain", "Origin": "null"}, body + "=", 415),
        ({"Content-Type": "application/x-www-form-urlencoded", "Origin": EVIL}, "a=1", 415),
        ({"Content-Type": "multipart/form-data; boundary=x", "Origin": EVIL}, "--x--", 415),
        # JSON from another origin (a preflight the server never grants, or a non-browser)
        ({"Content-Type": "application/json", "Origin": EVIL}, body, 403),
        ({"Content-Type": "application/json", "Origin": "null"}, body, 403),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, body, 403),
        # another port on the same machine is another origin
        ({"Content-Type": "application/json", "Origin": "http://127.0.0.1:1"}, body, 403),
    ]  # fmt: skip
    for headers, data, status in attempts:
        answer = http.send("POST", "/v1/runs", data, who=None, headers=headers)
        assert answer.status == status, (headers, answer.status, answer.body)
        judge("ambient", answer, refused=True)
        assert answer.error["field"] in ("Content-Type", "Origin", "Sec-Fetch-Site")
    # DNS rebinding: the page's own name in Host, with or without the port
    for name in ("evil.example", f"evil.example:{host.split(':')[1]}", "127.0.0.1.evil.example"):
        answer = with_host(http, "POST", "/v1/runs", name, body)
        assert (answer.status, answer.error["field"]) == (400, "Host"), answer.body
        judge("ambient", answer, refused=True)
    assert runs(http) == []  # nothing reached the queue, so no enode can run it
    # A rebinding page cannot read answers either: every method is refused on a foreign Host.
    for path in ("/v1/runs", "/v1/nodes", "/healthz", "/"):
        assert with_host(http, "GET", path, "evil.example").status == 400, path
    for name in (host, f"localhost:{host.split(':')[1]}"):
        assert with_host(http, "GET", "/v1/runs", name).status == 200, name
    # The page on the server's own origin (the panel) and programs without Origin still work.
    ok = http.send("POST", "/v1/runs", SHELL_RUN, who=None, headers={"Origin": server.url})
    assert ok.status == 201, ok.body
    run_id = ok.json()["run_id"]
    # A bodyless POST (cancel) from another origin is refused too: no CSRF hole without a body.
    for headers in ({"Origin": EVIL}, {"Origin": EVIL, "Content-Type": "text/plain"}):
        answer = http.send("POST", f"/v1/runs/{run_id}/cancel", None, who=None, headers=headers)
        assert answer.status in (403, 415), answer.body
    assert [r["state"] for r in runs(http)] == ["RUNNING"]
    assert http.send("POST", f"/v1/runs/{run_id}/cancel", None, who=None).status == 200


def test_the_tickets_board_refuses_foreign_hosts_origins_and_writes_without_its_token(
    tmp_path: Path,
) -> None:
    """Issue 25 §1: the board served any Host and took bodyless cross-site retry/unassign."""
    queue = QueueDir(tmp_path)
    ticket = create_ticket(queue, "a ticket", body="body")
    app = create_board(queue, hosts=LOOPBACK_HOSTS)
    page = TestClient(app, base_url="http://127.0.0.1:8765")
    html = page.get("/").text
    assert f'<meta name="csrf-token" content="{app.state.csrf}">' in html
    assert page.get("/api/board", headers={"Host": "evil.example"}).status_code == 400
    path = f"/api/tickets/{ticket}/retry"
    for headers, status in [
        ({}, 403),  # a bodyless cross-site POST carries no token
        ({"Origin": EVIL, "X-CSRF-Token": app.state.csrf}, 403),
        ({"Content-Type": "text/plain", "X-CSRF-Token": app.state.csrf}, 415),
        ({"X-CSRF-Token": "guess"}, 403),
    ]:
        assert page.post(path, headers=headers).status_code == status, headers
    answer = page.post(
        f"/api/tickets/{ticket}/answer", content="text=x",
        headers={"Content-Type": "application/x-www-form-urlencoded",
                 "X-CSRF-Token": app.state.csrf},
    )  # fmt: skip
    assert answer.status_code == 415
    # The page's own write: same origin, its token.
    mine = page.post(path, headers={"X-CSRF-Token": app.state.csrf, "Origin": str(page.base_url)})
    assert mine.status_code in (200, 409), mine.text  # 409: nothing to retry, but it was heard


# ---- tokens (issue 25 §2) ------------------------------------------------------------------------
LONG = "0123456789abcdef-long-enough"


@pytest.mark.parametrize(
    "trailer", ["\xa0", "\x85", "\x1c", "\xa0\xa0"], ids=["A0", "85", "1C", "A0A0"]
)
def test_a_token_with_anything_around_it_is_not_that_token(lab: Lab, trailer: str) -> None:
    """``.strip()`` once made ``Bearer tok\\xa0`` (and ``Bearer \\xa0`` against an empty token)
    authenticate: the token is now the header's bytes exactly. (Spaces and tabs at the very
    end of a header are the HTTP parser's to drop, RFC 9110 §5.5; inside they count.)"""
    for header in (f"Bearer {TOKENS['admin']}{trailer}", f"Bearer {trailer}{TOKENS['admin']}",
                   f"Bearer {trailer}", f"Bearer  {TOKENS['admin']}",
                   f"Bearer \t{TOKENS['admin']}"):  # fmt: skip
        answer = lab.http.send("GET", "/v1/runs", who=None, headers={"Authorization": header})
        assert answer.status in (400, 401), (repr(header), answer.status)  # 400: the parser's
        judge("auth", answer, refused=True)
    assert lab.http.send("GET", "/v1/runs", who="admin").status == 200


def tokens_file(tmp_path: Path, *tokens: str, mode: int = 0o600, role: str = "client") -> Path:
    p = tmp_path / "tokens.toml"
    p.write_text(
        "".join(
            f'[[token]]\ntoken = "{t}"\nprincipal = "p{i}"\nrole = "{"admin" if i else role}"\n'
            for i, t in enumerate(tokens)
        )
    )
    p.chmod(mode)
    return p


@pytest.mark.parametrize(
    ("tokens", "mode", "words"),
    [
        (("",), 0o600, "token[0].token is empty"),
        ((LONG, ""), 0o600, "token[1].token is empty"),
        (("short",), 0o600, "needs at least 16"),
        (("x" * 15,), 0o600, "needs at least 16"),
        ((LONG, LONG), 0o600, "token[1].token is the same as token[0].token"),
        ((LONG + " ",), 0o600, "visible ASCII"),
        ((LONG,), 0o644, "chmod 600"),
        ((LONG,), 0o640, "chmod 600"),
        ((LONG,), 0o606, "chmod 600"),
    ],
)
def test_a_bad_tokens_file_is_refused_with_one_line(
    tmp_path: Path, tokens: tuple[str, ...], mode: int, words: str
) -> None:
    """Issue 25 §2: an empty token, a duplicate (the last silently won: a client became an
    admin), a short token, a file other accounts can read — each refused, naming it."""
    with pytest.raises(ConfigError) as refused:
        Tokens.load(str(tokens_file(tmp_path, *tokens, mode=mode)))
    assert words in refused.value.message and "\n" not in refused.value.message


def test_mediator_serve_stops_at_start_on_a_bad_tokens_file(tmp_path: Path) -> None:
    """The real command: exit 2 and one line, before anything listens."""
    for tokens, mode in [((LONG, LONG), 0o600), (("",), 0o600), ((LONG,), 0o644)]:
        path = tokens_file(tmp_path, *tokens, mode=mode)
        r = subprocess.run(
            [sys.executable, "-m", "mediator.cli.main", "serve", "--tokens", str(path),
             "--database-url", "postgresql://127.0.0.1:1/none?connect_timeout=1"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "tokens" in lines[0], r.stderr
        assert "Traceback" not in r.stderr


def test_sighup_reloads_the_tokens_file_and_keeps_the_old_on_a_bad_one(
    dsn: str, tmp_path: Path
) -> None:
    """docs/security.md "Tokens": a token is added or revoked without a restart."""
    old, new = "old-token-0123456789abcdef", "new-token-0123456789abcdef"
    path = tokens_file(tmp_path, old)
    server = start_server(dsn, tmp_path, "--workers", "1", tokens=str(path))
    http = Attacker(server.url)

    def status(token: str) -> int:
        auth = {"Authorization": f"Bearer {token}"}
        return http.send("GET", "/v1/runs", who=None, headers=auth).status

    try:
        assert (status(old), status(new)) == (200, 401)
        tokens_file(tmp_path, new)
        server.process.proc.send_signal(signal.SIGHUP)
        server.process.wait_for(re.compile("reloaded the tokens file"))
        assert (status(old), status(new)) == (401, 200)
        tokens_file(tmp_path, new, new)  # a bad file: refused, the tokens in use stay
        server.process.proc.send_signal(signal.SIGHUP)
        server.process.wait_for(re.compile("was not reloaded"))
        assert (status(old), status(new)) == (401, 200)
    finally:
        assert server.process.stop() == 0
    assert os.path.exists(path)


def test_a_token_server_takes_json_bodies_only(lab: Lab) -> None:
    """With tokens nothing is ambient, but the media type is checked all the same: every route
    with a body answers 415 to anything but application/json."""
    node, run = "amb-n1", "amb-r1"
    routes = [
        ("/v1/runs", "client"), ("/v1/nodes", "node"), (f"/v1/runs/{run}/cancel", "client"),
        (f"/v1/runs/{run}/steps/0/claim", "node"), ("/v1/asks/1/answer", "client"),
    ]  # fmt: skip
    for path, who in routes:
        for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
            body = json.dumps({"node_id": node, "instance": "i1", "capabilities": {}})
            answer = lab.http.send("POST", path, body, who=who, headers={"Content-Type": kind})
            assert answer.status == 415, (path, kind, answer.body)
            judge("ambient", answer, refused=True)
