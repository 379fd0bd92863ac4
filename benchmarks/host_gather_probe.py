"""Probe: scattered ``layer_first`` host slots moved through a pinned bounce buffer that CPU threads
fill (load) or drain (backup), so the copy engines move one contiguous block per layer and
component instead of one row per slot.

Why: a 61-layer load of 512 scattered ``layer_first`` slots is 62k host rows. Issued as copy-engine
rows it costs 58 ms of CPU on a library thread and, beside the model's launches, 123 ms instead of
29; through the UVA kernel it takes SMs from the model and tops out at 92% of the ceiling; and
load + backup at once reach only 1.02-1.13x one direction (docs/benchmarks.md, fourth round).
With a host-side gather the device sees slots in one run. What decides it is whether 16 CPU
cores gather and scatter 42 KB / 8 KB rows at the PCIe rate next to the DMA traffic, which this
probe measures, with the layer pipeline (gather layer i+1 while layer i is on the wire; a device
``index_copy_`` scatters the staged layer to the pages), alone, beside a matmul per layer, and
load + backup at once. Its own torch copies, not the library's paths (it borrows
``transfer_gpu``'s timing and matmul helpers).

    python3 benchmarks/host_gather_probe.py [--reps 5] [--out docs/benchmarks/host_gather_probe.json]
    python3 benchmarks/host_gather_probe.py --cpu-check        # the gather / scatter logic on CPU
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transfer_gpu as tg  # noqa: E402  (measure, side_copy, the matmul helpers)

LAYERS = 61
ROW_BYTES = (41984, 8448)  # NSA fp8: latent and indexer bytes per page and layer
POOL_SLOTS = 2048
PAGES = 512


#: ``--movers``: the (pool, numpy) kinds of mover measured at each thread count.
MOVER_KINDS = {"torch": ((False, False), (True, False)), "numpy": ((True, True),),
               "all": ((False, False), (True, False), (True, True))}


def chunks(n: int, parts: int) -> list[slice]:
    step = -(-n // parts)
    return [slice(s, min(n, s + step)) for s in range(0, n, step)]


class Mover:
    """Gathers rows ``src[idx] -> out`` and scatters ``out -> dst[idx]`` with ``threads`` Python
    threads (each one ``index_select`` / ``index_copy_`` of a chunk, one intra-op thread each) or,
    with ``pool=False``, one call on torch's intra-op pool of ``threads``. With ``numpy=True`` the
    threads run numpy's ``take`` (``mode="clip"``: with the default ``"raise"`` numpy buffers
    ``out``) and fancy assignment instead, which copy a contiguous row with one ``memmove`` and
    release the GIL; torch's ``index_select`` of uint8 rows moved 4.4 GB/s on one of the H200
    host's cores (2026-12-01)."""

    def __init__(self, threads: int, pool: bool, numpy: bool = False) -> None:
        if numpy and not pool:
            raise ValueError("the numpy mover runs on its own threads (pool=True)")
        self.threads, self.pool, self.numpy = threads, pool, numpy
        self.executor = ThreadPoolExecutor(threads, initializer=torch.set_num_threads, initargs=(1,)) if pool else None

    def name(self) -> str:
        if self.numpy:
            return f"{self.threads} numpy threads"
        return f"{self.threads} python threads" if self.pool else f"intra-op {self.threads}"

    def _run(self, jobs) -> None:
        """``jobs``: (fn(rows slice), rows); one call per job, or per chunk of its rows on the pool."""
        if self.executor is None:
            torch.set_num_threads(self.threads)
            for fn, _ in jobs:
                fn(slice(None))
            return
        futures = [self.executor.submit(fn, part) for fn, rows in jobs for part in chunks(rows, self.threads)]
        for f in futures:
            f.result()

    def gather(self, pairs) -> None:
        """``pairs``: (src [slots, bytes], idx, out [len(idx), bytes])."""
        if self.numpy:
            self._run([(lambda part, s=s.numpy(), i=i.numpy(), o=o.numpy():
                        np.take(s, i[part], axis=0, out=o[part], mode="clip"), len(i)) for s, i, o in pairs])
            return
        self._run([(lambda part, s=s, i=i, o=o: torch.index_select(s, 0, i[part], out=o[part]), len(i))
                   for s, i, o in pairs])

    def scatter(self, pairs) -> None:
        """``pairs``: (dst [slots, bytes], idx, src [len(idx), bytes])."""
        if self.numpy:
            def put(part, d, i, s):
                d[i[part]] = s[part]
            self._run([(functools.partial(put, d=d.numpy(), i=i.numpy(), s=s.numpy()), len(i)) for d, i, s in pairs])
            return
        self._run([(lambda part, d=d, i=i, s=s: d.index_copy_(0, i[part], s[part]), len(i)) for d, i, s in pairs])

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown()


