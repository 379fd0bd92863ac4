"""The file tier's own executor (O_DIRECT, readv into the slot) against the obvious aiofiles store.

Why this exists: ``backends/file.py`` runs its own bounded thread executor with O_DIRECT reads
straight into host slots and O_DIRECT temp-file writes + fdatasync + link. The obvious alternative
is a page store on ``aiofiles``; the README says which one the library keeps and why, and this is
the measurement behind that sentence.

Stores compared, on the same pages, directory filesystem and concurrency (``--workers`` in
flight, 8 by default):

- ``own O_DIRECT``: ``FileBackend`` as shipped (``o_direct=true``), its ``_put`` / ``_get``
  primitives (the batch is split over its executor's threads).
- ``own buffered``: the same backend with ``o_direct=false``, to tell the executor's share from
  O_DIRECT's.
- ``aiofiles``: a minimal store of the same semantics built on aiofiles: the whole padded slot is
  written to a temp file in the page's directory, fdatasynced, linked to its name (put-if-absent),
  the temp file unlinked; a get opens the file, ``readinto`` a bytearray, then copies it into the
  host slot (``aiofiles, readinto slot``: the same, reading straight into the slot, no bytearray:
  aiofiles at its best; ``aiofiles, O_DIRECT``: unbuffered file objects opened with O_DIRECT on
  the aligned slot, the most aiofiles can be made to do). Every file call runs on an
  ``--workers``-thread executor handed to aiofiles, and at most ``--workers`` pages are in flight
  (an asyncio semaphore).

Both sides are timed at the I/O layer (no record verification, which costs the same for either).
A round is, per store: put ``--pages`` fresh pages, drop the page cache (``drop_page_cache``:
sync + ``/proc/sys/vm/drop_caches`` as root, else fadvise), cold get, warm get (again, page cache
as the put and cold get left it), compare every page with its source, delete. The order of the
stores alternates from round to round. CPU seconds are this process's ``getrusage`` (user + sys,
all threads) over each phase, per GB moved; GB count stored records (``pages x record_bytes``).

aiofiles is needed by this benchmark only (``pip install aiofiles``); it is no dependency of the
library. Usage: ``python benchmarks/file_executor.py --dir /work/bench/file-executor [--rounds 4]
[--json]``; the directory must be on a real disk (the script reports its filesystem type and
refuses tmpfs, where neither O_DIRECT nor cold reads exist).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import resource
import secrets
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiofiles
import aiofiles.os
import torch

from tiered_kv.backends.file import SUFFIX, TEMP_PREFIX, FileBackend, FileOptions, page_name
from tiered_kv import model_spec
from tiered_kv.ops.bench.raw_ceilings import drop_page_cache
from tiered_kv.model.host_pool import HostPool


class AiofilesStore:
    """A page store on aiofiles with the file backend's semantics (no capacity account)."""

    scheme = "aiofiles"

    def __init__(self, pool: HostPool, root: Path, *, workers: int, copy: bool = True, direct: bool = False) -> None:
        self.pool = pool
        self.copy = copy and not direct  # False: readinto the slot itself (no bytearray)
        # True: unbuffered file objects opened with O_DIRECT, reading and writing the aligned
        # padded slot: what aiofiles can be made to do, at which point it is a thread hop per call.
        self.open_options = {"buffering": 0, "opener": lambda p, f: os.open(p, f | os.O_DIRECT, 0o644)} if direct else {}
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="bench-aiofiles")
        self.in_flight = asyncio.Semaphore(workers)
        self.direct_io = False

    def path_of(self, key: str) -> Path:
        name = page_name(key)
        return self.root / name[:2] / (name + SUFFIX)

    async def _write(self, key: str, slot: int) -> bool:
        path = self.path_of(key)
        async with self.in_flight:
            if await aiofiles.os.path.exists(path, executor=self.executor):
                return True
            await aiofiles.os.makedirs(path.parent, exist_ok=True, executor=self.executor)
            temp = path.parent / f"{TEMP_PREFIX}{path.name}-{secrets.token_hex(6)}"
            try:
                async with aiofiles.open(temp, "xb", executor=self.executor, **self.open_options) as f:
                    await f.write(self.pool.slot_view(slot))
                    await f.flush()
                    await asyncio.get_running_loop().run_in_executor(self.executor, os.fdatasync, f.fileno())
                try:
                    await aiofiles.os.link(temp, path, executor=self.executor)
                except FileExistsError:
                    pass  # another writer won: records are immutable
            finally:
                await aiofiles.os.unlink(temp, executor=self.executor)
        return True

    async def _read(self, key: str, slot: int) -> bool:
        async with self.in_flight:
            try:
                f = await aiofiles.open(self.path_of(key), "rb", executor=self.executor, **self.open_options)
            except FileNotFoundError:
                return False
            try:
                buf = bytearray(self.pool.slot_bytes) if self.copy else self.pool.slot_view(slot)
                got = await f.readinto(buf)
            finally:
                await f.close()
        if self.copy:
            self.pool.slot_view(slot)[:got] = memoryview(buf)[:got]
        return got == self.pool.slot_bytes

    async def _put(self, keys: list[str], slots: list[int]) -> list[bool]:
        return list(await asyncio.gather(*(self._write(k, s) for k, s in zip(keys, slots))))

    async def _get(self, keys: list[str], slots: list[int]) -> list[bool]:
        return list(await asyncio.gather(*(self._read(k, s) for k, s in zip(keys, slots))))

    async def _delete(self, keys: list[str]) -> None:
        for k in keys:
            self.path_of(k).unlink(missing_ok=True)

    async def aclose(self) -> None:
        self.executor.shutdown(wait=True)


