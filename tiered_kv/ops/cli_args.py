"""Argument types shared by every subcommand: counts, numbers and byte sizes, refused in one line.

Each raises ``argparse.ArgumentTypeError``, which argparse turns into a usage error (exit 2) that
names the flag. Kept apart from ``tiered_kv.ops.cli`` so subcommand modules can use them without
importing the command table (which imports them).
"""

from __future__ import annotations

import argparse
import math

from ..errors import ConfigError
from ..model.sizes import parse_size


def _number(name: str, convert, accept, expected: str):
    """An argument type: ``convert`` the text, then ``accept`` the value, else one line naming it."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    parse.__name__ = name  # argparse names the type in some messages
    return parse


positive_int = _number("positive_int", int, lambda v: v > 0, "a positive integer")
non_negative_int = _number("non_negative_int", int, lambda v: v >= 0, "an integer >= 0")
positive_float = _number("positive_float", float, lambda v: 0 < v < math.inf, "a number > 0")


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
