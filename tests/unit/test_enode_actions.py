"""enode's actions (design.md §19): the built-ins ``shell``, ``sleep``, ``fail``, plugin discovery
through the ``mediator.actions`` entry points, and the log cut that keeps a result under the
server's body limit. No server: an action sees only its ``with`` object and a Context."""

from __future__ import annotations

import logging
import sys
from importlib.metadata import EntryPoint

import pytest

from mediator.enode.actions import (
    BUILTINS,
    ENTRY_POINT_GROUP,
    Context,
    Outcome,
    fail,
    load_actions,
    shell,
    sleep,
    truncate,
)


def ctx(**kw):
    base = dict(run_id="r1", seq=2, name="build", attempt=1, node_id="n1", instance="i1")
    return Context(**{**base, **kw})


# ---- shell ------------------------------------------------------------------------------------


def test_shell_passes_on_exit_0_with_its_output_as_the_log():
    assert shell({"cmd": "echo out; echo err >&2"}, ctx()) == Outcome("pass", "out\nerr\n")


def test_shell_fails_on_a_nonzero_exit_and_says_which():
    assert shell({"cmd": "echo broken; exit 3"}, ctx()) == Outcome(
        "fail", "broken\n\n[exit status 3]\n"
    )


def test_shell_runs_an_argv_list_without_a_shell():
    assert shell({"cmd": [sys.executable, "-c", "print('$HOME')"]}, ctx()).log == "$HOME\n"


def test_shell_tells_the_command_which_step_it_is():
    out = shell({"cmd": 'echo "$MEDIATOR_RUN_ID $MEDIATOR_STEP_SEQ $MEDIATOR_ATTEMPT"'}, ctx())
    assert out == Outcome("pass", "r1 2 1\n")


def test_shell_kills_a_command_that_outlives_its_timeout_and_heartbeats_meanwhile():
    beats = []
    out = shell(
        {"cmd": "echo started; exec sleep 30", "timeout": 0.6},
        ctx(heartbeat=lambda: beats.append(1)),
    )
    assert out.outcome == "fail"
    assert out.log == "started\n\n[timed out after 0.6 s; killed]\n"
    assert beats  # a long command leaves room for adverts (the lease is renewed by them)


@pytest.mark.parametrize(
    ("with_", "log"),
    [
        ({}, "shell: `cmd` must be a string or a list of strings, not None"),
        ({"cmd": "  "}, "shell: `cmd` must be a string or a list of strings, not '  '"),
        ({"cmd": "true", "timeout": -1}, "shell: `timeout` must be a number of seconds >= 0, "
                                         "not -1"),
        ({"cmd": "true", "timeout": True}, "shell: `timeout` must be a number of seconds >= 0, "
                                           "not True"),
    ],
)  # fmt: skip
def test_shell_fails_a_malformed_with_instead_of_crashing(with_, log):
    assert shell(with_, ctx()) == Outcome("fail", log)


# ---- sleep and fail ---------------------------------------------------------------------------


def test_sleep_waits_through_the_context_so_the_daemon_can_advertise():
    slept = []
    assert sleep({"seconds": 2.5}, ctx(sleep=slept.append)) == Outcome("pass", "slept 2.5 s\n")
    assert slept == [2.5]


def test_sleep_without_seconds_fails():
    out = sleep({}, ctx(sleep=pytest.fail))
    assert out == Outcome("fail", "sleep: `seconds` must be a number of seconds >= 0, not None")


def test_fail_always_fails_with_its_message():
    assert fail({}, ctx()) == Outcome("fail", "the fail action always fails\n")
    assert fail({"message": "no board"}, ctx()) == Outcome("fail", "no board\n")


def test_an_outcome_is_one_of_three():
    with pytest.raises(ValueError, match="outcome must be one of"):
        Outcome("passed")


# ---- discovery --------------------------------------------------------------------------------


def ep(name, value):
    return EntryPoint(name, value, ENTRY_POINT_GROUP)


def test_plugins_come_from_the_entry_point_group(caplog):
    caplog.set_level(logging.INFO, "mediator.enode")
    actions = load_actions(
        [
            ep("refuse", "mediator.enode.actions:fail"),
            ep("shell", "mediator.enode.actions:fail"),  # a built-in name: ignored
            ep("broken", "no_such_module_for_enode:action"),  # fails to import: left out
        ]
    )
    assert sorted(actions) == ["fail", "refuse", "shell", "sleep"]
    assert actions["shell"] is BUILTINS["shell"]
    assert actions["refuse"] is fail
    assert [r.message for r in caplog.records] == [
        "plugin action 'shell' (mediator.enode.actions:fail) ignored: a built-in has that name",
        "cannot load action 'broken' from no_such_module_for_enode:action: "
        "ModuleNotFoundError: No module named 'no_such_module_for_enode'",
    ]


def test_the_installed_group_loads():
    """Whatever is installed in this environment, the built-ins are there."""
    assert set(BUILTINS) <= set(load_actions())


# ---- logs -------------------------------------------------------------------------------------


def test_a_long_log_keeps_its_end():
    assert truncate("short", 10) == "short"
    assert truncate("0123456789abcdef", 10) == "[… 6 bytes cut …]\n6789abcdef"
    # a multi-byte character cut in half is dropped, not mangled
    assert truncate("ééééé", 5) == "[… 5 bytes cut …]\néé"


# ---- issue 11 §3: a step's output can always be sent -----------------------------------------


def test_logs_escape_nul_and_lone_surrogates_and_nothing_else():
    from mediator.enode.actions import escape_log

    assert escape_log("a\x00b") == "a\\x00b"
    assert escape_log("half \udc00 pair") == "half \\udc00 pair"
    assert escape_log("plain é ✓\n\t") == "plain é ✓\n\t"
