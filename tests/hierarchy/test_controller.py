"""The L3 controller alone over a real memory:// backend: futures, reads before writes,
cancellation of queued jobs, the degraded state, close, and its limits' typed errors."""

from __future__ import annotations

import asyncio
import time

import pytest

from tiered_kv import HostPool
from tiered_kv.backends import open_backend
from tiered_kv.errors import BackendUnavailableError, ConfigError
from tiered_kv.hierarchy import ControllerLimits, L3Controller

from .conftest import SPEC, assert_clean, keys_of, prompts, sealed

KEYS = keys_of(prompts(81, [8])[0])


def test_put_exists_get_round_trip_and_close():
    pool = HostPool(SPEC, 16)
    ctl = L3Controller(lambda: open_backend("memory://", pool), record_bytes=pool.record_bytes)
    try:
        src = sealed(pool, KEYS)
        assert ctl.put_from(KEYS, src).result(10) == [True] * 8
        assert ctl.exists(KEYS).result(10) == 8
        assert ctl.exists(KEYS[:3] + ["f" * 32]).result(10) == 3
        dst = pool.allocate(8)
        assert ctl.get_into(KEYS, dst).result(10) == [True] * 8
        assert all(bytes(pool.record_view(a)) == bytes(pool.record_view(b)) for a, b in zip(src, dst))
        assert ctl.stats.pages_written == 8 and ctl.stats.pages_read == 8
        pool.free(src + dst)
    finally:
        ctl.close()
    late = ctl.put_from(KEYS, [0] * 8)  # after close: refused at once, never hangs
    assert late.result(1) == [False] * 8
    assert_clean(pool, ctl)


class GatedBackend:
    """A key-only backend whose calls wait on a gate; records the order calls start in."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.gate: asyncio.Event | None = None
        self.fail = False

    async def _enter(self, what: str) -> None:
        if self.gate is None:
            self.gate = asyncio.Event()
        self.order.append(what)
        await self.gate.wait()
        if self.fail:
            raise BackendUnavailableError("server gone")

    async def exists(self, keys):
        if self.fail:
            raise BackendUnavailableError("server gone")
        return len(keys)

    async def get_into(self, keys, slots):
        await self._enter("get")
        return [True] * len(keys)

    async def put_from(self, keys, slots):
        await self._enter("put")
        return [True] * len(keys)

    async def aclose(self):
        pass


def test_reads_go_before_queued_writes_and_queued_jobs_cancel():
    backend = GatedBackend()
    ctl = L3Controller(backend, record_bytes=1, limits=ControllerLimits(read_workers=1, write_workers=1))
    try:
        first = ctl.get_into(KEYS[:1], [0])  # occupies the only read worker
        while not backend.order:
            pass
        puts = [ctl.put_from(KEYS[i:i + 1], [i]) for i in range(2, 5)]
        reads = [ctl.get_into(KEYS[1:2], [1]), ctl.get_into(KEYS[5:6], [5])]
        assert ctl.cancel(reads[1]) and reads[1].cancelled()
        ctl._loop.call_soon_threadsafe(backend.gate.set)
        assert first.result(10) == [True] and reads[0].result(10) == [True]
        assert all(p.result(10) == [True] for p in puts)
        assert backend.order[:2] == ["get", "get"]  # the waiting read before every queued write
        assert ctl.stats.reads_cancelled == 1
    finally:
        ctl.close()
    assert ctl.pending_tasks() == 0


def test_degraded_tier_answers_reads_at_once_and_recovers():
    backend = GatedBackend()
    backend.fail = True
    ctl = L3Controller(backend, record_bytes=1, limits=ControllerLimits(retry_base_s=0.01, retry_max_s=0.05))
    try:
        assert ctl.exists(KEYS).result(5) == 0  # the error becomes a miss and the tier degrades
        assert ctl.degraded and ctl.stats.degraded_episodes == 1
        assert ctl.get_into(KEYS, list(range(8))).result(5) == [False] * 8  # answered, not queued
        backend.fail = False
        deadline = time.monotonic() + 5
        while ctl.degraded and time.monotonic() < deadline:  # the health probe brings it back
            time.sleep(0.005)
        assert not ctl.degraded and ctl.stats.recoveries == 1
        assert ctl.exists(KEYS).result(5) == 8
    finally:
        ctl.close()
    assert ctl.pending_tasks() == 0


@pytest.mark.parametrize("kw", [{"read_workers": 0}, {"batch_pages": True}, {"write_batch_pages": -1},
                                {"retry_base_s": 0}, {"drain_timeout_s": float("inf")}, {"write_retries": -1}])
def test_bad_limits_are_config_errors(kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        ControllerLimits(**kw)


def test_an_orphaned_prefetch_counts_against_the_prefetch_slot_limit_until_its_reads_return():
    """A prefetch whose request ran while its reads were still running keeps its slots until they
    return; those slots are prefetch slots all that time, so max_prefetch_slots still bounds what
    prefetches hold. (Before: the count dropped at once and the next prefetch took the whole
    budget again: 8 slots held by prefetches under a limit of 4.)"""
    from tiered_kv.hierarchy import CacheManager
    from tiered_kv.model.slot_allocator import SlotAllocator

    backend = GatedBackend()
    ctl = L3Controller(backend, record_bytes=1, limits=ControllerLimits(read_workers=2, write_workers=1))
    alloc = SlotAllocator(16)
    mgr = CacheManager(alloc, page_size=16, l3=ctl, max_prefetch_slots=4)
    try:
        def decided(rid, keys):
            deadline = time.monotonic() + 10
            while (m := mgr.lookup(rid, keys)) is None:
                assert time.monotonic() < deadline
                time.sleep(0.001)
            return m

        a, b = KEYS[:4], KEYS[4:8]
        assert mgr.start_prefetch("a", a, decided("a", a)) == 4
        while not backend.order:  # a's read is running (held at the gate)
            time.sleep(0.001)
        assert len(mgr.prepare_load(a, "a")) == 0  # a runs first: its prefetch is orphaned
        assert mgr.stats.prefetches_timed_out == 1
        assert mgr.start_prefetch("b", b, decided("b", b)) == 0  # the 4 slots are still a's
        assert alloc.num_slots - alloc.free_count == 4
        ctl._loop.call_soon_threadsafe(backend.gate.set)
        assert mgr.wait_idle(10)
        mgr.abort("b")
        assert mgr.start_prefetch("b", b, decided("b2", b)) == 4  # a's reads returned: budget back
    finally:
        if backend.gate is not None:
            ctl._loop.call_soon_threadsafe(backend.gate.set)
        mgr.close()
    assert alloc.free_count == alloc.num_slots and ctl.pending_tasks() == 0
