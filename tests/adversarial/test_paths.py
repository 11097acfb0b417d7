"""Issue 11 §1: no id, path segment or file name reaches outside its root (amendments round 2).

The finding: ``{"run_id": ".."}`` was accepted, and ``GET /v1/runs/%2e%2e/record/tokens.toml``
served the tokens file beside the records root to any token. Every id that becomes a path is now
refused when it is ``.``/``..`` or starts with ``.``; every path is resolved and confined to its
root; record files are opened without following symlinks, and only the run's own files are served.
"""

from __future__ import annotations

import os

import pytest

from tests.adversarial.conftest import (
    CANARY,
    Lab,
    advertise,
    contract,
    free_node_gets_work,
    ok,
    unique,
)

pytestmark = [pytest.mark.e2e]

# Ids that must never become a folder name. The first four passed the old pattern.
BAD_IDS = [
    ".", "..", ".hidden", "...", "../x", "a/b", "/etc/passwd", "a\\b", "..\\..", "%2e%2e",
    "%2E.", "..%2f", "a\x00b", "\u2024\u2024", "\uff0e\uff0e", "\u2025", "", "x" * 65, "a b",
    "C:\\x", "~", "\udc00",
]  # fmt: skip

# ".." as it may appear in a URL path segment.
DOTDOT = ["..", "%2e%2e", "%2E%2E", "%2E.", ".%2e", "%2e.", "%252e%252e", "%c0%ae%c0%ae"]
# File names that try to climb out of a run's record, or into its hidden staging folders.
BAD_FILES = [
    "../../tokens.toml", "..%2f..%2ftokens.toml", "%2e%2e/%2e%2e/tokens.toml",
    "%2e%2e%2f%2e%2e%2ftokens.toml", "..%5c..%5ctokens.toml", "..\\..\\tokens.toml",
    "steps/../../../tokens.toml", "%2fetc%2fpasswd", "/etc/passwd", "//etc/passwd",
    "steps/%00", "contract.json%00.txt", ".staging", "./contract.json", "steps/./../seal.json",
    "%c0%ae%c0%ae/%c0%ae%c0%ae/tokens.toml", "%e2%80%a5/tokens.toml",
    "..;/..;/tokens.toml", "canary.txt", "../canary.txt",
]  # fmt: skip


@pytest.mark.parametrize("run_id", BAD_IDS, ids=repr)
def test_a_run_id_that_could_be_a_path_is_refused_and_nothing_is_written(lab: Lab, run_id: str):
    """Issue 11 §1: 400 naming run_id; no row, no folder."""
    node = unique("n")
    advertise(lab, node)
    before = lab.counts()
    r = lab.http.attack("paths", "POST", "/v1/runs", contract(run_id, node))
    assert (r.status, r.error["field"]) == (400, "run_id")
    assert lab.counts() == before
    free_node_gets_work(lab, node)


@pytest.mark.parametrize("node_id", BAD_IDS, ids=repr)
def test_a_node_id_that_could_be_a_path_is_refused(lab: Lab, node_id: str):
    before = lab.counts()
    body = {"node_id": node_id, "capabilities": {"kit": "x"}, "instance": "i1"}
    r = lab.http.attack("paths", "POST", "/v1/nodes", body, who="node")
    assert (r.status, r.error["field"]) == (400, "node_id")
    assert lab.counts() == before


@pytest.mark.parametrize("who", ["node", "client", "admin"])
@pytest.mark.parametrize("seg", DOTDOT)
def test_dot_dot_run_segments_never_reach_the_tokens_file(lab: Lab, seg: str, who: str):
    """The finding's exact request, with every spelling of ``..`` and every role's token."""
    for path in (
        f"/v1/runs/{seg}/record/tokens.toml",
        f"/v1/runs/{seg}/record/canary.txt",
        f"/v1/runs/{seg}/record",
        f"/v1/runs/{seg}",
        f"/v1/runs/{seg}/cancel",
        f"/v1/nodes/{seg}/work",
    ):
        method = "POST" if path.endswith("cancel") else "GET"
        r = lab.http.attack("paths", method, path, who=who)
        assert r.status in (400, 403, 404), (path, r.status)


def test_record_files_outside_the_run_are_never_served(lab: Lab):
    node, run = unique("n"), unique("r")
    advertise(lab, node)
    ok(lab.http.send("POST", "/v1/runs", contract(run, node)))
    ok(lab.http.send("POST", f"/v1/runs/{run}/cancel"))  # ends and seals it
    assert ok(lab.http.send("GET", f"/v1/runs/{run}/record/contract.json")).json()["run_id"] == run
    for name in BAD_FILES:
        r = lab.http.attack("paths", "GET", f"/v1/runs/{run}/record/{name}")
        assert r.status in (400, 404), (name, r.status)
    # Another run's files are not this run's files.
    other = unique("r")
    ok(lab.http.send("POST", "/v1/runs", contract(other, node)))
    r = lab.http.attack("paths", "GET", f"/v1/runs/{other}/record/..%2f{run}%2fcontract.json")
    assert r.status in (400, 404)


def test_record_files_are_opened_without_following_symlinks(lab: Lab):
    """A symlink planted in a record (by a local user) is not followed, even to inside the root."""
    node, run = unique("n"), unique("r")
    advertise(lab, node)
    ok(lab.http.send("POST", "/v1/runs", contract(run, node)))
    folder = lab.home / "records" / run
    (folder / "leak.txt").symlink_to(lab.home / "canary.txt")
    (folder / "steps").mkdir(exist_ok=True)
    (folder / "steps" / "up").symlink_to(lab.home)
    os.mkfifo(folder / "pipe.log")  # a FIFO must not hang the reading thread either
    try:
        for name in ("leak.txt", "steps/up/canary.txt", "steps/up/tokens.toml", "pipe.log"):
            r = lab.http.attack("paths", "GET", f"/v1/runs/{run}/record/{name}")
            assert r.status == 404 and CANARY.encode() not in r.body
        manifest = ok(lab.http.send("GET", f"/v1/runs/{run}/record")).json()
        assert "leak.txt" not in manifest["files"] and "pipe.log" not in manifest["files"]
    finally:
        os.unlink(folder / "leak.txt")
        os.unlink(folder / "steps" / "up")
        os.unlink(folder / "pipe.log")
