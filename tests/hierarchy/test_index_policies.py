"""The index and the policies, one rule at a time: eviction, write policies, admission,
minimum hit length, the prefetch timeout formula and the ranks' agree hook."""

from __future__ import annotations

import math

import pytest

from tiered_kv import HostPool
from tiered_kv.errors import ConfigError, PoolError, PoolExhaustedError
from tiered_kv.hierarchy import (AgreeTimeout, CacheManager, L3Controller, PageIndex, Policies, PrefetchPolicy,
                                 PrefetchTimeout, WritePolicy)
from tiered_kv.backends import open_backend
from tiered_kv.model.slot_allocator import SlotAllocator

from .conftest import PAGE, SPEC, SlowL3, assert_clean, keys_of, prompts


class Flag:
    """A completion whose ``done()`` the test toggles: a copy still in flight, then finished."""

    def __init__(self) -> None:
        self.is_done = False

    def done(self) -> bool:
        return self.is_done


KEYS = keys_of(prompts(1, [12])[0])


def resident(index: PageIndex, keys, completion=None) -> list[int]:
    slots = index.allocator.allocate(len(keys))
    for k, s in zip(keys, slots):
        index.begin_store(k, s)
        index.finish_store(k, True, completion)
    return slots


# --- the index -------------------------------------------------------------------------------
def test_eviction_skips_locked_and_in_flight_pages_lru_first():
    alloc = SlotAllocator(4)
    index = PageIndex(alloc)
    slots = resident(index, KEYS[:4])
    index.lock([KEYS[0]])
    index.begin_l3_put([KEYS[1]])
    index.touch([KEYS[2]])  # KEYS[3] is now the least recently used of the evictable ones
    ev = index.evict(1)
    assert ev.freed == 1 and ev.copy_down == []
    assert not index.is_resident(KEYS[3]) and alloc.free_count == 1
    ev = index.evict(3)  # only KEYS[2] may go: 0 is locked, 1 has a put in flight
    assert ev.freed == 1 and alloc.free_count == 2
    assert index.is_resident(KEYS[0]) and index.is_resident(KEYS[1])
    with pytest.raises(PoolError, match="cannot leave L2"):
        index.drop_l2(KEYS[0])
    index.unlock([KEYS[0]])
    index.finish_l3_put([KEYS[1]], [True])
    assert index.entry(KEYS[1]).on_l3
    assert index.evict(4).freed == 2 and alloc.free_count == 4
    assert slots and index.resident_count == 0


def test_a_slot_comes_back_only_once_its_copies_completed():
    alloc = SlotAllocator(2)
    index = PageIndex(alloc)
    store_copy = Flag()
    (slot_a,) = resident(index, KEYS[:1], store_copy)
    (slot_b,) = resident(index, KEYS[1:2])
    load_copy = Flag()
    index.lock([KEYS[1]])
    index.unlock([KEYS[1]], load_copy)  # a load L2 -> L1 still reads slot_b
    index.evict(2)
    assert index.resident_count == 0  # both left the index...
    assert alloc.free_count == 0  # ...but neither slot may be reused yet
    assert alloc.pending_count == 2
    with pytest.raises(PoolExhaustedError, match="waiting for their transfers"):
        alloc.allocate(1)
    store_copy.is_done = True
    alloc.reap()
    assert alloc.free_count == 1 and alloc.pending_count == 1
    assert alloc.allocate(1) == [slot_a]  # the one whose copy completed, not slot_b
    alloc.free([slot_a])
    load_copy.is_done = True
    alloc.reap()
    assert alloc.free_count == 2


def test_failed_store_never_matches_and_lock_needs_residency():
    alloc = SlotAllocator(2)
    index = PageIndex(alloc)
    (slot,) = alloc.allocate(1)
    index.begin_store(KEYS[0], slot)
    assert index.l2_run(KEYS) == 0  # storing is not a hit
    with pytest.raises(PoolError, match="not resident"):
        index.lock([KEYS[0]])
    assert index.finish_store(KEYS[0], False) == slot
    assert index.entry(KEYS[0]) is None
    with pytest.raises(PoolError, match="no store in progress"):
        index.finish_store(KEYS[0], True)
    alloc.free([slot])
    assert alloc.free_count == 2


def test_failed_l3_put_never_reads_as_present():
    index = PageIndex(SlotAllocator(3))
    resident(index, KEYS[:3])
    index.begin_l3_put(KEYS[:3])
    index.finish_l3_put(KEYS[:3], [True, False, True])
    assert [index.entry(k).on_l3 for k in KEYS[:3]] == [True, False, True]
    index.mark_l3_missing(KEYS[:1])
    assert not index.entry(KEYS[0]).on_l3


