"""What the index believes L3 holds follows what L3 says: pages L3 lost behind our back (another
instance's eviction, a restart, a delete) are written again once a lookup's exists or a prefetch's
misses said so. Real file L3, real host pool, oracle bytes."""

from __future__ import annotations

import asyncio
import time

from tiered_kv import HostPool, allocate_engine_like
from tiered_kv.backends import open_backend
from tiered_kv.hierarchy import CacheManager, L3Controller, Policies, TransferHalf
from tiered_kv.hierarchy.oracle import fill_pages

from .conftest import SPEC, assert_clean, decided_lookup, keys_of, prompts


class Cache:
    """Manager + worker over a HostPool, an engine-like L1 and a file L3 in ``root``."""

    def __init__(self, root, policies: Policies, slots: int = 4) -> None:
        self.url = f"file://{root}"
        self.host = HostPool(SPEC, slots)
        self.l1 = allocate_engine_like(SPEC, 17)
        self.worker = TransferHalf(self.l1, self.host)
        self.l3 = L3Controller(lambda: open_backend(self.url, self.host), record_bytes=self.host.record_bytes)
        self.mgr = CacheManager(self.host, page_size=SPEC.page_size, policies=policies, l3=self.l3,
                                max_prefetch_slots=slots)

    def store(self, plan, keys, pages) -> None:
        if plan is None:
            return
        self.worker.store(plan, [pages[i] for i in plan.positions])
        for done in self.worker.drain():
            self.mgr.complete_store(done, True)

    def lookup(self, rid, keys):
        return decided_lookup(self.mgr, rid, keys)

    def delete_on_l3(self, keys) -> None:
        """Another client removes pages (what an eviction elsewhere or a restart does)."""
        async def run():
            async with open_backend(self.url, None) as other:
                await other.delete(list(keys))
                assert await other.exists(list(keys)) == 0
        asyncio.run(run())

    def on_l3(self, keys) -> int:
        async def run():
            async with open_backend(self.url, None) as other:
                return await other.exists(list(keys))
        return asyncio.run(run())

    def close(self) -> None:
        self.mgr.close()
        assert_clean(self.host, self.l3)
        self.host.close()


A, B, C = (keys_of(p) for p in prompts(31, [4, 4, 4]))


def test_pages_l3_lost_are_put_again_when_stored_again(tmp_path):
    """write_through over a 4-slot L2. Before: the index kept on_l3=True for A forever, so A's
    second store skipped the put (8 puts, not 12) and A was lost for good from L3."""
    c = Cache(tmp_path / "l3", Policies(write="write_through"))
    try:
        fill_pages(c.l1, A, [1, 2, 3, 4])
        c.store(c.mgr.on_l1_inserted(A), A, [1, 2, 3, 4])
        assert c.mgr.wait_idle(10) and c.mgr.stats.l3_puts == 4
        c.delete_on_l3(A)
        fill_pages(c.l1, B, [5, 6, 7, 8])
        c.store(c.mgr.on_l1_inserted(B), B, [5, 6, 7, 8])  # A leaves L2 (believed on L3)
        assert c.mgr.wait_idle(10)
        assert c.lookup("a", A).l3_pages == 0  # L3's exists says A is gone: the index learns it
        fill_pages(c.l1, A, [1, 2, 3, 4])  # the engine recomputed A
        c.store(c.mgr.on_l1_inserted(A), A, [1, 2, 3, 4])
        assert c.mgr.wait_idle(10)
        assert c.mgr.stats.l3_puts == 12  # A went down again
        assert c.on_l3(A) == 4
        fill_pages(c.l1, C, [9, 10, 11, 12])
        c.store(c.mgr.on_l1_inserted(C), C, [9, 10, 11, 12])  # A leaves L2 again
        assert c.mgr.wait_idle(10)
        assert c.lookup("b", A).l3_pages == 4
    finally:
        c.close()


def test_a_prefetch_miss_marks_the_rest_of_the_chain_gone(tmp_path):
    """A page gone between lookup and prefetch: the prefetch's miss and every page after it read
    as gone (before: only the first missing page), so storing them again puts them all."""
    c = Cache(tmp_path / "l3", Policies(write="write_through", prefetch="wait_complete"))
    try:
        fill_pages(c.l1, A, [1, 2, 3, 4])
        c.store(c.mgr.on_l1_inserted(A), A, [1, 2, 3, 4])
        assert c.mgr.wait_idle(10)
        for k in A:
            c.mgr.index.drop_l2(k)
        m = c.lookup("a", A)
        assert m.l3_pages == 4
        c.delete_on_l3(A[1:])  # after the lookup, before the prefetch
        c.mgr.start_prefetch("a", A, m)
        while not c.mgr.prefetch_done("a"):
            time.sleep(0.001)
        plan = c.mgr.prepare_load(A, "a")
        c.mgr.complete_load(plan)
        assert len(plan) == 1
        assert [bool(c.mgr.index.entry(k) and c.mgr.index.entry(k).on_l3) for k in A] == [True, False, False, False]
        puts = c.mgr.stats.l3_puts
        fill_pages(c.l1, A, [1, 2, 3, 4])
        c.store(c.mgr.on_l1_inserted(A), A, [1, 2, 3, 4])
        assert c.mgr.wait_idle(10)
        assert c.mgr.stats.l3_puts == puts + 3 and c.on_l3(A) == 4
    finally:
        c.close()


def test_write_back_evicts_a_page_on_l3_at_once_even_after_a_hit(tmp_path):
    """write_back, a 4-slot L2: A went to L3 (copied down for B), came back and was loaded (a hit).
    When L1 evicts B, A (on L3) makes room at once and B is stored whole: an eviction must not
    wait for L3 to confirm what the index already believes (a check at eviction kept A, and B's
    pages were skipped: on no tier at all)."""
    c = Cache(tmp_path / "l3", Policies(write="write_back", prefetch="wait_complete"))
    try:
        fill_pages(c.l1, A, [1, 2, 3, 4])
        c.store(c.mgr.on_l1_evicting(A), A, [1, 2, 3, 4])
        fill_pages(c.l1, B, [5, 6, 7, 8])
        assert c.mgr.on_l1_evicting(B) is None  # L2 full of A's only copies: they go down first
        assert c.mgr.wait_idle(10) and c.on_l3(A) == 4
        plan = c.mgr.prepare_load(A)
        c.mgr.complete_load(plan)
        assert len(plan) == 4  # A hit on L2
        skipped = c.mgr.stats.stores_skipped
        c.store(c.mgr.on_l1_evicting(B), B, [5, 6, 7, 8])
        assert c.mgr.stats.stores_skipped == skipped
        assert c.mgr.index.l2_run(B) == 4 and c.mgr.index.l2_run(A) == 0
        assert c.mgr.wait_idle(10) and c.lookup("a", A).l3_pages == 4  # A still served, from L3
    finally:
        c.close()


def test_write_back_close_with_drain_sends_the_last_copies_down_first(tmp_path):
    """Closing frees every L2 copy; under write_back the pages whose only copy is on L2 go to L3
    first (as an eviction would send them), so a persistent L3 keeps them for the next process."""
    c = Cache(tmp_path / "l3", Policies(write="write_back"), slots=8)
    fill_pages(c.l1, A, [1, 2, 3, 4])
    c.store(c.mgr.on_l1_evicting(A), A, [1, 2, 3, 4])
    assert c.mgr.index.l2_run(A) == 4 and c.on_l3(A) == 0  # write_back: on L2 only so far
    c.close()
    assert c.on_l3(A) == 4
