"""CPU cost of issuing a staged 61-layer load through the staging ring, copies and kernels left out.

A staged load's library thread plans units, builds their kernel tables, uploads them and enqueues
copies and launches; beside the model's compute, every millisecond of that thread can make a layer
late. This script times what is left of a CPU engine's ``mixed`` load when the ring's copy-engine
copies, its kernel launches and the engine's own UVA launches do nothing: the planning and
bookkeeping, which run the same Python on a GPU machine (the H200's host runs this Python about
3x slower than this repository's CPU machine). No device and no bytes: the numbers compare code
versions on one machine, not hosts.

    python3 benchmarks/ring_issue_cpu.py [--layout layer_first] [--loads 100] [--pages 512]
        [--json out.json]

Never imported by the library or the tests' fixtures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiered_kv import HostPool, allocate_engine_like, nsa_spec  # noqa: E402
from tiered_kv.kernels import staged_copy, uva_copy  # noqa: E402
from tiered_kv.transfers.engine import TransferEngine, TransferOptions  # noqa: E402
from tiered_kv.transfers.policy import MIXED_LOADS  # noqa: E402


def _nothing(*args, **kwargs) -> None:
    return None


@contextmanager
def copies_left_out():
    """The ring's copy-engine copies, its kernel launches and the engine's UVA launches do nothing."""
    saved = [(staged_copy, "launch_uva"), (uva_copy, "launch_uva"), (staged_copy.StagedCopier, "_engine_copies"),
             (TransferEngine, "_uva")]
    originals = [getattr(owner, name) for owner, name in saved]
    try:
        for owner, name in saved:
            setattr(owner, name, _nothing)
        yield
    finally:
        for (owner, name), original in zip(saved, originals):
            setattr(owner, name, original)


def measure(layout: str, loads: int, pages: int, layers: int = 61, rounds: int = 5) -> dict:
    """Median ms per load over ``rounds`` rounds of ``loads`` loads of ``pages`` pages in one run
    of host slots (``MIXED_LOADS``' split for the layout: the ring's staged body)."""
    spec = nsa_spec(num_layers=layers, page_size=64)
    device = allocate_engine_like(spec, pages + 1, "cpu")
    host = HostPool(spec, pages, layout)
    engine = TransferEngine(device, host, path="mixed")
    slots, device_pages = torch.arange(pages), torch.randperm(pages) + 1
    options = TransferOptions(load_split=MIXED_LOADS[(layout == "layer_first", True)])
    per_round = []
    try:
        with copies_left_out():
            for _ in range(3):
                engine.load(slots, device_pages, options=options).synchronize()
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(loads):
                    engine.load(slots, device_pages, options=options).synchronize()
                per_round.append((time.perf_counter() - t0) / loads * 1e3)
    finally:
        engine.close()
        host.close()
    return {"layout": layout, "pages": pages, "layers": layers, "loads": loads, "ms_per_load": statistics.median(per_round),
            "ms_rounds": per_round}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=("layer_first", "page_first"), default="layer_first")
    parser.add_argument("--loads", type=int, default=100)
    parser.add_argument("--pages", type=int, default=512)
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args()
    if args.loads < 1 or args.pages < 1 or args.layers < 1:
        parser.error("--loads, --pages and --layers must be at least 1")
    row = measure(args.layout, args.loads, args.pages, args.layers)
    row.update({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
                "machine": platform.processor() or platform.machine(), "cores": os.cpu_count()})
    print(f"{args.layout}: {row['ms_per_load']:.2f} ms of issue per {args.layers}-layer load of {args.pages} pages "
          f"(median of 5 rounds of {args.loads}; rounds {', '.join(f'{x:.2f}' for x in row['ms_rounds'])})")
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
