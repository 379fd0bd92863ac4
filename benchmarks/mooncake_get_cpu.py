"""Where a Mooncake get's time goes on a small host: wall and CPU seconds of this process for our
``get_into`` (records verified) against the store's own ``batch_get_into`` on the same client and
slots, and for the verification alone.

    MC_TCP_BIND_ADDRESS=127.0.0.1 python benchmarks/mooncake_get_cpu.py "mooncake://...&contribute_segment=false"

Needs a running master and a process contributing store memory (``python -m
tiered_kv.ops.bench.segment_holder hold-segment URL``). 64 DeepSeek-V3.2 pages, 2 gets of 32 at once as
in ``tiered-kv bench storage --batch 32 --concurrency 2``, 8 rounds alternating which side goes
first, medians printed. Never imported by the library or the tests.
"""

from __future__ import annotations

import asyncio
import resource
import secrets
import statistics
import sys
import time

import numpy as np

from tiered_kv import HostPool, nsa_spec
from tiered_kv.backends import open_backend

PAGES, BATCH, ROUNDS = 64, 32, 8


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def main(url: str) -> None:
    with HostPool(nsa_spec(), 2 * PAGES) as pool:
        async with open_backend(url, pool) as backend:
            store, size = backend.store, pool.record_bytes
            src, dst = list(range(PAGES)), list(range(PAGES, 2 * PAGES))
            rng = np.random.default_rng()
            wall: dict[str, list[float]] = {"ours": [], "store's own": [], "verification alone": []}
            cpu: dict[str, list[float]] = {name: [] for name in wall}
            for round_index in range(ROUNDS):
                for slot in src:
                    pool.record_view(slot)[4096:] = rng.integers(0, 256, size - 4096, dtype=np.uint8).data
                keys = [f"cpu-{secrets.token_hex(6)}-{i}" for i in range(PAGES)]
                for slot, key in zip(src, keys):
                    pool.seal(slot, key)
                for i in range(0, PAGES, BATCH):
                    assert all(await backend.put_from(keys[i:i + BATCH], src[i:i + BATCH]))
                order = ("ours", "store's own") if round_index % 2 else ("store's own", "ours")
                for name in order:
                    c0, t0 = cpu_seconds(), time.perf_counter()
                    if name == "ours":
                        await asyncio.gather(*(backend.get_into(keys[i:i + BATCH], dst[i:i + BATCH])
                                               for i in range(0, PAGES, BATCH)))
                    else:
                        for i in range(0, PAGES, BATCH):
                            store.batch_get_into(keys[i:i + BATCH], [pool.slot_address(s) for s in dst[i:i + BATCH]],
                                                 [size] * BATCH)
                    wall[name].append(time.perf_counter() - t0)
                    cpu[name].append(cpu_seconds() - c0)
                c0, t0 = cpu_seconds(), time.perf_counter()
                assert not await backend._verify_all(list(zip(keys, dst)))
                wall["verification alone"].append(time.perf_counter() - t0)
                cpu["verification alone"].append(cpu_seconds() - c0)
                await backend.delete(keys)
            for name in wall:
                print(f"{name:20s} wall {statistics.median(wall[name]) * 1e3:6.1f} ms   "
                      f"cpu {statistics.median(cpu[name]) * 1e3:6.1f} ms   ({PAGES} pages, median of {ROUNDS})")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
