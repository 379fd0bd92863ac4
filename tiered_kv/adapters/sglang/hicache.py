"""tiered-kv's L3 backends (file, Redis, Mooncake, memory) as SGLang's HiCache storage backend.

SGLang (0.5.23) loads it with ``--hicache-storage-backend dynamic
--hicache-storage-backend-extra-config '{"backend_name": "tiered_kv", "module_path":
"tiered_kv.adapters.sglang.hicache", "class_name": "HiCacheBackend", "interface_v1": 1,
"url": "redis://host:6379/0"}'``, builds it as ``HiCacheBackend(storage_config, kwargs)`` and
registers its host pools (``register_mem_pool_host``, ``register_mem_host_pool_v2`` per pool,
``on_host_pools_registered``). Pages move between SGLang's own host pools and the backend:

* one page is one tiered-kv record holding every component of every pool: K and V (MHA), the
  latent (MLA), the latent *and* DSA's indexer keys. A record verifies whole or is a miss, so
  ``batch_exists`` and ``batch_exists_v2`` never disagree and no page's latent comes back without
  its indexer, or with one of another write;
* SGLang writes the indexer first (``batch_set_v2``), then the KV (``batch_set_v1``): the indexer
  set only notes which host page holds it, and the KV set writes the one record of both;
* SGLang reads the KV (``batch_get_v1``), then the indexer (``batch_get_v2``): the KV get reads
  the record and fills both pools; the indexer get is answered from that read (a page it did not
  fill is read again, whole);
* keys are SGLang's page hashes in the linker's namespace (spec fingerprint, model, layer range,
  TP shard of head-sharded MHA pools), so this backend and the tiered-kv linker share pages.

Where every registered pool holds a page of each component as one range of its buffer (SGLang's
``page_first_direct`` layouts; ``hicache_pages.CONTIGUOUS``) and the backend moves records in parts
(``Backend.moves_parts``: file, Redis, Mooncake, memory), a page is moved in place: a slot of a
``BoundPool`` keeps the record's 4 KiB header and takes SGLang's ranges as its payload, so the
backend reads into and writes from SGLang's host pool with no copy, and the record is sealed and
verified over those ranges. Such a call returns only once nothing reads or writes SGLang's pages
any more (a call past its timeout is cancelled and waited for, with a warning once it is past the
timeout again: a backend thread stuck in the kernel keeps SGLang's thread waiting rather than let
a late write land in a page SGLang reused). Every other layout passes through
the slot's own payload, where the page is gathered or scattered (one staging copy). A failing or
unreachable L3 makes calls answer False / 0 (a miss: SGLang recomputes), never raise.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo,
                                                  PoolName, PoolTransfer, PoolTransferResult)

from ...errors import BackendError, ConfigError, TieredKVError
from ...model import record
from ...model.bound_pool import BoundPool
from .hicache_pages import PoolPages, host_spec, pool_pages
from .linker import linker_namespace

log = logging.getLogger(__name__)

#: Keys of the extra config that SGLang itself reads; ours are ``_OPTIONS``.
_SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1"}
#: How many noted indexer writes / served indexer reads are kept for the KV call that follows.
_NOTED = 4096


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"hicache extra_config.{what} must be a non-empty string, got {value!r:.60}")
    return value


def _salt(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"hicache extra_config.{what} must be a string, got {value!r:.60}")
    return value


def _slots(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"hicache extra_config.{what} must be an int >= 1, got {value!r:.60}")
    return value


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"hicache extra_config.{what} must be true or false, got {value!r:.60}")
    return value


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 3600:
        raise ConfigError(f"hicache extra_config.{what} must be seconds in (0, 3600), got {value!r:.60}")
    return float(value)


#: Our keys of ``--hicache-storage-backend-extra-config``: their check and default (None: required).
_OPTIONS: dict[str, tuple[Callable[[object, str], Any], Any]] = {
    "url": (_text, None),  # file:///dir, redis://host:port/db, mooncake://..., memory://
    "model": (_text, ""),  # the namespace's model; default: SGLang's model name
    "tenant_salt": (_salt, ""),  # keeps two tenants' pages apart
    "staging_slots": (_slots, 64),  # pages in flight between SGLang's pools and L3 at once
    "timeout_s": (_seconds, 30.0),  # one L3 call; past it the pages are a miss (an in-place call cancelled)
    "in_place": (_flag, True),  # false: every page through a staging slot, whatever the layout
}


def hicache_options(extra: dict | None) -> dict[str, Any]:
    """Our options from SGLang's extra config: an unknown key, a bad value or a missing ``url`` or
    ``interface_v1`` is a ConfigError naming it."""
    extra = dict(extra or {})
    if not extra.get("interface_v1"):
        raise ConfigError('the tiered-kv HiCache backend needs "interface_v1": 1 in '
                          "--hicache-storage-backend-extra-config (SGLang then moves pages by host index)")
    ours = {k: v for k, v in extra.items() if k not in _SGLANG_KEYS}
    unknown = sorted(set(ours) - set(_OPTIONS))
    if unknown:
        raise ConfigError(f"hicache extra_config: unknown key(s) {unknown}; known: {sorted(_OPTIONS)}")
    if "url" not in ours:
        raise ConfigError('hicache extra_config needs "url" (file:///dir, redis://..., mooncake://..., memory://)')
    return {name: check(ours[name], name) if name in ours else default for name, (check, default) in _OPTIONS.items()}


#: What a call that reaches L3 may fail with: the pages it asked about are a miss (cancelled:
#: the backend was closed under the call).
_L3_FAILURES = (TieredKVError, concurrent.futures.TimeoutError, TimeoutError, OSError,
                concurrent.futures.CancelledError)


class _LoopThread:
    """An asyncio loop on a thread of its own: SGLang calls from its prefetch and backup threads."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._calls: set[asyncio.Task] = set()  # loop-side only: the calls running now
        self._thread = threading.Thread(target=self.loop.run_forever, name="tkv-hicache-loop", daemon=True)
        self._thread.start()

    async def _tracked(self, coroutine: Any) -> Any:
        task = asyncio.current_task()
        self._calls.add(task)
        try:
            return await coroutine
        finally:
            self._calls.discard(task)

    def submit(self, coroutine: Any) -> concurrent.futures.Future:
        """Start ``coroutine`` on the loop; a BackendError once the loop is closed. A caller that
        stops waiting does not cancel it (the future would be done while the task still ran):
        ``call_soon`` a cancel instead, or ``cancel_calls`` at close."""
        tracked = self._tracked(coroutine)
        try:
            return asyncio.run_coroutine_threadsafe(tracked, self.loop)
        except RuntimeError as error:  # closed under a call that had passed the closed check
            tracked.close()
            coroutine.close()
            raise BackendError("the tiered-kv HiCache backend is closed") from error

    def run(self, coroutine: Any, timeout_s: float) -> Any:
        return self.submit(coroutine).result(timeout=timeout_s)

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the loop; nothing once the loop is closed (nothing runs there then)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(callback)

    @property
    def running(self) -> bool:
        """Whether the loop still runs calls (a stopped loop never resumes one)."""
        return self.loop.is_running()

    def cancel_calls(self, timeout_s: float) -> None:
        """Cancel every call running on the loop and wait, at most ``timeout_s``, until each ended."""
        async def _cancel() -> None:
            calls = list(self._calls)
            for task in calls:
                task.cancel()
            if calls:
                await asyncio.wait(calls, timeout=timeout_s)

        with contextlib.suppress(RuntimeError, concurrent.futures.TimeoutError):
            asyncio.run_coroutine_threadsafe(_cancel(), self.loop).result(timeout=timeout_s + 1)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.call_soon(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


class _Lease:
    """Staging slots and the one L3 call that uses them."""

    def __init__(self, slots: list[int], loop: _LoopThread, timeout_s: float, in_place: bool, reads: bool) -> None:
        self.slots = slots
        self.call: concurrent.futures.Future | None = None
        self.loop = loop
        self.timeout_s = timeout_s
        self.in_place = in_place
        self.reads = reads
        self.answered = False  # the call returned its answer (not an error, not the timeout)
        self._task: asyncio.Task | None = None  # loop-side only
        self._abandoned = False  # loop-side only

    async def _tracked(self, coroutine) -> Any:
        if self._abandoned:  # timed out before it even started
            coroutine.close()
            raise asyncio.CancelledError
        self._task = asyncio.current_task()
        return await coroutine

    def _abandon(self) -> None:
        """On the loop: cancel the call, or keep it from starting."""
        self._abandoned = True
        if self._task is not None:
            self._task.cancel()

    def run(self, coroutine) -> Any:
        """The call's answer, waited for at most the timeout (a staged call that outlives it keeps
        the slots; an in-place one is cancelled, and the lease's exit waits until it let go).
        ``call`` is done only once the call's task is: it is cancelled on the loop, never through
        the future, which would mark it done while the task still runs."""
        self.call = self.loop.submit(self._tracked(coroutine))
        try:
            answer = self.call.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            if self.in_place:
                self.loop.call_soon(self._abandon)
            raise
        self.answered = True
        return answer


class _Staging:
    """The staging pool's slots, taken by SGLang's threads in chunks of at most half the pool."""

    def __init__(self, pool: BoundPool) -> None:
        self.pool = pool
        self.chunk = max(1, pool.num_slots // 2)
        self._array = pool.buffer.numpy()
        self._room = threading.Condition()
        self._leases = 0  # leases SGLang's threads are inside now
        self._closing = False

    def take(self, count: int, deadline: float) -> list[int] | None:
        with self._room:
            while True:
                if self._closing:
                    return None
                self.pool.reap()
                if self.pool.free_slots >= count:
                    return self.pool.allocate(count)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None  # slots still held by a backend call that timed out
                self._room.wait(min(left, 0.05))

    def give(self, slots: Sequence[int], call: concurrent.futures.Future | None) -> None:
        """Free ``slots`` once ``call`` (the L3 call that used them, if any) has returned."""
        with self._room:
            self.pool.free(slots, call)
            self._room.notify_all()

    def _idle(self, lease: _Lease) -> bool:
        call = lease.call
        if call is not None and not call.done() and lease.loop.running:
            return False  # a call on a stopped loop never resumes: only its threads may still run
        return not any(self.pool.is_held(slot) for slot in lease.slots)

    def wait_idle(self, lease: _Lease) -> None:
        """Block until nothing of ``lease``'s call is left: the call and every backend thread that
        held its slots have returned, so nothing touches the SGLang pages they are bound to. A
        cancelled call ends at once; a backend thread ends with its system call, so this waits
        past the timeout only for a stuck medium, and says so once."""
        started, warned = time.monotonic(), False
        while not self._idle(lease):
            if not warned and time.monotonic() - started > lease.timeout_s:
                log.warning("tiered-kv HiCache: an L3 call on %d of SGLang's pages still runs %.0f s after it was "
                            "cancelled; SGLang's thread waits for it so no late byte lands in a reused page",
                            len(lease.slots), time.monotonic() - started)
                warned = True
            time.sleep(0.005)

    def stop_leasing(self) -> None:
        """Lease no more slots: a caller waiting for some gets None at once."""
        with self._room:
            self._closing = True
            self._room.notify_all()

    def wait_leases_left(self, timeout_s: float) -> bool:
        """Wait, at most ``timeout_s``, for the threads inside a lease to leave it; whether all did
        (only then may the pool's memory go)."""
        deadline = time.monotonic() + timeout_s
        with self._room:
            while self._leases and (left := deadline - time.monotonic()) > 0:
                self._room.wait(left)
            return not self._leases

    def chunks(self, count: int) -> Iterator[range]:
        """Positions ``0..count`` in runs the pool can stage at once."""
        return (range(start, min(start + self.chunk, count)) for start in range(0, count, self.chunk))

    @contextlib.contextmanager
    def lease(self, count: int, loop: Any, timeout_s: float, *, in_place: bool = False,
              reads: bool = False) -> Iterator[_Lease | None]:
        """``count`` slots for one L3 call (None: none came free within ``timeout_s``), given back
        on exit once that call, if it ran, has returned. The slots start unbound (a slot keeps
        the binding of its last call, to pages SGLang may have reused since). ``in_place``: the
        caller binds them to SGLang's pages, and the exit returns only once nothing of the call
        touches them; a read (``reads``) that gave no answer then zeroes the pages it bound, so
        no byte of it is left there."""
        with self._room:
            self._leases += 1
        try:
            slots = self.take(count, time.monotonic() + timeout_s)
            if slots is None:
                yield None
                return
            for slot in slots:
                self.pool.unbind(slot)
            lease = _Lease(slots, loop, timeout_s, in_place, reads)
            try:
                yield lease
            finally:
                if in_place:
                    self.wait_idle(lease)
                    if reads and not lease.answered:
                        for slot in slots:
                            self.pool.wipe(slot)  # an unbound slot: its own memory only
                self.give(slots, lease.call)
        finally:
            with self._room:
                self._leases -= 1
                self._room.notify_all()

    def payload(self, slot: int) -> np.ndarray:
        start = slot * self.pool.slot_bytes + record.HEADER_BYTES
        return self._array[start:start + self.pool.spec.page_bytes]


class _Noted:
    """A bounded key -> host page map, thread-safe (noted indexer writes, served indexer reads)."""

    def __init__(self) -> None:
        self._pages: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, key: str, page: int) -> None:
        with self._lock:
            self._pages[key] = page
            self._pages.move_to_end(key)
            while len(self._pages) > _NOTED:
                self._pages.popitem(last=False)

    def take(self, key: str) -> int | None:
        with self._lock:
            return self._pages.pop(key, None)


class _Pages:
    """What the registered host pools make: the spec, a view of each pool, the staging pool, the
    namespace's root and the backend. Built once the pools are known; closed with the backend."""

    def __init__(self, config: HiCacheStorageConfig, options: dict, pools: dict[str, Any], loop: _LoopThread) -> None:
        kv_host = pools[PoolName.KV.value]
        ordered = {PoolName.KV.value: kv_host, **{n: h for n, h in pools.items() if n != PoolName.KV.value}}
        self.spec = host_spec(ordered)
        self.pools = {name: pool_pages(self.spec, name, host) for name, host in pools.items()}
        covered = sum(len(p.views) for p in self.pools.values())
        if covered != len(self.spec.components):
            raise ConfigError(f"the host pools hold {covered} of the spec's {len(self.spec.components)} components")
        in_place = options["in_place"] and all(p.contiguous for p in self.pools.values())
        model = options["model"] or config.model_name or "sglang"
        self.namespace = linker_namespace(self.spec, model, options["tenant_salt"], replicated=bool(config.is_mla_model),
                                          tp=(config.tp_size, config.tp_rank),
                                          first_layer=int(getattr(kv_host, "start_layer", 0) or 0),
                                          cp=(config.attn_cp_size, config.attn_cp_rank))
        regions = [p.region for p in self.pools.values() if p.contiguous]
        self.staging = _Staging(BoundPool(self.spec, options["staging_slots"], regions))
        self.loop = loop
        self.timeout_s = options["timeout_s"]
        try:
            from ...backends import open_backend

            async def _open() -> Any:  # opened on the loop: async clients bind to the loop they start on
                return open_backend(options["url"], self.staging.pool)

            self.backend = loop.run(_open(), self.timeout_s)
        except BaseException:
            self.staging.pool.close()
            raise
        #: Pages move in place (no staging copy): every pool holds a page as ranges, and the
        #: backend moves records in parts.
        self.in_place = in_place and self.backend.moves_parts

    def bind(self, slot: int, host_pages: dict[str, int]) -> None:
        """Make ``slot``'s payload SGLang's ranges of ``host_pages`` (pool name -> host page)."""
        parts = sorted((part for name, page in host_pages.items() for part in self.pools[name].parts(page)),
                       key=lambda part: part[0])
        self.staging.pool.bind(slot, [array for _, array in parts])

    def key(self, page_hash: str) -> str:
        """SGLang's page hash as a key of this namespace (the linker's keys)."""
        return self.namespace.engine_key(str(page_hash).encode())

    def call(self, coroutine: Any) -> Any:
        return self.loop.run(coroutine, self.timeout_s)

    def close(self) -> None:
        """Lease no more slots, cancel the L3 calls in flight (their pages are a miss) and let
        SGLang's threads leave their leases, then close the backend and the staging pool."""
        self.staging.stop_leasing()
        self.loop.cancel_calls(self.timeout_s)
        idle = self.staging.wait_leases_left(self.timeout_s)
        try:
            self.call(self.backend.aclose())
        finally:
            if idle:  # else a thread still in a lease reads the pool; its memory goes with the last reference
                self.staging.pool.close()


def _host_pages(pages: PoolPages, host_indices: torch.Tensor, count: int) -> list[int]:
    """The host pages of ``count`` pages from SGLang's token ``host_indices``."""
    starts = host_indices.detach().to("cpu", torch.int64).flatten()
    if starts.numel() < count * pages.page_size:
        raise ConfigError(f"{starts.numel()} host indices for {count} pages of {pages.page_size} tokens")
    return [pages.page_of(int(i)) for i in starts[:count * pages.page_size:pages.page_size].tolist()]


class HiCacheBackend(HiCacheStorage):
    """A tiered-kv L3 backend behind SGLang's ``HiCacheStorage`` (v1 pages + v2 indexer sidecar)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict | None = None) -> None:
        self.options = hicache_options(storage_config.extra_config)
        if storage_config.dcp_size != 1:
            raise ConfigError("the tiered-kv HiCache backend does not store decode-context-parallel (DCP) shards")
        self.storage_config = storage_config
        self.mem_pool_host = None
        self._host_pools: dict[str, Any] = {}
        self._pages: _Pages | None = None
        self._build_lock = threading.Lock()
        self._loop = _LoopThread()
        self._noted_indexer = _Noted()  # indexer writes waiting for their KV write
        self._served_indexer = _Noted()  # indexer pages a KV read filled, for the indexer read after it
        self._missed_indexer = _Noted()  # pages a KV read missed: SGLang keeps the smaller hit, so no re-read
        self._closed = False

    # --- registration --------------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        kv = mem_pool_host.get_pool(PoolName.KV) if hasattr(mem_pool_host, "get_pool") else mem_pool_host
        self.mem_pool_host = kv
        self._register(PoolName.KV.value, kv)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._register(PoolName(host_pool_name).value, host_pool)

    def _register(self, name: str, host: Any) -> None:
        with self._build_lock:
            if self._host_pools.get(name) is host:
                return
            self._host_pools[name] = host
            if self._pages is not None:  # a pool registered late: the spec is built again on next use
                self._pages.close()
                self._pages = None

    def on_host_pools_registered(self) -> None:
        self._ready()  # a spec or layout this adapter cannot move fails the attach

    def _ready(self) -> _Pages:
        with self._build_lock:
            if self._closed:
                raise BackendError("the tiered-kv HiCache backend is closed")
            if self._pages is None:
                if PoolName.KV.value not in self._host_pools:
                    raise ConfigError("no KV host pool registered (register_mem_pool_host)")
                self._pages = _Pages(self.storage_config, self.options, dict(self._host_pools), self._loop)
            return self._pages

    def _live(self) -> _Pages | None:
        """The pages, or None where no L3 call can run (closed while SGLang's threads still call,
        or an L3 that cannot be opened): their calls answer a miss."""
        try:
            return self._ready()
        except BackendError as error:
            log.warning("tiered-kv HiCache: %s; reported as a miss", error)
            return None

    @property
    def spec(self):
        return self._ready().spec

    @property
    def backend(self):
        """The tiered-kv backend (its ``stats``), for tests and operators."""
        return self._ready().backend

    def record_key(self, page_hash: str) -> str:
        """The tiered-kv key SGLang's page hash is stored under (the linker's key of that page)."""
        return self._ready().key(page_hash)

    def layouts(self) -> dict[str, dict[str, Any]]:
        """Per registered pool: its host layout, whether a page of it is contiguous ranges, and
        whether pages move in place (no staging copy: every pool contiguous, a backend that moves
        records in parts)."""
        pages = self._ready()
        return {name: {"layout": p.layout, "contiguous": p.contiguous, "in_place": pages.in_place}
                for name, p in pages.pools.items()}

    # --- existence -----------------------------------------------------------------------------
    def _exists(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        try:
            pages = self._ready()
            return pages.call(pages.backend.exists([pages.key(k) for k in keys]))
        except _L3_FAILURES as error:
            log.warning("tiered-kv HiCache exists of %d pages failed, reported as a miss: %s", len(keys), error)
            return 0

    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        return self._exists(keys)

    def batch_exists_v2(self, keys: list[str], pool_transfers: list[PoolTransfer] | None = None,
                        extra_info: HiCacheStorageExtraInfo | None = None) -> PoolTransferResult:
        # One record holds every pool's part of a page: each pool has the KV's leading run.
        hits = self._exists(keys)
        return PoolTransferResult(kv_hit_pages=hits,
                                  extra_pool_hit_pages={t.name: hits for t in pool_transfers or ()})

    def exists(self, key: str) -> bool:
        return self._exists([key]) == 1

    # --- writes --------------------------------------------------------------------------------
    def _write(self, pages: _Pages, keys: list[str], kv_pages: list[int], indexer_pages: dict[int, int]) -> list[bool]:
        """One record per page (``indexer_pages``: position -> the indexer's host page, where the
        spec has an indexer), sealed in staging slots and put; per page, whether it is stored."""
        done = [False] * len(keys)
        for positions in pages.staging.chunks(len(keys)):
            try:
                with pages.staging.lease(len(positions), pages.loop, pages.timeout_s, in_place=pages.in_place) as lease:
                    if lease is None:
                        return done
                    record_keys = []
                    for slot, position in zip(lease.slots, positions):
                        host_pages = {PoolName.KV.value: kv_pages[position]}
                        if PoolName.INDEXER.value in pages.pools:
                            host_pages[PoolName.INDEXER.value] = indexer_pages[position]
                        if lease.in_place:
                            pages.bind(slot, host_pages)
                        else:
                            payload = pages.staging.payload(slot)
                            for name, page in host_pages.items():
                                pages.pools[name].gather(page, payload)
                        record_keys.append(pages.key(keys[position]))
                        pages.staging.pool.seal(slot, record_keys[-1])
                    stored = lease.run(pages.backend.put_from(record_keys, lease.slots))
            except _L3_FAILURES as error:
                log.warning("tiered-kv HiCache put of %d pages failed, not stored: %s", len(positions), error)
                return done
            for position, ok in zip(positions, stored):
                done[position] = bool(ok)
        return done

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        if not keys:
            return []
        pages = self._live()
        if pages is None:
            return [False] * len(keys)
        kv_pages = _host_pages(pages.pools[PoolName.KV.value], host_indices, len(keys))
        indexer_pages: dict[int, int] = {}
        if PoolName.INDEXER.value in pages.pools:
            for position, key in enumerate(keys):
                noted = self._noted_indexer.take(key)
                # The indexer is addressed by the KV's host indices: unnoted, it is at the KV's page.
                indexer_pages[position] = kv_pages[position] if noted is None else noted
        return self._write(pages, keys, kv_pages, indexer_pages)

    def batch_set_v2(self, transfers: list[PoolTransfer],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        pages = self._live()
        if pages is None:
            return {transfer.name: [False] * len(transfer.keys or ()) for transfer in transfers}
        results: dict[str, list[bool]] = {}
        for transfer in transfers:
            keys = list(transfer.keys or [])
            if transfer.name == PoolName.KV:
                results[transfer.name] = self.batch_set_v1(keys, transfer.host_indices, extra_info)
            elif transfer.name.value in pages.pools:
                # Noted only: the record of both is written with the KV, which SGLang writes next.
                for key, page in zip(keys, _host_pages(pages.pools[transfer.name.value], transfer.host_indices,
                                                       len(keys))):
                    self._noted_indexer.note(key, page)
                results[transfer.name] = [True] * len(keys)
            else:
                results[transfer.name] = [False] * len(keys)
        return results

    # --- reads ---------------------------------------------------------------------------------
    def _read(self, pages: _Pages, keys: list[str], targets: dict[str, list[int]]) -> list[bool]:
        """Read each page's record and, once verified, fill ``targets`` (pool -> host page per
        position); per page, True for the leading run of pages that landed."""
        done = [False] * len(keys)
        # In place only where the record fills every pool: a read for one pool (the indexer's, not
        # served by the KV read) must not write the others' pages.
        in_place = pages.in_place and set(targets) == set(pages.pools)
        for positions in pages.staging.chunks(len(keys)):
            try:
                with pages.staging.lease(len(positions), pages.loop, pages.timeout_s, in_place=in_place,
                                         reads=True) as lease:
                    if lease is None:
                        return done
                    if in_place:
                        for slot, position in zip(lease.slots, positions):
                            pages.bind(slot, {name: host_pages[position] for name, host_pages in targets.items()})
                    found = lease.run(pages.backend.get_into([pages.key(keys[p]) for p in positions], lease.slots))
                    for index, (slot, position, ok) in enumerate(zip(lease.slots, positions, found)):
                        if not ok:
                            if in_place:  # a page past the leading run may have landed: none is left behind
                                for rest in lease.slots[index:]:
                                    pages.staging.pool.wipe(rest)
                            return done  # a miss ends the leading run
                        if not in_place:
                            payload = pages.staging.payload(slot)
                            for name, host_pages in targets.items():
                                pages.pools[name].scatter(payload, host_pages[position])
                        done[position] = True
            except _L3_FAILURES as error:
                log.warning("tiered-kv HiCache get of %d pages failed, reported as a miss: %s", len(positions), error)
                return done
        return done

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        if not keys:
            return []
        pages = self._live()
        if pages is None:
            return [False] * len(keys)
        kv_pages = _host_pages(pages.pools[PoolName.KV.value], host_indices, len(keys))
        targets = {PoolName.KV.value: kv_pages}
        if PoolName.INDEXER.value in pages.pools:
            targets[PoolName.INDEXER.value] = kv_pages  # the indexer is addressed by the KV's indices
        done = self._read(pages, keys, targets)
        if PoolName.INDEXER.value in pages.pools:
            for key, page, ok in zip(keys, kv_pages, done):
                (self._served_indexer if ok else self._missed_indexer).note(key, page)
        return done

    def batch_get_v2(self, transfers: list[PoolTransfer],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        pages = self._live()
        if pages is None:
            return {transfer.name: [False] * len(transfer.keys or ()) for transfer in transfers}
        results: dict[str, list[bool]] = {}
        for transfer in transfers:
            keys = list(transfer.keys or [])
            if transfer.name == PoolName.KV:
                results[transfer.name] = self.batch_get_v1(keys, transfer.host_indices, extra_info)
                continue
            if transfer.name.value not in pages.pools:
                results[transfer.name] = [False] * len(keys)
                continue
            wanted = _host_pages(pages.pools[transfer.name.value], transfer.host_indices, len(keys))
            served = [self._served_indexer.take(key) == page for key, page in zip(keys, wanted)]
            missed = [self._missed_indexer.take(key) == page for key, page in zip(keys, wanted)]
            first_miss = next((i for i, hit in enumerate(served) if not hit), len(keys))
            if all(served) or missed[first_miss]:
                # The KV read answered for these pages: its leading run is theirs (SGLang keeps the
                # smaller hit, so reading an indexer whose KV missed would serve nothing).
                results[transfer.name] = [i < first_miss for i in range(len(keys))]
                continue
            # Not filled by the KV read before it: read the records again, whole, for this pool only.
            results[transfer.name] = self._read(pages, keys, {transfer.name.value: wanted})
        return results

    # --- SGLang's legacy calls: without interface_v1 the constructor refused already -----------
    def _legacy(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError('the tiered-kv HiCache backend serves SGLang\'s "interface_v1" calls only')

    get = batch_get = set = batch_set = _legacy

    # --- lifecycle -----------------------------------------------------------------------------
    def close(self) -> None:
        with self._build_lock:
            if self._closed:
                return
            self._closed = True
            pages, self._pages = self._pages, None
        try:
            if pages is not None:
                pages.close()
        finally:
            self._loop.stop()

    def clear(self) -> None:
        """SGLang's ``clear`` empties the whole storage of a backend; L3 here is shared with other
        processes and engines, so nothing is deleted."""

    def get_stats(self) -> Any:
        return None if self._pages is None else self._pages.backend.stats
