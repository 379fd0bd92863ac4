"""Benchmark of L1 <-> L2 page transfers on a GPU (written for the H200), DeepSeek-V3.2 shapes.

    python benchmarks/transfer_gpu.py --out docs/benchmarks/transfer_gpu.json [--quick]
    python benchmarks/transfer_gpu.py --compare splits|blocks --out compare.json   # load splits vs `auto`

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
import functools
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone

import torch
import triton

from tiered_kv import HostPool, allocate_engine_like, nsa_spec
from tiered_kv.kernels import copy_pages_reference, copy_pages_uva, owned_streams, plan_uva_copy
from tiered_kv.kernels.uva_copy import DEFAULT_CTAS_ON_DEVICE
from tiered_kv.transfers.torch_path import backup_pairs, load_pairs
from tiered_kv.transfers.engine import BackupHandle, LoadSplit, TransferEngine, TransferOptions
from tiered_kv.transfers.policy import LOAD_STREAM_PRIORITY

SLEEP_CYCLES = 80_000_000  # ~40 ms at 1.98 GHz: longer than any path's issue time (load + backup: ~20 ms)


def fill_random(tensor: torch.Tensor) -> None:
    step = 1 << 28
    flat = tensor.view(-1)
    for start in range(0, flat.numel(), step):
        part = flat[start:start + step]
        part.copy_(torch.randint(0, 256, part.shape, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()


def _end_events(item) -> list[torch.cuda.Event]:
    """The end events of one item of ``issue``'s list: an event, a load handle (every layer's
    event: layers issued by several library threads land on several streams) or a backup handle
    (its event, which library threads may record); fetching them waits for the threads to record
    them, outside the caller's issue time."""
    if hasattr(item, "layers"):
        return [item.event(layer) for layer in item.layers]
    return [item.event] if isinstance(item, BackupHandle) else [item]


#: Engine attributes that hold objects with streams of their own (its issue threads).
ENGINE_STREAM_HOLDERS = ("_issuer", "_backup_issuer")


def engine_stream_handles(engine, stream_type: type = torch.cuda.Stream) -> dict[str, int]:
    """Every stream ``engine`` holds, by attribute path, as its handle (``cuda_stream``): the
    engine's own attributes (lists too) and its issue threads' ``streams``."""
    found: dict[str, int] = {}

    def visit(name: str, value) -> None:
        if isinstance(value, stream_type):
            found[name] = value.cuda_stream
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(f"{name}[{i}]", item)

    for name, value in vars(engine).items():
        visit(name, value)
    for holder in ENGINE_STREAM_HOLDERS:
        streams = getattr(getattr(engine, holder, None), "streams", None)
        if streams is not None:
            visit(f"{holder}.streams", streams)
    return found


def pool_stream_engine(*args, **kwargs) -> TransferEngine:
    """A ``TransferEngine(*args, **kwargs)`` whose streams are torch's pool streams, as every
    engine's were before the library owned its streams (``kernels.owned_streams``, twenty-third
    session): its lease is made while the process has no lender, and keeps none."""
    lender = owned_streams.default_lender
    owned_streams.default_lender = lambda: None
    try:
        engine = TransferEngine(*args, **kwargs)
    finally:
        owned_streams.default_lender = lender
    if engine._streams.owned:
        raise RuntimeError("the engine took owned streams")
    return engine


def side_stream(avoid=(), *, tries: int = 64, make=None):
    """A new stream whose handle is none of ``avoid``. ``torch.cuda.Stream()`` hands out the
    streams of a pool of 32 per priority round-robin, so a "new" stream can be one an engine
    already uses: the busy-GPU 40.6% of 2026-12-03 was a backup queued behind the 40 ms sleep put
    on such a stream (docs/benchmarks.md, twenty-second session)."""
    make = make or torch.cuda.Stream
    avoid = set(avoid)
    for _ in range(tries):
        stream = make()
        if stream.cuda_stream not in avoid:
            return stream
    raise RuntimeError(f"no new stream in {tries} is free of the {len(avoid)} to avoid")


def measure(issue, reps: int, warmup: int = 2, *, sleep: bool | str = True, engine=None) -> dict:
    """Median device ms of ``issue(i) -> list of end events or load handles`` (from a start event
    before it), the caller's issue time (wall and its thread's CPU) and the CPU the op costs in
    the whole process (every thread, from the issue until the device finished; the wait polls).
    ``sleep``: True, the device sleeps about 40 ms before the start event, so the issue runs
    ahead of it and the time is the device's alone; False, nothing before it: the time counts
    from the call on an idle GPU (an issue slower than the copies shows, and so do clocks that
    rise only once work arrives); ``"beside"``, the same sleep on a stream of its own that the op
    does not wait for: from the call, on a GPU already busy (its clocks up, as beside a model).
    That stream is none of ``engine``'s (``side_stream``), taken once the warmup reps have made
    the engine's lazily made streams; the warmup reps run without the sleep."""
    if sleep not in (True, False, "beside"):
        raise ValueError(f"measure: sleep must be True, False or 'beside', got {sleep!r}")
    side = None
    device_ms, issue_ms, caller_cpu, cpu = [], [], [], []
    for i in range(warmup + reps):
        torch.cuda.synchronize()
        if sleep == "beside" and i == warmup:
            side = side_stream(engine_stream_handles(engine).values() if engine is not None else ())
        if side is not None:
            with torch.cuda.stream(side):
                torch.cuda._sleep(SLEEP_CYCLES)
        elif sleep is True:
            torch.cuda._sleep(SLEEP_CYCLES)
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        items = issue(i)
        t1, c1 = time.perf_counter(), time.thread_time()
        ends = [end for item in items for end in _end_events(item)]
        for end in ends:
            while not end.query():
                time.sleep(0.0002)
        p1 = time.process_time()
        torch.cuda.synchronize()
        if i >= warmup:
            device_ms.append(max(start.elapsed_time(e) for e in ends))
            issue_ms.append((t1 - t0) * 1e3)
            caller_cpu.append((c1 - c0) * 1e3)
            cpu.append((p1 - p0) * 1e3)
    return {"ms": statistics.median(device_ms), "ms_min": min(device_ms), "ms_max": max(device_ms), "ms_each": device_ms,
            "issue_ms": statistics.median(issue_ms), "caller_cpu_ms": statistics.median(caller_cpu),
            "cpu_ms": statistics.median(cpu)}


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
        print(f"{name:60s} {row['gbps']:7.2f} GB/s  {timing['ms']:8.3f} ms  issue {timing['issue_ms']:7.3f} ms"
              f"  cpu {timing.get('cpu_ms', float('nan')):7.2f} ms", flush=True)
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

    print("\n== targets (default path: auto) ==")
    for layout in ("page_first", "layer_first"):
        for slots in ("runs", "scattered"):
            for op in ("backup", "load61"):
                r = row(group="paths", path="auto", layout=layout, op=op, slots=slots)
                print(f"{op:7s} {layout:11s} {slots:9s} {r['gbps']:6.2f} GB/s = {100 * r['frac_of_ceiling']:5.1f}% of ceiling "
                      f"(target 95%); issue {r['issue_ms']:6.2f} ms = {100 * r['issue_share']:5.1f}% of its device time, "
                      f"cpu {r['cpu_ms']:6.2f} ms")
                called = [r for r in results if r.get("group") in FROM_CALL_GROUPS and r["path"] == "auto"
                          and r["layout"] == layout and r["op"] == op and r["slots"] == slots]
                for r in called:
                    print(f"{op:7s} {layout:11s} {slots:9s} {r['gbps']:6.2f} GB/s = {100 * r['frac_of_ceiling']:5.1f}% of ceiling "
                          f"timed {FROM_CALL_GROUPS[r['group']][1]}")
            r = row(group="paths", path="auto", layout=layout, op="load1", slots=slots)
            print(f"load1   {layout:11s} {slots:9s} {r['gbps']:6.2f} GB/s = {100 * r['frac_of_layer_copy']:5.1f}% of a contiguous "
                  f"copy of the layer ({layer_gbps:.2f} GB/s)")
            for order in ("backup first", "load first"):
                try:
                    r = row(group="both", layout=layout, load_path="auto", backup_path="auto", slots=slots, order=order)
                except StopIteration:  # a record from before the order was kept
                    continue
                print(f"both    {layout:11s} {slots:9s} {r['gbps']:6.2f} GB/s = {r['vs_one_direction']:.2f}x one direction "
                      f"(target 1.6x), {order}")
            for factor in (0.5, 1.25):
                # ``auto`` and ``auto`` told that the model computes beside it (``beside_compute``).
                for path, label in (("auto", ""), ("auto beside compute", " (beside_compute)")):
                    try:
                        r = row(group="beside_compute", path=path, layout=layout, slots=slots, factor=factor)
                    except StopIteration:
                        continue
                    print(f"beside  {layout:11s} {slots:9s} {factor}x compute{label}: hidden {r['hidden_fraction']:5.2f} "
                          f"(target 0.9), compute slowdown {r['compute_slowdown']:5.3f} (target 1.05)")
    for op in ("backup", "load61"):
        swept = [r for r in results if r.get("group") == "cta_sweep" and r["op"] == op and r["ctas"] <= 16]
        if not swept:
            print(f"<=16 CTAs {op:7s} not swept in this run (--no-sweeps)")
            continue
        best = max(swept, key=lambda r: r["gbps"])
        print(f"<=16 CTAs {op:7s} best {best['gbps']:6.2f} GB/s = {100 * best['frac_of_ceiling']:5.1f}% at {best['ctas']} CTAs "
              f"({best['layout']}; target 90%)")
    for op in ("backup", "load61"):
        r = row(group="paths", path="auto", layout="page_first", op=op, slots="runs")
        print(f"vs naive {op:7s} {r['gbps'] / naive[op]['gbps']:5.1f}x (target 10x)")