def test_write_back_copies_the_last_copy_down_before_it_goes():
    index = PageIndex(SlotAllocator(3))
    resident(index, KEYS[:3])
    index.entry(KEYS[1]).on_l3 = True  # already on L3: may simply go
    ev = index.evict(1, copy_down_allowed=lambda e: True)
    assert ev.copy_down == [KEYS[0]] and ev.freed == 1
    assert index.is_resident(KEYS[0]) and not index.is_resident(KEYS[1])


# --- the manager's policies (a real memory:// L3) --------------------------------------------
class Cache:
    """A manager over a HostPool and a memory:// L3; stores land with sealed records."""

    def __init__(self, policies: Policies, slots: int = 8, **kw) -> None:
        self.host = HostPool(SPEC, slots)
        self.l3 = L3Controller(lambda: open_backend("memory://", self.host), record_bytes=self.host.record_bytes)
        self.mgr = CacheManager(self.host, page_size=PAGE, policies=policies, l3=self.l3, **kw)

    def store(self, plan) -> None:
        for k, s in zip(plan.keys, plan.slots):
            self.host.seal(s, k)
        self.mgr.complete_store(plan, True)

    def on_l3(self, keys) -> list[bool]:
        assert self.mgr.wait_idle(10)
        return [bool(self.mgr.index.entry(k) and self.mgr.index.entry(k).on_l3) for k in keys]

    def close(self) -> None:
        self.mgr.close()
        assert_clean(self.host, self.l3)


def test_write_back_puts_evicted_pages_on_l3_and_frees_them_afterwards():
    c = Cache(Policies(write=WritePolicy.WRITE_BACK), slots=4)
    try:
        assert c.mgr.on_l1_inserted(KEYS[:4]) is None  # write_back waits for the L1 eviction
        c.store(c.mgr.on_l1_evicting(KEYS[:4]))
        assert c.on_l3(KEYS[:4]) == [False] * 4  # sealed on L2; write_back does not copy down yet
        plan = c.mgr.prepare_store(KEYS[4:6])  # L2 is full: its last copies must go down first
        assert len(plan) == 0
        assert all(c.mgr.index.entry(k).l3_put_in_flight for k in KEYS[:4])  # all kept, copies going down
        assert c.on_l3(KEYS[:4]) == [True] * 4
        assert all(c.mgr.index.is_resident(k) for k in KEYS[:4])
        plan = c.mgr.prepare_store(KEYS[4:6])  # now on L3, they may leave L2
        assert len(plan) == 2 and not c.mgr.index.is_resident(KEYS[0])
        c.store(plan)
    finally:
        c.close()


def test_write_through_selective_stores_after_n_hits():
    c = Cache(Policies(write=WritePolicy.WRITE_THROUGH_SELECTIVE, selective_hits=3))
    try:
        assert c.mgr.on_l1_inserted(KEYS[:2]) is None
        assert c.mgr.on_l1_hit(KEYS[:2]) is None
        assert c.mgr.on_l1_hit(KEYS[1:2]) is None  # KEYS[1]: 2 hits, KEYS[0]: 1
        plan = c.mgr.on_l1_hit([KEYS[0], KEYS[1]])  # KEYS[1] reaches 3
        assert plan.keys == [KEYS[1]] and plan.positions == [1]
        c.store(plan)
        assert c.mgr.index.is_resident(KEYS[1]) and not c.mgr.index.is_resident(KEYS[0])
    finally:
        c.close()


def test_l3_admission_after_n_hits():
    c = Cache(Policies(l3_admission_hits=2))
    try:
        c.store(c.mgr.on_l1_inserted(KEYS[:2]))
        assert c.on_l3(KEYS[:2]) == [False, False]  # sealed on L2, not hit yet: not admitted
        c.mgr.on_l1_hit(KEYS[:2])
        assert c.on_l3(KEYS[:2]) == [False, False]
        c.mgr.on_l1_hit(KEYS[:1])
        assert c.on_l3(KEYS[:2]) == [True, False]
        assert c.l3.stats.pages_written == 1
    finally:
        c.close()


def test_a_non_writer_rank_never_puts():
    c = Cache(Policies(l3_writer=False))
    try:
        c.store(c.mgr.on_l1_inserted(KEYS[:3]))
        c.mgr.on_l1_hit(KEYS[:3])
        assert c.on_l3(KEYS[:3]) == [False] * 3 and c.l3.stats.writes_started == 0
    finally:
        c.close()