def filesystem_of(path: Path) -> str:
    """The type of the filesystem ``path`` lies on, from the longest matching mount point."""
    best, kind = "", "unknown"
    real = str(path.resolve())
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            _, point, fs_type, *_ = line.split()
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
                best, kind = point, fs_type
    return kind


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def timed(call) -> tuple[list, float, float]:
    cpu, start = cpu_seconds(), time.perf_counter()
    result = await call
    return result, time.perf_counter() - start, cpu_seconds() - cpu


async def one_round(store, pool: HostPool, src: list[int], dst: list[int], round_no: int) -> dict:
    keys = [f"bench-file-executor-{round_no}-{secrets.token_hex(6)}-{i}" for i in range(len(src))]
    for s, k in zip(src, keys):
        pool.seal(s, k)
    gb = len(src) * pool.record_bytes / 1e9
    os.sync()  # the previous store's dirty pages are not this put's to write back
    stored, put_s, put_cpu = await timed(store._put(keys, src))
    if not all(stored):
        raise RuntimeError(f"{store.scheme}: stored {sum(stored)} of {len(src)} pages")
    cold = drop_page_cache()
    out = {"cold": cold}
    for phase in ("cold", "warm"):
        for d in dst:
            pool.slot_view(d)[:] = bytes(pool.slot_bytes)
        got, get_s, get_cpu = await timed(store._get(keys, dst))
        if not all(got) or any(pool.record_view(s) != pool.record_view(d) for s, d in zip(src, dst)):
            raise RuntimeError(f"{store.scheme}: {phase} get returned {sum(map(bool, got))} of {len(src)} pages, or wrong bytes")
        out[f"get_{phase}_gbps"] = gb / get_s
        out[f"get_{phase}_cpu_s_per_gb"] = get_cpu / gb
    await store._delete(keys)
    out["put_gbps"] = gb / put_s
    out["put_cpu_s_per_gb"] = put_cpu / gb
    return out