def measure_ceilings(b: "Bench", layer_bytes: int, *, layer_d2h: bool = False):
    """The ceilings of a run: 2 GiB contiguous pinned copies each way and both ways at once, and a
    contiguous copy of one layer's bytes. Returns (h2d, d2h, both, layer_h2d, a pinned host copy
    of one layer's worth of random bytes)."""
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
    if layer_d2h:
        b.add("contiguous d2h of one layer's bytes", layer_bytes,
              measure(lambda i: [side_copy(host_a[:layer_bytes], dev_a[:layer_bytes], s1)], b.reps),
              group="ceiling", op="layer_d2h")
    host_layer = torch.empty(layer_bytes, dtype=torch.uint8, pin_memory=True)
    host_layer.copy_(host_b[:layer_bytes])
    return h2d, d2h, both, layer_h2d, host_layer  # the 2 GiB buffers go with this frame


def random_pools(spec, args) -> tuple:
    """A device pool shaped like the engine's and a pinned host pool per layout, all random bytes."""
    device_pool = allocate_engine_like(spec, args.device_pages, "cuda")
    for ci in range(len(spec.components)):
        for layer in range(spec.num_layers):
            view = device_pool.chunk_view(ci, layer)
            view.copy_(torch.randint(0, 256, view.shape, dtype=torch.uint8, device="cuda"))
    hosts = {layout: HostPool(spec, args.host_slots, layout) for layout in ("page_first", "layer_first")}
    for host in hosts.values():
        fill_random(host.buffer)
    return device_pool, hosts


def backup_copies_every_byte(engine, device_pool, host: HostPool, pages: torch.Tensor, slots: torch.Tensor,
                             options: TransferOptions | None = None) -> bool:
    """One backup of ``pages`` into ``slots`` (their host bytes poisoned first), checked byte for byte."""
    spec = host.spec
    for ci in range(len(spec.components)):
        for layer in range(spec.num_layers):
            host.chunk_view(ci, layer)[slots] = 0
    engine.backup(pages, slots, options=options).synchronize()
    return all(torch.equal(h[slots], d[pages.to(d.device)].cpu()) for d, h in backup_pairs(device_pool, host))


def load_copies_every_byte(engine, device_pool, host: HostPool, slots: torch.Tensor, pages: torch.Tensor,
                           options: TransferOptions | None = None) -> bool:
    """One load of ``slots`` into ``pages`` (every layer's device bytes poisoned first), checked byte for byte."""
    layers = range(host.spec.num_layers)
    for layer in layers:
        for _, d in load_pairs(host, device_pool, layer):
            d[pages.to(d.device)] = 0
    engine.load(slots, pages, options=options).synchronize()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return all(torch.equal(h[slots], d[pages.to(d.device)].cpu())
               for layer in layers for h, d in load_pairs(host, device_pool, layer))


