"""Parse and format byte sizes such as ``64GiB``, ``1.5TB`` or ``4096``."""

from __future__ import annotations

import re

from .errors import ConfigError

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
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int, *, what: str = "size") -> int:
    """Return the number of bytes in ``text`` (``"64GiB"``, ``"1.5TB"``, ``"0"``, ``4096``).

    Decimal units (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB, and the
    single letters K, M, G, T) powers of 1024. Raises ConfigError naming ``what`` otherwise.
    """
    if isinstance(text, bool):
        raise ConfigError(f"{what}: expected a size such as '64GiB', got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ConfigError(f"{what}: size must not be negative, got {text}")
        return text
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ConfigError(f"{what}: malformed size {text!r}; expected a number and a unit such as '64GiB' or '1.5TB'")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise ConfigError(f"{what}: unknown unit {unit!r} in {text!r}; use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB")
    return int(float(number) * factor)


def format_size(num_bytes: float) -> str:
    """Human-readable binary size, e.g. ``2.93 MiB``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
