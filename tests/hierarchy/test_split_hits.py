"""A hit whose pages sit on two tiers out of order: the head of a prefix left L2 (and is on L3)
while its tail is still on L2. The whole hit is served as one resident run: the head is read from
L3 into fresh slots, the tail is locked where it is (so making room for the head cannot evict
it), each page counts on the tier it came from, and every slot comes back.

The failure this guards against: a prefetch that ends at the first page of the L3 part with an L2
slot, or slots for the head that evict the tail, make a prompt seen again hit only its head (a
replay of a prompt, three fillers and the prompt again would hit 1,280 of its 4,096 tokens)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tiered_kv import HostPool, allocate_engine_like
from tiered_kv.backends import open_backend
from tiered_kv.hierarchy import (CacheManager, L1PrefixCache, L3Controller, NullTransferHalf, Policies,
                                 TransferHalf)
from tiered_kv.hierarchy.oracle import fill_pages, verify_pages
from tiered_kv.backends.simulated import SimulatedL3
from tiered_kv.model.slot_allocator import SlotAllocator

from .conftest import PAGE, SPEC, assert_clean, decided_lookup, keys_of, make_stack, prompts

A, B = (keys_of(p) for p in prompts(41, [6, 4]))
POLICIES = Policies(write="write_through", prefetch="wait_complete")


def _served(l1: L1PrefixCache, manager: CacheManager, rid, keys):
    deadline = time.monotonic() + 20
    while l1.lookup(rid, keys) is None:
        assert time.monotonic() < deadline, "lookup never decided"
        time.sleep(0.0005)
    l1.start(rid)
    while not manager.prefetch_done(rid):
        assert time.monotonic() < deadline, "prefetch never finished"
        time.sleep(0.0005)
    served = l1.run(rid)
    l1.poll()
    assert manager.wait_idle(30)
    l1.poll()
    return served


def _run_a_b_a(l1: L1PrefixCache, manager: CacheManager):
    """A (6 pages) fills 6 of 8 L2 slots and goes to L3; B (4 pages) evicts A's head from L2 and
    L1; A again: its head is on L3 only, its tail on L2 (and L3)."""
    first = _served(l1, manager, 0, A)
    _served(l1, manager, 1, B)
    assert manager.index.l2_run(A) == 0 and manager.index.l2_run(A, 2) == 4, "the setup: head off L2, tail on"
    hits = (manager.stats.l2_hit_pages, manager.stats.l3_hit_pages)
    again = _served(l1, manager, 2, A)
    lookup_hits = (manager.stats.l2_hit_pages - hits[0], manager.stats.l3_hit_pages - hits[1])
    return first, again, lookup_hits


def test_a_prefix_whose_head_left_l2_is_hit_whole_with_its_tail_from_l2(tmp_path):
    """Bytes moved over a file L3, every loaded byte checked against the oracle."""
    s = make_stack(f"file://{tmp_path / 'l3'}", host_slots=8, l1_pages=8, policies=POLICIES, max_prefetch_slots=8)
    try:
        first, again, lookup_hits = _run_a_b_a(s.l1, s.manager)
        assert first.computed_pages == 6
        # was l2 0, l3 2, 4 computed: the prefetch stopped at A[2] and its 2 slots evicted A[2:4]
        assert (again.l1_pages, again.l2_pages, again.l3_pages, again.computed_pages) == (0, 4, 2, 0)
        assert again.verified_pages == 6 and again.wrong_pages == 0
        assert lookup_hits == (4, 2)  # the manager's stats count the tail on L2 as the load does
        assert s.controller.stats.pages_read == 2  # only the head was read from L3
        assert all(s.manager.index.entry(k).locks == 0 for k in A + B)
    finally:
        s.close()


def test_simulate_and_bytes_agree_on_the_split_hit(tmp_path):
    """The same requests over a bare slot allocator, a simulated L3 and no bytes (the replay's
    ``--simulate``) are served from the same tiers."""
    s = make_stack(f"file://{tmp_path / 'l3'}", host_slots=8, l1_pages=8, policies=POLICIES, max_prefetch_slots=8)
    try:
        with_bytes = _run_a_b_a(s.l1, s.manager)
    finally:
        s.close()
    alloc = SlotAllocator(8)
    ctl = L3Controller(SimulatedL3(1000), record_bytes=1)
    manager = CacheManager(alloc, page_size=PAGE, policies=POLICIES, l3=ctl, max_prefetch_slots=8)
    l1 = L1PrefixCache(8, manager, NullTransferHalf())
    try:
        simulated = _run_a_b_a(l1, manager)
    finally:
        l1.close()
    assert_clean(alloc, ctl)
    strip = [(r.l1_pages, r.l2_pages, r.l3_pages, r.computed_pages) for r in with_bytes[:2]]
    assert strip == [(r.l1_pages, r.l2_pages, r.l3_pages, r.computed_pages) for r in simulated[:2]]
    assert with_bytes[2] == simulated[2] == (4, 2)


class Cache:
    """Manager + worker over a HostPool, an engine-like L1 and a file L3 (no L1 cache: the
    test moves every page by hand)."""

    def __init__(self, root, slots: int, max_prefetch_slots: int | None = None) -> None:
        self.url = f"file://{root}"
        self.host = HostPool(SPEC, slots)
        self.l1 = allocate_engine_like(SPEC, 17)
        self.worker = TransferHalf(self.l1, self.host)
        self.l3 = L3Controller(lambda: open_backend(self.url, self.host), record_bytes=self.host.record_bytes)
        self.mgr = CacheManager(self.host, page_size=PAGE, policies=POLICIES, l3=self.l3,
                                max_prefetch_slots=slots if max_prefetch_slots is None else max_prefetch_slots)

    def store(self, keys, pages) -> None:
        fill_pages(self.l1, keys, pages)
        plan = self.mgr.on_l1_inserted(keys)
        self.worker.store(plan, [pages[i] for i in plan.positions])
        for done in self.worker.drain():
            self.mgr.complete_store(done, True)
        assert self.mgr.wait_idle(10)

    def lookup(self, rid, keys):
        return decided_lookup(self.mgr, rid, keys)

    def load(self, rid, keys, pages):
        """Prefetch, load into L1 ``pages`` (cleared first), verify; returns the plan."""
        m = self.lookup(rid, keys)
        self.mgr.start_prefetch(rid, keys, m)
        while not self.mgr.prefetch_done(rid):
            time.sleep(0.0005)
        plan = self.mgr.prepare_load(keys, rid)
        fill_pages(self.l1, ["0" * 32] * len(plan), pages[:len(plan)])  # not the pages' own bytes
        handle = self.worker.load(plan, pages[:len(plan)])
        self.mgr.complete_load(plan, handle)
        getattr(handle, "synchronize", lambda: None)()
        assert verify_pages(self.l1, plan.keys, pages[:len(plan)]) == [True] * len(plan)
        return m, plan

    def delete_on_l3(self, keys) -> None:
        async def run():
            async with open_backend(self.url, None) as other:
                await other.delete(list(keys))
        asyncio.run(run())

    def close(self) -> None:
        self.mgr.close()
        assert_clean(self.host, self.l3)
        self.host.close()


def test_a_tail_l3_lost_but_l2_holds_completes_the_hit(tmp_path):
    """L3 holds the head only (it evicted the tail, or write_back never copied the tail down while
    L2 held it), L2 the tail only: the hit is the whole prompt, one read per head page, not the
    head alone that L3's exists answers (2 pages)."""
    c = Cache(tmp_path / "l3", slots=8)
    try:
        c.store(A, [1, 2, 3, 4, 5, 6])
        c.delete_on_l3(A[2:])
        for k in A[:2]:
            c.mgr.index.drop_l2(k)
        m, plan = c.load("a", A, [7, 8, 9, 10, 11, 12])
        assert (m.l2_pages, m.l3_pages) == (0, 6)
        assert plan.keys == A and plan.from_l3 == [True, True, False, False, False, False]
        assert (plan.pages_from_l2, plan.pages_from_l3) == (4, 2)
        assert c.l3.stats.pages_read == 2
        assert all(c.mgr.index.entry(k).locks == 0 for k in A)
    finally:
        c.close()


