"""SGLang's device pools seen as tiered-kv's L1: a pool group, a ``KVSpec`` and a ``DevicePool``.

SGLang's own builder (``resolve_hybrid_device_pool_group``) groups the pools a linker moves: for a
DSA (NSA) model the latent pool and the indexer pool, both addressed by the KV pool's indices. Plain
MHA and MLA pools have no builder in SGLang, so they get a group of SGLang's own
``DevicePoolEntry`` here. Every tensor stays the engine's: this module allocates nothing and never
copies a byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...errors import ConfigError
from ...model.device_pool import DeviceBuffer, DevicePool
from ...model.spec import Component, KVSpec


def device_pool_group(kvcache: Any, params: Any, page_size: int, components: set) -> Any:
    """SGLang's pool group for ``kvcache``; plain MHA / MLA pools get one of SGLang's entries."""
    from sglang.srt.mem_cache.hybrid_cache.linker_pool_assembler import (
        DevicePoolEntry,
        DevicePoolGroup,
        _mha_device_pool_entry,
        resolve_hybrid_device_pool_group,
    )
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool, MLATokenToKVPool

    if isinstance(kvcache, DSATokenToKVPool) or type(kvcache) not in (MHATokenToKVPool, MLATokenToKVPool):
        return resolve_hybrid_device_pool_group(kvcache=kvcache, page_size=page_size, params=params,
                                                components=components)
    layers = {layer: layer for layer in range(kvcache.layer_num)}
    if type(kvcache) is MHATokenToKVPool:
        entry = _mha_device_pool_entry(PoolName.KV, kvcache, layers, page_size)
        return DevicePoolGroup([entry], kvcache.layer_num, page_size)
    entry = DevicePoolEntry(name=PoolName.KV, indices_from_pool=PoolName.KV, device_pool=kvcache,
                            components=[kvcache.kv_buffer], layer_mapping=layers, page_size=page_size,
                            rows_are_pages=False)
    return DevicePoolGroup([entry], kvcache.layer_num, page_size, rank_replicated=True)


def _buffer_indices(mapped: int | Sequence[int]) -> list[int]:
    return [mapped] if isinstance(mapped, int) else list(mapped)


def _page_bytes(tensor: torch.Tensor, rows_per_page: int) -> int:
    return tensor.nbytes // tensor.shape[0] * rows_per_page


def spec_and_device_pool(group: Any, kind: str) -> tuple[KVSpec, DevicePool]:
    """One spec component per (pool, buffer of a layer): ``kv_0`` / ``kv_1`` are MHA's K and V,
    ``kv_0`` the MLA / DSA latent, ``indexer_0`` DSA's indexer keys. Every pool must take the KV
    pool's indices unchanged (SWA and Mamba pools keep indices of their own: a ConfigError)."""
    from sglang.srt.mem_cache.hicache_storage import PoolName

    components: list[Component] = []
    buffers: dict[str, DeviceBuffer] = {}
    for entry in group.entries:
        if entry.indices_from_pool != PoolName.KV or entry._index_mapper is not None:
            raise ConfigError(f"the tiered-kv linker moves pools addressed by the KV pool's indices; "
                              f"pool {entry.name.value!r} takes {entry.indices_from_pool.value!r}'s")
        rows_per_page = entry._row_span  # 1: a row is a page (DSA's indexer); page_size: token rows
        widths = {len(_buffer_indices(entry.layer_mapping[layer])) for layer in range(group.num_layers)
                  if layer in entry.layer_mapping}
        if len(widths) != 1 or len(entry.layer_mapping) != group.num_layers:
            # Draft (MTP) layers packed onto some layers, or a pool on some layers only.
            raise ConfigError(f"the tiered-kv linker needs pool {entry.name.value!r} on every one of the "
                              f"{group.num_layers} layers with one buffer set each; its layers map to "
                              f"{dict(entry.layer_mapping)!r:.120}")
        width = widths.pop()
        for position in range(width):
            layers = [entry.kv_buffer[_buffer_indices(entry.layer_mapping[layer])[position]]
                      for layer in range(group.num_layers)]
            name = f"{entry.name.value}_{position}"
            components.append(Component(name, _page_bytes(layers[0], rows_per_page),
                                        f"{layers[0].dtype} {tuple(layers[0].shape[1:])}"))
            buffers[name] = DeviceBuffer(tuple(layers), rows_per_page)
    spec = KVSpec(kind=kind, page_size=group.page_size, layer_start=0, layer_end=group.num_layers,
                  components=tuple(components), dims=(("engine", "sglang"),))
    # SGLang's page 0 holds the padding slot: no load may write it.
    return spec, DevicePool(spec, buffers, reserved_pages=[0])


def device_page_ids(indices: torch.Tensor, page_size: int) -> list[int]:
    """SGLang's token indices (whole, aligned pages) as page ids."""
    tokens = indices.detach().to(device="cpu", dtype=torch.int64).flatten()
    if tokens.numel() % page_size:
        raise ConfigError(f"{tokens.numel()} device indices are no whole number of {page_size}-token pages")
    starts = tokens.reshape(-1, page_size)[:, 0]
    if bool(torch.any(starts.remainder(page_size))):
        raise ConfigError("device indices must start pages (multiples of the page size)")
    return (starts // page_size).tolist()
