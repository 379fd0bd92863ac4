"""Copy-engine page copy: runs of adjacent pages merged into one (2-D, pitched) memcpy each.

No SM is used: the GPU's copy engines move the bytes, which is what lets a load and a backup run
at the same time at nearly twice one direction's bandwidth. The cost is per copy (a few
microseconds of CPU and engine setup), so this path pays off only when source and destination
ids form long runs; with scattered pages it degenerates to one copy per page and layer.

For each run and each ``(src, dst)`` pair one ``cudaMemcpy2DAsync`` (width = chunk bytes,
height = run length, pitches = the views' row strides) is enqueued on the given stream. When no
view is on a GPU the same runs are copied with torch on the CPU (the path CI exercises).

This module must never synchronise the device, nor validate ids (the caller did, on CPU).
``reference.copy_pages_reference`` is the pure torch reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import cudart
from .reference import ChunkPair
from .runs import Runs, find_runs


def copy_pages_direct(
    pairs: Sequence[ChunkPair],
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    *,
    stream: torch.cuda.Stream | None = None,
    runs: Runs | None = None,
) -> int:
    """For every pair and i: ``dst[dst_ids[i]] = src[src_ids[i]]``, one copy per run and pair.

    Args:
        pairs: ``(src, dst)`` uint8 chunk views ``[rows, chunk_bytes]``; host views pinned.
        src_ids, dst_ids: int64 ``[n]`` CPU tensors, already validated.
        stream: where the copies go (default: the current stream of the GPU side).
        runs: ``find_runs(src_ids, dst_ids)`` if the caller already has it.

    Returns:
        The number of copies enqueued.
    """
    if runs is None:
        runs = find_runs(src_ids, dst_ids)
    if len(runs) == 0 or not pairs:
        return 0
    on_gpu = any(v.device.type == "cuda" for pair in pairs for v in pair)
    if not on_gpu:
        for src, dst in pairs:
            for s, d, n in zip(runs.src_starts.tolist(), runs.dst_starts.tolist(), runs.lengths.tolist()):
                dst[d : d + n].copy_(src[s : s + n])
        return len(runs) * len(pairs)
    if stream is None:
        device = next(v.device for pair in pairs for v in pair if v.device.type == "cuda")
        stream = torch.cuda.current_stream(device)
    handle = stream.cuda_stream
    src_starts, dst_starts, lengths = runs.src_starts.tolist(), runs.dst_starts.tolist(), runs.lengths.tolist()
    for src, dst in pairs:
        width = src.shape[1]
        src_base, src_pitch = src.data_ptr(), src.stride(0)
        dst_base, dst_pitch = dst.data_ptr(), dst.stride(0)
        for s, d, n in zip(src_starts, dst_starts, lengths):
            cudart.memcpy_2d_async(dst_base + d * dst_pitch, dst_pitch, src_base + s * src_pitch, src_pitch, width, n, handle)
    return len(runs) * len(pairs)

