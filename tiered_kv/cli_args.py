"""Argument types shared by every subcommand: counts, numbers and byte sizes, refused in one line.

Each raises ``argparse.ArgumentTypeError``, which argparse turns into a usage error (exit 2) that
names the flag. Kept apart from ``tiered_kv.cli`` so subcommand modules can use them without
importing the command table (which imports them).
"""

from __future__ import annotations

import argparse
import math

from .errors import ConfigError
from .sizes import parse_size


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def positive_size(text: str) -> int:
    """A byte size such as ``64GiB``; zero is refused (a tier of no bytes holds nothing)."""
    try:
        value = parse_size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be > 0, got {text!r}")
    return value


__all__ = ["non_negative_int", "positive_float", "positive_int", "positive_size"]
