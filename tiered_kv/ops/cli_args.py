"""Argument types shared by every subcommand: counts, numbers and byte sizes, refused in one line.

Each raises ``argparse.ArgumentTypeError``, which argparse turns into a usage error (exit 2) that
names the flag. A value out of range says so as ``must be > 0, got -3`` (the parser in
``tiered_kv.ops.cli`` puts the flag first: ``--clients must be > 0, got -3``); text that is no number
at all says what was expected. Kept apart from ``tiered_kv.ops.cli`` so subcommand modules can use them without
importing the command table (which imports them).
"""

from __future__ import annotations

import argparse
import math

from ..errors import ConfigError
from ..model.sizes import parse_size


def _number(name: str, convert, kind: str, accept, bound: str):
    """An argument type: ``convert`` the text (else "expected ``kind``"), then ``accept`` the value
    (else "must be ``bound``"), one line naming the text as given."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value
    parse.__name__ = name  # argparse names the type in some messages
    return parse


positive_int = _number("positive_int", int, "an integer", lambda v: v > 0, "> 0")
non_negative_int = _number("non_negative_int", int, "an integer", lambda v: v >= 0, ">= 0")
positive_float = _number("positive_float", float, "a number", lambda v: 0 < v < math.inf, "> 0 and finite")


def positive_size(text: str) -> int:
    """A byte size such as ``64GiB``; zero and negative sizes are refused (a tier of no bytes
    holds nothing), as out of range rather than malformed."""
    negative = text.strip().startswith("-")
    try:
        value = parse_size(text.strip()[1:] if negative else text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if negative or value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def latent_dtype_choices() -> list[str]:
    """``--latent-dtype``'s choices (``plan``, ``replay``): every latent dtype some model kind stores."""
    from ..model.spec import LATENT_DTYPES

    return sorted({d for dtypes in LATENT_DTYPES.values() for d in dtypes})


def check_latent_dtype(model: str, latent_dtype: str | None) -> None:
    """ConfigError naming ``--latent-dtype`` where the ``--model`` preset does not store its latent so."""
    from ..model.spec import LATENT_DTYPES, MODEL_PRESETS

    kind = MODEL_PRESETS[model][0]
    allowed = LATENT_DTYPES[kind]
    if latent_dtype is not None and latent_dtype not in allowed:
        has = f"stores its latent only as {', '.join(allowed)}" if allowed else "has no latent (separate k and v)"
        raise ConfigError(f"--latent-dtype {latent_dtype}: {model} ({kind}) {has}")


__all__ = ["check_latent_dtype", "latent_dtype_choices", "non_negative_int", "positive_float", "positive_int",
           "positive_size"]