def runs_of(length: int, count: int, num_slots: int) -> torch.Tensor:
    """``count`` slots of ``num_slots`` in whole blocks of ``length`` adjacent slots at random places."""
    blocks = torch.randperm(num_slots // length)[: -(-count // length)]
    return (blocks[:, None] * length + torch.arange(length)).flatten()[:count]


def id_sets(args, sets: int) -> tuple[list[torch.Tensor], dict[str, list[torch.Tensor]]]:
    """``sets`` random device page lists and host slot lists, in one run each or scattered."""
    n = args.pages
    page_sets = [torch.randperm(args.device_pages - 1)[:n] + 1 for _ in range(sets)]
    run_starts = [int(torch.randint(0, args.host_slots - n + 1, ()).item()) for _ in range(sets)]
    return page_sets, {"runs": [torch.arange(s, s + n) for s in run_starts],
                       "scattered": [torch.randperm(args.host_slots)[:n] for _ in range(sets)],
                       "runs of 4": [runs_of(4, n, args.host_slots) for _ in range(sets)],
                       "runs of 16": [runs_of(16, n, args.host_slots) for _ in range(sets)]}


#: Candidate loads by name, (path, options), shared by the variants and the beside-compute groups.
CANDIDATES = {
    "ce blocks 8 on 1 issue thread": ("mixed", TransferOptions(load_split=LoadSplit(1.0, layers_per_copy=8), issue_threads=1)),
    "ce 0.8 blocks 8 ramp + kernel 0.2": (
        "mixed", TransferOptions(load_split=LoadSplit(0.8, layers_per_copy=8, kernel_blocks=8, ramp=True), issue_threads=1)),
    "kernel 0.7 + batch 0.3 on 1 thread": (
        "mixed", TransferOptions(load_split=LoadSplit(0.3, ce_path="batch", kernel_blocks=8, ramp=True), issue_threads=1)),
    "kernel 0.6 + batch 0.4 on 1 thread": (
        "mixed", TransferOptions(load_split=LoadSplit(0.4, ce_path="batch", kernel_blocks=8, ramp=True), issue_threads=1)),
    "kernel per layer": ("kernel", TransferOptions(load_split=LoadSplit())),
    "kernel 8 ctas": ("kernel", TransferOptions(num_ctas=8)),
    "kernel on 1 issue thread": ("kernel", TransferOptions(issue_threads=1)),
    "mixed caller thread": ("mixed", TransferOptions(issue_threads=0)),
    "mixed backup ce 0.15": ("mixed", TransferOptions(backup_ce_fraction=0.15)),
    "batch 4 issue threads": ("batch", TransferOptions(issue_threads=4)),
}


def _named(*names: str) -> list[tuple[str, str, TransferOptions]]:
    return [(name, *CANDIDATES[name]) for name in names]


#: Timed from the call as well (``from_call`` group): ``auto``, the kernel, and the idle copy-engine
#: split whose idle numbers need the issue to run ahead of the device (docs/benchmarks.md,
#: "Twenty-first session").
FROM_CALL = [("auto", "auto", None), ("kernel", "kernel", None)] + _named("ce 0.8 blocks 8 ramp + kernel 0.2")
#: The groups they are timed in: group -> (``measure``'s sleep, what the summary calls it).
FROM_CALL_GROUPS = {"from_call": (False, "from the call, idle GPU"), "from_call_busy": ("beside", "from the call, busy GPU")}

#: Item 1's candidates, (name, path, options): copy engines with staged layer blocks (page pitched
#: rows), beside a kernel share, the kernel with batch shares, per layer or with fewer CTAs, mixed
#: backups, batched copies from library issue threads.
VARIANTS = _named("ce blocks 8 on 1 issue thread", "ce 0.8 blocks 8 ramp + kernel 0.2", "kernel 0.7 + batch 0.3 on 1 thread",
                  "kernel 0.6 + batch 0.4 on 1 thread", "kernel per layer", "kernel 8 ctas", "mixed backup ce 0.15",
                  "batch 4 issue threads")


def backup_sets_beside(args, page_sets, load_slot_sets, *, scattered: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per id set, a backup of other pages into other slots (a run, or ``scattered`` over the
    free slots), disjoint from the load's."""
    n, out = args.pages, []
    for pages, slots in zip(page_sets, load_slot_sets):
        pages_b = torch.randperm(args.device_pages - 1)[: 2 * n] + 1
        pages_b = pages_b[~torch.isin(pages_b, pages)][:n]
        free = torch.arange(args.host_slots)[~torch.isin(torch.arange(args.host_slots), slots)]
        if scattered:
            out.append((pages_b, free[torch.randperm(free.numel())[:pages_b.numel()]]))
            continue
        start = int(torch.randint(0, free.numel() - pages_b.numel() + 1, ()).item())
        out.append((pages_b, free[start:start + pages_b.numel()]))
    return out


def print_compare(results: list[dict], group: str, width: int, *, issue: bool = False) -> None:
    """The rows of one compare group: GB/s, % of the ceiling (both: x one direction), [slowest-fastest]."""
    for r in results:
        if r.get("group") == group:
            extra = f"{r['vs_one_direction']:.2f}x" if r["op"] == "both" else f"{100 * r['frac_of_ceiling']:5.1f}%"
            where = f"{r['layout']:16s} {r.get('slots', ''):9s}"
            print(f"{r['op']:6s} {where} {r['split']:{width}s} {r['gbps']:6.2f} {extra}  "
                  f"[{r['bytes'] / r['ms_max'] / 1e6:5.1f}-{r['bytes'] / r['ms_min'] / 1e6:5.1f}]"
                  + (f" issue {r['issue_ms']:.2f} ms" if issue else ""))


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The transfer shape every GPU transfer benchmark shares: pages per transfer and pool sizes."""
    parser.add_argument("--pages", type=int, default=512, help="pages per transfer")
    parser.add_argument("--device-pages", type=int, default=2048)
    parser.add_argument("--host-slots", type=int, default=2048)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/benchmarks/transfer_gpu.json")
    parser.add_argument("--reps", type=int, default=10)
    add_shape_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="fewer sweep points and reps")
    parser.add_argument("--no-sweeps", action="store_true",
                        help="skip the CTA, tile, ce_fraction and staging sweeps (ceilings, paths and load + backup only)")
    parser.add_argument("--beside-reps", type=int, default=3, help="repetitions of each beside-compute measurement")
    parser.add_argument("--beside-paths", default="",
                        help="comma-separated names of the beside-compute loads to run (default: all of BESIDE)")
    parser.add_argument("--compare", choices=("splits", "blocks", "batch", "single", "both", "ctas"),
                        help="only these candidate load splits (or the batch path) against `auto` (see _candidates)")
    args = parser.parse_args()
    if args.compare in ("batch", "single", "both", "ctas"):
        return compare_batch(args)
    if args.compare:
        return compare(args)
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
    h2d, d2h, both, layer_h2d, _ = measure_ceilings(b, layer_bytes, layer_d2h=True)
    torch.cuda.empty_cache()
    ceiling = {"backup": d2h["gbps"], "load61": h2d["gbps"], "load1": h2d["gbps"], "both": both["gbps"]}

    # --- pools and engines ---------------------------------------------------------------------
    device_pool, hosts = random_pools(spec, args)
    engines = {(layout, path): TransferEngine(device_pool, host, path=path, timing=True)
               for layout, host in hosts.items() for path in ("kernel", "direct", "batch", "staged", "mixed", "auto", "torch")}

    sets = 4
    page_sets, slot_sets = id_sets(args, sets)

    def backup(engine, slots_kind, options=None):
        return lambda i: [engine.backup(page_sets[i % sets], slot_sets[slots_kind][i % sets], options=options)]

    def load(engine, slots_kind, layers=None, options=None):
        def issue(i):
            return [engine.load(slot_sets[slots_kind][i % sets], page_sets[i % sets], layers=layers, options=options)]
        return issue

    def run_ops(layout, path, slots_kind, reps, group="paths", ops=("backup", "load1", "load61"), options=None,
                name=None, sleep=True):
        engine = engines[(layout, path)]
        rows = {}
        timed = functools.partial(measure, reps=reps, sleep=sleep, engine=engine)
        for op in ops:
            if op == "backup":
                timing, nbytes = timed(backup(engine, slots_kind, options)), transfer_bytes
            elif op == "load61":
                timing, nbytes = timed(load(engine, slots_kind, options=options)), transfer_bytes
            else:
                timing, nbytes = timed(load(engine, slots_kind, [spec.num_layers // 2], options)), layer_bytes
            if path == "torch":
                # The reference copies through pageable CPU memory synchronously: the device
                # events miss the CPU half, the caller's wall time does not.
                timing["ms"] = max(timing["ms"], timing["issue_ms"])
            frac = nbytes / timing["ms"] / 1e6 / ceiling[op]
            extra = {"frac_of_layer_copy": nbytes / timing["ms"] / 1e6 / layer_h2d["gbps"]} if op == "load1" else {}
            rows[op] = b.add(f"{name or path:7s} {op:7s} {layout:11s} slots {slots_kind}", nbytes, timing, group=group,
                             op=op, path=name or path, layout=layout, slots=slots_kind, frac_of_ceiling=frac,
                             issue_share=timing["issue_ms"] / timing["ms"], **extra)
        return rows

    # --- naive torch baseline ------------------------------------------------------------------
    naive = run_ops("page_first", "torch", "runs", 2, group="naive", ops=("backup", "load61"))

    save(b, args, ceiling, layer_h2d, naive)

    # --- every path, both layouts, slots in runs and scattered ---------------------------------
    for layout in hosts:
        for path in ("kernel", "auto", "staged", "mixed", "batch"):
            for slots_kind in ("runs", "scattered"):
                run_ops(layout, path, slots_kind, b.reps)
        for slots_kind in ("runs", "scattered"):
            run_ops(layout, "direct", slots_kind, 2)
        save(b, args, ceiling, layer_h2d, naive)

    # --- the same targets timed from the call: no device sleep ahead of the issue, so a path whose
    # issue is slower than its copies shows it (``measure(sleep=False)``) ------------------------
    # On an idle GPU (``from_call``) and on one kept busy by a sleep on a stream the op does not wait
    # for (``from_call_busy``: clocks up, as beside a model's kernels).
    for layout in hosts:
        for name, path, options in FROM_CALL:
            for slots_kind in ("runs", "scattered"):
                for group, (sleep, _) in FROM_CALL_GROUPS.items():
                    run_ops(layout, path, slots_kind, b.reps, group=group, ops=("backup", "load61") if path != "mixed"
                            else ("load61",), options=options, name=name, sleep=sleep)
        save(b, args, ceiling, layer_h2d, naive)

    # --- item 1 candidates: the same ops with explicit options (copy engines only, staged layer
    # blocks, fewer CTAs, library issue threads), and slots in short runs (what an allocator that
    # keeps runs together gives after churn) ----------------------------------------------------
    for layout in hosts:
        for name, path, options in VARIANTS:
            for slots_kind in ("scattered", "runs"):
                if slots_kind == "runs" and not name.startswith("ce"):
                    continue
                ops = ("backup",) if "backup" in name else ("backup", "load61") if path in ("kernel", "batch") else ("load61",)
                run_ops(layout, path, slots_kind, b.reps, group="variants", ops=ops, options=options, name=name)
        for slots_kind in ("runs of 4", "runs of 16"):
            for path in ("auto", "kernel"):
                run_ops(layout, path, slots_kind, b.reps, group="allocator", ops=("backup", "load61"))
        save(b, args, ceiling, layer_h2d, naive)

    def finish() -> int:
        """Load + backup at once, beside compute, then the summary (the last sections of every run)."""
        concurrent_section(b, args, engines, hosts, page_sets, slot_sets, sets, transfer_bytes, page_bytes, h2d, d2h, ceiling)
        save(b, args, ceiling, layer_h2d, naive)
        global BESIDE
        wanted = set(filter(None, args.beside_paths.split(",")))
        unknown = wanted - {name for name, _, _ in BESIDE}
        if unknown:
            raise SystemExit(f"--beside-paths: no such beside-compute load: {', '.join(sorted(unknown))}")
        if wanted:
            BESIDE = [entry for entry in BESIDE if entry[0] in wanted]
        floor = FloorLoader(spec.num_layers, layer_bytes)
        if not floor.copied_every_byte():
            raise SystemExit("the floor loader lost bytes")
        beside_compute(b, engines, hosts, page_sets, slot_sets, sets, reps=args.beside_reps, floor=floor)
        del floor
        save(b, args, ceiling, layer_h2d, naive, done=True)
        summarize(b.results, ceiling, layer_h2d["gbps"], naive)
        print(f"wrote {args.out}")
        for host in hosts.values():
            host.close()
        return 0

    if args.no_sweeps:
        return finish()

    # --- mixed loads: share of pages through the copy engines ----------------------------------
    for layout in hosts:
        engine = engines[(layout, "mixed")]
        for fraction in (0.0, 0.25, 0.4, 0.5, 0.6, 0.75, 1.0):
            engine.options = replace(engine.options, ce_fraction=fraction)
            rows = run_ops(layout, "mixed", "runs", b.reps, group="ce_fraction", ops=("load1", "load61"))
            for row in rows.values():
                row["ce_fraction"] = fraction
                row["name"] += f" ce {fraction:.2f}"
        engine.options = replace(engine.options, ce_fraction=None)  # back to the measured defaults

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
            engine.options = replace(engine.options, num_ctas=ctas)
            t = measure(backup(engine, "runs"), b.reps)
            b.add(f"kernel backup {layout:11s} ctas {ctas:3d}", transfer_bytes, t, group="cta_sweep", op="backup",
                  layout=layout, ctas=ctas, frac_of_ceiling=transfer_bytes / t["ms"] / 1e6 / ceiling["backup"])
            t = measure(load(engine, "runs"), b.reps)
            b.add(f"kernel load61 {layout:11s} ctas {ctas:3d}", transfer_bytes, t, group="cta_sweep", op="load61",
                  layout=layout, ctas=ctas, frac_of_ceiling=transfer_bytes / t["ms"] / 1e6 / ceiling["load61"])
            t = measure(load(engine, "runs", [spec.num_layers // 2]), b.reps)
            b.add(f"kernel load1  {layout:11s} ctas {ctas:3d}", layer_bytes, t, group="cta_sweep", op="load1",
                  layout=layout, ctas=ctas, frac_of_layer_copy=layer_bytes / t["ms"] / 1e6 / layer_h2d["gbps"])
        engine.options = replace(engine.options, num_ctas=None)

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
    return finish()


def issue_pair(load, backup, order: str) -> list:
    """Issue a load and a backup (calls without arguments) in ``order`` (``"backup first"`` or
    ``"load first"``); their handles."""
    first, second = (load, backup) if order == "load first" else (backup, load)
    return [first(), second()]


def concurrent_section(b, args, engines, hosts, page_sets, slot_sets, sets, transfer_bytes, page_bytes, h2d, d2h,
                       ceiling) -> None:
    """Load (61 layers) and backup (all layers) at the same time on the engine's two streams."""
    beside = {"runs": backup_sets_beside(args, page_sets, slot_sets["runs"]),
              "scattered": backup_sets_beside(args, page_sets, slot_sets["scattered"], scattered=True)}
    backup_bytes = statistics.mean(p.numel() for p, _ in beside["runs"]) * page_bytes

    def concurrent(layout, load_path, backup_path, split=None, slots_kind="runs", options=None, order="backup first"):
        le, be = engines[(layout, load_path)], engines[(layout, backup_path)]
        if split is not None:
            options = replace(options or TransferOptions(), load_split=split)

        def issue(i):
            k = i % sets
            return issue_pair(lambda: le.load(slot_sets[slots_kind][k], page_sets[k], options=options),
                              lambda: be.backup(*beside[slots_kind][k]), order)
        return issue

    spec = b.spec
    variants = [("auto", "auto", None, "auto"), ("mixed", "staged", None, "mixed"), ("staged", "staged", None, "staged"),
                ("kernel", "kernel", None, "kernel"), ("kernel", "staged", None, "kernel"),
                ("batch", "staged", None, "batch"),
                ("mixed", "staged", LoadSplit(1.0), "staged, one layer per copy"),
                ("mixed", "staged", LoadSplit(1.0, layers_per_copy=4), "staged, blocks of 4 layers"),
                ("mixed", "staged", LoadSplit(1.0, layers_per_copy=16), "staged, blocks of 16 layers"),
                ("mixed", "staged", LoadSplit(1.0, layers_per_copy=spec.num_layers), "staged, whole slots")]
    scattered_variants = [("auto", "auto", None, "auto"), ("mixed", "staged", None, "mixed"),
                          ("kernel", "kernel", None, "kernel"), ("batch", "staged", None, "batch"),
                          ("batch", "kernel", None, "batch"),
                          ("kernel", "staged", None, "kernel"),
                          ("mixed", "staged", LoadSplit(1.0, layers_per_copy=8), "staged, blocks of 8 layers"),
                          ("mixed", "mixed", LoadSplit(0.3, ce_path="batch", kernel_blocks=8, ramp=True),
                           "kernel 0.7 + batch 0.3")]
    for layout in hosts:
        for slots_kind, chosen in (("runs", variants), ("scattered", scattered_variants)):
            # Every pair with the backup issued first; ``auto`` also with the load first (a backup
            # then sees the load in flight: ``transfer_policy.MIXED_BACKUPS_BESIDE_LOAD``).
            for load_path, backup_path, split, name, order in [(*v, "backup first") for v in chosen] + [
                    ("auto", "auto", None, "auto", "load first")]:
                t = measure(concurrent(layout, load_path, backup_path, split, slots_kind, order=order), b.reps)
                nbytes = int(transfer_bytes + backup_bytes)
                label = "" if order == "backup first" else f" ({order})"
                b.add(f"load {name} + backup {backup_path}{label} {layout} {slots_kind}", nbytes, t, group="both", op="both",
                      layout=layout, slots=slots_kind, load_path=load_path if split is None else name,
                      backup_path=backup_path, order=order, frac_of_ceiling=nbytes / t["ms"] / 1e6 / ceiling["both"],
                      vs_one_direction=nbytes / t["ms"] / 1e6 / max(h2d["gbps"], d2h["gbps"]))


#: Beside compute: (name, path, options) of the loads timed beside the model's matmuls.
BESIDE = [("auto", "auto", None), ("auto beside compute", "auto", TransferOptions(beside_compute=True)),
          ("kernel", "kernel", None)] + _named(
    "kernel 8 ctas", "kernel on 1 issue thread", "mixed caller thread", "ce blocks 8 on 1 issue thread",
    "ce 0.8 blocks 8 ramp + kernel 0.2", "kernel 0.7 + batch 0.3 on 1 thread", "kernel 0.6 + batch 0.4 on 1 thread",
    "batch 4 issue threads")


def matmul_ms(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, m: int, stream: torch.cuda.Stream) -> float:
    """Device ms of one ``x[:m] @ weight`` into ``y[:m]`` on ``stream`` (the mean of 20, after 3)."""
    with torch.cuda.stream(stream):
        for _ in range(3):
            torch.matmul(x[:m], weight, out=y[:m])
        s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s0.record()
        for _ in range(20):
            torch.matmul(x[:m], weight, out=y[:m])
        s1.record()
    torch.cuda.synchronize()
    return s0.elapsed_time(s1) / 20


def matmul_rows_for(per_matmul_ms: float, x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor,
                    stream: torch.cuda.Stream) -> int:
    """Rows (a multiple of 128, at most ``x``'s) whose matmul takes ``per_matmul_ms``: a linear
    guess, then two corrections measured at the guess (a matmul's time per row shrinks as it grows)."""
    m = 8192
    for _ in range(3):
        m = max(128, min(x.shape[0], int(round(m * per_matmul_ms / matmul_ms(x, weight, y, m, stream) / 128)) * 128))
    return m


#: The compute alone must come within this share of ``factor`` x the load (``calibrated_rows``).
CALIBRATION_TOLERANCE = 0.03


def rescaled_rows(m: int, target_ms: float, measured_ms: float, cap: int) -> int:
    """Rows for the next try at ``target_ms`` after ``m`` rows took ``measured_ms``: scaled by
    their ratio, a multiple of 128 in [128, ``cap``]."""
    return max(128, min(cap, int(round(m * target_ms / measured_ms / 128)) * 128))


def calibrated_rows(m: int, target_ms: float, measure, cap: int, tries: int = 4) -> tuple[int, dict]:
    """Rows whose whole compute alone (``measure(m)`` -> a ``compute_timeline`` row) ends within
    ``CALIBRATION_TOLERANCE`` of ``target_ms``, from the single-matmul guess ``m``: a matmul timed
    alone, back to back, runs faster than 61 of them after a synchronize and per-layer events, so
    the guess alone gave 1.29-1.52x where 1.25x was asked (H200, eleventh session). Returns the
    rows and their last measurement (the closest of ``tries``; at ``cap`` rows it stays short)."""
    best = None
    for _ in range(tries):
        compute = measure(m)
        error = abs(compute["compute_end"] / target_ms - 1)
        if best is None or error < best[0]:
            best = (error, m, compute)
        nxt = rescaled_rows(m, target_ms, compute["compute_end"], cap)
        if error <= CALIBRATION_TOLERANCE or nxt == m:
            break
        m = nxt
    return best[1], best[2]


def compute_timeline(starts: list[float], ends: list[float]) -> dict:
    """The model stream's matmuls (start and end of each, ms from the start event): when the
    last ended, their own time, when the first started, the idle time between them and how
    many layers it waited on. A gap over 20 us counts as a wait: back-to-back matmuls on one
    stream start within a few microseconds of the previous end."""
    gaps = [max(0.0, s - e) for s, e in zip(starts[1:], ends[:-1])]
    return {"compute_end": ends[-1], "busy": sum(e - s for s, e in zip(starts, ends)), "start_delay": starts[0],
            "stall": sum(gaps), "late_layers": sum(g > LATE_GAP_MS for g in gaps), "gaps": gaps}


#: A gap between two matmuls longer than this (ms) is a wait on the load.
LATE_GAP_MS = 0.02


def median_rows(rows: list[dict]) -> dict:
    """The median of each key over ``rows``; list values (per-layer gaps) element by element."""
    out = {}
    for key, first in rows[0].items():
        if isinstance(first, list):
            out[key] = [statistics.median(r[key][i] for r in rows) for i in range(len(first))]
        else:
            out[key] = statistics.median(r[key] for r in rows)
    return out


def late_layers_at(gaps: list[float]) -> dict[int, float]:
    """The layers the model waited on (their gap before them over ``LATE_GAP_MS``) and how long (ms)."""
    return {i + 1: round(g, 3) for i, g in enumerate(gaps) if g > LATE_GAP_MS}


def beside_metrics(load_ms: float, compute: dict, both: dict) -> dict:
    """The issue's beside-compute numbers from the load alone (``load_ms``), the compute alone
    and both at once (``compute_timeline`` rows, ``both`` with its ``load_ms``): ``hidden_fraction``
    = (load + compute - both) / load, ``compute_slowdown`` = the matmuls' own time beside the load
    / alone, and where the added time went."""
    compute_ms = compute["compute_end"]
    both_ms = max(both["load_ms"], both["compute_end"])
    return {"load_ms": load_ms, "compute_ms": compute_ms, "both_ms": both_ms, "compute_per_load": compute_ms / load_ms,
            "hidden_fraction": (load_ms + compute_ms - both_ms) / load_ms,
            "compute_slowdown": both["busy"] / compute["busy"],
            "start_delay_ms": both["start_delay"] - compute["start_delay"], "stall_ms": both["stall"],
            "busy_extra_ms": both["busy"] - compute["busy"], "late_layers": both["late_layers"]}


class FloorLoad:
    """A load handle of ``FloorLoader``: an event per layer, the engine's load handle's interface."""

    def __init__(self, events: list[torch.cuda.Event]) -> None:
        self.events = events
        self.layers = tuple(range(len(events)))

    def event(self, layer: int) -> torch.cuda.Event:
        return self.events[layer]

    def wait_layer(self, layer: int, stream: torch.cuda.Stream | None = None) -> None:
        (stream or torch.cuda.current_stream()).wait_event(self.events[layer])

    def synchronize(self) -> None:
        self.events[-1].synchronize()


class FloorLoader:
    """The bytes of a load layer by layer with nothing in the way: one pinned host region and one
    device region per layer, one copy each (the copy engines, no SM, nothing to plan), on a stream
    of the loads' priority, an event per layer. No path beats it beside the model's compute."""

    def __init__(self, num_layers: int, layer_bytes: int) -> None:
        self.host = torch.empty(num_layers, layer_bytes, dtype=torch.uint8, pin_memory=True)
        fill_random(self.host)
        self.device = torch.empty(num_layers, layer_bytes, dtype=torch.uint8, device="cuda")
        self.stream = torch.cuda.Stream(priority=LOAD_STREAM_PRIORITY)

    def load(self, slots=None, pages=None, options=None) -> FloorLoad:
        self.stream.wait_stream(torch.cuda.current_stream())
        events = []
        with torch.cuda.stream(self.stream):
            for layer in range(self.host.shape[0]):
                self.device[layer].copy_(self.host[layer], non_blocking=True)
                event = torch.cuda.Event(enable_timing=True)
                event.record(self.stream)
                events.append(event)
        return FloorLoad(events)

    def copied_every_byte(self) -> bool:
        self.device.zero_()
        self.load().synchronize()
        return torch.equal(self.device.cpu(), self.host)


class BesideModel:
    """The model beside a load (``beside_compute``, ``beside_floor.py``): its own stream and a
    bf16 matmul ``[m, 4096] x [4096, 4096]`` per layer, each waiting on its layer first."""

    #: Most matmul rows: 16384 capped scattered page_first loads (37 ms) at 1.31-1.39x where 1.25x was asked.
    ROWS_MAX = 32768
    K = 4096

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.weight = torch.randn(self.K, self.K, device="cuda", dtype=torch.bfloat16)
        self.x = torch.randn(self.ROWS_MAX, self.K, device="cuda", dtype=torch.bfloat16)
        self.y = torch.empty(self.ROWS_MAX, self.K, device="cuda", dtype=torch.bfloat16)
        self.stream = torch.cuda.Stream()

    def rows_for(self, per_layer_ms: float) -> int:
        """Matmul rows whose matmul takes about ``per_layer_ms`` alone."""
        return matmul_rows_for(per_layer_ms, self.x, self.weight, self.y, self.stream)

    def rep(self, load, m: int) -> dict:
        """One rep, every time relative to the start event (ms). ``load``: a callable that issues
        the load on the model's stream and returns its handle, or None (the compute alone); ``m``:
        matmul rows per layer, 0 for none (the load alone). No sleep before the start event: the
        caller issues the load and then the compute, as an engine does, so issue time on the
        caller's thread delays the compute."""
        torch.cuda.synchronize()
        with torch.cuda.stream(self.stream):
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            handle = load() if load is not None else None
            issue_ms = (time.perf_counter() - t0) * 1e3
            marks = []
            for layer in range(self.num_layers if m else 0):
                if handle is not None:
                    handle.wait_layer(layer)
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                torch.matmul(self.x[:m], self.weight, out=self.y[:m])
                e1.record()
                marks.append((e0, e1))
        if handle is not None:
            handle.synchronize()
        torch.cuda.synchronize()
        out = {"load_ms": max(start.elapsed_time(e) for e in _end_events(handle)) if handle is not None else 0.0,
               "first_layer_ms": start.elapsed_time(handle.event(handle.layers[0])) if handle is not None else 0.0,
               "issue_ms": issue_ms if handle is not None else 0.0}
        if marks:
            out.update(compute_timeline([start.elapsed_time(e0) for e0, _ in marks],
                                        [start.elapsed_time(e1) for _, e1 in marks]))
        return out


def beside_compute(b, engines, hosts, page_sets, slot_sets, sets, reps: int = 3,
                   kinds: tuple[str, ...] = ("runs", "scattered"), floor: "FloorLoader | None" = None, **fields) -> None:
    """A 61-layer load consumed layer by layer by the model's stream: per layer ``wait_layer``,
    then a bf16 matmul ``[m, 4096] x [4096, 4096]`` sized to about 0.5x and 1.25x the load's own
    time per layer (calibrated at the chosen size: matmul time is not linear in ``m``). No sleep
    before the start event: the caller issues the load and then the compute, as an engine does,
    so issue time on the caller's thread delays the compute.

    Besides ``hidden_fraction`` and ``compute_slowdown`` each row splits the time the load added
    to the compute (``both_ms - compute_ms``) into where it went: ``start_delay_ms`` (the first
    matmul's start from the start event, against alone), ``stall_ms`` (the model stream idle
    between matmuls, waiting on layers), ``busy_extra_ms`` (the matmuls' own time beside the load
    over alone); also ``first_layer_ms`` (layer 0's event from the start event), ``issue_ms``
    (the caller's ``load()`` call, wall) and ``late_layers`` (layers the model waited on).

    Compute alone and both at once are measured in turn (alone, both, alone, both, ...), after
    the compute's calibration. With ``floor`` (a ``FloorLoader``) the group starts with the same
    measurement for one contiguous copy per layer of the same bytes (path ``floor``): what
    moving these bytes beside these matmuls costs whatever the path."""
    num_layers = b.spec.num_layers
    model = BesideModel(num_layers)
    rows_max = BesideModel.ROWS_MAX

    def run(engine, slots_kind, i, options, m) -> dict:
        """One rep of ``model.rep`` (``engine`` None: the compute alone)."""
        if engine is None:
            return model.rep(None, m)
        return model.rep(lambda: engine.load(slot_sets[slots_kind][i % sets], page_sets[i % sets], options=options), m)

    def median_of(engine, slots_kind, options, m) -> dict:
        return median_rows([run(engine, slots_kind, i, options, m) for i in range(reps + 1)][1:])

    def measure_rows(engine, slots_kind, options, name, layout, slots_label) -> None:
        alone = median_of(engine, slots_kind, options, 0)
        load_ms = alone["load_ms"]
        for factor in (0.5, 1.25):
            m, calibration = calibrated_rows(model.rows_for(factor * load_ms / num_layers), factor * load_ms,
                                             lambda m: median_of(None, slots_kind, options, m), rows_max)
            run(engine, slots_kind, 0, options, m)  # warm-up of the pair
            # Compute alone and both at once in turn: the GPU's clocks drift over seconds of
            # matmuls, and a pair shares the drift (all alone reps first, then all both reps,
            # left the slowdown of loads that take SMs 0.05-0.15 lower: beside_floor.py).
            pairs = [(run(None, slots_kind, i, options, m), run(engine, slots_kind, i, options, m)) for i in range(reps)]
            compute = median_rows([alone_rep for alone_rep, _ in pairs])
            both = median_rows([both_rep for _, both_rep in pairs])
            row = {"name": f"beside {factor}x {name} {layout} {slots_label}", "group": "beside_compute",
                   "path": name, "layout": layout, "slots": slots_label, "factor": factor, "rows": m,
                   "protocol": "interleaved", **beside_metrics(load_ms, compute, both),
                   "compute_slowdown_each": [both_rep["busy"] / alone_rep["busy"] for alone_rep, both_rep in pairs],
                   "compute_slowdown_vs_calibration": both["busy"] / calibration["busy"],
                   "first_layer_ms": both["first_layer_ms"], "first_layer_alone_ms": alone["first_layer_ms"],
                   "issue_ms": both["issue_ms"], "issue_alone_ms": alone["issue_ms"],
                   # Which layers the model waited on (median gap per layer over the reps).
                   "late_at": late_layers_at(both["gaps"]), **fields}
            b.results.append(row)
            print(f"{row['name']:60s} load {load_ms:6.2f} compute {row['compute_ms']:6.2f} both {row['both_ms']:6.2f} ms "
                  f"hidden {row['hidden_fraction']:5.2f} slowdown {row['compute_slowdown']:5.3f} | "
                  f"start {row['start_delay_ms']:5.2f} stall {row['stall_ms']:5.2f} "
                  f"({row['late_layers']} late) busy+ {row['busy_extra_ms']:5.2f} "
                  f"layer0 {row['first_layer_ms']:5.2f} issue {row['issue_ms']:5.2f} | late at {row['late_at']}",
                  flush=True)

    if floor is not None:
        try:
            measure_rows(floor, "runs", None, "floor", "contiguous", "contiguous")
        except Exception as exc:  # a failed variant is reported, the others still run
            print(f"beside floor: FAILED {exc!r}", flush=True)
    for layout in hosts:
        for name, path, options in BESIDE:
            engine = engines[(layout, path)]
            for slots_kind in kinds:
                try:
                    measure_rows(engine, slots_kind, options, name, layout, slots_kind)
                except Exception as exc:  # a failed variant is reported, the others still run
                    print(f"beside {name} {layout} {slots_kind}: FAILED {exc!r}", flush=True)


# --- `--compare`: candidate load splits against the `auto` of before, in one run ---------------------

#: ``auto``'s mixed loads before the split candidates (2026-11-30 14:41 run): by (layout, op).
OLD_SPLITS = {("page_first", "load61"): LoadSplit(0.6), ("layer_first", "load61"): LoadSplit(1.0),
              ("page_first", "load1"): LoadSplit(0.25), ("layer_first", "load1"): LoadSplit(0.4),
              ("page_first", "both"): LoadSplit(1.0), ("layer_first", "both"): LoadSplit(1.0)}


def _candidates(layout: str, op: str, which: str) -> dict[str, LoadSplit]:
    """``which``: ``splits`` (copy streams, component split, pipelined single layers) or
    ``blocks`` (component split with several layers per copy-engine row)."""
    pf = layout == "page_first"
    out = {"old": OLD_SPLITS[(layout, op)]}
    if which == "blocks":
        if pf and op == "load61":
            out["components"] = LoadSplit(by="components")
            for per in (2, 4):
                out[f"components {per} layers per copy"] = LoadSplit(by="components", layers_per_copy=per)
        if pf and op == "both":
            out["components 2 streams"] = LoadSplit(by="components", copy_streams=2)
            for per in (2, 4, 8):
                out[f"components {per} layers per copy"] = LoadSplit(by="components", layers_per_copy=per)
            out["components 4 layers per copy 2 streams"] = LoadSplit(by="components", layers_per_copy=4, copy_streams=2)
        return out
    if op in ("load61", "both"):
        out["ce 2 streams"] = LoadSplit(1.0, copy_streams=2)
        if pf:
            out["ce 3 streams"] = LoadSplit(1.0, copy_streams=3)
            out["components"] = LoadSplit(by="components")
            out["components 2 streams"] = LoadSplit(by="components", copy_streams=2)
        if pf and op == "load61":
            out["pages 0.6 2 streams"] = LoadSplit(0.6, copy_streams=2)
    else:
        for fraction in (0.4, 0.5, 0.6, 0.75):
            out[f"pages {fraction} 2 streams units 64 ctas 16"] = LoadSplit(fraction, copy_streams=2, unit_rows=64,
                                                                             staging_ctas=16)
        for fraction in (0.5, 0.6):
            out[f"pages {fraction} 2 streams units 128 ctas 16"] = LoadSplit(fraction, copy_streams=2, unit_rows=128,
                                                                              staging_ctas=16)
        out["pages 0.6 1 stream units 64 ctas 16"] = LoadSplit(0.6, unit_rows=64, staging_ctas=16)
        out["pages 0.6 2 streams units 64 ctas 4"] = LoadSplit(0.6, copy_streams=2, unit_rows=64)
        if pf:
            out["components 2 streams units 64 ctas 16"] = LoadSplit(by="components", copy_streams=2, unit_rows=64,
                                                                     staging_ctas=16)
            out["components 1 stream"] = LoadSplit(by="components")
    return out


def compare_start(args, seed: int, label: str, *, layer_d2h: bool = False):
    """What every ``--compare`` run starts with: a seeded ``Bench``, the byte counts of one layer
    and of a whole transfer, and the ceilings (``measure_ceilings``)."""
    torch.manual_seed(seed)
    b = Bench(args)
    layer_bytes = args.pages * sum(c.bytes_per_layer for c in b.spec.components)
    transfer_bytes = args.pages * b.spec.page_bytes
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | {label}", flush=True)
    ceilings = measure_ceilings(b, layer_bytes, layer_d2h=layer_d2h)
    torch.cuda.empty_cache()
    return b, layer_bytes, transfer_bytes, ceilings


def compare(args) -> int:
    """Ceilings, then per (layout, op) the old ``auto`` split and each candidate: checked byte for
    byte against the torch reference, then timed (median of ``--reps``), the old one twice."""
    b, layer_bytes, transfer_bytes, (h2d, d2h, both, layer_h2d, host_layer) = compare_start(args, 1, "compare")
    spec, n = b.spec, args.pages
    # The single-layer reference moved between runs (54.6 GB/s, then 44.9): measure it several ways.
    s1 = torch.cuda.Stream()
    dev_layer = torch.empty(layer_bytes, dtype=torch.uint8, device="cuda")

    def layer_ref(name: str, sources) -> None:
        def issue(i):
            s1.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s1):
                start = 0
                for src in sources():
                    dev_layer[start:start + src.numel()].copy_(src, non_blocking=True)
                    start += src.numel()
            end = torch.cuda.Event(enable_timing=True)
            end.record(s1)
            return [end]
        b.add(f"contiguous h2d of one layer's bytes, {name}", layer_bytes, measure(issue, b.reps), group="layer_ref")

    layer_ref("own pinned buffer", lambda: [host_layer])
    ceiling = {"load61": h2d["gbps"], "load1": layer_h2d["gbps"], "both": max(h2d["gbps"], d2h["gbps"])}

    device_pool, hosts = random_pools(spec, args)
    views = [[device_pool.chunk_view(ci, layer) for layer in range(spec.num_layers)] for ci in range(len(spec.components))]
    engines = {layout: TransferEngine(device_pool, host, path="mixed", timing=True) for layout, host in hosts.items()}
    auto = {layout: TransferEngine(device_pool, host, path="auto", timing=True) for layout, host in hosts.items()}
    sets = 4
    page_sets, all_slot_sets = id_sets(args, sets)
    slot_sets = all_slot_sets["runs"]
    backup_sets = backup_sets_beside(args, page_sets, slot_sets)
    backup_bytes = int(statistics.mean(p.numel() for p, _ in backup_sets) * spec.page_bytes)
    mid = spec.num_layers // 2
    checks: list[dict] = []
    layer_ref("from the page_first pool (25.8 MB of its buffer)", lambda: [hosts["page_first"].buffer[:layer_bytes]])
    lf = hosts["layer_first"]
    layer_ref("from the layer_first pool (latent + indexer runs of 512 slots, 2 copies)",
              lambda: [lf.chunk_view(ci, mid)[int(slot_sets[0][0]):int(slot_sets[0][0]) + n].view(-1)
                       for ci in range(len(spec.components))])

    def check(layout: str, op: str, name: str, split: LoadSplit) -> bool:
        """Poison, run once (beside a backup for ``both``), compare every byte with the reference."""
        engine, host = engines[layout], hosts[layout]
        layers = [mid] if op == "load1" else list(range(spec.num_layers))
        slots, pages = slot_sets[0], page_sets[0]
        pages_dev = pages.cuda()
        for layer in layers:
            for ci in range(len(spec.components)):
                view = views[ci][layer]
                view[pages_dev] = torch.randint(0, 256, (n, view.shape[1]), dtype=torch.uint8, device="cuda")
        expected = {(ci, layer): views[ci][layer].clone() for layer in layers for ci in range(len(spec.components))}
        for (ci, layer), exp in expected.items():
            copy_pages_reference([(host.chunk_view(ci, layer), exp)], slots, pages)
        b_pages, b_slots = backup_sets[0]
        if op == "both":
            for view in (host.chunk_view(ci, layer) for layer in range(spec.num_layers) for ci in range(len(spec.components))):
                view[b_slots] = torch.randint(0, 256, (b_slots.numel(), view.shape[1]), dtype=torch.uint8, device="cuda").cpu()
        torch.cuda.synchronize()
        engine.options = replace(engine.options, load_split=split)
        backup = auto[layout].backup(b_pages, b_slots, path="staged") if op == "both" else None
        engine.load(slots, pages, layers=layers).synchronize()
        ok = all(torch.equal(views[ci][layer], exp) for (ci, layer), exp in expected.items())
        if backup is not None:
            backup.synchronize()
            for device_view, host_view in backup_pairs(device_pool, host):
                ok = ok and torch.equal(host_view[b_slots], device_view[b_pages.cuda()].cpu())
        checks.append({"layout": layout, "op": op, "split": name, "ok": ok})
        print(f"check {layout:11s} {op:6s} {name:42s} {'ok' if ok else 'WRONG'}", flush=True)
        return ok

    def timed(layout: str, op: str, name: str, split: LoadSplit | None) -> None:
        engine = engines[layout] if split is not None else auto[layout]
        engine.options = replace(engine.options, load_split=split)
        layers = [mid] if op == "load1" else None
        backuper = auto[layout] if split is None else engines[layout]

        def issue(i):
            k = i % sets
            ends = []
            if op == "both":
                ends.append(backuper.backup(*backup_sets[k], path="staged").event)
            handle = engine.load(slot_sets[k], page_sets[k], layers=layers)
            return ends + [handle.event(handle.layers[-1])]

        nbytes = layer_bytes if op == "load1" else transfer_bytes + (backup_bytes if op == "both" else 0)
        t = measure(issue, b.reps)
        row = b.add(f"{op:6s} {layout:11s} {name}", nbytes, t, group="compare", op=op, layout=layout, split=name,
                    frac_of_ceiling=nbytes / t["ms"] / 1e6 / ceiling[op])
        if op == "both":
            row["vs_one_direction"] = row["gbps"] / ceiling["both"]

    wrong = 0
    for op in ("load61", "load1", "both"):
        for layout in hosts:
            candidates = _candidates(layout, op, args.compare)
            for name, split in candidates.items():
                if name != "old" or op == "load1":  # the old splits are the tested paths of before
                    wrong += not check(layout, op, name, split)
            timed(layout, op, "auto (now)", None)
            for name, split in candidates.items():
                timed(layout, op, name, split)
            timed(layout, op, "old (again)", candidates["old"])
        _save_compare(args, b, ceiling, checks)
    layer_ref("own pinned buffer, again after everything", lambda: [host_layer])
    _save_compare(args, b, ceiling, checks)
    for r in b.results:
        if r.get("group") in ("ceiling", "layer_ref"):
            print(f"{r['name']:78s} {r['gbps']:6.2f}  [{r['bytes'] / r['ms_max'] / 1e6:5.1f}-{r['bytes'] / r['ms_min'] / 1e6:5.1f}]")
    print("\n== compare: GB/s, % of ceiling (load1: of the contiguous layer copy; both: x one direction) ==")
    print_compare(b.results, "compare", 42)
    print(f"checks: {len(checks) - wrong} ok, {wrong} wrong")
    for host in hosts.values():
        host.close()
    return 1 if wrong else 0


def compare_batch(args) -> int:
    """The ``batch`` path (one ``cudaMemcpyBatchAsync`` per layer or backup) against ``auto``, in
    one run: every op checked byte for byte against the torch reference, then timed."""
    from tiered_kv.kernels.cudart import FLAG_PREFER_OVERLAP_WITH_COMPUTE, runtime_version

    b, layer_bytes, transfer_bytes, (h2d, d2h, both, layer_h2d, host_layer_ref) = compare_start(
        args, 2, f"cudart {runtime_version()} | compare {args.compare}", layer_d2h=True)
    spec, n = b.spec, args.pages
    dev_layer_ref, ref_stream = torch.empty(layer_bytes, dtype=torch.uint8, device="cuda"), torch.cuda.Stream()
    ceiling = {"load61": h2d["gbps"], "load1": layer_h2d["gbps"], "backup": d2h["gbps"],
               "both": max(h2d["gbps"], d2h["gbps"])}
    device_pool, hosts = random_pools(spec, args)
    ncomp = len(spec.components)
    views = [[device_pool.chunk_view(ci, layer) for layer in range(spec.num_layers)] for ci in range(ncomp)]
    layouts = tuple(hosts)
    mixed = {layout: TransferEngine(device_pool, host, path="mixed", timing=True) for layout, host in hosts.items()}
    engines = {(layout, flags): TransferEngine(device_pool, host, path="batch", timing=True)
               for layout, host in hosts.items() for flags in (0, FLAG_PREFER_OVERLAP_WITH_COMPUTE)}
    for (layout, flags), engine in engines.items():
        engine.options = replace(engine.options, batch_flags=flags)
    auto = {layout: TransferEngine(device_pool, host, path="auto", timing=True) for layout, host in hosts.items()}
    sets = 4
    page_sets, slot_sets = id_sets(args, sets)
    backup_sets = backup_sets_beside(args, page_sets, slot_sets["runs"])
    backup_bytes = int(statistics.mean(p.numel() for p, _ in backup_sets) * spec.page_bytes)
    mid = spec.num_layers // 2
    checks: list[dict] = []

    def check(layout: str, op: str, load_engine, backup_engine, backup_path=None) -> bool:
        host = hosts[layout]
        slots, pages = slot_sets["runs"][0], page_sets[0]
        ok = True
        if op in ("load1", "load61", "both"):
            layers = [mid] if op == "load1" else list(range(spec.num_layers))
            pages_dev = pages.cuda()
            for layer in layers:
                for ci in range(ncomp):
                    view = views[ci][layer]
                    view[pages_dev] = torch.randint(0, 256, (n, view.shape[1]), dtype=torch.uint8, device="cuda")
            expected = {(ci, layer): views[ci][layer].clone() for layer in layers for ci in range(ncomp)}
            for (ci, layer), exp in expected.items():
                copy_pages_reference([(host.chunk_view(ci, layer), exp)], slots, pages)
        b_pages, b_slots = backup_sets[0]
        if op in ("backup", "both"):
            for view in (host.chunk_view(ci, layer) for layer in range(spec.num_layers) for ci in range(ncomp)):
                view[b_slots] = torch.randint(0, 256, (b_slots.numel(), view.shape[1]), dtype=torch.uint8)
        torch.cuda.synchronize()
        bh = backup_engine.backup(b_pages, b_slots, path=backup_path) if op in ("backup", "both") else None
        if op != "backup":
            load_engine.load(slots, pages, layers=layers).synchronize()
            ok = all(torch.equal(views[ci][layer], exp) for (ci, layer), exp in expected.items())
        if bh is not None:
            bh.synchronize()
            for device_view, host_view in backup_pairs(device_pool, host):
                ok = ok and torch.equal(host_view[b_slots], device_view[b_pages.cuda()].cpu())
        split = getattr(load_engine, "split", None)
        name = f"{op} {layout} load {getattr(load_engine, 'path', '-')} {split or ''} backup {backup_path or backup_engine.path}"
        checks.append({"name": name, "ok": ok})
        print(f"check {name:60s} {'ok' if ok else 'WRONG'}", flush=True)
        return ok

    def timed(layout, op, name, load_engine=None, backup_engine=None, backup_path=None, slots_kind="runs"):
        layers = [mid] if op == "load1" else None

        def issue(i):
            k = i % sets
            ends = []
            if op in ("backup", "both"):
                pages_b, slots_b = backup_sets[k] if op == "both" else (page_sets[k], slot_sets[slots_kind][k])
                ends.append(backup_engine.backup(pages_b, slots_b, path=backup_path).event)
            if op != "backup":
                handle = load_engine.load(slot_sets[slots_kind][k], page_sets[k], layers=layers)
                ends.append(handle.event(handle.layers[-1]))
            return ends

        nbytes = {"load1": layer_bytes, "load61": transfer_bytes, "backup": transfer_bytes,
                  "both": transfer_bytes + backup_bytes}[op]
        try:
            t = measure(issue, b.reps)
        except Exception as exc:  # a failed variant is reported, the others still run
            print(f"{op} {layout} {name}: FAILED {exc!r}", flush=True)
            return
        row = b.add(f"{op:6s} {layout:11s} {slots_kind:9s} {name}", nbytes, t, group="compare_batch", op=op, layout=layout,
                    slots=slots_kind, split=name, frac_of_ceiling=nbytes / t["ms"] / 1e6 / ceiling[op])
        if op == "both":
            row["vs_one_direction"] = row["gbps"] / ceiling["both"]

    class WithSplit:
        """The ``mixed`` engine of a layout with one split set while it is used."""

        def __init__(self, layout, split):
            self.engine, self.split, self.path = mixed[layout], split, "mixed"

        def load(self, *a, **k):
            self.engine.options = replace(self.engine.options, load_split=self.split)
            return self.engine.load(*a, **k)

    wrong = 0
    if args.compare == "single":
        splits = {"batch latent + kernel indexer": LoadSplit(by="components", ce_path="batch"),
                  "batch 0.6 pages + kernel": LoadSplit(0.6, ce_path="batch"),
                  "batch 0.75 pages + kernel": LoadSplit(0.75, ce_path="batch"),
                  "batch 0.85 pages + kernel": LoadSplit(0.85, ce_path="batch"),
                  "staged units 64 ctas 132": LoadSplit(1.0, unit_rows=64, staging_ctas=132),
                  "staged units 128 ctas 64": LoadSplit(1.0, unit_rows=128, staging_ctas=64)}

        for layout in layouts:
            for name, split in splits.items():
                wrong += not check(layout, "load1", WithSplit(layout, split), auto[layout])
        _save_compare(args, b, ceiling, checks)
        for layout in layouts:
            timed(layout, "load1", "auto", auto[layout])
            timed(layout, "load1", "batch", engines[(layout, 0)])
            for name, split in splits.items():
                timed(layout, "load1", name, WithSplit(layout, split))
            timed(layout, "load1", "batch (again)", engines[(layout, 0)])
            timed(layout, "load1", "auto (again)", auto[layout])
            for op in ("load61", "backup", "both"):
                timed(layout, op, "auto", auto[layout], auto[layout])
            timed(layout, "both", "auto (again)", auto[layout], auto[layout])
            _save_compare(args, b, ceiling, checks)
        b.add("contiguous h2d of one layer's bytes (again, at the end)", layer_bytes,
              measure(lambda i: [side_copy(dev_layer_ref, host_layer_ref, ref_stream)], b.reps), group="ceiling", op="layer_h2d")
    if args.compare == "both":
        both_patterns(b, hosts["page_first"], transfer_bytes, ceiling)
        for layout in hosts:
            wrong += not check(layout, "load1", auto[layout], auto[layout])
            wrong += not check(layout, "both", auto[layout], auto[layout])
            whole = WithSplit(layout, LoadSplit(1.0, layers_per_copy=spec.num_layers))
            wrong += not check(layout, "both", whole, auto[layout])
            for _ in range(2):
                timed(layout, "both", "auto + auto", auto[layout], auto[layout])
                timed(layout, "both", "whole-slot staged load + auto", whole, auto[layout])
            timed(layout, "load61", "auto", auto[layout])
            timed(layout, "load61", "whole-slot staged load", whole)
        _save_compare(args, b, ceiling, checks)
    if args.compare == "ctas":  # the kernel half of single-layer loads: its CTA budget, and the batch flag
        for layout in hosts:
            engine = mixed[layout]
            batch_split = WithSplit(layout, LoadSplit(by="components", ce_path="batch"))
            wrong += not check(layout, "load1", batch_split, auto[layout])
            for streams in (2, 3):
                wrong += not check(layout, "load1", WithSplit(layout, LoadSplit(1.0, ce_path="batch", copy_streams=streams)),
                                   auto[layout])
            timed(layout, "load1", "auto", auto[layout])
            for ctas in (8, 16, 24, 32, 64, 132):
                engine.options = replace(engine.options, num_ctas=ctas)
                timed(layout, "load1", f"batch latent + kernel indexer, {ctas} CTAs", batch_split)
            engine.options = replace(engine.options, num_ctas=None)
            for streams in (2, 3):
                timed(layout, "load1", f"batch latent on {streams} streams + kernel indexer",
                      WithSplit(layout, LoadSplit(by="components", ce_path="batch", copy_streams=streams)))
                timed(layout, "load1", f"batch everything on {streams} streams",
                      WithSplit(layout, LoadSplit(1.0, ce_path="batch", copy_streams=streams)))
            engine.options = replace(engine.options, batch_flags=FLAG_PREFER_OVERLAP_WITH_COMPUTE)
            timed(layout, "load1", "batch latent + kernel indexer, overlap flag", batch_split)
            engine.options = replace(engine.options, batch_flags=0)
            timed(layout, "load1", "auto (again)", auto[layout])
        b.add("contiguous h2d of one layer's bytes (again, at the end)", layer_bytes,
              measure(lambda i: [side_copy(dev_layer_ref, host_layer_ref, ref_stream)], b.reps), group="ceiling", op="layer_h2d")
        _save_compare(args, b, ceiling, checks)
    for layout in (hosts if args.compare == "batch" else ()):
        eng0, eng1, au = engines[(layout, 0)], engines[(layout, FLAG_PREFER_OVERLAP_WITH_COMPUTE)], auto[layout]
        for op in ("load1", "load61", "backup"):
            wrong += not check(layout, op, eng0, eng0)
        wrong += not check(layout, "both", eng0, au, "staged")
        wrong += not check(layout, "both", eng0, eng0)
        _save_compare(args, b, ceiling, checks)
        for op in ("load1", "load61", "backup"):
            timed(layout, op, "auto", au, au)
            timed(layout, op, "batch", eng0, eng0)
            timed(layout, op, "batch overlap flag", eng1, eng1)
            timed(layout, op, "auto (again)", au, au)
            timed(layout, op, "batch", eng0, eng0, slots_kind="scattered")
        timed(layout, "both", "auto + auto", au, au)
        timed(layout, "both", "batch + staged", eng0, au, "staged")
        timed(layout, "both", "batch + batch", eng0, eng0)
        timed(layout, "both", "batch + batch, overlap flag", eng1, eng1)
        timed(layout, "both", "auto + auto (again)", au, au)
        _save_compare(args, b, ceiling, checks)
    print("\n== compare batch: GB/s, % of ceiling (load1: of the contiguous layer copy; both: x one direction) ==")
    for r in b.results:
        if r.get("group") == "ceiling":
            print(f"{r['name']:60s} {r['gbps']:6.2f}")
    print_compare(b.results, "compare_batch", 36, issue=True)
    print(f"checks: {len(checks) - wrong} ok, {wrong} wrong")
    for host in hosts.values():
        host.close()
    return 1 if wrong else 0


def both_patterns(b: Bench, host: HostPool, nbytes: int, ceiling: dict) -> None:
    """Which host-read pattern keeps a load from running at full rate beside a backup: raw
    copy-engine copies of ``nbytes`` host -> device (contiguous, one 2-D copy of whole slots,
    per-layer 2-D copies of 42 / 8 KB rows as a staged page_first load makes them, per-layer
    1-D copies of dense rows), alone and beside a contiguous device -> host copy."""
    from tiered_kv.kernels.cudart import memcpy_2d_async, memcpy_async

    spec = host.spec
    rows = nbytes // spec.page_bytes
    slot = host.slot_bytes
    src0 = host.buffer.data_ptr() + 4096
    dev_in = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev_out = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host_out = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    s_load, s_backup = torch.cuda.Stream(), torch.cuda.Stream()
    sizes = [c.bytes_per_layer for c in spec.components]

    def h2d(kind):
        h = s_load.cuda_stream
        if kind == "contiguous":
            memcpy_async(dev_in.data_ptr(), src0, nbytes, h)
        elif kind == "whole slots (2-D, 3 MB rows)":
            memcpy_2d_async(dev_in.data_ptr(), spec.page_bytes, src0, slot, spec.page_bytes, rows, h)
        elif kind == "per layer 2-D (42 + 8 KB rows)":
            offset = 0
            for layer in range(spec.num_layers):
                for ci, size in enumerate(sizes):
                    src = host.chunk_view(ci, layer).data_ptr()
                    memcpy_2d_async(dev_in.data_ptr() + offset, size, src, slot, size, rows, h)
                    offset += size * rows
        elif kind.startswith("blocks of"):  # one latent and one indexer row per slot and block
            per = int(kind.split()[2])
            offset = 0
            for first in range(0, spec.num_layers, per):
                count = min(per, spec.num_layers - first)
                for ci, size in enumerate(sizes):
                    src = host.chunk_view(ci, first).data_ptr()
                    memcpy_2d_async(dev_in.data_ptr() + offset, size * count, src, slot, size * count, rows, h)
                    offset += size * count * rows
        else:  # per layer, dense: the same number of copies from a contiguous source
            offset = 0
            for layer in range(spec.num_layers):
                for size in sizes:
                    memcpy_async(dev_in.data_ptr() + offset, src0 + offset, size * rows, h)
                    offset += size * rows

    def issue(kind, with_backup):
        def run(i):
            ends = []
            for stream in (s_load, s_backup):
                stream.wait_stream(torch.cuda.current_stream())
            if with_backup:
                memcpy_async(host_out.data_ptr(), dev_out.data_ptr(), nbytes, s_backup.cuda_stream)
                end = torch.cuda.Event(enable_timing=True)
                end.record(s_backup)
                ends.append(end)
            if kind:
                h2d(kind)
                end = torch.cuda.Event(enable_timing=True)
                end.record(s_load)
                ends.append(end)
            return ends
        return run

    kinds = ("contiguous", "whole slots (2-D, 3 MB rows)", "per layer 2-D (42 + 8 KB rows)", "per layer 1-D dense",
             *(f"blocks of {n} layers 2-D" for n in (4, 8, 16)))
    b.add("pattern d2h contiguous alone", nbytes, measure(issue(None, True), b.reps), group="pattern")
    for kind in kinds:
        alone = b.add(f"pattern h2d {kind} alone", nbytes, measure(issue(kind, False), b.reps), group="pattern")
        both = b.add(f"pattern h2d {kind} + d2h contiguous", 2 * nbytes, measure(issue(kind, True), b.reps), group="pattern")
        print(f"   -> {kind}: alone {alone['gbps']:.2f}, both {both['gbps']:.2f} = {both['gbps'] / ceiling['both']:.2f}x")


def _save_compare(args, b: Bench, ceiling: dict, checks: list[dict]) -> None:
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": triton.__version__, "reps": b.reps, "pages_per_transfer": args.pages,
           "ceiling_gbps": ceiling, "checks": checks, "results": b.results}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
