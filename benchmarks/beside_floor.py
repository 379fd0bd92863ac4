"""Probe: what any load can hide beside the model's compute (issue 13's beside target, its floor).

The target: a 61-layer load consumed layer by layer by the model's matmuls (about 1.25x the load's
time) hides >= 90% of the load (``hidden_fraction``) while the matmuls run at most 5% slower than
alone (``compute_slowdown``). ``transfer_gpu.beside_compute`` measures our paths. This probe runs
the same measurement (its matmuls, calibration, timeline and ``beside_metrics``) with a loader no
path can beat, beside ``auto``'s loads in the same run:

- ``floor`` (``transfer_gpu.FloorLoader``): the same bytes as one contiguous pinned region per
  layer, one ``copy_`` per layer on a stream of the device's highest priority (the copy engines;
  no SM taken, nothing scattered, no planning: the whole load is issued in well under a
  millisecond). What it adds to the compute is what moving these bytes over PCIe beside these
  matmuls costs, whatever the path.
- ``auto`` and candidate splits (``--set``): the engine's own loads, both host layouts, slots in
  one run and scattered.

Each (loader, factor) is measured two ways, so the order of the measurements shows:
``sequential`` (every compute-alone rep, then every both rep: ``beside_compute``'s order until
2026-12-02) and ``interleaved`` (alone, both, alone, both, ...: the GPU's clocks drift over seconds
of matmuls, and each pair shares the drift; ``beside_compute``'s order since). Rows carry
``transfer_gpu.beside_metrics``'s keys, the loader's idle 61-layer load (``idle_gbps``, device
time after a sleep) and the spread of the reps.

    python3 benchmarks/beside_floor.py [--reps 8] [--rounds 2] [--out docs/benchmarks/beside_floor.json]

Never imported by the library or the tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transfer_gpu as tg  # noqa: E402  (the main benchmark's pools, matmuls and beside metrics)

from tiered_kv import HostPool  # noqa: E402
from tiered_kv.transfers.engine import TransferEngine  # noqa: E402
from tiered_kv.transfers.policy import (HEAD, MIXED_LOADS, PITCHED_RUNS_LOADS, SCATTERED_LOADS, WAVES,  # noqa: E402
                                       LoadSplit, TransferOptions)

FACTORS = (0.5, 1.25)
#: Engine kwarg of this probe (not the engine's): the engine takes torch's pool streams.
POOL_STREAMS = {"streams": "torch pool"}
LOW = {"high_priority_loads": False}
#: ``auto`` told that the model computes beside its loads.
BESIDE_COMPUTE = TransferOptions(beside_compute=True)

#: Loaders beside the floor, by set: (name, layout, slots, path, options, engine kwargs).
SETS = {
    "auto": [(f"auto {layout} {kind}", layout, kind, "auto", None, {})
             for layout in ("page_first", "layer_first") for kind in ("runs", "scattered")],
    # Copy engines only after (or without) the kernel head, staging scatter CTAs, stream priority.
    "first": [
        ("auto page_first runs", "page_first", "runs", "auto", None, {}),
        ("auto low priority page_first runs", "page_first", "runs", "auto", None, LOW),
        ("ce staged + head page_first runs", "page_first", "runs", "mixed",
         TransferOptions(load_split=LoadSplit(1.0, **HEAD, **WAVES)), {}),
        ("ce staged, no head page_first runs", "page_first", "runs", "mixed",
         TransferOptions(load_split=LoadSplit(1.0, **WAVES)), {}),
        ("ce staged, no head, low page_first runs", "page_first", "runs", "mixed",
         TransferOptions(load_split=LoadSplit(1.0, **WAVES)), LOW),
        ("auto page_first scattered", "page_first", "scattered", "auto", None, {}),
        ("ce blocks + head page_first scattered", "page_first", "scattered", "mixed",
         TransferOptions(load_split=LoadSplit(1.0, layers_per_copy=8, ramp=True, ramp_step=4, head_layers=8, **WAVES)), {}),
        ("ce blocks, no head page_first scattered", "page_first", "scattered", "mixed",
         TransferOptions(load_split=LoadSplit(1.0, layers_per_copy=8, ramp=True, ramp_step=4, **WAVES)), {}),
        ("auto layer_first runs", "layer_first", "runs", "auto", None, {}),
        ("auto low priority layer_first runs", "layer_first", "runs", "auto", None, LOW),
        ("ce staged, no head layer_first runs", "layer_first", "runs", "mixed",
         TransferOptions(load_split=LoadSplit(1.0, **WAVES)), {}),
        ("auto layer_first scattered", "layer_first", "scattered", "auto", None, {}),
        ("auto low priority layer_first scattered", "layer_first", "scattered", "auto", None, LOW),
        ("batch 4 threads layer_first scattered", "layer_first", "scattered", "batch",
         TransferOptions(issue_threads=4), {}),
    ],
    # Fewer CTAs for the UVA kernel's share of the body (the head keeps 16), staging scatter CTAs.
    "second": [
        ("auto page_first runs", "page_first", "runs", "auto", None, {}),
        *[(f"body kernel {c} ctas page_first runs", "page_first", "runs", "mixed",
           TransferOptions(load_split=replace(MIXED_LOADS[(False, True)], kernel_ctas=c, head_ctas=16)), {})
          for c in (2, 4, 8)],
        ("auto page_first scattered", "page_first", "scattered", "auto", None, {}),
        *[(f"body kernel {c} ctas page_first scattered", "page_first", "scattered", "mixed",
           TransferOptions(load_split=replace(SCATTERED_LOADS[False], kernel_ctas=c, head_ctas=16)), {})
          for c in (2, 4)],
        ("auto layer_first runs", "layer_first", "runs", "auto", None, {}),
        *[(f"staging {c} ctas layer_first runs", "layer_first", "runs", "mixed",
           TransferOptions(load_split=replace(MIXED_LOADS[(True, True)], staging_ctas=c)), {}) for c in (1, 16)],
        ("staged blocks 4 layer_first runs", "layer_first", "runs", "mixed",
         TransferOptions(load_split=replace(MIXED_LOADS[(True, True)], layers_per_copy=4, ramp_step=4)), {}),
        ("auto layer_first scattered", "layer_first", "scattered", "auto", None, {}),
        *[(f"body kernel {c} ctas tile {t} layer_first scattered", "layer_first", "scattered", "mixed",
           TransferOptions(load_split=replace(SCATTERED_LOADS[True], kernel_ctas=c, kernel_tile=t, head_ctas=16)), {})
          for c, t in ((8, 8192), (8, 16384), (4, 16384))],
    ],
    # The staging scatter's CTAs (16 beat 4 and 1 for layer_first runs in the second set) with the
    # kernel share's CTAs; a larger batch share for scattered layer_first.
    "third": [
        ("auto page_first runs", "page_first", "runs", "auto", None, {}),
        *[(f"staging 16, body kernel {c} ctas page_first runs", "page_first", "runs", "mixed",
           TransferOptions(load_split=replace(MIXED_LOADS[(False, True)], staging_ctas=16, kernel_ctas=c, head_ctas=16)), {})
          for c in (16, 6, 4)],
        ("auto page_first scattered", "page_first", "scattered", "auto", None, {}),
        *[(f"staging 16, body kernel {c} ctas page_first scattered", "page_first", "scattered", "mixed",
           TransferOptions(load_split=replace(SCATTERED_LOADS[False], staging_ctas=16, kernel_ctas=c, head_ctas=16)), {})
          for c in (16, 4)],
        ("auto layer_first runs", "layer_first", "runs", "auto", None, {}),
        *[(f"staging {c} ctas layer_first runs", "layer_first", "runs", "mixed",
           TransferOptions(load_split=replace(MIXED_LOADS[(True, True)], staging_ctas=c)), {}) for c in (16, 32)],
        ("auto layer_first scattered", "layer_first", "scattered", "auto", None, {}),
        ("batch 0.5 on 2 threads + kernel 8 ctas layer_first scattered", "layer_first", "scattered", "mixed",
         TransferOptions(load_split=replace(SCATTERED_LOADS[True], ce_fraction=0.5, kernel_ctas=8, head_ctas=16),
                         issue_threads=2), {}),
    ],
    # page_first runs through the copy engines only after the head, the indexer rows per layer (8 KB
    # pitched rows: 92% idle in the first set) or in blocks of layers (``minor_layers_per_copy``).
    "fourth": [
        ("auto page_first runs", "page_first", "runs", "auto", None, {}),
        ("ce + head, indexer per layer page_first runs", "page_first", "runs", "mixed",
         TransferOptions(load_split=LoadSplit(1.0, **HEAD, **WAVES)), {}),
        *[(f"ce + head, indexer blocks of {k} page_first runs", "page_first", "runs", "mixed",
           TransferOptions(load_split=LoadSplit(1.0, **HEAD, **WAVES, minor_layers_per_copy=k)), {}) for k in (4, 8, 16)],
        ("ce + head, indexer blocks of 8, scatter 16 page_first runs", "page_first", "runs", "mixed",
         TransferOptions(load_split=LoadSplit(1.0, **HEAD, **WAVES, minor_layers_per_copy=8, staging_ctas=16)), {}),
    ],
    # The fourth set's best (indexer blocks of 8, scatter 16) with more copy streams, units that
    # pipeline a group's scatter behind its copy, and more scatter CTAs: its idle load was 94.5% of
    # the ceiling against auto's 96.0%.
    "fifth": [
        ("auto page_first runs", "page_first", "runs", "auto", None, {}),
        *[(f"ce + head, indexer blocks of 8{label} page_first runs", "page_first", "runs", "mixed",
           TransferOptions(load_split=LoadSplit(1.0, **HEAD, **WAVES, minor_layers_per_copy=8, **knobs)), {})
          for label, knobs in ((", scatter 16", {"staging_ctas": 16}),
                               (", scatter 16, 2 copy streams", {"staging_ctas": 16, "copy_streams": 2}),
                               (", scatter 16, units of 128 rows", {"staging_ctas": 16, "unit_rows": 128}),
                               (", scatter 32", {"staging_ctas": 32}),
                               (", scatter 32, 2 copy streams", {"staging_ctas": 32, "copy_streams": 2}))],
    ],
    # Scatter 32 (the fifth set's best) with the indexer blocks a group or two ahead of their first
    # layer's, 64 scatter CTAs, the body beside the head.
    "sixth": [
        ("auto page_first runs", "page_first", "runs", "auto", None, {}),
        *[(f"ce + head, indexer blocks of 8{label} page_first runs", "page_first", "runs", "mixed",
           TransferOptions(load_split=LoadSplit(1.0, **HEAD, **WAVES, minor_layers_per_copy=8, **knobs)), {})
          for label, knobs in ((", scatter 32", {"staging_ctas": 32}),
                               (", scatter 32, 1 group ahead", {"staging_ctas": 32, "minor_lead_groups": 1}),
                               (", scatter 32, 2 groups ahead", {"staging_ctas": 32, "minor_lead_groups": 2}),
                               (", scatter 64", {"staging_ctas": 64}),
                               (", scatter 32, body beside the head", {"staging_ctas": 32, "body_after_head": False}),
                               (", scatter 32, 1 ahead, 2 copy streams",
                                {"staging_ctas": 32, "minor_lead_groups": 1, "copy_streams": 2}))],
    ],
    # (Run while ``auto`` took ``PITCHED_RUNS_LOADS`` for page_first runs; it is now the split of
    # ``TransferOptions.beside_compute``.) That split lost idle rate (93.7% of the ceiling in
    # the run of record against 95.3%): a small kernel share beside the copy engines, a ring of three
    # or four buffers, wider minor blocks; the split of before as control.
    "seventh": [
        ("auto page_first runs", "page_first", "runs", "auto", BESIDE_COMPUTE, {}),
        ("split of before page_first runs", "page_first", "runs", "mixed",
         TransferOptions(load_split=LoadSplit(0.6, by="components", **HEAD, **WAVES)), {}),
        ("auto, ring of 3 page_first runs", "page_first", "runs", "auto", BESIDE_COMPUTE,
         {"staging_buffers": 3}),
        ("auto, ring of 4 page_first runs", "page_first", "runs", "auto", BESIDE_COMPUTE,
         {"staging_buffers": 4}),
        ("auto + kernel 0.1 at 8 ctas page_first runs", "page_first", "runs", "mixed",
         TransferOptions(load_split=replace(PITCHED_RUNS_LOADS, ce_fraction=0.9, kernel_ctas=8, head_ctas=16)), {}),
        ("auto, indexer blocks of 16 page_first runs", "page_first", "runs", "mixed",
         TransferOptions(load_split=replace(PITCHED_RUNS_LOADS, minor_layers_per_copy=16)), {}),
    ],
    # The beside-compute split for page_first runs confirmed, and the same idea for scattered slots:
    # ``SCATTERED_LOADS``' blocks with every page on the copy engines (no kernel share holding SMs)
    # and the wider staging scatter, its blocks growing slower (less stall at a block's first
    # layer) or planned ahead; scattered layer_first with half its rows as memcpy batches.
    "eighth": [
        ("auto beside compute page_first runs", "page_first", "runs", "auto", BESIDE_COMPUTE, {}),
        ("auto page_first scattered", "page_first", "scattered", "auto", None, {}),
        *[(f"ce blocks + head{label} page_first scattered", "page_first", "scattered", "mixed",
           TransferOptions(load_split=replace(SCATTERED_LOADS[False], ce_fraction=1.0, **knobs)), {})
          for label, knobs in ((", scatter 32", {"staging_ctas": 32}),
                               (", scatter 32, ramp step 6", {"staging_ctas": 32, "ramp_step": 6}),
                               (", scatter 32, 3 lead blocks", {"staging_ctas": 32, "lead_blocks": 3}),
                               (", scatter 32, blocks of 4", {"staging_ctas": 32, "layers_per_copy": 4,
                                                              "kernel_blocks": 4}))],
        ("auto layer_first scattered", "layer_first", "scattered", "auto", None, {}),
        *[(f"batch 0.5 on {t} threads + kernel 8 ctas layer_first scattered", "layer_first", "scattered", "mixed",
           TransferOptions(load_split=replace(SCATTERED_LOADS[True], ce_fraction=0.5, kernel_ctas=8, head_ctas=16),
                           issue_threads=t), {}) for t in (2, 4)],
    ],
    # Scattered page_first's split since the eighth set (copy engines alone, scatter 32, three lead
    # blocks): the model still stalls about 2 ms at block starts and the head's kernel holds SMs
    # for its 8 layers; blocks that grow slower, a shorter head, a wider scatter, two copy streams.
    "ninth": [
        ("auto page_first scattered", "page_first", "scattered", "auto", None, {}),
        *[(f"auto{label} page_first scattered", "page_first", "scattered", "mixed",
           TransferOptions(load_split=replace(SCATTERED_LOADS[False], **knobs)), {})
          for label, knobs in ((", ramp step 6", {"ramp_step": 6}),
                               (", ramp step 6, scatter 64", {"ramp_step": 6, "staging_ctas": 64}),
                               (", head 4", {"head_layers": 4}),
                               (", 2 copy streams", {"copy_streams": 2}))],
    ],
    # The engine's own streams (``kernels.owned_streams``, since the twenty-third session) against
    # torch's pool streams as before, each row's cells in the same round: the first run of record
    # with owned streams had several beside rows lower than the one before it.
    "streams": [
        (f"{label} {streams} {layout} {kind}", layout, kind, "auto", options,
         {} if streams == "owned" else POOL_STREAMS)
        for label, layout, kind, options in (("auto beside compute", "page_first", "runs", BESIDE_COMPUTE),
                                             ("auto beside compute", "page_first", "scattered", BESIDE_COMPUTE),
                                             ("auto", "layer_first", "runs", None),
                                             ("auto", "layer_first", "scattered", None))
        for streams in ("owned", "pool")
    ],
}
Model = tg.BesideModel
ROWS_MAX = tg.BesideModel.ROWS_MAX


def idle_load(load, nbytes: int, reps: int) -> dict:
    """The loader's 61-layer load alone, device time after a sleep (``transfer_gpu.measure``)."""
    timing = tg.measure(lambda i: [load()], reps)
    return {"idle_ms": timing["ms"], "idle_gbps": nbytes / timing["ms"] / 1e6, "idle_issue_ms": timing["issue_ms"]}


