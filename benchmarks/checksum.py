"""Checksum and keyed-tag throughput for page records, on threads (the codecs release the GIL).

Hashes DeepSeek-V3.2 records (3,076,352 B payload) from a working set larger than the CPU caches,
on 1..N threads, for the plain checksums (xxh3-64, xxh3-128, crc32c if installed, zlib.crc32) and
the keyed tags a tenant's secret adds (HMAC-SHA256-128, what keyed records carry, through
``RecordKey.tag``; keyed BLAKE2b-128 from hashlib, the alternative measured against it), and prints
GB/s and pages/s as a Markdown table (``--json`` for one JSON object). Two more rows time what a
reader pays per record, ``record.verify`` of whole records (header checks included), plain and
keyed. "Per core" figures divide by the CPU time of the hashing thread (``time.thread_time``), so
other processes on a shared machine do not lower them; the thread columns are wall-clock
throughput. Each figure is the best of ``--repeat`` runs. Usage: ``python benchmarks/checksum.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import xxhash

from tiered_kv import nsa_spec
from tiered_kv.model import record
from tiered_kv.model.record_key import RecordKey

SPEC = nsa_spec(num_layers=61)  # DeepSeek-V3.2
PAGE = SPEC.page_bytes
assert PAGE == 3_076_352


def candidates() -> dict:
    out = {"xxh3_64": xxhash.xxh3_64_intdigest, "xxh3_128": xxhash.xxh3_128_digest, "zlib.crc32": zlib.crc32}
    try:
        import crc32c

        out["crc32c"] = crc32c.crc32c
    except ImportError:
        pass
    secret = os.urandom(32)
    blake_key = hashlib.blake2b(secret, digest_size=32).digest()
    out["hmac-sha256-128 (keyed tag)"] = RecordKey(secret).tag
    out["blake2b-128 keyed"] = lambda b: hashlib.blake2b(b, key=blake_key, digest_size=16).digest()
    return out


def verifiers(records: list[memoryview], secret: bytes) -> dict:
    """``record.verify`` of every record, plain and keyed: each seals the records its way first
    (headers only) and returns the function the timing runs."""
    key = RecordKey(secret)

    def sealed(record_key):
        for i, rec in enumerate(records):
            record.write_header(rec[:record.HEADER_BYTES], fingerprint=SPEC.fingerprint, key=f"page-{i}",
                                payload=rec[record.HEADER_BYTES:], record_key=record_key)
        index = {id(rec): i for i, rec in enumerate(records)}
        return lambda rec: record.verify(rec, fingerprint=SPEC.fingerprint, key=f"page-{index[id(rec)]}",
                                         payload_len=PAGE, record_key=record_key)

    return {"record.verify plain (xxh3-128)": lambda: sealed(None),
            "record.verify keyed (hmac-sha256-128)": lambda: sealed(key)}


def measure(fn, pages: list[memoryview], threads: int, rounds: int) -> float:
    """GB/s of ``fn`` over every page, ``rounds`` times, on ``threads`` threads."""
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, pages[:threads]))  # warm up
        start = time.perf_counter()
        for _ in range(rounds):
            list(pool.map(fn, pages))
        elapsed = time.perf_counter() - start
    return rounds * len(pages) * PAGE / elapsed / 1e9


def measure_cpu(fn, items: list[memoryview], rounds: int) -> float:
    """GB/s per core: bytes hashed over the CPU seconds this thread spent hashing them."""
    fn(items[0])  # warm up
    start = time.thread_time()
    for _ in range(rounds):
        for item in items:
            fn(item)
    return rounds * len(items) * PAGE / (time.thread_time() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pages", type=int, default=96, help="working set in pages (default 96 = 295 MB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many measurements (default 3)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stride = record.HEADER_BYTES + PAGE
    data = np.random.default_rng().integers(0, 256, args.pages * stride, dtype=np.uint8)
    records = [memoryview(data[i * stride:(i + 1) * stride]) for i in range(args.pages)]
    pages = [rec[record.HEADER_BYTES:] for rec in records]
    thread_counts = sorted({1, os.cpu_count() or 1})
    columns = ["core", *thread_counts]  # "core": per core, by CPU time

    def row(fn, items) -> dict:
        out = {"core": max(measure_cpu(fn, items, args.rounds) for _ in range(args.repeat))}
        out.update({t: max(measure(fn, items, t, args.rounds) for _ in range(args.repeat)) for t in thread_counts})
        return out

    results = {name: row(fn, pages) for name, fn in candidates().items()}
    for name, prepare in verifiers(records, os.urandom(32)).items():
        results[name] = row(prepare(), records)
    per_s = {name: {c: gbps * 1e9 / PAGE for c, gbps in r.items()} for name, r in results.items()}
    if args.json:
        print(json.dumps({"page_bytes": PAGE, "gbps": results, "pages_per_s": per_s}))
        return
    names = {"core": "per core"} | {t: f"{t} thread{'s' if t > 1 else ''}" for t in thread_counts}
    heads = [f"{names[c]} {unit}" for c in columns for unit in ("GB/s", "pages/s")]
    print("| checksum | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(heads))
    for name, r in results.items():
        cells = [f"{r[c]:.2f} | {per_s[name][c]:,.0f}" for c in columns]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
