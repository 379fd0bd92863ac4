"""The config file's typed tree: one pydantic model per section, ``extra="forbid"`` everywhere.

    Config
    ├── spec         SpecConfig        a model preset, or an explicit spec (kind, layers, ...)
    ├── l1           L1Config          GPU (or CPU) page pool: size, device
    ├── l2           L2Config          pinned host pool: size, layout
    ├── l3           L3Config          size, backend URL and its typed options
    ├── policies     PoliciesConfig    mirrors hierarchy.Policies field by field
    │   └── prefetch_timeout           mirrors hierarchy.PrefetchTimeout
    ├── controller   ControllerConfig  mirrors hierarchy.ControllerLimits
    ├── metrics      MetricsConfig     Prometheus endpoint (off by default)
    └── security     SecurityConfig    tenant salt of the page keys, secret for keyed record tags

The models only type and shape values; what a value may be is decided where it is used:
``Policies`` / ``PrefetchTimeout`` / ``ControllerLimits`` check each field (a mirrored section
builds its dataclass per field, so the error names the key), the spec factories check the spec,
and an L3 section's options go through the very parser the backend's ``from_url`` uses
(``url_options.options_from_url`` under each scheme's URL rules), so a value in the URL's query
and the same value under ``options:`` give the same object and the same reason.

Text is read the way URL queries are (``"8"`` is an int, ``"true"`` a bool, ``"64GiB"`` a size),
because environment variables are text; a bool is never an int and a float never an int.
This module reads no file and no environment: that is ``loader``'s job.
"""

from __future__ import annotations

import dataclasses
import math
import re
from enum import Enum
from typing import Annotated, Any, ClassVar, Literal, get_type_hints
from urllib.parse import parse_qsl, urlencode

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, SecretStr, ValidationInfo, create_model,
                      field_validator, model_validator)
from pydantic_settings import BaseSettings, SettingsConfigDict

from ..backends.file import FileOptions
from ..backends.memory import MemoryOptions
from ..backends.mooncake import MooncakeOptions
from ..backends.redis_options import RedisOptions, parse_redis_url
from ..backends.url_options import HostName, options_from_url, split_url
from ..errors import ConfigError, SpecError
from ..hierarchy import ControllerLimits, Policies, PrefetchTimeout
from ..ops.plan import plan_tiers
from ..model.record_key import MIN_SECRET_BYTES, RecordKey
from ..model.sizes import format_size, parse_size
from ..model.spec import LATENT_DTYPES, MODEL_PRESETS, KVSpec, mha_spec, mla_spec, model_spec, nsa_spec

ENV_PREFIX = "TIERED_KV_"
ENV_DELIMITER = "__"

#: Latent dtypes each model kind can store (MLA's latent is bf16; MHA has separate k and v).
DEFAULT_LATENT = {"nsa": "fp8", "mla": "bf16"}


class Problem(ValueError):
    """A cross-field check's finding at ``key`` (dotted, relative to the model that raised it).

    Pydantic keeps the exception in the error's context; ``loader`` appends ``key`` to the error's
    location, so the message names the key at fault, not the section that noticed."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key
        self.reason = reason


# --- scalars as files and environment variables write them -------------------------------------
_INT_RE = re.compile(r"[+-]?[0-9]{1,30}", re.ASCII)
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?", re.ASCII)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _int(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"need an int, got the bool {value!r}")
    if isinstance(value, str):
        if not _INT_RE.fullmatch(value.strip()):
            raise ValueError(f"need an int, got {value!r}")
        return int(value)
    return value


def _float(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"need a number, got the bool {value!r}")
    if isinstance(value, str):
        if not _FLOAT_RE.fullmatch(value.strip()):
            raise ValueError(f"need a finite number, got {value!r}")
        value = float(value)
    if isinstance(value, int):
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"need a finite number, got {value!r}")
    return value


def _bool(value: Any) -> Any:
    if isinstance(value, str):
        word = value.strip().lower()
        if word not in _TRUE | _FALSE:
            raise ValueError(f"need a bool ({', '.join(sorted(_TRUE | _FALSE))}), got {value!r}")
        return word in _TRUE
    return value


def _size(value: Any) -> int:
    if isinstance(value, float):
        raise ValueError(f"need a size such as '64GiB' or a whole number of bytes, got {value!r}")
    try:
        return parse_size(value)
    except ConfigError as exc:
        raise ValueError(str(exc).removeprefix("size: ")) from None


def _layer_range(value: Any) -> Any:
    """``"START:END"`` (as the CLI writes it) or a two-item list."""
    if isinstance(value, str):
        start, sep, end = value.partition(":")
        if not sep or not _INT_RE.fullmatch(start.strip()) or not _INT_RE.fullmatch(end.strip()):
            raise ValueError(f"need START:END (end exclusive) or [START, END], got {value!r}")
        return (int(start), int(end))
    return value


Int = Annotated[int, BeforeValidator(_int), Field(strict=True)]
Float = Annotated[float, BeforeValidator(_float), Field(strict=True)]
Bool = Annotated[bool, BeforeValidator(_bool), Field(strict=True)]
Size = Annotated[int, BeforeValidator(_size)]
Port = Annotated[int, BeforeValidator(_int), Field(strict=True, ge=1, le=65535)]
Text = Annotated[str, Field(strict=True)]


class Section(BaseModel):
    """Every section: unknown keys refused, values frozen once checked."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=False)