def cpu_check() -> int:
    """The gather and scatter of every mover on small CPU tensors, against plain indexing."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(0, 256, (64, 100), dtype=torch.uint8, generator=g)
    idx = torch.randperm(64, generator=g)[:20]
    for mover in (Mover(3, True), Mover(2, False), Mover(3, True, numpy=True)):
        out = torch.empty(20, 100, dtype=torch.uint8)
        mover.gather([(src, idx, out)])
        assert torch.equal(out, src[idx]), mover.name()
        dst = torch.zeros_like(src)
        mover.scatter([(dst, idx, out)])
        assert torch.equal(dst[idx], src[idx]) and int(dst.sum()) == int(src[idx].sum()), mover.name()
        mover.close()
    print("cpu check passed")
    return 0


class Setup:
    def __init__(self, args) -> None:
        t0 = time.perf_counter()
        self.host = [torch.empty(LAYERS, POOL_SLOTS, b, dtype=torch.uint8, pin_memory=True) for b in ROW_BYTES]
        self.dev = [torch.empty(LAYERS, POOL_SLOTS, b, dtype=torch.uint8, device="cuda") for b in ROW_BYTES]
        for h, d in zip(self.host, self.dev):
            d.random_(0, 256)
            h.copy_(d)
        g = torch.Generator().manual_seed(7)
        # Scattered host slots and device pages; the load's and the backup's are disjoint, so the
        # two at once are deterministic and both can be checked afterwards.
        slots, pages = torch.randperm(POOL_SLOTS, generator=g), torch.randperm(POOL_SLOTS, generator=g)
        self.slots, self.back_slots = slots[:PAGES], slots[PAGES:2 * PAGES]
        self.pages, self.back_pages = pages[:PAGES].cuda(), pages[PAGES:2 * PAGES].cuda()
        self.layer_bytes = PAGES * sum(ROW_BYTES)
        self.bytes = self.layer_bytes * LAYERS
        nbuf = args.buffers
        self.bounce = [[torch.empty(PAGES, b, dtype=torch.uint8, pin_memory=True) for b in ROW_BYTES] for _ in range(2 * nbuf)]
        self.staging = [[torch.empty(PAGES, b, dtype=torch.uint8, device="cuda") for b in ROW_BYTES] for _ in range(2 * nbuf)]
        torch.cuda.synchronize()
        print(f"setup {time.perf_counter() - t0:.1f} s", flush=True)


def load(s: Setup, mover: Mover, stream, start_event, nbuf: int, base: int = 0, on_layer=None):
    """A 61-layer load: per layer gather into bounce buffer k, copy it to staging k, scatter to the
    pages; returns the per-layer events. Bounce k is reused after its copy's event completed."""
    stream.wait_event(start_event)
    copied = [None] * nbuf
    events = []
    for layer in range(LAYERS):
        k = layer % nbuf
        if copied[k] is not None:
            copied[k].synchronize()
        bounce, staging = s.bounce[base + k], s.staging[base + k]
        mover.gather([(s.host[c][layer], s.slots, bounce[c]) for c in range(2)])
        with torch.cuda.stream(stream):
            for c in range(2):
                staging[c].copy_(bounce[c], non_blocking=True)
            copied[k] = torch.cuda.Event()
            copied[k].record(stream)
            for c in range(2):
                s.dev[c][layer].index_copy_(0, s.pages, staging[c])
            done = torch.cuda.Event(enable_timing=True)
            done.record(stream)
        events.append(done)
        if on_layer is not None:
            on_layer(layer, done)
    return events


def backup(s: Setup, mover: Mover, stream, start_event, nbuf: int, base: int):
    """A 61-layer backup: per layer gather the pages into staging k on the device, copy it to
    bounce k, and once that copy is done scatter bounce k into the host slots (CPU). Returns the
    wall time at which the last scatter finished and the events."""
    stream.wait_event(start_event)
    pending = []
    events = []

    def drain(item):
        layer, k, ev = item
        ev.synchronize()
        mover.scatter([(s.host[c][layer], s.back_slots, s.bounce[base + k][c]) for c in range(2)])

    for layer in range(LAYERS):
        k = layer % nbuf
        if len(pending) == nbuf:
            drain(pending.pop(0))
        with torch.cuda.stream(stream):
            for c in range(2):
                torch.index_select(s.dev[c][layer], 0, s.back_pages, out=s.staging[base + k][c])
                s.bounce[base + k][c].copy_(s.staging[base + k][c], non_blocking=True)
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(stream)
        events.append(ev)
        pending.append((layer, k, ev))
    for item in pending:
        drain(item)
    return time.perf_counter(), events


