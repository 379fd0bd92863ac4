"""Staged page copy: copy engines on the host side, a UVA kernel on the device side.

Device pages of a transfer are usually scattered (the engine's allocator hands them out) while host
slots come in long runs (the host pool allocates runs). A copy engine moves long host runs at the
full PCIe rate without using an SM, but needs a dense or pitched device buffer on the other side;
a UVA kernel handles scattered device pages but reads host memory more slowly than a copy engine.
So this path does both steps with the tool that suits it:

    load   (host -> device):  host runs --copy engine--> staging buffer --kernel scatter--> pages
    backup (device -> host):  pages --kernel gather--> staging buffer --copy engine--> host runs

The staging ring is a few device buffers; units (a block of rows x a group of (component, layer)
pairs) take buffers in turn, so the copy engine fills unit k+1 while the kernel drains unit k.
Each unit's consumer waits on a "ready" event of its producer, and the next producer of a buffer
waits on the "free" event of its last consumer (events are per buffer and re-recorded: a wait
binds to the record that precedes it). When a unit's host views share one row pitch (``page_first``
slots), staging mirrors the contiguous pieces they cover in each row and one copy per run and
piece moves them: for all layers that is the whole slot payload, for a block of adjacent layers
one latent and one indexer piece; wide rows, which copy engines stream at full rate (also while
the other direction is busy), instead of one 42 KB and one 8 KB row per slot and layer.

A unit of many host copies of few rows each (scattered slots: one row per slot and piece;
``layer_first`` runs: one dense copy per run and pair; ``page_first`` runs of up to
``BATCH_MAX_MEAN_ROWS`` slots: a pitched copy of that many rows) goes to the copy engines as one
``cudaMemcpyBatchAsync`` per unit instead of one ``cudaMemcpy2DAsync`` each: about 1.3 us of CPU
per row of the batch against about 21 us per 2-D call, and the copy engines run a 2-D op of narrow
rows slower than the same rows as 1-D copies (docs/benchmarks.md, "Transfers on the H200").
``host_batch`` (per copier) forces it on or off; on CPU the same copy list runs through
``memmove``, so CI checks its addresses.

CPU cost matters as much as bytes: everything a call's kernels need (tables, ids) goes to the
device in one pinned copy (one per wave with ``first_wave``: the first groups are planned, sent
and enqueued before the rest are planned, so they copy meanwhile), so a unit costs one launch, a
few copies and a few event operations. A unit's kernel table depends only on its ring slot, pairs
and staging layout, so the ring keeps each list of views' geometry and tables, their device copies
too (``_Geometry``, views held weakly): once a list's tables are known, a call uploads only its
ids, which brings a staged backup's first gather about 0.6 ms closer to the call. Only layouts that
do not follow the call's size are kept (spans, and full dense units): a dense unit of fewer rows,
as every unit of a ``layer_first`` call smaller than one unit is, gets its table built per call, so
calls of ever new sizes neither keep memory nor churn the kept tables.
Planning is numpy, per group of pairs: the call's runs are cut at unit boundaries at once, and a
unit's host copies are a slice of one int64 table (a row per span or pair and piece of a run);
copy lists and the ``cudaMemcpy2DAsync`` loop read those tables, so scattered slots (hundreds of
runs) cost microseconds per unit, not per run.
This module never synchronises the device and never validates ids. On a machine without CUDA the
same code runs with CPU buffers and no streams (the path CI exercises).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import weakref
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from . import cudart
from .reference import ChunkPair
from .owned_streams import StreamLease
from .streams import on_stream
from .uva_copy import DEFAULT_CTAS_ON_DEVICE, UvaPlan, launch_uva, upload

#: Default ring: two 32 MiB buffers hold one DeepSeek-V3.2 layer (latent + indexer) of 512 pages
#: each (25.8 MB), so a per-layer load is one unit.
DEFAULT_BUFFER_BYTES = 32 << 20
DEFAULT_NUM_BUFFERS = 2
_REGION_ALIGN = 256  # staging regions start 256-B aligned, so the kernel keeps 16-B vectors
#: Device-side gather / scatter tiles: HBM latency, not PCIe, bounds these programs, so each one
#: keeps 64 KiB in flight per step (4x the UVA default) to do its share with few CTAs.
STAGING_BLOCK = 16384
STAGING_NUM_WARPS = 16
#: A unit's host copies go out as one memcpy batch (when ``host_batch`` is None) when there are at
#: least ``BATCH_MIN_COPIES`` of them (loads; ``BATCH_MIN_COPIES_TO_HOST`` for backups) and they
#: hold at most ``BATCH_MAX_MEAN_ROWS`` 1-D copies per copy on average (``_batch_rows``: a dense
#: copy is one, however many rows): where one 2-D call per copy costs more CPU than the copy
#: engines need to move it, or where the copy engines run a 2-D op of narrow rows slower than the
#: same rows as 1-D copies. On the H200 (docs/benchmarks.md, "Transfers on the H200") a mean of up
#: to 64 rows batched took ``page_first`` loads from slots in short runs from 85% to 94-95% of the
#: ceiling, and a minimum of 4 copies did the same for ``layer_first`` runs of 64 (7-8 dense runs
#: a layer). Backups are issued on the caller's thread, where a batch of a few copies costs more
#: CPU than their 2-D calls, so they batch from 16 copies on.
BATCH_MIN_COPIES = 4
BATCH_MIN_COPIES_TO_HOST = 16
BATCH_MAX_MEAN_ROWS = 64
#: Lists of pairs whose geometry (``_Geometry``) a ring keeps, the least recently used dropped:
#: an engine's backups pass one list, its loads a group per layer or block of layers (a serving
#: engine whose loads cut ever other blocks would cycle through them: planned per call, no harm).
GEOMETRIES_KEPT = 256
#: Tables a geometry keeps: one per ring slot and unit layout that does not follow the call's size
#: (a ``layer_first`` backup larger than one unit has up to 61 such layouts per slot; a short unit's
#: table is never kept), the least recently used dropped. A table is 40 bytes per pair.
TABLES_KEPT = 1024


def _round(value: int) -> int:
    return -(-value // _REGION_ALIGN) * _REGION_ALIGN


#: Columns of a unit's host-copy table (``_Unit.host_copies``).
_HOST, _HOST_PITCH, _OFFSET, _STAGE_PITCH, _WIDTH, _HEIGHT, _VIEW = range(7)
#: Up to this many copies per group, its table is built row by row in Python (see ``_units``).
_SMALL_TABLE = 32


@dataclass
class _Unit:
    pairs: list[int]  # indices into the call's pairs
    r0: int  # rows [r0, r1) of the call's rows, sorted by host id
    r1: int
    # int64 [copies, 7], one 2-D copy per row (columns ``_HOST``...): host addr, host pitch,
    # staging offset, staging pitch, width, height, and an index into ``host_views`` of a view in
    # the same memory (the CPU path turns the address back into a tensor view through it). Numpy
    # columns, not tuples: scattered slots are thousands of copies per call.
    host_copies: np.ndarray
    stage_views: list[tuple[int, int, int]]  # per pair: (staging offset, staging pitch, chunk)
    host_views: Sequence[torch.Tensor]
    bases: int = 1  # host_copies is [bases, pieces] flattened base-major (see ``_units``)
    # What its staging offsets were laid out for: 0 for spans (the same for any rows), a full unit's
    # row count for dense blocks, None for a dense unit of fewer rows (its offsets, so its kernel
    # table, follow the call's size). With the slot and pairs it names a table the ring keeps.
    stage_rows: int | None = 0


@dataclass
class _KeptTable:
    """A unit table's kernel plan and, once uploaded, its device copy and the event after the upload
    (``landed``; None on CPU), with the streams already made to wait for it."""

    plan: UvaPlan
    device: torch.Tensor | None = None
    landed: torch.cuda.Event | None = None
    waited: list = field(default_factory=list)


@dataclass
class _Geometry:
    """What the ring needs of one list of pairs besides the ids, kept across calls
    (``StagedCopier._geometry_of``): the host views' ``(address, row pitch, width)``, the device
    views' offsets from the staging storage and row pitches, and the tables built for them.
    Reading a view's address and pitch is a torch call each: a 61-layer backup's geometry and
    tables are over a millisecond of the caller's thread before its first gather."""

    views: tuple  # weak references to every pair's views in order (the key is their ids)
    info: tuple[tuple[int, int, int], ...]
    device_offsets: np.ndarray  # int64 [pairs]
    device_pitches: np.ndarray
    # (slot, first pair, pairs, ``_Unit.stage_rows``) -> _KeptTable, the least recently used dropped;
    # only layouts that do not follow a call's size (``StagedCopier._plan_wave``)
    tables: OrderedDict = field(default_factory=OrderedDict)