def lookup(mgr, rid, keys, l1=0):
    for _ in range(20_000):
        m = mgr.lookup(rid, keys, l1)
        if m is not None:
            return m
        import time
        time.sleep(0.0005)
    raise AssertionError("lookup never decided")


def test_min_hit_tokens():
    c = Cache(Policies(min_hit_tokens=3 * PAGE))
    try:
        c.store(c.mgr.on_l1_inserted(KEYS[:3]))
        m = lookup(c.mgr, "a", KEYS[:2] + ["f" * 32])
        assert (m.l2_pages, m.l3_pages) == (0, 0) and c.mgr.stats.below_min_hit == 1
        m = lookup(c.mgr, "b", KEYS[:4])
        assert (m.l2_pages, m.l3_pages) == (3, 0)
        m = lookup(c.mgr, "c", KEYS[:4], l1=1)  # only what lies beyond L1 counts
        assert (m.l1_pages, m.l2_pages) == (1, 0)
    finally:
        c.close()


@pytest.mark.parametrize("tokens", [0, 1000, 64_000, 10**7])
def test_prefetch_timeout_formula(tokens):
    t = PrefetchTimeout(base_s=0.01, per_1k_tokens_s=0.003, max_s=0.2)
    assert t.for_tokens(tokens) == pytest.approx(min(0.2, 0.01 + 0.003 * tokens / 1000))
    assert Policies(prefetch=PrefetchPolicy.TIMEOUT, prefetch_timeout=t).prefetch_wait_s(tokens) == t.for_tokens(tokens)
    assert Policies(prefetch="wait_complete").prefetch_wait_s(tokens) == math.inf
    assert Policies(prefetch="best_effort").prefetch_wait_s(tokens) == 0.0


def test_prefetch_ready_follows_the_timeout_on_a_test_clock():
    now = [100.0]
    t = PrefetchTimeout(base_s=0.5, per_1k_tokens_s=1.0, max_s=10.0)
    c = Cache(Policies(prefetch="timeout", prefetch_timeout=t), clock=lambda: now[0])
    gate = []
    try:
        c.store(c.mgr.on_l1_inserted(KEYS[:2]))
        m = lookup(c.mgr, "r", KEYS[:2])
        c.mgr.start_prefetch("r", KEYS[:2], m)
        # A prefetch that has not returned: hold its future open by hand
        pending = c.mgr._prefetches["r"]
        import concurrent.futures
        pending.future = concurrent.futures.Future()
        gate.append(pending.future)
        wait = t.for_tokens(len(pending.keys) * PAGE)  # the tokens read from L3 (none: an L2 hit)
        assert pending.wait_s == pytest.approx(wait)
        assert not c.mgr.prefetch_ready("r")
        now[0] += wait * 0.9
        assert not c.mgr.prefetch_ready("r")
        now[0] += wait * 0.2
        assert c.mgr.prefetch_ready("r")
        pending.future.set_result([])
        pending.future = None
        c.mgr.abort("r")
    finally:
        c.close()


def test_agree_takes_the_minimum_and_a_timeout_means_no_hit():
    answers = []

    def agree(n):
        answers.append(n)
        return min(n, 2)

    c = Cache(Policies(), agree=agree)
    try:
        c.store(c.mgr.on_l1_inserted(KEYS[:4]))
        m = lookup(c.mgr, "a", KEYS[:4])
        assert answers == [4] and (m.l2_pages, m.l3_pages) == (2, 0)
    finally:
        c.close()

    def silent(n):
        raise AgreeTimeout("rank 1 did not answer")

    m, timeouts = _agreed_lookup(silent)
    assert (m.l2_pages, m.l3_pages) == (0, 0) and timeouts == 1


def _agreed_lookup(agree):
    """The match of a lookup of 4 stored pages under ``agree``, and the agree timeouts counted."""
    c = Cache(Policies(), agree=agree)
    try:
        c.store(c.mgr.on_l1_inserted(KEYS[:4]))
        return lookup(c.mgr, "a", KEYS[:4]), c.mgr.stats.agree_timeouts
    finally:
        c.close()


@pytest.mark.parametrize("kw, match", [
    ({"write": "write_sometimes"}, "write policy"), ({"prefetch": "eager"}, "prefetch policy"),
    ({"selective_hits": 0}, "selective_hits"), ({"min_hit_tokens": -1}, "min_hit_tokens"),
    ({"agree_deadline_s": float("nan")}, "agree_deadline_s"), ({"l3_writer": "yes"}, "l3_writer"),
])
def test_bad_policies_are_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        Policies(**kw)
    with pytest.raises(ConfigError, match="max_s"):
        PrefetchTimeout(max_s=-1)


