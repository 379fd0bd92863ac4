"""The media's own throughput, for ``bench storage`` to set our put / get beside.

Two tables keyed by URL scheme, so a medium's ceiling is one entry and no backend class carries
benchmark code:

- ``CEILINGS``: scheme -> ``ceiling(url, page_bytes=, pages=, batch=)`` (blocking), the medium's
  own put / get of ``pages`` values of ``page_bytes`` measured the way its docs name (direct I/O
  for files, ``redis-benchmark`` for Redis, Mooncake's own zero-copy calls); it returns
  ``{"raw_put_gbps", "raw_get_gbps", "raw_method", ...}``.
- ``SAME_PAGE_ROUNDS``: scheme -> ``round(backend, src_slots, dst_slots, batch=)`` (async), the
  medium's own calls moving the very slots of a benchmark round out and back through the backend's
  own client, no records involved: ``{"raw_put_s", "raw_get_s"}`` (Mooncake).

``measure_raw_ceiling`` / ``measure_raw_round`` look a scheme up and answer None where it has no
entry (plugin schemes). Every helper leaves the medium as it found it: its own
files, keys and objects are removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from ...backends.url_options import split_url
from ...errors import BackendError, BackendUnavailableError, ConfigError

Ceiling = Callable[..., "dict[str, Any] | None"]
SamePageRound = Callable[..., Awaitable["dict[str, float] | None"]]


def measure_raw_ceiling(url: str, *, page_bytes: int, pages: int, batch: int | None = None) -> dict[str, Any] | None:
    """The ceiling of ``url``'s medium (see ``CEILINGS``), or None where it has none.

    ``batch``: pages per call where the medium's own calls take batches (``bench storage`` passes
    its own batch size, so both sides move the same pages per call)."""
    ceiling = CEILINGS.get(split_url(url).scheme.lower())
    return None if ceiling is None else ceiling(url, page_bytes=page_bytes, pages=pages, batch=batch)


async def measure_raw_round(backend: Any, src_slots: list[int], dst_slots: list[int], *, batch: int) -> dict[str, float] | None:
    """The medium's own calls on ``src_slots`` -> ``dst_slots`` through ``backend``'s client (see
    ``SAME_PAGE_ROUNDS``), or None where the medium has no such calls."""
    same_pages = SAME_PAGE_ROUNDS.get(backend.scheme)
    return None if same_pages is None else await same_pages(backend, src_slots, dst_slots, batch=batch)


# --- file:// ------------------------------------------------------------------------------------
def drop_page_cache(path: Path | None = None) -> bool:
    """Best effort: evict cached file pages (whole cache as root, else this file). True if done."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        pass
    if path is None:
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def _timed_streams(work: Callable[[int], object], streams: int) -> float:
    """Seconds for ``work(i)`` on ``streams`` threads at once."""
    with ThreadPoolExecutor(streams) as pool:
        start = time.perf_counter()
        list(pool.map(work, range(streams)))
        return time.perf_counter() - start


