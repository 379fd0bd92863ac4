"""Benchmark of L1 <-> L2 page transfers on a GPU (written for the H200), DeepSeek-V3.2 shapes.

    python benchmarks/transfer_gpu.py --out docs/benchmarks/transfer_gpu.json [--quick]

In one run: the ceiling (one contiguous 2 GiB pinned copy each way, and both ways at once), a
contiguous copy of one layer's bytes (the fair ceiling for a single-layer load), the naive torch
baseline, and every transfer path (``kernel``, ``direct``, ``staged``, ``mixed``, ``auto``) for the backup of
all layers, the load of one layer alone and the load of all 61 layers one after another, in both
host layouts, with host slots in runs (what the allocator hands out) and scattered; a sweep of the
UVA kernel's CTA budget and tile, of the copy-engine share of mixed loads and of the staging kernels'
budget; load and backup at the same time on two streams.

Timing: CUDA events, median of ``--reps`` after warm-up. Before each start event the measuring
stream sleeps on the GPU for ~20 ms, so the CPU has enqueued the whole transfer before the clock
starts: the numbers are device time (the CPU issue time is reported beside them; when it exceeds
the sleep it shows up in the device time too). Never imported by the library or the tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone

import torch
import triton

from tiered_kv import HostPool, allocate_engine_like, nsa_spec
from tiered_kv.kernels import copy_pages_uva, plan_uva_copy
from tiered_kv.kernels.uva_copy import DEFAULT_CTAS_ON_DEVICE
from tiered_kv.transfer import load_pairs
from tiered_kv.transfer_engine import TransferEngine

SLEEP_CYCLES = 40_000_000  # ~20 ms at 1.98 GHz: longer than any path's issue time below a few 100 ms


def fill_random(tensor: torch.Tensor) -> None:
    step = 1 << 28
    flat = tensor.view(-1)
    for start in range(0, flat.numel(), step):
        part = flat[start:start + step]
        part.copy_(torch.randint(0, 256, part.shape, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()


def measure(issue, reps: int, warmup: int = 2) -> dict:
    """Median device ms of ``issue(i) -> list of end events`` (from a start event before it)."""
    device_ms, issue_ms = [], []
    for i in range(warmup + reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        ends = issue(i)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        if i >= warmup:
            device_ms.append(max(start.elapsed_time(e) for e in ends))
            issue_ms.append((t1 - t0) * 1e3)
    return {"ms": statistics.median(device_ms), "ms_min": min(device_ms), "ms_max": max(device_ms),
            "issue_ms": statistics.median(issue_ms)}


def side_copy(dst: torch.Tensor, src: torch.Tensor, stream: torch.cuda.Stream):
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)
    end = torch.cuda.Event(enable_timing=True)
    end.record(stream)
    return end


class Bench:
    def __init__(self, args) -> None:
        self.args = args
        self.results: list[dict] = []
        self.spec = nsa_spec(61, 64)
        self.reps = args.reps

    def add(self, name: str, nbytes: int, timing: dict, **fields) -> dict:
        row = {"name": name, "bytes": nbytes, **fields, **timing, "gbps": nbytes / timing["ms"] / 1e6}
        self.results.append(row)
        print(f"{name:60s} {row['gbps']:7.2f} GB/s  {timing['ms']:8.3f} ms  issue {timing['issue_ms']:7.3f} ms", flush=True)
        return row


def save(b: Bench, args, ceiling: dict, layer_h2d: dict | None, naive: dict | None, *, done: bool = False) -> None:
    """Write everything measured so far (after every section, so a cut-off run keeps its numbers)."""
    spec = b.spec
    out = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "complete": done,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "spec": spec.describe(),
        "pages_per_transfer": args.pages,
        "device_pages": args.device_pages,
        "host_slots": args.host_slots,
        "reps": b.reps,
        "ceiling_gbps": ceiling,
        "layer_copy_gbps": layer_h2d["gbps"] if layer_h2d else None,
        "naive_gbps": {op: row["gbps"] for op, row in naive.items()} if naive else None,
        "results": b.results,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


def summarize(results: list[dict], ceiling: dict, layer_gbps: float, naive: dict) -> None:
    """The issue's targets for the default path (``auto``, slots in runs), one line each."""
    def row(**match):
        return next(r for r in results if all(r.get(k) == v for k, v in match.items()))

    print("\n== targets (default path: auto, host slots in runs) ==")
    for layout in ("page_first", "layer_first"):
        for op in ("backup", "load61"):
            r = row(group="paths", path="auto", layout=layout, op=op, slots="runs")
            print(f"{op:7s} {layout:11s} {r['gbps']:6.2f} GB/s = {100 * r['frac_of_ceiling']:5.1f}% of ceiling (target 95%)")
        r = row(group="paths", path="auto", layout=layout, op="load1", slots="runs")
        print(f"load1   {layout:11s} {r['gbps']:6.2f} GB/s = {100 * r['frac_of_layer_copy']:5.1f}% of a contiguous copy of the layer "
              f"({layer_gbps:.2f} GB/s; target 100%)")
        r = row(group="concurrent", layout=layout, load_path="auto", backup_path="auto")
        print(f"both    {layout:11s} {r['gbps']:6.2f} GB/s = {r['vs_one_direction']:.2f}x one direction (target 1.6x)")
    for op in ("backup", "load61"):
        best = max((r for r in results if r.get("group") == "cta_sweep" and r["op"] == op and r["ctas"] <= 16),
                   key=lambda r: r["gbps"])
        print(f"<=16 CTAs {op:7s} best {best['gbps']:6.2f} GB/s = {100 * best['frac_of_ceiling']:5.1f}% at {best['ctas']} CTAs "
              f"({best['layout']}; target 90%)")
    for op in ("backup", "load61"):
        r = row(group="paths", path="auto", layout="page_first", op=op, slots="runs")
        print(f"vs naive {op:7s} {r['gbps'] / naive[op]['gbps']:5.1f}x (target 10x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/benchmarks/transfer_gpu.json")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--pages", type=int, default=512, help="pages per transfer")
    parser.add_argument("--device-pages", type=int, default=2048)
    parser.add_argument("--host-slots", type=int, default=2048)
    parser.add_argument("--quick", action="store_true", help="fewer sweep points and reps")
    args = parser.parse_args()
    if args.quick:
        args.reps = 4
    torch.manual_seed(0)
    b = Bench(args)
    spec, n = b.spec, args.pages
    page_bytes = spec.page_bytes
    layer_bytes = n * sum(c.bytes_per_layer for c in spec.components)
    transfer_bytes = n * page_bytes
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
          f"{spec.describe()} | {n} pages = {transfer_bytes / 1e9:.3f} GB, one layer {layer_bytes / 1e6:.2f} MB", flush=True)

    # --- ceiling -------------------------------------------------------------------------------
    size = 2 << 30
    host_a = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    host_b = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    dev_a = torch.empty(size, dtype=torch.uint8, device="cuda")
    dev_b = torch.empty(size, dtype=torch.uint8, device="cuda")
    fill_random(dev_a)
    host_b.copy_(dev_a)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    reps = max(3, b.reps // 2)
    h2d = b.add("ceiling h2d 2 GiB contiguous", size, measure(lambda i: [side_copy(dev_b, host_b, s1)], reps),
                group="ceiling", op="h2d")
    d2h = b.add("ceiling d2h 2 GiB contiguous", size, measure(lambda i: [side_copy(host_a, dev_a, s1)], reps),
                group="ceiling", op="d2h")
    both = b.add("ceiling both ways 2 x 2 GiB contiguous", 2 * size,
                 measure(lambda i: [side_copy(host_a, dev_a, s1), side_copy(dev_b, host_b, s2)], reps),
                 group="ceiling", op="both")
    layer_h2d = b.add("contiguous h2d of one layer's bytes", layer_bytes,
                      measure(lambda i: [side_copy(dev_b[:layer_bytes], host_b[:layer_bytes], s1)], b.reps),
                      group="ceiling", op="layer_h2d")
    b.add("contiguous d2h of one layer's bytes", layer_bytes,
          measure(lambda i: [side_copy(host_a[:layer_bytes], dev_a[:layer_bytes], s1)], b.reps),
          group="ceiling", op="layer_d2h")
    del host_a, host_b, dev_a, dev_b
    torch.cuda.empty_cache()
    ceiling = {"backup": d2h["gbps"], "load61": h2d["gbps"], "load1": h2d["gbps"], "both": both["gbps"]}

    # --- pools and engines ---------------------------------------------------------------------
    device_pool = allocate_engine_like(spec, args.device_pages, "cuda")
    for ci in range(len(spec.components)):
        for layer in range(spec.num_layers):
            view = device_pool.chunk_view(ci, layer)
            view.copy_(torch.randint(0, 256, view.shape, dtype=torch.uint8, device="cuda"))
    hosts = {layout: HostPool(spec, args.host_slots, layout) for layout in ("page_first", "layer_first")}
    for host in hosts.values():
        fill_random(host.buffer)
    engines = {(layout, path): TransferEngine(device_pool, host, path=path, timing=True)
               for layout, host in hosts.items() for path in ("kernel", "direct", "staged", "mixed", "auto", "torch")}

    sets = 4
    page_sets = [torch.randperm(args.device_pages - 1)[:n] + 1 for _ in range(sets)]
    run_starts = [int(torch.randint(0, args.host_slots - n + 1, ()).item()) for _ in range(sets)]
    slot_sets = {"runs": [torch.arange(s, s + n) for s in run_starts],
                 "scattered": [torch.randperm(args.host_slots)[:n] for _ in range(sets)]}

    def backup(engine, slots_kind):
        return lambda i: [engine.backup(page_sets[i % sets], slot_sets[slots_kind][i % sets]).event]

    def load(engine, slots_kind, layers=None):
        def issue(i):
            handle = engine.load(slot_sets[slots_kind][i % sets], page_sets[i % sets], layers=layers)
            return [handle.event(handle.layers[-1])]
        return issue

    def run_ops(layout, path, slots_kind, reps, group="paths", ops=("backup", "load1", "load61")):
        engine = engines[(layout, path)]
        rows = {}
        for op in ops:
            if op == "backup":
                timing, nbytes = measure(backup(engine, slots_kind), reps), transfer_bytes
            elif op == "load61":
                timing, nbytes = measure(load(engine, slots_kind), reps), transfer_bytes
            else:
                timing, nbytes = measure(load(engine, slots_kind, [spec.num_layers // 2]), reps), layer_bytes
            if path == "torch":
                # The reference copies through pageable CPU memory synchronously: the device
                # events miss the CPU half, the caller's wall time does not.
                timing["ms"] = max(timing["ms"], timing["issue_ms"])
            frac = nbytes / timing["ms"] / 1e6 / ceiling[op]
            extra = {"frac_of_layer_copy": nbytes / timing["ms"] / 1e6 / layer_h2d["gbps"]} if op == "load1" else {}
            rows[op] = b.add(f"{path:7s} {op:7s} {layout:11s} slots {slots_kind}", nbytes, timing, group=group, op=op,
                             path=path, layout=layout, slots=slots_kind, frac_of_ceiling=frac, **extra)
        return rows

    # --- naive torch baseline ------------------------------------------------------------------
    naive = run_ops("page_first", "torch", "runs", 2, group="naive", ops=("backup", "load61"))

    save(b, args, ceiling, layer_h2d, naive)

    # --- every path, both layouts, slots in runs and scattered ---------------------------------
    for layout in hosts:
        for path in ("kernel", "auto"):
            for slots_kind in ("runs", "scattered"):
                run_ops(layout, path, slots_kind, b.reps)
        for path in ("staged", "mixed"):
            run_ops(layout, path, "runs", b.reps)
        run_ops(layout, "direct", "runs", 2)

    save(b, args, ceiling, layer_h2d, naive)

    # --- mixed loads: share of pages through the copy engines ----------------------------------
    for layout in hosts:
        engine = engines[(layout, "mixed")]
        for fraction in (0.0, 0.25, 0.4, 0.5, 0.6, 0.75, 1.0):
            engine.ce_fraction = fraction
            rows = run_ops(layout, "mixed", "runs", b.reps, group="ce_fraction", ops=("load1", "load61"))
            for row in rows.values():
                row["ce_fraction"] = fraction
                row["name"] += f" ce {fraction:.2f}"
        engine.ce_fraction = None  # back to the measured defaults

    # --- staging kernel budget (gather / scatter on the device) ---------------------------------
    for layout in hosts:
        for ctas in (2, 4, 8, 16):
            for path in ("staged", "mixed"):
                engine = engines[(layout, path)]
                for direction in ("load", "backup"):
                    engine.staging_copier(direction).num_ctas = ctas
                ops = ("backup",) if path == "staged" else ("load1", "load61")
                rows = run_ops(layout, path, "runs", b.reps, group="staging_ctas", ops=ops)
                for row in rows.values():
                    row["staging_ctas"] = ctas
                    row["name"] += f" staging ctas {ctas}"
        for path in ("staged", "mixed"):
            for direction in ("load", "backup"):
                engines[(layout, path)].staging_copier(direction).num_ctas = DEFAULT_CTAS_ON_DEVICE

    save(b, args, ceiling, layer_h2d, naive)

    # --- CTA budget sweep (kernel path) --------------------------------------------------------
    budgets = [1, 2, 4, 8, 16, 32, 132] if not args.quick else [4, 16, 132]
    for layout in hosts:
        engine = engines[(layout, "kernel")]
        for ctas in budgets:
            engine.num_ctas = ctas
            t = measure(backup(engine, "runs"), b.reps)
            b.add(f"kernel backup {layout:11s} ctas {ctas:3d}", transfer_bytes, t, group="cta_sweep", op="backup",
                  layout=layout, ctas=ctas, frac_of_ceiling=transfer_bytes / t["ms"] / 1e6 / ceiling["backup"])
            t = measure(load(engine, "runs"), b.reps)
            b.add(f"kernel load61 {layout:11s} ctas {ctas:3d}", transfer_bytes, t, group="cta_sweep", op="load61",
                  layout=layout, ctas=ctas, frac_of_ceiling=transfer_bytes / t["ms"] / 1e6 / ceiling["load61"])
            t = measure(load(engine, "runs", [spec.num_layers // 2]), b.reps)
            b.add(f"kernel load1  {layout:11s} ctas {ctas:3d}", layer_bytes, t, group="cta_sweep", op="load1",
                  layout=layout, ctas=ctas, frac_of_layer_copy=layer_bytes / t["ms"] / 1e6 / layer_h2d["gbps"])
        engine.num_ctas = None

    save(b, args, ceiling, layer_h2d, naive)

    # --- tile sweep (host -> device, 61 layers, page_first) ------------------------------------
    host = hosts["page_first"]
    stream = torch.cuda.Stream()
    plans = [plan_uva_copy(load_pairs(host, device_pool, layer)) for layer in range(spec.num_layers)]
    tiles = [(1024, 4), (2048, 4), (4096, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16)]
    for ctas in (16,):
        for block, warps in tiles:
            def issue(i, block=block, warps=warps, ctas=ctas):
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for plan in plans:
                        copy_pages_uva(plan, slot_sets["runs"][i % sets], page_sets[i % sets], num_ctas=ctas,
                                       block=block, num_warps=warps)
                end = torch.cuda.Event(enable_timing=True)
                end.record(stream)
                return [end]
            t = measure(issue, b.reps)
            b.add(f"uva h2d 61 layers ctas {ctas} block {block:5d} warps {warps:2d}", transfer_bytes, t, group="tile_sweep",
                  op="load61", ctas=ctas, block=block, warps=warps, frac_of_ceiling=transfer_bytes / t["ms"] / 1e6 / ceiling["load61"])

    save(b, args, ceiling, layer_h2d, naive)

    # --- load and backup at the same time -------------------------------------------------------
    # Backups of other pages into other slots, disjoint from the loads' pages and slots.
    backup_sets = []
    for k in range(sets):
        pages_b = torch.randperm(args.device_pages - 1)[: 2 * n] + 1
        pages_b = pages_b[~torch.isin(pages_b, page_sets[k])][:n]
        free_slots = torch.arange(args.host_slots)[~torch.isin(torch.arange(args.host_slots), slot_sets["runs"][k])]
        start = int(torch.randint(0, free_slots.numel() - pages_b.numel() + 1, ()).item())
        backup_sets.append((pages_b, free_slots[start:start + pages_b.numel()]))
    backup_bytes = statistics.mean(p.numel() for p, _ in backup_sets) * page_bytes

    def concurrent(layout, load_path, backup_path):
        le, be = engines[(layout, load_path)], engines[(layout, backup_path)]

        def issue(i):
            k = i % sets
            bh = be.backup(*backup_sets[k])
            lh = le.load(slot_sets["runs"][k], page_sets[k])
            return [bh.event, lh.event(lh.layers[-1])]
        return issue

    for layout in hosts:
        for load_path, backup_path in (("auto", "auto"), ("mixed", "staged"), ("staged", "staged"),
                                       ("kernel", "kernel"), ("kernel", "staged")):
            t = measure(concurrent(layout, load_path, backup_path), b.reps)
            nbytes = int(transfer_bytes + backup_bytes)
            b.add(f"load {load_path} + backup {backup_path} {layout}", nbytes, t, group="concurrent", op="both",
                  layout=layout, load_path=load_path, backup_path=backup_path,
                  frac_of_ceiling=nbytes / t["ms"] / 1e6 / ceiling["both"],
                  vs_one_direction=nbytes / t["ms"] / 1e6 / max(h2d["gbps"], d2h["gbps"]))

    save(b, args, ceiling, layer_h2d, naive, done=True)
    summarize(b.results, ceiling, layer_h2d["gbps"], naive)
    print(f"wrote {args.out}")
    for host in hosts.values():
        host.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