def measure_loader(model: Model, name: str, load, reps: int, fields: dict, factors=FACTORS) -> list[dict]:
    """Rows for one loader: its load alone, then per factor the compute calibrated to it and both
    at once, measured sequentially and interleaved."""
    alone = tg.median_rows([model.rep(load, 0) for _ in range(reps + 1)][1:])
    load_ms = alone["load_ms"]
    rows = []
    for factor in factors:
        target = factor * load_ms
        m, _ = tg.calibrated_rows(model.rows_for(target / model.num_layers), target,
                                  lambda m: tg.median_rows([model.rep(None, m) for _ in range(reps + 1)][1:]), ROWS_MAX)
        model.rep(load, m)  # warm-up of the pair
        sequential_alone = [model.rep(None, m) for _ in range(reps)]
        sequential_both = [model.rep(load, m) for _ in range(reps)]
        pairs = [(model.rep(None, m), model.rep(load, m)) for _ in range(reps)]
        for order, computes, boths in (("sequential", sequential_alone, sequential_both),
                                       ("interleaved", [a for a, _ in pairs], [b for _, b in pairs])):
            compute, both = tg.median_rows(computes), tg.median_rows(boths)
            row = {"group": "beside_floor", "loader": name, "factor": factor, "order": order, "rows": m, **fields,
                   **tg.beside_metrics(load_ms, compute, both),
                   "first_layer_ms": both["first_layer_ms"], "first_layer_alone_ms": alone["first_layer_ms"],
                   "issue_ms": both["issue_ms"], "late_at": tg.late_layers_at(both["gaps"]),
                   # Per pair (interleaved) or per rep index (sequential): the spread behind the medians.
                   "slowdown_each": [b["busy"] / a["busy"] for a, b in zip(computes, boths)],
                   "hidden_each": [(load_ms + a["compute_end"] - max(b["load_ms"], b["compute_end"])) / load_ms
                                   for a, b in zip(computes, boths)]}
            row["met"] = row["hidden_fraction"] >= 0.9 and row["compute_slowdown"] <= 1.05
            rows.append(row)
            print(f"{name:42s} {factor:4.2f}x {order:11s} load {load_ms:6.2f} compute {row['compute_ms']:6.2f} "
                  f"both {row['both_ms']:6.2f} hidden {row['hidden_fraction']:5.3f} slowdown {row['compute_slowdown']:5.3f}"
                  f" | start {row['start_delay_ms']:5.2f} stall {row['stall_ms']:5.2f} busy+ {row['busy_extra_ms']:5.2f}"
                  f" layer0 {row['first_layer_ms']:5.2f} | hidden each {min(row['hidden_each']):.3f}-"
                  f"{max(row['hidden_each']):.3f} slowdown each {min(row['slowdown_each']):.3f}-"
                  f"{max(row['slowdown_each']):.3f}", flush=True)
    return rows