def file_ceiling(url: str, *, page_bytes: int, pages: int, batch: int | None = None) -> dict[str, Any]:
    """Direct-I/O sequential write (fsynced) and cold read of ``pages * page_bytes`` in the same
    directory, 8 MiB requests, by one stream and by as many streams as the backend has workers
    (each on its own stretch of the file). ``raw_*`` is the faster of the two: the medium's
    ceiling, which on a virtual disk a single stream may not reach."""
    from ...backends.file import TEMP_PREFIX, FileOptions, direct_io_works
    from ...backends.url_options import options_from_url, split_url

    path_text = unquote(split_url(url).path)
    # The same parse as the backend's: a bad value is a ConfigError naming it.
    workers = options_from_url(FileOptions, url, path=path_text).workers
    root = Path(path_text)
    root.mkdir(parents=True, exist_ok=True)
    chunk = 8 << 20
    chunks = max(workers, -(-pages * page_bytes // chunk))
    total = chunks * chunk
    path = root / f"{TEMP_PREFIX}raw-{secrets.token_hex(4)}"
    flags = os.O_DIRECT if direct_io_works(root) else 0
    buffers = [mmap.mmap(-1, chunk) for _ in range(workers)]
    for b in buffers:
        b.write(os.urandom(chunk))
    result: dict[str, Any] = {"raw_method": f"{'O_DIRECT' if flags else 'buffered'} 8 MiB requests, 1 and {workers} "
                                            f"streams, best of the two"}
    try:
        for streams in (1, workers):
            parts = [range(i, chunks, streams) for i in range(streams)]
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | flags, 0o644)
            try:
                write_s = _timed_streams(lambda i, fd=fd, parts=parts: [os.pwrite(fd, buffers[i], c * chunk) for c in parts[i]],
                                         streams)
                start = time.perf_counter()
                os.fsync(fd)
                write_s += time.perf_counter() - start
            finally:
                os.close(fd)
            drop_page_cache(path)
            fd = os.open(path, os.O_RDONLY | flags)
            try:
                read_s = _timed_streams(lambda i, fd=fd, parts=parts: [os.preadv(fd, [buffers[i]], c * chunk) for c in parts[i]],
                                        streams)
            finally:
                os.close(fd)
            path.unlink()
            result[f"raw_put_{streams}_streams_gbps"] = total / write_s / 1e9
            result[f"raw_get_{streams}_streams_gbps"] = total / read_s / 1e9
    finally:
        path.unlink(missing_ok=True)
        for b in buffers:
            b.close()
    result["raw_put_gbps"] = max(v for k, v in result.items() if k.startswith("raw_put_"))
    result["raw_get_gbps"] = max(v for k, v in result.items() if k.startswith("raw_get_"))
    return result


# --- memory:// ----------------------------------------------------------------------------------
def memory_ceiling(url: str, *, page_bytes: int, pages: int, batch: int | None = None) -> dict[str, Any]:
    """The in-process store's medium is RAM: one copy of each page into a store-owned buffer
    (put) and one back out (get), page by page, with no records, keys or locks: the memcpy that
    any in-memory store pays at least once each way (best of three passes)."""
    import numpy as np

    source = np.frombuffer(os.urandom(page_bytes), dtype=np.uint8)
    stored = [np.empty(page_bytes, dtype=np.uint8) for _ in range(pages)]
    target = np.empty(page_bytes, dtype=np.uint8)
    put_s = get_s = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for page in stored:
            np.copyto(page, source)
        put_s = min(put_s, time.perf_counter() - start)
        start = time.perf_counter()
        for page in stored:
            np.copyto(target, page)
        get_s = min(get_s, time.perf_counter() - start)
    total = pages * page_bytes
    return {"raw_put_gbps": total / put_s / 1e9, "raw_get_gbps": total / get_s / 1e9,
            "raw_method": f"memcpy of {pages} pages of {page_bytes:,} B into and out of process memory (numpy copyto, "
                          f"best of 3)"}


# --- redis:// -----------------------------------------------------------------------------------
def redis_ceiling(url: str, *, page_bytes: int, pages: int, batch: int | None = None) -> dict[str, Any]:
    """``redis-benchmark`` SET then GET of ``pages`` values of ``page_bytes`` on the same server,
    with as many connections as the backend uses (``max_in_flight``), no pipelining."""
    import shutil
    import subprocess

    import redis

    from ...backends.redis_options import parse_redis_url

    options = parse_redis_url(url, {})
    tool = shutil.which("redis-benchmark")
    if tool is None:
        raise BackendUnavailableError("redis-benchmark is not on PATH (Debian/Ubuntu: apt-get install redis-tools)")
    args = [tool, "-t", "set,get", "-d", str(page_bytes), "-n", str(max(pages, 1)),
            "-c", str(options.max_in_flight), "--dbnum", str(options.db), "--csv"]
    args += ["-s", options.path] if options.path else ["-h", options.host, "-p", str(options.port)]
    if options.password:
        args += ["-a", options.password] + (["--user", options.username] if options.username else [])
    if options.tls:
        args += ["--tls"] + (["--cacert", options.ssl_ca_certs] if options.ssl_ca_certs else [])
        args += (["--cert", options.ssl_certfile] if options.ssl_certfile else [])
        args += (["--key", options.ssl_keyfile] if options.ssl_keyfile else [])
        args += ["--insecure"] if options.ssl_cert_reqs == "none" else []

    def requests_per_second(argv: list[str]) -> dict[str, float]:
        try:
            run = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"redis-benchmark against {options.address} failed: {exc}; {getattr(exc, 'stderr', '')}") from exc
        found = {}
        for line in run.stdout.splitlines():
            fields = [f.strip('"') for f in line.split(",")]
            if len(fields) > 1 and fields[0] in ("SET", "GET"):
                found[fields[0]] = float(fields[1])
        if not found:
            raise BackendError(f"redis-benchmark printed no SET/GET results: {run.stdout[-500:]} {run.stderr[-500:]}")
        return found

    rps = requests_per_second(args)
    if set(rps) != {"SET", "GET"}:
        raise BackendError(f"redis-benchmark gave {sorted(rps)}, expected SET and GET")
    # Plain redis-benchmark rewrites one key, so the server reuses the same memory; a cache
    # stores distinct keys. `-r` gives the same workload as put_from, for the record.
    distinct_args = [a if a != "set,get" else "set" for a in args] + ["-r", "1000000000"]
    distinct = requests_per_second(distinct_args)["SET"]
    # redis-benchmark's own key (no -r: one key, rewritten); do not leave 3 MB behind.
    client_options: dict[str, Any] = dict(db=options.db, username=options.username or None, password=options.password or None,
                                          socket_timeout=options.socket_timeout_s, socket_connect_timeout=options.connect_timeout_s)
    if options.path:
        client = redis.Redis(unix_socket_path=options.path, **client_options)
    elif options.tls:
        client = redis.Redis(host=options.host, port=options.port, ssl=True, **client_options, **options.redis_py_tls())
    else:
        client = redis.Redis(host=options.host, port=options.port, **client_options)
    try:
        with client:
            client.delete("key:__rand_int__")
            # The -r run's keys are key:<12 digits>.
            stale = list(client.scan_iter(match="key:" + "[0-9]" * 12, count=1000))
            if stale:
                client.delete(*stale)
    except redis.RedisError as exc:
        raise BackendError(f"redis at {options.address}: removing redis-benchmark's key failed: {exc}") from exc
    return {
        "raw_put_gbps": rps["SET"] * page_bytes / 1e9,
        "raw_get_gbps": rps["GET"] * page_bytes / 1e9,
        "raw_put_distinct_keys_gbps": distinct * page_bytes / 1e9,
        "raw_method": f"redis-benchmark -t set,get -d {page_bytes} -n {pages} -c {options.max_in_flight} (and -t set -r 1e9)",
    }


