"""Benchmark of L1 <-> L2 page transfers on a GPU (written for the H200), DeepSeek-V3.2 shapes.

    python benchmarks/transfer_gpu.py --out docs/benchmarks/transfer_gpu.json [--quick] [--no-sweeps]

In one run: the ceiling (one contiguous 2 GiB pinned copy each way, and both ways at once), a
contiguous copy of one layer's bytes (the fair ceiling for a single-layer load), the naive torch
baseline, and every transfer path (``kernel``, ``direct``, ``batch``, ``staged``, ``mixed``,
``auto``), each first checked byte for byte, for the backup of all layers, the load of one layer
alone and the load of all 61 layers one after another, in both host layouts, with host slots in
runs, in short runs (what a churned allocator hands out, ``benchmarks/slot_runs.py``) and
scattered; ``auto`` and the kernel timed from the call too; load and backup at the same time; a
61-layer load consumed layer by layer beside the model's matmuls; and (unless ``--no-sweeps``) a
sweep of the UVA kernel's CTA budget and tile, of the copy-engine share of mixed loads and of the
staging kernels' budget.

Timing: CUDA events, median of ``--reps`` after warm-up. Before each start event the measuring
stream sleeps on the GPU for ~40 ms, so the CPU has enqueued the whole transfer before the clock
starts: the numbers are device time (the CPU issue time is reported beside them; when it exceeds
the sleep it shows up in the device time too). The groups timed from the call have no such sleep.
Imported by the tests only for its arithmetic (``tests/test_beside_metrics.py``), never by the
library.
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
from tiered_kv.kernels import copy_pages_uva, plan_uva_copy
from tiered_kv.kernels.uva_copy import DEFAULT_CTAS_ON_DEVICE
from tiered_kv.transfers.torch_path import backup_pairs, load_pairs
from tiered_kv.transfers.engine import BackupHandle, TransferEngine, TransferOptions
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
    event: layers issued by several library threads land on several streams; fetching them waits
    for the threads to record them, outside the caller's issue time) or a backup handle."""
    if hasattr(item, "layers"):
        return [item.event(layer) for layer in item.layers]
    return [item.event] if isinstance(item, BackupHandle) else [item]


def measure(issue, reps: int, warmup: int = 2, *, sleep: bool | str = True) -> dict:
    """Median device ms of ``issue(i) -> list of end events or load handles`` (from a start event
    before it), the caller's issue time (wall and its thread's CPU) and the CPU the op costs in
    the whole process (every thread, from the issue until the device finished; the wait polls).
    ``sleep``: True, the device sleeps about 40 ms before the start event, so the issue runs
    ahead of it and the time is the device's alone; False, nothing before it: the time counts
    from the call on an idle GPU (an issue slower than the copies shows, and so do clocks that
    rise only once work arrives); ``"beside"``, the same sleep on a stream of its own that the op
    does not wait for: from the call, on a GPU already busy (its clocks up, as beside a model).
    That stream is one of torch's pool, never one of an engine's (they are the library's own,
    ``kernels.owned_streams``); the warmup reps run without the sleep."""
    if sleep not in (True, False, "beside"):
        raise ValueError(f"measure: sleep must be True, False or 'beside', got {sleep!r}")
    side = None
    device_ms, issue_ms, caller_cpu, cpu = [], [], [], []
    for i in range(warmup + reps):
        torch.cuda.synchronize()
        if sleep == "beside" and i == warmup:
            side = torch.cuda.Stream()
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


def save(b: Bench, args, ceiling: dict, layer_h2d: dict | None, naive: dict | None, *, done: bool = False,
         checks: list[dict] | None = None) -> None:
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
        "checks": checks or [],
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
                r = row(group="both", layout=layout, load_path="auto", backup_path="auto", slots=slots, order=order)
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


