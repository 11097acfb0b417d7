"""``mediator``'s parser as design.md §19 writes it (issue 15 §2): ``mediator serve --data DIR``
with the shared options after the subcommand as well as before, no abbreviations, and help that says
every option's default."""

from __future__ import annotations

import argparse

import pytest

from mediator.cli.main import DEFAULT_DATA, build_parser


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_the_spec_form_puts_data_config_and_records_after_serve():
    args = parse("serve", "--data", "D", "--config", "C.toml", "--records", "R", "--dev")
    assert (args.data, args.config, args.records, args.database_url) == ("D", "C.toml", "R", None)


def test_the_shared_options_still_work_before_the_subcommand_and_after_wins():
    assert parse("--data", "D", "serve", "--dev").data == "D"
    assert parse("--data", "D", "serve", "--data", "E").data == "E"
    assert parse("serve").data == DEFAULT_DATA and parse("serve").config is None
    args = parse("--records", "R", "records", "verify", "run-1")
    assert (args.records, args.run_id) == ("R", "run-1")
    assert parse("records", "verify", "run-1", "--records", "S").records == "S"


@pytest.mark.parametrize(
    "argv",
    [
        ("serve", "--dat", "D"),  # once silently taken as --database-url D
        ("serve", "--database", "postgresql://x"),
        ("serve", "--tok", "t.toml"),
        ("--conf", "c.toml", "serve"),
    ],
)
def test_no_option_may_be_abbreviated(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(*argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err or "invalid choice" in err


def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += parsers(sub)
    return found


def test_every_parser_refuses_abbreviations_and_every_option_says_its_default():
    for p in parsers(build_parser()):
        assert p.allow_abbrev is False, p.prog
        assert p.description, f"{p.prog} has no description"
        for action in p._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            assert action.help, f"{p.prog} {action.dest} has no help"
            if action.option_strings:
                assert "default" in action.help, f"{p.prog} {action.dest}: {action.help}"


def test_serve_help_describes_the_command(capsys):
    with pytest.raises(SystemExit):
        parse("serve", "--help")
    out = capsys.readouterr().out
    assert "usage: mediator serve" in out and "embedded PostgreSQL" in out
    assert f"(default: {DEFAULT_DATA})" in out


def test_the_workers_shared_socket_gets_nagle_turned_off_on_every_connection():
    """issue 13 (serve --workers): the parent binds the socket the workers accept on. asyncio
    sets TCP_NODELAY only on a connection whose socket says it is TCP, and an accepted socket
    inherits the listener's proto: a listener made with proto 0 left Nagle on, and every response
    waited out the client's delayed ACK (44 ms a request instead of 1)."""
    import asyncio
    import socket

    from mediator.cli.main import _bind

    listener = _bind("127.0.0.1", 0)
    port = listener.getsockname()[1]

    async def accept_one() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            nodelay = await asyncio.wait_for(seen, 10)
            writer.close()
        return nodelay

    # A thread of its own: a test before this one may have left an event loop running here.
    import threading

    result: list[int] = []
    try:
        worker = threading.Thread(target=lambda: result.append(asyncio.run(accept_one())))
        worker.start()
        worker.join(30)
    finally:
        listener.close()
    assert result and result[0] != 0


# ---- serve --workers: restarting a worker (review of issue 13) ----------------------------------
def test_a_worker_that_keeps_failing_is_restarted_after_a_doubling_wait_up_to_a_cap():
    from mediator.cli.main import Backoff

    b = Backoff(first_s=0.5, cap_s=30.0, stable_s=30.0)
    waits = [b.after_exit(None) for _ in range(9)]  # nine failed starts in a row
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert b.failed == 9


def test_a_worker_that_served_a_while_resets_the_wait_and_a_short_life_does_not():
    from mediator.cli.main import Backoff

    b = Backoff(first_s=0.5, cap_s=30.0, stable_s=30.0)
    assert [b.after_exit(None), b.after_exit(None)] == [0.5, 1.0]
    assert b.after_exit(5.0) == 2.0 and b.failed == 0  # it listened: not a failed start...
    assert b.after_exit(None) == 4.0 and b.failed == 1  # ...but 5 s proves nothing yet
    assert b.after_exit(30.0) == 0.5 and b.failed == 0  # served 30 s: start over
    assert b.after_exit(None) == 1.0
    assert Backoff(first_s=2.0).after_exit(None) == 2.0


def test_importing_the_cli_leaves_the_metrics_mode_to_serve():
    # prometheus_client fixes its mode from PROMETHEUS_MULTIPROC_DIR once, when it is imported;
    # `serve` chooses the mode after reading --workers, so the CLI module must not import it
    # (mediator/api/metrics.py). In a fresh interpreter: this one has imported it long ago.
    import subprocess
    import sys

    code = "import sys, mediator.cli.main; print('prometheus_client' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("serv", "--dev"), "did you mean 'serve'?"),
        (("records", "verfy", "x"), "did you mean 'verify'?"),
    ],
)
def test_a_mistyped_command_is_answered_with_the_closest_one(argv, said, capsys):
    """issue 29: a typo showed the usage and the list of commands, nothing nearer."""
    with pytest.raises(SystemExit) as e:
        parse(*argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().endswith(said)


def test_a_command_nothing_like_any_gets_no_guess(capsys):
    with pytest.raises(SystemExit):
        parse("xyzzy")
    assert "did you mean" not in capsys.readouterr().err


def test_a_failed_reaper_pass_is_logged_and_the_next_pass_still_runs(caplog) -> None:
    """The reaper timer outlives a failing pass (the database away, say): each failure is one
    log line, and the passes go on at their period until the server stops the timer."""
    import threading

    from mediator.cli.main import Reaper

    passes = threading.Semaphore(0)

    class Failing:
        def reap(self) -> None:
            passes.release()
            raise RuntimeError("the database is unavailable")

    reaper = Reaper(Failing(), every_s=0.01)
    with caplog.at_level("ERROR", logger="mediator"):
        reaper.start()
        for _ in range(3):  # three passes, each after a failed one
            assert passes.acquire(timeout=10)
        reaper.stop()
    failures = [r for r in caplog.records if "reaper pass failed" in r.getMessage()]
    assert len(failures) >= 2 and failures[0].exc_info is not None