@pytest.mark.parametrize("kw, match", [
    ({"slots": None}, "slots must be a HostPool or a SlotAllocator"),
    ({"policies": "write_back"}, "policies must be a Policies"),
    ({"agree": 3}, "agree must be a callable"),
    ({"max_prefetch_slots": 1.5}, "max_prefetch_slots must be an int"),
    ({"max_prefetch_slots": True}, "max_prefetch_slots must be an int"),
])
def test_bad_manager_arguments_are_config_errors(kw, match):
    args = {"slots": SlotAllocator(8), "page_size": PAGE, **kw}
    with pytest.raises(ConfigError, match=match):
        CacheManager(args.pop("slots"), **args)


@pytest.mark.parametrize("kw, match", [({"record_bytes": 0}, "record_bytes"), ({"record_bytes": 1.5}, "record_bytes"),
                                       ({"record_bytes": 8, "limits": {"read_workers": 1}}, "limits must be")])
def test_bad_controller_arguments_are_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        L3Controller(lambda: open_backend("memory://", None), **kw)


def test_start_prefetch_refuses_what_is_no_match_and_holds_nothing():
    alloc = SlotAllocator(8)
    mgr = CacheManager(alloc, page_size=PAGE)
    keys = KEYS[:4]
    for bad in (None, "4 pages", 4):
        with pytest.raises(ConfigError, match="match must be the Match"):
            mgr.start_prefetch("r", keys, bad)
    from tiered_kv.hierarchy import Match

    with pytest.raises(ConfigError, match="covers 6 pages but 4 keys"):
        mgr.start_prefetch("r", keys, Match(2, 2, 2, PAGE))
    assert mgr.start_prefetch("r", keys, Match(0, 0, 0, PAGE)) == 0  # the request id was not taken
    mgr.close()
    assert alloc.free_count == alloc.num_slots


def test_l1_cache_refuses_an_unknown_request_as_a_pool_error():
    """``run`` / ``start`` of a request that never looked up: PoolError naming it (run was a bare
    KeyError), and the cache goes on serving."""
    from .conftest import make_stack

    s = make_stack(None, host_slots=8, l1_pages=4)
    try:
        for call in (s.l1.run, s.l1.start):
            with pytest.raises(PoolError, match="unknown request 'nobody'"):
                call("nobody")
        s.serve("r", KEYS[:2])
    finally:
        s.close()


def test_agree_timeouts_of_any_kind_mean_no_hit_and_a_bad_answer_is_named():
    """A process group's own timeout (a builtin TimeoutError, as socket or gloo waits raise) is no
    hit, like AgreeTimeout (it escaped the lookup before); an answer that is no int is a
    ConfigError naming agree (int(None) was a bare TypeError, 2.7 was taken as 2)."""
    def timed_out(n):
        raise TimeoutError("all_reduce timed out")

    m, timeouts = _agreed_lookup(timed_out)
    assert (m.l2_pages, m.l3_pages) == (0, 0) and timeouts == 1
    for bad in (None, "3", 2.7, True):
        with pytest.raises(ConfigError, match="agree"):
            _agreed_lookup(lambda n, bad=bad: bad)


def test_hits_served_from_l2_count_for_l3_admission():
    """A page the engine reloads from L2 was hit: under write_through with an admission rule it
    goes to L3 once it reached the hits, as after L1 hits. (Before: only on_l1_hit admitted, so
    with l3_admission_hits=1, as examples/configs/local-ssd.yaml has it, pages that left L1 and
    were hit from L2 again and again never reached L3 and were lost with their L2 eviction.)"""
    c = Cache(Policies(l3_admission_hits=2))
    try:
        c.store(c.mgr.on_l1_inserted(KEYS[:2]))
        for expected in ([False, False], [True, True]):
            plan = c.mgr.prepare_load(KEYS[:2])
            c.mgr.complete_load(plan)
            assert c.on_l3(KEYS[:2]) == expected
        assert c.l3.stats.pages_written == 2
        plan = c.mgr.prepare_load(KEYS[:2])  # admitted and on L3 already: no second put
        c.mgr.complete_load(plan)
        assert c.mgr.wait_idle(10) and c.l3.stats.pages_written == 2 and c.l3.stats.writes_started == 1
    finally:
        c.close()


