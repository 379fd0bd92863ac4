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
4. The same prefetch / backup through the job protocol, in the same rounds: ``L3Jobs`` over a
   ``LocalLink`` (the worker side in this process: what a ``CacheManager`` given a controller
   runs) and over a ``PipeLink`` (the worker side in a child process, jobs and results over a
   ``multiprocessing`` pipe; the pages there live in the child's own host pool). Target: the
   split >= 90% of one process.

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
from tiered_kv.hierarchy.l3_jobs import L3Jobs  # noqa: E402
from tiered_kv.hierarchy.links import local_l3  # noqa: E402
from tiered_kv.hierarchy.process_link import PipeLink, stack_worker  # noqa: E402
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


PAYLOAD_SEED = 2


def _seal(pool: HostPool, keys, slots) -> None:
    """The round's pages: one random payload under fresh keys, sealed."""
    payload = np.random.default_rng(PAYLOAD_SEED).integers(0, 256, pool.spec.page_bytes, dtype=np.uint8).tobytes()
    for k, s in zip(keys, slots):
        view = pool.record_view(s)
        view[len(view) - len(payload):] = payload
        pool.seal(s, k)


def bench_worker(spec, slots: int, url: str, options: dict):
    """The split's worker side (in the child): ``stack_worker`` plus a ``seal`` call for the pages."""
    parts = stack_worker(spec, slots, 0, url, options)
    pool = parts.worker.l3.backend.pool  # the child's host pool, which its backend reads and writes
    parts.calls["seal"] = lambda keys, slots: _seal(pool, keys, slots)
    return parts


def _through_jobs(jobs: L3Jobs, keys, src, dst, pages: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    assert all(jobs.put_from(keys, src).result(120))
    put_s = time.perf_counter() - t0
    assert jobs.exists(keys).result(60) == pages
    t0 = time.perf_counter()
    assert all(jobs.get_into(keys, dst).result(120))
    return put_s, time.perf_counter() - t0


def bench_backend(name: str, url: str, options: dict, spec, pages: int, rounds: int) -> dict:
    pool = HostPool(spec, 2 * pages)
    src = pool.allocate(pages)
    dst = pool.allocate(pages)
    controller = L3Controller(lambda: open_backend(url, pool, **options), record_bytes=pool.record_bytes)
    one_process = local_l3(L3Controller(lambda: open_backend(url, pool, **options), record_bytes=pool.record_bytes))
    link = PipeLink(bench_worker, spec, 2 * pages, url, options)
    split = L3Jobs(link)
    nbytes = pages * pool.record_bytes
    contenders = ("bare", "controller", "one_process", "split")
    out = {op: {who: [] for who in contenders} for op in ("put", "get")}
    try:
        for rnd in range(rounds + 1):  # round 0 warms up and is not counted
            for who in (contenders if rnd % 2 else contenders[::-1]):
                keys = [secrets.token_hex(16) for _ in range(pages)]
                if who == "split":
                    link.call("seal", keys, src)
                else:
                    _seal(pool, keys, src)
                if who == "bare":
                    put_s = asyncio.run(_bare(url, pool, options, "put", keys, src))
                    get_s = asyncio.run(_bare(url, pool, options, "get", keys, dst))
                elif who == "controller":
                    t0 = time.perf_counter()
                    assert all(controller.put_from(keys, src).result(120))
                    put_s = time.perf_counter() - t0
                    assert controller.exists(keys).result(60) == pages
                    t0 = time.perf_counter()
                    assert all(controller.get_into(keys, dst).result(120))
                    get_s = time.perf_counter() - t0
                else:
                    put_s, get_s = _through_jobs(one_process if who == "one_process" else split, keys, src, dst, pages)
                if rnd:
                    out["put"][who].append(nbytes / put_s / 1e9)
                    out["get"][who].append(nbytes / get_s / 1e9)
    finally:
        controller.close()
        one_process.close()
        split.close()
        pool.free(src + dst)
        pool.close()
    summary = {"pages": pages, "page_bytes": pool.record_bytes}
    for op in ("get", "put"):
        medians = {who: statistics.median(out[op][who]) for who in contenders}
        # Paired too: the same round's sides share the server's and the disk's state (Redis
        # grows its heap in the first rounds, then evicts), so their ratio varies far less than
        # either side alone; the storage bench reports its per-round ratio the same way.
        def paired(a: str, b: str, op: str = op) -> float:
            return round(statistics.median(x / y for x, y in zip(out[op][a], out[op][b])), 3)

        summary[op] = {**{f"{who}_GBps": round(v, 3) for who, v in medians.items()},
                       "ratio": round(medians["controller"] / medians["bare"], 3),
                       "per_round_ratio": paired("controller", "bare"),
                       "one_process_vs_bare": paired("one_process", "bare"),
                       "split_vs_one_process": paired("split", "one_process"),
                       "split_vs_bare": paired("split", "bare"),
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
