"""Probe: candidate paths for issue 13's unmet serving targets, one H200 run, one JSON.

Measures, in the same run as the ceilings (2 GiB contiguous pinned copies), with DeepSeek-V3.2 NSA
fp8, 512 random device pages of 2048 and host slots scattered (a random subset of 2048) or in one
run:
- ``load61``: 61-layer loads of scattered ``page_first`` slots: copy-engine layer blocks (8, 16,
  ramped 1, 2, 4, 8), with 2 copy streams, with a larger staging ring, and with a share of the
  pages through the UVA kernel at the same time;
- ``backup``: backups of scattered slots, both layouts: UVA kernel (CTA budgets), ``mixed`` with
  a copy-engine share (one memcpy batch from the device pages beside the kernel), batch, staged;
- ``both``: load + backup of scattered slots at once with those backups beside the chosen load;
- ``beside_compute``: the main benchmark's ``beside_compute`` (bf16 matmuls per layer at 0.5x and
  1.25x the load's per-layer time) for the candidates, with the load streams at the device's
  highest priority (the engine's default now) and at the default priority.
Every candidate's bytes are checked against the source once before it is timed.

    python3 benchmarks/serving_probe.py [--set first|second|...|twelfth|thirteenth] [--reps 6]
        [--beside-reps 6] [--skip load61,backup,both,beside] [--out docs/benchmarks/serving_probe.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transfer_gpu as tg  # noqa: E402  (the main benchmark's measuring helpers)

from tiered_kv.transfers.engine import LoadSplit, TransferEngine, TransferOptions  # noqa: E402
from tiered_kv.transfers.policy import HEAD as tp_HEAD  # noqa: E402
from tiered_kv.transfers.policy import SCATTERED_LOADS_WITHOUT_BATCH  # noqa: E402

B8 = LoadSplit(1.0, layers_per_copy=8)
B8R = LoadSplit(1.0, layers_per_copy=8, ramp=True)

#: 61-layer loads of scattered page_first slots: (name, path, options, engine kwargs).
FIRST_LOADS = [
    ("auto", "auto", None, {}),
    ("ce blocks 8", "mixed", TransferOptions(load_split=B8, issue_threads=1), {}),
    ("ce blocks 8 ramp", "mixed", TransferOptions(load_split=B8R, issue_threads=1), {}),
    ("ce blocks 16 ramp", "mixed", TransferOptions(load_split=LoadSplit(1.0, layers_per_copy=16, ramp=True),
                                                   issue_threads=1), {}),
    ("ce blocks 8 ramp 2 streams", "mixed",
     TransferOptions(load_split=LoadSplit(1.0, layers_per_copy=8, ramp=True, copy_streams=2), issue_threads=1), {}),
    ("ce blocks 8 ramp, ring 2 x 64 MiB", "mixed", TransferOptions(load_split=B8R, issue_threads=1),
     {"staging_bytes": 64 << 20}),
    ("ce blocks 8 ramp, ring 3 x 32 MiB", "mixed", TransferOptions(load_split=B8R, issue_threads=1),
     {"staging_buffers": 3}),
    ("ce 0.8 blocks 8 ramp + kernel 0.2", "mixed",
     TransferOptions(load_split=LoadSplit(0.8, layers_per_copy=8, ramp=True), issue_threads=1), {}),
    ("ce 0.65 blocks 8 ramp + kernel 0.35", "mixed",
     TransferOptions(load_split=LoadSplit(0.65, layers_per_copy=8, ramp=True), issue_threads=1), {}),
    ("kernel", "kernel", None, {}),
    ("batch 4 issue threads", "batch", TransferOptions(issue_threads=4), {}),
]

#: Backups of scattered slots (both layouts): (name, path, options).
FIRST_BACKUPS = [("auto", "auto", None), ("kernel", "kernel", None), ("kernel 32 ctas", "kernel", TransferOptions(num_ctas=32)),
           ("kernel 8 ctas", "kernel", TransferOptions(num_ctas=8)), ("staged", "staged", None),
           ("batch", "batch", None)] + [
    (f"mixed ce {f}", "mixed", TransferOptions(backup_ce_fraction=f)) for f in (0.15, 0.3, 0.45)]

#: Load + backup at once, scattered slots: (name, load path, load options, backup path, backup options).
FIRST_BOTH = [("auto + auto", "auto", None, "auto", None),
        ("auto + batch", "auto", None, "batch", None),
        ("auto + staged", "auto", None, "staged", None),
        ("auto + mixed ce 0.3", "auto", None, "mixed", TransferOptions(backup_ce_fraction=0.3)),
        ("auto + mixed ce 0.6", "auto", None, "mixed", TransferOptions(backup_ce_fraction=0.6)),
        ("batch 4 thr + batch", "batch", TransferOptions(issue_threads=4), "batch", None),
        ("ce blocks 8 ramp + staged", "mixed", TransferOptions(load_split=B8R, issue_threads=1), "staged", None)]

#: Beside compute: (name, path, options, engine kwargs), keyed into the engines below.
FIRST_BESIDE = [
    ("auto", "auto", None, {}),
    ("auto normal priority", "auto", None, {"high_priority_loads": False}),
    ("kernel", "kernel", None, {}),
    ("kernel normal priority", "kernel", None, {"high_priority_loads": False}),
    ("kernel 8 ctas", "kernel", TransferOptions(num_ctas=8), {}),
    ("ce blocks 8 ramp", "mixed", TransferOptions(load_split=B8R, issue_threads=1), {}),
    ("ce blocks 8 ramp normal priority", "mixed", TransferOptions(load_split=B8R, issue_threads=1),
     {"high_priority_loads": False}),
    ("ce blocks 4 ramp", "mixed", TransferOptions(load_split=LoadSplit(1.0, layers_per_copy=4, ramp=True),
                                                  issue_threads=1), {}),
    ("ce 0.8 blocks 8 ramp + kernel 0.2", "mixed",
     TransferOptions(load_split=LoadSplit(0.8, layers_per_copy=8, ramp=True), issue_threads=1), {}),
    ("mixed (runs split) on 1 issue thread", "mixed", TransferOptions(issue_threads=1), {}),
    ("batch 4 issue threads", "batch", TransferOptions(issue_threads=4), {}),
    ("batch 2 issue threads", "batch", TransferOptions(issue_threads=2), {}),
]


K8R = LoadSplit(kernel_blocks=8, ramp=True)
PF_MIX = LoadSplit(0.8, layers_per_copy=8, kernel_blocks=8, ramp=True)
LF_MIX2 = LoadSplit(0.2, ce_path="batch", kernel_blocks=8, ramp=True)
LF_MIX3 = LoadSplit(0.3, ce_path="batch", kernel_blocks=8, ramp=True)

#: Second probe: the first probe's winners with the kernel in ramped blocks, the copy-engine
#: share with the kernel half in blocks too, and batch shares beside the kernel (layer_first).
SECOND_LOADS = [
    ("auto", "auto", None, {}),
    ("kernel blocks 8 ramp", "kernel", None, {}),
    ("ce 0.8 blocks 8 ramp + kernel 0.2 blocks", "mixed", TransferOptions(load_split=PF_MIX, issue_threads=1), {}),
    ("ce 0.8 blocks 8 ramp + kernel 0.2 blocks, ring 3", "mixed", TransferOptions(load_split=PF_MIX, issue_threads=1),
     {"staging_buffers": 3}),
    ("ce 0.8 blocks 8 ramp + kernel 0.2 blocks caller thread", "mixed",
     TransferOptions(load_split=PF_MIX, issue_threads=0), {}),
    ("kernel 0.8 blocks + batch 0.2 on 1 thread", "mixed", TransferOptions(load_split=LF_MIX2, issue_threads=1), {}),
    ("kernel 0.7 blocks + batch 0.3 on 1 thread", "mixed", TransferOptions(load_split=LF_MIX3, issue_threads=1), {}),
    ("kernel 0.7 blocks + batch 0.3 on 2 threads", "mixed",
     TransferOptions(load_split=replace(LF_MIX3, copy_streams=2), issue_threads=1), {}),
]
SECOND_BACKUPS = [("auto", "auto", None), ("kernel", "kernel", None)] + [
    (f"mixed ce {f}", "mixed", TransferOptions(backup_ce_fraction=f)) for f in (0.1, 0.15, 0.2)] + [
    (f"mixed ce {f} kernel 32 ctas", "mixed", TransferOptions(backup_ce_fraction=f, num_ctas=32)) for f in (0.1, 0.15)]
SECOND_BOTH = [("auto + auto", "auto", None, "auto", None),
               ("kernel blocks + staged", "kernel", None, "staged", None),
               ("kernel blocks + kernel", "kernel", None, "kernel", None),
               ("batch 4 threads + kernel", "batch", TransferOptions(issue_threads=4), "kernel", None),
               ("kernel blocks + mixed ce 0.15", "kernel", None, "mixed", TransferOptions(backup_ce_fraction=0.15)),
               ("kernel 0.7 + batch 0.3 + mixed ce 0.15", "mixed", TransferOptions(load_split=LF_MIX3, issue_threads=1),
                "mixed", TransferOptions(backup_ce_fraction=0.15)),
               ("ce 0.8 blocks 8 ramp + kernel 0.2 + staged", "mixed", TransferOptions(load_split=PF_MIX, issue_threads=1),
                "staged", None)]
SECOND_BESIDE = [
    ("auto", "auto", None, {}),
    ("kernel blocks 8 ramp", "kernel", None, {}),
    ("kernel per layer", "kernel", TransferOptions(load_split=LoadSplit()), {}),
    ("ce 0.8 blocks 8 ramp + kernel 0.2 blocks", "mixed", TransferOptions(load_split=PF_MIX, issue_threads=1), {}),
    ("ce 0.8 blocks 8 ramp + kernel 0.2 blocks caller thread", "mixed",
     TransferOptions(load_split=PF_MIX, issue_threads=0), {}),
    ("kernel 0.8 blocks + batch 0.2 on 1 thread", "mixed", TransferOptions(load_split=LF_MIX2, issue_threads=1), {}),
    ("kernel 0.7 blocks + batch 0.3 on 1 thread", "mixed", TransferOptions(load_split=LF_MIX3, issue_threads=1), {}),
]
#: Third probe: the final code's choices again with more repetitions beside compute, and load +
#: backup with slots in runs rep by rep (``ms_each``: its medians were bimodal, 32 or 58 ms).
THIRD_BOTH = [("auto + auto", "auto", None, "auto", None),
              ("staged + staged", "staged", None, "staged", None),
              ("ce one layer per copy + staged", "mixed", TransferOptions(load_split=LoadSplit(1.0)), "staged", None),
              ("ce one layer per copy, caller thread + staged", "mixed",
               TransferOptions(load_split=LoadSplit(1.0), issue_threads=0), "staged", None)]
THIRD_BESIDE = [
    ("auto", "auto", None, {}),
    ("kernel", "kernel", None, {}),
    ("kernel per layer", "kernel", TransferOptions(load_split=LoadSplit()), {}),
    ("ce 0.8 blocks 8 ramp + kernel 0.2 blocks", "mixed", TransferOptions(load_split=PF_MIX, issue_threads=1), {}),
    ("kernel 0.7 blocks + batch 0.3 on 1 thread", "mixed", TransferOptions(load_split=LF_MIX3, issue_threads=1), {}),
]
#: Fourth probe: beside compute only, after one event per kernel block (fewer records on the
#: issuing thread), with more repetitions.
FOURTH_BESIDE = [
    ("auto", "auto", None, {}),
    ("kernel", "kernel", None, {}),
    ("kernel 8 ctas", "kernel", TransferOptions(num_ctas=8), {}),
    ("kernel on 1 issue thread", "kernel", TransferOptions(issue_threads=1), {}),
]
#: Fifth probe: beside compute only, with the loss split (start delay, stalls, busy extra, layer 0),
#: compute sized by calibration at the chosen rows.
FIFTH_BESIDE = [
    ("auto", "auto", None, {}),
    ("kernel", "kernel", None, {}),
    ("kernel 8 ctas", "kernel", TransferOptions(num_ctas=8), {}),
    ("ce blocks 8 ramp on 1 issue thread", "mixed", TransferOptions(load_split=B8R, issue_threads=1), {}),
    ("ce blocks 8 ramp caller thread", "mixed", TransferOptions(load_split=B8R, issue_threads=0), {}),
    ("mixed caller thread", "mixed", TransferOptions(issue_threads=0), {}),
]


class PolicyVariant:
    """An engine whose ``auto`` loads take ``transfer_policy``'s multi-layer splits changed by
    ``change(split)`` (the module tables swapped around each call, a few microseconds): a
    candidate policy measured against the current one in the same run."""

    TABLES = ("MIXED_LOADS", "SCATTERED_LOADS", "MIXED_LOADS_BESIDE_BACKUP", "SCATTERED_LOADS_BESIDE_BACKUP")

    def __init__(self, engine: TransferEngine, change) -> None:
        import tiered_kv.transfers.policy as tp

        self.engine, self._tp = engine, tp
        self._changed = {}
        for name in self.TABLES:
            table = getattr(tp, name)
            # Only several-layer splits: MIXED_LOADS is keyed (dense, several layers).
            self._changed[name] = {key: change(split) if not (isinstance(key, tuple) and not key[1]) else split
                                   for key, split in table.items()}

    def _swap(self, tables: dict) -> dict:
        old = {name: getattr(self._tp, name) for name in tables}
        for name, table in tables.items():
            setattr(self._tp, name, table)
        return old

    def load(self, *args, **kwargs):
        old = self._swap(self._changed)
        try:
            return self.engine.load(*args, **kwargs)
        finally:
            self._swap(old)


def _head(layers: int, step: int | None = 5, few_ctas: bool = False):
    def change(split: LoadSplit) -> LoadSplit:
        ctas = 4 if few_ctas and split.ce_fraction >= 0.8 and split.ce_fraction < 1.0 else split.kernel_ctas
        # ``head_ramp_step`` None: the head ramps by ``step`` as when the set was written.
        return replace(split, head_layers=layers, ramp=split.ramp or step is not None, ramp_step=step, kernel_ctas=ctas,
                       head_ramp_step=None)
    return change


#: Sixth probe: heads by the kernel (``head_layers``), blocks that grow with the layer index
#: (``ramp_step``), a small kernel share on few CTAs, against the current policy; the kernel path
#: with the same ramp. Idle 61-layer loads, load + backup and beside compute, both slot kinds.
#: Entries (name, path, options, engine kwargs, policy change or None).
KR5 = LoadSplit(kernel_blocks=8, ramp=True, ramp_step=5)
SIXTH = [
    ("auto", "auto", None, {}, None),
    ("auto head 6 ramp step 5", "auto", None, {}, _head(6)),
    ("auto head 8 ramp step 5 kernel share 4 ctas", "auto", None, {}, _head(8, few_ctas=True)),
    ("auto head 4 ramp doubling", "auto", None, {}, _head(4, step=None)),
    ("kernel", "kernel", None, {}, None),
    ("kernel ramp step 5", "kernel", TransferOptions(load_split=KR5), {}, None),
    ("kernel ramp step 5 8 ctas", "kernel", TransferOptions(load_split=KR5, num_ctas=8), {}, None),
]


def _body_kernel(ctas: int, tile: int):
    def change(split: LoadSplit) -> LoadSplit:
        return replace(split, kernel_ctas=ctas, kernel_tile=tile) if split.ce_path == "batch" and split.ce_fraction < 0.5 else split
    return change


#: Seventh probe: the policy with heads (``auto``), and the UVA kernel with larger tiles on fewer
#: CTAs (more host reads in flight per CTA: fewer SMs taken from the model), alone and as the body
#: of scattered ``layer_first`` loads.
SEVENTH = [
    ("auto", "auto", None, {}, None),
    ("auto, batch body's kernel 8 ctas tile 16384", "auto", None, {}, _body_kernel(8, 16384)),
    ("kernel", "kernel", None, {}, None),
    ("kernel ramp step 5 8 ctas tile 16384", "kernel",
     TransferOptions(load_split=replace(KR5, kernel_ctas=8, kernel_tile=16384)), {}, None),
    ("kernel ramp step 5 6 ctas tile 16384", "kernel",
     TransferOptions(load_split=replace(KR5, kernel_ctas=6, kernel_tile=16384)), {}, None),
    ("kernel ramp step 5 8 ctas tile 8192", "kernel",
     TransferOptions(load_split=replace(KR5, kernel_ctas=8, kernel_tile=8192)), {}, None),
    ("kernel ramp step 5 12 ctas tile 16384", "kernel",
     TransferOptions(load_split=replace(KR5, kernel_ctas=12, kernel_tile=16384)), {}, None),
]


def _scattered_page_first_head(layers: int, step: int | None = None):
    """Only the scattered ``page_first`` split (copy-engine blocks of 8 beside a kernel share)."""
    def change(split: LoadSplit) -> LoadSplit:
        if split.layers_per_copy == 8 and 0 < split.ce_fraction < 1.0:
            return replace(split, head_layers=layers, ramp_step=step)
        return split
    return change


#: Eighth probe: longer heads for scattered ``page_first`` loads, whose copy-engine blocks of 8
#: layers still land after the model reached them (stalls of 7-11 ms at 1.25x in the final runs).
EIGHTH = [
    ("auto", "auto", None, {}, None),
    ("auto, scattered page_first head 8", "auto", None, {}, _scattered_page_first_head(8)),
    ("auto, scattered page_first head 12", "auto", None, {}, _scattered_page_first_head(12)),
    ("auto, scattered page_first head 16", "auto", None, {}, _scattered_page_first_head(16)),
]
def _pitched(split: LoadSplit, **fields) -> TransferOptions:
    return TransferOptions(load_split=split, issue_threads=1, pitched_batch=True, **fields)


#: Ninth probe: the staging ring's copy-engine copies as pitched ops (``cudaMemcpy3DBatchAsync``),
#: a slot's rows of a block of ``layer_first`` layers one op (``TransferOptions.pitched_batch``):
#: about 8k ops for a 61-layer load of 512 scattered slots instead of 62k row copies, no SM
#: beyond the staging scatter. Loads (both layouts; page_first blocks are already one row per slot,
#: so there it is the control), backups, load + backup at once, beside compute.
P8 = LoadSplit(1.0, layers_per_copy=8, ramp=True)
P8H = LoadSplit(1.0, layers_per_copy=8, ramp=True, ramp_step=5, head_layers=8)
NINTH_LOADS = [
    ("auto", "auto", None, {}),
    ("ce blocks 8 ramp (row copies)", "mixed", TransferOptions(load_split=P8, issue_threads=1), {}),
    ("pitched blocks 8 ramp", "mixed", _pitched(P8), {}),
    ("pitched blocks 4 ramp", "mixed", _pitched(LoadSplit(1.0, layers_per_copy=4, ramp=True)), {}),
    ("pitched blocks 16 ramp", "mixed", _pitched(LoadSplit(1.0, layers_per_copy=16, ramp=True)), {}),
    ("pitched blocks 8 ramp 2 copy streams", "mixed", _pitched(replace(P8, copy_streams=2)), {}),
    ("pitched head 8 blocks 8 ramp step 5", "mixed", _pitched(P8H), {}),
]
NINTH_BACKUPS = [("auto", "auto", None), ("staged", "staged", None),
                 ("staged pitched", "staged", TransferOptions(pitched_batch=True))]
NINTH_BOTH = [("auto + auto", "auto", None, "auto", None),
              ("pitched blocks 8 ramp + auto", "mixed", _pitched(P8), "auto", None),
              ("pitched blocks 8 ramp + staged pitched", "mixed", _pitched(P8), "staged",
               TransferOptions(pitched_batch=True)),
              ("auto + staged pitched", "auto", None, "staged", TransferOptions(pitched_batch=True))]
NINTH_BESIDE = [("auto", "auto", None, {}),
                ("pitched blocks 8 ramp", "mixed", _pitched(P8), {}),
                ("pitched blocks 4 ramp", "mixed", _pitched(LoadSplit(1.0, layers_per_copy=4, ramp=True)), {}),
                ("pitched head 8 blocks 8 ramp step 5", "mixed", _pitched(P8H), {})]

#: Tenth probe (H200, after the ninth showed pitched ops slower): load + backup at once with one
#: direction on the copy engines and the other on the UVA kernel, since UVA in both directions
#: shares the SMs' PCIe request capacity (~61 GB/s together) and scattered ``layer_first`` rows
#: put both of ``auto``'s directions mostly on the kernel. Each side has its own engine (unlike
#: the candidate sets' ``both`` group), so an ``auto`` load here does not see the backup in flight.
B32 = TransferOptions(num_ctas=32)
CE8 = TransferOptions(load_split=P8, issue_threads=1)
TENTH_BOTH = [("auto + auto", "auto", None, "auto", None),
              ("batch + kernel", "batch", None, "kernel", None),
              ("batch + kernel 32 ctas", "batch", None, "kernel", B32),
              ("ce blocks 8 ramp + kernel", "mixed", CE8, "kernel", None),
              ("ce blocks 8 ramp + kernel 32 ctas", "mixed", CE8, "kernel", B32),
              ("ce blocks 8 ramp + batch", "mixed", CE8, "batch", None),
              ("batch + batch", "batch", None, "batch", None),
              ("kernel + batch", "kernel", None, "batch", None),
              ("auto + batch", "auto", None, "batch", None),
              ("auto + kernel 32 ctas", "auto", None, "kernel", B32)]


def _entry_takes(table: str, key, split: LoadSplit):
    """A change for ``PolicyVariant``: the loads that ``transfer_policy``'s ``table[key]`` entry
    decides take ``split``. An entry object shared by two tables (``layer_first``'s
    ``SCATTERED_LOADS`` and ``SCATTERED_LOADS_BESIDE_BACKUP``) changes in both."""
    import tiered_kv.transfers.policy as tp

    return lambda s: split if s is getattr(tp, table)[key] else s


def _layer_first_beside_backup(split: LoadSplit):
    """Scattered ``layer_first`` loads take ``split`` (the entry is shared with idle scattered
    loads, so only the ``both`` group measures it fairly)."""
    return _entry_takes("SCATTERED_LOADS_BESIDE_BACKUP", True, split)


#: Eleventh probe: the tenth's best ``layer_first`` pair (a copy-engine load in rows of blocks of 8
#: layers beside a kernel backup) with ``auto``'s own backup, one engine, as ``auto`` would run it.
ELEVENTH = [
    ("auto", "auto", None, {}, None),
    ("auto, lf beside backup ce blocks 8 ramp", "auto", None, {}, _layer_first_beside_backup(P8)),
    ("auto, lf beside backup ce head 8 blocks 8", "auto", None, {},
     _layer_first_beside_backup(LoadSplit(1.0, layers_per_copy=8, **tp_HEAD))),
]


def _page_first_runs(split: LoadSplit):
    """``page_first`` loads of several layers from slots in runs take ``split``."""
    return _entry_takes("MIXED_LOADS", (False, True), split)


#: Twelfth probe (not run yet): ``page_first`` loads from slots in runs beside compute. The
#: fourth round's split (latent rows by the copy engines, indexer rows by the UVA kernel, after an
#: 8-layer kernel head) hid 0.82 at a compute slowdown of 1.07, the kernel's indexer share slowing
#: the matmuls by 3 ms; ``layer_first`` with everything on the copy engines after the head hid 0.93
#: at 1.00. Candidates: the copy engines alone after the head, per layer or in blocks of 8.
TWELFTH = [
    ("auto", "auto", None, {}, None),
    ("auto, pf runs ce after head", "auto", None, {}, _page_first_runs(LoadSplit(1.0, **tp_HEAD))),
    ("auto, pf runs ce blocks 8 after head", "auto", None, {},
     _page_first_runs(LoadSplit(1.0, layers_per_copy=8, **tp_HEAD))),
]


def _entry_changed(table: str, key, **fields):
    """A change for ``PolicyVariant``: the policy's own ``table[key]`` split with ``fields`` changed."""
    import tiered_kv.transfers.policy as tp

    return _entry_takes(table, key, replace(getattr(tp, table)[key], **fields))


