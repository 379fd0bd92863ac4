"""UVA page copy: one Triton launch copies rows of many chunk-view pairs, in any direction.

The GPU reads and writes pinned host memory directly through unified virtual addressing, so a
launch can gather random device pages into host slots (backup, device -> host), scatter host slots
into random device pages (load, host -> device), or move rows between two device buffers (the
gather / scatter step of the staged path). Which of these it is depends only on where the views
live; the kernel sees byte addresses.

One launch covers any number of ``(src, dst)`` pairs: their base addresses, row pitches and chunk
sizes travel as one small int64 table, so "all layers of a backup" and "one layer of a load" are
the same kernel with a longer or shorter table. Programs are persistent: ``num_ctas`` programs
walk the (pair, row, tile) work list with a stride, which puts a hard budget on the SMs a transfer
takes from the model running beside it. Every address computation is int64 (host pools are
hundreds of GiB).

Host-side entry points: ``plan_uva_copy`` (the table, built once per set of pairs),
``upload`` (tables and ids to the device in one pinned asynchronous copy), ``launch_uva`` (one
launch from uploaded tensors) and ``copy_pages_uva`` (all three for one copy).

This module must never validate ids (the caller did, on CPU) nor synchronise the device: it only
enqueues work on the current stream. Host memory it touches must be pinned (page-locked and
mapped); pageable host memory would fault the kernel. ``reference.copy_pages_reference`` is
the pure torch reference.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .reference import ChunkPair

#: CTA budgets chosen by measurement on the H200 (``benchmarks/transfer_gpu.py``, docs/benchmarks.md
#: "Transfers on the H200"): device -> host saturates PCIe from a few CTAs (posted writes), host ->
#: device needs more reads in flight. Host -> device reads top out at about 92% of the copy engines'
#: rate whatever the budget (16, 32 or 64 CTAs), cache modifier or prefetch hint.
DEFAULT_CTAS_TO_HOST = 8
DEFAULT_CTAS_FROM_HOST = 16
#: Device -> device (staging gather / scatter, with 64 KiB tiles): HBM is ~80x faster than PCIe;
#: 4 CTAs keep a staged transfer within 1% of 16 on the H200.
DEFAULT_CTAS_ON_DEVICE = 4

#: Elements (of the chosen word size) copied per program per loop step. 4096 x 4 B = 16 KiB in
#: flight per program and step; larger tiles did not help on the H200 (see the benchmark).
DEFAULT_BLOCK = 4096
DEFAULT_NUM_WARPS = 8

# The per-pair table holds, in words relative to the anchor: src_off, dst_off, src_pitch,
# dst_pitch, chunk. Column of the chunk size:
_CHUNK = 4


@triton.jit
def _uva_copy_kernel(
    anchor,  # pointer all addresses are expressed against (word-typed)
    table,  # int64 [num_pairs, 5]: src_off, dst_off, src_pitch, dst_pitch, chunk (all in words)
    src_ids,  # int64 [num_ids]
    dst_ids,  # int64 [num_ids]
    num_pairs,
    num_ids,
    BLOCK: tl.constexpr,
    ALIGN: tl.constexpr,  # words every offset, pitch and chunk is a multiple of (for 16-B vectors)
):
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    # Global tile counter: tiles are dealt round-robin across pairs, so the leftover tiles of one
    # pair do not always land on the same low-numbered programs.
    consumed = pid * 0
    # while-loops rather than range(): the interpreter (TRITON_INTERPRET=1, numpy >= 2.4) cannot
    # take a runtime scalar as a range bound; compiled, both become the same scf loop.
    p = pid * 0
    while p < num_pairs:
        row = table + p * 5
        src_off = tl.load(row + 0)
        dst_off = tl.load(row + 1)
        src_pitch = tl.load(row + 2)
        dst_pitch = tl.load(row + 3)
        chunk = tl.load(row + 4)
        tiles_per_row = (chunk + BLOCK - 1) // BLOCK
        total = num_ids * tiles_per_row
        t = (pid - consumed % nprog + nprog) % nprog
        while t < total:
            i = t // tiles_per_row
            j = t - i * tiles_per_row
            s = tl.load(src_ids + i)
            d = tl.load(dst_ids + i)
            start = j * BLOCK
            src_base = tl.multiple_of(src_off + s * src_pitch + start, ALIGN)
            dst_base = tl.multiple_of(dst_off + d * dst_pitch + start, ALIGN)
            # The hint lets the compiler keep 16-B vectors under the mask (the tail is word-aligned).
            mask = cols < tl.multiple_of(chunk - start, ALIGN)
            words = tl.load(anchor + src_base + cols, mask=mask)
            tl.store(anchor + dst_base + cols, words, mask=mask)
            t += nprog
        consumed += total
        p += 1


@functools.cache
def _interpreted_kernel():
    """The same kernel run by Triton's interpreter, for host-only copies (CPU machines, CI).

    Chosen per call rather than through TRITON_INTERPRET, so it works whatever imported this
    module first.
    """
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(_uva_copy_kernel.fn)


@dataclass(frozen=True)
class UvaPlan:
    """What a launch needs besides the ids: the anchor, the per-pair table and the word geometry.

    Pure host-side data: build it once per set of pairs (e.g. once per layer of a pool) and reuse
    it. Plans built with the same ``anchor`` can share one upload (``upload``) and run as several
    launches (``launch_uva``), which is how a 61-layer load issues 61 launches for one small copy.
    """

    anchor: torch.Tensor  # word-typed tensor at the base address every offset is relative to
    table: torch.Tensor  # int64 [num_pairs, 5] on the CPU, in words
    word_bytes: int
    align_words: int
    max_chunk_words: int
    default_ctas: int  # the measured budget for this direction (host -> device, ...)

    @property
    def num_pairs(self) -> int:
        return self.table.shape[0]


def _launch_device(pairs: Sequence[ChunkPair]) -> torch.device:
    for src, dst in pairs:
        for view in (dst, src):
            if view.device.type != "cpu":
                return view.device
    return torch.device("cpu")  # Triton interpreter: everything is host memory


def plan_uva_copy(pairs: Sequence[ChunkPair], *, anchor: torch.Tensor | None = None,
                  word_bytes: int | None = None) -> UvaPlan:
    """Describe ``pairs`` for ``copy_pages_uva``; touches no device.

    Args:
        pairs: non-empty list of ``(src, dst)`` uint8 chunk views ``[rows, chunk_bytes]`` (inner
            stride 1, any row stride), same ``chunk_bytes`` within a pair. Host views must be
            pinned when the launch device is a GPU.
        anchor: a tensor on the launch device whose data pointer the offsets are relative to
            (default: one of the views). Plans that share an anchor and word can share an upload.
        word_bytes: force the word size (4 or 1); default the largest that divides everything.
    """
    if not pairs:
        raise ValueError("plan_uva_copy needs at least one (src, dst) pair")
    for src, dst in pairs:
        if src.dtype != torch.uint8 or dst.dtype != torch.uint8 or src.dim() != 2 or dst.dim() != 2:
            raise ValueError("chunk views must be 2-D uint8 tensors [rows, chunk_bytes]")
        if src.shape[1] != dst.shape[1] or src.stride(1) != 1 or dst.stride(1) != 1:
            raise ValueError(f"pair chunk sizes / inner strides differ: {tuple(src.shape)} vs {tuple(dst.shape)}")
    device = _launch_device(pairs)
    if anchor is None:
        anchor = next((v for pair in pairs for v in (pair[1], pair[0]) if v.device == device), pairs[0][1])
    base = anchor.data_ptr()
    common = 0
    for src, dst in pairs:
        for value in (src.data_ptr() - base, dst.data_ptr() - base, src.stride(0), dst.stride(0), src.shape[1]):
            common = math.gcd(common, value)
    common = math.gcd(common, base)
    word = word_bytes or (4 if common % 4 == 0 else 1)
    if common % word:
        raise ValueError(f"word of {word} B does not divide the pairs' addresses, pitches and chunks")
    align = 16 // word if common % 16 == 0 else 1
    # The kernel uses only the anchor's data pointer and dtype (the word), never its shape.
    anchor = torch.as_strided(anchor.view(torch.uint8) if anchor.dtype != torch.uint8 else anchor, (word,), (1,))
    if word == 4:
        anchor = anchor.view(torch.int32)
    rows = [
        [
            (src.data_ptr() - base) // word,
            (dst.data_ptr() - base) // word,
            src.stride(0) // word,
            dst.stride(0) // word,
            src.shape[1] // word,
        ]
        for src, dst in pairs
    ]
    table = torch.tensor(rows, dtype=torch.int64)
    return UvaPlan(anchor, table, word, align, max(r[_CHUNK] for r in rows), default_ctas(pairs))


def upload(device: torch.device, parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copy int64 CPU tensors to ``device`` in one pinned, asynchronous copy on the current stream.

    Returns the device slices in order. torch's caching host allocator keeps the pinned block
    alive until the copy has run, so this never syncs the device.
    """
    flat = [p.reshape(-1).to(torch.int64) for p in parts]
    packed = torch.cat(flat) if flat else torch.zeros(0, dtype=torch.int64)
    if device.type != "cpu":
        packed = packed.pin_memory().to(device, non_blocking=True)
    return unpack(packed, [p.numel() for p in flat])


