"""The ``tickets`` command, run in-process through ``main(argv)`` (tickets.md §5, last bullet)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from mediator.tickets.cli import _parser, main
from mediator.tickets.frontmatter import Document


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_new_then_list_shows_the_ticket_and_the_totals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "new", "--queue", str(tmp_path), "--title", "Fix it", "--priority", "4"
    )
    h = out.strip()
    assert code == 0 and (tmp_path / f"{h}.md").exists()
    doc = Document.parse((tmp_path / f"{h}.md").read_text())
    assert (doc.get("title"), doc.get("priority"), doc.get("kind")) == ("Fix it", "4", "ticket")

    code, out, _ = run(capsys, "list", "--queue", str(tmp_path))
    assert code == 0
    assert out.splitlines() == [f"{h:<14} queued          p4 Fix it", "1 ticket"]


def test_list_names_what_the_bell_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TICKET_QUEUE", str(tmp_path))  # --queue defaults to $TICKET_QUEUE
    _, out, _ = run(capsys, "new", "--title", "Copied")
    h = out.strip()
    path = tmp_path / f"{h}.md"
    path.write_text(path.read_text().replace("kind: ticket", "kind: ticket\nsession_id: s-9"))
    _, out, _ = run(capsys, "list")
    assert out.splitlines()[-3:] == [
        "1 ticket (1 undispatched, see the bell)",
        "bell: 1 tickets nobody picks up",
        f"  {h}  Copied: assigned to session s-9 on an open file",
    ]
    data = json.loads(run(capsys, "list", "--json")[1])
    assert data["totals"]["undispatched"] == 1


def test_unassign_removes_the_session_id_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h = run(capsys, "new", "--queue", str(tmp_path), "--title", "Copied", "--body", "Keep me.")[1]
    path = tmp_path / f"{h.strip()}.md"
    original = path.read_text()
    path.write_text(original.replace("kind: ticket", "kind: ticket\nsession_id: s-9\nowner: mina"))
    assert run(capsys, "unassign", "--queue", str(tmp_path), h.strip())[0] == 0
    assert path.read_text() == original.replace("kind: ticket", "kind: ticket\nowner: mina")
    code, _, err = run(capsys, "unassign", "--queue", str(tmp_path), h.strip())
    assert (code, err) == (1, f"tickets: ticket {h.strip()} has no session_id\n")


def test_answer_is_refused_when_no_question_waits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h = run(capsys, "new", "--queue", str(tmp_path), "--title", "Quiet")[1].strip()
    code, _, err = run(capsys, "answer", "--queue", str(tmp_path), h, "blue")
    assert (code, err) == (1, f"tickets: ticket {h} is not waiting for an answer\n")
    path = tmp_path / f"{h}.md"
    path.write_text(
        path.read_text().replace(
            "kind: ticket", "kind: ticket\nawaiting_answer_since: 2025-03-01T12:00:00Z"
        )
    )
    code, out, _ = run(capsys, "answer", "--queue", str(tmp_path), h, "blue", "--by", "mina")
    assert (code, out) == (0, f"{h}.answer.1.md\n")
    answer = Document.parse((tmp_path / f"{h}.answer.1.md").read_text())
    assert (answer.get("kind"), answer.get("ticket"), answer.get("answered_by")) == (
        "answer",
        h,
        "mina",
    )
    assert answer.body == "blue\n"


def test_retry_forgets_the_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h = run(capsys, "new", "--queue", str(tmp_path), "--title", "Flaky")[1].strip()
    path = tmp_path / f"{h}.md"
    original = path.read_text()
    path.write_text(original.replace("---\n", "---\nfailures: 3\nlast_error: boom\n", 1))
    assert run(capsys, "list", "--queue", str(tmp_path))[1].splitlines()[0].endswith("[failed]")
    assert run(capsys, "retry", "--queue", str(tmp_path), h)[0] == 0
    assert path.read_text() == original


def test_suffix_settings_that_cannot_tell_lanes_apart_stop_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TICKET_INPROGRESS", ".done")
    code, _, err = run(capsys, "list", "--queue", str(tmp_path))
    assert code == 2
    assert "one is a suffix of the other" in err


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "worker", "--queue", str(tmp_path))[0] == 2  # no command after --
    assert run(capsys, "list", "--queue", str(tmp_path / "missing"))[0] == 2
    assert run(capsys, "new", "--queue", str(tmp_path), "--title", "x", "--priority", "9")[0] == 1


# ---- issue 15 §2: flags as written, every option explained -----------------------------------


def subcommands() -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_a_prefix_of_an_option_is_refused_not_guessed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--js`` was silently taken as ``--json`` (argparse's prefix matching); now an error."""
    for argv in (
        ["list", "--js", "--queue", str(tmp_path)],
        ["list", "--que", str(tmp_path)],
        ["new", "--title", "x", "--prio", "4", "--queue", str(tmp_path)],
        ["worker", "--exit-when", "--queue", str(tmp_path), "--", "true"],
    ):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2, argv
        assert "unrecognized arguments" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []
    assert all(not p.allow_abbrev for p in (_parser(), *subcommands().values()))


def test_every_option_has_help_that_shows_its_default() -> None:
    missing = []
    for name, parser in subcommands().items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            text = action.help or ""
            if not text:
                missing.append(f"{name} {action.dest}: no help")
            elif action.option_strings and "default" not in text and not action.required:
                missing.append(f"{name} {'/'.join(action.option_strings)}: no default shown")
    assert missing == []


def test_worker_help_shows_the_command_after_the_double_dash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["worker", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: tickets worker [options] -- CMD {path} ")
    assert "{hash}" in out
    assert "--heartbeat HEARTBEAT seconds between heartbeats while CMD runs (default: 60.0)" in out
