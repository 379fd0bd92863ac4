"""``tiered-kv bench storage``: put / get throughput of an L3 backend against its medium's ceiling.

DeepSeek-V3.2 pages (3,076,352 B payload, one page_first record each) with fresh random bytes.
Put is timed from sealing (each batch sealed on a thread as it starts, overlapping earlier
batches' writes, as in an engine) to the backend's acknowledgement (the file backend fsyncs each page
before it acknowledges, so the flush is included); get is timed cold (page cache dropped where
the machine allows it) and then warm; every get is verified (checksums included in the time).
In the same run, ``bench.raw_ceilings.measure_raw_ceiling`` gives the medium's own numbers:
direct I/O for files, ``redis-benchmark`` for Redis, Mooncake's own zero-copy calls (and its bytes
API, the naive path). Where the medium's own calls can also run on the round's very slots through
the backend's own client (``raw_ceilings.measure_raw_round``: Mooncake), that is the ceiling the
ratios use, as the issue's "on the same pages" asks; rounds alternate which side goes first.

Throughput counts stored records (payload + 4 KiB header; ``plan.describe_page_sizes``). The
``ours / raw`` ratios are computed per round and their median reported, which is not the ratio of
the median throughputs. For ``file://`` the run removes the directories it created that it left
empty (the backend's fan-out directories, and the root itself if it made it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import secrets
import statistics
import time
from pathlib import Path
from urllib.parse import unquote

import torch

from ...backends.url_options import split_url
from ..cli_args import non_negative_int, positive_int
from ...errors import BackendError
from ...model.host_pool import HostPool
from ..plan import describe_page_sizes
from ...model.spec import nsa_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", required=True, metavar="URL", help="backend URL, e.g. file:///mnt/nvme/kv")
    parser.add_argument("--pages", type=positive_int, default=64, help="pages to write and read (default 64, 197 MB)")
    parser.add_argument("--batch", type=positive_int, default=8, help="pages per put_from / get_into call (default 8)")
    parser.add_argument("--concurrency", type=positive_int, default=4, help="batches in flight at once (default 4)")
    parser.add_argument("--repeat", type=positive_int, default=3, help="rounds of (ours, raw), medians reported (default 3)")
    parser.add_argument("--warmup", type=non_negative_int, default=1, help="untimed rounds first: connections, server memory (default 1)")
    parser.add_argument("--no-raw", action="store_true", help="skip the medium's raw ceiling")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


async def _in_batches(fn, keys: list[str], slots: list[int], batch: int, concurrency: int) -> list[bool]:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> list[bool]:
        async with gate:
            return await fn(keys[i:i + batch], slots[i:i + batch])

    parts = await asyncio.gather(*(one(i) for i in range(0, len(keys), batch)))
    return [ok for part in parts for ok in part]


async def measure(url: str, *, pages: int, batch: int, concurrency: int, raw: bool, repeat: int = 1, warmup: int = 0) -> dict:
    """``repeat`` rounds of our put/get and the raw ceiling, interleaved (in alternating order) so
    that a medium whose speed drifts (virtual disks do) is compared with itself; each figure is the
    median. The ceiling moves ``batch`` pages per call where its calls take batches.

    One pool and one backend serve every round, as one serves an engine for its lifetime (a fresh
    client per round would time connection set-up); ``warmup`` untimed rounds come first, as the
    ceilings warm up their own buffers. Each round writes fresh random pages under fresh keys.
    """
    with _removing_empty_dirs_it_made(url):
        return await _measure(url, pages=pages, batch=batch, concurrency=concurrency, raw=raw, repeat=repeat,
                              warmup=warmup)


def shown_url(url: str) -> str:
    """``url`` as the user wrote it, less its query and fragment (options there may hold a
    password). Not re-assembled from its parts: ``memory://`` would come back as ``memory:``."""
    return url.split("#", 1)[0].split("?", 1)[0]


