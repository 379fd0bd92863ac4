"""Probe: ``auto`` backups and 61-layer loads with host slots in short runs, the staging ring's
batch decision of now against the one before, in one run with its ceilings.

The ring sends a unit's copy-engine copies as one ``cudaMemcpyBatchAsync`` when they are many and
short. It used to count a dense copy (a run of ``layer_first`` rows) as one row per slot, so slots
in runs of 16 went out as one ``cudaMemcpy2DAsync`` per (run, component, layer); it now counts the
1-D copies the batch would hold (``staged_copy._batch_rows``). ``before`` swaps the old count back
in around each call; ``rows 16`` is a candidate that batches pitched copies of short runs row by row
too (``RULES``). Every variant's bytes are checked once before it is timed.

    python3 benchmarks/short_runs_probe.py [--reps 6] [--out short_runs_probe.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transfer_gpu as tg  # noqa: E402  (Bench, measure, pools, id sets)

from tiered_kv.kernels import staged_copy  # noqa: E402
from tiered_kv.transfers.engine import LoadSplit, TransferEngine, TransferOptions  # noqa: E402
from tiered_kv.transfers.policy import SCATTERED_LOADS  # noqa: E402

KINDS = ("runs of 16", "runs of 32", "runs of 64", "runs", "runs of 4", "scattered")
runs_of = tg.runs_of  # the slot kinds of ``transfer_gpu.id_sets``, of any run length


def _old_count(copies) -> int:
    return int(copies[:, 5].sum())  # every copy by its rows, dense or not


#: The staging ring's batch decision per rule: (the rows count, the most rows per copy on average,
#: the fewest copies a load's batch takes, the fewest a backup's takes; None: the library's). The
#: rules other than ``now`` pin all four, as each was measured. ``min 4``: units of 4 copies and
#: more batch in both directions (for ``layer_first`` runs of 64: 8 dense runs per layer, 14-16
#: copies a unit, mostly under 16); the library took it for loads only.
#: ``now``: the library's; ``before``: the count of before the eighth session (a dense copy counted
#: by its rows); ``rows N``: pitched copies of up to N rows on average batched row by row too (for
#: ``page_first`` slots in short runs: one ``cudaMemcpy2DAsync`` cost about 21 us of issue in the
#: ``before`` rows, a row of a batch about 1.3 us, ``batch3d_probe``).
RULES = {"now": (None, None, None, None), "before": (_old_count, 2, 16, 16), "rows 2": (None, 2, 16, 16),
         "rows 16": (None, 16, 16, 16), "rows 64": (None, 64, 16, 16), "min 4": (None, 64, 4, 4)}
#: The rules the first part compares for every slot kind. ``rows 2`` is the eighth session's rule
#: (``BATCH_MAX_MEAN_ROWS`` 2), ``before`` the one before it; the library's is ``rows 64`` since the
#: ninth session's third probe.
SWEPT_RULES = ("now", "rows 2", "before")
#: ``page_first`` loads from slots in short runs, through ``mixed`` with the split ``auto`` gives
#: scattered slots (blocks of 8 layers: one 403 KB row per slot and block instead of a 42 KB row
#: per layer, so a tenth of the 2-D calls), with and without the ``rows 16`` rule; ``auto`` sends
#: runs of 8 and more through the per-layer split (83-85% of the ceiling, fourth round). The
#: ``per-layer split`` candidates give the ``mixed`` engine no options: ``MIXED_LOADS``' split for
#: slots in runs, which ``auto`` takes for runs of 8 and more (for runs of 4 it takes the blocks of
#: 8); ``short_runs_probe_third.json`` calls them "auto's split".
PAGE_FIRST_CANDIDATES = [
    ("per-layer split", None, "now"),
    ("per-layer split, rows 16", None, "rows 16"),
    ("per-layer split, rows 64", None, "rows 64"),
    ("blocks of 8 split", TransferOptions(load_split=SCATTERED_LOADS[False]), "now"),
    ("blocks of 8 split, rows 16", TransferOptions(load_split=SCATTERED_LOADS[False]), "rows 16"),
    ("blocks of 8 split, rows 64", TransferOptions(load_split=SCATTERED_LOADS[False]), "rows 64"),
    ("copy engines in blocks of 8 after a head of 4, rows 16",
     TransferOptions(load_split=LoadSplit(1.0, layers_per_copy=8, ramp=True, head_layers=4)), "rows 16"),
]


@contextmanager
def rule(name: str):
    """Swap the staging ring's batch decision for ``RULES[name]`` around a call; yields a count of
    the decisions taken inside (``{"batch": units sent as one memcpy batch, "2-D calls": units
    sent as one call per copy}``), so a run shows which branch each rule took."""
    count, max_rows, min_copies, min_to_host = RULES[name]
    saved = (staged_copy._batch_rows, staged_copy.BATCH_MAX_MEAN_ROWS, staged_copy.StagedCopier._batched,
             staged_copy.BATCH_MIN_COPIES, staged_copy.BATCH_MIN_COPIES_TO_HOST)
    decisions = {"batch": 0, "2-D calls": 0}

    def counted(copier, copies, to_device) -> bool:
        batched = saved[2](copier, copies, to_device)
        decisions["batch" if batched else "2-D calls"] += 1
        return batched
    staged_copy._batch_rows = count or saved[0]
    staged_copy.BATCH_MAX_MEAN_ROWS = max_rows or saved[1]
    staged_copy.BATCH_MIN_COPIES = min_copies or saved[3]
    staged_copy.BATCH_MIN_COPIES_TO_HOST = min_to_host or saved[4]
    staged_copy.StagedCopier._batched = counted
    try:
        yield decisions
    finally:
        (staged_copy._batch_rows, staged_copy.BATCH_MAX_MEAN_ROWS, staged_copy.StagedCopier._batched,
         staged_copy.BATCH_MIN_COPIES, staged_copy.BATCH_MIN_COPIES_TO_HOST) = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="short_runs_probe.json")
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--candidates-only", action="store_true",
                        help="skip the rules' sweep over both layouts; only the page_first candidates")
    parser.add_argument("--beside", default="", help="candidates (separated by ;) also measured beside compute "
                        "(transfer_gpu.beside_compute) with slots in runs of 16 and of 64")
    parser.add_argument("--beside-reps", type=int, default=6)
    parser.add_argument("--sweep-only", action="store_true", help="skip the page_first candidates")
    parser.add_argument("--rules", default=",".join(SWEPT_RULES), help="comma-separated rules of the sweep")
    tg.add_shape_arguments(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    b = tg.Bench(args)
    spec, n = b.spec, args.pages
    transfer_bytes = n * spec.page_bytes
    h2d, d2h, _, _, _ = tg.measure_ceilings(b, n * sum(c.bytes_per_layer for c in spec.components))
    torch.cuda.empty_cache()
    device_pool, hosts = tg.random_pools(spec, args)
    sets = 4
    page_sets, slot_sets = tg.id_sets(args, sets)
    slot_sets["runs of 64"] = [runs_of(64, n, args.host_slots) for _ in range(sets)]
    slot_sets["runs of 32"] = [runs_of(32, n, args.host_slots) for _ in range(sets)]
    checks = []

    def check(layout, host, engine, kind, name, decisions, options=None, backup=True) -> None:
        """Run the backup (if asked) and the load once each and compare every byte."""
        slots = slot_sets[kind][0]
        ok = not backup or tg.backup_copies_every_byte(engine, device_pool, host, page_sets[0], slots)
        ok = tg.load_copies_every_byte(engine, device_pool, host, slots, page_sets[1], options) and ok
        checks.append({"what": f"{layout} {kind} {name}", "ok": ok, "ring_units": dict(decisions)})
        print(f"check {layout} {kind} {name}: {'ok' if ok else 'WRONG BYTES'}, ring units {decisions}", flush=True)

    def time_load(layout, engine, kind, name, options=None, **fields) -> None:
        t = tg.measure(lambda i: [engine.load(slot_sets[kind][i % sets], page_sets[i % sets], options=options)], b.reps)
        b.add(f"load61 {layout} {kind} {name}", transfer_bytes, t, op="load61", layout=layout, slots=kind,
              frac_of_ceiling=transfer_bytes / t["ms"] / 1e6 / h2d["gbps"], **fields)

    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    unknown_rules = set(rules) - set(RULES)
    if unknown_rules:
        parser.error(f"unknown --rules: {sorted(unknown_rules)} (known: {sorted(RULES)})")
    for layout, host in hosts.items() if not args.candidates_only else ():
        engine = TransferEngine(device_pool, host, path="auto", timing=True)
        for kind in KINDS:
            for name in rules if kind != "scattered" else ("now",):
                with rule(name) as decisions:
                    check(layout, host, engine, kind, name, decisions)
                    t = tg.measure(lambda i: [engine.backup(page_sets[i % sets], slot_sets[kind][i % sets]).event], b.reps)
                    b.add(f"backup {layout} {kind} {name}", transfer_bytes, t, op="backup", layout=layout, slots=kind,
                          rule=name, frac_of_ceiling=transfer_bytes / t["ms"] / 1e6 / d2h["gbps"])
                    time_load(layout, engine, kind, name, rule=name)
        engine.close()

    # page_first loads from short runs through the splits of scattered slots (blocks of layers).
    mixed = TransferEngine(device_pool, hosts["page_first"], path="mixed", timing=True)
    beside = set(filter(None, (n.strip() for n in args.beside.split(";"))))
    for name, options, rule_name in PAGE_FIRST_CANDIDATES if not args.sweep_only else ():
        for kind in ("runs of 4", "runs of 16", "runs of 32", "runs of 64", "runs"):
            with rule(rule_name) as decisions:
                check("page_first", hosts["page_first"], mixed, kind, name, decisions, options, backup=False)
                time_load("page_first", mixed, kind, name, options, rule=rule_name, candidate=True)
        if name in beside:
            with rule(rule_name):
                tg.BESIDE = [(name, "mixed", options)]
                tg.beside_compute(b, {("page_first", "mixed"): mixed}, {"page_first": hosts["page_first"]}, page_sets,
                                  slot_sets, sets, reps=args.beside_reps, kinds=("runs of 16", "runs of 64"), rule=rule_name)
    unknown = beside - {name for name, _, _ in PAGE_FIRST_CANDIDATES}
    if unknown:
        print(f"unknown --beside candidates: {sorted(unknown)}", flush=True)
    mixed.close()
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "reps": b.reps, "ceiling_gbps": {"h2d": h2d["gbps"], "d2h": d2h["gbps"]},
           "checks": checks, "results": b.results}
    Path(args.out).write_text(json.dumps(out, indent=1))
    for host in hosts.values():
        host.close()
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
