"""A page of SGLang's HiCache host pools as the payload of one tiered-kv page record.

SGLang keeps a page of its host pools in one of several layouts (``--hicache-mem-layout``). This
module views each pool's buffer, for every layout SGLang offers for that pool, as
``uint8 [pages, layers, ...]``: one page's bytes of one component in the order of a tiered-kv
record (layer-major, each layer's rows as the device pool holds them). The record is the one the
tiered-kv linker writes for the same pools (``linker_pools.spec_and_device_pool``), so a page is
the same bytes whichever layout or adapter wrote it.

Where a page of a component is one contiguous range of the host buffer in record order (the
``page_first_direct`` layouts, and the indexer's ``page_first``), the record needs no copy at all:
``PoolPages.parts`` gives those ranges, which a ``BoundPool`` slot takes as its payload, and the
backend reads and writes SGLang's memory in place. Elsewhere a page is gathered into a staging
slot and scattered back (``layer_first``: one run per layer; ``page_first`` / ``page_head``: token-
or head-major pages, transposed on the way). ``CONTIGUOUS`` names which is which. This module
never allocates a pool and never touches a device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError
from ...model.spec import Component, KVSpec


def _bytes(buffer: torch.Tensor) -> torch.Tensor:
    return buffer.view(torch.uint8)


def _pages(buffer: torch.Tensor, axis: int, page_num: int, page_size: int) -> torch.Tensor:
    """``buffer`` with its token axis ``axis`` split into ``[page_num, page_size]``."""
    tokens = buffer.narrow(axis, 0, page_num * page_size)
    shape = list(tokens.shape)
    return tokens.reshape(shape[:axis] + [page_num, page_size] + shape[axis + 1:])


def _mha(host: Any, layout: str) -> list[torch.Tensor]:
    """K and V: ``[pages, layers, page_size, heads, head_dim]`` bytes each."""
    buffer, n, ps = _bytes(host.kv_buffer), host.page_num, host.page_size
    views = []
    for part in (buffer[0], buffer[1]):
        if layout == "layer_first":  # [layers, tokens, heads, dim]
            views.append(_pages(part, 1, n, ps).permute(1, 0, 2, 3, 4))
        elif layout == "page_first":  # [tokens, layers, heads, dim]
            views.append(_pages(part, 0, n, ps).permute(0, 2, 1, 3, 4))
        elif layout == "page_first_direct":  # [pages, layers, page_size, heads, dim]
            views.append(part)
        else:  # page_head: [pages, heads, page_size, layers, dim]
            views.append(part.permute(0, 3, 2, 1, 4))
    return views


def _mla(host: Any, layout: str) -> list[torch.Tensor]:
    """The latent: ``[pages, layers, page_size, 1, kv_cache_dim]`` bytes."""
    buffer, n, ps = _bytes(host.kv_buffer), host.page_num, host.page_size
    if layout == "layer_first":  # [layers, tokens, 1, dim]
        return [_pages(buffer, 1, n, ps).permute(1, 0, 2, 3, 4)]
    if layout == "page_first":  # [tokens, layers, 1, dim]
        return [_pages(buffer, 0, n, ps).permute(0, 2, 1, 3, 4)]
    return [buffer]  # page_first_direct: [pages, layers, page_size, 1, dim]


#: Per host pool kind: the buffer that holds every page of it (a bound part must lie in one).
_REGION: dict[str, Callable[[Any], torch.Tensor]] = {
    "mha": lambda host: host.kv_buffer,
    "mla": lambda host: host.kv_buffer,
    "indexer": lambda host: host.index_k_with_scale_buffer,
}


def _indexer(host: Any, layout: str) -> list[torch.Tensor]:
    """DSA's index keys with their scales: ``[pages, layers, row_bytes]`` (one row per page)."""
    buffer = _bytes(host.index_k_with_scale_buffer)
    if layout == "layer_first":  # [layers, pages, row]
        return [buffer.permute(1, 0, 2)]
    return [buffer.flatten(2)]  # page_first(_direct): [pages, layers, 1, row]