#: ``auto``'s scattered ``page_first`` split as of 912a0fb, which the nineteenth to twenty-second
#: probes changed (``auto`` took a head of 8 layers and full blocks after them since): those sets'
#: candidates are built from this fixed value, so they measure what they measured then.
PF_SCATTERED_912A0FB = LoadSplit(0.8, layers_per_copy=8, kernel_blocks=8, ramp=True, head_layers=4)
#: The same split as of 1077943 (the twenty-third probe's base; ``auto`` took its step-4 row since).
PF_SCATTERED_1077943 = replace(PF_SCATTERED_912A0FB, head_layers=8, body_ramp=False)


def _pf_scattered_from(base: LoadSplit, **fields):
    """Scattered ``page_first`` loads take ``base`` (a fixed split of before, not the policy's
    entry now) with ``fields`` changed."""
    return _entry_takes("SCATTERED_LOADS", False, replace(base, **fields))


def _scattered_from_policy(dense_host_rows: bool, **fields):
    """Loads of several layers from scattered slots of one layout (``layer_first``'s entry changes
    beside a backup too: the thirteenth set skips ``both``)."""
    return _entry_changed("SCATTERED_LOADS", dense_host_rows, **fields)


def _runs_from_policy(dense_host_rows: bool, **fields):
    """Loads of several layers from slots in runs of one layout."""
    return _entry_changed("MIXED_LOADS", (dense_host_rows, True), **fields)