def make_engine(device_pool, host, path: str, kwargs: dict) -> TransferEngine:
    """A timing engine; with ``POOL_STREAMS`` its streams are torch's pool streams
    (``transfer_gpu.pool_stream_engine``)."""
    kwargs = dict(kwargs)
    make = TransferEngine if kwargs.pop("streams", None) is None else tg.pool_stream_engine
    return make(device_pool, host, path=path, timing=True, **kwargs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/benchmarks/beside_floor.json")
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="times the whole set of loaders is measured")
    parser.add_argument("--set", default="auto", choices=sorted(SETS), help="the loaders beside the floor")
    parser.add_argument("--factors", default="0.5,1.25", help="compute per load, comma-separated")
    tg.add_shape_arguments(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    b = tg.Bench(argparse.Namespace(reps=args.reps))
    spec, n = b.spec, args.pages
    layer_bytes = n * sum(c.bytes_per_layer for c in spec.components)
    h2d, d2h, both, _, _ = tg.measure_ceilings(b, layer_bytes)
    torch.cuda.empty_cache()
    factors = tuple(float(x) for x in args.factors.split(","))
    loaders = SETS[args.set]
    device_pool = tg.allocate_engine_like(spec, args.device_pages, "cuda")
    hosts = {layout: HostPool(spec, args.host_slots, layout) for layout in sorted({entry[1] for entry in loaders})}
    for host in hosts.values():
        tg.fill_random(host.buffer)
    engines = {}
    for _, layout, _, path, _, kwargs in loaders:
        key = (layout, path, tuple(sorted(kwargs.items())))
        if key not in engines:
            engines[key] = make_engine(device_pool, hosts[layout], path, kwargs)
    sets = 4
    page_sets, slot_sets = tg.id_sets(args, sets)
    floor = tg.FloorLoader(spec.num_layers, layer_bytes)
    checks = {"floor": floor.copied_every_byte()}

    def engine_of(entry):
        _, layout, _, path, _, kwargs = entry
        return engines[(layout, path, tuple(sorted(kwargs.items())))]

    for entry in loaders:
        name, layout, kind, _, options, _ = entry
        checks[name] = tg.load_copies_every_byte(engine_of(entry), device_pool, hosts[layout], slot_sets[kind][0],
                                                 page_sets[0], options)
    print(f"bytes checked: {checks}", flush=True)
    if not all(checks.values()):
        print("a loader lost bytes: not timed", file=sys.stderr)
        return 1

    model = Model(spec.num_layers)
    results = []

    def cycling(engine, kind, options):
        state = {"i": 0}

        def load():
            i = state["i"] = state["i"] + 1
            return engine.load(slot_sets[kind][i % sets], page_sets[i % sets], options=options)
        return load

    nbytes = n * spec.page_bytes
    for round_ in range(args.rounds):
        floor_fields = {"round": round_, "layout": None, "slots": None, **idle_load(floor.load, nbytes, args.reps)}
        results += measure_loader(model, "floor (contiguous per layer)", floor.load, args.reps, floor_fields, factors)
        for entry in loaders:
            name, layout, kind, path, options, kwargs = entry
            load = cycling(engine_of(entry), kind, options)
            fields = {"round": round_, "layout": layout, "slots": kind, "path": path,
                      "options": repr(options), "engine": kwargs, **idle_load(load, nbytes, args.reps)}
            results += measure_loader(model, name, load, args.reps, fields, factors)
        out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "python": platform.python_version(), "spec": spec.describe(),
               "pages_per_transfer": n, "reps": args.reps, "set": args.set, "rounds_done": round_ + 1, "bytes_checked": checks,
               "ceiling_gbps": {"h2d": h2d["gbps"], "d2h": d2h["gbps"], "both": both["gbps"]}, "results": results}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    for row in results:
        if row["factor"] == max(factors):
            print(f"{row['round']} {row['loader']:42s} {row['order']:11s} idle {row['idle_gbps']:5.2f} hidden {row['hidden_fraction']:5.3f} "
                  f"slowdown {row['compute_slowdown']:5.3f} {'met' if row['met'] else 'not met'}")
    print(f"wrote {args.out}")
    for host in hosts.values():
        host.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