#: Per host pool kind: the layouts SGLang 0.5.23 builds for it, and whether a page of each of its
#: components is one contiguous range of the host buffer in record order (one memcpy) or gathered.
CONTIGUOUS: dict[str, dict[str, bool]] = {
    "mha": {"layer_first": False, "page_first": False, "page_first_direct": True, "page_head": False},
    "mla": {"layer_first": False, "page_first": False, "page_first_direct": True},
    "indexer": {"layer_first": False, "page_first": True, "page_first_direct": True},
}

_VIEWS: dict[str, Callable[[Any, str], list[torch.Tensor]]] = {"mha": _mha, "mla": _mla, "indexer": _indexer}


def host_pool_kind(host: Any) -> str:
    """``mha``, ``mla`` or ``indexer`` for SGLang's host pool classes this adapter moves."""
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    kinds = {MHATokenToKVPoolHost: "mha", MLATokenToKVPoolHost: "mla", DSAIndexerPoolHost: "indexer"}
    kind = kinds.get(type(host))
    if kind is None:
        raise ConfigError(f"the tiered-kv HiCache backend moves SGLang's {sorted(c.__name__ for c in kinds)} host "
                          f"pools; got {type(host).__name__}")
    return kind


def _components(name: str, kind: str, host: Any) -> list[Component]:
    """The linker's components for ``host`` (``linker_pools.spec_and_device_pool`` names them from
    the device pool: ``{pool}_{position}``, bytes of a page's rows of one layer, dtype and row shape)."""
    if kind == "mha":
        row, dtype, rows = (host.head_num, host.head_dim), host.dtype, host.page_size
        parts = 2
    elif kind == "mla":
        row, dtype, rows, parts = (1, host.kv_cache_dim), host.dtype, host.page_size, 1
    else:
        row, dtype, rows, parts = (host.indexer_page_stride_size,), host.indexer_dtype, 1, 1
    size = rows * dtype.itemsize
    for extent in row:
        size *= extent
    return [Component(f"{name}_{position}", size, f"{dtype} {row}") for position in range(parts)]


def host_spec(pools: dict[str, Any]) -> KVSpec:
    """The spec of one page of SGLang's registered host ``pools`` (name -> host pool; ``kv`` first):
    the spec the tiered-kv linker builds for the device pools behind them, so both write the same
    records under the same fingerprint."""
    kinds = {name: host_pool_kind(host) for name, host in pools.items()}
    kv = pools["kv"]
    if kinds["kv"] == "indexer" or any(kind != "indexer" for name, kind in kinds.items() if name != "kv"):
        raise ConfigError(f"the tiered-kv HiCache backend moves a KV pool and DSA's indexer; got {kinds}")
    device = {"mha": "MHATokenToKVPool", "mla": "MLATokenToKVPool"}[kinds["kv"]]
    if "indexer" in pools:
        device = type(pools["indexer"].device_pool).__name__
    components = [c for name, host in pools.items() for c in _components(name, kinds[name], host)]
    layers = {host.layer_num for host in pools.values()}
    if len(layers) != 1:
        raise ConfigError(f"SGLang's host pools cover different layer counts: "
                          f"{ {name: host.layer_num for name, host in pools.items()} }")
    return KVSpec(kind=f"sglang-{device}", page_size=kv.page_size, layer_start=0, layer_end=layers.pop(),
                  components=tuple(components), dims=(("engine", "sglang"),))


