"""Typed options from a backend URL's query string: ``?capacity=64GiB&workers=8``, checked by pydantic.

A backend declares its options as a frozen dataclass whose fields carry their constraints as
``Annotated[...]`` pydantic metadata (``Field(gt=0, le=..., allow_inf_nan=False)``; the aliases
below name the usual ones). The same annotations serve every way options are made:

- ``options_from_url(cls, url, overrides, **fixed)`` turns query text into typed values (bool words,
  ints written as ints, finite floats, byte sizes such as ``64GiB`` for fields ending in ``_bytes``),
  checks each value strictly against its field (a bool is no int, a float no int), then builds the
  dataclass through ``pydantic.TypeAdapter(cls)``, which runs the class's cross-field checks;
- ``check_fields(self)``, called first in each options class's ``__post_init__``, applies the same
  per-field checks to options built directly in Python;
- a config tree (pydantic models) can hold these dataclasses as fields and get the same checks.

Every problem is a ``ConfigError`` on one line, ``URL: option KEY=VALUE: reason``; unknown and
repeated keys are refused. This module never lets a ValueError of ``urllib`` or pydantic out:
``split_url`` and ``url_port`` are the URL splitter every backend uses.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin, get_type_hints
from urllib.parse import SplitResult, parse_qsl, urlsplit

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError

from ..errors import ConfigError, TieredKVError
from ..model.sizes import MAX_SIZE, parse_size

C = TypeVar("C")

# --- bounds and the constrained types options use ----------------------------------------------
MAX_WORKERS = 1024  # threads or connections of one backend; more is a typo, not a tuning
MAX_TIMEOUT_S = 7 * 86400.0  # socket and thread timeouts: the OS refuses much larger values
MAX_TTL_S = 100 * 365 * 86400.0  # Redis PX in ms stays far inside int64

Workers = Annotated[int, Field(gt=0, le=MAX_WORKERS)]
TimeoutSeconds = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)]
ByteSize = Annotated[int, Field(ge=0, le=MAX_SIZE)]


def check_host(host: str) -> str:
    """A name or address the resolver can take: no spaces or controls, IDNA-encodable."""
    if not host or any(c.isspace() or not c.isprintable() for c in host) or any(c in host for c in "/?#@[]"):
        raise ValueError("not a host name or address")
    try:
        host.encode("idna")
    except UnicodeError:
        raise ValueError("not a valid (IDNA) host name") from None
    return host


HostName = Annotated[str, AfterValidator(check_host)]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_INT_RE = re.compile(r"[+-]?[0-9]{1,30}", re.ASCII)
# Floats as people write them; Python's float() also takes "nan", "inf", "1_0" and Unicode digits.
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?", re.ASCII)
_NON_FINITE = {"nan", "inf", "infinity"}
_FIELD_CONFIG = ConfigDict(allow_inf_nan=False)


# --- URLs --------------------------------------------------------------------------------------
def split_url(url: str) -> SplitResult:
    """``urlsplit`` that answers ConfigError for what it refuses (brackets, bad IPv6, NFKC hosts)."""
    if not isinstance(url, str):
        raise ConfigError(f"backend URL must be a str, got {type(url).__name__}")
    try:
        return urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"{url!r}: bad host part ({exc})") from None


def url_port(parts: SplitResult, url: str) -> int | None:
    """The URL's port (None when absent); ConfigError naming the port for text or out of range."""
    try:
        return parts.port
    except ValueError:
        raise ConfigError(f"{url}: bad port {parts.netloc.rpartition(':')[2]!r}; expected 1..65535") from None


# --- fields ------------------------------------------------------------------------------------
def _base(kind: Any) -> tuple[Any, bool]:
    """``Annotated[int, ...] | None`` -> ``(int, True)``; ``float`` -> ``(float, False)``."""
    optional = False
    if get_origin(kind) in (Union, types.UnionType):
        args = [a for a in get_args(kind) if a is not type(None)]
        optional = len(args) < len(get_args(kind))
        if len(args) == 1:
            kind = args[0]
    if get_origin(kind) is Annotated:
        kind = get_args(kind)[0]
    return kind, optional


