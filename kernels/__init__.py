"""Moving pages between a device pool and a host pool.

Everything here works on *chunk views*: 2-D ``uint8`` tensors ``[rows, chunk_bytes]`` whose rows are
pages (or host slots) of one (component, layer), with any row stride and an inner stride of 1.
A copy is a list of ``(src_view, dst_view)`` pairs plus two int64 id tensors: for every pair and
every i, ``dst_view[dst_ids[i]] = src_view[src_ids[i]]``.

This package imports only torch, Triton and the standard library; it never imports the core.
"""

from .reference import copy_pages_reference

__all__ = ["copy_pages_reference"]