def unpack(packed: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
    """The consecutive slices of ``packed`` of ``sizes`` elements (an upload's parts, in order)."""
    out, start = [], 0
    for size in sizes:
        out.append(packed[start:start + size])
        start += size
    return out


def launch_uva(
    plan: UvaPlan,
    table: torch.Tensor,
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    *,
    num_ctas: int | None = None,
    block: int = DEFAULT_BLOCK,
    num_warps: int = DEFAULT_NUM_WARPS,
) -> None:
    """One launch on the current stream with ``table`` / ids already on the launch device.

    Args:
        table: ``plan.table`` on the device (int64 ``[num_pairs * 5]``).
        src_ids, dst_ids: int64 ``[n]`` on the device.
    """
    n = src_ids.numel()
    if n == 0:
        return
    tiles = n * plan.num_pairs * triton.cdiv(plan.max_chunk_words, block)
    grid = (max(1, min(num_ctas or plan.default_ctas, tiles)),)
    kernel = _uva_copy_kernel if plan.anchor.device.type != "cpu" else _interpreted_kernel()
    kernel[grid](
        plan.anchor,
        table,
        src_ids,
        dst_ids,
        plan.num_pairs,
        n,
        BLOCK=block,
        ALIGN=plan.align_words,
        num_warps=num_warps,
    )


def copy_pages_uva(
    pairs: Sequence[ChunkPair] | UvaPlan,
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    *,
    num_ctas: int | None = None,
    block: int = DEFAULT_BLOCK,
    num_warps: int = DEFAULT_NUM_WARPS,
) -> None:
    """For every pair and i: ``dst[dst_ids[i]] = src[src_ids[i]]``, in one launch on the current stream.

    Args:
        pairs: ``(src, dst)`` uint8 chunk views ``[rows, chunk_bytes]``, or a ``UvaPlan`` of them.
        src_ids, dst_ids: int64 ``[n]`` on the CPU, validated by the caller (in range,
            destinations unique). They travel to the device with the table in one pinned,
            asynchronous copy, so a launch never syncs the device.
        num_ctas: the program budget (persistent programs); default by direction, see
            ``DEFAULT_CTAS_*``.
        block: words per program per step (a power of two).
    """
    if src_ids.numel() != dst_ids.numel():
        raise ValueError(f"src_ids has {src_ids.numel()} ids, dst_ids {dst_ids.numel()}")
    if src_ids.numel() == 0:
        return
    plan = pairs if isinstance(pairs, UvaPlan) else plan_uva_copy(pairs)
    table, src, dst = upload(plan.anchor.device, [plan.table, src_ids, dst_ids])
    launch_uva(plan, table, src, dst, num_ctas=num_ctas, block=block, num_warps=num_warps)


def default_ctas(pairs: Sequence[ChunkPair]) -> int:
    """The measured default CTA budget for the direction of ``pairs`` (by where src / dst live)."""
    src, dst = pairs[0]
    # Pinned host memory is a CPU tensor to torch: the direction is read off the devices.
    if src.device.type == "cpu" and dst.device.type != "cpu":
        return DEFAULT_CTAS_FROM_HOST
    if src.device.type != "cpu" and dst.device.type == "cpu":
        return DEFAULT_CTAS_TO_HOST
    return DEFAULT_CTAS_ON_DEVICE

