"""The index does not grow with every page ever seen: L3-only memory is bounded, hit counts of
pages that left L1 (and are on neither L2 nor L3) are dropped when the engine evicts them."""

from __future__ import annotations

import pytest

from tiered_kv.hierarchy import CacheManager, PageIndex, Policies
from tiered_kv.model.slot_allocator import SlotAllocator

from .conftest import keys_of, prompts

KEYS = keys_of(prompts(1, [40])[0])


def test_pages_known_only_on_l3_are_bounded_oldest_forgotten():
    alloc = SlotAllocator(4)
    index = PageIndex(alloc, max_l3_only=5)
    for k in KEYS[:12]:
        (slot,) = alloc.allocate(1)
        index.begin_store(k, slot)
        index.finish_store(k, True)
        index.begin_l3_put([k])
        index.finish_l3_put([k], [True])
        index.drop_l2(k)  # now only on L3
    assert alloc.free_count == 4
    remembered = [k for k in KEYS[:12] if index.entry(k) is not None]
    assert remembered == KEYS[7:12]  # the newest five, the oldest forgotten
    assert all(index.entry(k).on_l3 and index.entry(k).state is None for k in remembered)
    # A page that comes back to L2 is no longer counted as L3-only.
    (slot,) = alloc.allocate(1)
    index.begin_store(KEYS[7], slot)
    index.finish_store(KEYS[7], True)
    for k in KEYS[12:16]:
        (s,) = alloc.allocate(1)
        index.begin_store(k, s)
        index.finish_store(k, True)
        index.begin_l3_put([k])
        index.finish_l3_put([k], [True])
        index.drop_l2(k)
    assert index.is_resident(KEYS[7])  # resident pages are never forgotten
    assert sum(1 for k in KEYS[:16] if index.entry(k) is not None and index.entry(k).state is None) == 5
    index.clear()
    assert alloc.free_count == 4 and not index.entries


def test_hit_counts_of_pages_evicted_from_l1_are_dropped():
    alloc = SlotAllocator(8)
    manager = CacheManager(alloc, page_size=16, policies=Policies(write="write_through_selective", selective_hits=3))
    assert manager.on_l1_hit(KEYS[:4]) is None  # one hit each: not yet hot
    assert all(manager.index.entry(k).hits == 1 for k in KEYS[:4])
    assert manager.on_l1_evicting(KEYS[:4]) is None
    assert all(manager.index.entry(k) is None for k in KEYS[:4])  # nothing refers to them any more
    # Counting restarts: three hits after the eviction make a page hot again.
    for _ in range(2):
        assert manager.on_l1_hit(KEYS[:1]) is None
    plan = manager.on_l1_hit(KEYS[:1])
    assert plan is not None and plan.keys == KEYS[:1]
    manager.complete_store(plan, True)
    manager.close()
    assert alloc.free_count == 8


def _write_through_pages(tmp_path, url_options: str, pages: int, slots: int = 4):
    """``pages`` distinct pages stored through a ``slots``-slot L2 onto a real file L3, each put
    landed before the next store; returns the manager (closed) and the L3 capacity it saw."""
    from tiered_kv import HostPool, allocate_engine_like
    from tiered_kv.backends import open_backend
    from tiered_kv.hierarchy import L3Controller, TransferHalf
    from tiered_kv.hierarchy.oracle import fill_pages

    from .conftest import SPEC, assert_clean

    host = HostPool(SPEC, slots)
    l1 = allocate_engine_like(SPEC, 4)
    worker = TransferHalf(l1, host)
    url = f"file://{tmp_path / 'l3'}{url_options}"
    l3 = L3Controller(lambda: open_backend(url, host), record_bytes=host.record_bytes)
    mgr = CacheManager(host, page_size=SPEC.page_size, policies=Policies(write="write_through"), l3=l3)
    capacity = l3.backend.capacity_pages
    keys = keys_of(prompts(43, [pages])[0])
    peak_entries = 0
    try:
        for i, key in enumerate(keys):
            fill_pages(l1, [key], [1 + i % 3])
            plan = mgr.on_l1_inserted([key])
            worker.store(plan, [1 + i % 3])
            for done in worker.drain():
                mgr.complete_store(done, True)
            assert mgr.wait_idle(10)
            mgr.on_l1_evicting([key])
            peak_entries = max(peak_entries, len(mgr.index.entries))
        assert mgr.stats.l3_puts == pages
    finally:
        mgr.close()
        assert_clean(host, l3)
        host.close()
    return mgr, capacity, peak_entries


def test_pages_known_only_on_l3_are_bounded_by_a_file_l3s_capacity(tmp_path):
    # The index kept an entry for every page ever written to L3 (up to 2^20), whatever L3 held:
    # 22,675 entries over a file L3 of at most 630 pages.
    from tiered_kv import HostPool

    from .conftest import SPEC

    record = HostPool(SPEC, 1)
    capacity_bytes = 6 * -(-record.record_bytes // 4096) * 4096  # six page files
    record.close()
    mgr, capacity, peak = _write_through_pages(tmp_path, f"?capacity_bytes={capacity_bytes}", pages=40)
    assert capacity is not None and 0 < capacity < 40
    assert mgr.index.max_l3_only == capacity
    # Pages on L2 (4 slots) plus at most the L3's capacity known only on L3.
    assert peak <= 4 + capacity


def test_without_an_l3_capacity_the_bound_is_a_few_times_l2(tmp_path):
    from tiered_kv.hierarchy.index import L3_ONLY_PER_L2_SLOT

    mgr, capacity, peak = _write_through_pages(tmp_path, "", pages=40)
    assert capacity is None  # a file L3 without capacity_bytes: bounded by the disk only
    assert mgr.index.max_l3_only == L3_ONLY_PER_L2_SLOT * 4
    assert peak <= 4 + L3_ONLY_PER_L2_SLOT * 4 < 40


def test_the_l3_only_bound_is_checked_and_capped():
    from tiered_kv.errors import ConfigError
    from tiered_kv.hierarchy.index import MAX_L3_ONLY, l3_only_bound

    assert l3_only_bound(None, 1 << 30) == MAX_L3_ONLY
    assert l3_only_bound(None, 3) == 12
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ConfigError, match="max_l3_only must be an int > 0"):
            PageIndex(SlotAllocator(1), max_l3_only=bad)
