"""The metadata half's calls as documented: the agree deadline, prepare_load's keys, typed errors
for bad input (nothing stored lost), the timeout policy's tokens, and wait_idle. Real HostPool,
real memory:// L3 through the controller."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tiered_kv import HostPool
from tiered_kv.backends import open_backend
from tiered_kv.errors import ConfigError, PageKeyError, TieredKVError
from tiered_kv.hierarchy import CacheManager, L3Controller, Match, Policies, PrefetchTimeout

from .conftest import PAGE, SPEC, assert_clean, decided_lookup, keys_of, prompts

KEYS = keys_of(prompts(41, [6])[0])


class Cache:
    def __init__(self, policies: Policies = Policies(), slots: int = 16, **kw) -> None:
        self.host = HostPool(SPEC, slots)
        self.l3 = L3Controller(lambda: open_backend("memory://", self.host), record_bytes=self.host.record_bytes)
        self.mgr = CacheManager(self.host, page_size=PAGE, policies=policies, l3=self.l3,
                                max_prefetch_slots=slots, **kw)

    def store(self, keys) -> None:
        """Stores with sealed records (what the worker does), then waits for the L3 puts."""
        plan = self.mgr.prepare_store(keys)
        for k, s in zip(plan.keys, plan.slots):
            self.host.seal(s, k)
        self.mgr.complete_store(plan, True)
        assert self.mgr.wait_idle(10)

    def only_on_l3(self, keys) -> None:
        self.store(keys)
        for k in keys:
            self.mgr.index.drop_l2(k)
        self.host.reap()

    def lookup(self, rid, keys, l1=0):
        return decided_lookup(self.mgr, rid, keys, l1)

    def close(self) -> None:
        self.mgr.close()
        assert_clean(self.host, self.l3)
        self.host.close()


# --- Policies.agree_deadline_s bounds the agree hook -----------------------------------------
def test_an_agree_hook_that_does_not_answer_in_time_means_no_hit_by_the_deadline():
    release = threading.Event()

    def silent_rank(pages: int) -> int:  # a rank whose peer never answers (it has no deadline)
        release.wait(10)
        return pages

    c = Cache(Policies(agree_deadline_s=0.2), agree=silent_rank)
    try:
        c.store(KEYS[:4])
        t0 = time.monotonic()
        m = c.lookup("a", KEYS[:4])
        waited = time.monotonic() - t0
        assert (m.l2_pages, m.l3_pages) == (0, 0)  # no hit: recompute
        assert waited < 1.5, f"lookup blocked {waited:.2f}s past a 0.2s deadline"
        assert c.mgr.stats.agree_timeouts == 1
        release.set()
        c.mgr.agree = lambda pages: pages  # settable: an answering hook gives the hit
        assert c.lookup("b", KEYS[:4]).l2_pages == 4
    finally:
        release.set()
        c.close()


def test_a_hook_with_its_own_deadline_is_called_directly_so_ranks_cannot_split():
    """TcpAgreement-like hooks bound themselves, on every rank alike. A second, shorter timer on
    one rank would give up while the hook still answered the other ranks with the minimum, and
    the ranks would load different hits; so the hook's own deadline is the only one."""

    class SlowPeers:
        deadline_s = 2.0  # its own deadline: the round ends by then on every rank

        def __init__(self) -> None:
            self.threads: set[str] = set()

        def __call__(self, pages: int) -> int:
            self.threads.add(threading.current_thread().name)
            time.sleep(0.4)  # the other ranks arrive after the policy's deadline, within the hook's
            return pages

    hook = SlowPeers()
    c = Cache(Policies(agree_deadline_s=0.1), agree=hook)
    try:
        c.store(KEYS[:4])
        assert c.lookup("a", KEYS[:4]).l2_pages == 4  # the hook's answer, not the policy's timeout
        assert c.mgr.stats.agree_timeouts == 0
        assert hook.threads == {threading.current_thread().name}  # on the caller's thread
        assert c.mgr.agree is hook
    finally:
        c.close()


@pytest.mark.parametrize("deadline", [0, 0.0, -1.0])
def test_an_agree_deadline_must_be_positive(deadline):
    with pytest.raises(ConfigError, match="agree_deadline_s"):
        Policies(agree_deadline_s=deadline)


