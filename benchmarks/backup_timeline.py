"""Probe: where a backup's time from the call goes, on the H200.

Timed from the call, ``auto``'s staged backups (``page_first`` slots of both kinds, ``layer_first``
runs) end 2.2-2.8 ms later than after the benchmark's device sleep, while planning the staging
ring's units and tables takes about 0.25 ms (2026-12-03, twenty-first session,
docs/benchmarks.md). This script shows where the rest goes, per rep, with nothing ahead of the
backup on the device:
- ``returned_ms``: when ``engine.backup`` returned (wall, from the call);
- ``first_launch_ms`` / ``first_copy_ms``: when the caller's thread launched the ring's first
  gather kernel / enqueued its first copy-engine copy (wall, from the call);
- ``first_gathered_ms`` / ``first_copied_ms``: when those landed on the device (from a start event
  recorded just before the call; timing events recorded right behind them);
- ``landed_ms``: when the backup's own event completed;
and, summed over the reps, the wall and thread CPU time of each step of the issue (as
``issue_timeline.py`` does for loads).

    python3 benchmarks/backup_timeline.py [--reps 10] [--layouts page_first,layer_first]
        [--slots scattered,runs] [--plan-waves default,0,1,4] [--trace-ms 5]
        [--out docs/benchmarks/backup_timeline.json]

``--plan-waves``: ``TransferOptions.backup_plan_wave`` of each case (``default``: the policy's,
``0``: every unit planned before the first gather).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import issue_timeline  # noqa: E402  (its step timers and the caller's front steps)
import transfer_gpu as tg  # noqa: E402

from tiered_kv.transfers import engine as te  # noqa: E402
from tiered_kv.kernels import staged_copy, uva_copy  # noqa: E402
from tiered_kv.errors import ConfigError  # noqa: E402
from tiered_kv.transfers.engine import TransferEngine, TransferOptions  # noqa: E402
from tiered_kv.transfers.policy import backup_plan_wave  # noqa: E402

#: (owner, attribute name, label): a backup's steps that are timed (wrapped for the run).
STEPS = [
    (TransferEngine, "backup", "engine.backup (whole call)"),
    *issue_timeline.FRONT_STEPS,
    (staged_copy.StagedCopier, "_run", "staged._run (whole ring call)"),
    (staged_copy.StagedCopier, "_wave_units", "staged._wave_units (units)"),
    (staged_copy.StagedCopier, "_plan_wave", "staged._plan_wave (slots, tables, plans)"),
    (staged_copy.StagedCopier, "_send", "staged._send (table upload)"),
    (staged_copy.StagedCopier, "_issue_wave", "staged._issue_wave (every unit)"),
    (staged_copy.StagedCopier, "_kernel", "staged._kernel (gather launch)"),
    (staged_copy.StagedCopier, "_engine_copies", "staged._engine_copies (CE copies)"),
    (staged_copy.StagedCopier, "_handoff", "staged._handoff (events)"),
    (uva_copy, "launch_uva", "uva_copy.launch_uva"),
    (uva_copy, "upload", "uva_copy.upload"),
    # The mixed backup of scattered ``layer_first`` slots: the kernel's share, then a memcpy batch.
    (TransferEngine, "_uva", "engine._uva (mixed: kernel share)"),
    (te._Backup, "copy_rows", "_Backup.copy_rows (mixed: batch share)"),
]


class FirstUnit:
    """Marks a backup's first ring unit: the caller's wall time when its gather kernel was launched
    and its copy-engine copies enqueued, and a timing event right behind each on its stream."""

    def __init__(self) -> None:
        self.reset(0.0)
        self._undo = []

    def reset(self, t0: float) -> None:
        self.t0 = t0
        self.launch_ms = self.copy_ms = None
        self.gathered = self.copied = None

    def install(self) -> None:
        copier = staged_copy.StagedCopier
        kernel, copies = copier.__dict__["_kernel"], copier.__dict__["_engine_copies"]
        marks = self

        def _kernel(self, plan, table, src_ids, dst_ids, stream, num_ctas=None):
            kernel(self, plan, table, src_ids, dst_ids, stream, num_ctas)
            if marks.launch_ms is None and stream is not None:
                marks.launch_ms = (time.perf_counter() - marks.t0) * 1e3
                marks.gathered = torch.cuda.Event(enable_timing=True)
                marks.gathered.record(stream)

        def _engine_copies(self, unit, buffer_addr, to_device, streams, pitched=False):
            copies(self, unit, buffer_addr, to_device, streams, pitched)
            if marks.copy_ms is None and not to_device and streams and streams[0] is not None:
                marks.copy_ms = (time.perf_counter() - marks.t0) * 1e3
                marks.copied = torch.cuda.Event(enable_timing=True)
                marks.copied.record(streams[0])

        self._undo = [("_kernel", kernel), ("_engine_copies", copies)]
        copier._kernel, copier._engine_copies = _kernel, _engine_copies

    def uninstall(self) -> None:
        for name, original in self._undo:
            setattr(staged_copy.StagedCopier, name, original)
        self._undo = []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/benchmarks/backup_timeline.json")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--layouts", default="page_first,layer_first")
    parser.add_argument("--slots", default="scattered,runs")
    parser.add_argument("--plan-waves", default="default",
                        help="comma-separated backup_plan_wave values to time (default: the policy's; 0: one wave)")
    parser.add_argument("--trace-ms", type=float, default=5.0, help="print the first rep's steps up to this ms")
    tg.add_shape_arguments(parser)
    args = parser.parse_args()
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    try:
        plan_waves = [plan_wave(value) for value in args.plan_waves.split(",")]
    except (ValueError, ConfigError) as error:
        parser.error(f"--plan-waves: {error}")
    torch.manual_seed(0)
    spec = tg.Bench(args).spec
    device_pool, hosts = tg.random_pools(spec, args)
    page_sets, slot_sets = tg.id_sets(args, 4)
    timers, marks = issue_timeline.Timers(), FirstUnit()
    results = []
    try:
        for owner, name, label in STEPS:
            timers.wrap(owner, name, label)
        marks.install()  # around the step timers: the marks' own events stay out of the steps' times
        for layout in args.layouts.split(","):
            engine = TransferEngine(device_pool, hosts[layout], path="auto")
            for kind in args.slots.split(","):
                for options in plan_waves:
                    results.append(time_case(args, engine, layout, kind, page_sets, slot_sets, timers, marks, options))
            engine.close()
    finally:  # the ring's and the engine's methods as they were, also after an error
        marks.uninstall()
        timers.undo()
        for host in hosts.values():
            host.close()
    Path(args.out).write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                          "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                          "args": vars(args), "results": results}, indent=1))
    print(f"wrote {args.out}")
    return 0


def plan_wave(value: str) -> TransferOptions:
    """``--plan-waves`` item: ``default`` or a unit count (0: one wave)."""
    return TransferOptions() if value.strip() == "default" else TransferOptions(backup_plan_wave=int(value))


def time_case(args, engine, layout: str, kind: str, page_sets, slot_sets, timers, marks: FirstUnit,
              options: TransferOptions) -> dict:
    """``args.reps`` backups from the call (after one unmeasured), each with its first unit's marks."""
    per_rep, trace = [], []
    watcher = torch.cuda.Stream()
    timers.wall.clear(), timers.cpu.clear(), timers.calls.clear()
    for i in range(args.reps + 1):
        measured = i > 0
        torch.cuda.synchronize()
        timers.on, timers.tracing, timers.trace = measured, i == 1, []
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        marks.reset(t0)
        handle = engine.backup(page_sets[i % 4], slot_sets[kind][i % 4], options=options)
        returned = time.perf_counter()
        # The handle's event is not a timing event: a timing event on a stream that waits for it
        # completes when the backup lands (or when it is enqueued, just after the return, if later).
        landed = torch.cuda.Event(enable_timing=True)
        watcher.wait_event(handle.event)
        landed.record(watcher)
        handle.synchronize()
        torch.cuda.synchronize()
        timers.on = False
        if not measured:
            continue
        if i == 1:
            trace = [(label, thread, (a - t0) * 1e3, (z - t0) * 1e3) for label, thread, a, z in timers.trace
                     if (a - t0) * 1e3 <= args.trace_ms]
        per_rep.append({
            "returned_ms": (returned - t0) * 1e3, "landed_ms": start.elapsed_time(landed),
            "first_launch_ms": marks.launch_ms, "first_copy_ms": marks.copy_ms,
            "first_gathered_ms": start.elapsed_time(marks.gathered) if marks.gathered is not None else None,
            "first_copied_ms": start.elapsed_time(marks.copied) if marks.copied is not None else None,
        })
    keys = per_rep[0].keys()
    med = {key: (statistics.median(r[key] for r in per_rep) if per_rep[0][key] is not None else None) for key in keys}
    wave = backup_plan_wave(options)
    row = {"layout": layout, "slots": kind, "path": handle.path, "plan_wave": wave, **med, "trace": trace, "steps": timers.rows(args.reps)}
    print(f"== auto backup {layout} {kind} ({handle.path}, plan_wave {wave}): " + ", ".join(
        f"{key} {'-' if value is None else f'{value:.2f}'}" for key, value in med.items()), flush=True)
    for s in row["steps"]:
        print(f"   {s['step']:45s} {s['thread']:22s} calls {s['calls_per_rep']:6.1f} wall {s['wall_ms_per_rep']:7.2f} "
              f"cpu {s['cpu_ms_per_rep']:7.2f}")
    print("   first rep's steps (ms from the call):")
    for label, thread, a, z in sorted(trace, key=lambda t: t[2]):
        print(f"     {a:7.2f} {z:7.2f} {z - a:6.2f}  {thread[-7:]:8s} {label}")
    return row


if __name__ == "__main__":
    sys.exit(main())
