"""The adversarial tier: a real ``mediator serve --tokens FILE`` attacked over raw HTTP (issue 11).

One server per module runs on its own database, with its records root inside a folder that also
holds the tokens file and a canary file — the layout the path-escape finding (issue 11 §1) used to
read the tokens. Every request goes through :class:`Attacker`, which sends the path bytes exactly
as written (``http.client`` does not normalise ``..`` or percent-encodings) and judges each answer:

* *refused cleanly*: a 4xx whose body is the ``{"error": {code, message, field}}`` shape (or the
  HTTP parser's own plain 400 for a request line or header it cannot parse), with no internal text
  and no secret in it;
* *unsafe*: any 5xx, any leak, any secret — the test fails on the spot.

The figures per attack class (cases tried / refused cleanly / unsafe) are printed at the end of the
session and recorded in ``docs/security.md``.
"""

from __future__ import annotations

import http.client
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from mediator.store.db import Store
from tests.conftest import FIGURES
from tests.e2e.servers import Server, start_server

CANARY = "canary-7f3a-do-not-serve"
SECRETS = (
    "tok-node-1-0123456789abcdef",
    "tok-node-2-0123456789abcdef",
    "tok-client-1-0123456789abcdef",
    "tok-client-2-0123456789abcdef",
    "tok-admin-0123456789abcdef",
    CANARY,
)
TOKENS = {
    "node": "tok-node-1-0123456789abcdef",
    "node2": "tok-node-2-0123456789abcdef",
    "client": "tok-client-1-0123456789abcdef",
    "client2": "tok-client-2-0123456789abcdef",
    "admin": "tok-admin-0123456789abcdef",
}
LEAKS = ("traceback", "psycopg", "site-packages", 'file "', '.py"', "select ", "insert into")
TABLES = ("runs", "steps", "nodes", "leases", "asks", "events", "needs_classes")

# attack class → Counter(tried, clean, unsafe): session-wide, so it lives in tests/conftest.py,
# which prints it at the end (and gathers it from every xdist worker).


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> dict[str, Any]:
        return self.json()["error"]  # type: ignore[no-any-return]


