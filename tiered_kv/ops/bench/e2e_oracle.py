"""Page KV as a pure function of the page key, made and checked on the pool's own device.

The end-to-end loop (``tiered_kv.ops.bench.e2e``) lets its model compute every layer of the tokens
it misses, then writes ``PageOracle`` values over the full pages it computed, so the KV a page
holds depends on its key alone, whichever request or tier produced it, and any page loaded from
L2 or L3 can be checked exactly (``verify``). The model's attention then reads those values (the
recomputed and the loaded prefix alike), so its logits are a function of the prompt alone.

A chunk of (key, component, layer) is a window of one fixed random pool at an offset hashed from
the key: one blake2b per key, the rest is tensor arithmetic, so filling or checking a layer of
hundreds of pages is one gather on the GPU. MHA pools hold numbers (bf16, fp16, fp32), so their pool holds finite
numbers of that type (random bytes would be NaN or Inf now and then, and attention would spread them);
other kinds hold raw random bytes.

Not on any serving path; it must never be used for anything but benchmarks and tests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from ...errors import SpecError
from ...model.spec import KVSpec

_POOL_ELEMENTS = 1 << 23  # 8M elements: 16 MiB of bf16 values, 8 MiB of bytes
_LAYER_STEP = 1_000_003  # offset steps per layer and per component: odd, far apart, below the pool
_COMPONENT_STEP = 7_340_033


#: Element types of MHA pools (whose k / v the model reads as numbers), by the spec's dtype name.
_MHA_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
               "fp32": torch.float32, "float32": torch.float32}


def oracle_dtype(spec: KVSpec) -> torch.dtype:
    """Element type a component of ``spec`` holds: the MHA dtype for k / v, bytes otherwise."""
    if spec.kind == "mha":
        return _MHA_DTYPES.get(dict(spec.dims).get("dtype", ""), torch.uint8)
    return torch.uint8


class PageOracle:
    """The KV of every page of ``spec`` as a function of its key, on ``device``."""

    def __init__(self, spec: KVSpec, device: torch.device | str, *, seed: int = 0x746B76) -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = oracle_dtype(spec)
        item = torch.empty((), dtype=self.dtype).element_size()
        gen = torch.Generator().manual_seed(seed)
        if self.dtype == torch.uint8:
            pool = torch.randint(0, 256, (_POOL_ELEMENTS,), dtype=torch.uint8, generator=gen)
        else:
            pool = (torch.randn(_POOL_ELEMENTS, generator=gen) * 0.5).to(self.dtype)
        self.pool = pool.to(self.device)
        self._elements: list[int] = []
        for c in spec.components:
            if c.bytes_per_layer % item:
                raise SpecError(f"component {c.name!r}: {c.bytes_per_layer} B is no whole number of {self.dtype} elements")
            n = c.bytes_per_layer // item
            if n > _POOL_ELEMENTS // 2:
                raise SpecError(f"component {c.name!r}: {n} elements per chunk, the oracle makes at most {_POOL_ELEMENTS // 2}")
            self._elements.append(n)
        # One row per possible offset (overlapping windows of the pool; a view, no copy).
        self._windows = [self.pool.unfold(0, n, 1) for n in self._elements]
        self._bases: dict[str, int] = {}

    def bases(self, keys: Sequence[str]) -> torch.Tensor:
        """Per key, its offset seed (int64, on the device)."""
        out = []
        for key in keys:
            base = self._bases.get(key)
            if base is None:
                digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
                base = self._bases[key] = int.from_bytes(digest, "little") % _POOL_ELEMENTS
            out.append(base)
        return torch.tensor(out, dtype=torch.int64).to(self.device, non_blocking=True)

    def chunk(self, bases: torch.Tensor, component: int, layer: int) -> torch.Tensor:
        """``uint8 [len(bases), bytes_per_layer]``: the (component, layer) chunk of each page."""
        windows = self._windows[component]
        offsets = (bases + (layer * _LAYER_STEP + component * _COMPONENT_STEP)) % windows.shape[0]
        return windows.index_select(0, offsets).view(torch.uint8)

    def fill(self, device_pool, bases: torch.Tensor, pages: torch.Tensor, layer: int) -> None:
        """Write the oracle's chunks of one layer into ``pages`` (a device int64 tensor)."""
        for ci in range(len(self.spec.components)):
            device_pool.chunk_view(ci, layer).index_copy_(0, pages, self.chunk(bases, ci, layer))

    def check(self, device_pool, keys: Sequence[str], pages: Sequence[int]) -> list[bool]:
        """Per page: whether every component and layer holds exactly the oracle's bytes."""
        if not keys:
            return []
        bases = self.bases(keys)
        index = torch.tensor(list(pages), dtype=torch.int64).to(self.device)
        ok = torch.ones(len(keys), dtype=torch.bool, device=self.device)
        for ci in range(len(self.spec.components)):
            for layer in range(self.spec.num_layers):
                got = device_pool.chunk_view(ci, layer).index_select(0, index)
                ok &= (got == self.chunk(bases, ci, layer)).all(dim=1)
        return ok.tolist()


__all__ = ["PageOracle", "oracle_dtype"]
