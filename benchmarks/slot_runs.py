"""What host slots a running cache hands its GPU transfers: slot run lengths under a real trace.

``benchmarks/transfer_gpu.py`` times every path with host slots in one run, in runs of 4 and 16,
and scattered; which of those matters depends on what the L2 allocator hands out once the cache
has churned. This replays the Mooncake conversation trace (``../shared/traces``) through the
hierarchy on CPU (the embedded default, or any ``tiered-kv replay`` flags after ``--``) and records
every L1 <-> L2 transfer the hierarchy asks the engine for: its pages and the mean run of adjacent
host slots, the measure ``auto`` itself uses (``transfer_policy.is_scattered``: mean < 8 counts as
scattered). Prints, per direction and per quarter of the run, the share of pages in each class of
mean run, and writes the whole record as JSON.

    python3 benchmarks/slot_runs.py [--trace FILE] [--limit 600] [--out slot_runs.json] [-- replay flags]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from tiered_kv.ops.replay import cli as replay_cli
from tiered_kv.ops.replay.driver import replay
from tiered_kv.compose import build
from tiered_kv.transfers.engine import TransferEngine
from tiered_kv.transfers.policy import STAGED_MIN_MEAN_RUN, mean_host_run

TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "conversation_trace.jsonl"
#: Classes of a transfer's mean host-slot run, as ``transfer_gpu.py`` names its slot kinds.
CLASSES = [("scattered (< 2)", 0, 2), ("2-4", 2, 4), ("4-8 (runs of 4)", 4, STAGED_MIN_MEAN_RUN),
           ("8-32 (runs of 16)", STAGED_MIN_MEAN_RUN, 32), ("32-128", 32, 128), (">= 128 (runs)", 128, float("inf"))]


def mean_run(slots) -> float:
    """The mean run of adjacent host slots, as ``auto`` measures it (``transfer_policy.mean_host_run``)."""
    return mean_host_run(torch.as_tensor(np.asarray(slots, dtype=np.int64)))


class Recorder:
    """Wraps ``TransferEngine.load`` / ``backup`` for the run: (op, pages, mean run, when) per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, float, float]] = []
        self._started = time.perf_counter()
        self._load, self._backup = TransferEngine.load, TransferEngine.backup

    def __enter__(self) -> "Recorder":
        recorder = self

        def load(engine, host_slots, device_pages, **kwargs):
            recorder.note("load", host_slots)
            return recorder._load(engine, host_slots, device_pages, **kwargs)

        def backup(engine, device_pages, host_slots, **kwargs):
            recorder.note("backup", host_slots)
            return recorder._backup(engine, device_pages, host_slots, **kwargs)
        TransferEngine.load, TransferEngine.backup = load, backup
        return self

    def __exit__(self, *exc) -> None:
        TransferEngine.load, TransferEngine.backup = self._load, self._backup

    def note(self, op: str, host_slots) -> None:
        slots = list(host_slots)
        if slots:
            self.calls.append((op, len(slots), mean_run(slots), time.perf_counter() - self._started))


def shares(calls: list[tuple[str, int, float, float]]) -> dict[str, float]:
    """Share of the pages moved in each class of mean run."""
    total = sum(pages for _, pages, _, _ in calls) or 1
    return {name: round(sum(p for _, p, run, _ in calls if lo <= run < hi) / total, 4) for name, lo, hi in CLASSES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--limit", type=int, default=600, help="the trace's first N requests")
    parser.add_argument("--out", default="slot_runs.json")
    parser.add_argument("replay_flags", nargs=argparse.REMAINDER, help="after --: tiered-kv replay flags")
    args = parser.parse_args()
    flags = [f for f in args.replay_flags if f != "--"]
    replay_parser = argparse.ArgumentParser()
    replay_cli.add_arguments(replay_parser)
    replay_args = replay_parser.parse_args(["--trace", args.trace, "--limit", str(args.limit), "--quiet", *flags])
    settings = replay_cli.settings_from_args(replay_args)
    requests = replay_cli.workload_from_args(replay_args)
    h = build(settings)
    try:
        with Recorder() as recorder:
            result = replay(h, requests, inflight=replay_args.inflight)
    finally:
        h.close()
        h.release_memory()
    calls = recorder.calls
    quarters = np.array_split(np.arange(len(calls)), 4)
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.processor() or platform.machine(),
           "trace": args.trace, "requests": len(requests), "replay_flags": flags, "spec": settings.spec.describe(),
           "requests_done": len(result.requests), "wall_s": round(result.wall_s, 1),
           "classes": [name for name, _, _ in CLASSES],
           "by_op": {}, "calls": [list(c) for c in calls]}
    for op in ("load", "backup"):
        mine = [c for c in calls if c[0] == op]
        per_quarter = [shares([calls[i] for i in q if calls[i][0] == op]) for q in quarters]
        out["by_op"][op] = {"calls": len(mine), "pages": sum(c[1] for c in mine),
                            "mean_pages_per_call": round(sum(c[1] for c in mine) / max(1, len(mine)), 1),
                            "share_of_pages": shares(mine), "share_of_pages_by_quarter": per_quarter}
        print(f"{op}: {len(mine)} calls, {out['by_op'][op]['pages']} pages")
        for name, _, _ in CLASSES:
            row = " ".join(f"{q[name]:6.1%}" for q in per_quarter)
            print(f"  {name:20s} {out['by_op'][op]['share_of_pages'][name]:6.1%}   by quarter: {row}")
    Path(args.out).write_text(json.dumps(out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
