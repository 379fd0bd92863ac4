"""Probe: where the caller's own ``TransferEngine.load`` call spends its time, function by function.

Beside the model's compute the caller's call delays the first matmul: on the H200's host a
61-layer load of 512 pages returns after 1.3-1.7 ms and issues layer 0 at about 1.55 ms
(``issue_timeline.py --beside``, 2026-12-02), though its steps take 9-25 us each on a desktop
CPU. ``issue_timeline.py`` times the named steps; this script runs the caller's thread under
``cProfile`` (which profiles only the thread that enables it: the library threads are not in
it) for ``--reps`` loads per (layout, slots) and records the functions with the most own and
cumulative time, plus the call's wall time and layer 0's issue time without the profiler.

    python3 benchmarks/caller_profile.py [--reps 30] [--top 40] [--timing] [--beside-compute] [--out docs/benchmarks/caller_profile.json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transfer_gpu as tg  # noqa: E402

from tiered_kv.transfers import engine as te  # noqa: E402
from tiered_kv.transfers.engine import TransferEngine  # noqa: E402


def top_functions(profile: cProfile.Profile, reps: int, key: str, top: int) -> list[dict]:
    """The ``top`` functions by ``key`` ('tottime' or 'cumtime'), microseconds per load."""
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = []
    for (filename, line, func), (cc, nc, tt, ct, _callers) in stats.stats.items():
        rows.append({"function": f"{Path(filename).name}:{line}({func})", "calls_per_load": nc / reps,
                     "own_us_per_load": tt * 1e6 / reps, "cum_us_per_load": ct * 1e6 / reps})
    field = "own_us_per_load" if key == "tottime" else "cum_us_per_load"
    return sorted(rows, key=lambda r: -r[field])[:top]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/benchmarks/caller_profile.json")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--timing", action="store_true",
                        help="engines with timing events, as benchmarks/transfer_gpu.py makes them")
    parser.add_argument("--beside-compute", action="store_true",
                        help="loads with TransferOptions(beside_compute=True), as transfer_gpu.py's "
                             "'auto beside compute' rows issue them")
    tg.add_shape_arguments(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    spec = tg.Bench(args).spec
    device_pool, hosts = tg.random_pools(spec, args)
    page_sets, slot_sets = tg.id_sets(args, 4)
    issued_at: dict[int, float] = {}
    original_layer = te._Issued.layer

    def layer(self, index):
        issued_at.setdefault(index, time.perf_counter())
        return original_layer(self, index)

    te._Issued.layer = layer
    options = te.TransferOptions(beside_compute=True) if args.beside_compute else None
    results = []
    try:
        for layout, host in hosts.items():
            engine = TransferEngine(device_pool, host, path="auto", timing=args.timing)
            for kind in ("runs", "scattered"):
                walls, firsts = [], []
                profile = cProfile.Profile()
                for i in range(2 * args.reps + 2):
                    profiled = i >= args.reps + 2  # warm-up, then timed plain, then profiled
                    torch.cuda.synchronize()
                    issued_at.clear()
                    if profiled:
                        profile.enable()
                    t0 = time.perf_counter()
                    handle = engine.load(slot_sets[kind][i % 4], page_sets[i % 4], options=options)
                    wall = time.perf_counter() - t0
                    if profiled:
                        profile.disable()
                    handle.synchronize()
                    if 2 <= i < args.reps + 2:
                        walls.append(wall * 1e3)
                        if 0 in issued_at:
                            firsts.append((issued_at[0] - t0) * 1e3)
                row = {"layout": layout, "slots": kind, "path": handle.path,
                       "call_ms_median": statistics.median(walls),
                       "layer0_issued_ms_median": statistics.median(firsts) if firsts else None,
                       "by_own_time": top_functions(profile, args.reps, "tottime", args.top),
                       "by_cumulative_time": top_functions(profile, args.reps, "cumtime", args.top)}
                results.append(row)
                print(f"== {layout} {kind} ({handle.path}): call {row['call_ms_median']:.3f} ms, "
                      f"layer 0 issued at {row['layer0_issued_ms_median']} ms", flush=True)
                for r in row["by_cumulative_time"][:args.top]:
                    print(f"  cum {r['cum_us_per_load']:8.1f} us own {r['own_us_per_load']:7.1f} us "
                          f"x{r['calls_per_load']:6.1f}  {r['function']}", flush=True)
                print("  -- by own time", flush=True)
                for r in row["by_own_time"][:25]:
                    print(f"  own {r['own_us_per_load']:7.1f} us x{r['calls_per_load']:6.1f}  {r['function']}", flush=True)
            engine.close()
    finally:
        te._Issued.layer = original_layer
        for host in hosts.values():
            host.close()
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "python": sys.version.split()[0], "args": vars(args), "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