class Attacker:
    """Raw HTTP against one server; every answer is judged and counted under an attack class."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80

    def send(
        self,
        method: str,
        path: str,
        body: bytes | str | dict[str, Any] | list[Any] | None = None,
        *,
        who: str | None = "client",
        headers: dict[str, str] | None = None,
        chunks: Iterator[bytes] | None = None,
    ) -> Answer:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        h = dict(headers or {})
        if who is not None:
            h["Authorization"] = f"Bearer {TOKENS[who]}"
        data: bytes | None
        if isinstance(body, dict | list):
            data = json.dumps(body).encode()
        elif isinstance(body, str):
            data = body.encode("utf-8", "surrogatepass")
        else:
            data = body
        if data is not None or chunks is not None:
            h.setdefault("Content-Type", "application/json")
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for k, v in h.items():
                conn.putheader(k, v)
            if chunks is not None:
                conn.putheader("Transfer-Encoding", "chunked")
                conn.endheaders()
                try:
                    for chunk in chunks:
                        conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    conn.send(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the server answered early (413) and closed: read its answer
            else:
                if data is not None:
                    conn.putheader("Content-Length", str(len(data)))
                conn.endheaders(data)
            r = conn.getresponse()
            return Answer(r.status, r.read(), {k.lower(): v for k, v in r.getheaders()})
        finally:
            conn.close()

    def attack(self, kind: str, method: str, path: str, body: Any = None, **kw: Any) -> Answer:
        """Send one hostile request and assert it was refused cleanly (or served safely)."""
        answer = self.send(method, path, body, **kw)
        judge(kind, answer, refused=True)
        return answer


def judge(kind: str, answer: Answer, *, refused: bool) -> None:
    """Count the answer under ``kind``; fail on a 5xx, a leak, or (``refused``) a 2xx."""
    figures = FIGURES.setdefault(kind, Counter())
    figures["tried"] += 1
    text = answer.body.decode("utf-8", "replace")
    low = text.lower()
    unsafe = (
        answer.status >= 500
        or any(leak in low for leak in LEAKS)
        or any(secret in text for secret in SECRETS)
    )
    if unsafe:
        figures["unsafe"] += 1
        pytest.fail(f"{kind}: unsafe answer {answer.status}: {text[:300]}")
    if refused:
        clean = 400 <= answer.status < 500 and _error_shaped(answer)
        if not clean:
            pytest.fail(f"{kind}: not refused cleanly: {answer.status} {text[:300]}")
    figures["clean"] += 1


def _error_shaped(answer: Answer) -> bool:
    if answer.headers.get("content-type", "").startswith("text/plain"):
        return answer.status == 400  # the HTTP parser's own refusal of a malformed request
    try:
        error = answer.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return set(error) == {"code", "message", "field"}


@dataclass
class Lab:
    """One attacked server, the folder around its records root, and a read-only database view."""

    server: Server
    http: Attacker
    store: Store
    home: Path  # holds tokens.toml, the canary and records/

    def counts(self) -> dict[str, int]:
        """Rows per table: equal before and after a refused request (nothing committed)."""
        sql = " UNION ALL ".join(f"SELECT '{t}' AS t, count(*) AS n FROM {t}" for t in TABLES)
        return {r["t"]: r["n"] for r in self.store.read_only(sql)}

    def outside_records(self) -> dict[str, bytes]:
        """Every file beside the records root, with its bytes (the canary among them)."""
        return {
            str(p.relative_to(self.home)): p.read_bytes()
            for p in sorted(self.home.iterdir())
            if p.is_file()
        }


@pytest.fixture(scope="package")
def lab(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    home = tmp_path_factory.mktemp("lab")
    (home / "canary.txt").write_text(CANARY + "\n")
    tokens = home / "tokens.toml"
    roles = {"node": "node", "node2": "node", "client": "client", "client2": "client"}
    entries = [
        f'[[token]]\ntoken = "{TOKENS[k]}"\nprincipal = "p-{k}"\nrole = "{r}"\n'
        for k, r in {**roles, "admin": "admin"}.items()
    ]
    tokens.write_text("\n".join(entries))
    tokens.chmod(0o600)
    name = cluster.fresh_database()
    dsn = cluster.dsn(name)
    work = tmp_path_factory.mktemp("work")
    # Nothing in the shared lab expires while the package runs: the attacks compare every
    # table's rows before and after a refused request (`Lab.counts`), and a node an earlier test
    # advertised whose advert lapsed mid-attack was reaped, freeing its leases, under a loaded
    # machine. Expiry and reaping have their own tests (tests/db, tests/e2e).
    hour = {"MEDIATOR_ADVERT_TTL_SECONDS": "3600", "MEDIATOR_LEASE_TTL_SECONDS": "3600"}
    server = start_server(dsn, work, tokens=str(tokens), records=home / "records", env=hour)
    store = Store(dsn, None, max_size=2)
    before = {"canary.txt": (home / "canary.txt").read_bytes(), "tokens.toml": tokens.read_bytes()}
    try:
        yield Lab(server, Attacker(server.url), store, home)
    finally:
        store.close()
        code = server.process.stop()
        cluster.drop(name)
    # Never a path outside its root: the folder around the records root holds exactly what it
    # held before the attacks, byte for byte, and nothing was created there.
    assert sorted(p.name for p in home.iterdir()) == ["canary.txt", "records", "tokens.toml"]
    assert {k: (home / k).read_bytes() for k in before} == before
    assert code == 0, "".join(server.process.output[-40:])
    assert not any("Traceback" in line for line in server.process.output), "".join(
        server.process.output
    )


# ---- builders shared by the attack modules ------------------------------------------------------
_serial = iter(range(1, 1_000_000))


def unique(prefix: str) -> str:
    return f"{prefix}{next(_serial)}"


def ok(answer: Answer) -> Answer:
    assert 200 <= answer.status < 300, (answer.status, answer.body[:300])
    return answer


def advertise(lab: Lab, node_id: str, who: str = "node", **caps: Any) -> Answer:
    body = {"node_id": node_id, "capabilities": caps or {"kit": node_id}, "instance": "i1"}
    return ok(lab.http.send("POST", "/v1/nodes", body, who=who))


def contract(run_id: str, kit: str, **extra: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "roles": {"dut": {"kit": kit}},
        "steps": [{"name": "flash", "role": "dut", "uses": "shell", "with": {"cmd": "true"}}],
        **extra,
    }


def claimed_step(lab: Lab) -> tuple[str, str, int]:
    """A fresh node holding a fresh run whose one step it has claimed: (node, run, attempt)."""
    node, run = unique("n"), unique("r")
    advertise(lab, node)
    assert ok(lab.http.send("POST", "/v1/runs", contract(run, node))).status == 201
    claim = {"node_id": node, "instance": "i1"}
    step = ok(lab.http.send("POST", f"/v1/runs/{run}/steps/0/claim", claim, who="node")).json()
    return node, run, step["attempt"]


def free_node_gets_work(lab: Lab, node: str) -> None:
    """After the attacks the node is still usable: a valid run goes RUNNING and shows as work."""
    run = unique("after")
    assert ok(lab.http.send("POST", "/v1/runs", contract(run, node))).status == 201
    work = ok(lab.http.send("GET", f"/v1/nodes/{node}/work", who="node")).json()["steps"]
    assert [s["run_id"] for s in work] == [run]
