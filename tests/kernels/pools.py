"""Pools shaped like real engines for the kernel tests, and a byte-for-byte copy checker.

Device pools are built here (not with ``allocate_engine_like``) so the tests keep the raw tensors
and can check that every byte outside the copied rows is untouched, and so they cover engine
layouts with unusual page strides: SGLang (token-indexed latent, indexer with spare pages) and
vLLM (k and v stacked in one ``[blocks, 2, ...]`` tensor, page stride twice the chunk).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tiered_kv import Component, DeviceBuffer, DevicePool, HostPool, KVSpec, mha_spec, mla_spec, nsa_spec


def small_specs() -> dict[str, KVSpec]:
    """Small specs of every kind, plus one whose sizes are not multiples of 4 (byte-word path)."""
    odd = KVSpec(kind="odd", page_size=1, layer_start=0, layer_end=2,
                 components=(Component("a", 100), Component("b", 37)))
    return {
        "nsa": nsa_spec(num_layers=3, page_size=4),
        "mla": mla_spec(2, 4),
        "mha": mha_spec(2, 4, 2, 16),
        "odd": odd,
    }


@dataclass
class DeviceSide:
    pool: DevicePool
    roots: list[torch.Tensor]  # every byte the pool's tensors own, as flat uint8 tensors


def random_fill(tensors: Sequence[torch.Tensor]) -> None:
    """Fresh random bytes (drawn on the GPU when there is one: GBs of pinned pool fill fast)."""
    source = "cuda" if torch.cuda.is_available() else "cpu"
    step = 1 << 28
    for t in tensors:
        flat = t.view(torch.uint8).view(-1) if t.dtype != torch.uint8 else t.view(-1)
        for start in range(0, flat.numel(), step):
            part = flat[start:start + step]
            part.copy_(torch.randint(0, 256, part.shape, dtype=torch.uint8, device=source))


def make_device_pool(spec: KVSpec, num_pages: int, device: str | torch.device = "cpu") -> DeviceSide:
    """An engine-like pool: SGLang-style for NSA/MLA/odd, vLLM-style stacked k/v for MHA."""
    buffers: dict[str, DeviceBuffer] = {}
    roots: list[torch.Tensor] = []
    layers = spec.num_layers
    if spec.kind == "mha":
        k_layers, v_layers = [], []
        for _ in range(layers):
            kv = torch.empty(num_pages, 2, spec.components[0].bytes_per_layer, dtype=torch.uint8, device=device)
            roots.append(kv.view(-1))
            k_layers.append(kv[:, 0])
            v_layers.append(kv[:, 1])
        buffers = {"k": DeviceBuffer.page_indexed(k_layers), "v": DeviceBuffer.page_indexed(v_layers)}
    else:
        for i, c in enumerate(spec.components):
            tensors = []
            for _ in range(layers):
                if i == 0 and c.bytes_per_layer % spec.page_size == 0:
                    t = torch.empty(num_pages * spec.page_size, 1, c.bytes_per_layer // spec.page_size, dtype=torch.uint8, device=device)
                else:  # page-indexed, with spare pages beyond the pool (SGLang's indexer has some)
                    t = torch.empty(num_pages + 3, c.bytes_per_layer, dtype=torch.uint8, device=device)
                roots.append(t.view(-1))
                tensors.append(t)
            rows = spec.page_size if tensors[0].dim() == 3 else 1
            buffers[c.name] = DeviceBuffer(tuple(tensors), rows)
    random_fill(roots)
    return DeviceSide(DevicePool(spec, buffers, reserved_pages=(0,)), roots)


def make_host_pool(spec: KVSpec, num_slots: int, layout: str) -> HostPool:
    pool = HostPool(spec, num_slots, layout)
    random_fill([pool.buffer])
    return pool


def random_ids(count: int, low: int, high: int) -> torch.Tensor:
    """``count`` distinct ids from ``[low, high)`` in random order."""
    return (torch.randperm(high - low)[:count] + low).to(torch.int64)


def adjacent_ids(count: int, low: int, high: int) -> torch.Tensor:
    """``count`` ids in a few runs of adjacent ids, shuffled (what a run allocator hands out)."""
    ids: list[int] = []
    free = list(range(low, high))
    while len(ids) < count:
        run = int(torch.randint(1, 6, ()).item())
        start = int(torch.randint(0, len(free), ()).item())
        take = [x for x in free[start:start + run]][: count - len(ids)]
        ids += take
        free = [x for x in free if x not in take]
    order = torch.randperm(len(ids))
    return torch.tensor(ids, dtype=torch.int64)[order]


def spans(views: Sequence[torch.Tensor]) -> list[tuple[int, int]] | None:
    """The staging ring's spans of ``views`` (``staged_copy._spans_of``): their bytes as maximal
    contiguous pieces of a row, or None where they share no pitch or overlap."""
    from tiered_kv.kernels.staged_copy import _spans_of

    return _spans_of([(v.data_ptr(), v.stride(0), v.shape[1]) for v in views])


def _root_of(view: torch.Tensor, roots: Sequence[torch.Tensor]) -> tuple[int, torch.Tensor]:
    for i, root in enumerate(roots):
        start = root.data_ptr()
        if root.device == view.device and start <= view.data_ptr() < start + root.numel():
            return i, root
    raise AssertionError("view lies in none of the given roots")


def check_copy(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    dst_roots: Sequence[torch.Tensor],
    run: Callable[[], None],
) -> None:
    """Poison every destination byte, run the copy, then check it byte for byte.

    Copied rows must equal their source rows; every other byte of ``dst_roots`` must keep its
    poison.
    """
    random_fill(dst_roots)  # fresh poison each run
    before = [root.clone() for root in dst_roots]
    expected = [src.index_select(0, src_ids.to(src.device)).cpu() for src, _ in pairs]
    written = [torch.zeros(root.shape, dtype=torch.bool) for root in dst_roots]
    for _, dst in pairs:
        i, root = _root_of(dst, dst_roots)
        mask = torch.as_strided(written[i], dst.shape, dst.stride(), dst.data_ptr() - root.data_ptr())
        mask[dst_ids] = True
    run()
    if torch.cuda.is_available():  # copies into host memory run on the device too
        torch.cuda.synchronize()
    for (_src, dst), rows in zip(pairs, expected):
        got = dst.index_select(0, dst_ids.to(dst.device)).cpu()
        assert torch.equal(got, rows), f"copied rows differ ({int((got != rows).sum())} bytes)"
    for root, old, mask in zip(dst_roots, before, written):
        changed = root.cpu() != old.cpu()
        assert not bool((changed & ~mask).any()), "bytes outside the copied rows changed"
