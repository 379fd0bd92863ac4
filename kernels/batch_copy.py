"""Batched copy-engine page copy: every (page, component) row of a call in one memcpy batch.

The ``direct`` path pays a few microseconds of CPU per ``cudaMemcpy2DAsync``, so scattered pages
(one copy per page, component and layer) are more copies than the CPU can issue; ``staged`` avoids
that with a device staging buffer and a kernel, at the price of an extra hop that a single layer
cannot hide. ``cudaMemcpyBatchAsync`` (CUDA 12.8+) hands the copy engines thousands of copies in
one call, so each row goes straight from its host slot to its device page: no SM, no staging, and
the other direction's copy engine stays free for a backup running at the same time.

The work of a call is a *copy list*: three uint64 arrays (destination address, source address,
size), built with numpy from the chunk views' base addresses and row pitches. Rows adjacent on
both sides (a run of pages whose rows are dense on both sides) merge into one copy. On a GPU the
list is one ``cudaMemcpyBatchAsync`` on the given stream; on a machine without CUDA the *same list*
is executed with ``ctypes.memmove``, so the CPU tests check the address arithmetic the GPU relies
on. ``reference.copy_pages_reference`` is the pure torch reference.

This module never synchronises the device and never validates ids (the caller did, on CPU).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from . import cudart
from .owned_streams import kept_stream
from .reference import ChunkPair


@dataclass(frozen=True)
class CopyList:
    """``len(sizes)`` independent copies: ``sizes[k]`` bytes from ``srcs[k]`` to ``dsts[k]``."""

    dsts: np.ndarray  # uint64
    srcs: np.ndarray  # uint64
    sizes: np.ndarray  # uint64

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def nbytes(self) -> int:
        return int(self.sizes.sum())


def plan_copy_list(pairs: Sequence[ChunkPair], src_ids: torch.Tensor, dst_ids: torch.Tensor, *,
                   merge: bool = True) -> CopyList:
    """The copies that move rows ``src_ids`` of every pair's source to rows ``dst_ids`` of its
    destination, rows adjacent on both sides merged (``merge``).

    Args:
        pairs: ``(src, dst)`` uint8 chunk views ``[rows, chunk_bytes]``, any row pitch.
        src_ids, dst_ids: int64 ``[n]`` CPU tensors, already validated.
    """
    src = src_ids.detach().cpu().numpy().astype(np.uint64, copy=False).reshape(-1)
    dst = dst_ids.detach().cpu().numpy().astype(np.uint64, copy=False).reshape(-1)
    if src.shape != dst.shape:
        raise ValueError(f"src_ids has {src.size} ids, dst_ids {dst.size}")
    empty = np.zeros(0, dtype=np.uint64)
    if src.size == 0 or not pairs:
        return CopyList(empty, empty, empty)
    # Rows in source order, so runs of adjacent slots / pages come out adjacent in the list.
    order = np.argsort(src, kind="stable")
    src, dst = src[order], dst[order]
    dsts, srcs, sizes = [], [], []
    for src_view, dst_view in pairs:
        width = src_view.shape[1]
        if dst_view.shape[1] != width:
            raise ValueError(f"pair of chunk views with {width} and {dst_view.shape[1]} bytes per row")
        srcs.append(np.uint64(src_view.data_ptr()) + src * np.uint64(src_view.stride(0)))
        dsts.append(np.uint64(dst_view.data_ptr()) + dst * np.uint64(dst_view.stride(0)))
        sizes.append(np.full(src.size, width, dtype=np.uint64))
    # Pair-major: a pair's rows stay together, so runs of dense rows merge.
    copies = CopyList(np.concatenate(dsts), np.concatenate(srcs), np.concatenate(sizes))
    return merge_copy_list(copies) if merge else copies


def merge_copy_list(copies: CopyList) -> CopyList:
    """``copies`` with each copy that continues the one before it on both sides merged into it."""
    dsts_a, srcs_a, sizes_a = copies.dsts, copies.srcs, copies.sizes
    if len(sizes_a) > 1:
        joins = (srcs_a[:-1] + sizes_a[:-1] == srcs_a[1:]) & (dsts_a[:-1] + sizes_a[:-1] == dsts_a[1:])
        starts = np.flatnonzero(np.concatenate(([True], ~joins)))
        srcs_a, dsts_a = srcs_a[starts], dsts_a[starts]
        sizes_a = np.add.reduceat(sizes_a, starts)
    return CopyList(np.ascontiguousarray(dsts_a), np.ascontiguousarray(srcs_a), np.ascontiguousarray(sizes_a))


def run_copy_list(copies: CopyList, *, stream: torch.cuda.Stream | None = None, on_gpu: bool, flags: int = 0) -> None:
    """Enqueue ``copies`` as one batch on ``stream`` (GPU), or run them now with memmove (CPU)."""
    if len(copies) == 0:
        return
    if on_gpu:
        issue_batch(stream or torch.cuda.current_stream(),
                    lambda handle: cudart.memcpy_batch_async(copies.dsts, copies.srcs, copies.sizes, handle, flags=flags))
        return
    for d, s, n in zip(copies.dsts.tolist(), copies.srcs.tolist(), copies.sizes.tolist()):
        ctypes.memmove(d, s, n)


def issue_batch(stream: torch.cuda.Stream, call) -> None:
    """``call(handle)`` with the ``cudaStream_t`` its batch runs on, in ``stream``'s order. The
    runtime refuses batches on the legacy default stream: there the batch runs
    on a side stream ordered after it, and the default stream is ordered after the batch."""
    if stream.cuda_stream != 0:
        call(stream.cuda_stream)
        return
    side = kept_stream(stream.device)
    side.wait_stream(stream)
    call(side.cuda_stream)
    stream.wait_stream(side)


def available() -> bool:
    """Whether the batched path can run on a GPU here (CUDA runtime 12.8 or later)."""
    return torch.cuda.is_available() and cudart.has_memcpy_batch()


def copy_pages_batch(pairs: Sequence[ChunkPair], src_ids: torch.Tensor, dst_ids: torch.Tensor, *,
                     stream: torch.cuda.Stream | None = None, flags: int = 0) -> int:
    """For every pair and i: ``dst[dst_ids[i]] = src[src_ids[i]]``, in one batch of copies.

    Host views must be pinned when the other side is on a GPU. Returns the number of copies.
    """
    copies = plan_copy_list(pairs, src_ids, dst_ids)
    on_gpu = any(v.device.type == "cuda" for pair in pairs for v in pair)
    if on_gpu and stream is None:
        device = next(v.device for pair in pairs for v in pair if v.device.type == "cuda")
        stream = torch.cuda.current_stream(device)
    run_copy_list(copies, stream=stream, on_gpu=on_gpu, flags=flags)
    return len(copies)

