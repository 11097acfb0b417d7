"""Generated variants of every attack class (issue 11, "Keep it found"): hypothesis builds ids and
text from the characters that have hurt before — NUL, lone surrogates, dots, slashes, backslashes,
percent-encodings, look-alike dots — plus deep nesting and huge numbers, and sends them to the real
server. Whatever comes back: never a 5xx, never a secret, and a refused request commits nothing.
Examples are bounded so the tier stays well under a minute.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mediator.core import limits
from tests.adversarial.conftest import Lab, advertise, contract, judge, unique
from tests.conftest import examples

pytestmark = [pytest.mark.e2e]

SETTINGS = settings(
    max_examples=examples(40),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PIECES = [".", "..", "/", "\\", "%2e", "%2E", "%2f", "%5c", "%00", "\x00", "\udc00", "\ud800",
          "\u2024", "\uff0e", "\u2025", "a", "Z", "0", "_", "-", " ", "~", ":",
          "\u00e9"]  # fmt: skip
ids = st.lists(st.sampled_from(PIECES), min_size=0, max_size=6).map("".join) | st.text(max_size=8)
junk_text = st.text(alphabet=st.characters(exclude_categories=()), max_size=20) | st.lists(
    st.sampled_from(["\x00", "\udc00", "\ud800", "a", "\u2400", "\ufffd"])
).map("".join)


def _allowed(value: str) -> bool:
    return limits.valid_id(value)


@SETTINGS
@given(run_id=ids)
def test_generated_run_ids(lab: Lab, run_id: str):
    node = unique("n")
    advertise(lab, node)
    before = lab.counts()
    r = lab.http.send("POST", "/v1/runs", json.dumps(contract(run_id, node)))
    if _allowed(run_id):
        judge("generated", r, refused=False)
        assert r.status in (200, 201, 202), r.body
    else:
        judge("generated", r, refused=True)
        assert (r.status, r.error["field"]) == (400, "run_id")
        assert lab.counts() == before


@SETTINGS
@given(segment=ids, file=ids, safe=st.sampled_from(["", "/", "%", "/%", "."]))
def test_generated_record_paths(lab: Lab, segment: str, file: str, safe: str):
    enc = quote(segment.encode("utf-8", "surrogatepass"), safe=safe)
    name = quote(file.encode("utf-8", "surrogatepass"), safe=safe)
    for path in (f"/v1/runs/{enc}/record/{name}", f"/v1/runs/{enc}/record", f"/v1/runs/{enc}"):
        r = lab.http.send("GET", path, who="node")
        judge("generated", r, refused=r.status >= 400)


@SETTINGS
@given(node_id=ids, label=junk_text, instance=junk_text)
def test_generated_adverts(lab: Lab, node_id: str, label: str, instance: str):
    before = lab.counts()
    body = {"node_id": node_id, "label": label, "instance": instance, "capabilities": {"k": label}}
    r = lab.http.send("POST", "/v1/nodes", json.dumps(body), who="node")
    judge("generated", r, refused=r.status >= 400)
    if r.status >= 400:
        assert r.status == 400 and r.error["field"] is not None
        assert lab.counts() == before


@SETTINGS
@given(
    depth=st.integers(limits.MAX_BODY_DEPTH + 1, 20_000),
    opener=st.sampled_from(["[", '{"k":']),
    where=st.sampled_from(["/v1/runs", "/v1/nodes", "/v1/runs/r/steps/0/result"]),
)
def test_generated_deep_bodies(lab: Lab, depth: int, opener: str, where: str):
    closer = "]" if opener == "[" else "}"
    before = lab.counts()
    r = lab.http.send("POST", where, opener * depth + "1" + closer * depth, who="node")
    judge("generated", r, refused=True)
    assert r.status == 400 and str(limits.MAX_BODY_DEPTH) in r.error["message"]
    assert lab.counts() == before


@SETTINGS
@given(number=st.integers(min_value=10**limits.MAX_NUMBER_CHARS, max_value=10**4000)
       | st.integers(max_value=-(10**limits.MAX_NUMBER_CHARS), min_value=-(10**4000)))  # fmt: skip
def test_generated_huge_numbers(lab: Lab, number: int):
    before = lab.counts()
    step = '{"name": "s", "role": "d", "with": {"cmd": "true"}}'
    body = '{"roles": {"d": {"n": NUMBER}}, "steps": [STEP]}'.replace("STEP", step)
    body = body.replace("NUMBER", str(number))
    r = lab.http.send("POST", "/v1/runs", body)
    judge("generated", r, refused=True)
    assert r.status == 400 and str(limits.MAX_NUMBER_CHARS) in r.error["message"]
    assert lab.counts() == before


@SETTINGS
@given(log=junk_text)
def test_generated_logs_are_stored_or_refused_never_500(lab: Lab, log: str):
    from tests.adversarial.conftest import claimed_step

    node, run, attempt = claimed_step(lab)
    body = {"node_id": node, "instance": "i1", "attempt": attempt, "outcome": "pass", "log": log}
    r = lab.http.send("POST", f"/v1/runs/{run}/steps/0/result", json.dumps(body), who="node")
    judge("generated", r, refused=False)
    assert r.status == 200, r.body