@dataclass(frozen=True)
class PoolPages:
    """One host pool's components as record-ordered page views, and where they sit in the payload."""

    name: str  # SGLang's pool name: "kv", "indexer"
    kind: str  # host_pool_kind
    layout: str
    page_size: int
    views: tuple[np.ndarray, ...]  # per component: uint8 [pages, layers, ...], sharing SGLang's memory
    offsets: tuple[int, ...]  # per component: byte offset of its first layer in the payload
    region: np.ndarray | None  # the host buffer every page of this pool lies in, as flat bytes

    @property
    def contiguous(self) -> bool:
        """Whether a page of each component is one range of SGLang's buffer: moved in place."""
        return CONTIGUOUS[self.kind][self.layout] and self.region is not None

    def parts(self, page: int) -> list[tuple[int, np.ndarray]]:
        """Host ``page`` as ``(payload offset, range)`` per component, each range one contiguous
        run of SGLang's buffer (only where ``contiguous``): what a ``BoundPool`` slot binds."""
        if not self.contiguous:
            raise ConfigError(f"pool {self.name!r} in layout {self.layout!r} holds a page in pieces: it is staged")
        return [(offset, view[page].reshape(-1)) for view, offset in zip(self.views, self.offsets)]

    def page_of(self, host_index: int) -> int:
        """The host page of SGLang's token index ``host_index`` (a page's first token)."""
        if host_index % self.page_size:
            raise ConfigError(f"host index {host_index} of pool {self.name!r} does not start a "
                              f"{self.page_size}-token page")
        return host_index // self.page_size

    def _targets(self, payload: np.ndarray, page: int):
        for view, offset in zip(self.views, self.offsets):
            source = view[page]
            yield source, payload[offset:offset + source.size].reshape(source.shape)

    # numpy, not torch: a torch copy fans out over its intra-op threads, which SGLang's I/O threads
    # calling at once (and the engine's own work) leave spinning; numpy copies on the calling thread.
    def gather(self, page: int, payload: np.ndarray) -> None:
        """Copy host ``page`` into its place in a record's ``payload`` (uint8, whole page)."""
        for source, target in self._targets(payload, page):
            np.copyto(target, source)

    def scatter(self, payload: np.ndarray, page: int) -> None:
        """Copy its part of a verified record's ``payload`` into host ``page``."""
        for source, target in self._targets(payload, page):
            np.copyto(source, target)


def pool_pages(spec: KVSpec, name: str, host: Any) -> PoolPages:
    """``host`` (SGLang's pool ``name``) as the spec's components ``{name}_0``, ``{name}_1``...; a
    ConfigError where its layout is one this adapter does not move, or its page differs from the spec's."""
    kind = host_pool_kind(host)
    layout = host.layout
    if layout not in CONTIGUOUS[kind]:
        raise ConfigError(f"host layout {layout!r} of pool {name!r} ({type(host).__name__}) is not one the "
                          f"tiered-kv HiCache backend moves; use one of {sorted(CONTIGUOUS[kind])}")
    if getattr(host, "dcp_size", 1) != 1:
        raise ConfigError("the tiered-kv HiCache backend does not move decode-context-parallel (DCP) host pools")
    views = _VIEWS[kind](host, layout)
    names = [c.name for c in spec.components]
    offsets = []
    for position, view in enumerate(views):
        component = f"{name}_{position}"
        if component not in names:
            raise ConfigError(f"pool {name!r} has no component {component!r} in the spec ({names})")
        index = names.index(component)
        expected = spec.components[index].bytes_per_layer * spec.num_layers
        if view.shape[1] != spec.num_layers or view[0].numel() != expected:
            raise ConfigError(f"host pool {name!r} holds {view[0].numel()} bytes of {component!r} per page over "
                              f"{view.shape[1]} layers; the device pool's spec says {expected} over {spec.num_layers}")
        offsets.append(spec.chunk_offset(index, 0))
    whole = _bytes(_REGION[kind](host))
    region = whole.view(-1).numpy() if whole.is_contiguous() else None  # a strided buffer is staged
    return PoolPages(name, kind, layout, host.page_size, tuple(view.numpy() for view in views), tuple(offsets),
                     region)
