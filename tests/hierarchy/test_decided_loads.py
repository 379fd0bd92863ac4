"""A load never exceeds the hit its request's lookup decided: the minimum hit, the ranks'
agreement and the lookup's own L2 / L3 run bound ``prepare_load``, whatever keys the caller passes.

Ranks agree over real loopback sockets (``TcpAgreement``), each rank a manager of its own on a
thread; L2 is a real ``HostPool`` (or a bare ``SlotAllocator`` where no bytes are involved).
"""

from __future__ import annotations

import threading

import pytest

from tiered_kv.errors import PoolError
from tiered_kv.hierarchy import CacheManager, Policies
from tiered_kv.hierarchy.agree import TcpAgreement
from tiered_kv.model.slot_allocator import SlotAllocator

from .conftest import PAGE, SlowL3, assert_clean, keys_of, prompts

KEYS = keys_of(prompts(83, [8])[0])


def holding(pages: int, policies: Policies = Policies(), agree=None, slots: int = 16) -> CacheManager:
    """A scheduler-side manager whose L2 holds the prompt's first ``pages`` pages."""
    mgr = CacheManager(SlotAllocator(slots), page_size=PAGE, policies=policies, agree=agree)
    mgr.complete_store(mgr.prepare_store(KEYS[:pages]), True)
    return mgr


def close_clean(mgr: CacheManager) -> None:
    mgr.close()
    assert_clean(mgr.allocator, None)


def test_ranks_that_agreed_on_two_pages_each_load_two_whatever_their_l2_holds():
    """The README's flow on two ranks: rank 0 holds 5 pages, rank 1 holds 2; they agree on 2.
    Each rank's load is 2 pages (not the 5 rank 0's L2 holds), so the ranks run the same
    prefill."""
    agree0 = TcpAgreement(0, 2, ("127.0.0.1", 0), deadline_s=5.0)
    agree1 = TcpAgreement(1, 2, ("127.0.0.1", agree0.port), deadline_s=5.0)
    ranks = [holding(5, agree=agree0), holding(2, agree=agree1)]
    loaded: dict[int, int] = {}
    errors: list[BaseException] = []

    def rank(i: int) -> None:
        try:
            mgr = ranks[i]
            match = mgr.lookup("r", KEYS)
            assert match is not None and (match.l2_pages, match.l3_pages) == (2, 0)
            mgr.start_prefetch("r", KEYS, match)
            plan = mgr.prepare_load(KEYS, "r")  # the whole prompt's keys, as the README passes them
            loaded[i] = len(plan)
            mgr.complete_load(plan)
        except BaseException as exc:  # reported on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert not errors, errors
        assert loaded == {0: 2, 1: 2}
    finally:
        agree0.close()
        agree1.close()
        for mgr in ranks:
            close_clean(mgr)


def test_a_hit_below_the_minimum_loads_nothing():
    """min_hit_tokens of 3 pages, 2 on L2: the lookup answers no hit, so the load is empty too."""
    mgr = holding(2, Policies(min_hit_tokens=3 * PAGE))
    try:
        match = mgr.lookup("r", KEYS)
        assert (match.l2_pages, match.l3_pages) == (0, 0)
        mgr.start_prefetch("r", KEYS, match)
        for keys in (KEYS, KEYS[:2]):  # the whole prompt, or just the pages L2 holds
            plan = mgr.prepare_load(keys, "r")
            assert len(plan) == 0
            mgr.complete_load(plan)
            assert mgr.lookup("r", KEYS) is not None  # decided again for the next form
    finally:
        close_clean(mgr)


def test_a_load_is_bounded_by_the_lookup_even_when_l2_grew_since():
    """The lookup decided 2 pages; 3 more landed on L2 before the request was scheduled. The load
    is the 2 pages decided (the prefill of the rest was planned from the lookup's answer)."""
    mgr = holding(2)
    try:
        match = mgr.lookup("r", KEYS)
        assert match.l2_pages == 2
        mgr.complete_store(mgr.prepare_store(KEYS[2:5]), True)
        mgr.start_prefetch("r", KEYS, match)
        plan = mgr.prepare_load(KEYS, "r")
        assert plan.keys == KEYS[:2]
        mgr.complete_load(plan)
    finally:
        close_clean(mgr)


def test_a_prefetch_covers_no_more_than_the_lookup_decided():
    """A match larger than the request's decided one (built by the caller, or another request's)
    locks and reads no more than the decision."""
    mgr = holding(5, Policies(min_hit_tokens=0))
    try:
        decided = mgr.lookup("small", KEYS[:2])
        bigger = mgr.lookup("big", KEYS)
        assert (decided.l2_pages, bigger.l2_pages) == (2, 5)
        mgr.start_prefetch("small", KEYS, bigger)
        assert [mgr.index.entry(k).locks for k in KEYS[:5]] == [1, 1, 0, 0, 0]
        plan = mgr.prepare_load(KEYS, "small")
        assert plan.keys == KEYS[:2]
        mgr.complete_load(plan)
        mgr.abort("big")
    finally:
        close_clean(mgr)


def test_a_request_scheduled_before_its_lookup_decided_loads_nothing():
    """lookup said "not yet" and the scheduler ran the request anyway: nothing was decided, so
    nothing loads (the pages L2 held were never checked against the minimum or the ranks)."""

    from tiered_kv.hierarchy import L3Controller

    alloc = SlotAllocator(8)
    l3 = L3Controller(SlowL3(), record_bytes=4096)
    mgr = CacheManager(alloc, page_size=PAGE, l3=l3, policies=Policies(min_hit_tokens=4 * PAGE))
    try:
        mgr.complete_store(mgr.prepare_store(KEYS[:2]), True)
        assert mgr.lookup("r", KEYS) is None
        plan = mgr.prepare_load(KEYS, "r")
        assert len(plan) == 0
        mgr.complete_load(plan)
        assert mgr.wait_idle(5)
    finally:
        mgr.close()
    assert_clean(alloc, l3)


def test_a_load_without_a_lookup_keeps_the_minimum_and_is_refused_where_ranks_agree():
    """Keys passed without a decided lookup: the minimum hit still holds; with an agree hook the
    ranks cannot have agreed on it, so it is a PoolError saying to look the request up first."""
    mgr = holding(2, Policies(min_hit_tokens=3 * PAGE))
    try:
        plan = mgr.prepare_load(KEYS[:2])
        assert len(plan) == 0
        mgr.complete_load(plan)
    finally:
        close_clean(mgr)
    mgr = holding(4, agree=lambda pages: pages)
    try:
        with pytest.raises(PoolError, match="lookup"):
            mgr.prepare_load(KEYS)
        with pytest.raises(PoolError, match="lookup"):
            mgr.prepare_load(KEYS, "never-looked-up")
        assert all(mgr.index.entry(k).locks == 0 for k in KEYS[:4])
    finally:
        close_clean(mgr)
