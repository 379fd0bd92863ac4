"""Page bytes as a pure function of (key, component, layer): every hit anywhere can be checked.

The replay's "prefill" writes ``oracle_bytes`` into the engine's L1 pages; whatever tier a hit comes
back from, its bytes on L1 are compared with the same function (``verify_pages``). A page whose
latent and indexer came from different writes, another request's page or a corrupted record shows
up as a wrong page. Used by the replay and the tests; not on any serving path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch

from ..errors import SpecError


_POOL_BYTES = 1 << 25  # 32 MiB of fixed random bytes; a chunk is a slice of it
_pool: np.ndarray | None = None


def _random_pool() -> np.ndarray:
    global _pool
    if _pool is None:
        _pool = np.random.Generator(np.random.PCG64(0x746B76)).integers(0, 256, _POOL_BYTES, dtype=np.uint8)
        _pool.flags.writeable = False
    return _pool


def oracle_bytes(key: str, component: int, layer: int, nbytes: int) -> np.ndarray:
    """``nbytes`` pseudo-random bytes determined by the page key, component and layer.

    A read-only slice of one fixed random buffer at an offset hashed from (key, component, layer):
    as unpredictable as fresh random bytes for catching a page of another key or layer, another
    write or a flipped byte, but free to make, so a replay's "prefill" costs a memcpy per chunk.
    """
    pool = _random_pool()
    if nbytes > pool.size // 2:
        raise SpecError(f"oracle chunks are at most {pool.size // 2} bytes, got {nbytes}")
    digest = hashlib.blake2b(f"{key}/{component}/{layer}".encode(), digest_size=8).digest()
    offset = int.from_bytes(digest, "little") % (pool.size - nbytes)
    return pool[offset:offset + nbytes]


def fill_pages(device_pool, keys: Sequence[str], pages: Sequence[int]) -> None:
    """Write each key's oracle bytes into its device page (every component and layer)."""
    spec = device_pool.spec
    for ci, comp in enumerate(spec.components):
        for layer in range(spec.num_layers):
            view = device_pool.chunk_view(ci, layer)
            for key, page in zip(keys, pages):
                view[page].copy_(torch.from_numpy(oracle_bytes(key, ci, layer, comp.bytes_per_layer).copy()))


def verify_pages(device_pool, keys: Sequence[str], pages: Sequence[int]) -> list[bool]:
    """Per page: whether every byte of every component and layer equals the key's oracle bytes."""
    spec = device_pool.spec
    ok = [True] * len(keys)
    for ci, comp in enumerate(spec.components):
        for layer in range(spec.num_layers):
            view = device_pool.chunk_view(ci, layer)
            for i, (key, page) in enumerate(zip(keys, pages)):
                if ok[i]:
                    got = view[page].cpu().numpy()
                    ok[i] = bool(np.array_equal(got, oracle_bytes(key, ci, layer, comp.bytes_per_layer)))
    return ok


__all__ = ["fill_pages", "oracle_bytes", "verify_pages"]
