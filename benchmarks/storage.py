"""Run ``tiered-kv bench storage`` for several backend URLs and write docs/benchmarks/storage.json.

Usage: ``python benchmarks/storage.py URL [URL ...] [--pages N] [--repeat N]``, e.g.
``python benchmarks/storage.py file:///mnt/nvme/kv redis://127.0.0.1:6379/0``. Servers must be
running; for Redis give it ``maxmemory`` above pages x 3 MB and ``proto-max-bulk-len`` >= 4 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from tiered_kv.ops.bench.storage import measure

OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "storage.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--pages", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    results = {}
    if OUT.exists():
        results = json.loads(OUT.read_text())
    for url in args.urls:
        result = asyncio.run(measure(url, pages=args.pages, batch=args.batch, concurrency=args.concurrency, raw=True,
                                     repeat=args.repeat, warmup=args.warmup))
        results[url.split("://", 1)[0]] = result
        print(json.dumps({k: v for k, v in result.items() if k != "rounds"}))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