T2 = TransferOptions(issue_threads=2)
#: Thirteenth probe (not run yet): scattered loads, idle and beside compute (``--skip both``).
#: ``layer_first`` (93% idle, hidden 0.81 at 1.05 beside compute at 1.25x, ninth session): more of
#: the pages through memcpy batches, issued on two library threads so the batch half's CPU (about
#: 1.3 us a row) stays under the load's time, and fewer SMs taken by the kernel half. The issue
#: threads alone first, so the share's effect is apart from the threads'. ``page_first`` (94.9%
#: idle, hidden 0.79): blocks of 4 layers instead of 8 (raw copy-engine reads of 4-layer rows
#: 53.9 GB/s against 55.4), so layers are ready in smaller groups, and blocks that grow by 3.
THIRTEENTH = [
    ("auto", "auto", None, {}, None),
    ("auto, 2 issue threads", "auto", T2, {}, None),
    ("auto, lf scattered kernel 0.6 + batch 0.4, 2 issue threads", "auto", T2, {},
     _scattered_from_policy(True, ce_fraction=0.4)),
    ("auto, lf scattered kernel 0.5 + batch 0.5, 2 issue threads", "auto", T2, {},
     _scattered_from_policy(True, ce_fraction=0.5)),
    ("auto, pf scattered blocks of 4", "auto", None, {}, _scattered_from_policy(False, layers_per_copy=4, kernel_blocks=4)),
    ("auto, pf scattered blocks of 8, ramp step 3", "auto", None, {}, _scattered_from_policy(False, ramp_step=3)),
    # Tenth session: a block of b layers starting at layer j stalls a model at 1.25x unless
    # b <= 1 + j / 4, so blocks growing by one every 5 layers after the 8-layer head never stall
    # at the idle rate; the copy engines alone after the head take no SM from the matmuls.
    ("auto, pf scattered head 8, ramp step 5", "auto", None, {}, _scattered_from_policy(False, **tp_HEAD)),
    # (The policy's split since 2026-12-03 is copy engines only as well, with a wider scatter and lead
    # blocks: the variant names what it measured then.)
    ("auto, pf scattered copy engines only after the head", "auto", None, {},
     _scattered_from_policy(False, ce_fraction=1.0, staging_ctas=None, lead_blocks=1)),
    # ``layer_first`` runs beside compute hid 0.896 (start 1.54 ms, stall 0.82, busy 0.93): a
    # shorter head takes the SMs for fewer layers.
    ("auto, lf runs head 3", "auto", None, {}, _runs_from_policy(True, head_layers=3)),
]