@dataclass(frozen=True)
class _SpanLayout:
    """Staging rows of views that stage as spans (``_span_layout``): the spans, the staging row
    pitch, a base copy row per span and each view's ``(staging offset, staging pitch, width)``."""

    spans: list[tuple[int, int]]
    stage_pitch: int
    bases: list[tuple[int, ...]]
    stage_views: list[tuple[int, int, int]]


@functools.lru_cache(maxsize=512)
def _span_layout(info: tuple[tuple[int, int, int], ...], buffer_bytes: int) -> _SpanLayout | None:
    """How views given as ``(address, row pitch, width)`` stage as spans in ``buffer_bytes``
    buffers, or None (no common pitch, overlap, or a staging row wider than a buffer). Kept per
    ``info``: it depends on nothing else, and a 61-layer backup's 122 views cost about 0.15 ms of
    Python each call."""
    spans = _spans_of(info)
    if spans is None:
        return None
    columns = list(itertools.accumulate((_round(width) for _, width in spans), initial=0))
    stage_pitch = columns[-1]
    if stage_pitch > buffer_bytes:
        return None
    pitch = info[0][1]
    span_starts = [start for start, _ in spans]
    bases = [(start, pitch, column, stage_pitch, width, 0, 0) for (start, width), column in zip(spans, columns)]
    # Each view's staging column: its span's plus its place in the span.
    stage_views = []
    for ptr, _, width in info:
        j = bisect.bisect_right(span_starts, ptr) - 1
        stage_views.append((columns[j] + ptr - span_starts[j], stage_pitch, width))
    return _SpanLayout(spans, stage_pitch, bases, stage_views)


