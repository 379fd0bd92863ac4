"""Where the time before a load's layer 0 lands goes (H200): the caller's steps, then the kernel.

Beside the model's compute, every ``auto`` load of the serving probes lost 1.4-2.6 ms before the
model's first matmul could start (``start_delay_ms``), 5-8% of a 61-layer load, against about
0.5 ms that one layer's bytes need on PCIe. This probe runs one load at a time from an idle GPU
(as the beside-compute group does) and stamps, on the caller's thread, the end of each step of
``TransferEngine.load`` up to the head's first launch (validation, path choice, split, the head's
upload, the launch call itself), with a CUDA event recorded right before and after that launch on
the head's stream. Then, on the same ids, the floor: one layer's UVA kernel alone with its table
and ids already on the device, and a contiguous copy-engine copy of one layer's bytes. Each load
runs twice: right after ``torch.cuda.synchronize()`` (as the beside-compute group starts it) and
from a caller that polled the device and kept busy for 2 ms (``caller: busy``).

    python3 benchmarks/first_layer_probe.py [--reps 10] [--out docs/benchmarks/first_layer_probe.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transfer_gpu as tg  # noqa: E402

import tiered_kv.transfers.engine as te  # noqa: E402
from tiered_kv.kernels import uva_copy  # noqa: E402
from tiered_kv.transfers.engine import TransferEngine  # noqa: E402


class Stamps:
    """perf_counter stamps (ms from the call) of the steps of one load, and events around the
    head's first launch."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self.marks: dict[str, float] = {}
        self.before = self.after = None

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, (time.perf_counter() - self.t0) * 1e3)


STAMPS = Stamps()


def _wrap(owner, name: str, label: str, *, first_launch: bool = False) -> None:
    inner = getattr(owner, name)

    def wrapped(*args, **kwargs):
        if first_launch and "launch called" not in STAMPS.marks:
            STAMPS.mark("launch called")
            STAMPS.before = torch.cuda.Event(enable_timing=True)
            STAMPS.before.record()
            out = inner(*args, **kwargs)
            STAMPS.after = torch.cuda.Event(enable_timing=True)
            STAMPS.after.record()
            STAMPS.mark(label)
            return out
        out = inner(*args, **kwargs)
        STAMPS.mark(label)
        return out
    setattr(owner, name, wrapped)


def instrument() -> None:
    _wrap(te, "validate", "validated")
    _wrap(TransferEngine, "_choose", "path chosen")
    _wrap(uva_copy, "upload", "first upload")
    _wrap(uva_copy, "launch_uva", "launch returned", first_launch=True)


def _spin_until_idle(busy_ms: float = 2.0) -> None:
    """Wait for the device by polling, then keep the thread busy a little longer: a caller that
    was running (as a serving engine's scheduler is) instead of one woken from a synchronize."""
    while not torch.cuda.current_stream().query():
        pass
    end = time.perf_counter() + busy_ms / 1e3
    while time.perf_counter() < end:
        pass


def one_load(engine, slots, pages, warm: bool = False) -> dict:
    torch.cuda.synchronize()
    if warm:
        _spin_until_idle()
    STAMPS.marks, STAMPS.before, STAMPS.after = {}, None, None
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    STAMPS.t0 = time.perf_counter()
    handle = engine.load(slots, pages)
    returned = (time.perf_counter() - STAMPS.t0) * 1e3
    handle.synchronize()
    torch.cuda.synchronize()
    out = dict(STAMPS.marks, returned=returned, layer0_gpu=start.elapsed_time(handle.event(handle.layers[0])))
    if STAMPS.before is not None:
        out["launch_enqueued_gpu"] = start.elapsed_time(STAMPS.before)
        out["launch_done_gpu"] = start.elapsed_time(STAMPS.after)
    return out


