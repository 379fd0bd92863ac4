"""Runs of adjacent ids: the unit the copy-engine paths issue one copy for.

A copy engine moves one long copy at full speed but pays a few microseconds of CPU and engine
setup per copy, so the copy-engine paths merge pages whose source *and* destination ids are both
consecutive into one (possibly 2-D, pitched) copy. Pure CPU work on CPU id tensors; never touches
a device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Runs:
    """``len(starts_src)`` runs: run k copies rows ``src[s_k : s_k + n_k]`` to ``dst[d_k : d_k + n_k]``."""

    src_starts: np.ndarray  # int64 [runs]
    dst_starts: np.ndarray  # int64 [runs]
    lengths: np.ndarray  # int64 [runs]

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def mean_length(self) -> float:
        return float(self.lengths.mean()) if len(self.lengths) else 0.0


def _numpy_ids(ids: torch.Tensor) -> np.ndarray:
    return ids.detach().cpu().numpy().astype(np.int64, copy=False).reshape(-1)


def _sorted_pairs(src_ids: torch.Tensor, dst_ids: torch.Tensor | None, sort_by: str):
    """The pairs sorted by ``sort_by`` (``dst_ids`` None: the positions ``0..n-1``), and where a
    run breaks between neighbours (bool ``[n-1]``); None for no pairs."""
    src = _numpy_ids(src_ids)
    dst = np.arange(src.size, dtype=np.int64) if dst_ids is None else _numpy_ids(dst_ids)
    if src.shape != dst.shape:
        raise ValueError(f"src_ids has {src.size} ids, dst_ids {dst.size}")
    if src.size == 0:
        return None
    order = np.argsort(dst if sort_by == "dst" else src, kind="stable")
    src, dst = src[order], dst[order]
    return src, dst, (src[1:] - src[:-1] != 1) | (dst[1:] - dst[:-1] != 1)


def find_runs(src_ids: torch.Tensor, dst_ids: torch.Tensor, *, sort_by: str = "dst") -> Runs:
    """Merge ``(src_ids[i], dst_ids[i])`` into maximal runs where both ids step by +1.

    The order of the pairs does not matter to a copy (destinations are unique), so they are first
    sorted by ``sort_by`` (``"dst"`` or ``"src"``) to find the longest runs.

    Args:
        src_ids, dst_ids: int64 ``[n]`` CPU tensors.
    """
    pairs = _sorted_pairs(src_ids, dst_ids, sort_by)
    if pairs is None:
        empty = np.zeros(0, dtype=np.int64)
        return Runs(empty, empty, empty)
    src, dst, breaks_at = pairs
    breaks = np.flatnonzero(breaks_at) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [src.size]))
    return Runs(src[starts], dst[starts], ends - starts)


def mean_run_length(src_ids: torch.Tensor, dst_ids: torch.Tensor | None = None, *, sort_by: str = "dst") -> float:
    """``find_runs(src_ids, dst_ids, sort_by=sort_by).mean_length`` without building the runs
    (``dst_ids`` None: the positions ``0..n-1`` sorted by ``src_ids``, so a run of adjacent ids
    must also be adjacent in the list).

    Path choice asks this of every transfer before its first copy is issued, so on a load's
    critical path: about 8-16 us for 512 ids against 35-40 for ``find_runs`` (numpy, CPU ids).
    """
    pairs = _sorted_pairs(src_ids, dst_ids, "src" if dst_ids is None else sort_by)
    if pairs is None:
        return 0.0
    src, _, breaks_at = pairs
    return src.size / (1 + np.count_nonzero(breaks_at))
