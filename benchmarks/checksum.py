"""Checksum throughput for page records, on threads (the codec releases the GIL).

Hashes DeepSeek-V3.2 records (3,076,352 B payload) from a working set larger than the CPU caches,
on 1..N threads, for xxh3-64, xxh3-128, crc32c (if installed) and zlib.crc32, and prints GB/s as a
Markdown table (``--json`` for one JSON object). Usage: ``python benchmarks/checksum.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import xxhash

PAGE = 3_076_352


def candidates() -> dict:
    out = {"xxh3_64": xxhash.xxh3_64_intdigest, "xxh3_128": xxhash.xxh3_128_digest, "zlib.crc32": zlib.crc32}
    try:
        import crc32c

        out["crc32c"] = crc32c.crc32c
    except ImportError:
        pass
    return out


def measure(fn, pages: list[memoryview], threads: int, rounds: int) -> float:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, pages[:threads]))  # warm up
        start = time.perf_counter()
        for _ in range(rounds):
            list(pool.map(fn, pages))
        elapsed = time.perf_counter() - start
    return rounds * len(pages) * PAGE / elapsed / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pages", type=int, default=96, help="working set in pages (default 96 = 295 MB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    data = np.random.default_rng().integers(0, 256, args.pages * PAGE, dtype=np.uint8)
    pages = [memoryview(data[i * PAGE:(i + 1) * PAGE]) for i in range(args.pages)]
    thread_counts = sorted({1, os.cpu_count() or 1})
    results = {name: {t: measure(fn, pages, t, args.rounds) for t in thread_counts} for name, fn in candidates().items()}
    if args.json:
        print(json.dumps({"page_bytes": PAGE, "gbps": results}))
        return
    print("| checksum | " + " | ".join(f"{t} thread{'s' if t > 1 else ''} GB/s" for t in thread_counts) + " |")
    print("|---|" + "---|" * len(thread_counts))
    for name, row in results.items():
        print(f"| {name} | " + " | ".join(f"{row[t]:.1f}" for t in thread_counts) + " |")


if __name__ == "__main__":
    main()