@pytest.mark.parametrize("write", list(WritePolicy))
def test_l1_events_after_close_are_pool_errors_under_every_write_policy(write):
    """After close the L1 events are refused as lookup is (they returned quietly under the
    policies that store nothing for them, and on_l1_hit still counted hits and asked a closed
    L3 for puts); abort stays a quiet no-op, so a late cleanup never fails."""
    c = Cache(Policies(write=write, selective_hits=1))
    c.close()
    for call in (c.mgr.on_l1_inserted, c.mgr.on_l1_hit, c.mgr.on_l1_evicting):
        with pytest.raises(PoolError, match="closed"):
            call(KEYS[:2])
    c.mgr.abort("late")
    assert_clean(c.host, c.l3)


def test_l1_pages_takes_numpy_ints_and_refuses_bools_floats_and_out_of_range():
    """An engine's page counts are often numpy ints: they count (a ConfigError before); bools,
    floats and counts outside 0..len(keys) are ConfigErrors naming l1_pages."""
    import numpy as np

    c = Cache(Policies())
    try:
        c.store(c.mgr.on_l1_inserted(KEYS[:4]))
        m = lookup(c.mgr, "a", KEYS[:4], np.int64(1))
        assert (m.l1_pages, m.l2_pages) == (1, 3) and type(m.l1_pages) is int
        for bad in (True, np.bool_(False), 1.0, -1, 5, "1"):
            with pytest.raises(ConfigError, match="l1_pages"):
                c.mgr.lookup("b", KEYS[:4], bad)
    finally:
        c.close()


def test_a_load_plan_completed_twice_is_refused_and_never_unlocks_another_requests_pages():
    """Two requests load the same L2 pages; the engine completes the first plan twice (a retry).
    The second completion is a PoolError and the other request's lock stays: it used to take the
    other request's lock away, so its slots went to a new store while its load still read them."""
    alloc = SlotAllocator(2)
    mgr = CacheManager(alloc, page_size=PAGE)
    plan = mgr.prepare_store(KEYS[:2])
    mgr.complete_store(plan, True)
    a = mgr.prepare_load(KEYS[:2], "a")
    b = mgr.prepare_load(KEYS[:2], "b")  # b's load is in flight
    mgr.complete_load(a)
    with pytest.raises(PoolError, match="already completed"):
        mgr.complete_load(a)
    assert [mgr.index.entry(k).locks for k in KEYS[:2]] == [1, 1]
    assert len(mgr.prepare_store(KEYS[2:4])) == 0  # b's slots are not handed out
    mgr.complete_load(b)
    with pytest.raises(PoolError, match="already completed"):
        mgr.complete_store(plan, True)
    mgr.close()
    assert alloc.free_count == alloc.num_slots


def test_a_request_scheduled_while_its_l3_answer_was_out_leaves_nothing_pending():
    """The scheduler stops waiting for L3 (lookup said None) and runs the request: prepare_load
    with its id ends the request, its lookup included, as abort does. Before, the lookup stayed
    in the manager for good: busy() was True forever and wait_idle ran out its timeout."""

    alloc = SlotAllocator(4)
    l3 = L3Controller(SlowL3(), record_bytes=4096)
    mgr = CacheManager(alloc, page_size=PAGE, l3=l3)
    try:
        assert mgr.lookup("r", KEYS[:2]) is None
        plan = mgr.prepare_load(KEYS[:2], "r")
        mgr.complete_load(plan)
        assert mgr.pending_l3("r") is None
        assert mgr.wait_idle(5)
    finally:
        mgr.close()
    assert_clean(alloc, l3)


@pytest.mark.parametrize("bad", ["a plan", None, 3])
def test_completing_what_is_no_plan_is_a_config_error_and_changes_nothing(bad):
    """complete_load / complete_store of something that is no plan (a request id, None) raised
    AttributeError from inside the manager; it is a ConfigError, and no page changes state."""
    alloc = SlotAllocator(2)
    mgr = CacheManager(alloc, page_size=PAGE)
    plan = mgr.prepare_store(KEYS[:2])
    mgr.complete_store(plan, True)
    load = mgr.prepare_load(KEYS[:2], "a")
    with pytest.raises(ConfigError, match="complete_load: plan must be the LoadPlan"):
        mgr.complete_load(bad)
    with pytest.raises(ConfigError, match="complete_store: plan must be the StorePlan"):
        mgr.complete_store(bad, True)
    assert [mgr.index.entry(k).locks for k in KEYS[:2]] == [1, 1]  # a's lock untouched
    mgr.complete_load(load)
    mgr.close()
    assert alloc.free_count == alloc.num_slots