@contextlib.contextmanager
def _removing_empty_dirs_it_made(url: str):
    """For ``file://``: afterwards remove the directories that appeared during the run and are
    empty (the backend's fan-out directories of deleted pages, and the root and its parents if
    the run created them). Directories that existed before, or hold anything, stay. A file
    backend writing into the same directory at the same time could lose a fan-out directory it
    just made; benchmark a directory of its own."""
    # The backends' own splitter: a URL urllib refuses (unbalanced brackets) is the backend's
    # ConfigError when it opens, not a ValueError here; a NUL byte is refused by it too.
    parts = split_url(url)
    if parts.scheme != "file" or not parts.path.startswith("/") or "\x00" in unquote(parts.path):
        yield
        return
    root = Path(unquote(parts.path))
    try:
        chain = [root, *root.parents]
        first_existing = next(i for i, p in enumerate(chain) if p.exists())
        before = set(root.iterdir()) if first_existing == 0 else set()
    except (OSError, ValueError):
        # A path the OS refuses (NUL byte, no permission): the backend reports it; nothing to tidy.
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            made_inside = [sub for sub in root.iterdir() if sub not in before and sub.is_dir()]
            for sub in made_inside:
                _rmdir_if_empty(sub)
        for directory in chain[:first_existing]:  # innermost first: each is empty only once its child went
            _rmdir_if_empty(directory)


def _rmdir_if_empty(path: Path) -> None:
    # rmdir removes only an empty directory: any failure (not empty, gone) means leave it.
    with contextlib.suppress(OSError):
        path.rmdir()


async def _measure(url: str, *, pages: int, batch: int, concurrency: int, raw: bool, repeat: int, warmup: int) -> dict:
    from ...backends import open_backend
    from .raw_ceilings import measure_raw_ceiling

    with HostPool(nsa_spec(), 2 * pages) as pool:
        async with open_backend(url, pool) as backend:
            for _ in range(warmup):
                await _one_round(backend, pool, pages=pages, batch=batch, concurrency=concurrency)

            def measure_ceiling() -> dict | None:
                return measure_raw_ceiling(url, page_bytes=pool.record_bytes, pages=pages, batch=batch)

            rounds = []
            for index in range(repeat):
                # Ours first in even rounds, the ceiling first in odd ones: whatever the medium
                # carries from one measurement into the next falls on both sides alike.
                ceiling = measure_ceiling() if raw and index % 2 else None
                result = await _one_round(backend, pool, pages=pages, batch=batch, concurrency=concurrency,
                                          raw=raw, raw_first=bool(index % 2))
                if raw and not index % 2:
                    ceiling = measure_ceiling()
                if ceiling and "raw_put_gbps" in result:
                    # The same-pages ceiling of this round is the one to compare with; the class's
                    # (a fresh client on its own buffer) stays in the record under its own name.
                    ceiling = {(f"{k[:-5]}_fresh_client_gbps" if k in ("raw_put_gbps", "raw_get_gbps") else k): v
                               for k, v in ceiling.items()}
                if ceiling:
                    result.update(ceiling)
                if result.get("raw_same_pages"):
                    result["raw_method"] = (f"the backend's own client and slots, {batch} pages per call, "
                                            f"no records (raw_*_fresh_client_gbps: {result.get('raw_method', 'not measured')})")
                if "raw_put_gbps" in result:
                    result["put_vs_raw"] = result["put_gbps"] / result["raw_put_gbps"]
                    result["get_vs_raw"] = result["get_gbps"] / result["raw_get_gbps"]
                    if "raw_put_distinct_keys_gbps" in result:
                        result["put_vs_raw_distinct_keys"] = result["put_gbps"] / result["raw_put_distinct_keys_gbps"]
                rounds.append(result)
        page_bytes, record_bytes, slot_bytes = pool.spec.page_bytes, pool.record_bytes, pool.slot_bytes
    result = dict(rounds[0])
    for key in rounds[0]:
        if key.endswith("_gbps") or "_vs_raw" in key:
            result[key] = statistics.median(r[key] for r in rounds)
    result.update({
        "backend": shown_url(url),
        "pages": pages,
        "batch": batch,
        "concurrency": concurrency,
        "page_bytes": page_bytes,
        "record_bytes": record_bytes,
        "slot_bytes": slot_bytes,
        "repeat": repeat,
        "warmup": warmup,
        "date": datetime.date.today().isoformat(),
        "host": f"{platform.node()} {os.cpu_count()} cpus",
        "rounds": [{k: v for k, v in r.items() if k.endswith("_gbps")} for r in rounds],
    })
    return result