@pytest.mark.parametrize("free_for_reads", [0, 1])
def test_a_prefetch_l2_cannot_make_room_for_ends_before_the_first_read_without_a_slot(tmp_path, free_for_reads):
    """L2 of 6 + free_for_reads slots: A's tail (4, locked by the prefetch) and B's 2 pages locked
    by a load in flight leave room for at most ``free_for_reads`` of the head's 2 reads. The run
    ends before the first read without a slot, the tail pages beyond it are unlocked again, and
    every slot comes back."""
    c = Cache(tmp_path / "l3", slots=6 + free_for_reads)
    try:
        c.store(A, [1, 2, 3, 4, 5, 6])
        for k in A[:2]:
            c.mgr.index.drop_l2(k)
        c.store(B[:2], [7, 8])
        other = c.mgr.prepare_load(B[:2])  # another request's load, still running
        m, plan = c.load("a", A, [9, 10, 11, 12, 13, 14])
        assert (m.l2_pages, m.l3_pages) == (0, 6)
        assert plan.keys == A[:free_for_reads] and plan.from_l3 == [True] * free_for_reads
        assert all(c.mgr.index.entry(k).locks == 0 for k in A[2:])  # unlocked, not leaked
        c.mgr.complete_load(other)
        assert c.mgr.index.l2_run(A, 2) == 4
    finally:
        c.close()


def test_a_prefetch_budget_ends_the_run_at_the_first_read_beyond_it(tmp_path):
    """max_prefetch_slots=1: one read (A[0]); A[1] would be the second, so the run is A[0] alone
    and the tail stays unlocked on L2."""
    c = Cache(tmp_path / "l3", slots=8, max_prefetch_slots=1)
    try:
        c.store(A, [1, 2, 3, 4, 5, 6])
        for k in A[:2]:
            c.mgr.index.drop_l2(k)
        m, plan = c.load("a", A, [7, 8, 9, 10, 11, 12])
        assert m.l3_pages == 6 and plan.keys == A[:1] and plan.from_l3 == [True]
        assert all(c.mgr.index.entry(k).locks == 0 for k in A[1:] if c.mgr.index.entry(k))
    finally:
        c.close()