def check_paths(engines, device_pool, hosts, pages: torch.Tensor, slot_sets: dict) -> list[dict]:
    """Every engine's load and backup of ``pages`` (slots in runs and scattered) checked byte for
    byte, each a row ``{path, op, layout, slots, ok}`` (the reference path ``torch`` is not checked).
    The load goes first, into the pages in reverse order, so that a page a broken load left
    poisoned is not the one a broken backup leaves poisoned too (both would then look copied)."""
    checks = []
    for (layout, path), engine in engines.items():
        if path == "torch":
            continue
        for slots_kind in ("runs", "scattered"):
            slots = slot_sets[slots_kind][0]
            for op, check, ids in (("load", load_copies_every_byte, (slots, pages.flip(0))),
                                   ("backup", backup_copies_every_byte, (pages, slots))):
                ok = check(engine, device_pool, hosts[layout], *ids)
                checks.append({"path": path, "op": op, "layout": layout, "slots": slots_kind, "ok": ok})
                print(f"check {path:7s} {op:7s} {layout:11s} slots {slots_kind:9s} {'ok' if ok else 'WRONG'}", flush=True)
    return checks


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


#: Timed from the call as well (``from_call`` groups): ``auto`` and the kernel, (name, path, options).
FROM_CALL = [("auto", "auto", None), ("kernel", "kernel", None)]
#: The groups they are timed in: group -> (``measure``'s sleep, what the summary calls it).
FROM_CALL_GROUPS = {"from_call": (False, "from the call, idle GPU"), "from_call_busy": ("beside", "from the call, busy GPU")}

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
                        help="skip the CTA, tile, ce_fraction and staging sweeps")
    parser.add_argument("--beside-reps", type=int, default=3, help="repetitions of each beside-compute measurement")
    parser.add_argument("--beside-paths", default="",
                        help="comma-separated names of the beside-compute loads to run (default: all of BESIDE)")
    args = parser.parse_args()
    wanted = set(filter(None, args.beside_paths.split(",")))
    unknown = wanted - {name for name, _, _ in BESIDE}
    if unknown:
        parser.error(f"--beside-paths: no such beside-compute load: {', '.join(sorted(unknown))}")
    beside_loads = [entry for entry in BESIDE if not wanted or entry[0] in wanted]
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
    # Nothing is timed before every path has copied every byte.
    checks = check_paths(engines, device_pool, hosts, page_sets[0], slot_sets)
    if not all(check["ok"] for check in checks):
        save(b, args, ceiling, layer_h2d, None, checks=checks)
        wrong = [f"{c['path']} {c['op']} {c['layout']} {c['slots']}" for c in checks if not c["ok"]]
        raise SystemExit(f"copied wrong bytes, nothing timed: {'; '.join(wrong)}")

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
        timed = functools.partial(measure, reps=reps, sleep=sleep)
        for op in ops:
            if op == "backup":
                timing, nbytes = timed(backup(engine, slots_kind, options)), transfer_bytes
            elif op == "load61":
                timing, nbytes = timed(load(engine, slots_kind, options=options)), transfer_bytes
            else:
                timing, nbytes = timed(load(engine, slots_kind, [spec.num_layers // 2], options)), layer_bytes
            if path == "torch":
                # The reference copies through pageable CPU memory synchronously: the device
                # events miss the CPU share, the caller's wall time does not.
                timing["ms"] = max(timing["ms"], timing["issue_ms"])
            frac = nbytes / timing["ms"] / 1e6 / ceiling[op]
            extra = {"frac_of_layer_copy": nbytes / timing["ms"] / 1e6 / layer_h2d["gbps"]} if op == "load1" else {}
            rows[op] = b.add(f"{name or path:7s} {op:7s} {layout:11s} slots {slots_kind}", nbytes, timing, group=group,
                             op=op, path=name or path, layout=layout, slots=slots_kind, frac_of_ceiling=frac,
                             issue_share=timing["issue_ms"] / timing["ms"], **extra)
        return rows

    # --- naive torch baseline ------------------------------------------------------------------
    naive = run_ops("page_first", "torch", "runs", 2, group="naive", ops=("backup", "load61"))

    save(b, args, ceiling, layer_h2d, naive, checks=checks)

    # --- every path, both layouts, slots in runs and scattered ---------------------------------
    for layout in hosts:
        for path in ("kernel", "auto", "staged", "mixed", "batch"):
            for slots_kind in ("runs", "scattered"):
                run_ops(layout, path, slots_kind, b.reps)
        for slots_kind in ("runs", "scattered"):
            run_ops(layout, "direct", slots_kind, 2)
        save(b, args, ceiling, layer_h2d, naive, checks=checks)

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
        save(b, args, ceiling, layer_h2d, naive, checks=checks)

    # --- slots in short runs: what a churned allocator hands out (``benchmarks/slot_runs.py``) -----
    for layout in hosts:
        for slots_kind in ("runs of 4", "runs of 16"):
            for path in ("auto", "kernel"):
                run_ops(layout, path, slots_kind, b.reps, group="allocator", ops=("backup", "load61"))
        save(b, args, ceiling, layer_h2d, naive, checks=checks)

    def finish() -> int:
        """Load + backup at once, beside compute, then the summary (the last sections of every run)."""
        concurrent_section(b, args, engines, hosts, page_sets, slot_sets, sets, transfer_bytes, page_bytes, h2d, d2h, ceiling)
        save(b, args, ceiling, layer_h2d, naive, checks=checks)
        floor = FloorLoader(spec.num_layers, layer_bytes)
        if not floor.copied_every_byte():
            raise SystemExit("the floor loader lost bytes")
        beside_compute(b, engines, hosts, page_sets, slot_sets, sets, beside_loads, reps=args.beside_reps, floor=floor)
        del floor
        save(b, args, ceiling, layer_h2d, naive, done=True, checks=checks)
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

    save(b, args, ceiling, layer_h2d, naive, checks=checks)

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

    save(b, args, ceiling, layer_h2d, naive, checks=checks)

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

    save(b, args, ceiling, layer_h2d, naive, checks=checks)
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

    def concurrent(layout, load_path, backup_path, slots_kind="runs", order="backup first"):
        le, be = engines[(layout, load_path)], engines[(layout, backup_path)]

        def issue(i):
            k = i % sets
            return issue_pair(lambda: le.load(slot_sets[slots_kind][k], page_sets[k]),
                              lambda: be.backup(*beside[slots_kind][k]), order)
        return issue

    for layout in hosts:
        for slots_kind, pairs in BOTH_PATHS.items():
            # Every pair with the backup issued first; ``auto`` also with the load first (a backup
            # then sees the load in flight: ``transfer_policy.MIXED_BACKUPS_BESIDE_LOAD``).
            for load_path, backup_path, order in [(*pair, "backup first") for pair in pairs] + [
                    ("auto", "auto", "load first")]:
                t = measure(concurrent(layout, load_path, backup_path, slots_kind, order=order), b.reps)
                nbytes = int(transfer_bytes + backup_bytes)
                label = "" if order == "backup first" else f" ({order})"
                b.add(f"load {load_path} + backup {backup_path}{label} {layout} {slots_kind}", nbytes, t, group="both",
                      op="both", layout=layout, slots=slots_kind, load_path=load_path, backup_path=backup_path,
                      order=order, frac_of_ceiling=nbytes / t["ms"] / 1e6 / ceiling["both"],
                      vs_one_direction=nbytes / t["ms"] / 1e6 / max(h2d["gbps"], d2h["gbps"]))


#: Load + backup at once: (load path, backup path) pairs by kind of slots.
BOTH_PATHS = {
    "runs": [("auto", "auto"), ("mixed", "staged"), ("staged", "staged"), ("kernel", "kernel"), ("kernel", "staged"),
             ("batch", "staged")],
    "scattered": [("auto", "auto"), ("mixed", "staged"), ("kernel", "kernel"), ("batch", "staged"), ("batch", "kernel"),
                  ("kernel", "staged")],
}

#: Beside compute: (name, path, options) of the loads timed beside the model's matmuls.
BESIDE = [("auto", "auto", None), ("auto beside compute", "auto", TransferOptions(beside_compute=True)),
          ("kernel", "kernel", None)]


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
    the guess alone gave 1.29-1.52x where 1.25x was asked on the H200. Returns the
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
    """The model beside a load (``beside_compute``): its own stream and a
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


def beside_compute(b, engines, hosts, page_sets, slot_sets, sets, loads=BESIDE, reps: int = 3,
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
    moving these bytes beside these matmuls costs whatever the path. ``loads``: (name, path,
    options) of the loads timed, ``BESIDE`` by default."""
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
            # left the slowdown of loads that take SMs 0.05-0.15 lower).
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
        for name, path, options in loads:
            engine = engines[(layout, path)]
            for slots_kind in kinds:
                try:
                    measure_rows(engine, slots_kind, options, name, layout, slots_kind)
                except Exception as exc:  # a failed variant is reported, the others still run
                    print(f"beside {name} {layout} {slots_kind}: FAILED {exc!r}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
