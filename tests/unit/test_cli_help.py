"""Every command line's --help, as a person reads it (issue 29: "(default: an embedded one)
(default: None)"): each option says its default at most once, and never in Python's words
("None") — a required option says so instead. All five programs, every subcommand, nested ones
(``python -m sim twin export``) included, rendered as the terminal shows them."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from mediator.cli import main as mediator_main
from mediator.cli import runctl
from mediator.enode import main as enode_main
from mediator.tickets import cli as tickets_cli
from sim.outputs import cli as sim_cli

PROGRAMS = {
    "mediator": mediator_main.build_parser,
    "runctl": runctl.build_parser,
    "enode": enode_main.build_parser,
    "tickets": tickets_cli._parser,
    "python -m sim": sim_cli.build_parser,
}


def pages(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, str]]:
    yield name, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from pages(sub, f"{name} {sub_name}")


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_help_page_says_each_default_once_and_in_words(program: str) -> None:
    seen = 0
    for name, text in pages(PROGRAMS[program](), program):
        seen += 1
        flat = " ".join(text.split())  # argparse wraps lines; a default may straddle two
        assert "(default: None)" not in flat, (name, text)
        doubled = re.search(r"\(default:[^()]*(\([^()]*\)[^()]*)*\)\s*\(default:", flat)
        assert doubled is None, (name, doubled.group(0) if doubled else "")
    assert seen >= 1
