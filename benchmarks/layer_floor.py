"""One layer alone: how close can any way of moving one layer's bytes into scattered device pages
come to one contiguous copy of the same bytes?  Raw copy patterns on the GPU (written for the H200).

    python benchmarks/layer_floor.py --reps 10 --out docs/benchmarks/transfer_gpu_layer_floor.json
    python benchmarks/layer_floor.py --ab 30 --out ab.json    # interleaved A/B of single-layer splits

One layer of DeepSeek-V3.2 NSA (512 pages: 21.5 MB latent + 4.3 MB indexer), host slots in one run,
random device pages. In one run, each timed like ``transfer_gpu.py`` (GPU sleep, CUDA events,
median of ``--reps``):

- the contiguous copy of one layer's bytes (the target's reference), in one copy and in two halves
  on two copy streams (do two copy engines beat one?);
- the same contiguous bytes cut into one copy per (page, component) row in one batch (the copy
  engines' per-copy cost without any scatter);
- the contiguous bytes split between one copy-engine copy and the UVA kernel at once (is there
  link bandwidth beyond one copy engine that SM-issued reads could add?);
- the library's ``batch`` path and ``auto`` (rows straight into the pages);
- staged: the host rows copied by the copy engines into a contiguous device staging buffer in
  units of R rows (1-D from ``layer_first``, 2-D from ``page_first``), each unit scattered into
  the pages by a device kernel as soon as it has landed (the best a staged design can do: the
  scatter of the last unit is the only part not hidden behind a copy).

Every pattern that writes the pages is checked byte for byte first. With ``--ab N`` only the
single-layer load splits are timed instead, interleaved: each of N rounds times every candidate
once, in rotating order, so drift of the machine falls on all of them alike.

Never imported by the library or the tests.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import numpy as np
import torch

from transfer_gpu import add_shape_arguments, compare_start, measure, random_pools, side_copy, _save_compare

from tiered_kv.kernels import copy_pages_uva
from tiered_kv.kernels.batch_copy import plan_copy_list, run_copy_list
from tiered_kv.kernels.cudart import memcpy_2d_async, memcpy_async, memcpy_batch_async
from tiered_kv.transfers.engine import LoadSplit, TransferEngine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/benchmarks/transfer_gpu_layer_floor.json")
    parser.add_argument("--reps", type=int, default=10)
    add_shape_arguments(parser)
    parser.add_argument("--ab", type=int, default=0, metavar="N",
                        help="only an interleaved A/B of single-layer load splits, N rounds")
    args = parser.parse_args()
    b, layer_bytes, _, (h2d, _, _, layer_h2d, host_layer) = compare_start(args, 3, "layer floor")
    spec, n = b.spec, args.pages
    ceiling = {"load1": layer_h2d["gbps"], "h2d": h2d["gbps"]}
    device_pool, hosts = random_pools(spec, args)
    mid = spec.num_layers // 2
    widths = [c.bytes_per_layer for c in spec.components]
    dev_views = [device_pool.chunk_view(ci, mid) for ci in range(len(widths))]
    pages = torch.randperm(args.device_pages - 1)[:n] + 1
    pages_dev = pages.cuda()
    first = int(torch.randint(0, args.host_slots - n + 1, ()).item())
    slots = torch.arange(first, first + n)
    copy_s, copy_s2, scatter_s = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    dev_layer = torch.empty(layer_bytes, dtype=torch.uint8, device="cuda")
    staging = torch.empty(layer_bytes, dtype=torch.uint8, device="cuda")
    checks: list[dict] = []

    def end_on(stream):
        end = torch.cuda.Event(enable_timing=True)
        end.record(stream)
        return end

    def contiguous_halves(i):
        half = layer_bytes // 2
        ends = []
        for stream, lo, hi in ((copy_s, 0, half), (copy_s2, half, layer_bytes)):
            stream.wait_stream(torch.cuda.current_stream())
            memcpy_async(dev_layer.data_ptr() + lo, host_layer.data_ptr() + lo, hi - lo, stream.cuda_stream)
            ends.append(end_on(stream))
        return ends

    # One copy per (component, page) row, contiguous on both sides: nothing to merge, nothing to scatter.
    sizes = np.concatenate([np.full(n, w, dtype=np.uint64) for w in widths])
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.uint64)

    def contiguous_rows(i):
        copy_s.wait_stream(torch.cuda.current_stream())
        memcpy_batch_async(np.uint64(dev_layer.data_ptr()) + offsets, np.uint64(host_layer.data_ptr()) + offsets,
                           sizes, copy_s.cuda_stream)
        return [end_on(copy_s)]

    def contiguous_with_kernel(kernel_share: float, ctas: int | None):
        """The first part in one copy-engine copy, the rest by the UVA kernel at the same time."""
        w = widths[-1]
        rows = int(layer_bytes * kernel_share) // w
        cut = layer_bytes - rows * w
        pairs = [(host_layer[cut:].view(rows, w), dev_layer[cut:].view(rows, w))]
        ids = torch.arange(rows)

        def issue(i):
            for stream in (copy_s, copy_s2):
                stream.wait_stream(torch.cuda.current_stream())
            memcpy_async(dev_layer.data_ptr(), host_layer.data_ptr(), cut, copy_s.cuda_stream)
            with torch.cuda.stream(copy_s2):
                copy_pages_uva(pairs, ids, ids, num_ctas=ctas)
            return [end_on(copy_s), end_on(copy_s2)]
        return issue

    def batch_into_pages(layout):
        host = hosts[layout]
        pairs = [(host.chunk_view(ci, mid), dev_views[ci]) for ci in range(len(widths))]

        def issue(i):
            copy_s.wait_stream(torch.cuda.current_stream())
            run_copy_list(plan_copy_list(pairs, slots, pages), stream=copy_s, on_gpu=True)
            return [end_on(copy_s)]
        return issue

    def staged(layout, rows_per_unit):
        """Copy-engine copies into staging, unit by unit, the indexer first (so the last unit, whose
        scatter is not hidden, is a small latent unit); each unit scattered once it has landed."""
        host = hosts[layout]
        units, offset = [], 0
        for ci in reversed(range(len(widths))):
            for r0 in range(0, n, rows_per_unit):
                r1 = min(n, r0 + rows_per_unit)
                units.append((ci, r0, r1, offset))
                offset += (r1 - r0) * widths[ci]

        def issue(i):
            copy_s.wait_stream(torch.cuda.current_stream())
            scatter_s.wait_stream(torch.cuda.current_stream())
            for ci, r0, r1, off in units:
                view, w = host.chunk_view(ci, mid), widths[ci]
                src = view.data_ptr() + (first + r0) * view.stride(0)
                dst = staging.data_ptr() + off
                if view.stride(0) == w:
                    memcpy_async(dst, src, (r1 - r0) * w, copy_s.cuda_stream)
                else:
                    memcpy_2d_async(dst, w, src, view.stride(0), w, r1 - r0, copy_s.cuda_stream)
                landed = torch.cuda.Event()
                landed.record(copy_s)
                scatter_s.wait_event(landed)
                with torch.cuda.stream(scatter_s):
                    dev_views[ci].index_copy_(0, pages_dev[r0:r1], staging[off:off + (r1 - r0) * w].view(r1 - r0, w))
            return [end_on(scatter_s)]
        return issue

    def engine_auto(layout):
        engine = TransferEngine(device_pool, hosts[layout], path="auto", timing=True)

        def issue(i):
            handle = engine.load(slots, pages, layers=[mid])
            return [handle.event(mid)]
        return issue

    def check(name: str, layout: str, issue) -> bool:
        for view in dev_views:
            view[pages_dev] = 0
        issue(0)
        torch.cuda.synchronize()
        host = hosts[layout]
        ok = all(torch.equal(dev_views[ci][pages_dev].cpu(), host.chunk_view(ci, mid)[slots]) for ci in range(len(widths)))
        checks.append({"name": f"{name} {layout}", "ok": ok})
        print(f"check {name} {layout}: {'ok' if ok else 'WRONG'}", flush=True)
        return ok

    def timed(name: str, issue, layout: str = "-") -> None:
        row = b.add(f"{layout:11s} {name}", layer_bytes, measure(issue, b.reps), group="floor", op="load1",
                    layout=layout, split=name)
        row["frac_of_ceiling"] = row["gbps"] / ceiling["load1"]
        print(f"   {100 * row['frac_of_ceiling']:5.1f}% of the contiguous layer copy  "
              f"[{layer_bytes / row['ms_max'] / 1e6:5.1f}-{layer_bytes / row['ms_min'] / 1e6:5.1f}]", flush=True)

    if args.ab:
        return ab_splits(args, b, ceiling, hosts, device_pool, slots, pages, mid, checks, check, layer_bytes,
                         side_copy_issue=lambda i: [side_copy(dev_layer, host_layer, copy_s)])

    units = (512, 128, 64, 32, 16)
    wrong = 0
    for layout in hosts:
        wrong += not check("batch", layout, batch_into_pages(layout))
        wrong += not check("auto", layout, engine_auto(layout))
        for r in units:
            wrong += not check(f"staged units {r}", layout, staged(layout, r))
    for share in (0.05, 0.25):
        dev_layer.zero_()
        contiguous_with_kernel(share, 16)(0)
        torch.cuda.synchronize()
        ok = torch.equal(dev_layer.cpu(), host_layer)
        checks.append({"name": f"contiguous with kernel share {share}", "ok": ok})
        print(f"check contiguous with kernel share {share}: {'ok' if ok else 'WRONG'}", flush=True)
        wrong += not ok
    _save_compare(args, b, ceiling, checks)
    timed("contiguous, 1 copy", lambda i: [side_copy(dev_layer, host_layer, copy_s)])
    timed("contiguous, 2 halves on 2 streams", contiguous_halves)
    timed("contiguous both sides, 1 batch of 1024 row copies", contiguous_rows)
    for share in (0.05, 0.1, 0.17, 0.25):
        for ctas in (8, 16, 32):
            timed(f"contiguous, {1 - share:.2f} copy engine + {share:.2f} UVA kernel ({ctas} CTAs)",
                  contiguous_with_kernel(share, ctas))
    for layout in hosts:
        timed("auto", engine_auto(layout), layout)
        timed("batch into pages", batch_into_pages(layout), layout)
        for r in units:
            timed(f"staged units {r} rows + index_copy scatter", staged(layout, r), layout)
        timed("auto (again)", engine_auto(layout), layout)
    timed("contiguous, 1 copy (again)", lambda i: [side_copy(dev_layer, host_layer, copy_s)])
    _save_compare(args, b, ceiling, checks)
    print(f"checks: {len(checks) - wrong} ok, {wrong} wrong")
    for host in hosts.values():
        host.close()
    return 1 if wrong else 0


AB_SPLITS = {
    "batch, whole layer": LoadSplit(1.0, ce_path="batch"),
    "batch latent + kernel indexer": LoadSplit(by="components", ce_path="batch"),
}


def ab_splits(args, b, ceiling, hosts, device_pool, slots, pages, mid, checks, check, layer_bytes, side_copy_issue) -> int:
    """Interleaved A/B: per round, every (layout, candidate) and the contiguous copy timed once."""
    candidates = {}
    for layout, host in hosts.items():
        auto = TransferEngine(device_pool, host, path="auto", timing=True)
        candidates[(layout, "auto")] = auto
        for name, split in AB_SPLITS.items():
            engine = TransferEngine(device_pool, host, path="mixed", timing=True)
            engine.options = replace(engine.options, load_split=split)
            candidates[(layout, name)] = engine

    def issue_of(engine):
        def issue(i):
            handle = engine.load(slots, pages, layers=[mid])
            return [handle.event(mid)]
        return issue

    wrong = 0
    for (layout, name), engine in candidates.items():
        wrong += not check(name, layout, issue_of(engine))
    issues = {("-", "contiguous, 1 copy"): side_copy_issue, **{key: issue_of(e) for key, e in candidates.items()}}
    keys = list(issues)
    for key in keys:  # warm-up
        measure(issues[key], 2, warmup=0)
    samples: dict = {key: [] for key in keys}
    for r in range(args.ab):
        shift = r % len(keys)
        for key in keys[shift:] + keys[:shift]:
            samples[key].append(measure(issues[key], 1, warmup=0)["ms"])
    contiguous = sorted(samples[("-", "contiguous, 1 copy")])
    for key in keys:
        ms = sorted(samples[key])
        med = ms[len(ms) // 2]
        row = {"name": f"ab {key[0]} {key[1]}", "group": "ab", "layout": key[0], "split": key[1], "op": "load1",
               "bytes": layer_bytes, "gbps": layer_bytes / med / 1e6, "ms": med, "ms_min": ms[0], "ms_max": ms[-1],
               "samples_ms": samples[key]}
        b.results.append(row)
        print(f"{key[0]:11s} {key[1]:32s} {row['gbps']:6.2f} GB/s, median {med:.4f} ms [{ms[0]:.4f}-{ms[-1]:.4f}] "
              f"= {100 * contiguous[len(contiguous) // 2] / med:5.1f}% of the contiguous copy's median", flush=True)
    _save_compare(args, b, ceiling, checks)
    print(f"checks: {len(checks) - wrong} ok, {wrong} wrong")
    for host in hosts.values():
        host.close()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
