"""Probe: whether streams made with ``torch.cuda.Stream()`` are one of a transfer engine's own.

PyTorch hands out ``torch.cuda.Stream()`` round-robin from a pool of 32 streams per priority and
device, and the engine makes its streams the same way. So once enough streams have been made in a
process, a "new" stream is an engine stream. Work put on it then orders the engine's transfers
behind it, or the other way round. A serving engine's own streams can alias the library's like
this, and so can a benchmark's.

The twenty-second session (2026-12-03, docs/benchmarks.md) traced the busy-GPU 40.6% of
``transfer_gpu.py`` to this. A scattered ``page_first`` backup timed from the call ran at 22.44
GB/s, which is 70 ms: the backup's 30 ms plus the 40 ms sleep that ``measure(sleep="beside")``
put on "a stream of its own".

Since the twenty-third session the engine makes its own streams (``kernels.owned_streams``), so
no new torch stream should be one of them; the first run (at the twenty-second session's code,
docs/benchmarks/stream_alias_probe_pool.json) found 6 of 64 and a backup held 70.3 ms instead of
31.4.

This script checks that on the device:
- ``aliases``: which of ``--streams`` new streams per priority (0 and -1) are which engine streams,
  found through every stream attribute of the engine and its issue threads (a backup and a
  61-layer load are run first, so the lazily made streams exist);
- ``from_call``: backups and 61-layer loads of scattered slots timed from the call, by an engine
  with the library's own streams and one with torch's pool streams, in turn (``--ab-reps``);
- ``timed``: a backup from the call with a 40 ms sleep put first on a new stream that is the
  engine's backup stream, and on one that is no engine stream. With aliasing, the first should
  land about 40 ms later.

    python3 benchmarks/stream_alias_probe.py [--streams 64] [--reps 5]
        [--out docs/benchmarks/stream_alias_probe.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transfer_gpu as tg  # noqa: E402

from tiered_kv.transfers.engine import TransferEngine  # noqa: E402

def aliases(engine_handles: dict[str, int], candidates: Iterable[int]) -> dict[int, list[str]]:
    """For each candidate stream handle (by position) that is an engine stream, the engine's names for it."""
    names: dict[int, list[str]] = {}
    for name, handle in engine_handles.items():
        names.setdefault(handle, []).append(name)
    return {i: names[handle] for i, handle in enumerate(candidates) if handle in names}


def from_call_ab(device_pool, hosts, pages, slots, reps: int) -> dict:
    """Backups and 61-layer loads of scattered slots timed from the call to their end (ms), by an
    engine with the library's own streams and one with torch's pool streams, rep by rep in turn
    (so both see the same host and link; each goes first every other rep), per layout; the
    engine's ``auto`` path."""
    rows: dict = {}
    nbytes = len(pages) * device_pool.spec.page_bytes
    for layout, host in hosts.items():
        engines = {"owned": TransferEngine(device_pool, host, path="auto"),
                   "pool": tg.pool_stream_engine(device_pool, host, path="auto")}
        ops = {"backup": lambda e: e.backup(pages, slots), "load61": lambda e: e.load(slots, pages)}
        try:
            for op, issue in ops.items():
                times: dict[str, list[float]] = {name: [] for name in engines}
                for rep in range(reps + 1):  # the first rep of each warms up
                    order = list(engines.items())
                    for name, engine in order if rep % 2 else order[::-1]:  # each goes first in turn
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        issue(engine).synchronize()
                        if rep:
                            times[name].append((time.perf_counter() - t0) * 1e3)
                for name, each in times.items():
                    ms = statistics.median(each)
                    rows[f"{op} {layout} scattered {name}"] = {"ms": ms, "gbps": nbytes / ms / 1e6, "each": each}
                    print(f"from the call: {op:6s} {layout:11s} scattered, {name:5s} streams: {ms:6.2f} ms "
                          f"= {nbytes / ms / 1e6:5.2f} GB/s (median of {reps})", flush=True)
        finally:
            for engine in engines.values():
                engine.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/benchmarks/stream_alias_probe.json")
    parser.add_argument("--streams", type=int, default=64, help="new streams made per priority (0 and -1)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--ab-reps", type=int, default=12,
                        help="reps of the from-the-call A/B of owned against pool streams (0: none)")
    tg.add_shape_arguments(parser)
    args = parser.parse_args()
    if args.streams < 1 or args.reps < 1 or args.ab_reps < 0:
        parser.error("--streams and --reps must be at least 1, --ab-reps at least 0")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    torch.manual_seed(0)
    spec = tg.Bench(args).spec
    device_pool, hosts = tg.random_pools(spec, args)
    page_sets, slot_sets = tg.id_sets(args, 1)
    pages, slots = page_sets[0], slot_sets["scattered"][0]
    engine = TransferEngine(device_pool, hosts["page_first"], path="auto")
    try:
        engine.backup(pages, slots).synchronize()  # the lazily made streams exist after a backup and a load
        engine.load(slots, pages).synchronize()
        handles = tg.engine_stream_handles(engine)
        # Since 2026-12-03 (twenty-third session) the engine's streams are its own
        # (``kernels.owned_streams``): no new torch stream should be one of them.
        report = {"engine_streams": handles, "owned_streams": engine._streams.owned, "aliases": {}, "timed": {}}
        print(f"engine streams owned by the library: {engine._streams.owned}", flush=True)
        made: dict[int, list[torch.cuda.Stream]] = {}
        for priority in (0, -1):
            made[priority] = [torch.cuda.Stream(priority=priority) for _ in range(args.streams)]
            found = aliases(handles, [s.cuda_stream for s in made[priority]])
            report["aliases"][str(priority)] = {str(i): names for i, names in found.items()}
            print(f"priority {priority:2d}: {len(found)} of {args.streams} new streams are engine streams: "
                  + ", ".join(f"#{i} = {'/'.join(names)}" for i, names in sorted(found.items())), flush=True)
        backup_handle = handles.get("backup_stream")
        sides = {"aliasing backup_stream": next((s for s in made[0] if s.cuda_stream == backup_handle), None),
                 "no engine stream": next((s for s in made[0] if s.cuda_stream not in handles.values()), None)}
        for label, side in sides.items():
            if side is None:
                print(f"{label}: none among the new streams, not timed")
                continue
            landed = []
            for _ in range(args.reps):
                torch.cuda.synchronize()
                with torch.cuda.stream(side):
                    torch.cuda._sleep(tg.SLEEP_CYCLES)
                t0 = time.perf_counter()
                engine.backup(pages, slots).synchronize()
                landed.append((time.perf_counter() - t0) * 1e3)
                torch.cuda.synchronize()
            report["timed"][label] = {"landed_ms": statistics.median(landed), "each": landed}
            print(f"backup from the call, 40 ms sleep on a new stream {label}: landed after "
                  f"{statistics.median(landed):.1f} ms (median of {args.reps})", flush=True)
        if args.ab_reps:
            report["from_call"] = from_call_ab(device_pool, hosts, pages, slot_sets["scattered"][0], args.ab_reps)
    finally:
        engine.close()
        for host in hosts.values():
            host.close()
    report.update({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args)})
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