#: Fourteenth probe: the thirteenth (H200, tenth session) showed scattered ``page_first`` loads
#: bound by the issuing thread when one load runs from start to end: 42 ms alone against 30 ms
#: when loads follow each other (whose issue overlaps the previous load's copying), with 31 ms of
#: CPU for 10,240 row copies of the copy-engine share, and the candidates with fewer copy-engine
#: rows (the 8-layer head) ran alone fastest. Fewer rows: the latent rows through the copy engines
#: and the indexer rows by the kernel (5,120 rows), or a smaller page share. ``layer_first``: a
#: smaller memcpy-batch share (less CPU; the 0.4 and 0.5 shares ran alone in 36-44 ms).
FOURTEENTH = [
    ("auto", "auto", None, {}, None),
    ("auto, pf scattered latent by copy engines, indexer by kernel", "auto", None, {},
     _scattered_from_policy(False, by="components")),
    ("auto, pf scattered head 8 step 5, latent by copy engines, indexer by kernel", "auto", None, {},
     _scattered_from_policy(False, by="components", **tp_HEAD)),
    ("auto, pf scattered copy engines 0.6", "auto", None, {}, _scattered_from_policy(False, ce_fraction=0.6)),
    ("auto, pf scattered head 8, ramp step 5", "auto", None, {}, _scattered_from_policy(False, **tp_HEAD)),
    ("auto, lf scattered kernel 0.8 + batch 0.2", "auto", None, {}, _scattered_from_policy(True, ce_fraction=0.2)),
]


#: Fifteenth probe: the staging ring beside compute. Its two 32 MiB buffers let the copy engines
#: run one unit ahead of the ring's scatter kernel, whose CTAs wait for SMs while the model's
#: matmuls hold them: with more buffers the copy engines keep copying while a scatter waits.
#: Every staged case changes (slots in runs of both layouts, scattered ``page_first``); the kernel
#: alone in ramped blocks is the reference that needs no ring (0.88 / 1.03 for scattered
#: ``page_first`` in the second probe).
FIFTEENTH = [
    ("auto", "auto", None, {}, None),
    ("auto, ring 4 x 32 MiB", "auto", None, {"staging_buffers": 4}, None),
    ("auto, ring 8 x 32 MiB", "auto", None, {"staging_buffers": 8}, None),
    ("kernel blocks 8 ramp", "kernel", None, {}, None),
]


#: Sixteenth probe: ``auto`` alone, many repetitions (``--beside-reps 30``): where its hidden
#: share beside compute sits once the spread between rows (0.80-0.92 for slots in runs) is
#: averaged out.
SIXTEENTH = [("auto", "auto", None, {}, None)]


#: Seventeenth probe: backups issued from library threads (``TransferOptions.backup_issue_threads``,
#: new). Load + backup at once with scattered ``layer_first`` rows reached 1.02-1.13x in every
#: pairing measured (tenth set): UVA kernels in both directions share the SMs' PCIe request
#: capacity, and copy engines in both directions were bound by the backup's 62k row copies issued
#: for 77-87 ms on the caller's thread. With the backup's rows dealt to 2-8 threads (one memcpy
#: batch each, on their own streams) both directions can run on the copy engines. Backups alone
#: first (what the threads cost and reach), then with loads of every kind beside them.
BT = {k: TransferOptions(backup_issue_threads=k) for k in (0, 2, 4, 8)}
L4, L8 = TransferOptions(issue_threads=4), TransferOptions(issue_threads=8)
SEVENTEENTH_BACKUPS = [("auto", "auto", None), ("batch, caller's thread", "batch", BT[0]),
                       ("batch, 2 threads", "batch", BT[2]), ("batch, 4 threads", "batch", BT[4]),
                       ("batch, 8 threads", "batch", BT[8]),
                       ("mixed ce 0.5, 4 threads", "mixed", TransferOptions(backup_ce_fraction=0.5, backup_issue_threads=4)),
                       ("mixed ce 0.3, 2 threads", "mixed", TransferOptions(backup_ce_fraction=0.3, backup_issue_threads=2))]