def test_the_minimum_hit_holds_after_the_ranks_agreed():
    """A hook that agrees on fewer pages than the minimum hit: no hit, no prefetch (every rank gets
    the same answer and applies the same minimum, so they still agree)."""
    c = Cache(Policies(min_hit_tokens=4 * PAGE), agree=lambda pages: min(pages, 2))
    try:
        c.only_on_l3(KEYS[:4])
        m = c.lookup("a", KEYS[:4])
        assert (m.l2_pages, m.l3_pages) == (0, 0)
        assert c.mgr.start_prefetch("a", KEYS[:4], m) == 0
        c.mgr.abort("a")
    finally:
        c.close()


def test_touch_makes_l2_pages_the_most_recently_used():
    c = Cache(slots=4)
    try:
        c.store(KEYS[:2])
        c.store(KEYS[2:4])
        c.mgr.touch(KEYS[:2] + ["f" * 32])  # a key not on L2 is ignored
        assert c.mgr.index.lru_keys() == KEYS[2:4] + KEYS[:2]
        c.store(KEYS[4:6])  # room for two: the pages not touched go (a store prepared is completed)
        assert c.mgr.index.l2_run(KEYS[:2]) == 2 and c.mgr.index.l2_run(KEYS[2:4]) == 0
        with pytest.raises(PageKeyError):
            c.mgr.touch(["bad\nkey"])
    finally:
        c.close()


def test_wrong_parts_are_named_when_the_cache_is_made_not_later():
    from tiered_kv.hierarchy import AsyncCacheManager, TransferHalf
    from tiered_kv import allocate_engine_like
    from tiered_kv.errors import IndexValidationError

    with HostPool(SPEC, 4) as host:
        with pytest.raises(ConfigError, match="l3 must be an L3Controller.*open_backend"):
            CacheManager(host, page_size=PAGE, l3="redis://127.0.0.1:1")
        with pytest.raises(ConfigError, match="wraps a CacheManager"):
            AsyncCacheManager(None)
        worker = TransferHalf(allocate_engine_like(SPEC, 4), host)
        with pytest.raises(IndexValidationError, match="load: expected the LoadPlan"):
            worker.load(None, [])
        with pytest.raises(IndexValidationError, match="store: expected the StorePlan"):
            worker.store(None, [])


# --- prepare_load with the prompt's keys and an L1 hit ---------------------------------------
def test_prepare_load_takes_the_l1_offset_as_lookup_does():
    c = Cache(Policies(prefetch="wait_complete"))
    try:
        c.only_on_l3(KEYS)
        m = c.lookup("r", KEYS, 2)
        assert (m.l1_pages, m.l2_pages, m.l3_pages) == (2, 0, 4)
        assert c.mgr.start_prefetch("r", KEYS, m) == 4
        while not c.mgr.prefetch_ready("r"):
            time.sleep(0.001)
        # The whole prompt's keys, as lookup / start_prefetch take them: the L1 hit is skipped.
        plan = c.mgr.prepare_load(KEYS, "r")
        assert plan.keys == KEYS[2:] and len(plan) == 4
        c.mgr.complete_load(plan)
        # The documented form (the pages beyond L1) and the explicit offset give the same.
        for plan in (c.mgr.prepare_load(KEYS[2:]), c.mgr.prepare_load(KEYS, l1_pages=2)):
            assert plan.keys == KEYS[2:]
            c.mgr.complete_load(plan)
        with pytest.raises(ConfigError, match="l1_pages"):
            c.mgr.prepare_load(KEYS, l1_pages=7)
    finally:
        c.close()


# --- bad input is a typed error under every policy, and nothing stored is lost ---------------
@pytest.mark.parametrize("write", ["write_through", "write_through_selective", "write_back"])
@pytest.mark.parametrize("event", ["on_l1_inserted", "on_l1_hit", "on_l1_evicting"])
@pytest.mark.parametrize("bad", [["bad\nkey"], "abc", [1], None])
def test_l1_events_refuse_bad_keys_under_every_policy(write, event, bad):
    c = Cache(Policies(write=write))
    try:
        c.store(KEYS[:2])
        with pytest.raises(PageKeyError):
            getattr(c.mgr, event)(bad)
        assert c.mgr.index.l2_run(KEYS[:2]) == 2
    finally:
        c.close()


