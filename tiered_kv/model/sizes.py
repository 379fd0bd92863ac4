"""Parse and format byte sizes such as ``64GiB``, ``1.5TB`` or ``4096``."""

from __future__ import annotations

import re
from decimal import Decimal, localcontext

from ..errors import ConfigError

#: Direct I/O and page_first host slots work in whole blocks of this many bytes.
ALIGN = 4096


def round_up(value: int, multiple: int = ALIGN) -> int:
    """``value`` rounded up to a multiple of ``multiple`` (a padded slot from a record's bytes)."""
    return -(-value // multiple) * multiple


# The largest size anything here takes: what an int64 offset (files, mmap, C APIs) can hold.
MAX_SIZE = 2**63 - 1

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}
# ASCII only: \d would take other scripts' digits, which no size is written in.
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*([A-Za-z]*)\s*", re.ASCII)


def parse_size(text: str | int, *, what: str = "size") -> int:
    """Return the number of bytes in ``text`` (``"64GiB"``, ``"1.5TB"``, ``"0"``, ``4096``).

    Decimal units (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB, and the
    single letters K, M, G, T) powers of 1024; fractions of a byte are dropped. The number is read
    exactly (no float: ``1e400GiB`` or 400 nines are "too large", not an OverflowError). Raises
    ConfigError naming ``what`` for anything that is not a size of 0..MAX_SIZE bytes.
    """
    if isinstance(text, bool):
        raise ConfigError(f"{what}: expected a size such as '64GiB', got {text!r}")
    if isinstance(text, int):
        if not 0 <= text <= MAX_SIZE:
            raise ConfigError(f"{what}: size must be 0..{MAX_SIZE} bytes, got {text}")
        return int(text)
    if not isinstance(text, str):
        raise ConfigError(f"{what}: expected a size such as '64GiB', got {type(text).__name__}")
    match = _SIZE_RE.fullmatch(text)
    if not match:
        raise ConfigError(f"{what}: malformed size {text[:80]!r}; expected a number and a unit such as '64GiB' or '1.5TB'")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise ConfigError(f"{what}: unknown unit {unit!r} in {text[:80]!r}; use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB")
    whole = number.partition(".")[0].lstrip("0")
    if len(whole) > 20:  # certainly above MAX_SIZE; spares Decimal a huge multiplication
        raise ConfigError(f"{what}: size {text[:80]!r} is too large; at most {MAX_SIZE} bytes")
    with localcontext() as ctx:
        ctx.prec = len(number) + 20  # exact: every digit of the number times a unit <= 2**50
        size = int(Decimal(number) * factor)
    if size > MAX_SIZE:
        raise ConfigError(f"{what}: size {text[:80]!r} is too large; at most {MAX_SIZE} bytes")
    return size


def format_size(num_bytes: float) -> str:
    """Human-readable binary size, e.g. ``2.93 MiB``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