SEVENTEENTH_BOTH = [("auto + auto", "auto", None, "auto", None),
                    ("batch 4 thr + batch caller", "batch", L4, "batch", BT[0]),
                    ("batch 4 thr + batch 4 thr", "batch", L4, "batch", BT[4]),
                    ("batch 4 thr + batch 8 thr", "batch", L4, "batch", BT[8]),
                    ("batch 8 thr + batch 8 thr", "batch", L8, "batch", BT[8]),
                    ("batch 8 thr + batch 4 thr", "batch", L8, "batch", BT[4]),
                    ("auto + batch 4 thr", "auto", None, "batch", BT[4]),
                    ("ce blocks 8 ramp + batch 4 thr", "mixed", CE8, "batch", BT[4]),
                    ("batch 4 thr + mixed ce 0.5, 4 thr", "batch", L4, "mixed",
                     TransferOptions(backup_ce_fraction=0.5, backup_issue_threads=4))]


#: Eighteenth probe: the head handed over (``CALLER_HEAD_BLOCKS``, new). A model waiting on layer
#: 0 starts only once ``load`` returned, and with the whole head on the caller's thread that was
#: after layer 0 had landed (``page_first`` runs: return at 2.15 ms, layer 0 at 2.02). Now the
#: caller launches the head's first block and a library thread the rest; the whole head on the
#: caller (as before) and two blocks on it run beside it in the same run.
EIGHTEENTH = [
    ("auto", "auto", None, {}, None),
    ("auto, whole head on the caller", "auto", TransferOptions(caller_head_blocks=64), {}, None),
    ("auto, 2 head blocks on the caller", "auto", TransferOptions(caller_head_blocks=2), {}, None),
]


#: Nineteenth probe (not run yet: built in the eleventh session after its device time ran out). A
#: scattered ``page_first`` load alone is bound by the one thread that issues its copy-engine rows
#: (stall 10-11 ms beside the matmuls at 1.25x); with ``issue_halves`` 2 the copy-engine pages go
#: in two halves, each through its own staging ring and copy stream, issued by two threads and
#: joined per block. Same split otherwise; ``auto`` beside it in the same run. Run with
#: ``--skip both --beside-reps 12``; the beside rows' ``late_at`` says which layers still wait.
NINETEENTH = [
    ("auto", "auto", None, {}, None),
    ("auto, pf scattered in two issued halves", "auto", None, {},
     _pf_scattered_from(PF_SCATTERED_912A0FB, issue_halves=2)),
    ("auto, pf scattered in two issued halves, head 8 step 5", "auto", None, {},
     _pf_scattered_from(PF_SCATTERED_912A0FB, issue_halves=2, **tp_HEAD)),
]


#: Twentieth probe: the scattered ``page_first`` body is bound by its issue (41.9 ms from the call
#: against 29.9 ms of copying, nineteenth probe); a larger staging ring means fewer units, so
#: fewer scatter launches, batches and events per load. ``auto``'s split, the ring changed.
TWENTIETH = [
    ("auto", "auto", None, {}, None),
    ("auto, ring 2 x 64 MiB", "auto", None, {"staging_bytes": 64 << 20}, None),
    ("auto, ring 2 x 128 MiB", "auto", None, {"staging_bytes": 128 << 20}, None),
    ("auto, ring 4 x 32 MiB", "auto", None, {"staging_buffers": 4}, None),
]


#: Twenty-first probe: the issue timeline (``benchmarks/issue_timeline.py``) of a scattered
#: ``page_first`` load shows the model waiting on the body's second block, issued only after the
#: rest of the body was planned in one call; ``lead_blocks`` 3 plans and issues the first three
#: blocks one call each.
TWENTYFIRST = [
    ("auto", "auto", None, {}, None),
    ("auto, pf scattered lead 3", "auto", None, {}, _pf_scattered_from(PF_SCATTERED_912A0FB, lead_blocks=3)),
    ("auto, pf scattered lead 3, ring 2 x 64 MiB", "auto", None, {"staging_bytes": 64 << 20},
     _pf_scattered_from(PF_SCATTERED_912A0FB, lead_blocks=3)),
]


#: Twenty-second probe: each staged block of scattered ``page_first`` slots costs its issuing
#: thread about the same (one row per slot and component, ~2 us each) whatever its layers, and
#: the body's blocks ramp again from one layer after the head: a longer kernel head (all pages
#: through the UVA kernel) and full 8-layer copy-engine blocks right after it. Run (01:49) with
#: ``auto`` at 912a0fb and a row "head 8, body unramped", which ``auto`` is since; that row is now
#: the ``auto`` row, and the 912a0fb split has a row of its own.
TWENTYSECOND = [
    ("auto", "auto", None, {}, None),
    ("auto as of 912a0fb", "auto", None, {}, _pf_scattered_from(PF_SCATTERED_912A0FB)),
    ("auto, pf scattered lead 3", "auto", None, {}, _pf_scattered_from(PF_SCATTERED_912A0FB, lead_blocks=3)),
    ("auto, pf scattered head 12, body unramped", "auto", None, {},
     _pf_scattered_from(PF_SCATTERED_912A0FB, head_layers=12, body_ramp=False)),
    ("auto, pf scattered head 16, body unramped", "auto", None, {},
     _pf_scattered_from(PF_SCATTERED_912A0FB, head_layers=16, body_ramp=False)),
]


#: Twenty-third probe (run twice, 02:10 and 02:11, ``--layouts page_first --slots scattered``:
#: ``auto`` took the step-4 row, so the rows are built from the 1077943 split). With the
#: twenty-second's split the model still waits 1.5-2.0 ms at layer 8, the body's first block: a
#: layer of an 8-layer block is ready only once the whole block landed, and at 1.25x the model
#: gains only ~0.14 ms a layer on the copy, so a block of B layers is waited on until about layer
#: 3.5 B. Blocks that grow with the layer index (``ramp_step``, head and body alike) keep each
#: block's wait short while a copy-engine block stays >= 3 layers (each costs ~1.9 ms of issue).
#: A pipeline model with the timeline's constants (PCIe 0.5 ms a layer, 1.9 ms of issue a block,
#: matmuls 0.64 ms a layer) gives stalls of 2.7 ms for the current split, 0.3 for step 4 and 0.9
#: for step 5. Run with ``--skip both --beside-reps 12``.
TWENTYTHIRD = [
    ("auto", "auto", None, {}, None),
    ("auto as of 1077943", "auto", None, {}, _pf_scattered_from(PF_SCATTERED_1077943)),
    ("auto, pf scattered step 5", "auto", None, {}, _pf_scattered_from(PF_SCATTERED_1077943, ramp_step=5)),
    ("auto, pf scattered head 12 step 4", "auto", None, {},
     _pf_scattered_from(PF_SCATTERED_1077943, head_layers=12, ramp_step=4)),
]



def _fields_where(applies, **fields):
    """A change for ``PolicyVariant``: every several-layer split that ``applies(split)`` takes
    ``fields``; the others stay as they are."""
    return lambda split: replace(split, **fields) if applies(split) else split


def _step_everywhere(step: int):
    """Every ramped split takes ``ramp_step`` ``step`` (head and body alike: ``head_ramp_step`` None)."""
    return _fields_where(lambda split: split.ramp, ramp_step=step, head_ramp_step=None)


#: Twenty-fourth probe (run 2026-12-02: two head blocks on the caller won, now ``CALLER_HEAD_BLOCKS``).
#: The twenty-third's ``ramp_step`` 4 won for scattered
#: ``page_first`` (0.87 / 0.84 hidden against 0.80 / 0.81); the other three cases still wait at
#: layer 5, the 2-layer block [5, 6] of ``HEAD``'s step 5, and every case at layer 1, the head's
#: second block, launched by library thread 1 after ``load`` returned. Candidates: step 4 in every
#: ramped split, the caller launching the head's first two blocks, and both; and the kernel
#: tables kept on the device with the ids through a pinned ring (``device_tables``: about 0.5 ms
#: of the caller's path before the first launch is the head's upload). Run with
#: ``--skip both --beside-reps 12`` (all four cases), then ``both`` alone if a candidate wins.
TWENTYFOURTH = [
    ("auto", "auto", None, {}, None),
    ("auto, step 4 everywhere", "auto", None, {}, _step_everywhere(4)),
    ("auto, 2 head blocks on the caller", "auto", TransferOptions(caller_head_blocks=2), {}, None),
    ("auto, step 4 everywhere, 2 head blocks on the caller", "auto", TransferOptions(caller_head_blocks=2), {},
     _step_everywhere(4)),
    ("auto, device tables", "auto", TransferOptions(device_tables=True), {}, None),
]


