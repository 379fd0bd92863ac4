"""The index does not grow with every page ever seen: L3-only memory is bounded, hit counts of
pages that left L1 (and are on neither L2 nor L3) are dropped when the engine evicts them."""

from __future__ import annotations

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
