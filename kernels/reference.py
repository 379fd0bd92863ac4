"""The pure torch page copy: the reference every GPU kernel must match, and the CPU path.

``copy_pages_reference(pairs, src_ids, dst_ids)``: for each ``(src, dst)`` pair of chunk views
(``uint8 [rows, chunk_bytes]``, any row stride, inner stride 1) and each i,
``dst[dst_ids[i]] = src[src_ids[i]]``. Works with src and dst on different devices (the gather
happens on the source's device, then one copy crosses over). Ids must already be validated.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ChunkPair = tuple[torch.Tensor, torch.Tensor]


def copy_pages_reference(pairs: Sequence[ChunkPair], src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
    """Copy rows ``src_ids`` of every source view to rows ``dst_ids`` of its destination view.

    Args:
        pairs: ``(src, dst)`` uint8 views ``[rows, chunk_bytes]``; both views of a pair have the
            same ``chunk_bytes``.
        src_ids, dst_ids: int64 tensors of equal length (any device; moved where needed).
    """
    if src_ids.numel() == 0:
        return
    ids_by_device: dict[tuple[torch.device, str], torch.Tensor] = {}

    def ids_on(ids: torch.Tensor, device: torch.device, which: str) -> torch.Tensor:
        key = (device, which)
        if key not in ids_by_device:
            ids_by_device[key] = ids.to(device=device, dtype=torch.int64, non_blocking=True)
        return ids_by_device[key]

    for src, dst in pairs:
        rows = src.index_select(0, ids_on(src_ids, src.device, "src"))
        if rows.device != dst.device:
            rows = rows.to(dst.device)
        dst.index_copy_(0, ids_on(dst_ids, dst.device, "dst"), rows)