async def run(args: argparse.Namespace) -> dict:
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    fs_type = filesystem_of(root)
    if fs_type in ("tmpfs", "ramfs"):
        raise SystemExit(f"{root} is on {fs_type}: put it on a real disk (neither O_DIRECT nor cold reads exist there)")
    spec = model_spec("deepseek-v3.2")
    pool = HostPool(spec, 2 * args.pages, "page_first")
    src, dst = pool.allocate(args.pages), pool.allocate(args.pages)
    for s in src:
        payload = pool.record_view(s)[4096:]
        payload[:] = torch.randint(0, 256, (len(payload),), dtype=torch.uint8).numpy().data
    work = root / f"run-{secrets.token_hex(4)}"
    stores = {
        "own O_DIRECT": FileBackend(pool, FileOptions(path=str(work / "direct"), workers=args.workers)),
        "own buffered": FileBackend(pool, FileOptions(path=str(work / "buffered"), o_direct=False, workers=args.workers)),
        "aiofiles": AiofilesStore(pool, work / "aiofiles", workers=args.workers),
        "aiofiles, readinto slot": AiofilesStore(pool, work / "aiofiles-slot", workers=args.workers, copy=False),
        "aiofiles, O_DIRECT": AiofilesStore(pool, work / "aiofiles-direct", workers=args.workers, direct=True),
    }
    if not stores["own O_DIRECT"].direct_io:
        raise SystemExit(f"{root} ({fs_type}) refused O_DIRECT: the comparison needs a filesystem that takes it")
    rounds: dict[str, list[dict]] = {name: [] for name in stores}
    try:
        order = list(stores)
        for r in range(args.warmup + args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                result = await one_round(stores[name], pool, src, dst, r)
                if r >= args.warmup:
                    rounds[name].append(result)
    finally:
        for store in stores.values():
            await store.aclose()
        shutil.rmtree(work, ignore_errors=True)
    pool.free(src + dst)
    pool.reap()
    assert pool.free_slots == pool.num_slots, "every host slot is back"
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()], "no task left pending"
    metrics = [k for k in rounds["aiofiles"][0] if k != "cold"]
    summary = {name: {m: statistics.median(r[m] for r in rs) for m in metrics} | {"cold": all(r["cold"] for r in rs)}
               for name, rs in rounds.items()}
    return {
        "date": datetime.date.today().isoformat(),
        "host": f"{platform.node()} {os.cpu_count()} cpus",
        "load_before": os.getloadavg(),
        "dir": str(root), "filesystem": fs_type,
        "model": "deepseek-v3.2", "pages": args.pages, "record_bytes": pool.record_bytes, "slot_bytes": pool.slot_bytes,
        "workers": args.workers, "rounds": args.rounds, "warmup": args.warmup,
        "aiofiles": aiofiles.__version__ if hasattr(aiofiles, "__version__") else "installed",
        "median": summary, "per_round": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/work/bench/file-executor", help="a directory on a real disk")
    parser.add_argument("--pages", type=int, default=64, help="pages per round (default 64 = 197 MB)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--workers", type=int, default=8, help="threads and pages in flight, both stores")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()
    result = asyncio.run(run(args))
    result["load_before"], result["load_after"] = load, os.getloadavg()
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['date']} {result['host']}, {result['dir']} on {result['filesystem']}, {args.pages} DeepSeek-V3.2 pages "
          f"of {result['record_bytes']:,} B, {args.workers} in flight, median of {args.rounds} rounds; "
          f"load {load[0]:.2f} before, {result['load_after'][0]:.2f} after")
    print("| store | put GB/s | cold get GB/s | warm get GB/s | put CPU s/GB | cold get CPU s/GB | warm get CPU s/GB |")
    print("|---|---|---|---|---|---|---|")
    for name, m in result["median"].items():
        print(f"| {name} | {m['put_gbps']:.2f} | {m['get_cold_gbps']:.2f} | {m['get_warm_gbps']:.2f} | "
              f"{m['put_cpu_s_per_gb']:.2f} | {m['get_cold_cpu_s_per_gb']:.2f} | {m['get_warm_cpu_s_per_gb']:.2f} |")


if __name__ == "__main__":
    main()
