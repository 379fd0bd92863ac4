"""Staged page copy: copy engines on the host side, a UVA kernel on the device side.

Device pages of a transfer are usually scattered (the engine's allocator hands them out) while host
slots come in long runs (the host pool allocates runs). A copy engine moves long host runs at the
full PCIe rate without using an SM, but needs a dense or pitched device buffer on the other side;
a UVA kernel handles scattered device pages but reads host memory more slowly than a copy engine.
So this path does both halves with the tool that suits it:

    load   (host -> device):  host runs --copy engine--> staging buffer --kernel scatter--> pages
    backup (device -> host):  pages --kernel gather--> staging buffer --copy engine--> host runs

The staging ring is a few device buffers; units (a block of pages x a group of (component, layer)
pairs) take buffers in turn, so the copy engine fills unit k+1 while the kernel drains unit k.
Events order everything: each unit's consumer waits on a "ready" event of its producer, and the
next producer of a buffer waits on the "free" event of its last consumer. HBM is ~80x faster than
PCIe, so the device half costs a few percent of one SM budget's time.

This module never synchronises the device and never validates ids. On a machine without CUDA the
same code runs with CPU buffers and no streams (the path CI exercises).
``copy_pages_staged_reference`` is the pure torch reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import numpy as np
import torch

from .direct_copy import copy_pages_direct
from .reference import ChunkPair, copy_pages_reference
from .runs import find_runs
from .uva_copy import DEFAULT_CTAS_ON_DEVICE, copy_pages_uva

#: Default ring: two 32 MiB buffers hold one DeepSeek-V3.2 layer (latent + indexer) of 512 pages
#: each (25.8 MB), so a layer is one unit.
DEFAULT_BUFFER_BYTES = 32 << 20
DEFAULT_NUM_BUFFERS = 2
_REGION_ALIGN = 256  # staging regions start 256-B aligned, so the kernel keeps 16-B vectors


class StagedCopier:
    """Owns a ring of device staging buffers and moves pages through it.

    Use one copier per direction (one for loads, one for backups) so the two never wait on each
    other's buffers. All methods enqueue work and return at once.
    """

    def __init__(
        self,
        device: torch.device | str,
        *,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        num_buffers: int = DEFAULT_NUM_BUFFERS,
        num_ctas: int = DEFAULT_CTAS_ON_DEVICE,
    ) -> None:
        if buffer_bytes <= 0 or num_buffers <= 0:
            raise ValueError(f"staging needs buffer_bytes > 0 and num_buffers > 0, got {buffer_bytes}, {num_buffers}")
        self.device = torch.device(device)
        self.buffer_bytes = buffer_bytes
        self.num_ctas = num_ctas
        self._buffers = [torch.empty(buffer_bytes, dtype=torch.uint8, device=self.device) for _ in range(num_buffers)]
        self._free: list[torch.cuda.Event | None] = [None] * num_buffers
        self._next = 0
        self._on_gpu = self.device.type == "cuda"

    # --- public ----------------------------------------------------------------------------------
    def to_device(
        self,
        pairs: Sequence[ChunkPair],
        host_ids: torch.Tensor,
        device_ids: torch.Tensor,
        *,
        copy_stream: torch.cuda.Stream | None = None,
        kernel_stream: torch.cuda.Stream | None = None,
    ) -> None:
        """Load: for every ``(host_view, device_view)`` pair and i, ``device[device_ids[i]] = host[host_ids[i]]``.

        Completion is ordered on ``kernel_stream`` (record an event there after this call).
        Args: views ``uint8 [rows, chunk_bytes]``; ids int64 ``[n]`` on the CPU, validated.
        """
        self._run(pairs, host_ids, device_ids, to_device=True, copy_stream=copy_stream, kernel_stream=kernel_stream)

    def to_host(
        self,
        pairs: Sequence[ChunkPair],
        device_ids: torch.Tensor,
        host_ids: torch.Tensor,
        *,
        copy_stream: torch.cuda.Stream | None = None,
        kernel_stream: torch.cuda.Stream | None = None,
    ) -> None:
        """Backup: for every ``(device_view, host_view)`` pair and i, ``host[host_ids[i]] = device[device_ids[i]]``.

        Completion is ordered on ``copy_stream`` (record an event there after this call).
        """
        self._run(pairs, host_ids, device_ids, to_device=False, copy_stream=copy_stream, kernel_stream=kernel_stream)

    # --- internals -------------------------------------------------------------------------------
    def _units(self, pairs: Sequence[ChunkPair], num_rows: int) -> list[tuple[list[int], int, int]]:
        """Split (rows x pairs) into units that fit one buffer: (pair indices, first row, end row)."""
        chunks = [pair[0].shape[1] for pair in pairs]
        padded = [-(-c // _REGION_ALIGN) * _REGION_ALIGN for c in chunks]
        max_chunk = max(padded)
        if max_chunk > self.buffer_bytes:
            raise ValueError(f"a {max_chunk}-byte chunk does not fit a {self.buffer_bytes}-byte staging buffer")
        rows_per_block = min(num_rows, self.buffer_bytes // max_chunk)
        units = []
        for r0 in range(0, num_rows, rows_per_block):
            r1 = min(num_rows, r0 + rows_per_block)
            group: list[int] = []
            used = 0
            for index, size in enumerate(padded):
                need = -(-(r1 - r0) * size // _REGION_ALIGN) * _REGION_ALIGN
                if group and used + need > self.buffer_bytes:
                    units.append((group, r0, r1))
                    group, used = [], 0
                group.append(index)
                used += need
            units.append((group, r0, r1))
        return units

    def _run(self, pairs, host_ids, device_ids, *, to_device, copy_stream, kernel_stream) -> None:
        if host_ids.numel() != device_ids.numel():
            raise ValueError(f"host_ids has {host_ids.numel()} ids, device_ids {device_ids.numel()}")
        if host_ids.numel() == 0 or not pairs:
            return
        if self._on_gpu and (copy_stream is None or kernel_stream is None):
            raise ValueError("staged copies on a GPU need an explicit copy_stream and kernel_stream")
        # Stage rows in host order, so consecutive host slots become one copy-engine copy.
        host_np = host_ids.cpu().numpy().astype(np.int64, copy=False)
        order = np.argsort(host_np, kind="stable")
        host_sorted = torch.from_numpy(host_np[order])
        device_sorted = torch.from_numpy(device_ids.cpu().numpy().astype(np.int64, copy=False)[order])
        for group, r0, r1 in self._units(pairs, host_sorted.numel()):
            self._unit([pairs[i] for i in group], host_sorted[r0:r1], device_sorted[r0:r1], to_device, copy_stream, kernel_stream)

    def _unit(self, pairs, host_ids, device_ids, to_device, copy_stream, kernel_stream) -> None:
        rows = host_ids.numel()
        slot = self._next
        self._next = (slot + 1) % len(self._buffers)
        buffer = self._buffers[slot]
        producer, consumer = (copy_stream, kernel_stream) if to_device else (kernel_stream, copy_stream)
        if self._free[slot] is not None:
            producer.wait_event(self._free[slot])
        stage_rows = torch.arange(rows, dtype=torch.int64)
        runs = find_runs(host_ids, stage_rows, sort_by="src")
        host_side, device_side, offset = [], [], 0
        for pair in pairs:
            host_view, device_view = (pair[0], pair[1]) if to_device else (pair[1], pair[0])
            chunk = host_view.shape[1]
            stage = buffer[offset : offset + rows * chunk].view(rows, chunk)
            offset += -(-rows * chunk // _REGION_ALIGN) * _REGION_ALIGN
            host_side.append((host_view, stage) if to_device else (stage, host_view))
            device_side.append((stage, device_view) if to_device else (device_view, stage))
        if to_device:
            self._engine_copies(host_side, runs, stage_rows, copy_stream)
            self._handoff(copy_stream, kernel_stream)
            self._kernel(device_side, stage_rows, device_ids, kernel_stream)
        else:
            self._kernel(device_side, device_ids, stage_rows, kernel_stream)
            self._handoff(kernel_stream, copy_stream)
            flipped = find_runs(stage_rows, host_ids, sort_by="src")
            self._engine_copies(host_side, flipped, stage_rows, copy_stream)
        if self._on_gpu:
            free = torch.cuda.Event()
            free.record(consumer)
            self._free[slot] = free

    def _engine_copies(self, pairs, runs, ids, stream) -> None:
        copy_pages_direct(pairs, ids, ids, stream=stream, runs=runs)

    def _kernel(self, pairs, src_ids, dst_ids, stream) -> None:
        with torch.cuda.stream(stream) if self._on_gpu else nullcontext():
            copy_pages_uva(pairs, src_ids, dst_ids, num_ctas=self.num_ctas)

    def _handoff(self, producer, consumer) -> None:
        if self._on_gpu:
            ready = torch.cuda.Event()
            ready.record(producer)
            consumer.wait_event(ready)


def copy_pages_staged_reference(pairs: Sequence[ChunkPair], src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
    """Pure torch reference of a staged copy: ``dst[dst_ids[i]] = src[src_ids[i]]`` for every pair."""
    copy_pages_reference(pairs, src_ids, dst_ids)
