"""What one KV page is made of: named components x layers, each with a byte size per layer.

Every other module works on pages described by a ``KVSpec`` and never special-cases a model
kind. The payload of a page is laid out component by component in spec order, each one
layer-major: ``[c0 l0][c0 l1]...[c0 lN][c1 l0]...``. ``chunk_offset`` gives where a
(component, layer) chunk starts inside that payload.

This module must stay free of torch / CUDA so that a scheduler process can use it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property

from ..errors import SpecError

#: Version of the stored page format. Part of every fingerprint, so a format change can never
#: read pages written by an older one.
FORMAT_VERSION = 1

_DTYPE_BYTES = {
    "fp8": 1,
    "float8_e4m3fn": 1,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "fp32": 4,
    "float32": 4,
}


def check_int(value: object, what: str, *, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``; SpecError naming ``what`` otherwise.

    Bools (``True`` is no page size of 1), floats (``64.0`` would reach the fingerprint as
    ``64.0`` and name another spec) and text are refused, so a spec is built only from integers.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"{what} must be an int >= {minimum}, got {value!r}")
    return value


def dtype_bytes(dtype: str) -> int:
    """Bytes of one element of a dtype named like ``bf16`` or ``float8_e4m3fn``."""
    try:
        return _DTYPE_BYTES[dtype]
    except (KeyError, TypeError):  # TypeError: an unhashable value (a list) is no dtype name either
        raise SpecError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(_DTYPE_BYTES))}") from None


@dataclass(frozen=True)
class Component:
    """One named part of a page (``latent``, ``indexer``, ``k``, ``v``) and its size per layer."""

    name: str
    bytes_per_layer: int  # bytes of this component for one page and one layer
    layout: str = ""  # what is inside, for humans and for the fingerprint

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise SpecError(f"component name must be an identifier, got {self.name!r}")
        check_int(self.bytes_per_layer, f"component {self.name!r}: bytes_per_layer")


@dataclass(frozen=True)
class KVSpec:
    """A page: ``components`` x layers ``[layer_start, layer_end)``, holding ``page_size`` tokens.

    ``kind`` and ``dims`` describe the model for the fingerprint (and humans); sizes come only from
    the components.
    """

    kind: str
    page_size: int
    layer_start: int
    layer_end: int
    components: tuple[Component, ...]
    dims: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        check_int(self.page_size, "page_size")
        check_int(self.layer_start, "layer_start", minimum=0)
        check_int(self.layer_end, "layer_end")
        if not 0 <= self.layer_start < self.layer_end:
            raise SpecError(f"layer range must satisfy 0 <= start < end, got [{self.layer_start}, {self.layer_end})")
        if not self.components:
            raise SpecError("a spec needs at least one component")
        if not all(isinstance(c, Component) for c in self.components):
            raise SpecError(f"components must be Component values, got {[type(c).__name__ for c in self.components]}")
        names = [c.name for c in self.components]
        if len(set(names)) != len(names):
            raise SpecError(f"component names must be unique, got {names}")

    # --- sizes -------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start

    @cached_property
    def page_bytes(self) -> int:
        """Payload bytes of one full page, every component and layer."""
        return sum(c.bytes_per_layer for c in self.components) * self.num_layers

    @property
    def bytes_per_token(self) -> float:
        """Bytes one token occupies across all layers (page_bytes / page_size)."""
        per_token = self.page_bytes / self.page_size
        return int(per_token) if per_token.is_integer() else per_token

    def component_bytes(self, name: str) -> int:
        """Bytes of one component across all layers of a page."""
        return self.component(name).bytes_per_layer * self.num_layers

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise SpecError(f"spec {self.kind!r} has no component {name!r}; it has {[c.name for c in self.components]}")

    def component_index(self, name: str) -> int:
        return self.components.index(self.component(name))

    @cached_property
    def _component_offsets(self) -> tuple[int, ...]:
        offsets, position = [], 0
        for c in self.components:
            offsets.append(position)
            position += c.bytes_per_layer * self.num_layers
        return tuple(offsets)

    def chunk_offset(self, component_index: int, layer: int) -> int:
        """Byte offset of (component, local layer) inside a page payload."""
        if check_int(component_index, "component index", minimum=0) >= len(self.components):
            raise SpecError(f"component index {component_index!r} outside 0..{len(self.components) - 1}")
        if not 0 <= layer < self.num_layers:
            raise SpecError(f"layer {layer} outside 0..{self.num_layers - 1}")
        return self._component_offsets[component_index] + layer * self.components[component_index].bytes_per_layer

    # --- identity ----------------------------------------------------------------------------
    @cached_property
    def fingerprint(self) -> str:
        """32 hex chars, stable across processes and machines; changes with anything that changes bytes."""
        canonical = json.dumps(
            {
                "format": FORMAT_VERSION,
                "kind": self.kind,
                "page_size": self.page_size,
                "layers": [self.layer_start, self.layer_end],
                "components": [[c.name, c.bytes_per_layer, c.layout] for c in self.components],
                "dims": [list(d) for d in self.dims],
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()

    def describe(self) -> str:
        parts = ", ".join(f"{c.name} {c.bytes_per_layer} B" for c in self.components)
        return (
            f"{self.kind} page_size={self.page_size} layers=[{self.layer_start},{self.layer_end}) "
            f"per layer: {parts}; page {self.page_bytes} B"
        )


def check_spec(spec: object) -> KVSpec:
    """``spec`` if it is a ``KVSpec``; SpecError otherwise (pools take a spec, not its name)."""
    if not isinstance(spec, KVSpec):
        raise SpecError(f"expected a KVSpec (nsa_spec(), model_spec(...)), got {type(spec).__name__}")
    return spec


def _layer_range(num_layers: int, layer_range: tuple[int, int] | None, page_size: int) -> tuple[int, int]:
    """Checks the arguments every factory shares (before any size is computed from them, so the
    error names the argument, not a component size derived from it) and returns the layer bounds."""
    check_int(page_size, "page_size")
    check_int(num_layers, "num_layers")
    if layer_range is None:
        return 0, num_layers
    try:
        start, end = layer_range  # type: ignore[misc]
    except (TypeError, ValueError):
        raise SpecError(f"layer_range must be (start, end), got {layer_range!r}") from None
    check_int(start, "layer_range start", minimum=0)
    check_int(end, "layer_range end")
    if not 0 <= start < end <= num_layers:
        raise SpecError(f"layer_range {layer_range} must lie within [0, {num_layers}] and be non-empty")
    return start, end


def nsa_spec(
    num_layers: int = 61,
    page_size: int = 64,
    latent_dtype: str = "fp8",
    *,
    kv_lora_rank: int = 512,
    rope_dim: int = 64,
    index_head_dim: int = 128,
    quant_block: int = 128,
    layer_range: tuple[int, int] | None = None,
) -> KVSpec:
    """DeepSeek-V3.2 NSA: an MLA latent plus the lightning indexer's fp8 keys, per page per layer.

    fp8 latent, per token: ``kv_lora_rank`` fp8 nope + one fp32 scale per 128 of them + ``rope_dim``
    bf16 rope (656 B for V3.2). bf16 latent: ``(kv_lora_rank + rope_dim) * 2`` (1,152 B).
    Indexer, per page: ``page_size x index_head_dim`` fp8 keys, then ``page_size`` fp32 scales per
    quant block (8,448 B for V3.2 at page 64).
    """
    start, end = _layer_range(num_layers, layer_range, page_size)
    for name, value in (("kv_lora_rank", kv_lora_rank), ("rope_dim", rope_dim), ("index_head_dim", index_head_dim),
                        ("quant_block", quant_block)):
        check_int(value, name)
    if latent_dtype == "fp8" and kv_lora_rank % 128:
        raise SpecError(f"kv_lora_rank must be a multiple of 128 for the fp8 latent (one fp32 scale per 128), got {kv_lora_rank}")
    if index_head_dim % quant_block:
        raise SpecError(f"index_head_dim {index_head_dim} must be a multiple of quant_block {quant_block} "
                        "(one fp32 indexer scale per block)")
    if latent_dtype == "fp8":
        latent_token = kv_lora_rank + (kv_lora_rank // 128) * 4 + rope_dim * 2
        latent_layout = f"{page_size}x[{kv_lora_rank} fp8 nope|{kv_lora_rank // 128} fp32 scale|{rope_dim} bf16 rope]"
    elif latent_dtype == "bf16":
        latent_token = (kv_lora_rank + rope_dim) * 2
        latent_layout = f"{page_size}x[{kv_lora_rank + rope_dim} bf16]"
    else:
        raise SpecError(f"latent_dtype must be 'fp8' or 'bf16', got {latent_dtype!r}")
    scales_per_token = index_head_dim // quant_block
    indexer_bytes = page_size * index_head_dim + page_size * scales_per_token * 4
    return KVSpec(
        kind="nsa",
        page_size=page_size,
        layer_start=start,
        layer_end=end,
        components=(
            Component("latent", page_size * latent_token, latent_layout),
            Component("indexer", indexer_bytes, f"{page_size}x{index_head_dim} fp8 keys|{page_size}x{scales_per_token} fp32 scales"),
        ),
        dims=(("latent_dtype", latent_dtype), ("kv_lora_rank", str(kv_lora_rank)), ("rope_dim", str(rope_dim)),
              ("index_head_dim", str(index_head_dim)), ("quant_block", str(quant_block)), ("model_layers", str(num_layers))),
    )


def mla_spec(
    num_layers: int,
    page_size: int,
    dtype: str = "bf16",
    *,
    kv_lora_rank: int = 512,
    rope_dim: int = 64,
    layer_range: tuple[int, int] | None = None,
) -> KVSpec:
    """MLA (DeepSeek-V2/V3): one latent of ``kv_lora_rank + rope_dim`` elements per token."""
    start, end = _layer_range(num_layers, layer_range, page_size)
    check_int(kv_lora_rank, "kv_lora_rank")
    check_int(rope_dim, "rope_dim")
    elements = kv_lora_rank + rope_dim
    return KVSpec(
        kind="mla",
        page_size=page_size,
        layer_start=start,
        layer_end=end,
        components=(Component("latent", page_size * elements * dtype_bytes(dtype), f"{page_size}x{elements} {dtype}"),),
        dims=(("dtype", dtype), ("kv_lora_rank", str(kv_lora_rank)), ("rope_dim", str(rope_dim)), ("model_layers", str(num_layers))),
    )


def mha_spec(
    num_layers: int,
    page_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str = "bf16",
    *,
    layer_range: tuple[int, int] | None = None,
    tp_rank: int = 0,
    tp_size: int = 1,
) -> KVSpec:
    """MHA / GQA: separate k and v, ``page_size x num_kv_heads x head_dim`` elements each.

    ``num_kv_heads`` is the heads this rank holds; ``(tp_rank, tp_size)`` go into the fingerprint
    because MHA caches are sharded by heads.
    """
    start, end = _layer_range(num_layers, layer_range, page_size)
    check_int(num_kv_heads, "num_kv_heads")
    check_int(head_dim, "head_dim")
    check_int(tp_size, "tp_size")
    if check_int(tp_rank, "tp_rank", minimum=0) >= tp_size:
        raise SpecError(f"tp_rank must be an int in 0..{tp_size - 1}, got {tp_rank!r}")
    size = page_size * num_kv_heads * head_dim * dtype_bytes(dtype)
    layout = f"{page_size}x{num_kv_heads}x{head_dim} {dtype}"
    return KVSpec(
        kind="mha",
        page_size=page_size,
        layer_start=start,
        layer_end=end,
        components=(Component("k", size, layout), Component("v", size, layout)),
        dims=(("dtype", dtype), ("num_kv_heads", str(num_kv_heads)), ("head_dim", str(head_dim)),
              ("tp", f"{tp_rank}/{tp_size}"), ("model_layers", str(num_layers))),
    )


#: Latent dtypes each spec kind can store (MHA has no latent): the CLI and the config refuse others.
LATENT_DTYPES = {"nsa": ("fp8", "bf16"), "mla": ("bf16",), "mha": ()}

#: Named models for the CLI and configs: name -> (factory, default layer count, description).
MODEL_PRESETS = {
    "deepseek-v3.2": ("nsa", 61, "DeepSeek-V3.2 NSA cache: latent + indexer keys"),
    "deepseek-v3": ("mla", 61, "DeepSeek-V3 MLA cache, bf16 latent"),
    "llama-3.1-8b": ("mha", 32, "Llama 3.1 8B, 8 KV heads x 128, bf16"),
    "llama-3.1-70b": ("mha", 80, "Llama 3.1 70B, 8 KV heads x 128, bf16"),
}


def model_spec(
    model: str,
    *,
    num_layers: int | None = None,
    page_size: int = 64,
    latent_dtype: str | None = None,
    layer_range: tuple[int, int] | None = None,
) -> KVSpec:
    """The spec of a named model preset (see ``MODEL_PRESETS``).

    ``num_layers``: the model's first N layers (None: all of them); more than the model has is a
    SpecError, not a bigger model. ``latent_dtype``: None for the preset's own (NSA: fp8); a dtype
    the model's kind cannot store (``LATENT_DTYPES``: MLA only bf16, MHA no latent) is a SpecError,
    not silently ignored.
    """
    try:
        kind, default_layers, _ = MODEL_PRESETS[model]
    except (KeyError, TypeError):
        raise SpecError(f"unknown model {model!r}; known: {', '.join(MODEL_PRESETS)}") from None
    if latent_dtype is not None and latent_dtype not in LATENT_DTYPES[kind]:
        allowed = LATENT_DTYPES[kind]
        has = f"stores its latent only as {', '.join(allowed)}" if allowed else "has no latent (separate k and v)"
        raise SpecError(f"latent_dtype {latent_dtype!r}: {model} ({kind}) {has}")
    if num_layers is not None:
        check_int(num_layers, "num_layers")
        if num_layers > default_layers:
            raise SpecError(f"num_layers {num_layers}: {model} has {default_layers} layers")
    layers = default_layers if num_layers is None else num_layers
    if kind == "nsa":
        return nsa_spec(layers, page_size, latent_dtype or "fp8", layer_range=layer_range)
    if kind == "mla":
        return mla_spec(layers, page_size, "bf16", layer_range=layer_range)
    return mha_spec(layers, page_size, 8, 128, "bf16", layer_range=layer_range)