def _spans_of(info: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]] | None:
    """The bytes of views given as ``(address, row pitch, width)`` as maximal contiguous pieces of
    a row, ``[(address, width), ...]``, if they share one row pitch and do not overlap (else None).

    ``page_first`` views of one slot do: all layers of all components tile the payload (one
    piece: whole-slot rows), and a block of adjacent layers is one latent and one indexer piece.
    """
    pitch = info[0][1]
    if any(p != pitch for _, p, _ in info):
        return None
    spans: list[list[int]] = []
    for start, _, size in sorted(info):
        if spans and start < spans[-1][0] + spans[-1][1]:
            return None  # overlapping views
        if spans and start == spans[-1][0] + spans[-1][1]:
            spans[-1][1] += size
        else:
            spans.append([start, size])
    if spans[-1][0] + spans[-1][1] - spans[0][0] > pitch:
        return None
    return [(start, width) for start, width in spans]


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
        host_batch: bool | None = None,
        streams: StreamLease | None = None,
    ) -> None:
        if buffer_bytes <= 0 or num_buffers <= 0:
            raise ValueError(f"staging needs buffer_bytes > 0 and num_buffers > 0, got {buffer_bytes}, {num_buffers}")
        self.device = torch.device(device)
        self.buffer_bytes = _round(buffer_bytes) if buffer_bytes >= _REGION_ALIGN else buffer_bytes
        self.num_ctas = num_ctas
        #: Host copies as one memcpy batch per unit: True, False, or None (short runs on a GPU
        #: whose runtime has batched copies, see ``BATCH_MIN_COPIES``).
        self.host_batch = host_batch
        self.block, self.num_warps = STAGING_BLOCK, STAGING_NUM_WARPS
        self._on_gpu = self.device.type == "cuda"
        # The ring's own streams (its upload stream) come from its owner's lease, else its own.
        self._streams = streams
        self._storage = torch.empty(self.buffer_bytes * num_buffers, dtype=torch.uint8, device=self.device)
        self._anchors: dict[int, torch.Tensor] = {}  # ``_anchor``: word size -> view of the storage
        self._num_buffers = num_buffers
        self._next = 0
        self._ready = [torch.cuda.Event() for _ in range(num_buffers)] if self._on_gpu else []
        self._free = [torch.cuda.Event() for _ in range(num_buffers)] if self._on_gpu else []
        self._free_recorded = [False] * num_buffers
        # Waves' uploads (``first_wave``), made once the first one needs them.
        self._upload_stream: torch.cuda.Stream | None = None
        # Geometry of the lists of pairs seen, by their views' ids and direction (``_geometry_of``).
        self._geometries: OrderedDict[tuple[tuple[int, ...], bool], _Geometry] = OrderedDict()

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
        self.to_device_groups([pairs], host_ids, device_ids, copy_stream=copy_stream, kernel_stream=kernel_stream)

    def to_device_groups(
        self,
        groups: Sequence[Sequence[ChunkPair]],
        host_ids: torch.Tensor,
        device_ids: torch.Tensor,
        *,
        copy_stream: torch.cuda.Stream | None = None,
        kernel_stream: torch.cuda.Stream | None = None,
        on_group_done: Callable[[int], None] | None = None,
        num_ctas: int | None = None,
        first_wave: int | None = None,
    ) -> None:
        """``to_device`` of several groups of pairs (e.g. one group per layer) in one call.

        Groups run in order; ``on_group_done(g)`` is called right after the last work of group g
        was enqueued on ``kernel_stream`` (record a per-layer event there). Sorting and runs happen
        once for the whole call. ``num_ctas``: the scatter's budget for this call (default: the
        copier's). ``first_wave``: the groups are planned, their tables uploaded and their work
        enqueued in waves of ``first_wave``, then twice as many groups each time (``waves``), so
        the first groups copy while the rest are planned (None: one wave, every group planned
        and uploaded before the first copy).
        """
        self._run(groups, host_ids, device_ids, True, copy_stream, kernel_stream, on_group_done, num_ctas, first_wave)

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

        Completion is ordered on ``copy_stream`` (record an event there after this call). Every
        unit is planned and its table uploaded before the first gather.
        """
        self._run([pairs], host_ids, device_ids, False, copy_stream, kernel_stream, None)

    # --- planning --------------------------------------------------------------------------------
    def _units(self, host_views: Sequence[torch.Tensor], host_sorted: np.ndarray, run_starts: np.ndarray,
               run_ends: np.ndarray, info: Sequence[tuple[int, int, int]] | None = None) -> list[_Unit]:
        """Split (rows x pairs) into units that each fit one buffer, with their host-side copies.

        Views with one row pitch stage as *spans*: a staging row holds each contiguous piece of a
        host row side by side, and one copy per run and piece moves it (whole-slot or layer-block
        rows: wide rows copy engines stream at full rate, also beside a backup). Otherwise each
        pair stages as its own dense block of rows. ``run_starts`` / ``run_ends``: the runs of
        adjacent ids in ``host_sorted``, which tile it. ``info``: the views' ``(address, row
        pitch, width)`` if known (``_Geometry.info``), else read from them.
        """
        n = host_sorted.size
        if info is None:
            info = [(v.data_ptr(), v.stride(0), v.shape[1]) for v in host_views]  # torch calls, once
        span_layout = _span_layout(tuple(info), self.buffer_bytes)
        spans = None if span_layout is None else span_layout.spans
        if spans is not None:
            stage_pitch = span_layout.stage_pitch
            rows_per_unit = self.buffer_bytes // stage_pitch
        else:
            biggest = _round(max(width for _, _, width in info))
            if biggest > self.buffer_bytes:
                raise ValueError(f"a {biggest}-byte chunk does not fit a {self.buffer_bytes}-byte staging buffer")
            rows_per_unit = self.buffer_bytes // biggest
        if n == 0:
            return []
        # The call's runs cut at unit boundaries, all at once: piece i is rows [starts[i], ends[i])
        # of one unit, and unit u's pieces are [bounds[u], bounds[u + 1]). The runs tile [0, n),
        # so a piece ends where the next one starts.
        unit_starts = list(range(0, n, rows_per_unit))
        if len(unit_starts) == 1:
            starts, local, bounds, heights = run_starts, run_starts, [0, run_starts.size], run_ends - run_starts
        else:  # a mask, not np.union1d: that one sorts, ten times the cost for 512 rows
            is_start = np.zeros(n, dtype=bool)
            is_start[run_starts] = True
            is_start[unit_starts] = True
            starts = np.flatnonzero(is_start)
            local = starts % rows_per_unit  # the piece's first row within its unit
            bounds = np.searchsorted(starts, unit_starts).tolist() + [starts.size]
            ends = np.concatenate((starts, [n]))  # np.diff(append=) costs twice as much
            heights = ends[1:] - ends[:-1]
        unit_bounds = [(r0, min(n, r0 + rows_per_unit), p0, p1) for r0, p0, p1 in zip(unit_starts, bounds, bounds[1:])]

        # One copy per (base row, piece): a base row per span (span layout) or per pair (dense
        # blocks), plus the piece's terms. A unit's copies are table[its bases, its pieces], base-major.
        if spans is not None:
            bases, span_stage = span_layout.bases, span_layout.stage_views
        else:
            # Pair groups and staging offsets per unit row count: every unit but the last has the same.
            groups_of = {rows: self._pair_groups(info, rows) for rows in {r1 - r0 for r0, r1, _, _ in unit_bounds}}
            offsets = groups_of[unit_bounds[0][1] - unit_bounds[0][0]][1]
            bases = [(ptr, pitch, offset, width, width, 0, k)
                     for k, ((ptr, pitch, width), offset) in enumerate(zip(info, offsets))]
        base = np.array(bases, dtype=np.int64)
        if len(bases) * starts.size <= _SMALL_TABLE:
            # A few copies (slots in one run): Python rows cost less than the numpy calls below.
            pieces = list(zip(host_sorted[starts].tolist(), local.tolist(), heights.tolist()))
            table = np.array([[(h + row * hp, hp, o + first * sp, sp, w, height, view) for row, first, height in pieces]
                              for h, hp, o, sp, w, _, view in bases], dtype=np.int64)
        else:
            table = np.empty((len(bases), starts.size, 7), dtype=np.int64)
            table[:] = base[:, None, :]
            table[..., _HOST] += base[:, _HOST_PITCH, None] * host_sorted[starts]
            table[..., _OFFSET] += base[:, _STAGE_PITCH, None] * local
            table[..., _HEIGHT] = heights
        if spans is not None:
            span_pairs = list(range(len(host_views)))
            return [_Unit(span_pairs, r0, r1, table[:, p0:p1].reshape(-1, 7), span_stage, host_views, len(bases))
                    for r0, r1, p0, p1 in unit_bounds]
        r0, r1, p0, p1 = unit_bounds[-1]
        if groups_of[r1 - r0][1] != offsets:  # a short last unit: its own staging offsets
            table[:, p0:p1, _OFFSET] += np.array(groups_of[r1 - r0][1], dtype=np.int64)[:, None] - base[:, _OFFSET, None]

        def full_rows(rows: int) -> int | None:
            return rows if rows == rows_per_unit else None
        units = []
        for r0, r1, p0, p1 in unit_bounds:
            ranges, unit_offsets = groups_of[r1 - r0]
            for k0, k1 in ranges:
                stage = [(unit_offsets[k], info[k][2], info[k][2]) for k in range(k0, k1)]
                units.append(_Unit(list(range(k0, k1)), r0, r1, table[k0:k1, p0:p1].reshape(-1, 7), stage, host_views,
                                   k1 - k0, full_rows(r1 - r0)))
        return units

    def _pair_groups(self, info, rows: int) -> tuple[list[tuple[int, int]], list[int]]:
        """The pairs of a ``rows``-row unit in groups that each fit one buffer (ranges ``[k0, k1)``
        of pairs, in order), and each pair's staging offset in its group (a dense block of rows
        per pair)."""
        ranges, offsets, k0, used = [], [], 0, 0
        for k, (_, _, width) in enumerate(info):
            need = _round(rows * width)
            if k > k0 and used + need > self.buffer_bytes:
                ranges.append((k0, k))
                k0, used = k, 0
            offsets.append(used)
            used += need
        ranges.append((k0, len(info)))
        return ranges, offsets

    def _table(self, unit: _Unit, slot: int, geometry: _Geometry, to_device: bool) -> np.ndarray:
        """The unit's kernel table in bytes relative to the staging storage: int64 [pairs, 5]."""
        k0 = unit.pairs[0]
        k1 = k0 + len(unit.pairs)  # a unit's pairs are consecutive
        stage = np.asarray(unit.stage_views, dtype=np.int64).reshape(-1, 3)
        table = np.empty((len(stage), 5), dtype=np.int64)  # filled by column: no temporaries to stack
        src, dst = (0, 1) if to_device else (1, 0)
        np.add(stage[:, 0], slot * self.buffer_bytes, out=table[:, src])
        table[:, src + 2] = stage[:, 1]
        table[:, dst] = geometry.device_offsets[k0:k1]
        table[:, dst + 2] = geometry.device_pitches[k0:k1]
        table[:, 4] = stage[:, 2]
        return table

    def _geometry_of(self, pairs: Sequence[ChunkPair], to_device: bool) -> _Geometry:
        """``pairs``' geometry, kept across calls by the identity of their views (an engine builds
        its views once per pool, so a backup's list, and a load's groups of the same layers, find
        theirs). It holds the views weakly, so a pool dropped by its owner is freed; a view's id
        taken by a new view after that finds the old entry dead and is planned anew."""
        views = [view for pair in pairs for view in pair]
        key = (tuple(map(id, views)), to_device)
        geometry = self._geometries.get(key)
        if geometry is not None and all(ref() is view for ref, view in zip(geometry.views, views)):
            self._geometries.move_to_end(key)
            return geometry
        host_views = [pair[0] if to_device else pair[1] for pair in pairs]
        device_views = [pair[1] if to_device else pair[0] for pair in pairs]
        storage = self._storage.data_ptr()
        device = np.array([(v.data_ptr() - storage, v.stride(0)) for v in device_views], dtype=np.int64).reshape(-1, 2)
        geometry = _Geometry(tuple(map(weakref.ref, views)), tuple((v.data_ptr(), v.stride(0), v.shape[1]) for v in host_views),
                             device[:, 0], device[:, 1])
        self._geometries[key] = geometry
        self._geometries.move_to_end(key)
        while len(self._geometries) > GEOMETRIES_KEPT:
            self._geometries.popitem(last=False)
        return geometry

    # --- running ---------------------------------------------------------------------------------
    def _run(self, groups, host_ids, device_ids, to_device, copy_stream, kernel_stream, on_group_done,
             num_ctas=None, first_wave=None) -> None:
        if host_ids.numel() != device_ids.numel():
            raise ValueError(f"host_ids has {host_ids.numel()} ids, device_ids {device_ids.numel()}")
        if host_ids.numel() == 0 or not groups:
            for g in range(len(groups)):
                if on_group_done is not None:
                    on_group_done(g)
            return
        if self._on_gpu and (copy_stream is None or kernel_stream is None):
            raise ValueError("staged copies on a GPU need an explicit copy_stream and kernel_stream")
        # Stage rows in host order, so consecutive host slots become one copy-engine copy.
        host_np = host_ids.cpu().numpy().astype(np.int64, copy=False)
        order = np.argsort(host_np, kind="stable")
        host_sorted = host_np[order]
        device_sorted = torch.from_numpy(device_ids.cpu().numpy().astype(np.int64, copy=False)[order].copy())
        breaks = np.flatnonzero(np.diff(host_sorted) != 1) + 1
        run_starts = np.concatenate(([0], breaks))
        run_ends = np.concatenate((breaks, [host_sorted.size]))

        # Each wave's tables go in one upload; the ids go with the first. A unit stages at most every
        # row of the call, so one row list serves every unit.
        device_dev = stage_dev = None
        done_groups = 0
        own_stream = first_wave is not None
        for g0, g1 in waves(len(groups), first_wave):
            units = self._wave_units(groups, g0, g1, to_device, host_sorted, run_starts, run_ends)
            if not units:
                continue
            work, tables = self._plan_wave(units, to_device)
            missing = [kept for kept in tables if kept.device is None]
            extra = [device_sorted, torch.arange(host_sorted.size, dtype=torch.int64)] if device_dev is None else []
            if missing or extra:
                uploaded = self._send([kept.plan.table for kept in missing] + extra, kernel_stream, own_stream=own_stream)
                if device_dev is None:
                    uploaded, (device_dev, stage_dev) = uploaded[:-2], uploaded[-2:]
                self._keep(missing, uploaded, kernel_stream, own_stream)
            self._wait_kept(tables, kernel_stream)
            done_groups = self._issue_wave(work, tables, device_dev, stage_dev, to_device, copy_stream, kernel_stream,
                                           on_group_done, done_groups, num_ctas)
        while on_group_done is not None and done_groups < len(groups):
            on_group_done(done_groups)
            done_groups += 1

    def _send(self, parts: list, kernel_stream, *, own_stream: bool) -> list[torch.Tensor]:
        """Upload ``parts`` (``upload``) for ``kernel_stream``'s kernels. Without ``first_wave`` the
        copy is enqueued on ``kernel_stream`` itself. With it (``own_stream``: every upload of the
        call, a call of one wave too) it goes on a stream of the copier's that waits for nothing,
        and ``kernel_stream`` waits for it: on ``kernel_stream`` a later wave's copy could start only
        after the scatters before it and then queue behind the data copies on the copy engines,
        which cost idle 61-layer loads 1-2% on the H200."""
        if not self._on_gpu or not own_stream:
            with on_stream(kernel_stream) if self._on_gpu else nullcontext():
                return upload(self.device, parts)
        if self._upload_stream is None:
            if self._streams is None:
                self._streams = StreamLease(self._storage.device)  # the ring's own device, with its index
            self._upload_stream = self._streams.take()
        with on_stream(self._upload_stream):
            sent = upload(self.device, parts)
        landed = torch.cuda.Event()
        landed.record(self._upload_stream)
        kernel_stream.wait_event(landed)
        # Allocated on the upload stream, read on the kernel stream: not reused before that is done.
        sent[0].record_stream(kernel_stream)
        return sent

    def _wave_units(self, groups, g0: int, g1: int, to_device: bool, host_sorted, run_starts,
                    run_ends) -> list[tuple[int, _Unit, _Geometry]]:
        """The units of groups ``g0..g1`` in order, each with its group and that group's geometry."""
        units = []
        for g in range(g0, g1):
            pairs = groups[g]
            if not pairs:
                continue
            geometry = self._geometry_of(pairs, to_device)
            host_views = [pair[0] if to_device else pair[1] for pair in pairs]
            units += [(g, unit, geometry)
                      for unit in self._units(host_views, host_sorted, run_starts, run_ends, info=geometry.info)]
        return units

    def _plan_wave(self, units, to_device: bool) -> tuple[list, list[_KeptTable]]:
        """Plan a wave of ``_wave_units``: each unit's ring slot, its work (group, unit, slot, table
        index) and its table. A table depends only on the slot and the unit's pairs and staging
        layout, not on the ids. Where that layout does not follow the call's size
        (``_Unit.stage_rows``: spans, full dense units) the table is built once per geometry and
        kept with it, its device copy too once uploaded: a span backup has one per buffer, and
        after the first call a wave builds and sends none. The others are built for the call, so
        calls of ever new sizes keep nothing."""
        work = []  # (group, unit, slot, table index)
        tables: list[_KeptTable] = []
        table_index: dict[tuple, int] = {}
        for g, unit, geometry in units:
            slot = self._next
            self._next = (slot + 1) % self._num_buffers
            layout = unit.stage_rows if unit.stage_rows is not None else ("call", unit.r1 - unit.r0)
            key = (id(geometry), slot, unit.pairs[0], len(unit.pairs), layout)
            if key not in table_index:
                table_index[key] = len(tables)
                tables.append(self._table_for(unit, slot, geometry, to_device))
            work.append((g, unit, slot, table_index[key]))
        return work, tables

    def _table_for(self, unit: _Unit, slot: int, geometry: _Geometry, to_device: bool) -> _KeptTable:
        """``unit``'s table in ``slot``: the one kept with ``geometry``, else a new one, kept there
        if its layout does not follow the call's size."""
        if unit.stage_rows is None:
            return self._plan_table(self._table(unit, slot, geometry, to_device))
        key = (slot, unit.pairs[0], len(unit.pairs), unit.stage_rows)
        kept = geometry.tables.get(key)
        if kept is not None:
            geometry.tables.move_to_end(key)
            return kept
        kept = geometry.tables[key] = self._plan_table(self._table(unit, slot, geometry, to_device))
        while len(geometry.tables) > TABLES_KEPT:
            geometry.tables.popitem(last=False)
        return kept

    def _plan_table(self, table: np.ndarray) -> _KeptTable:
        """``table``'s kernel plan (words of 4 bytes where every offset, pitch and the storage
        allow, 16-B vectors where they are 16-B aligned), not yet uploaded; kept with its
        geometry or used for one call, as ``_table_for`` decides."""
        common = math.gcd(int(np.gcd.reduce(table.reshape(-1))), self._storage.data_ptr())
        word = 4 if common % 4 == 0 else 1
        align = 16 // word if common % 16 == 0 else 1
        plan = UvaPlan(self._anchor(word), torch.from_numpy(table // word), word, align, int(table[:, 4].max()) // word,
                       self.num_ctas)
        return _KeptTable(plan)

    def _anchor(self, word: int) -> torch.Tensor:
        """The staging storage's first ``word`` bytes as one word (the base of every table's
        offsets), made once per word size: a view costs microseconds of torch per unit."""
        anchor = self._anchors.get(word)
        if anchor is None:
            anchor = torch.as_strided(self._storage, (word,), (1,))
            if word == 4:
                anchor = anchor.view(torch.int32)
            self._anchors[word] = anchor
        return anchor

    def _keep(self, missing: list[_KeptTable], uploaded: list[torch.Tensor], kernel_stream, own_stream: bool) -> None:
        """The device copies of newly built tables, kept with them. On a GPU with an event recorded
        right behind the upload on the stream it went on (the ring's own, or ``kernel_stream``), so
        a later call on another stream waits for the upload only; ``kernel_stream`` is already
        ordered after it and counted as waited."""
        landed = None
        if self._on_gpu and missing:
            landed = torch.cuda.Event()
            landed.record(self._upload_stream if own_stream else kernel_stream)
        for kept, device in zip(missing, uploaded):
            kept.device, kept.landed = device, landed
            if landed is not None:
                kept.waited = [kernel_stream]

    def _wait_kept(self, tables: list[_KeptTable], kernel_stream) -> None:
        """``kernel_stream`` waits for the uploads of the kept tables it reads (once per upload and
        stream: a stream's later work is ordered after the first wait)."""
        if not self._on_gpu:
            return
        for kept in tables:
            if kept.landed is not None and kernel_stream not in kept.waited:
                kernel_stream.wait_event(kept.landed)
                # Read there: a table dropped later (``TABLES_KEPT``) is not reused before that is done.
                kept.device.record_stream(kernel_stream)
                kept.waited.append(kernel_stream)

    def _issue_wave(self, work, tables, device_dev, stage_dev, to_device, copy_stream, kernel_stream,
                    on_group_done, done_groups: int, num_ctas) -> int:
        """Enqueue a planned wave's units in order; ``on_group_done`` after each group's last unit
        (and for the groups without pairs before it). Returns the groups done so far."""
        producer, consumer = (copy_stream, kernel_stream) if to_device else (kernel_stream, copy_stream)
        for index, (g, unit, slot, t) in enumerate(work):
            plan, table = tables[t].plan, tables[t].device
            rows = unit.r1 - unit.r0
            if self._on_gpu and self._free_recorded[slot]:
                producer.wait_event(self._free[slot])
            buffer_addr = self._storage.data_ptr() + slot * self.buffer_bytes
            ids_device, ids_stage = device_dev[unit.r0:unit.r1], stage_dev[:rows]
            if to_device:
                self._engine_copies(unit, buffer_addr, True, copy_stream)
                self._handoff(slot, copy_stream, kernel_stream)
                self._kernel(plan, table, ids_stage, ids_device, kernel_stream, num_ctas)
            else:
                self._kernel(plan, table, ids_device, ids_stage, kernel_stream, num_ctas)
                self._handoff(slot, kernel_stream, copy_stream)
                self._engine_copies(unit, buffer_addr, False, copy_stream)
            if self._on_gpu:
                self._free[slot].record(consumer)
                self._free_recorded[slot] = True
            last_of_group = index + 1 == len(work) or work[index + 1][0] != g
            if on_group_done is not None and last_of_group:
                while done_groups <= g:  # groups without pairs are done as soon as reached
                    on_group_done(done_groups)
                    done_groups += 1
        return done_groups

    def _batched(self, copies, to_device: bool) -> bool:
        """Whether ``copies`` (one unit's share) go out as one memcpy batch (see ``host_batch``)."""
        if self.host_batch is not None:
            return self.host_batch
        if not self._on_gpu or len(copies) < (BATCH_MIN_COPIES if to_device else BATCH_MIN_COPIES_TO_HOST):
            return False
        return _batch_rows(copies) <= BATCH_MAX_MEAN_ROWS * len(copies) and _batch_available()

    @staticmethod
    def _copy_list(copies: np.ndarray, buffer_addr: int, to_device: bool):
        """The unit's 2-D host copies (a ``host_copies`` table) as 1-D row copies (rows adjacent
        on both sides merged), built with numpy in one pass: hundreds of copies per unit cost
        microseconds, not one array operation each."""
        from .batch_copy import CopyList, merge_copy_list

        heights, sizes = copies[:, _HEIGHT], copies[:, _WIDTH]
        # A copy dense on both sides (one run of layer_first rows) is one row: its rows would merge
        # anyway, so they are not listed one by one first.
        dense = _dense_copies(copies)
        if dense.any():
            sizes, heights = np.where(dense, sizes * heights, sizes), np.where(dense, 1, heights)
        host, stage = copies[:, _HOST], copies[:, _OFFSET] + buffer_addr
        if not (heights == 1).all():
            first = np.cumsum(heights)
            total = int(first[-1])
            first -= heights  # each copy's first row in the list
            which = np.repeat(np.arange(len(copies)), heights)
            row = np.arange(total) - first[which]  # row j of copy i: its first row plus j pitches
            host = host[which] + row * copies[:, _HOST_PITCH][which]
            stage = stage[which] + row * copies[:, _STAGE_PITCH][which]
            sizes = sizes[which]
        # Addresses and sizes are >= 0: the same bits as uint64, without a copy.
        host, stage, sizes = (np.ascontiguousarray(a).view(np.uint64) for a in (host, stage, sizes))
        dsts, srcs = (stage, host) if to_device else (host, stage)
        copy_list = CopyList(dsts, srcs, sizes)
        # Rows of scattered slots rarely join (pitched rows, other slots): test that first, which
        # costs a third of a merge.
        if len(sizes) > 1 and ((host[:-1] + sizes[:-1] == host[1:]) & (stage[:-1] + sizes[:-1] == stage[1:])).any():
            return merge_copy_list(copy_list)
        return copy_list

    def _engine_copies(self, unit: _Unit, buffer_addr: int, to_device: bool, stream) -> None:
        copies = unit.host_copies
        if len(copies) and self._batched(copies, to_device):
            self._batch_copies(copies, buffer_addr, to_device, stream)
            return
        if self._on_gpu:
            handle = stream.cuda_stream
            # Few copies, or pitched ones of many rows (the batch was not worth it): a loop over
            # Python ints.
            for host_addr, host_pitch, offset, stage_pitch, width, height, _ in copies.tolist():
                stage_addr = buffer_addr + offset
                if to_device:
                    cudart.memcpy_2d_async(stage_addr, stage_pitch, host_addr, host_pitch, width, height, handle)
                else:
                    cudart.memcpy_2d_async(host_addr, host_pitch, stage_addr, stage_pitch, width, height, handle)
            return
        # CPU: the same copies through torch views of the host memory.
        storage_addr = self._storage.data_ptr()
        for host_addr, host_pitch, offset, stage_pitch, width, height, view in copies.tolist():
            ref = unit.host_views[view]
            stage_start = buffer_addr - storage_addr + offset
            stage = torch.as_strided(self._storage, (height, width), (stage_pitch, 1), stage_start)
            host = torch.as_strided(ref, (height, width), (host_pitch, 1), ref.storage_offset() + host_addr - ref.data_ptr())
            if to_device:
                stage.copy_(host)
            else:
                host.copy_(stage)

    def _batch_copies(self, copies, buffer_addr: int, to_device: bool, stream) -> None:
        """A unit's copies as one memcpy batch (memmove on CPU: the CPU storage's address stands in
        for the device buffer's)."""
        from .batch_copy import run_copy_list

        run_copy_list(self._copy_list(copies, buffer_addr, to_device), stream=stream, on_gpu=self._on_gpu)

    def _kernel(self, plan, table, src_ids, dst_ids, stream, num_ctas=None) -> None:
        with on_stream(stream) if self._on_gpu else nullcontext():
            launch_uva(plan, table, src_ids, dst_ids, num_ctas=num_ctas or self.num_ctas, block=self.block,
                       num_warps=self.num_warps)

    def _handoff(self, slot: int, producer, consumer) -> None:
        if self._on_gpu:
            self._ready[slot].record(producer)
            consumer.wait_event(self._ready[slot])


def waves(count: int, first: int | None) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of ``count`` groups in waves of ``first``, then twice as many each
    time (``first`` None: one wave of all). Doubling keeps the uploads few (about log2 of the
    groups) while the first wave is small enough to be planned in a fraction of one group's copy."""
    if count <= 0:
        return []
    if first is None:
        return [(0, count)]
    out, start, size = [], 0, max(1, first)
    while start < count:
        out.append((start, min(count, start + size)))
        start += size
        size *= 2
    return out


def _batch_available() -> bool:
    from .batch_copy import available

    return available()


def _dense_copies(copies: np.ndarray) -> np.ndarray:
    """Which of a ``host_copies`` table's copies (``[..., 7]``) are dense on both sides (row pitch
    = width): a run of ``layer_first`` rows, one 1-D copy of ``width * height`` bytes however
    many rows."""
    sizes = copies[..., _WIDTH]
    return (copies[..., _HOST_PITCH] == sizes) & (copies[..., _STAGE_PITCH] == sizes)


def _batch_rows(copies: np.ndarray) -> int:
    """The 1-D copies a memcpy batch of ``copies`` holds: a dense copy is one, any other copy one
    per row. A dense run of ``layer_first`` rows counts as one copy, not one per row: counted by
    rows such units stayed out of the batch, one ``cudaMemcpy2DAsync`` per (run, component, layer),
    and ran at 77% of the ceiling instead of 96% on the H200."""
    return int(np.where(_dense_copies(copies), 1, copies[:, _HEIGHT]).sum())