@pytest.mark.parametrize("success", [None, "yes", 1, [True, None], [1, 0]])
def test_complete_store_refuses_flags_that_are_not_bools_and_keeps_the_plan(success):
    c = Cache()
    try:
        plan = c.mgr.prepare_store(KEYS[:2])
        for k, s in zip(plan.keys, plan.slots):
            c.host.seal(s, k)
        with pytest.raises(ConfigError, match="success"):
            c.mgr.complete_store(plan, success)
        c.mgr.complete_store(plan, np.array([True, True]))  # the plan is still open; numpy bools count
        assert c.mgr.index.l2_run(KEYS[:2]) == 2
    finally:
        c.close()


def test_unhashable_request_ids_and_bad_matches_are_typed_errors():
    c = Cache()
    try:
        c.store(KEYS[:2])
        for call in (lambda: c.mgr.lookup(["x"], KEYS), lambda: c.mgr.start_prefetch({}, KEYS, Match(0, 0, 0, PAGE)),
                     lambda: c.mgr.prefetch_ready(["x"]), lambda: c.mgr.abort(["x"]),
                     lambda: c.mgr.prepare_load(KEYS, ["x"])):
            with pytest.raises(ConfigError, match="request_id"):
                call()
        with pytest.raises(ConfigError, match="l2_pages"):
            Match(0, -1, 2, PAGE)
        with pytest.raises(ConfigError, match="page_size"):
            Match(0, 1, 0, 0)
        with pytest.raises(ConfigError, match="tokens"):  # a match counted in another page size
            c.mgr.start_prefetch("q", KEYS, Match(0, 2, 0, 2 * PAGE))
        assert c.mgr.index.l2_run(KEYS[:2]) == 2 and not c.mgr._prefetches
    finally:
        c.close()


def test_every_bad_input_error_is_the_librarys_own():
    c = Cache()
    try:
        for call in (lambda: c.mgr.on_l1_evicting(None), lambda: c.mgr.complete_store(c.mgr.prepare_store([]), None),
                     lambda: c.mgr.lookup(["x"], KEYS)):
            with pytest.raises(TieredKVError):
                call()
    finally:
        c.close()


# --- the timeout policy counts the tokens the request waits for -------------------------------
def test_the_timeout_policy_counts_the_tokens_read_from_l3():
    t = PrefetchTimeout(base_s=0.0, per_1k_tokens_s=1.0, max_s=10.0)
    c = Cache(Policies(prefetch="timeout", prefetch_timeout=t))
    try:
        c.only_on_l3(KEYS[2:])
        c.store(KEYS[:2])
        m = c.lookup("r", KEYS)
        assert (m.l2_pages, m.l3_pages) == (2, 4)
        c.mgr.start_prefetch("r", KEYS, m)
        # per_1k_tokens x tokens / 1000 over the 4 pages read from L3, not the 2 already on L2
        assert c.mgr._prefetches["r"].wait_s == pytest.approx(t.for_tokens(4 * PAGE))
        assert c.mgr.wait_idle(10)
        c.mgr.abort("r")
    finally:
        c.close()


# --- a lookup nobody asks again does not keep the manager busy -------------------------------
def test_wait_idle_does_not_wait_for_a_lookup_whose_answer_is_back():
    c = Cache()
    try:
        c.only_on_l3(KEYS)
        assert c.mgr.lookup("asked-once", KEYS) is None  # the request never asks again
        t0 = time.monotonic()
        assert c.mgr.wait_idle(5)
        assert time.monotonic() - t0 < 2
        assert c.lookup("asked-once", KEYS).l3_pages == len(KEYS)  # its answer still counts
    finally:
        c.close()


# --- the cache's parts agree, and protect takes keys -------------------------------------------
def test_a_page_size_other_than_the_host_pools_is_refused_naming_both():
    with HostPool(SPEC, 4) as host:
        with pytest.raises(ConfigError, match=rf"page_size {2 * PAGE}.*{PAGE}"):
            CacheManager(host, page_size=2 * PAGE)
        CacheManager(host, page_size=PAGE).close()  # the pool's own page size is taken
        assert host.free_slots == host.num_slots


@pytest.mark.parametrize("protect", [[None], "abc", [KEYS[0], 7]])
def test_prepare_store_refuses_a_protect_that_is_not_keys(protect):
    c = Cache(slots=2)
    try:
        c.store(KEYS[:2])
        with pytest.raises(PageKeyError, match="protect"):
            c.mgr.prepare_store(KEYS[2:4], protect=protect)
        assert c.mgr.index.l2_run(KEYS[:2]) == 2  # nothing evicted, nothing reserved
        assert c.host.free_slots == 0
    finally:
        c.close()