#: Twenty-fifth probe: the twenty-fourth's winner, now ``auto`` (``CALLER_HEAD_BLOCKS`` 2), against
#: one block on the caller (as before) and three, in the same run: the A/B once more before the
#: final benchmark, since the runs cases had moved the other way within the spread.
TWENTYFIFTH = [
    ("auto", "auto", None, {}, None),
    ("auto, 1 head block on the caller", "auto", TransferOptions(caller_head_blocks=1), {}, None),
    ("auto, 3 head blocks on the caller", "auto", TransferOptions(caller_head_blocks=3), {}, None),
]


def _everywhere(**fields):
    """Every several-layer split takes ``fields`` (``lead_blocks``, ``plan_wave``: only staged
    copy-engine halves read them)."""
    return _fields_where(lambda split: True, **fields)


#: Twenty-sixth probe: the thirteenth session's issue timeline of a scattered ``page_first`` load
#: beside the matmuls shows the body's thread planning all of the body after its first block in
#: one call (2.4 ms of ``_units`` / ``_table`` for 8 blocks, then 0.4 ms of upload) before it
#: issues the second block (layers 11-13): the copy engines sat idle from 9.0 to 10.4 ms and the
#: model waited about 0.8 ms at layer 11. Candidates: the first 2, 3 or every block planned and
#: issued one call each (``lead_blocks``), the rest in one call.
TWENTYSIXTH = [
    ("auto", "auto", None, {}, None),
    ("auto, lead 2", "auto", None, {}, _everywhere(lead_blocks=2)),
    ("auto, lead 3", "auto", None, {}, _everywhere(lead_blocks=3)),
    ("auto, every block its own call", "auto", None, {}, _everywhere(lead_blocks=64)),
]


def _head_changed(**fields):
    """Every split with a head takes ``fields`` (``head_ramp_step``, ``head_ctas``, ``body_after_head``)."""
    return _fields_where(lambda split: split.head_layers, **fields)


#: Twenty-seventh probe: in the twenty-sixth's timelines the head lands about as fast as the model
#: consumes it beside the matmuls (0.5-0.95 ms a layer against 0.85-0.9), so the model waits about
#: 1 ms at layer 4 (scattered ``page_first``: head blocks 1, 1, 1, 1, 2, 2) and 0.2-0.35 ms at layer
#: 5 (``HEAD``'s 1, 1, 1, 1, 1, 2, 1), the first layer of the head's first two-layer block.
#: Candidates: the head in single-layer blocks (``head_ramp_step`` 8: two more launches), the head's
#: launches at 32 CTAs (16 by default from the host; only the head's layers take the SMs), both.
TWENTYSEVENTH = [
    ("auto", "auto", None, {}, None),
    ("auto, head in single layers", "auto", None, {}, _head_changed(head_ramp_step=8)),
    ("auto, head at 32 ctas", "auto", None, {}, _head_changed(head_ctas=32)),
    ("auto, head in single layers at 32 ctas", "auto", None, {}, _head_changed(head_ramp_step=8, head_ctas=32)),
]


#: Twenty-eighth probe: with the head in single layers (twenty-seventh) the wait at layer 4 was
#: gone, and the model waited as long at layers 8 and 11 instead: the body's first blocks land at
#: 9.5 and 12 ms whatever the head does, since the body's copies start only once the head has
#: landed (6.5 ms) and its thread plans only after the head's launches (3.3 ms). Beside the
#: matmuls the head's kernel moves a layer in 0.5-0.95 ms (36 GB/s at most), so part of the link is
#: idle under it. Candidates: the body's copies beside the head's (``body_after_head`` False), the
#: head in single layers again, both.
TWENTYEIGHTH = [
    ("auto", "auto", None, {}, None),
    ("auto, body beside the head", "auto", None, {}, _head_changed(body_after_head=False)),
    ("auto, head in single layers", "auto", None, {}, _head_changed(head_ramp_step=8)),
    ("auto, body beside a head in single layers", "auto", None, {},
     _head_changed(body_after_head=False, head_ramp_step=8)),
]


#: Twenty-ninth probe: ``auto``'s scattered ``layer_first`` head of single layers (since the
#: twenty-eighth) against ``HEAD``'s step-5 head it had before, once more in one run.
TWENTYNINTH = [
    ("auto", "auto", None, {}, None),
    ("auto, HEAD's step-5 head", "auto", None, {}, _entry_changed("SCATTERED_LOADS", True, head_ramp_step=None)),
]


#: Thirtieth probe: the fifteenth session's issue timelines (slots in runs, idle and beside the
#: matmuls) show the body's thread issuing layer 9 3.3-4.4 ms after layer 8: it plans the 52 blocks
#: after its first one in one call before the first of them copies, and the link idles about 3 ms
#: (the model waits at layer 9 beside the matmuls). Candidates: the staged calls in waves from 1
#: block (``plan_wave``), and with the kernel half's tables kept on the device as well
#: (``device_tables``: the body's kernel half of ``page_first`` runs uploaded 53 tables first).
#: Scattered ``layer_first`` loads (a ``batch`` body) do not use the ring: a control.
THIRTIETH = [
    ("auto", "auto", None, {}, None),
    ("auto, waves from 1", "auto", None, {}, _everywhere(plan_wave=1)),
    ("auto, waves from 1, device tables", "auto", TransferOptions(device_tables=True), {}, _everywhere(plan_wave=1)),
]


#: Thirty-first probe: the thirtieth's waves closed the body's gap at layer 9 (runs: layers 8, 9, 10
#: issued at 3.4, 4.1, 4.6 ms) but cost idle 61-layer loads 1-2% (scattered ``page_first`` 51.1
#: against 52.1 GB/s), their later uploads enqueued on the scatter's stream behind the data copies;
#: beside the matmuls the cells moved within the spread (the ``layer_first`` scattered control, not
#: a ring user, 0.79 / 0.86 / 0.79). Now the waves' uploads go on the ring's own stream.
#: Candidates as the thirtieth, and the device tables alone.
THIRTYFIRST = THIRTIETH + [("auto, device tables", "auto", TransferOptions(device_tables=True), {}, None)]


#: Thirty-second probe (for ``issue_timeline.py --set thirtysecond --layouts layer_first --slots scattered``):
#: the idle copy-engine split for scattered ``layer_first`` loads that reached >= 95% in 20 of 24
#: recorded runs and 77-92% in 3 (docs/benchmarks.md "Twentieth session"), unguarded, and the same
#: with every block in a call of its own (what the paced guard of 2026-12-03 also changed: it fell
#: back in nearly every load). Per layer, when the thread issued it and when it landed show whether
#: per-block calls alone put the thread behind the copy engines, and what a starved run looks like.
CE_IDLE_LAYER_FIRST = LoadSplit(0.8, layers_per_copy=8, kernel_blocks=8, ramp=True)
THIRTYSECOND = [
    ("auto", "auto", None, {}, None),
    ("ce 0.8 blocks 8 ramp + kernel 0.2", "mixed", TransferOptions(load_split=CE_IDLE_LAYER_FIRST, issue_threads=1),
     {}, None),
    ("ce 0.8 blocks 8 ramp + kernel 0.2, a call per block", "mixed",
     TransferOptions(load_split=replace(CE_IDLE_LAYER_FIRST, lead_blocks=64), issue_threads=1), {}, None),
]

#: The thirty-third probe: the idle copy-engine split at 0.8 / 0.7 / 0.6 of the pages, the kernel, a
#: batch share and the batch path from ``transfer_gpu.CANDIDATES``, with the load ring's
#: ``IssueLag`` per candidate (did the copy engines wait on the thread?); with ``--from-call`` each
#: also timed from the call (no device sleep ahead of the issue).
THIRTYTHIRD = THIRTYSECOND + [
    (f"ce {share} blocks 8 ramp + kernel {round(1 - share, 1)}", "mixed",
     TransferOptions(load_split=replace(CE_IDLE_LAYER_FIRST, ce_fraction=share), issue_threads=1), {}, None)
    for share in (0.7, 0.6)] + [
    (name, *tg.CANDIDATES[name], {}, None)
    for name in ("kernel on 1 issue thread", "kernel 0.6 + batch 0.4 on 1 thread", "batch 4 issue threads")]