# --- mooncake:// --------------------------------------------------------------------------------
MOONCAKE_BATCH = 16  # pages per call in mooncake_ceiling, unless the caller names its own batch
MOONCAKE_ROUNDS = 3


def mooncake_ceiling(url: str, *, page_bytes: int, pages: int, batch: int | None = None) -> dict[str, Any]:
    """Mooncake's own calls on ``pages`` values of ``page_bytes``, store memory in a second process.

    The ceiling is its zero-copy ``batch_put_from`` / ``batch_get_into`` from and into one
    registered buffer (``raw_*``); its bytes API ``put_batch`` / ``get_batch`` is the naive path
    (``naive_*``), both medians of warm rounds. For a pure-client URL the calls use the store memory
    already contributed (as the backend does), else a fresh second process's. ``raw_*_cold``: the
    first pass, into a fresh segment and destinations never touched, to set beside a benchmark's
    own first pass. This process is a pure client, as the backend under test should be.
    """
    from ...backends.mooncake import MooncakeOptions, open_store
    from .segment_holder import SegmentHolder

    options = MooncakeOptions.from_url(url)
    batch = batch or MOONCAKE_BATCH
    if page_bytes <= 0 or pages <= 0 or batch <= 0:
        raise ConfigError(f"mooncake ceiling: page_bytes, pages and batch must be > 0, got {page_bytes}, {pages}, {batch}")
    total = page_bytes * pages
    # Room for every page twice over (the store evicts above 95% full), whatever the allocator rounds.
    donor = dataclasses.replace(options, contribute_segment=True, global_segment_bytes=2 * total + (64 << 20))
    client = dataclasses.replace(options, contribute_segment=False, global_segment_bytes=None,
                                 local_buffer_bytes=max(options.local_buffer_bytes, batch * page_bytes + (16 << 20)))
    # A pure-client URL means segments are already contributed (the deployment's own holder): the
    # ceiling then runs against that same store memory, as the backend under test does. Otherwise
    # a fresh second process contributes it.
    holder = SegmentHolder(donor) if options.contribute_segment else contextlib.nullcontext()
    with holder:
        store = open_store(client)
        buffer = mmap.mmap(-1, 2 * total)  # sources, then the destinations of the gets
        try:
            return _mooncake_rounds(store, buffer, page_bytes, pages, batch)
        finally:
            store.close()
            buffer.close()


