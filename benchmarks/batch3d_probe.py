"""Probe: pitched copies in one ``cudaMemcpy3DBatchAsync`` for scattered ``layer_first`` slots.

A ``layer_first`` host pool keeps each component as ``[layers, slots, bytes]``, so one slot's rows
of a block of B layers are B rows one layer stride apart: one pitched copy. Today the copy engines
get one 1-D copy per (slot, component, layer) in ``cudaMemcpyBatchAsync`` (62k copies for a
61-layer load of 512 scattered DeepSeek-V3.2 slots, about 1 us of CPU each). This probe measures,
in one run with contiguous ceilings of the same bytes:

- ``load``: host slots -> a dense device staging buffer, per block of B layers one batch call:
  1-D rows (``cudaMemcpyBatchAsync``) against 2-D ops of height B (``cudaMemcpy3DBatchAsync``),
  B = 1, 2, 4, 8, 61;
- ``backup``: the staging buffer -> host slots, the same variants;
- ``both``: a load and a backup of other slots at once, each on its own stream.

Every variant's bytes are checked against the source once before it is timed. Issue times are the
caller's thread (one thread issues everything).

    python3 benchmarks/batch3d_probe.py [--reps 6] [--out docs/benchmarks/batch3d_probe.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transfer_gpu as tg  # noqa: E402  (measure, fill_random)

from tiered_kv.model.host_pool import HostPool  # noqa: E402
from tiered_kv.kernels import cudart  # noqa: E402
from tiered_kv.model.spec import nsa_spec  # noqa: E402

SLOTS, PAGES = 2048, 512
BLOCKS = (1, 2, 4, 8, 61)


class Side:
    """One component's host rows ``[layers, slots, width]`` and a dense staging buffer
    ``[layers, pages, width]`` on the device."""

    def __init__(self, pool: HostPool, component: int, layers: int) -> None:
        first = pool.chunk_view(component, 0)
        self.width = first.shape[1]
        self.host_addr = first.data_ptr()
        self.host_layer = pool.chunk_view(component, 1).data_ptr() - self.host_addr
        self.host = torch.as_strided(first, (layers, SLOTS, self.width), (self.host_layer, self.width, 1))
        self.stage = torch.empty(layers, PAGES, self.width, dtype=torch.uint8, device="cuda")
        self.layers = layers


def plan(sides, slots: np.ndarray, block: int, to_device: bool, two_d: bool):
    """Per block of layers: the copies of every (side, slot) as one op list (2-D: one op of the
    block's height; 1-D: one row copy per layer)."""
    calls = []
    layers = sides[0].layers
    for l0 in range(0, layers, block):
        height = min(block, layers - l0)
        dsts, srcs, sizes, dps, sps, hs = [], [], [], [], [], []
        for side in sides:
            host = np.uint64(side.host_addr) + np.uint64(l0 * side.host_layer) + slots.astype(np.uint64) * np.uint64(side.width)
            stage = (np.uint64(side.stage.data_ptr()) + np.uint64(l0 * PAGES * side.width)
                     + np.arange(slots.size, dtype=np.uint64) * np.uint64(side.width))
            if two_d:
                src, dst = (host, stage) if to_device else (stage, host)
                sp, dp = (side.host_layer, PAGES * side.width) if to_device else (PAGES * side.width, side.host_layer)
                dsts.append(dst), srcs.append(src), sizes.append(np.full(slots.size, side.width, np.uint64))
                dps.append(np.full(slots.size, dp, np.uint64)), sps.append(np.full(slots.size, sp, np.uint64))
                hs.append(np.full(slots.size, height, np.uint64))
            else:
                for j in range(height):
                    h = host + np.uint64(j * side.host_layer)
                    s = stage + np.uint64(j * PAGES * side.width)
                    src, dst = (h, s) if to_device else (s, h)
                    dsts.append(dst), srcs.append(src), sizes.append(np.full(slots.size, side.width, np.uint64))
        if two_d:
            calls.append(("3d", cudart.pack_2d_ops(np.concatenate(dsts), np.concatenate(dps), np.concatenate(srcs),
                                                   np.concatenate(sps), np.concatenate(sizes), np.concatenate(hs))))
        else:
            calls.append(("1d", (np.ascontiguousarray(np.concatenate(dsts)), np.ascontiguousarray(np.concatenate(srcs)),
                                 np.ascontiguousarray(np.concatenate(sizes)))))
    return calls


def issue_calls(calls, stream: torch.cuda.Stream) -> None:
    for kind, work in calls:
        if kind == "3d":
            cudart.memcpy_3d_batch_async(work, stream.cuda_stream)
        else:
            cudart.memcpy_batch_async(*work, stream.cuda_stream)


def run_on(calls_by_stream):
    """Issue each stream's calls after the current stream, return each stream's end event."""
    ends = []
    for stream, calls in calls_by_stream:
        stream.wait_stream(torch.cuda.current_stream())
        issue_calls(calls, stream)
        end = torch.cuda.Event(enable_timing=True)
        end.record(stream)
        ends.append(end)
    return ends


def check(sides, slots: np.ndarray, to_device: bool, calls, stream) -> bool:
    index = torch.from_numpy(slots.astype(np.int64)).cuda()
    for side in sides:
        side.stage.zero_() if to_device else tg.fill_random(side.stage)
    if not to_device:  # poison the target rows first, so a copy that did not land shows
        for side in sides:
            side.host[:, torch.from_numpy(slots.astype(np.int64))] = 0
    torch.cuda.synchronize()
    run_on([(stream, calls)])
    torch.cuda.synchronize()
    ok = True
    for side in sides:
        host_rows = side.host.to("cuda", non_blocking=False)[:, index]
        ok &= bool(torch.equal(host_rows, side.stage))
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--out", default="docs/benchmarks/batch3d_probe.json")
    args = parser.parse_args()
    if not cudart.has_memcpy_3d_batch():
        print("cudaMemcpy3DBatchAsync not available here")
        return 1
    spec = nsa_spec(61, 64)
    torch.manual_seed(0)
    pool = HostPool(spec, SLOTS, "layer_first")
    tg.fill_random(pool.buffer)
    perm = torch.randperm(SLOTS).numpy()
    load_slots, backup_slots = np.sort(perm[:PAGES]), np.sort(perm[PAGES:2 * PAGES])
    load_sides = [Side(pool, c, spec.num_layers) for c in range(len(spec.components))]
    backup_sides = [Side(pool, c, spec.num_layers) for c in range(len(spec.components))]
    nbytes = sum(s.stage.numel() for s in load_sides)
    results = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "cuda_runtime": cudart.runtime_version(), "bytes": nbytes, "rows": []}
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    big_h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    big_d = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    big_h2 = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    big_d2 = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    ceilings = {
        "h2d": tg.measure(lambda i: [tg.side_copy(big_d, big_h, s1)], args.reps),
        "d2h": tg.measure(lambda i: [tg.side_copy(big_h, big_d, s1)], args.reps),
        "both": tg.measure(lambda i: [tg.side_copy(big_d, big_h, s1), tg.side_copy(big_h2, big_d2, s2)], args.reps),
    }
    results["ceilings_gbps"] = {k: nbytes * (2 if k == "both" else 1) / v["ms"] / 1e6 for k, v in ceilings.items()}
    print("ceilings", results["ceilings_gbps"], flush=True)
    del big_h, big_d, big_h2, big_d2

    def add(group, name, timing, moved, ok, ops):
        row = {"group": group, "name": name, "ok": ok, "ops": ops, **timing, "gbps": moved / timing["ms"] / 1e6}
        results["rows"].append(row)
        print(f"{group:7s} {name:34s} ok={ok} ops={ops:6d} {row['gbps']:7.2f} GB/s {timing['ms']:7.2f} ms "
              f"issue {timing['issue_ms']:7.2f} ms cpu {timing['caller_cpu_ms']:7.2f}", flush=True)

    plans = {}
    for to_device, group, sides, slots in ((True, "load", load_sides, load_slots), (False, "backup", backup_sides, backup_slots)):
        for two_d in (False, True):
            for block in BLOCKS:
                if not two_d and block not in (1, 61):
                    continue  # 1-D rows are the same copies whatever the block; two call sizes
                name = f"{'3d' if two_d else '1d'} block {block}"
                t0 = time.perf_counter()
                calls = plan(sides, slots, block, to_device, two_d)
                plan_ms = (time.perf_counter() - t0) * 1e3
                ok = check(sides, slots, to_device, calls, s1)
                ops = sum(len(w) if k == "3d" else len(w[2]) for k, w in calls)
                timing = tg.measure(lambda i, c=calls: run_on([(s1, c)]), args.reps)
                timing["plan_ms"] = plan_ms
                add(group, name, timing, nbytes, ok, ops)
                plans[(group, name)] = calls

    for load_name, backup_name in (("3d block 8", "3d block 61"), ("3d block 4", "3d block 61"), ("3d block 8", "3d block 8"),
                                   ("1d block 1", "1d block 61"), ("3d block 8", "1d block 61")):
        lc, bc = plans[("load", load_name)], plans[("backup", backup_name)]
        timing = tg.measure(lambda i, lc=lc, bc=bc: run_on([(s1, lc), (s2, bc)]), args.reps)
        add("both", f"{load_name} + {backup_name}", timing, 2 * nbytes, True, 0)

    # Does the call take a pitch above 2^31 - 1 (a layer stride of a layer_first pool of more than
    # about 51k DeepSeek-V3.2 slots)? kernels.staged_copy.MAX_PITCH keeps folds under it until this says.
    wide = torch.empty((1 << 31) + (1 << 25), dtype=torch.uint8, pin_memory=True)
    wide[:4096].fill_(7)
    wide[(1 << 31) + 4096:(1 << 31) + 8192].fill_(9)
    target = torch.zeros(2, 4096, dtype=torch.uint8, device="cuda")
    op = cudart.pack_2d_ops(target.data_ptr(), 4096, wide.data_ptr(), (1 << 31) + 4096, 4096, 2)
    try:
        cudart.memcpy_3d_batch_async(op, s1.cuda_stream)
        s1.synchronize()
        results["pitch_above_2gib"] = {"ok": bool((target[0] == 7).all() and (target[1] == 9).all()), "error": None}
    except cudart.CudaRuntimeError as exc:
        results["pitch_above_2gib"] = {"ok": False, "error": str(exc)}
    print("pitch above 2 GiB:", results["pitch_above_2gib"], flush=True)
    del wide

    for row in results["rows"]:
        direction = {"load": "h2d", "backup": "d2h", "both": "both"}[row["group"]]
        row["of_ceiling"] = row["gbps"] / results["ceilings_gbps"][direction]
    both = {r["name"]: r for r in results["rows"] if r["group"] == "both"}
    results["both_x_one_direction"] = {k: r["gbps"] / results["ceilings_gbps"]["h2d"] for k, r in both.items()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps(results["both_x_one_direction"], indent=1))
    return 0 if all(r["ok"] for r in results["rows"]) else 2


if __name__ == "__main__":
    sys.exit(main())