#: Thirty-fourth probe (twenty-fourth session, ``--skip load61,backup,beside``): load + backup at once
#: with scattered slots. In every run of record since the tenth session scattered ``layer_first``
#: pairs moved 1.01-1.02x one direction with ``auto`` (a kernel 0.7 + batch 0.3 load beside a kernel
#: 0.85 + batch 0.15 backup) and 1.11-1.13x with the UVA kernel alone both ways. Which half's
#: copy-engine share costs it: each half without its share, both without, and the kernel paths.
#: ``auto + auto`` pairs share one engine (the load sees the backup in flight); the others each
#: take their own. ``--both-order load`` issues the load first.
KERNEL_ONLY_LOAD = TransferOptions(load_split=SCATTERED_LOADS_WITHOUT_BATCH)
KERNEL_ONLY_BACKUP = TransferOptions(backup_ce_fraction=0.0)
THIRTYFOURTH_BOTH = [("auto + auto", "auto", None, "auto", None),
                     ("kernel + kernel", "kernel", None, "kernel", None),
                     ("auto load kernel only + auto", "mixed", KERNEL_ONLY_LOAD, "auto", None),
                     ("auto + auto backup kernel only", "auto", None, "auto", KERNEL_ONLY_BACKUP),
                     ("auto load kernel only + auto backup kernel only", "mixed", KERNEL_ONLY_LOAD, "auto",
                      KERNEL_ONLY_BACKUP),
                     ("kernel + auto", "kernel", None, "auto", None),
                     ("auto + kernel", "auto", None, "kernel", None)]

CANDIDATE_SETS = {"sixth": SIXTH, "seventh": SEVENTH, "eighth": EIGHTH, "eleventh": ELEVENTH, "twelfth": TWELFTH,
                  "thirteenth": THIRTEENTH, "fourteenth": FOURTEENTH,
                  "fifteenth": FIFTEENTH, "sixteenth": SIXTEENTH, "eighteenth": EIGHTEENTH,
                  "nineteenth": NINETEENTH, "twentieth": TWENTIETH,
                  "twentyfirst": TWENTYFIRST, "twentysecond": TWENTYSECOND,
                  "twentythird": TWENTYTHIRD, "twentyfourth": TWENTYFOURTH,
                  "twentyfifth": TWENTYFIFTH, "twentysixth": TWENTYSIXTH,
                  "twentyseventh": TWENTYSEVENTH, "twentyeighth": TWENTYEIGHTH,
                  "twentyninth": TWENTYNINTH, "thirtieth": THIRTIETH,
                  "thirtyfirst": THIRTYFIRST, "thirtysecond": THIRTYSECOND,
                  "thirtythird": THIRTYTHIRD}
SETS = {"fifth": ([], [], [], FIFTH_BESIDE), "first": (FIRST_LOADS, FIRST_BACKUPS, FIRST_BOTH, FIRST_BESIDE),
        "fourth": ([], [], [], FOURTH_BESIDE),
        "second": (SECOND_LOADS, SECOND_BACKUPS, SECOND_BOTH, SECOND_BESIDE),
        "third": ([], [], THIRD_BOTH, THIRD_BESIDE),
        "ninth": (NINTH_LOADS, NINTH_BACKUPS, NINTH_BOTH, NINTH_BESIDE),
        "tenth": ([], [], TENTH_BOTH, []),
        "seventeenth": ([], SEVENTEENTH_BACKUPS, SEVENTEENTH_BOTH, []),
        "thirtyfourth": ([], [], THIRTYFOURTH_BOTH, [])}


#: (group, ``transfer_gpu.measure``'s sleep) of the 61-layer loads a candidate set times: after the
#: device sleep, then (``--from-call``) from the call on an idle and on a busy GPU.
LOAD_TIMINGS = (("load61", True), ("load61_from_call", False), ("load61_from_call_busy", "beside"))


def load_lag(engine):
    """A function that returns the load ring's ``IssueLag`` since now (``starved_units`` of
    ``lag_units``: units whose previous unit had landed when they were issued)."""
    engine = getattr(engine, "engine", engine)
    copier = engine.staging_copier("load") if engine.on_gpu else None
    if copier is None:
        return lambda: {}
    units, starved = copier.lag.units, copier.lag.starved
    return lambda: {"lag_units": copier.lag.units - units, "starved_units": copier.lag.starved - starved}


