"""runctl without a server (design.md §19): argument parsing, usage errors (exit 2), a server that
is not there (exit 1, one line), contract files, and the text formats as pure functions — whole
outputs compared, so a change of format shows up here first. The commands against the real API
are in test_runctl_api.py."""

from __future__ import annotations

import argparse
import io
import json
import socket

import httpx
import pytest

from mediator.cli import runctl
from mediator.client import ApiError, Client, Reply


def run(*argv: str, **kw):
    out, err = io.StringIO(), io.StringIO()
    code = runctl.main(list(argv), stdout=out, stderr=err, **kw)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def dead_url():
    """A loopback URL nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


# ---- parsing ----------------------------------------------------------------------------------


def test_global_options_work_before_and_after_the_command():
    parser = runctl.build_parser()
    before = parser.parse_args(["--json", "--url", "http://h:1", "status", "r1"])
    after = parser.parse_args(["status", "r1", "--json", "--url", "http://h:1", "--token", "t"])
    assert (before.json, before.url, before.run_id) == (True, "http://h:1", "r1")
    assert (after.json, after.url, after.token) == (True, "http://h:1", "t")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["status"],
        ["submit"],
        ["answer", "3"],
        ["watch", "r1", "--interval", "0"],
        ["submit", "a.json", "--timeout", "soon"],
        ["list", "--limit", "0"],
    ],
)
def test_usage_errors_exit_2(argv, capsys):
    code, out, _ = run(*argv)
    assert code == 2
    assert out == ""
    assert "usage: runctl" in capsys.readouterr().err


def test_help_exits_0_and_lists_every_exit_status(capsys):
    # issue 15 §4: each status a script can test for is written where a user looks first
    assert run("--help")[0] == 0
    text = capsys.readouterr().out
    assert "exit status:" in text
    for code, words in [
        (0, "the run PASSED"), (1, "the run FAILED"), (2, "usage error"), (3, "422"),
        (4, "no such run"), (5, "--timeout passed"), (6, "cannot be reached"),
        (130, "interrupted"), (141, "output was closed"),
    ]:  # fmt: skip
        assert any(
            line.split(maxsplit=1)[:1] == [str(code)] and words in line
            for line in text.splitlines()
        ), (code, words)
    assert run("watch", "--help")[0] == 0
    assert "5    watch and submit --wait: --timeout passed" in capsys.readouterr().out


def _parsers():
    parser = runctl.build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [("runctl", parser), *sub.choices.items()]


def test_no_parser_takes_an_abbreviation():
    # issue 15 §2: "--js" is not silently "--json", "--sta" not "--state"
    assert all(p.allow_abbrev is False for _, p in _parsers())
    assert run("status", "r1", "--js")[0] == 2
    assert run("list", "--sta", "queued")[0] == 2
    assert run("--ur", "http://h:1", "list")[0] == 2


def test_every_option_has_help_text_that_shows_its_default():
    # issue 15 §2: nothing on any parser is undocumented; an option says what happens without it
    for name, parser in _parsers():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            assert action.help, (name, action.dest)
            if action.option_strings:
                assert "default" in action.help, (name, action.option_strings)


@pytest.mark.parametrize("given", ["queued", "QUEUED", "Queued", "running", "failed"])
def test_list_takes_states_in_any_case(given):
    assert runctl.build_parser().parse_args(["list", "--state", given]).state == given.upper()


def test_list_refuses_a_state_that_does_not_exist():
    assert run("list", "--state", "waiting")[0] == 2


def test_long_ids_are_shortened_to_the_tail_that_tells_them_apart():
    ids = ["20261201T010203123456-9f3a6b21", "20261201T010203123999-9f3a6b21", "run-a",
           "20261201T010204000000-00c0ffee"]  # fmt: skip
    assert runctl.short_ids(ids) == {
        ids[0]: "…6-9f3a6b21",  # the two share 9 characters of tail: the 10th tells them apart
        ids[1]: "…9-9f3a6b21",
        "run-a": "run-a",
        ids[3]: "…00c0ffee",
    }


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0:00"), (59.9, "0:59"), (61, "1:01"), (3600, "1:00:00"), (90061, "1-01:01:01")],
)
def test_ages_read_like_squeue_s_time(seconds, text):
    assert runctl.age_text(seconds) == text


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("missing.json", None, "runctl: cannot read {path}: No such file or directory\n"),
        ("bad.json", "{roles", "runctl: {path} is not valid JSON: Expecting property name "
                               "enclosed in double quotes: line 1 column 2 (char 1)\n"),
        ("bad.toml", "roles = ", "runctl: {path} is not valid TOML: Invalid value (at end of "
                                 "document)\n"),
    ],
)  # fmt: skip
def test_a_contract_file_that_cannot_be_read_is_a_usage_error(tmp_path, name, text, message):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    code, out, err = run("--url", "http://127.0.0.1:9", "submit", str(path))
    assert (code, out, err) == (2, "", message.format(path=path))


def test_contracts_are_json_or_toml(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text(
        'run_id = "r1"\n[roles.dut]\nboard = "x"\n'
        '[[steps]]\nname = "build"\nrole = "dut"\nwith = { cmd = "make" }\n'
    )
    doc = {
        "run_id": "r1",
        "roles": {"dut": {"board": "x"}},
        "steps": [{"name": "build", "role": "dut", "with": {"cmd": "make"}}],
    }
    (tmp_path / "c.json").write_text(json.dumps(doc))
    assert runctl.read_contract(str(toml)) == doc
    assert runctl.read_contract(str(tmp_path / "c.json")) == doc


# ---- no server --------------------------------------------------------------------------------


def test_a_server_that_is_not_there_is_one_line_and_exit_6(dead_url):
    code, out, err = run("--url", dead_url, "status", "r1")
    assert (code, out) == (runctl.EXIT_UNREACHABLE, "")  # issue 15 §4: not 1 like any error
    assert err.startswith(f"runctl: cannot reach the Mediator at {dead_url}: ")
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_ctrl_c_while_waiting_is_one_line_and_leaves_the_run_alone():
    def poll(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"run_id": "r1", "state": "RUNNING", "steps": []})

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    client = Client("http://mediator", transport=httpx.MockTransport(poll))
    code, out, err = run("watch", "r1", client=client, sleep=interrupt)
    assert (code, out, err) == (
        130,
        "RUNNING\n",
        "runctl: interrupted (the run is not cancelled)\n",
    )


def test_url_and_token_come_from_the_environment(dead_url, monkeypatch):
    monkeypatch.setenv("MEDIATOR_URL", dead_url)
    assert run("nodes")[2].startswith(f"runctl: cannot reach the Mediator at {dead_url}")


def test_an_error_that_is_not_the_api_shape_is_still_one_line():
    def proxy(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == "Bearer s3cret"
        return httpx.Response(502, text="<html><body>\n<h1>Bad gateway</h1></body></html>")

    client = Client("http://mediator", "s3cret", transport=httpx.MockTransport(proxy))
    code, out, err = run("status", "r1", client=client)
    assert (code, out) == (1, "")
    assert err == "runctl: 502 http_502: <html><body> <h1>Bad gateway</h1></body></html>\n"


def test_api_errors_carry_status_code_message_and_field():
    def refuse(request: httpx.Request) -> httpx.Response:
        body = {"error": {"code": "invalid_contract", "message": "Bad after.", "field": "steps[1]"}}
        return httpx.Response(400, json=body)

    client = Client("http://mediator", transport=httpx.MockTransport(refuse))
    with client, pytest.raises(ApiError) as caught:
        client.submit({})
    e = caught.value
    assert (e.status, e.code, e.message, e.field) == (
        400,
        "invalid_contract",
        "Bad after.",
        "steps[1]",
    )
    assert str(e) == "400 invalid_contract: Bad after. (field steps[1])"


# ---- formats ----------------------------------------------------------------------------------

ALL_BUSY = {
    "code": "ALL_BUSY",
    "role": "dut",
    "candidates": ["a"],
    "message": 'Every node that can serve role "dut" is busy or draining (a); the run waits.',
}


def test_submit_prints_the_status_and_state_then_the_run_id():
    assert runctl.submit_lines(Reply(201, {"run_id": "r1", "state": "RUNNING"})) == [
        "201 · RUNNING",
        "r1",
    ]
    rejected = {"run_id": "r3", "state": "FAILED", "reject": {"code": "NO_CANDIDATE",
                "role": "dut", "message": 'No live node can serve role "dut".'}}  # fmt: skip
    assert runctl.submit_lines(Reply(422, rejected)) == [
        "422 · FAILED",
        "r3",
        'NO_CANDIDATE: No live node can serve role "dut".',
    ]


def test_a_dry_run_prints_what_would_happen():
    ok = Reply(200, {"dry_run": True, "assigned": {"host": "b", "dut": "a"}, "width": 2})
    assert runctl.submit_lines(ok) == ["200 · DRY RUN", "assigned  dut=a, host=b", "width     2"]
    no = Reply(200, {"dry_run": True, "reject": ALL_BUSY})
    assert runctl.submit_lines(no) == [
        "200 · DRY RUN",
        f"reject    ALL_BUSY: {ALL_BUSY['message']}",
    ]


def test_status_of_a_queued_run_says_where_it_waits_and_why():
    run = {
        "run_id": "r2", "state": "QUEUED", "verdict": None, "work_id": "", "assigned": None,
        "reject": None, "created_at": "2031-03-01T12:00:00+00:00", "started_at": None,
        "ended_at": None, "queue_position": 1, "wait_reason": ALL_BUSY,
        "steps": [{"seq": 0, "name": "build", "state": "PENDING", "node_id": "", "attempt": 0}],
    }  # fmt: skip
    assert runctl.run_lines(run) == [
        "QUEUED",
        "run       r2",
        "position  1",
        f"waiting   ALL_BUSY: {ALL_BUSY['message']}",
        "created   2031-03-01T12:00:00+00:00",
        "steps",
        "  SEQ  NAME   STATE    NODE  ATTEMPT",
        "  0    build  PENDING  -     0",
    ]


def test_watch_prints_what_changed():
    step = {"seq": 0, "name": "build", "state": "PENDING", "node_id": "a", "attempt": 0}
    queued = {"state": "QUEUED", "queue_position": 2, "steps": [step]}
    running = {"state": "RUNNING", "steps": [{**step, "state": "CLAIMED", "attempt": 1}]}
    passed = {"state": "PASSED", "verdict": "passed", "steps": [{**step, "state": "PASSED",
              "attempt": 1}]}  # fmt: skip
    assert runctl.changes(None, queued) == ["QUEUED · position 2"]
    assert runctl.changes(queued, running) == ["RUNNING", "  step 0 build: CLAIMED on a attempt 1"]
    assert runctl.changes(running, running) == []
    assert runctl.changes(running, passed) == [
        "PASSED · passed",
        "  step 0 build: PASSED on a attempt 1",
    ]


def test_tables_align_and_say_when_empty():
    assert runctl.table(["A", "LONGER"], [["xyz", "1"], ["", "22"]]) == [
        "A    LONGER",
        "xyz  1",
        "     22",
    ]
    assert runctl.table(["A"], []) == ["(none)"]


def test_a_mistyped_command_is_answered_with_the_closest_one(capsys):
    """issue 29: `runctl lsit` showed the usage and the list of commands, nothing nearer."""
    assert runctl.main(["lsit"], stdout=io.StringIO(), stderr=io.StringIO()) == runctl.EXIT_USAGE
    assert capsys.readouterr().err.strip().endswith("did you mean 'list'?")
