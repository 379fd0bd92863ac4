"""Typed options from a backend URL's query string: ``?capacity=64GiB&workers=8``.

A backend declares its options as a frozen dataclass; ``options_from_url`` converts each query
value to the field's type (int, float, bool, str, byte sizes for fields ending in ``_bytes``) and
rejects unknown keys, naming the URL and the key.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints
from urllib.parse import parse_qsl, urlsplit

from ..errors import ConfigError
from ..sizes import parse_size

C = TypeVar("C")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _unoptional(kind: Any) -> Any:
    """``int | None`` -> ``int``; other types unchanged."""
    if get_origin(kind) in (Union, types.UnionType):
        args = [a for a in get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


def _convert(name: str, kind: Any, value: Any, url: str) -> Any:
    if not isinstance(value, str):
        return value  # given as a keyword option, already typed
    kind = _unoptional(kind)
    if name.endswith("_bytes"):
        return parse_size(value, what=f"{url}: option {name}")
    try:
        if kind is bool:
            lowered = value.lower()
            if lowered not in _TRUE | _FALSE:
                raise ValueError(value)
            return lowered in _TRUE
        if kind is int:
            return int(value)
        if kind is float:
            return float(value)
    except ValueError:
        raise ConfigError(f"{url}: option {name}={value!r} is not a valid {getattr(kind, '__name__', kind)}") from None
    return value


def options_from_url(cls: type[C], url: str, overrides: dict[str, Any] | None = None, **fixed: Any) -> C:
    """Build options dataclass ``cls`` from ``url``'s query, then ``overrides``, then ``fixed``."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if key not in fields:
            raise ConfigError(f"{url}: unknown option {key!r}; known: {', '.join(sorted(fields))}")
        values[key] = value
    for key, value in (overrides or {}).items():
        if key not in fields:
            raise ConfigError(f"unknown option {key!r} for {url}; known: {', '.join(sorted(fields))}")
        values[key] = value
    values.update(fixed)
    converted = {k: _convert(k, hints.get(k, str), v, url) for k, v in values.items()}
    try:
        return cls(**converted)
    except TypeError as exc:
        raise ConfigError(f"{url}: {exc}") from None