@functools.cache
def _fields(cls: type) -> dict[str, tuple[Any, bool, TypeAdapter]]:
    """name -> (base type, optional, strict adapter of the annotated field type)."""
    hints = get_type_hints(cls, include_extras=True)
    out = {}
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name, Any)
        out[f.name] = (*_base(hint), TypeAdapter(hint, config=_FIELD_CONFIG))
    return out


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def _from_text(name: str, kind: Any, optional: bool, text: str) -> Any:
    """A query value as the field's type; ValueError with the reason."""
    if optional and text == "":
        return None
    if name.endswith("_bytes"):
        return parse_size(text, what="size")
    if kind is bool:
        lowered = text.lower()
        if lowered not in _TRUE | _FALSE:
            raise ValueError(f"not a bool; use one of {', '.join(sorted(_TRUE | _FALSE))}")
        return lowered in _TRUE
    if kind is int:
        if not _INT_RE.fullmatch(text):
            raise ValueError("not a valid int")
        return int(text)
    if kind is float:
        if not _FLOAT_RE.fullmatch(text):
            raise ValueError("need a finite number" if text.strip().lower().lstrip("+-") in _NON_FINITE else "not a valid number")
        return float(text)  # 1e999 is inf here: the field's finiteness check names it
    return text


def _reason(name: str, error: dict[str, Any]) -> str:
    """One pydantic error as a short reason naming the bound."""
    ctx = error.get("ctx") or {}
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if error["type"] in bounds:
        limit = next(iter(ctx.values()))
        return f"need {name} {bounds[error['type']]} {limit}"
    if error["type"] == "finite_number":
        return "need a finite number"
    if isinstance(ctx.get("error"), Exception):
        return str(ctx["error"])
    return error["msg"][:1].lower() + error["msg"][1:]


def _problem(where: str, name: str, shown: Any, reason: str) -> ConfigError:
    return ConfigError(f"{where}: option {name}={shown!r}: {reason}")


def _check_value(cls: type, where: str, name: str, value: Any, shown: Any) -> Any:
    """``value`` checked strictly against field ``name``; ConfigError naming it."""
    kind, optional, adapter = _fields(cls)[name]
    try:
        if isinstance(value, str) and kind is not str:
            value = _from_text(name, kind, optional, value)
        return adapter.validate_python(value, strict=True)
    except ValidationError as exc:
        raise _problem(where, name, shown, "; ".join(_reason(name, e) for e in exc.errors(include_url=False))) from None
    except ConfigError as exc:  # from parse_size: drop its own "size: " lead
        raise _problem(where, name, shown, str(exc).removeprefix("size: ")) from None
    except ValueError as exc:
        raise _problem(where, name, shown, str(exc)) from None


def check_fields(options: object) -> None:
    """Check every field of an options dataclass against its annotation; for ``__post_init__``."""
    cls = type(options)
    for name in _fields(cls):
        value = getattr(options, name)
        _check_value(cls, cls.__name__, name, value, value)


def options_from_url(cls: type[C], url: str, overrides: dict[str, Any] | None = None, **fixed: Any) -> C:
    """Build options dataclass ``cls`` from ``url``'s query, then ``overrides``, then ``fixed``.

    ``fixed`` are values the URL's other parts give (host, port, path): a query key or override
    naming one of them is refused, as are unknown and repeated keys.
    """
    fields = _fields(cls)
    known = ", ".join(sorted(set(fields) - set(fixed)))
    given: dict[str, Any] = {}
    for key, value in parse_qsl(split_url(url).query, keep_blank_values=True):
        if key not in fields:
            raise ConfigError(f"{url}: unknown option {key!r}; known: {known}")
        if key in given:
            raise ConfigError(f"{url}: option {key} given twice")
        given[key] = value
    for key, value in (overrides or {}).items():
        if key not in fields:
            raise ConfigError(f"{url}: unknown option {key!r}; known: {known}")
        given[key] = value  # an explicit option wins over the query
    for key in given:
        if key in fixed:
            raise ConfigError(f"{url}: {key} comes from the URL itself, not from an option")
    given.update(fixed)
    checked = {k: _check_value(cls, url, k, v, v) for k, v in given.items()}
    try:
        return _adapter(cls).validate_python(checked)
    except ValidationError as exc:
        raise ConfigError(f"{url}: {_whole(exc)}") from None


def _whole(exc: ValidationError) -> str:
    """A ValidationError of a whole options class: its own ConfigError, or missing fields."""
    reasons = []
    for error in exc.errors(include_url=False):
        inner = (error.get("ctx") or {}).get("error")
        if isinstance(inner, TieredKVError):
            reasons.append(str(inner))
        elif error["type"] == "missing":
            reasons.append(f"option {error['loc'][0]} is required")
        else:
            reasons.append(f"option {'.'.join(map(str, error['loc']))}: {_reason(str(error['loc'][-1]) if error['loc'] else '', error)}")
    return "; ".join(reasons)


__all__ = ["ByteSize", "HostName", "check_host", "TimeoutSeconds", "Workers", "check_fields", "options_from_url", "split_url", "url_port",
           "MAX_TIMEOUT_S", "MAX_TTL_S", "MAX_WORKERS"]
