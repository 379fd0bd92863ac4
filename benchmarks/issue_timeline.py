"""Probe: where a 61-layer load's issue time goes, layer by layer, on the H200.

A load measured from the call with no sleep before it (as ``beside_compute`` measures the load
alone, and as an engine issues it) ends later than the same load issued ahead of the device: a
scattered ``page_first`` load of 512 pages takes 41.9 ms from the call against 29.9 ms of copying
(2026-12-02 nineteenth probe). This script shows why, per layer and per rep:
- ``issued_ms``: when the library thread made the layer's event available (wall, from the call);
- ``landed_ms``: when the layer's event completed on the device (from a start event recorded just
  before the call);
and, summed over the reps, the wall and thread CPU time spent in each of the issue's steps
(planning, table upload, copy-engine rows, kernel launches, event hand-offs), per thread, plus
each thread's total CPU against its wall time (a gap is GIL or a blocked CUDA call).

With ``--beside`` the model's matmuls (about 1.25x the load, as ``beside_compute``) consume the
layers, and each layer also gets ``waited_ms`` (when the caller's ``wait_layer`` returned).

    python3 benchmarks/issue_timeline.py [--reps 6] [--layouts page_first,layer_first]
        [--slots scattered,runs] [--beside] [--staging-bytes N] [--lead-blocks 1,3 | --set twentyfourth]
        [--trace-ms 20]
        [--out docs/benchmarks/issue_timeline.json]
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import statistics
import sys
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serving_probe  # noqa: E402  (its candidate sets and PolicyVariant)
import transfer_gpu as tg  # noqa: E402

from tiered_kv.transfers import engine as te  # noqa: E402
from tiered_kv.transfers import policy as tp  # noqa: E402
from tiered_kv.kernels import batch_copy, staged_copy, uva_copy  # noqa: E402
from tiered_kv.transfers.engine import TransferEngine  # noqa: E402

#: The caller's steps before any copy, loads and backups alike (``backup_timeline.py`` too).
FRONT_STEPS = [
    (te, "validate", "engine: validate (ids, pools)"),
    (TransferEngine, "_check_host_pinned", "engine: host pool pinned"),
    (TransferEngine, "_choose", "engine: path choice"),
]
#: (owner, attribute name, label): the issue's steps that are timed (wrapped for the run).
STEPS = [
    (TransferEngine, "load", "engine.load (whole call)"),
    # Before the first launch: the caller's path that the start delay beside compute is made of
    # (0.54 ms before the head's tables on the H200, 2026-12-02, not split further until these).
    *FRONT_STEPS,
    (TransferEngine, "_next_head_stream", "engine: head stream"),
    (te._Load, "__init__", "engine: _Load objects"),
    (TransferEngine, "_load_on_threads", "engine: hand-off to library threads"),
    (TransferEngine, "_parts", "engine._parts (split ids)"),
    (TransferEngine, "_load_plan", "engine._load_plan"),
    (te._Load, "kernel_half", "kernel_half (plans + upload)"),
    (uva_copy, "upload", "uva upload (kernel tables + ids)"),
    (te._Load, "staged_half", "staged_half (whole body)"),
    (te._Load, "finish_layer", "finish_layer (kernel block launch + event)"),
    (staged_copy.StagedCopier, "_units", "staged._units (planning)"),
    (staged_copy.StagedCopier, "_table", "staged._table"),
    (staged_copy.StagedCopier, "_engine_copies", "staged._engine_copies (CE rows)"),
    (staged_copy.StagedCopier, "_copy_list", "staged._copy_list (numpy rows)"),
    (staged_copy.StagedCopier, "_kernel", "staged._kernel (scatter launch)"),
    (staged_copy.StagedCopier, "_handoff", "staged._handoff (events)"),
    (staged_copy, "upload", "staged upload (tables)"),
    (batch_copy, "run_copy_list", "batch_copy.run_copy_list"),
    (uva_copy, "launch_uva", "uva_copy.launch_uva"),
]


SCATTERED, MIXED = dict(tp.SCATTERED_LOADS), dict(tp.MIXED_LOADS)


def use_lead_blocks(lead: int) -> None:
    """``auto``'s split tables for one case: every split with ``lead_blocks`` ``lead``, or the
    policy's own for 1. Set for every case, since the tables are read in the caller's ``load``
    and a case with 1 after one with 3 must not keep 3."""
    if lead == 1:
        tp.SCATTERED_LOADS, tp.MIXED_LOADS = SCATTERED, MIXED
    else:
        tp.SCATTERED_LOADS = {dense: replace(split, lead_blocks=lead) for dense, split in SCATTERED.items()}
        tp.MIXED_LOADS = {key: replace(split, lead_blocks=lead) for key, split in MIXED.items()}


class Timers:
    """Wall and thread-CPU seconds per (step, thread), while ``on``."""

    def __init__(self) -> None:
        self.wall = collections.defaultdict(float)
        self.cpu = collections.defaultdict(float)
        self.calls = collections.defaultdict(int)
        self.on = False
        self.trace: list[tuple[str, str, float, float]] = []  # (step, thread, start, end) while tracing
        self.tracing = False
        self._undo = []

    def wrap(self, owner, name: str, label: str) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        func = original.__func__ if isinstance(original, staticmethod) else original
        timers = self

        @functools.wraps(func)
        def timed(*args, **kwargs):
            if not timers.on:
                return func(*args, **kwargs)
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return func(*args, **kwargs)
            finally:
                key = (label, threading.current_thread().name)
                timers.wall[key] += time.perf_counter() - w0
                timers.cpu[key] += time.thread_time() - c0
                timers.calls[key] += 1
                if timers.tracing:
                    timers.trace.append((label, key[1], w0, time.perf_counter()))
        setattr(owner, name, staticmethod(timed) if isinstance(original, staticmethod) else timed)
        self._undo.append((owner, name, original))

    def undo(self) -> None:
        """Put every wrapped attribute back."""
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def rows(self, reps: int) -> list[dict]:
        return [{"step": label, "thread": thread, "calls_per_rep": self.calls[(label, thread)] / reps,
                 "wall_ms_per_rep": self.wall[(label, thread)] * 1e3 / reps,
                 "cpu_ms_per_rep": self.cpu[(label, thread)] * 1e3 / reps}
                for label, thread in sorted(self.wall)]


def thread_cpu() -> dict[str, float]:
    """CPU seconds of every live thread of this process, by name (Linux: per-thread clocks)."""
    out = {}
    for t in threading.enumerate():
        try:
            out[t.name] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, AttributeError):
            continue
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/benchmarks/issue_timeline.json")
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--layouts", default="page_first,layer_first")
    parser.add_argument("--slots", default="scattered,runs")
    parser.add_argument("--beside", action="store_true", help="consume the layers with matmuls at about 1.25x")
    parser.add_argument("--staging-bytes", type=int, default=None)
    parser.add_argument("--lead-blocks", default="1",
                        help="comma-separated LoadSplit.lead_blocks of auto's scattered split to run")
    parser.add_argument("--set", default=None,
                        help="time each candidate of this serving_probe.py candidate set (default: auto alone)")
    parser.add_argument("--trace-ms", type=float, default=20.0, help="print the first rep's steps up to this ms")
    tg.add_shape_arguments(parser)
    args = parser.parse_args()
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.set is not None and args.set not in serving_probe.CANDIDATE_SETS:
        parser.error(f"--set: no candidate set {args.set!r} (one of {', '.join(sorted(serving_probe.CANDIDATE_SETS))})")
    if args.set is not None and args.lead_blocks != "1":
        parser.error("--set and --lead-blocks swap the same policy tables: give one of them")
    candidates = serving_probe.CANDIDATE_SETS[args.set] if args.set else [("auto", "auto", None, {}, None)]
    torch.manual_seed(0)
    spec = tg.Bench(args).spec
    device_pool, hosts = tg.random_pools(spec, args)
    page_sets, slot_sets = tg.id_sets(args, 4)
    timers = Timers()
    # Each layer's availability to the caller: ``_Issued.layer`` is called by the issuing thread.
    issued_at: dict[int, float] = {}
    original_layer = te._Issued.layer

    def layer(self, index):
        issued_at.setdefault(index, time.perf_counter())
        return original_layer(self, index)

    try:
        for owner, name, label in STEPS:
            timers.wrap(owner, name, label)
        te._Issued.layer = layer
        time_cases(args, candidates, spec, device_pool, hosts, page_sets, slot_sets, timers, issued_at)
    finally:  # the engine's classes and the policy tables as they were, also after an error
        timers.undo()
        te._Issued.layer = original_layer
        use_lead_blocks(1)
        for host in hosts.values():
            host.close()
    return 0


def time_cases(args, candidates, spec, device_pool, hosts, page_sets, slot_sets, timers: Timers,
               issued_at: dict[int, float]) -> None:
    """Time every (layout, candidate, slots, lead blocks) case and write ``args.out``."""
    k = 4096
    weight = torch.randn(k, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(32768, k, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    model = torch.cuda.Stream()
    results = []
    for layout, (name, path, options, kwargs, change) in [(lo, c) for lo in args.layouts.split(",") for c in candidates]:
        if args.staging_bytes:
            kwargs = {**kwargs, "staging_bytes": args.staging_bytes}
        engine = TransferEngine(device_pool, hosts[layout], path=path, timing=True, **kwargs)
        loader = serving_probe.PolicyVariant(engine, change) if change is not None else engine
        for kind, lead in [(k, int(v)) for k in args.slots.split(",") for v in args.lead_blocks.split(",")]:
            use_lead_blocks(lead)
            rows = 0
            if args.beside:  # the load alone from the call, then rows for 1.25x of it
                ms = []
                for i in range(3):
                    torch.cuda.synchronize()
                    start = torch.cuda.Event(enable_timing=True)
                    start.record()
                    h = loader.load(slot_sets[kind][i % 4], page_sets[i % 4], options=options)
                    h.synchronize()
                    ms.append(max(start.elapsed_time(h.event(L)) for L in h.layers))
                rows = tg.matmul_rows_for(1.25 * statistics.median(ms) / spec.num_layers, x, weight, y, model)
            per_rep = []
            timers.wall.clear(), timers.cpu.clear(), timers.calls.clear()
            cpu_before = {}
            for i in range(args.reps + 1):
                measured = i > 0
                torch.cuda.synchronize()
                issued_at.clear()
                timers.on = measured
                timers.tracing, timers.trace = i == 1, []
                cpu_before = thread_cpu()
                with torch.cuda.stream(model):
                    start = torch.cuda.Event(enable_timing=True)
                    start.record()
                    t0 = time.perf_counter()
                    h = loader.load(slot_sets[kind][i % 4], page_sets[i % 4], options=options)
                    returned = time.perf_counter()
                    waited, marks = {}, []
                    if rows:
                        for L in h.layers:
                            h.wait_layer(L)
                            waited[L] = time.perf_counter()
                            e0 = torch.cuda.Event(enable_timing=True)
                            e0.record()
                            torch.matmul(x[:rows], weight, out=y[:rows])
                            marks.append(e0)
                    h.synchronize()
                    issue_end = time.perf_counter()
                torch.cuda.synchronize()
                timers.on = False
                cpu_after = thread_cpu()
                if not measured:
                    continue
                if i == 1:
                    trace = [(label, thread, (a - t0) * 1e3, (z - t0) * 1e3) for label, thread, a, z in timers.trace
                             if (a - t0) * 1e3 <= args.trace_ms]
                landed = {L: start.elapsed_time(h.event(L)) for L in h.layers}
                per_rep.append({
                    "returned_ms": (returned - t0) * 1e3, "issue_end_ms": (issue_end - t0) * 1e3,
                    "landed_last_ms": max(landed.values()),
                    "issued_ms": {L: (issued_at[L] - t0) * 1e3 for L in h.layers if L in issued_at},
                    "landed_ms": landed,
                    "waited_ms": {L: (w - t0) * 1e3 for L, w in waited.items()},
                    "matmul_start_ms": {L: start.elapsed_time(e) for L, e in zip(h.layers, marks)},
                    "thread_cpu_ms": {n: (cpu_after[n] - cpu_before.get(n, 0.0)) * 1e3 for n in cpu_after},
                })
            med = {key: statistics.median(r[key] for r in per_rep) for key in ("returned_ms", "issue_end_ms", "landed_last_ms")}
            layers = per_rep[0]["landed_ms"].keys()

            def median_of(key, L):
                vals = [r[key][L] for r in per_rep if L in r[key]]
                return statistics.median(vals) if vals else None
            timeline = [{"layer": L, "issued_ms": median_of("issued_ms", L), "landed_ms": median_of("landed_ms", L),
                         "waited_ms": median_of("waited_ms", L), "matmul_start_ms": median_of("matmul_start_ms", L)}
                        for L in layers]
            threads = collections.defaultdict(list)
            for r in per_rep:
                for n, ms in r["thread_cpu_ms"].items():
                    threads[n].append(ms)
            row = {"candidate": name, "layout": layout, "slots": kind, "lead_blocks": lead, "beside_rows": rows, "trace": trace, **med, "timeline": timeline,
                   "thread_cpu_ms": {n: statistics.median(v) for n, v in threads.items() if statistics.median(v) > 0.05},
                   "steps": timers.rows(args.reps)}
            results.append(row)
            print(f"== {name}: {layout} {kind} lead blocks {lead} rows {rows}: returned {med['returned_ms']:.2f} ms, issue+sync end "
                  f"{med['issue_end_ms']:.2f}, last layer landed {med['landed_last_ms']:.2f}", flush=True)
            print("   thread cpu ms:", {n: round(v, 2) for n, v in row["thread_cpu_ms"].items()})
            for s in row["steps"]:
                print(f"   {s['step']:45s} {s['thread']:22s} calls {s['calls_per_rep']:6.1f} wall {s['wall_ms_per_rep']:7.2f} "
                      f"cpu {s['cpu_ms_per_rep']:7.2f}")
            print("   first rep's steps (ms from the call):")
            for label, thread, a, z in sorted(trace, key=lambda t: t[2]):
                print(f"     {a:7.2f} {z:7.2f} {z - a:6.2f}  {thread[-7:]:8s} {label}")
            print("   layer: issued / landed / waited / matmul start (ms)")
            print("   " + " ".join(f"{t['layer']}:{_f(t['issued_ms'])}/{_f(t['landed_ms'])}/{_f(t['waited_ms'])}/"
                                    f"{_f(t['matmul_start_ms'])}" for t in timeline), flush=True)
        engine.close()
    Path(args.out).write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                          "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                          "args": vars(args), "results": results}, indent=1))



def _f(v) -> str:
    return "-" if v is None else f"{v:.1f}"


if __name__ == "__main__":
    sys.exit(main())
