"""Argument types shared by the command-line tools (``runctl``, ``enode``, ``mediator``): a bad
number is a usage error (exit 2) with a message, not a traceback, and a mistyped command is
answered with the closest one. No I/O, no other ``mediator`` imports, so
``enode`` can use it without loading anything else."""

from __future__ import annotations

import argparse
import difflib
import math
import re
from typing import NoReturn


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or not value > 0:
        # issue 11 §9: "inf" and "1e999" parse as floats; a timeout of infinity never fires
        raise argparse.ArgumentTypeError(f"must be a finite number more than 0: {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number of at least 0 (0 switches a feature off: ``enode --long-poll 0``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of at least 0: {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


_INVALID_CHOICE = re.compile(r"invalid choice: '?([^'\s]*)'? \(choose from (.*)\)")


class SuggestingParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose "invalid choice" error names the closest choice (issue 29:
    ``runctl lsit`` showed the usage and the whole list, no "did you mean"). Subparsers made
    with ``add_subparsers`` are of the same class."""

    def error(self, message: str) -> NoReturn:
        m = _INVALID_CHOICE.search(message)
        if m:
            choices = [c.strip().strip("'") for c in m.group(2).split(",")]
            close = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.5)
            if close:
                message = f"{message}; did you mean {close[0]!r}?"
        super().error(message)