def _mooncake_rounds(store: Any, buffer: mmap.mmap, page_bytes: int, pages: int, batch_pages: int) -> dict[str, Any]:
    import numpy as np

    total = page_bytes * pages
    np.frombuffer(buffer, dtype=np.uint8)[:total] = np.random.default_rng().integers(0, 256, total, dtype=np.uint8)
    address = _buffer_address(buffer)
    _check(store.register_buffer(address, len(buffer)), "register_buffer")
    batches = [range(i, min(i + batch_pages, pages)) for i in range(0, pages, batch_pages)]
    view = memoryview(buffer)
    offsets = [i * page_bytes for i in range(pages)]

    def timed(fn: Callable[[], None]) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def one_round() -> dict[str, float]:
        prefix = f"tkv-raw-{secrets.token_hex(6)}"
        keys = [f"{prefix}-{i}" for i in range(pages)]

        def put_bytes() -> None:
            for batch in batches:
                values = [view[i * page_bytes:(i + 1) * page_bytes] for i in batch]  # noqa: F821 (bound until the del after the last round)
                _check(store.put_batch([f"{prefix}-b-{i}" for i in batch], values), "put_batch")

        def get_bytes() -> None:
            for batch in batches:
                values = store.get_batch([f"{prefix}-b-{i}" for i in batch])
                if [len(v) for v in values] != [page_bytes] * len(batch):
                    raise BackendError("mooncake: get_batch returned values of the wrong length")

        out = {"raw_put": _zero_copy_pass(store.batch_put_from, keys, [address + o for o in offsets], page_bytes, batch_pages),
               "raw_get": _zero_copy_pass(store.batch_get_into, keys, [address + total + o for o in offsets], page_bytes,
                                          batch_pages)}
        store.batch_remove(keys, True)
        out["naive_put"] = timed(put_bytes)
        out["naive_get"] = timed(get_bytes)
        store.batch_remove([f"{prefix}-b-{i}" for i in range(pages)], True)
        return out

    try:
        # The first round is also the warm-up: the holder's segment and our destinations fault
        # their pages in. Its zero-copy figures are reported apart, as the cold first pass.
        cold = one_round()
        rounds = [one_round() for _ in range(MOONCAKE_ROUNDS)]
    finally:
        del view
        store.unregister_buffer(address)
    gigabytes = page_bytes * pages / 1e9
    result: dict[str, Any] = {f"{name}_gbps": gigabytes / statistics.median(r[name] for r in rounds)
                              for name in rounds[0]}
    result["raw_put_cold_gbps"] = gigabytes / cold["raw_put"]
    result["raw_get_cold_gbps"] = gigabytes / cold["raw_get"]
    result["raw_method"] = (f"mooncake batch_put_from / batch_get_into ({batch_pages} pages per call; naive_*: "
                            f"put_batch / get_batch of bytes), store memory in a second process, "
                            f"median of {MOONCAKE_ROUNDS} rounds after a warm-up (raw_*_cold: the warm-up, "
                            f"into a fresh segment and untouched destinations)")
    return result


async def mooncake_same_pages(backend: Any, src_slots: list[int], dst_slots: list[int], *, batch: int) -> dict[str, float]:
    """``batch_put_from`` / ``batch_get_into`` of the slots' bytes on the backend's own store client
    and registered pool: the ceiling on the same pages, with nothing of ours around it."""
    pool = backend.pool  # NoHostPoolError on a key-only backend: it registered no buffer

    def same_pages() -> dict[str, float]:
        store, size = backend.store, pool.record_bytes
        keys = [f"tkv-raw-{secrets.token_hex(6)}-{i}" for i in range(len(src_slots))]
        # One transfer slot of the backend's own, so the round never overlaps its transfers.
        with backend.transfer_slot():
            try:
                return {"raw_put_s": _zero_copy_pass(store.batch_put_from, keys,
                                                     [pool.slot_address(s) for s in src_slots], size, batch),
                        "raw_get_s": _zero_copy_pass(store.batch_get_into, keys,
                                                     [pool.slot_address(s) for s in dst_slots], size, batch)}
            finally:
                store.batch_remove(keys, True)

    return await backend.run_blocking(same_pages, hold_slots=dst_slots)


def _zero_copy_pass(call: Any, keys: list[str], addresses: list[int], size: int, batch: int) -> float:
    """Seconds for ``call`` (``batch_put_from`` / ``batch_get_into``) to move every key from or
    into its address, ``batch`` keys per call; a failed key raises."""
    start = time.perf_counter()
    for i in range(0, len(keys), batch):
        codes = call(keys[i:i + batch], addresses[i:i + batch], [size] * len(keys[i:i + batch]))
        for code in codes:
            _check(code, call.__name__)
    return time.perf_counter() - start


def _buffer_address(buffer: mmap.mmap) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def _check(code: int, what: str) -> None:
    if code < 0:
        from ...backends.mooncake import mooncake_error

        raise mooncake_error(code, what)


#: scheme -> the medium's own put / get (blocking; see the module docstring).
CEILINGS: dict[str, Ceiling] = {
    "memory": memory_ceiling,
    "file": file_ceiling,
    "redis": redis_ceiling,
    "rediss": redis_ceiling,
    "unix": redis_ceiling,
    "mooncake": mooncake_ceiling,
}

#: scheme -> the medium's own calls on a round's very slots, through the backend's client (async).
SAME_PAGE_ROUNDS: dict[str, SamePageRound] = {
    "mooncake": mooncake_same_pages,
}