def _default(cls: type, name: str) -> Any:
    """The default of dataclass ``cls``'s field ``name``: the one place defaults are written."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


class Mirror(Section):
    """A section whose fields are exactly a frozen dataclass's (``target``): that dataclass's own
    ``__post_init__`` checks each value (built with that one field, so the error names the key),
    and ``build()`` makes the dataclass value itself."""

    target: ClassVar[type]

    @field_validator("*")
    @classmethod
    def _checked_by_target(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, Mirror):
            return value  # a nested mirror checked its own fields
        try:
            cls.target(**{info.field_name: value})
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    def build(self) -> Any:
        return self.target(**{name: v.build() if isinstance(v, Mirror) else v for name, v in self})


# --- spec --------------------------------------------------------------------------------------
class SpecConfig(Section):
    """Either ``model`` (a preset of ``tiered_kv.model.spec.MODEL_PRESETS``) or ``kind`` + ``layers``."""

    model: Literal[tuple(MODEL_PRESETS)] | None = "deepseek-v3.2"  # type: ignore[valid-type]
    kind: Literal["nsa", "mla", "mha"] | None = None
    layers: Int | None = None
    layer_range: Annotated[tuple[Int, Int], BeforeValidator(_layer_range)] | None = None
    page_size: Int = 64
    latent_dtype: Literal["fp8", "bf16"] | None = None
    num_kv_heads: Int | None = None
    head_dim: Int | None = None
    name: Text | None = None

    @model_validator(mode="before")
    @classmethod
    def _explicit_spec_drops_the_preset(cls, data: Any) -> Any:
        # ``kind`` alone means an explicit spec: the preset default does not apply then.
        if isinstance(data, dict) and data.get("kind") is not None and "model" not in data:
            return {**data, "model": None}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "SpecConfig":
        if self.model is not None and self.kind is not None:
            raise Problem("kind", f"give spec.model (a preset) or spec.kind (an explicit spec), not both "
                                  f"(model {self.model!r}, kind {self.kind!r})")
        if self.model is None and self.kind is None:
            raise Problem("model", f"need spec.model (one of {', '.join(MODEL_PRESETS)}) or spec.kind")
        kind = self.resolved_kind
        if self.latent_dtype is not None and self.latent_dtype not in LATENT_DTYPES[kind]:
            allowed = LATENT_DTYPES[kind]
            has = f"stores its latent only as {', '.join(allowed)}" if allowed else "has no latent (separate k and v)"
            raise Problem("latent_dtype", f"{self.model or kind} ({kind}) {has}")
        for key in ("num_kv_heads", "head_dim"):
            if getattr(self, key) is not None and (kind != "mha" or self.model is not None):
                raise Problem(key, "only an explicit mha spec (spec.kind: mha) takes KV heads; a preset has its own"
                              if kind == "mha" else f"a {kind} spec has no KV heads")
        if self.model is not None:
            total = MODEL_PRESETS[self.model][1]
            if self.layers is not None and self.layer_range is not None:
                raise Problem("layer_range", "give spec.layers (the first N) or spec.layer_range, not both")
            if self.layers is not None and not 0 < self.layers <= total:
                raise Problem("layers", f"{self.model} has {total} layers, got {self.layers}")
        elif self.layers is None:
            raise Problem("layers", f"an explicit {kind} spec needs its layer count")
        try:
            self.build()
        except SpecError as exc:
            text = str(exc)
            key = next((k for word, k in (("layer_range", "layer_range"), ("page_size", "page_size"),
                                          ("num_layers", "layers"), ("num_kv_heads", "num_kv_heads"),
                                          ("head_dim", "head_dim")) if word in text), "kind")
            raise Problem(key, str(exc)) from None
        return self

    @property
    def resolved_kind(self) -> str:
        return MODEL_PRESETS[self.model][0] if self.model is not None else self.kind  # type: ignore[return-value]

    @property
    def namespace_name(self) -> str:
        """The model name page keys are derived from: two instances sharing L3 must agree on it."""
        if self.name is not None:
            return self.name
        return self.model if self.model is not None else f"{self.kind}-{self.layers}l"

    def build(self) -> KVSpec:
        latent = self.latent_dtype or DEFAULT_LATENT.get(self.resolved_kind, "fp8")
        if self.model is not None:
            bounds = self.layer_range or ((0, self.layers) if self.layers else None)
            return model_spec(self.model, page_size=self.page_size, latent_dtype=self.latent_dtype, layer_range=bounds)
        layers = self.layers or 0
        factories = {
            "nsa": lambda: nsa_spec(layers, self.page_size, latent, layer_range=self.layer_range),
            "mla": lambda: mla_spec(layers, self.page_size, latent, layer_range=self.layer_range),
            "mha": lambda: mha_spec(layers, self.page_size, 8 if self.num_kv_heads is None else self.num_kv_heads,
                                    128 if self.head_dim is None else self.head_dim,
                                    layer_range=self.layer_range),
        }
        return factories[self.kind]()  # type: ignore[index]


# --- tiers -------------------------------------------------------------------------------------
_DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?", re.ASCII)


def _device(value: Any) -> Any:
    # L1 lives where the transfer paths copy from: a CPU or a CUDA device. Checked here, so that
    # ``config check`` names l1.device instead of the replay failing on it after the file passed.
    if isinstance(value, str) and not _DEVICE.fullmatch(value):
        raise ValueError(f"expected cpu, cuda or cuda:N, got {value!r}")
    return value


class L1Config(Section):
    size: Size = parse_size("64GiB")
    device: Annotated[Text, AfterValidator(_device)] | None = None  # None: "cuda" when there is one, else "cpu"


class L2Config(Section):
    size: Size = parse_size("512GiB")
    layout: Literal["page_first", "layer_first"] = "page_first"


#: scheme -> the backend's own parser of a URL and option overrides into its typed options.
BACKEND_OPTIONS: dict[str, Any] = {
    "file": FileOptions.from_url,
    "memory": lambda url, overrides: options_from_url(MemoryOptions, url, overrides),
    "redis": parse_redis_url,
    "rediss": parse_redis_url,
    "unix": parse_redis_url,
    "mooncake": MooncakeOptions.from_url,
}
#: scheme -> its options dataclass (for docs and ``show``).
OPTION_CLASSES = {"file": FileOptions, "memory": MemoryOptions, "redis": RedisOptions, "mooncake": MooncakeOptions}


def _scalar(value: Any) -> Any:
    if value is not None and not isinstance(value, (str, int, float, bool)):
        raise ValueError(f"an option value is a string, number or bool, got {type(value).__name__}")
    return value


def _query_text(value: Any) -> str:
    """An option value as the URL query writes it (what the backend's parser reads back)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class L3Config(Section):
    """The L3 tier. ``url`` None: a ``file://`` store in a temporary directory (embedded use)."""

    size: Size = parse_size("4TiB")
    url: Text | None = None
    options: dict[Text, Annotated[Any, BeforeValidator(_scalar)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _options_parse(self) -> "L3Config":
        if self.url is None:
            if self.options:
                raise Problem("options", "options need l3.url (its scheme says whose options they are)")
            return self
        scheme = self.scheme
        parser = BACKEND_OPTIONS.get(scheme)
        if parser is None:
            from ..backends import available_schemes

            if scheme not in available_schemes():
                raise Problem("url", f"{self.url!r}: unknown backend scheme {scheme!r}; known: "
                                     f"{', '.join(available_schemes())}")
            if self.options:
                raise Problem("options", f"{scheme}:// is a plugin backend: put its options in the URL's query")
            return self
        try:
            parser(self.url, {})
        except ConfigError as exc:
            raise Problem("url", str(exc)) from None
        try:
            parser(self.url, dict(self.options))
        except ConfigError as exc:
            text = str(exc)
            named = [k for k in self.options if f"option {k}=" in text or f"option {k!r}" in text or f" {k} " in text]
            raise Problem(f"options.{named[0]}" if named else "options", text) from None
        return self

    @property
    def scheme(self) -> str | None:
        if self.url is None:
            return None
        if "://" not in self.url:
            raise Problem("url", f"backend URL must look like scheme://..., got {self.url!r}")
        try:
            return split_url(self.url).scheme.lower()
        except ConfigError as exc:
            raise Problem("url", str(exc)) from None

    @property
    def effective_url(self) -> str | None:
        """``url`` with ``options`` written into its query (they win over the query's own values):
        what ``open_backend`` is given, and parses into ``backend_options()``."""
        if self.url is None or not self.options:
            return self.url
        parts = split_url(self.url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        query.update({k: _query_text(v) for k, v in self.options.items()})
        return parts._replace(query=urlencode(query)).geturl()

    def backend_options(self) -> Any:
        """The backend's typed options value (``FileOptions``, ``RedisOptions``, ...); None for the
        embedded temporary store or a plugin scheme."""
        parser = BACKEND_OPTIONS.get(self.scheme) if self.url is not None else None
        return None if parser is None else parser(self.url, dict(self.options))


# --- policies, controller, metrics -------------------------------------------------------------
#: A mirrored dataclass field's type -> the config's type for it (text read as URL queries are).
_MIRROR_TYPES: dict[Any, Any] = {int: Int, float: Float, bool: Bool}


def mirror(name: str, target: type, nested: dict[str, type[Mirror]] | None = None) -> type[Mirror]:
    """A ``Mirror`` section with exactly ``target``'s fields, types and defaults, made from the
    dataclass itself so a field added there is a key here (and the docs test asks for its row).
    Fields counting bytes take sizes (``1GiB``); ``nested`` names sections for dataclass fields."""
    hints = get_type_hints(target)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(target):
        if nested and f.name in nested:
            fields[f.name] = (nested[f.name], Field(default_factory=nested[f.name]))
            continue
        kind = hints[f.name]
        if "bytes" in f.name and kind is int:
            kind = Size
        elif isinstance(kind, type) and issubclass(kind, Enum):
            pass
        elif kind in _MIRROR_TYPES:
            kind = _MIRROR_TYPES[kind]
        else:
            raise TypeError(f"{target.__name__}.{f.name}: no config type for {kind!r}")
        fields[f.name] = (kind, _default(target, f.name))
    section = create_model(name, __base__=Mirror, __module__=__name__, **fields)
    section.target = target
    section.__doc__ = f"The config of ``{target.__module__}.{target.__name__}``, field by field."
    return section


PrefetchTimeoutConfig = mirror("PrefetchTimeoutConfig", PrefetchTimeout)
PoliciesConfig = mirror("PoliciesConfig", Policies, {"prefetch_timeout": PrefetchTimeoutConfig})
ControllerConfig = mirror("ControllerConfig", ControllerLimits)


def _metrics_host(value: str) -> str:
    """The endpoint's address as ``serve_metrics`` takes it (an IP address, no host name)."""
    from ..ops.metrics import check_address

    return check_address(value, 0)[0]


class MetricsConfig(Section):
    enabled: Bool = False
    host: Annotated[HostName, AfterValidator(_metrics_host)] = "127.0.0.1"
    port: Port = 9400


def _secret(value: Any) -> Any:
    """A secret as text of at least MIN_SECRET_BYTES bytes; the reason never repeats the value."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if not isinstance(value, str):
        raise ValueError(f"a secret is text, got {type(value).__name__}")
    if len(value.encode("utf-8")) < MIN_SECRET_BYTES:
        raise ValueError(f"a secret needs at least {MIN_SECRET_BYTES} bytes, got {len(value.encode('utf-8'))} "
                         f"(e.g. python -c 'import secrets; print(secrets.token_hex(32))')")
    return SecretStr(value)


class SecurityConfig(Section):
    """Tenant isolation on a shared L3 (docs/security.md): ``tenant`` salts the page keys
    (``Namespace.tenant_salt``), so tenants' keys differ; ``secret`` seals records with a keyed tag
    (``RecordKey``) and refuses records without it. The secret is masked wherever it is shown."""

    tenant: Text = ""
    secret: Annotated[SecretStr, BeforeValidator(_secret)] | None = None

    def record_key(self) -> RecordKey | None:
        return None if self.secret is None else RecordKey(self.secret.get_secret_value())


# --- the whole tree ----------------------------------------------------------------------------
class Config(BaseSettings):
    """The whole hierarchy. ``loader.load_config`` layers file < environment < explicit values and
    validates the result here once; ``TIERED_KV_L2__SIZE`` names ``l2.size`` (see ``loader``)."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True, env_prefix=ENV_PREFIX,
                                      env_nested_delimiter=ENV_DELIMITER, case_sensitive=False)

    spec: SpecConfig = Field(default_factory=SpecConfig)
    l1: L1Config = Field(default_factory=L1Config)
    l2: L2Config = Field(default_factory=L2Config)
    l3: L3Config = Field(default_factory=L3Config)
    policies: PoliciesConfig = Field(default_factory=PoliciesConfig)
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    # Set by loader.load_config: dotted key -> (source, origin), and the file's path.
    _sources: dict[str, tuple[str, str]] = PrivateAttr(default_factory=dict)
    _path: str | None = PrivateAttr(default=None)

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):  # type: ignore[override]
        # Construction validates exactly what it is given: the layering is loader's, in one place.
        return (init_settings,)

    @model_validator(mode="after")
    def _combinations(self) -> "Config":
        spec = self.spec.build()
        gpu, host, disk = plan_tiers(spec, gpu_bytes=self.l1.size, host_bytes=self.l2.size, disk_bytes=self.l3.size)
        name = self.spec.namespace_name
        for key, tier in (("l1.size", gpu), ("l3.size", disk)):
            if tier.pages == 0:
                raise Problem(key, f"{format_size(tier.capacity_bytes)} holds no page of {tier.bytes_per_page:,} B "
                                   f"({name}, page size {spec.page_size})")
        batch = self.controller.batch_pages
        if host.pages < batch:
            raise Problem("l2.size", f"{format_size(host.capacity_bytes)} holds {host.pages} pages of "
                                     f"{host.bytes_per_page:,} B, fewer than one controller batch "
                                     f"(controller.batch_pages = {batch})")
        if self.l2.layout != "page_first":
            scheme = self.l3.scheme or "file"
            options = self.l3.backend_options()
            zero_copy = scheme in ("file", "mooncake") or bool(getattr(options, "zero_copy", False))
            how = "moves whole page records zero-copy from" if zero_copy else "moves whole page records through"
            raise Problem("l2.layout", f"{self.l2.layout} host slots cannot serve the L3 backend {scheme}:// "
                                       f"(it {how} page_first slots); use page_first")
        return self

    # --- the values the hierarchy takes --------------------------------------------------------
    def kv_spec(self) -> KVSpec:
        return self.spec.build()

    def policies_value(self) -> Policies:
        return self.policies.build()

    def controller_limits(self) -> ControllerLimits:
        return self.controller.build()

    def summary(self) -> str:
        """One line: the spec, each tier in bytes and pages, the policies, metrics."""
        spec = self.kv_spec()
        gpu, host, disk = plan_tiers(spec, gpu_bytes=self.l1.size, host_bytes=self.l2.size, disk_bytes=self.l3.size)
        l3 = self.l3.url or "file:// (temporary directory)"
        metrics = f"metrics on {self.metrics.host}:{self.metrics.port}" if self.metrics.enabled else "metrics off"
        if self.security.secret is not None:
            metrics += f"; records keyed (key id {self.security.record_key().key_id.hex()})"
        return (f"{self.spec.namespace_name} ({spec.kind}, layers {spec.layer_start}..{spec.layer_end}, page "
                f"{spec.page_size}); L1 {format_size(gpu.capacity_bytes)} = {gpu.pages:,} pages, L2 "
                f"{format_size(host.capacity_bytes)} = {host.pages:,} pages ({self.l2.layout}), L3 {l3} "
                f"{format_size(disk.capacity_bytes)} = {disk.pages:,} pages; write {self.policies.write.value}, "
                f"prefetch {self.policies.prefetch.value}; {metrics}")


__all__ = ["BACKEND_OPTIONS", "Config", "ControllerConfig", "ENV_DELIMITER", "ENV_PREFIX", "L1Config", "L2Config",
           "L3Config", "LATENT_DTYPES", "MetricsConfig", "Mirror", "OPTION_CLASSES", "PoliciesConfig",
           "PrefetchTimeoutConfig", "Problem", "Section", "SecurityConfig", "SpecConfig"]
