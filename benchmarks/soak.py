"""Soak: a million page operations through all three tiers, watching what the process keeps.

Usage: ``python benchmarks/soak.py [--ops 1000000] [--sample-every 50000] [--l3 file|memory|redis]
[--out FILE.json]``.

Synthetic chats (a fresh seed per batch, so new conversations keep arriving and the old ones age
out of every tier) go through the replay's real hierarchy: an engine-like L1, a host-pool L2 and an
L3 (``--l3``: a file store with ``capacity_bytes`` in a temporary directory, ``memory://`` with the
same capacity, or a ``redis-server`` it starts with ``maxmemory`` and LRU eviction), bytes moved and every loaded page
checked against its oracle bytes. Pages are small (one layer, a 128-wide latent, 16 tokens) so a
million operations take minutes on two cores. A page operation is one page stored L1 -> L2, loaded
L2 -> L1, written L2 -> L3 or read L3 -> L2.

Every ``--sample-every`` operations it records the RSS (anonymous and file-backed apart), glibc's
heap (bytes in use, bytes free, per arena: the main thread's and the other threads'), the open
file descriptors, the process's
threads (the kernel's count, executors' included) and the page index's entries: all of them, those
on L2, those known only as on L3, against the tiers' capacities in pages and the index's bound
(``PageIndex.max_l3_only``). Growth is a least-squares slope over the samples after the warm-up
(the first ``--warmup-ops``), per 100k page operations. Targets: RSS growing under 1 MB per 100k
page operations after the warm-up, the index within L1 + L2 + its L3-only bound, no fd or
thread growth after the warm-up, and never more threads than at the start plus those its pools
start as their work overlaps (``pool_threads``). Prints (and with ``--out`` writes) one JSON object; exit 1 when a target is missed
or a loaded page was wrong. Linux only (/proc).

``--tracemalloc`` also traces Python's allocations from half-way through the warm-up and compares
the end with the end of the warm-up: the traced memory's growth beside the RSS's, with the source
lines whose allocations grew most. (Tracing starts before the baseline so that the bounded
structures, the index and the L3 store's names, have been replaced by traced objects by then: a
baseline taken as tracing starts counts every replaced entry as growth.) Growth of the RSS that
Python's own objects do not account for is the C allocator's or torch's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tiered_kv import nsa_spec  # noqa: E402
from tiered_kv.compose import Hierarchy  # noqa: E402
from tiered_kv.ops.replay import ChatWorkload, build, embedded_default, replay, synthetic_chat  # noqa: E402

#: One layer, a 128-wide latent, 16-token pages: about 2.5 KB a page.
SPEC = nsa_spec(num_layers=1, page_size=16, kv_lora_rank=128)
#: Tiers in pages: L3 is bounded (a file L3 with capacity_bytes), well below the pages written.
TIERS = {"l1_pages": 1024, "l2_pages": 2048, "l3_pages": 4096}
#: Per batch: 32 conversations of 8 rounds (system prompt 1,024 tokens, turns 128 + answers 96).
BATCH = ChatWorkload(clients=32, rounds=8, system_tokens=1024, turn_tokens=128, answer_tokens=96, rate=1000.0)
RSS_TARGET_PER_100K = 1 << 20


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def page_ops(h: Hierarchy) -> int:
    """Pages stored L1 -> L2, loaded L2 -> L1, written to and read from L3 so far."""
    m, c = h.manager.stats, h.controller.stats
    return m.stores + m.load_pages + c.pages_written + c.pages_read


def pool_threads(h: Hierarchy) -> int:
    """Threads that pools start only as their work overlaps, at most: the L3 backend's executor
    (a file L3's ``workers``), the controller loop's default executor (asyncio's ``min(32, cpus + 4)``) and
    torch's intra-op threads."""
    import torch

    return h.controller.backend._executor._max_workers + min(32, (os.cpu_count() or 1) + 4) + torch.get_num_threads()


def _mallinfo() -> dict[str, int]:
    """glibc's heap: bytes in use by malloc's callers, free inside its arenas, and mmapped chunks."""
    import ctypes

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    m = libc.mallinfo2()
    return {"malloc_in_use": m.uordblks + m.hblkhd, "malloc_free": m.fordblks, "malloc_arena": m.arena,
            "malloc_mmapped": m.hblkhd}


def _malloc_arenas() -> dict[str, int]:
    """glibc's heap split by arena (``malloc_info``): the main thread's arena (heap 0, every
    thread's allocation at or above the mmap threshold aside) and the other threads' arenas,
    each as bytes taken from the system and bytes of those free."""
    import ctypes
    import re

    libc = ctypes.CDLL("libc.so.6")
    libc.open_memstream.restype = ctypes.c_void_p
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = ctypes.c_void_p(libc.open_memstream(ctypes.byref(buf), ctypes.byref(size)))
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    xml = ctypes.string_at(buf, size.value).decode()
    libc.free(buf)
    out = {"main_arena_system": 0, "main_arena_free": 0, "thread_arenas": 0, "thread_arenas_system": 0,
           "thread_arenas_free": 0}
    for nr, body in re.findall(r'<heap nr="(\d+)">(.*?)</heap>', xml, re.S):
        system = int(re.search(r'<system type="current" size="(\d+)"/>', body).group(1))
        free = sum(int(n) for n in re.findall(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"/>', body))
        if nr == "0":
            out["main_arena_system"], out["main_arena_free"] = system, free
        else:
            out["thread_arenas"] += 1
            out["thread_arenas_system"] += system
            out["thread_arenas_free"] += free
    return out


def sample(h: Hierarchy, ops: int, started: float, l3_pages_held: Any, trim: bool = False) -> dict[str, Any]:
    gc.collect()
    if trim:
        _malloc_trim()
    index = h.manager.index
    return {
        "ops": ops,
        "t_s": round(time.perf_counter() - started, 2),
        "rss_bytes": _status("VmRSS") * 1024,
        "rss_anon_bytes": _status("RssAnon") * 1024,
        "rss_file_bytes": _status("RssFile") * 1024,
        **_mallinfo(),
        **_malloc_arenas(),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": _status("Threads"),
        "index_entries": len(index.entries),
        "index_l2_resident": index.resident_count,
        "index_l3_only": index.l3_only_count,
        "l3_pages_held": l3_pages_held(),
    }


def _traced_growth(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, top: int = 12) -> list[dict[str, Any]]:
    """The source lines whose live allocations grew most between two snapshots."""
    return [{"where": f"{d.traceback[0].filename.replace(str(REPO) + '/', '')}:{d.traceback[0].lineno}",
             "bytes": d.size_diff, "blocks": d.count_diff}
            for d in after.compare_to(before, "lineno")[:top]]


def slope_per_100k(samples: list[dict[str, Any]], field: str) -> float:
    """Least-squares growth of ``field`` per 100k page operations over ``samples``: on a shared
    machine one late sample moves an end-minus-start difference; a fit over all of them less."""
    xs = [s["ops"] for s in samples]
    ys = [s[field] for s in samples]
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return 0.0 if sxx == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx * 100_000


class _RedisServer:
    """A ``redis-server`` on a free loopback port, without persistence, bounded by ``maxmemory``
    with LRU eviction as a cache is run (the soak's L3 for ``--l3 redis``)."""

    def __init__(self, maxmemory: int) -> None:
        import shutil
        import socket
        import subprocess
        import tempfile

        server = shutil.which("redis-server")
        if server is None:
            raise SystemExit("soak --l3 redis: redis-server not found on PATH")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.dir = tempfile.mkdtemp(prefix="tkv-soak-redis-")
        self.process = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
             "--appendonly", "no", "--maxmemory", str(maxmemory), "--maxmemory-policy", "allkeys-lru"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        self.client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError as err:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.close()
                    raise SystemExit(f"soak --l3 redis: redis-server on port {self.port} did not start") from err
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        import shutil

        self.client.close()
        self.process.terminate()
        self.process.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _l3_settings(l3: str, server: "_RedisServer | None") -> dict[str, Any]:
    from tiered_kv.ops.plan import slot_bytes

    capacity = TIERS["l3_pages"] * slot_bytes(SPEC)
    urls = {"file": None, "memory": f"memory://?capacity_bytes={capacity}", "redis": server.url if server else None}
    return {"l3_url": urls[l3]}


def _l3_pages_held(h: Hierarchy, l3: str, server: "_RedisServer | None") -> int:
    counters = {"file": lambda: sum(1 for _ in os.scandir(h.tempdir)),
                "memory": lambda: len(h.controller.backend._store.records),
                "redis": lambda: server.client.dbsize()}
    return counters[l3]()


def _malloc_trim() -> None:
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


def soak(target_ops: int, sample_every: int, warmup_ops: int, trace: bool = False, l3: str = "file",
         trim: bool = False) -> dict[str, Any]:
    from tiered_kv.ops.plan import slot_bytes

    # Redis holds L3's capacity of records plus its own per-key overhead (about 100 B a key).
    server = _RedisServer(TIERS["l3_pages"] * (slot_bytes(SPEC) + 128)) if l3 == "redis" else None
    h = build(embedded_default(spec=SPEC, **TIERS, **_l3_settings(l3, server)))

    def held() -> int:
        return _l3_pages_held(h, l3, server)

    samples: list[dict[str, Any]] = []
    wrong = verified = requests = 0
    try:
        capacities = {"l1": h.l1.capacity, "l2": h.manager.num_slots,
                      "l3": getattr(h.controller.backend, "capacity_pages", None) or TIERS["l3_pages"]}
        bound = capacities["l1"] + capacities["l2"] + h.manager.index.max_l3_only
        started = time.perf_counter()
        samples.append(sample(h, 0, started, held, trim))
        thread_bound = samples[0]["threads"] + pool_threads(h)
        next_sample = sample_every
        seed = 0
        traced_from: tuple[int, int, tracemalloc.Snapshot] | None = None  # (ops, traced bytes, snapshot)
        while page_ops(h) < target_ops:
            if trace and not tracemalloc.is_tracing() and page_ops(h) >= warmup_ops // 2:
                tracemalloc.start(1)
            if trace and traced_from is None and page_ops(h) >= warmup_ops:
                gc.collect()
                traced_from = (page_ops(h), tracemalloc.get_traced_memory()[0], tracemalloc.take_snapshot())
            result = replay(h, synthetic_chat(ChatWorkload(**{**vars(BATCH), "seed": seed})), inflight=8)
            seed += 1
            requests += len(result.requests)
            wrong += sum(r.wrong_pages for r in result.requests)
            verified += sum(r.verified_pages for r in result.requests)
            del result
            ops = page_ops(h)
            if ops >= next_sample or ops >= target_ops:
                samples.append(sample(h, ops, started, held, trim))
                next_sample = ops + sample_every
        wall = time.perf_counter() - started
        traced: dict[str, Any] | None = None
        if traced_from is not None:
            gc.collect()
            ops_from, bytes_from, snapshot = traced_from
            now = tracemalloc.get_traced_memory()[0]
            traced = {"from_ops": ops_from, "to_ops": page_ops(h),
                      "python_growth_bytes_per_100k_ops": round((now - bytes_from) * 100_000 / max(1, page_ops(h) - ops_from)),
                      "top_lines": _traced_growth(snapshot, tracemalloc.take_snapshot())}
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        manager = dict(vars(h.manager.stats))
        controller = {k: v for k, v in vars(h.controller.stats).items()
                      if k in ("pages_read", "pages_written", "degraded_episodes", "writes_refused", "backend_errors")}
        l3_evictions = (int(server.client.info("stats")["evicted_keys"]) if server is not None
                        else h.controller.backend.stats.evictions)
    finally:
        h.close()
        h.release_memory()
        if server is not None:
            server.close()
    after = [s for s in samples if s["ops"] >= warmup_ops]
    first, last = after[0], after[-1]
    span = max(1, last["ops"] - first["ops"])
    growth = slope_per_100k(after, "rss_bytes")
    slopes = {f: round(slope_per_100k(after, f)) for f in
              ("rss_bytes", "rss_anon_bytes", "rss_file_bytes", "malloc_in_use", "malloc_free", "malloc_arena",
               "main_arena_system", "main_arena_free", "thread_arenas_system", "thread_arenas_free")}
    peak_entries = max(s["index_entries"] for s in samples)
    summary = {
        "ops": samples[-1]["ops"],
        "requests": requests,
        "batches": seed,
        "wall_s": round(wall, 1),
        "ops_per_s": round(samples[-1]["ops"] / wall),
        "pages_verified": verified,
        "pages_wrong": wrong,
        "page_ops": {"l1_to_l2": manager["stores"], "l2_to_l1": manager["load_pages"],
                     "l2_to_l3": controller["pages_written"], "l3_to_l2": controller["pages_read"]},
        "l3_evictions": l3_evictions,
        "prefetch_pages_missing": manager["prefetch_pages_missing"],
        "tier_capacity_pages": capacities,
        "index_bound": {"max_l3_only": bound - capacities["l1"] - capacities["l2"], "entries_at_most": bound},
        "index_entries_peak": peak_entries,
        "warmup_ops": warmup_ops,
        "rss_bytes": {"start": samples[0]["rss_bytes"], "after_warmup": first["rss_bytes"], "end": last["rss_bytes"]},
        "rss_growth_bytes_per_100k_ops": round(growth),
        "rss_end_minus_warmup_bytes_per_100k_ops": round((last["rss_bytes"] - first["rss_bytes"]) * 100_000 / span),
        "growth_per_100k_ops_after_warmup": slopes,
        "l3": l3,
        "malloc_trim_at_samples": trim,
        "fds": {"after_warmup": first["fds"], "end": last["fds"]},
        "threads": {"start": samples[0]["threads"], "after_warmup": first["threads"], "end": last["threads"],
                    "peak": max(s["threads"] for s in samples), "at_most": thread_bound},
        "controller": controller,
    }
    if traced is not None:
        summary["tracemalloc"] = traced
    summary["targets_met"] = {
        "rss_growth_under_1MB_per_100k_ops": growth < RSS_TARGET_PER_100K,
        "index_within_bound": peak_entries <= bound,
        "no_fd_growth": last["fds"] <= first["fds"],
        "no_thread_growth": last["threads"] <= first["threads"] and all(s["threads"] <= thread_bound for s in samples),
        "no_wrong_page": wrong == 0,
    }
    summary["samples"] = samples
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1_000_000, help="page operations to run (default 1,000,000)")
    parser.add_argument("--sample-every", type=int, default=50_000, help="page operations between samples")
    parser.add_argument("--warmup-ops", type=int, default=200_000, help="page operations before growth is measured")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="trace Python's allocations after the warm-up and report the lines that grew")
    parser.add_argument("--l3", choices=("file", "memory", "redis"), default="file",
                        help="L3 backend: a bounded file store (default), memory:// or a redis-server it starts")
    parser.add_argument("--malloc-trim", action="store_true",
                        help="call glibc's malloc_trim(0) before every sample (a diagnosis: what the heap holds free)")
    args = parser.parse_args(argv)
    result = soak(args.ops, args.sample_every, args.warmup_ops, args.tracemalloc, args.l3, args.malloc_trim)
    text = json.dumps(result, indent=1)
    print(text, flush=True)
    g = {k: v / 2**20 for k, v in result["growth_per_100k_ops_after_warmup"].items()}
    verdict = "met" if result["targets_met"]["rss_growth_under_1MB_per_100k_ops"] else "NOT met"
    print(f"soak: {result['ops']:,} page operations ({result['l3']} L3); growth per 100k after "
          f"{result['warmup_ops']:,}: RSS {g['rss_bytes']:.2f} MB (anonymous {g['rss_anon_bytes']:.2f}, "
          f"file-backed {g['rss_file_bytes']:.2f}; malloc in use {g['malloc_in_use']:.2f}, free "
          f"{g['malloc_free']:.2f}): target < 1 MB {verdict}", file=sys.stderr, flush=True)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0 if all(result["targets_met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
