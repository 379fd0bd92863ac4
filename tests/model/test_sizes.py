"""Byte sizes: exact, bounded, and only ConfigError on bad input."""

from __future__ import annotations

import pytest

from tiered_kv.errors import ConfigError
from tiered_kv.model.sizes import MAX_SIZE, format_size, parse_size


@pytest.mark.parametrize("text, size", [
    ("64GiB", 64 << 30), ("1.5TB", 1_500_000_000_000), ("0", 0), ("4096", 4096), (" 2 k ", 2048),
    (".5KiB", 512), ("0.5B", 0), ("1.9999B", 1), (4096, 4096), ("8191PiB", 8191 << 50),
    (str(MAX_SIZE), MAX_SIZE), ("0" * 5000 + "1", 1),
    # exact, where a float would round: 2**53 + 1 bytes
    (str(2**53 + 1), 2**53 + 1), ("9007199254740993B", 2**53 + 1),
    ("1." + "9" * 60 + "PiB", 2 * 2**50 - 1),
])
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text, message", [
    ("9" * 400, "too large"),  # float("9"*400) is inf: was an OverflowError
    ("9" * 5000 + "GiB", "too large"),
    (str(MAX_SIZE + 1), "too large"),
    ("8192PiB", "too large"),
    (MAX_SIZE + 1, "0..9223372036854775807"),
    (-1, "0..9223372036854775807"),
    ("1e400GiB", "malformed size"),
    ("nan", "malformed size"),
    ("inf", "malformed size"),
    ("-1GiB", "malformed size"),
    ("1.GiB", "malformed size"),
    ("\u0661\u0662", "malformed size"),  # Arabic-Indic digits: \d took them, float() too
    ("12\u00a0GiB", "malformed"),  # a no-break space is no ASCII space
    ("5 parsecs", "unknown unit 'parsecs'"),
    ("", "malformed size"),
    (True, "expected a size"),
    (None, "expected a size such as .64GiB., got NoneType"),
    (1.5, "expected a size such as .64GiB., got float"),
    (b"1GiB", "expected a size such as .64GiB., got bytes"),
])
def test_bad_sizes_are_config_errors(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_size(text, what="--host-mem")


def test_the_message_names_what_and_stays_short():
    with pytest.raises(ConfigError) as info:
        parse_size("x" * 100_000, what="--disk")
    assert str(info.value).startswith("--disk: malformed size")
    assert len(str(info.value)) < 300


def test_format_size():
    assert format_size(3 * 2**20) == "3.00 MiB"
    assert format_size(512) == "512 B"
