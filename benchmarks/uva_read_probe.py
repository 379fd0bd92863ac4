"""Probe: can the UVA kernel read pinned host memory as efficiently as the copy engines?

Every kernel path of issue 13 tops out at about 92% of the copy engines' host -> device ceiling
(51.1-51.2 against 55.5 GB/s in the run of record, slots in runs or scattered alike), so whatever
the kernel moves of a scattered ``layer_first`` load caps that load below the 95% target. 92% is
what PCIe's per-packet overhead gives if the SMs' reads of host memory come back as 128-byte
completions while the copy engines get 256-byte ones, so this probe asks the hardware for bigger
reads and times the same copy (a 61-layer NSA load of 512 scattered host slots into 512 random
device pages, ``layer_first`` rows: 41,984 B latent and 8,448 B indexer per slot and layer) with:

- ``tl.load``: the library's kernel as it is (16-byte vectors, ``kernels.uva_copy``'s tiling);
- ``tl.load .cg``: the same, cached in L2 only;
- ``ld L2::128B`` / ``ld L2::256B``: each 16-byte load in inline PTX with a prefetch-size hint,
  asking L2 to fetch the whole 128 / 256-byte line around it;
- ``ld.nc L2::256B``: the same through the non-coherent path;
- ``bulk prefetch``: each program first asks L2 for its next tile with one
  ``cp.async.bulk.prefetch.L2`` (Hopper's bulk copy unit), then loads the tile with ``tl.load``.

Each at 16, 32 and 64 programs, slots scattered and in one run, beside the copy engines' own
copy of the same bytes as one contiguous block (the ceiling) in the same run. Every variant's
bytes are checked before it is timed; a variant that fails to build is recorded with its error.

    python3 benchmarks/uva_read_probe.py [--reps 8] [--out docs/benchmarks/uva_read_probe.json]

Never imported by the library or the tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton
import triton.language as tl

LAYERS, SLOTS, PAGES, N = 61, 2048, 2048, 512
WIDTHS = (41984, 8448)  # DeepSeek-V3.2 NSA fp8: latent and indexer bytes per page and layer
BLOCK = 4096  # words per program and step, as kernels.uva_copy
CTAS = (16, 32, 64)
SLEEP_CYCLES = 2_000_000

# Load modes (constexpr MODE of the kernel).
MODES = {"tl.load": 0, "tl.load .cg": 1, "ld L2::128B": 2, "ld L2::256B": 3, "ld.nc L2::256B": 4, "bulk prefetch": 5}

_LD = ("{{ .reg .pred p; setp.ne.b32 p, $5, 0; mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0; "
       "@p {op}.v4.b32 {{$0, $1, $2, $3}}, [$4]; }}")
LD_128 = tl.constexpr(_LD.format(op="ld.global.L2::128B"))
LD_256 = tl.constexpr(_LD.format(op="ld.global.L2::256B"))
LD_NC_256 = tl.constexpr(_LD.format(op="ld.global.nc.L2::256B"))
ST = tl.constexpr("{ .reg .pred p; setp.ne.b32 p, $6, 0; mov.b32 $0, 0; @p st.global.v4.b32 [$1], {$2, $3, $4, $5}; }")
PREFETCH = tl.constexpr("{ .reg .pred p; setp.ne.b32 p, $3, 0; mov.b32 $0, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; }")


@triton.jit
def _probe_kernel(anchor, table, src_ids, dst_ids, num_pairs, num_ids, BLOCK: tl.constexpr, MODE: tl.constexpr):
    """``kernels.uva_copy._uva_copy_kernel``'s walk (persistent programs over (pair, id, tile)),
    with the tile's load chosen by MODE. Offsets, pitches and chunks in 4-byte words."""
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    vec = tl.arange(0, BLOCK // 4) * 4
    consumed = pid * 0
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
            src_base = tl.multiple_of(src_off + s * src_pitch + start, 4)
            dst_base = tl.multiple_of(dst_off + d * dst_pitch + start, 4)
            left = tl.multiple_of(chunk - start, 4)
            if MODE == 0 or MODE == 1 or MODE == 5:
                if MODE == 5:
                    # Ask L2 for the next tile of this program (same row or the next id's) now.
                    t2 = t + nprog
                    if t2 < total:
                        i2 = t2 // tiles_per_row
                        j2 = t2 - i2 * tiles_per_row
                        s2 = tl.load(src_ids + i2)
                        start2 = j2 * BLOCK
                        nbytes = tl.minimum(chunk - start2, BLOCK) * 4
                        one = tl.arange(0, 1)
                        tl.inline_asm_elementwise(PREFETCH, "=r,l,r,r",
                                                  [anchor + src_off + s2 * src_pitch + start2 + one,
                                                   (nbytes + one * 0).to(tl.int32), (one == 0).to(tl.int32)],
                                                  dtype=tl.int32, is_pure=False, pack=1)
                mask = cols < left
                if MODE == 1:
                    words = tl.load(anchor + src_base + cols, mask=mask, cache_modifier=".cg")
                else:
                    words = tl.load(anchor + src_base + cols, mask=mask)
                tl.store(anchor + dst_base + cols, words, mask=mask)
            else:
                live = (vec < left).to(tl.int32)
                if MODE == 2:
                    a, b, c, e = tl.inline_asm_elementwise(LD_128, "=r,=r,=r,=r,l,r", [anchor + src_base + vec, live],
                                                           dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
                                                           is_pure=False, pack=1)
                elif MODE == 3:
                    a, b, c, e = tl.inline_asm_elementwise(LD_256, "=r,=r,=r,=r,l,r", [anchor + src_base + vec, live],
                                                           dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
                                                           is_pure=False, pack=1)
                else:
                    a, b, c, e = tl.inline_asm_elementwise(LD_NC_256, "=r,=r,=r,=r,l,r",
                                                           [anchor + src_base + vec, live],
                                                           dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
                                                           is_pure=False, pack=1)
                tl.inline_asm_elementwise(ST, "=r,l,r,r,r,r,r", [anchor + dst_base + vec, a, b, c, e, live],
                                          dtype=tl.int32, is_pure=False, pack=1)
            t += nprog
        consumed += total
        p += 1


class Pools:
    """``layer_first`` rows per component: pinned host ``[layers, slots, width]`` and device
    ``[layers, pages, width]``, and the (src, dst) table of a load in words against one anchor."""

    def __init__(self) -> None:
        self.host = [torch.empty(LAYERS, SLOTS, w, dtype=torch.uint8, pin_memory=True) for w in WIDTHS]
        for h in self.host:
            h.view(torch.int32).random_()
        self.device = [torch.zeros(LAYERS, PAGES, w, dtype=torch.uint8, device="cuda") for w in WIDTHS]
        self.anchor = self.host[0].view(torch.int32)
        base = self.anchor.data_ptr()
        rows = []
        for h, dv, w in zip(self.host, self.device, WIDTHS):
            for layer in range(LAYERS):
                src, dst = h[layer].data_ptr(), dv[layer].data_ptr()
                assert (src - base) % 16 == 0 and (dst - base) % 16 == 0
                rows.append([(src - base) // 4, (dst - base) // 4, w // 4, w // 4, w // 4])
        self.table = torch.tensor(rows, dtype=torch.int64, device="cuda")
        self.nbytes = N * LAYERS * sum(WIDTHS)

    def launch(self, mode: int, ctas: int, slots: torch.Tensor, pages: torch.Tensor) -> None:
        _probe_kernel[(ctas,)](self.anchor, self.table, slots, pages, self.table.shape[0], slots.numel(),
                               BLOCK=BLOCK, MODE=mode, num_warps=8)

    def check(self, slots: torch.Tensor, pages: torch.Tensor) -> bool:
        """Whether every device page holds its host slot's rows (ids on the device)."""
        cpu_slots = slots.cpu()
        return all(torch.equal(dv[:, pages].cpu(), h[:, cpu_slots]) for h, dv in zip(self.host, self.device))

    def clear(self) -> None:
        for dv in self.device:
            dv.zero_()


def timed(fn, reps: int) -> dict:
    """Median device ms of ``fn()`` over ``reps`` (after one warm-up), each after a sleep."""
    ms = []
    for i in range(reps + 1):
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i:
            ms.append(start.elapsed_time(end))
    return {"ms": statistics.median(ms), "ms_min": min(ms), "ms_max": max(ms)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--out", default="docs/benchmarks/uva_read_probe.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    pools = Pools()
    nbytes = pools.nbytes
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    results = []

    def ceiling() -> dict:
        timing = timed(lambda: dst.copy_(src, non_blocking=True), args.reps)
        row = {"variant": "ceiling h2d contiguous", **timing, "gbps": nbytes / timing["ms"] / 1e6}
        print(f"{row['variant']:40s} {row['gbps']:6.2f} GB/s", flush=True)
        return row

    pages = torch.randperm(PAGES)[:N].to(torch.int64)
    slot_sets = {"scattered": torch.randperm(SLOTS)[:N].to(torch.int64),
                 "runs": torch.arange(N, dtype=torch.int64) + 700}
    results.append(ceiling())
    ids = {kind: (s.cuda(), pages.cuda()) for kind, s in slot_sets.items()}
    for name, mode in MODES.items():
        for kind, (slots, dev_pages) in ids.items():
            try:
                pools.clear()
                pools.launch(mode, 16, slots, dev_pages)
                torch.cuda.synchronize()
                ok = pools.check(slots, dev_pages)
            except Exception as exc:  # a variant whose PTX does not build: recorded, the others go on
                results.append({"variant": name, "slots": kind, "error": f"{type(exc).__name__}: {exc}"[:2000]})
                print(f"{name:22s} {kind:9s} FAILED: {exc}", flush=True)
                traceback.print_exc()
                break
            for ctas in CTAS:
                timing = timed(lambda: pools.launch(mode, ctas, slots, dev_pages), args.reps)
                row = {"variant": name, "slots": kind, "ctas": ctas, "bytes_ok": ok, **timing,
                       "gbps": nbytes / timing["ms"] / 1e6}
                row["of_ceiling"] = row["gbps"] / results[0]["gbps"]
                results.append(row)
                print(f"{name:22s} {kind:9s} {ctas:3d} ctas {row['gbps']:6.2f} GB/s = {100 * row['of_ceiling']:5.1f}%"
                      f" (min-max {row['ms_min']:.2f}-{row['ms_max']:.2f} ms) bytes ok {ok}", flush=True)
    results.append(ceiling())
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
           "bytes": nbytes, "pages": N, "layers": LAYERS, "widths": WIDTHS, "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