def candidate_probe(args, b, engine, hosts, page_sets, slot_sets, sets, check_load, add, ceiling, h2d, d2h, transfer_bytes, skip):
    """The sixth and later probes (``CANDIDATE_SETS``): every candidate checked, then idle loads,
    load + backup and beside compute."""
    spec = b.spec
    made = {}
    candidates = CANDIDATE_SETS[args.set]
    hosts = {layout: host for layout, host in hosts.items() if layout in args.layouts.split(",")}
    kinds = tuple(args.slots.split(","))
    for name, path, options, kwargs, change in candidates:
        for layout in hosts:
            e = engine(layout, path, **kwargs)
            made[(layout, name)] = PolicyVariant(e, change) if change is not None else e
            for kind in kinds:
                check_load(name, layout, made[(layout, name)], options, kind)
    if "load61" not in skip:
        for name, path, options, kwargs, change in candidates:
            for layout in hosts:
                e = made[(layout, name)]
                for kind in kinds:
                    # After the sleep, and with ``--from-call`` also from the call on an idle GPU and
                    # on one kept busy beside the load.
                    for group, sleep in LOAD_TIMINGS[:3 if args.from_call else 1]:
                        lag = load_lag(e)
                        t = tg.measure(lambda i: [e.load(slot_sets[kind][i % sets], page_sets[i % sets], options=options)],
                                       b.reps, sleep=sleep, engine=e)
                        row = add(f"{group.replace('_', ' ')} {name} {layout} {kind}", transfer_bytes, t, group=group,
                                  path=name, layout=layout, slots=kind,
                                  frac_of_ceiling=transfer_bytes / t["ms"] / 1e6 / ceiling["load61"],
                                  issue_share=t["issue_ms"] / t["ms"], **lag())
                        if "lag_units" in row:
                            print(f"    {group}: {row['starved_units']} of {row['lag_units']} copy-engine units issued after "
                                  "the one before landed", flush=True)
    if "backup" not in skip and args.from_call:
        # ``auto`` backups timed three ways, in turn per rep set: after the sleep, from the call on an
        # idle GPU, from the call on a busy one (a backup is issued on the caller's thread).
        for layout in hosts:
            e = made[(layout, "auto")]
            for kind in kinds:
                for rnd in range(args.backup_rounds):
                    for group, sleep in (("backup", True), ("backup_from_call", False), ("backup_from_call_busy", "beside")):
                        t = tg.measure(lambda i: [e.backup(page_sets[i % sets], slot_sets[kind][i % sets])], b.reps,
                                       sleep=sleep, engine=e)
                        add(f"{group.replace('_', ' ')} auto {layout} {kind} round {rnd}", transfer_bytes, t, group=group,
                            path="auto", layout=layout, slots=kind, round=rnd,
                            frac_of_ceiling=transfer_bytes / t["ms"] / 1e6 / d2h["gbps"])
    if "both" not in skip:
        for kind in kinds:
            beside = tg.backup_sets_beside(args, page_sets, slot_sets[kind], scattered=kind == "scattered")
            nbytes = int(transfer_bytes + statistics.mean(p.numel() for p, _ in beside) * spec.page_bytes)
            for name, path, options, kwargs, change in candidates:
                if path != "auto":
                    continue
                for layout in hosts:
                    le, be = made[(layout, name)], engine(layout, "auto")

                    def issue(i, le=le, be=be):
                        k = i % sets
                        bh = be.backup(*beside[k])
                        return [bh, le.load(slot_sets[kind][k], page_sets[k], options=options)]
                    t = tg.measure(issue, b.reps)
                    add(f"both {name} {layout} {kind}", nbytes, t, group="both", path=name, layout=layout, slots=kind,
                        vs_one_direction=nbytes / t["ms"] / 1e6 / max(h2d["gbps"], d2h["gbps"]))
                    print("    each rep (ms):", " ".join(f"{ms:.1f}" for ms in t["ms_each"]), flush=True)
    if "beside" not in skip:
        tg.BESIDE = [(name, name, options) for name, _, options, _, _ in candidates]
        tg.beside_compute(b, made, hosts, page_sets, slot_sets, sets, reps=args.beside_reps, kinds=kinds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/benchmarks/serving_probe.json")
    parser.add_argument("--reps", type=int, default=6)
    tg.add_shape_arguments(parser)
    parser.add_argument("--set", choices=sorted(SETS | CANDIDATE_SETS), default="second", help="which probe's candidates")
    parser.add_argument("--beside-reps", type=int, default=3, help="repetitions of each beside-compute measurement")
    parser.add_argument("--both-slots", default="scattered", help="host slots of the load + backup group (scattered, runs)")
    parser.add_argument("--both-order", choices=("backup", "load"), default="backup",
                        help="which of the load + backup pair is issued first (named sets)")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval for the beside-compute group (seconds; default Python's 0.005)")
    parser.add_argument("--layouts", default="page_first,layer_first",
                        help="host layouts a candidate set measures (candidate sets only)")
    parser.add_argument("--slots", default="runs,scattered", help="host slots a candidate set measures (runs, scattered)")
    parser.add_argument("--backup-rounds", type=int, default=2,
                        help="with --from-call: rounds of auto backups timed after the sleep / from the call idle / busy")
    parser.add_argument("--from-call", action="store_true",
                        help="candidate sets: also time each 61-layer load from the call (no device sleep before it)")
    parser.add_argument("--skip", default="", help="comma-separated groups to skip (load61,backup,both,beside)")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    LOADS, BACKUPS, BOTH, BESIDE = SETS.get(args.set, ([], [], [], []))  # candidate sets: candidate_probe
    started = time.perf_counter()
    torch.manual_seed(0)
    b = tg.Bench(args)
    spec, n = b.spec, args.pages
    transfer_bytes = n * spec.page_bytes
    layer_bytes = n * sum(c.bytes_per_layer for c in spec.components)
    h2d, d2h, both, layer_h2d, _ = tg.measure_ceilings(b, layer_bytes)
    torch.cuda.empty_cache()
    ceiling = {"backup": d2h["gbps"], "load61": h2d["gbps"]}
    device_pool, hosts = tg.random_pools(spec, args)
    engines: dict[tuple, TransferEngine] = {}

    def engine(layout: str, path: str, **kwargs) -> TransferEngine:
        key = (layout, path, tuple(sorted(kwargs.items())))
        if key not in engines:
            engines[key] = TransferEngine(device_pool, hosts[layout], path=path, timing=True, **kwargs)
        return engines[key]

    sets = 4
    page_sets, slot_sets = tg.id_sets(args, sets)
    checks: list[dict] = []

    def check_load(name, layout, e, options, slots_kind="scattered") -> None:
        ok = tg.load_copies_every_byte(e, device_pool, hosts[layout], slot_sets[slots_kind][0], page_sets[0], options)
        checks.append({"what": f"load {name} {layout} {slots_kind}", "ok": ok})
        print(f"check load {name} {layout} {slots_kind}: {'ok' if ok else 'WRONG BYTES'}", flush=True)

    def check_backup(name, layout, e, options, slots_kind="scattered") -> None:
        ok = tg.backup_copies_every_byte(e, device_pool, hosts[layout], page_sets[1], slot_sets[slots_kind][1], options)
        checks.append({"what": f"backup {name} {layout} {slots_kind}", "ok": ok})
        print(f"check backup {name} {layout} {slots_kind}: {'ok' if ok else 'WRONG BYTES'}", flush=True)

    def add(name, nbytes, timing, **fields):
        return b.add(name, nbytes, timing, **fields)

    def save(done=False):
        out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "complete": done,
               "device": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": b.reps,
               "ceiling_gbps": {"h2d": h2d["gbps"], "d2h": d2h["gbps"], "both": both["gbps"]},
               "wall_s": time.perf_counter() - started, "checks": checks, "results": b.results}
        Path(args.out).write_text(json.dumps(out, indent=1))

    if args.set in CANDIDATE_SETS:
        candidate_probe(args, b, engine, hosts, page_sets, slot_sets, sets, check_load, add, ceiling, h2d, d2h, transfer_bytes, skip)
        save(done=True)
        print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")
        for host in hosts.values():
            host.close()
        return 0 if all(c["ok"] for c in checks) else 1

    # --- 61-layer loads of scattered page_first slots -------------------------------------------
    if "load61" not in skip:
        for name, path, options, kwargs in LOADS:
            for layout in hosts:
                e = engine(layout, path, **kwargs)
                check_load(name, layout, e, options)
                for slots_kind in ("scattered",):
                    t = tg.measure(lambda i: [e.load(slot_sets[slots_kind][i % sets], page_sets[i % sets], options=options)],
                                   b.reps)
                    add(f"load61 {name} {layout} {slots_kind}", transfer_bytes, t, group="load61", path=name, layout=layout,
                        slots=slots_kind, frac_of_ceiling=transfer_bytes / t["ms"] / 1e6 / ceiling["load61"],
                        issue_share=t["issue_ms"] / t["ms"])
        save()

    # --- backups of scattered slots -------------------------------------------------------------
    if "backup" not in skip:
        for layout in hosts:
            for name, path, options in BACKUPS:
                e = engine(layout, path)
                check_backup(name, layout, e, options)
                # The handle, not its event: a threaded backup's event waits for its threads' issue.
                t = tg.measure(lambda i: [e.backup(page_sets[i % sets], slot_sets["scattered"][i % sets], options=options)],
                               b.reps)
                add(f"backup {name} {layout} scattered", transfer_bytes, t, group="backup", path=name, layout=layout,
                    slots="scattered", frac_of_ceiling=transfer_bytes / t["ms"] / 1e6 / ceiling["backup"])
                print(f"    issue {t['issue_ms']:.1f} ms, cpu {t['cpu_ms']:.1f} ms", flush=True)
        save()

    # --- load + backup at once, scattered slots -------------------------------------------------
    if "both" not in skip:
        kind = args.both_slots
        beside = tg.backup_sets_beside(args, page_sets, slot_sets[kind], scattered=kind == "scattered")
        backup_bytes = statistics.mean(p.numel() for p, _ in beside) * spec.page_bytes
        nbytes = int(transfer_bytes + backup_bytes)
        for layout in hosts:
            for name, load_path, load_options, backup_path, backup_options in BOTH:
                le, be = engine(layout, load_path), engine(layout, backup_path)
                check_load(name, layout, le, load_options, kind)
                check_backup(name, layout, be, backup_options, kind)

                def issue(i, le=le, be=be, lo=load_options, bo=backup_options):
                    k = i % sets
                    return tg.issue_pair(lambda: le.load(slot_sets[kind][k], page_sets[k], options=lo),
                                         lambda: be.backup(*beside[k], options=bo), f"{args.both_order} first")
                t = tg.measure(issue, b.reps)
                add(f"both {name} {layout} {kind}", nbytes, t, group="both", path=name, layout=layout, slots=kind,
                    vs_one_direction=nbytes / t["ms"] / 1e6 / max(h2d["gbps"], d2h["gbps"]))
                print("    each rep (ms):", " ".join(f"{ms:.1f}" for ms in t["ms_each"]),
                      f"| issue {t['issue_ms']:.1f} ms, cpu {t['cpu_ms']:.1f} ms", flush=True)
        save()

    # --- beside compute ---------------------------------------------------------------------------
    if "beside" not in skip:
        table, keyed = [], {}
        for name, path, options, kwargs in BESIDE:
            for layout in hosts:
                keyed[(layout, name)] = engine(layout, path, **kwargs)
            table.append((name, name, options))
        tg.BESIDE = table
        if args.switch_interval is not None:
            sys.setswitchinterval(args.switch_interval)
        tg.beside_compute(b, keyed, hosts, page_sets, slot_sets, sets, reps=args.beside_reps)
    save(done=True)
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")
    for host in hosts.values():
        host.close()
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