def micro(device_pool, host, slots, pages, reps: int = 200) -> dict:
    """CPU microseconds per call of each step before a head's first launch, on this host."""
    import numpy as np

    from tiered_kv.kernels import find_runs
    from tiered_kv.transfers.policy import is_scattered

    engine = TransferEngine(device_pool, host, path="auto")
    copy = te.validate(device_pool, host, pages, slots, to_host=False)
    plans = [engine._load_plan((layer,)) for layer in range(8)]
    tables = [p.table for p in plans]
    device = torch.device("cuda")
    table, s, d = uva_copy.upload(device, [plans[0].table, slots, pages])
    pinned = torch.empty(1 << 16, dtype=torch.int64, pin_memory=True)
    on_device = torch.empty(1 << 16, dtype=torch.int64, device=device)
    stream = torch.cuda.Stream()

    def numpy_concat_pin():
        packed = np.concatenate([t.numpy().reshape(-1) for t in tables] + [slots.numpy(), pages.numpy()])
        return torch.from_numpy(packed).pin_memory().to(device, non_blocking=True)

    def pinned_ring():
        n = slots.numel()
        pinned[:n].numpy()[:] = slots.numpy()
        pinned[n:2 * n].numpy()[:] = pages.numpy()
        on_device[:2 * n].copy_(pinned[:2 * n], non_blocking=True)

    steps = {
        "validate": lambda: te.validate(device_pool, host, pages, slots, to_host=False),
        "is_scattered": lambda: is_scattered(slots),
        "find_runs (is_scattered before)": lambda: find_runs(slots, torch.arange(slots.numel()), sort_by="src").mean_length,
        "find_runs (direct check before)": lambda: find_runs(slots, pages).mean_length,
        "_choose (scattered cached)": lambda: engine._choose(None, copy, to_host=False),
        "_choose (fresh copy)": lambda: engine._choose(None, te.validate(device_pool, host, pages, slots, to_host=False),
                                                       to_host=False),
        "_load_split": lambda: engine._load_split(61, None, copy),
        "upload 8 tables + ids": lambda: uva_copy.upload(device, tables + [slots, pages]),
        "upload ids only": lambda: uva_copy.upload(device, [slots, pages]),
        "numpy concat + pin_memory + to": numpy_concat_pin,
        "persistent pinned buffer + copy_": pinned_ring,
        "launch_uva (1 layer)": lambda: uva_copy.launch_uva(plans[0], table, s, d),
        "event record": lambda: torch.cuda.Event().record(),
        "stream wait_stream": lambda: stream.wait_stream(torch.cuda.current_stream()),
    }
    out = {}
    for name, step in steps.items():
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        out[name] = (time.perf_counter() - t0) / reps * 1e6
        torch.cuda.synchronize()
    print("micro (us per call):", "; ".join(f"{k} {v:.1f}" for k, v in out.items()), flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", default="docs/benchmarks/first_layer_probe.json")
    tg.add_shape_arguments(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    spec = tg.nsa_spec(61, 64)
    device_pool, hosts = tg.random_pools(spec, args)
    page_sets, slot_sets = tg.id_sets(args, 4)
    instrument()
    rows = []
    for layout, host in hosts.items():
        engine = TransferEngine(device_pool, host, path="auto", timing=True)
        for kind in ("runs", "scattered"):
            for i in range(3):
                engine.load(slot_sets[kind][i % 4], page_sets[i % 4]).synchronize()
            for warm in (False, True):
                reps = [one_load(engine, slot_sets[kind][i % 4], page_sets[i % 4], warm) for i in range(args.reps)]
                row = {"layout": layout, "slots": kind, "caller": "busy" if warm else "after synchronize",
                       "path": engine._choose(None, te.validate(device_pool, host, page_sets[0], slot_sets[kind][0],
                                                                to_host=False), to_host=False)}
                for key in reps[0]:
                    row[key] = statistics.median(r[key] for r in reps if key in r)
                rows.append(row)
                print(layout, kind, " ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in row.items() if k not in ("layout", "slots")), flush=True)
    # The floor: layer 0 of 512 pages by the UVA kernel, everything already on the device.
    floor = {}
    for layout, host in hosts.items():
        engine = TransferEngine(device_pool, host, path="kernel")
        plan = engine._load_plan((0,))
        slots, pages = slot_sets["scattered"][0], page_sets[0]
        table, s, d = uva_copy.upload(torch.device("cuda"), [plan.table, slots, pages])
        times = []
        for _ in range(args.reps + 2):
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            uva_copy.launch_uva(plan, table, s, d)
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1))
        floor[f"kernel layer 0 {layout} scattered"] = statistics.median(times[2:])
    layer_bytes = args.pages * sum(c.bytes_per_layer for c in spec.components)
    src = torch.empty(layer_bytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(layer_bytes, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(args.reps + 2):
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src, non_blocking=True)
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    floor["copy engine, one layer's bytes contiguous"] = statistics.median(times[2:])
    micro_us = micro(device_pool, hosts["page_first"], slot_sets["runs"][0], page_sets[0])
    print("floor (ms):", " ".join(f"{k}: {v:.3f}" for k, v in floor.items()), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
        "torch": torch.__version__, "python": platform.python_version(), "pages": args.pages, "reps": args.reps,
        "loads_ms": rows, "floor_ms": floor, "micro_us": micro_us}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
