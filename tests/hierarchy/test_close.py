"""Closing the metadata half: one bound for the whole close, and work in flight finished in any order.

- ``CacheManager.close(drain=True)`` over a backend whose calls hang returns within the
  controller's ``drain_timeout_s`` (plus the time to cancel), not after a wait of its own.
- A store or load the worker still runs when the manager closes keeps its slots until the caller
  completes it (``complete_store`` / ``complete_load`` after ``close``), without an error; the
  worker's ``finished_stores`` / ``drain`` seal them as usual.

Real HostPool, real memory:// backend (wrapped so that its calls block on an event), real
TransferHalf on an engine-like CPU pool.
"""

from __future__ import annotations

import threading
import time

import pytest

from tiered_kv import HostPool, allocate_engine_like
from tiered_kv.backends.memory import MemoryBackend
from tiered_kv.hierarchy import CacheManager, ControllerLimits, L3Controller, Policies, TransferHalf
from tiered_kv.hierarchy.oracle import fill_pages

from .conftest import PAGE, SPEC, assert_clean, decided_lookup, keys_of, prompts

KEYS = keys_of(prompts(97, [4])[0])
DRAIN_S = 1.0


class HungMemory(MemoryBackend):
    """memory:// whose ``op`` calls block on an executor thread until ``release`` is set."""

    def __init__(self, pool: HostPool, op: str, release: threading.Event) -> None:
        super().__init__(pool)
        self.op, self.release = op, release

    async def _hang(self, op: str) -> None:
        if self.op == op and not self.release.is_set():
            await self.run_blocking(self.release.wait)

    async def _put(self, keys, slots):
        await self._hang("put")
        return await super()._put(keys, slots)

    async def _get(self, keys, slots):
        await self._hang("get")
        return await super()._get(keys, slots)


def sealed_store(mgr: CacheManager, host: HostPool, keys) -> None:
    plan = mgr.prepare_store(keys)
    for k, s in zip(plan.keys, plan.slots):
        host.seal(s, k)
    mgr.complete_store(plan, True)


@pytest.mark.parametrize("op", ["put", "get"])
def test_close_with_a_hung_backend_returns_within_the_drain_timeout(op):
    host = HostPool(SPEC, 16)
    release = threading.Event()
    backend = HungMemory(host, op, release)
    l3 = L3Controller(backend, record_bytes=host.record_bytes, limits=ControllerLimits(drain_timeout_s=DRAIN_S))
    mgr = CacheManager(host, page_size=PAGE, l3=l3, max_prefetch_slots=8)
    try:
        if op == "get":  # pages on L3 only; the prefetch's read hangs
            release.set()
            sealed_store(mgr, host, KEYS)
            assert mgr.wait_idle(10)
            for k in KEYS:
                mgr.index.drop_l2(k)
            release.clear()
            match = decided_lookup(mgr, "r", KEYS)
            assert mgr.start_prefetch("r", KEYS, match) == len(KEYS)
        else:  # write_through puts the stored pages down; the put hangs
            sealed_store(mgr, host, KEYS)
        time.sleep(0.1)  # the call is running on the backend's thread
        assert mgr.busy()
        t0 = time.monotonic()
        mgr.close(drain=True)
        took = time.monotonic() - t0
        assert took < DRAIN_S + 3, f"close took {took:.1f}s with drain_timeout_s={DRAIN_S}"
        assert l3.closed and l3.pending_tasks() == 0
    finally:
        release.set()
        mgr.close()
    deadline = time.monotonic() + 10
    while host.reap() or host.free_slots < host.num_slots:  # a hung read holds its slots until it returned
        assert time.monotonic() < deadline, "slots of the hung call never came back"
        time.sleep(0.01)
    assert_clean(host, l3)
    host.close()


class Worker:
    """L1 (engine-like CPU pool), L2 and the transfer half around one manager."""

    def __init__(self, policies: Policies = Policies()) -> None:
        self.host = HostPool(SPEC, 8)
        self.l1 = allocate_engine_like(SPEC, 9)
        self.worker = TransferHalf(self.l1, self.host)
        self.mgr = CacheManager(self.host, page_size=PAGE, policies=policies)

    def store(self, keys, pages):
        fill_pages(self.l1, keys, pages)
        plan = self.mgr.on_l1_inserted(keys)
        self.worker.store(plan, [pages[i] for i in plan.positions])
        return plan


@pytest.mark.parametrize("collect", ["finished_stores", "drain"])
def test_a_store_in_flight_at_close_is_completed_after_it_without_an_error(collect):
    w = Worker()
    plan = w.store(KEYS, [1, 2, 3, 4])
    w.mgr.close()
    assert w.host.free_slots == w.host.num_slots - len(KEYS)  # the copy may still write: slots held
    finished = getattr(w.worker, collect)()  # seals the slots: they are still the store's
    assert finished == [plan]
    w.mgr.complete_store(plan, True)  # the closed manager frees them now
    assert_clean(w.host, None)
    w.host.close()


def test_a_load_in_flight_at_close_keeps_its_slots_until_it_completes():
    w = Worker()
    done = w.store(KEYS, [1, 2, 3, 4])
    for finished in w.worker.drain():
        w.mgr.complete_store(finished, True)
    assert done.completed
    match = decided_lookup(w.mgr, "r", KEYS)
    plan = w.mgr.prepare_load(KEYS, "r")
    assert len(plan) == match.l2_pages == len(KEYS)
    handle = w.worker.load(plan, [5, 6, 7, 8])
    w.mgr.close()
    assert w.host.free_slots == w.host.num_slots - len(KEYS)  # the load may still read them
    w.mgr.complete_load(plan, handle)
    assert_clean(w.host, None)
    w.host.close()
