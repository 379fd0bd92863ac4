"""Ids to the device through a ring of pinned host rows, with no pinned allocation per load.

``uva_copy.upload`` packs its tensors into a freshly pinned tensor (torch's caching host
allocator) and copies that: for a load's head, about half a millisecond of the caller's path
before the first launch on the H200's host. A head's kernel tables stay on the device, so it
uploads only its ids, through rows of one pinned tensor allocated once, each copied out on the
current stream.

A row is written again only once the copy out of it has run (its event). When the next row is
still in flight, as when loads are queued faster than their streams drain, the upload falls back to
``uva_copy.upload``: the caller is never blocked on the device. On CPU, and for ids longer than a
row, it is ``uva_copy.upload``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from .uva_copy import unpack, upload

#: Rows in the ring, and int64 ids a row holds (a load of 512 pages: 1,024 ids).
RING_ROWS = 32
ROW_IDS = 1 << 14


class IdsRing:
    """Uploads of int64 ids through preallocated pinned rows (see module docstring)."""

    def __init__(self, device: torch.device | str, rows: int = RING_ROWS, row_ids: int = ROW_IDS) -> None:
        self.device = torch.device(device)
        self._on_gpu = self.device.type == "cuda"
        self._row_ids = row_ids
        self._host = torch.empty((rows, row_ids), dtype=torch.int64, pin_memory=True) if self._on_gpu else None
        self._copied: list[torch.cuda.Event | None] = [None] * rows
        self._next = 0
        self._lock = threading.Lock()  # the caller's thread and library issue threads upload at once
        self.fallbacks = 0  # uploads that went through ``uva_copy.upload`` (row busy or too long)

    def upload(self, parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``parts`` (int64 CPU tensors) on the device, in order, copied on the current stream."""
        sizes = [p.numel() for p in parts]
        total = sum(sizes)
        if not self._on_gpu or total > self._row_ids:
            if self._on_gpu:
                with self._lock:
                    self.fallbacks += 1
            return upload(self.device, parts)
        with self._lock:
            k = self._next
            copied = self._copied[k]
            if copied is not None and not copied.query():
                self.fallbacks += 1
                return upload(self.device, parts)
            self._next = (k + 1) % len(self._copied)
            row = self._host[k, :total]
            start = 0
            for part, size in zip(parts, sizes):
                row[start:start + size].copy_(part.reshape(-1))
                start += size
            packed = row.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))  # the stream the copy went on
            self._copied[k] = event
        return unpack(packed, sizes)


__all__ = ["IdsRing", "RING_ROWS", "ROW_IDS"]
