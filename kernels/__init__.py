"""Moving pages between a device pool and a host pool.

Everything here works on *chunk views*: 2-D ``uint8`` tensors ``[rows, chunk_bytes]`` whose rows are
pages (or host slots) of one (component, layer), with any row stride and an inner stride of 1.
A copy is a list of ``(src_view, dst_view)`` pairs plus two int64 id tensors: for every pair and
every i, ``dst_view[dst_ids[i]] = src_view[src_ids[i]]``.

Paths, each beside its torch reference:
    reference     pure torch (index_select / index_copy_): the contract, and the CPU path
    uva_copy      Triton kernel reading / writing pinned host memory directly (UVA)
    direct_copy   copy engines, one (2-D) memcpy per run of adjacent pages
    batch_copy    copy engines, every row of a call in one cudaMemcpyBatchAsync
    staged_copy   copy engines for host runs + the UVA kernel for scattered device pages

This package imports only torch, numpy, Triton and the standard library, and never the core.
Triton is imported on first use of a kernel path, so the core still imports where it is missing.
"""

from importlib import import_module

from .reference import copy_pages_reference

_LAZY = {
    "copy_pages_direct": "direct_copy",
    "copy_pages_batch": "batch_copy",
    "Runs": "runs",
    "find_runs": "runs",
    "mean_run_length": "runs",
    "StagedCopier": "staged_copy",
    "UvaPlan": "uva_copy",
    "copy_pages_uva": "uva_copy",
    "plan_uva_copy": "uva_copy",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["copy_pages_reference", *_LAZY]
