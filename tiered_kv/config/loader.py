"""Loading a config: the file, then ``TIERED_KV_*`` environment variables, then explicit values.

The one precedence rule, written once (``load_config``): **file < environment < explicit
arguments**; a later layer replaces a leaf value of an earlier one and leaves its other keys alone.

- file: YAML (``.yaml`` / ``.yml``, duplicate keys refused) or TOML (``.toml``, ``tomllib``); with no
  path, ``TIERED_KV_CONFIG`` names the file; with neither, only defaults.
- environment: ``TIERED_KV_`` + the key path in upper case, sections joined by ``__``
  (``TIERED_KV_L2__SIZE=64GiB``, ``TIERED_KV_L3__OPTIONS__WORKERS=16``), read by pydantic-settings'
  ``EnvSettingsSource`` from the mapping given (``os.environ`` by default); a whole section may be
  JSON (``TIERED_KV_METRICS='{"enabled": true}'``). A ``TIERED_KV_*`` name that is no key is refused.
- explicit: a dict, nested (``{"l2": {"size": "64GiB"}}``) or dotted (``{"l2.size": "64GiB"}``):
  what code or CLI flags pass.

Every problem is one ``ConfigError`` line naming where the value came from and its key path:
``FILE: l2.size: reason``, ``TIERED_KV_L2__SIZE: reason``, ``arguments: l2.size: reason``.
``describe`` lists every effective value with its source (default / file / env / argument).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_settings import EnvSettingsSource, SettingsError

from ..errors import ConfigError
from ..model.sizes import format_size
from .models import ENV_DELIMITER, ENV_PREFIX, OPTION_CLASSES, Config, Problem, Section

CONFIG_PATH_ENV = ENV_PREFIX + "CONFIG"
DEFAULT, FILE, ENV, ARGUMENT = "default", "file", "env", "argument"
MASK = "**********"  # what ``describe`` / ``show`` print for a secret that is set


@dataclasses.dataclass(frozen=True)
class Setting:
    """One effective value: dotted ``key``, ``value``, ``source`` (default / file / env / argument)
    and ``origin`` (the file's path, the environment variable, or ``arguments``)."""

    key: str
    value: Any
    source: str
    origin: str


# --- the three layers --------------------------------------------------------------------------
class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: not valid YAML: {at}{' '.join(str(problem).split())}") from None


def _toml(text: str, where: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {' '.join(str(exc).split())}") from None


#: file suffix -> parser of its text.
FORMATS = {".yaml": _yaml, ".yml": _yaml, ".toml": _toml}


def read_file(path: str | os.PathLike) -> dict[str, Any]:
    """The file's mapping (an empty file is ``{}``); ConfigError naming the file."""
    where = str(path)
    parse = FORMATS.get(Path(path).suffix.lower())
    if parse is None:
        raise ConfigError(f"{where}: unknown config format; use {', '.join(FORMATS)}")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read: {exc}") from None
    data = parse(text, where)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level must be a mapping of sections, got {type(data).__name__}")
    _check_keys(data, where + ": ")
    return data


def _check_keys(data: dict, where: str, prefix: str = "") -> None:
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(f"{where}{prefix}{key!r}: keys are strings, got {type(key).__name__}")
        if isinstance(value, dict):
            _check_keys(value, where, f"{prefix}{key}.")


class _EnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ  # read by super().__init__ through _load_env_vars
        super().__init__(Config)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # Config is case-insensitive: pydantic-settings matches lower-cased names.
        return {k.lower(): v for k, v in self._environ.items()}


def _env_name(path: tuple[str, ...]) -> str:
    return ENV_PREFIX + ENV_DELIMITER.join(p.upper() for p in path)


def _env_layer(env: Mapping[str, str]) -> dict[str, Any]:
    ours = sorted(k for k in env if k.upper().startswith(ENV_PREFIX) and k.upper() != CONFIG_PATH_ENV)
    for name in ours:
        section = name[len(ENV_PREFIX):].split(ENV_DELIMITER)[0].lower()
        if section not in Config.model_fields:
            raise ConfigError(f"{name}: unknown key {section!r}; known: {', '.join(Config.model_fields)} "
                              f"(nested keys join with {ENV_DELIMITER}, e.g. {_env_name(('l2', 'size'))})")
    if not ours:
        return {}
    try:
        return _EnvSource({k: env[k] for k in ours})()
    except SettingsError as exc:
        cause = exc.__cause__ or exc
        field = str(exc).split('"')[1] if str(exc).count('"') >= 2 else ""
        raise ConfigError(f"{_env_name((field,)) if field else ENV_PREFIX + '*'}: not valid JSON for a section "
                          f"({' '.join(str(cause).split())})") from None


def _expand(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys (``"l2.size"``) into nested dicts; nested dicts kept."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"arguments: {key!r}: keys are non-empty strings")
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"arguments: {key}: {part} is given both as a value and as a section")
        node[leaf] = _merge(node.get(leaf, {}), _expand(value)) if isinstance(value, Mapping) else value
    return out


def _merge(base: Any, top: Any) -> Any:
    """``top`` over ``base``: mappings merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(top, dict):
        merged = dict(base)
        for key, value in top.items():
            merged[key] = _merge(base.get(key), value) if key in base else value
        return merged
    return top


def _leaves(data: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(data, dict) and data:
        return [leaf for k, v in data.items() for leaf in _leaves(v, prefix + (str(k),))]
    return [prefix] if prefix else []


# --- provenance --------------------------------------------------------------------------------
def _sources(file_data: dict, path: str | None, env_data: dict, env: Mapping[str, str],
             explicit: dict) -> dict[str, tuple[str, str]]:
    """dotted key -> (source, origin) of the layer that set it last."""
    out: dict[str, tuple[str, str]] = {}

    def put(leaf: tuple[str, ...], found: tuple[str, str]) -> None:
        # A section set below an earlier layer's value replaced that value: it is no longer its source.
        for i in range(1, len(leaf)):
            out.pop(".".join(leaf[:i]), None)
        out[".".join(leaf)] = found

    for leaf in _leaves(file_data):
        put(leaf, (FILE, str(path)))
    names = {k.upper(): k for k in env}
    for leaf in _leaves(env_data):
        # The longest prefix an environment variable names: TIERED_KV_L2__SIZE, or TIERED_KV_L2 as JSON.
        var = next((names[_env_name(leaf[:i])] for i in range(len(leaf), 0, -1) if _env_name(leaf[:i]) in names),
                   _env_name(leaf))
        put(leaf, (ENV, var))
    for leaf in _leaves(explicit):
        put(leaf, (ARGUMENT, "arguments"))
    return out


def _source_of(key: str, sources: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        found = sources.get(".".join(parts[:i]))
        if found is not None:
            return found
    below = [v for k, v in sources.items() if k.startswith(key + ".")] if key else []
    return below[-1] if below else None


# --- errors ------------------------------------------------------------------------------------
def _model_at(loc: list[str]) -> type[BaseModel] | None:
    model: type[BaseModel] = Config
    for part in loc:
        field = model.model_fields.get(part)
        kind = field.annotation if field is not None else None
        if not (isinstance(kind, type) and issubclass(kind, BaseModel)):
            return None
        model = kind
    return model


def _reason(error: dict[str, Any], loc: list[str]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        known = f"; known: {', '.join(model.model_fields)}" if model is not None else ""
        return f"unknown key{known}"
    if kind == "missing":
        return "required"
    msg = " ".join(error["msg"].removeprefix("Value error, ").split())
    msg = msg[:1].lower() + msg[1:]
    value = error.get("input")
    if kind not in ("value_error", "assertion_error") and isinstance(value, (str, int, float, bool, type(None))):
        msg += f", got {value!r}"
    return msg


def _label(key: str, reason: str, sources: dict[str, tuple[str, str]], path: str | None) -> str:
    found = _source_of(key, sources)
    if found is None:  # a default at fault in a combination: name the file, if any
        return f"{path or 'config'}: {key}: {reason}"
    source, origin = found
    if source == ENV:
        var_path = origin[len(ENV_PREFIX):].lower().split(ENV_DELIMITER)
        rest = key.split(".")[len(var_path):]
        return f"{origin}: {'.'.join(rest) + ': ' if rest else ''}{reason}"
    return f"{origin}: {key}: {reason}"


def _config_error(exc: ValidationError, sources: dict[str, tuple[str, str]], path: str | None) -> ConfigError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = [str(p) for p in first["loc"]]
    inner = (first.get("ctx") or {}).get("error")
    if isinstance(inner, Problem):
        loc += inner.key.split(".")
        reason = inner.reason
    else:
        reason = _reason(first, loc)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return ConfigError(" ".join(_label(".".join(loc), reason, sources, path).split()) + more)


# --- the entry points --------------------------------------------------------------------------
def config_file(path: str | os.PathLike | None = None, env: Mapping[str, str] = os.environ) -> str | None:
    """The file a load reads: ``path``, else ``$TIERED_KV_CONFIG`` (when set and not empty), else None."""
    if path is not None:
        return str(path)
    return next((env[k] for k in env if k.upper() == CONFIG_PATH_ENV and env[k]), None)


def load_config(path: str | os.PathLike | None = None, overrides: Mapping[str, Any] | None = None,
                env: Mapping[str, str] = os.environ, *, defaults: Mapping[str, Any] | None = None) -> Config:
    """The effective config: ``path`` (or ``$TIERED_KV_CONFIG``) < ``TIERED_KV_*`` in ``env`` <
    ``overrides``. ConfigError, one line, naming the file / variable, the key path and the reason.

    ``defaults`` (nested or dotted keys) stand in for the models' own defaults under all three
    layers, and show as ``default``: the replay's embedded setup when no file is given. A
    ``spec.model`` or ``spec.kind`` set by a layer drops the defaults' ``spec`` section and tier
    sizes: they describe one spec, and another is named."""
    path = config_file(path, env)
    label = path
    file_data = read_file(path) if path is not None else {}
    env_data = _env_layer(env)
    explicit = _expand(overrides or {})
    sources = _sources(file_data, label, env_data, env, explicit)
    merged = _merge(_merge(file_data, env_data), explicit)
    base = _expand(defaults or {})
    given_spec = merged.get("spec") if isinstance(merged, dict) else None
    if isinstance(given_spec, dict) and {"model", "kind"} & given_spec.keys():
        # A model or kind given above names another spec: the defaults' spec and the tier sizes
        # chosen for it do not apply (the models' own defaults do).
        base.pop("spec", None)
        for tier in ("l1", "l2", "l3"):
            if isinstance(base.get(tier), dict):
                base[tier].pop("size", None)
    merged = _merge(base, merged)
    try:
        config = Config(**merged)
    except ValidationError as exc:
        raise _config_error(exc, sources, label) from None
    except Problem as exc:  # raised outside a validator (a property read early)
        raise ConfigError(_label(exc.key, exc.reason, sources, label)) from None
    config._sources = sources
    config._path = label
    return config


def _plain(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return MASK  # never shown, logged or written out
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


def _walk(model: BaseModel, prefix: str, sources: dict[str, tuple[str, str]]) -> list[Setting]:
    out: list[Setting] = []
    for name in type(model).model_fields:
        key = prefix + name
        value = getattr(model, name)
        if isinstance(value, Section):
            out += _walk(value, key + ".", sources)
        elif isinstance(value, dict) and value:
            out += [_setting(f"{key}.{k}", v, sources) for k, v in value.items()]
        else:
            out.append(_setting(key, value, sources))
    return out


def _setting(key: str, value: Any, sources: dict[str, tuple[str, str]]) -> Setting:
    source, origin = _source_of(key, sources) or (DEFAULT, DEFAULT)
    return Setting(key, _plain(value), source, origin)


def describe(config: Config) -> list[Setting]:
    """Every effective value and where it came from; then the L3 backend's resolved options
    (``l3.backend.*``: from ``l3.options``, the URL, or the backend's defaults)."""
    sources: dict[str, tuple[str, str]] = getattr(config, "_sources", None) or {}
    out = _walk(config, "", sources)
    options = config.l3.backend_options()
    if options is not None:
        url_source = _source_of("l3.url", sources) or (DEFAULT, DEFAULT)
        defaults = {f.name: f.default for f in dataclasses.fields(options)}
        for f in dataclasses.fields(options):
            value = getattr(options, f.name)
            given = _source_of(f"l3.options.{f.name}", sources) if f.name in config.l3.options else None
            source = given or (url_source if value != defaults[f.name] else (DEFAULT, DEFAULT))
            out.append(Setting(f"l3.backend.{f.name}", _plain(value), *source))
    return out


def _shown(setting: Setting) -> str:
    if isinstance(setting.value, int) and not isinstance(setting.value, bool) and setting.key in SIZE_KEYS:
        return f"{setting.value} ({format_size(setting.value)})"
    return json.dumps(setting.value) if not isinstance(setting.value, str) else setting.value


def show(config: Config, *, as_json: bool = False) -> str:
    """``describe`` as a table (key, value, source) or as one JSON object keyed by dotted key."""
    settings = describe(config)
    if as_json:
        return json.dumps({s.key: {"value": s.value, "source": s.source, "origin": s.origin} for s in settings},
                          default=str)
    width = max(len(s.key) for s in settings)
    rows = [f"{s.key:<{width}}  {_shown(s)}  [{s.source}{'' if s.origin in (DEFAULT, 'arguments') else ': ' + s.origin}]"
            for s in settings]
    return "\n".join(rows)


def _size_keys() -> frozenset[str]:
    from .models import _size  # the Size type's validator marks a size field

    keys = set()

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            kind = field.annotation
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                walk(kind, prefix + name + ".")
            elif any(getattr(m, "func", None) is _size for m in field.metadata):
                keys.add(prefix + name)
    walk(Config, "")
    keys.update(f"l3.backend.{f.name}" for cls in OPTION_CLASSES.values() for f in dataclasses.fields(cls)
                if f.name.endswith("_bytes"))
    return frozenset(keys)


SIZE_KEYS = _size_keys()


# --- the replay --------------------------------------------------------------------------------
def to_replay_settings(config: Config) -> Any:
    """The ``tiered_kv.compose.ReplaySettings`` this config describes: its spec and namespace
    name, tiers in pages as ``plan`` counts them (L1 in page payloads, L2 / L3 in padded slots), the
    L3 URL with its options written in (None: the replay's temporary file store), policies,
    controller limits, host layout, L1 device, tenant salt and record key. Run flags (simulate,
    verify) keep their defaults."""
    from ..compose import ReplaySettings

    base = ReplaySettings(spec=config.kv_spec(), model=config.spec.namespace_name, l3_url=config.l3.effective_url,
                          policies=config.policies_value(), limits=config.controller_limits(),
                          host_layout=config.l2.layout, device=config.l1.device, tenant=config.security.tenant,
                          record_key=config.security.record_key())
    return base.with_sizes(gpu_bytes=config.l1.size, host_bytes=config.l2.size, disk_bytes=config.l3.size)


def replay_settings(path: str | os.PathLike | None = None, overrides: Mapping[str, Any] | None = None,
                    env: Mapping[str, str] = os.environ) -> Any:
    """``to_replay_settings(load_config(path, overrides, env))``: what ``replay --config FILE`` runs;
    with no file (and no ``$TIERED_KV_CONFIG``), the embedded default under ``env`` and ``overrides``."""
    from ..compose import embedded_config

    defaults = embedded_config() if config_file(path, env) is None else None
    return to_replay_settings(load_config(path, overrides, env, defaults=defaults))


__all__ = ["CONFIG_PATH_ENV", "FORMATS", "config_file", "SIZE_KEYS", "Setting", "describe", "load_config", "read_file",
           "replay_settings", "show", "to_replay_settings"]