async def _one_round(backend, pool: HostPool, *, pages: int, batch: int, concurrency: int, raw: bool = False,
                     raw_first: bool = False) -> dict:
    """Fresh random pages under fresh keys: put, cold get, warm get, verify, delete. With ``raw``,
    also the medium's own calls on the very same slots through the same client, where the backend
    has them (``measure_raw_round``): before ours when ``raw_first``, else after."""
    from .raw_ceilings import drop_page_cache, measure_raw_round

    src = pool.allocate(pages)
    dst = pool.allocate(pages)
    for slot in src:
        payload = pool.record_view(slot)[4096:]
        payload[:] = torch.randint(0, 256, (len(payload),), dtype=torch.uint8).numpy().data
    keys = [f"bench-{secrets.token_hex(8)}-{i}" for i in range(pages)]
    total = pages * pool.record_bytes
    same_pages: dict | None = None
    if raw and raw_first:
        same_pages = await measure_raw_round(backend, src, dst, batch=batch)

    async def seal_and_put(batch_keys: list[str], batch_slots: list[int]) -> list[bool]:
        # As an engine would: each batch is sealed (on a thread: xxh3 releases the GIL)
        # when it is ready, while earlier batches are being written.
        await asyncio.to_thread(lambda: [pool.seal(s, k) for s, k in zip(batch_slots, batch_keys)])
        return await backend.put_from(batch_keys, batch_slots)

    start = time.perf_counter()
    stored = await _in_batches(seal_and_put, keys, src, batch, concurrency)
    put_s = time.perf_counter() - start
    if not all(stored):
        raise BackendError(f"{backend.scheme} backend stored only {sum(stored)} of {pages} pages of {pool.record_bytes:,} B; "
                           f"is it large enough (capacity_bytes, maxmemory) and empty of other data?")
    cold = drop_page_cache()
    start = time.perf_counter()
    got = await _in_batches(backend.get_into, keys, dst, batch, concurrency)
    get_s = time.perf_counter() - start
    start = time.perf_counter()
    got_warm = await _in_batches(backend.get_into, keys, dst, batch, concurrency)
    warm_s = time.perf_counter() - start
    if not (all(got) and all(got_warm)):
        raise BackendError(f"{backend.scheme} backend read back only {sum(got)} of {pages} pages it had just stored "
                           f"(and {sum(got_warm)} warm); it evicted them, or they failed verification")
    for s, d in zip(src, dst):
        if pool.record_view(s) != pool.record_view(d):
            raise BackendError(f"{backend.scheme} backend returned a verified page that differs from the one written")
    await backend.delete(keys)
    if raw and not raw_first:
        same_pages = await measure_raw_round(backend, src, dst, batch=batch)
    pool.free(src + dst)
    result = {
        "put_gbps": total / put_s / 1e9,
        "get_gbps": total / get_s / 1e9,
        "get_warm_gbps": total / warm_s / 1e9,
        "get_cold": cold,
    }
    if same_pages:
        result["raw_put_gbps"] = total / same_pages["raw_put_s"] / 1e9
        result["raw_get_gbps"] = total / same_pages["raw_get_s"] / 1e9
        result["raw_same_pages"] = True
    return result


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(measure(args.backend, pages=args.pages, batch=args.batch, concurrency=args.concurrency,
                                 raw=not args.no_raw, repeat=args.repeat, warmup=args.warmup))
    if args.json:
        print(json.dumps(result))
        return 0
    rounds = result["repeat"]
    print(f"backend {result['backend']}: {result['pages']} pages, batch {result['batch']}, "
          f"{result['concurrency']} batches in flight, median of {rounds} round{'s' * (rounds > 1)}")
    print(f"per page  {describe_page_sizes(nsa_spec())}")
    print(f"GB/s count stored records: {result['pages']} x {result['record_bytes']:,} B each way")
    print(f"{'':<16}{'put GB/s':>10}{'get GB/s':>10}")
    print(f"{'tiered-kv':<16}{result['put_gbps']:>10.2f}{result['get_gbps']:>10.2f}   "
          f"(warm get {result['get_warm_gbps']:.2f}, cold={result['get_cold']})")
    if "raw_put_gbps" in result:
        print(f"{'raw':<16}{result['raw_put_gbps']:>10.2f}{result['raw_get_gbps']:>10.2f}   ({result.get('raw_method', '')})")
        print(f"{'per-round ratio':<16}{result['put_vs_raw']:>10.2f}{result['get_vs_raw']:>10.2f}   "
              f"(tiered-kv / raw within each round, median of {rounds}; not the ratio of the two rows above)")
    return 0
