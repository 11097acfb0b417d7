"""Argument types shared by the command-line tools (``runctl``, ``enode``): a bad number is a
usage error (exit 2) with a message, not a traceback. No I/O, no other ``mediator`` imports, so
``enode`` can use it without loading anything else."""

from __future__ import annotations

import argparse
import math


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or not value > 0:
        # issue 11 §9: "inf" and "1e999" parse as floats; a timeout of infinity never fires
        raise argparse.ArgumentTypeError(f"must be a finite number more than 0: {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value
