"""The hierarchy's CPU costs and the controller's throughput against the bare backend.

Usage: ``python benchmarks/hierarchy.py [--pages 64] [--rounds 5] [--backends file,redis]``.

1. ``page_keys`` of a 128k-token prompt (DeepSeek-V3.2 spec, page 64: 2,048 keys), from a numpy
   array and from a Python list. Target <= 5 ms.
2. ``CacheManager.lookup`` of that prompt with 1M pages indexed on L2 (no L3: the round trip is
   excluded). Target <= 2 ms.
3. ``--pages`` DeepSeek-V3.2 pages (61 layers, 3 MB each) L3 -> L2 through the ``L3Controller``
   (prefetch) and L2 -> L3 (backup) against the same backend class's bare ``get_into`` /
   ``put_from`` of the same pages in the same run, alternating per round, fresh keys per round
   (puts are put-if-absent). Redis runs on a ``redis-server`` this script starts on loopback; the
   file backend writes under a temp dir on the root disk. Target: controller >= 90% of bare.

Prints one JSON object; the numbers go to docs/benchmarks.md ("Hierarchy").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tiered_kv import HostPool, model_spec  # noqa: E402
from tiered_kv.backends import open_backend  # noqa: E402
from tiered_kv.hierarchy import CacheManager, L3Controller  # noqa: E402
from tiered_kv.model.keys import Namespace, page_keys  # noqa: E402
from tiered_kv.model.slot_allocator import SlotAllocator  # noqa: E402

TOKENS = 128 * 1024


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def bench_keys(spec) -> dict:
    ns = Namespace.for_spec(spec, "deepseek-ai/DeepSeek-V3.2")
    tokens = np.random.default_rng(0).integers(0, 129_280, TOKENS)
    listed = tokens.tolist()
    page_keys(ns, tokens)
    return {"pages": TOKENS // spec.page_size,
            "ndarray_ms": median_ms(lambda: page_keys(ns, tokens), 30),
            "list_ms": median_ms(lambda: page_keys(ns, listed), 30)}


def bench_match(spec, indexed: int = 1 << 20) -> dict:
    ns = Namespace.for_spec(spec, "deepseek-ai/DeepSeek-V3.2")
    keys = page_keys(ns, np.random.default_rng(1).integers(0, 129_280, TOKENS))
    alloc = SlotAllocator(indexed)
    mgr = CacheManager(alloc, page_size=spec.page_size)
    slots = alloc.allocate(indexed)
    t0 = time.perf_counter()
    index = mgr.index
    for i, slot in enumerate(slots[:indexed - len(keys)]):
        index.add_resident(f"{i:032x}", slot)
    for k, slot in zip(keys, slots[indexed - len(keys):]):
        index.add_resident(k, slot)
    fill_s = time.perf_counter() - t0
    match = mgr.lookup("r", keys)
    assert match.l2_pages == len(keys), match
    rid = iter(range(10**9))
    ms = median_ms(lambda: mgr.lookup(next(rid), keys), 30)
    return {"indexed_pages": indexed, "prompt_pages": len(keys), "lookup_ms": ms, "index_fill_s": fill_s}


async def _bare(url: str, pool: HostPool, options: dict, op: str, keys, slots) -> float:
    async with open_backend(url, pool, **options) as backend:
        if op == "get":
            assert await backend.exists(keys) == len(keys)
        t0 = time.perf_counter()
        result = await (backend.get_into(keys, slots) if op == "get" else backend.put_from(keys, slots))
        elapsed = time.perf_counter() - t0
        assert all(result), f"bare {op} failed"
        return elapsed


def bench_backend(name: str, url: str, options: dict, spec, pages: int, rounds: int) -> dict:
    pool = HostPool(spec, 2 * pages)
    src = pool.allocate(pages)
    dst = pool.allocate(pages)
    payload = np.random.default_rng(2).integers(0, 256, spec.page_bytes, dtype=np.uint8).tobytes()
    controller = L3Controller(lambda: open_backend(url, pool, **options), record_bytes=pool.record_bytes)
    nbytes = pages * pool.record_bytes
    out = {"put": {"bare": [], "controller": []}, "get": {"bare": [], "controller": []}}
    try:
        for rnd in range(rounds + 1):  # round 0 warms up and is not counted
            for who in (("bare", "controller") if rnd % 2 else ("controller", "bare")):
                keys = [secrets.token_hex(16) for _ in range(pages)]
                for k, s in zip(keys, src):
                    view = pool.record_view(s)
                    view[len(view) - len(payload):] = payload
                    pool.seal(s, k)
                if who == "bare":
                    put_s = asyncio.run(_bare(url, pool, options, "put", keys, src))
                    get_s = asyncio.run(_bare(url, pool, options, "get", keys, dst))
                else:
                    t0 = time.perf_counter()
                    assert all(controller.put_from(keys, src).result(120))
                    put_s = time.perf_counter() - t0
                    assert controller.exists(keys).result(60) == pages
                    t0 = time.perf_counter()
                    assert all(controller.get_into(keys, dst).result(120))
                    get_s = time.perf_counter() - t0
                if rnd:
                    out["put"][who].append(nbytes / put_s / 1e9)
                    out["get"][who].append(nbytes / get_s / 1e9)
    finally:
        controller.close()
        pool.free(src + dst)
        pool.close()
    summary = {"pages": pages, "page_bytes": pool.record_bytes}
    for op in ("get", "put"):
        bare, ctl = statistics.median(out[op]["bare"]), statistics.median(out[op]["controller"])
        # Paired too: the same round's two sides share the server's and the disk's state (Redis
        # grows its heap in the first rounds, then evicts), so their ratio varies far less than
        # either side alone; the storage bench reports its per-round ratio the same way.
        paired = statistics.median(c / b for c, b in zip(out[op]["controller"], out[op]["bare"]))
        summary[op] = {"bare_GBps": round(bare, 3), "controller_GBps": round(ctl, 3), "ratio": round(ctl / bare, 3),
                       "per_round_ratio": round(paired, 3),
                       "rounds": {k: [round(x, 3) for x in v] for k, v in out[op].items()}}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backends", default="file,redis")
    args = parser.parse_args()
    spec = model_spec("deepseek-v3.2")
    result = {"keys_128k": bench_keys(spec), "match_128k_1M": bench_match(spec)}
    print(json.dumps(result), flush=True)
    wanted = args.backends.split(",")
    if "file" in wanted:
        with tempfile.TemporaryDirectory(prefix="tkv-bench-", dir=str(Path.home())) as d:
            result["file"] = bench_backend("file", f"file://{d}/l3", {}, spec, args.pages, args.rounds)
            print(json.dumps({"file": result["file"]}), flush=True)
    if "redis" in wanted:
        from tests.backends.redis_server import RedisServer

        with RedisServer(maxmemory="2gb") as server:
            result["redis"] = bench_backend("redis", server.url, {}, spec, args.pages, args.rounds)
            print(json.dumps({"redis": result["redis"]}), flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