def check_load(s: Setup) -> bool:
    return all(torch.equal(s.dev[c][layer][s.pages].cpu(), s.host[c][layer][s.slots]) for c in range(2)
               for layer in (0, 30, 60))


def check_backup(s: Setup) -> bool:
    return all(torch.equal(s.host[c][layer][s.back_slots], s.dev[c][layer][s.back_pages].cpu()) for c in range(2)
               for layer in (0, 30, 60))


def timed(fn, reps: int) -> dict:
    ms = []
    cpu = []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        c0 = time.process_time()
        ms.append(fn())
        cpu.append((time.process_time() - c0) * 1e3)
    return {"ms": statistics.median(ms[1:]), "ms_each": ms[1:], "cpu_ms": statistics.median(cpu[1:])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--buffers", type=int, default=3)
    parser.add_argument("--out", default="docs/benchmarks/host_gather_probe.json")
    parser.add_argument("--cpu-check", action="store_true")
    parser.add_argument("--movers", choices=sorted(MOVER_KINDS), default="all",
                        help="torch's index_select / index_copy_, numpy's take / fancy assignment, or both")
    args = parser.parse_args()
    if args.cpu_check:
        return cpu_check()
    cores = len(os.sched_getaffinity(0))
    s = Setup(args)
    results: list[dict] = []

    def add(row: dict) -> None:
        results.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "ms_each"}),
              flush=True)

    # Ceiling: one contiguous pinned copy of the load's bytes each way, in this run.
    big_h = torch.empty(s.bytes, dtype=torch.uint8, pin_memory=True)
    big_d = torch.empty(s.bytes, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()

    ceiling = {}
    for op, dst, src in (("h2d", big_d, big_h), ("d2h", big_h, big_d)):
        t = tg.measure(lambda i: [tg.side_copy(dst, src, side)], args.reps)
        ceiling[op] = s.bytes / t["ms"] / 1e6
        add({"group": "ceiling", "op": op, **t, "gbps": ceiling[op]})
    del big_h, big_d

    # 1. CPU gather / scatter alone, every mover.
    movers = [Mover(t, pool, numpy) for t in (1, 4, 8, 12, 16) if t <= cores
              for pool, numpy in MOVER_KINDS[args.movers]]
    for mover in movers:
        for op in ("gather", "scatter"):
            def run(mover=mover, op=op):
                t0 = time.perf_counter()
                for layer in range(LAYERS):
                    b = s.bounce[layer % 2]
                    if op == "gather":
                        mover.gather([(s.host[c][layer], s.slots, b[c]) for c in range(2)])
                    else:
                        mover.scatter([(s.host[c][layer], s.back_slots, b[c]) for c in range(2)])
                return (time.perf_counter() - t0) * 1e3
            t = timed(run, args.reps)
            add({"group": "cpu", "op": op, "mover": mover.name(), **t, "gbps": s.bytes / t["ms"] / 1e6})

    stream, stream2 = torch.cuda.Stream(), torch.cuda.Stream()
    nbuf = args.buffers

    def load_once(mover):
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        events = load(s, mover, stream, start, nbuf)
        torch.cuda.synchronize()
        return start.elapsed_time(events[-1])

    def backup_once(mover):
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        t_end, _ = backup(s, mover, stream, start, nbuf, 0)
        return (t_end - t0) * 1e3

    # 2. Pipelined load and backup alone (wall for the backup: it ends on the CPU).
    pipelined = [m for m in movers if m.threads >= 4]
    best = {}  # op -> (mover, ms) of the fastest mover that copied every byte
    ops = (("load61", load_once, check_load, "h2d"), ("backup", backup_once, check_backup, "d2h"))
    for mover in pipelined:
        for op, once, check, direction in ops:
            t = timed(lambda: once(mover), args.reps)
            ok = check(s)
            gbps = s.bytes / t["ms"] / 1e6
            add({"group": op, "mover": mover.name(), **t, "gbps": gbps, "frac_of_ceiling": gbps / ceiling[direction],
                 "bytes_ok": ok})
            if ok and t["ms"] < best.get(op, (None, float("inf")))[1]:
                best[op] = (mover, t["ms"])
    if "load61" not in best:
        print("no load mover copied every byte", flush=True)
        return 1

    # 3. Load + backup at once: the load on this thread, the backup on another, separate movers.
    for threads_each in sorted({max(4, cores // 2), max(4, cores // 4)}):
        numpy_movers = args.movers != "torch"  # numpy's when measured: they release the GIL
        lm, bm = Mover(threads_each, True, numpy_movers), Mover(threads_each, True, numpy_movers)

        def both_once():
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            out = {}
            th = threading.Thread(target=lambda: out.setdefault("b", backup(s, bm, stream2, start, nbuf, nbuf)))
            th.start()
            events = load(s, lm, stream, start, nbuf)
            th.join()
            torch.cuda.synchronize()
            assert len(events) == LAYERS and "b" in out
            return (time.perf_counter() - t0) * 1e3  # wall: the backup ends on the CPU

        t = timed(both_once, args.reps)
        ok = check_load(s) and check_backup(s)
        gbps = 2 * s.bytes / t["ms"] / 1e6
        add({"group": "both", "mover": f"{lm.name()} + {bm.name()}", **t, "gbps": gbps,
             "x_one_direction": gbps / ceiling["h2d"], "bytes_ok": ok})
        lm.close()
        bm.close()

    # 4. Beside compute: the load on a library thread, the model's matmuls on this one.
    mover, load_ms = best["load61"]
    k = 4096
    max_rows = 16384
    weight = torch.randn(k, k, device="cuda", dtype=torch.bfloat16)
    x_all = torch.randn(max_rows, k, device="cuda", dtype=torch.bfloat16)
    y_all = torch.empty(max_rows, k, device="cuda", dtype=torch.bfloat16)
    model = torch.cuda.Stream()

    def layer_compute(per_layer_ms):
        """(matmuls per layer, rows each) taking about ``per_layer_ms``: several matmuls where one
        of ``max_rows`` rows is shorter (this probe's loads are slow, so their layers are long)."""
        count = max(1, math.ceil(per_layer_ms / tg.matmul_ms(x_all, weight, y_all, max_rows, model)))
        return count, tg.matmul_rows_for(per_layer_ms / count, x_all, weight, y_all, model)

    def beside_once(count, m, with_load):
        torch.cuda.synchronize()
        ready = [threading.Event() for _ in range(LAYERS)]
        events = [None] * LAYERS
        errors: list[BaseException] = []
        marks = []

        def on_layer(layer, ev):
            events[layer] = ev
            ready[layer].set()

        def run_load():
            try:
                load(s, mover, stream, start, nbuf, 0, on_layer)
            except BaseException as exc:  # handed to this thread below
                errors.append(exc)
                for r in ready:
                    r.set()

        with torch.cuda.stream(model):
            start = torch.cuda.Event(enable_timing=True)
            start.record(model)
            th = threading.Thread(target=run_load) if with_load else None
            if th is not None:
                th.start()
            for layer in range(LAYERS):
                if th is not None:
                    if not ready[layer].wait(timeout=60) or errors:
                        th.join(timeout=60)
                        raise RuntimeError(f"the load thread stopped before layer {layer}") from (errors or [None])[0]
                    model.wait_event(events[layer])
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record(model)
                for _ in range(count):
                    torch.matmul(x_all[:m], weight, out=y_all[:m])
                e1.record(model)
                marks.append((e0, e1))
        if th is not None:
            th.join()
        torch.cuda.synchronize()
        end = max(start.elapsed_time(marks[-1][1]), start.elapsed_time(events[-1]) if with_load else 0.0)
        busy = sum(a.elapsed_time(b) for a, b in marks)
        return end, busy

    for factor in (0.5, 1.25):
        count, m = layer_compute(factor * load_ms / LAYERS)
        alone = [beside_once(count, m, False) for _ in range(args.reps + 1)][1:]
        both = [beside_once(count, m, True) for _ in range(args.reps + 1)][1:]
        compute_ms = statistics.median(a for a, _ in alone)
        both_ms = statistics.median(a for a, _ in both)
        add({"group": "beside_compute", "mover": mover.name(), "factor": factor, "matmuls_per_layer": count, "rows": m,
             "load_ms": load_ms, "compute_ms": compute_ms, "compute_per_load": compute_ms / load_ms, "both_ms": both_ms,
             "hidden_fraction": (load_ms + compute_ms - both_ms) / load_ms,
             "compute_slowdown": statistics.median(b for _, b in both) / statistics.median(b for _, b in alone),
             "bytes_ok": check_load(s)})

    for m in movers:
        m.close()
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "cores": cores, "reps": args.reps, "buffers": nbuf, "ceiling_gbps": ceiling,
           "results": results}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
