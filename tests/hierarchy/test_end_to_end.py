"""End to end on CPU with the NSA spec, for file, redis and mooncake as L3, every byte checked.

A first cache fills L1, spills to L2 and L3 (write-through); a fresh cache (new L1, new host pool,
new manager and controller) over the same L3 medium then holds nothing above L3: its first
requests hit L3 only, later ones L2 (prefetched pages that L1 has evicted since). Every page that
comes back from L2 or L3 is compared with the oracle, byte for byte, layer by layer.
Also: many requests with shared prefixes interleaved at once, prefetches cancelled midway,
``close()`` in the middle of work.
"""

from __future__ import annotations

import time

import pytest

from tiered_kv.errors import PoolError
from tiered_kv.hierarchy import ControllerLimits

from ..backends.redis_server import DelayProxy
from .conftest import LoopThread, keys_of, make_stack, prompts

# Every test here runs with the scheduler and worker sides in one process, then in two.
pytestmark = pytest.mark.usefixtures("stack_process")


def test_fill_spill_evict_and_load_back(l3_kind, l3_opener):
    url, options = l3_opener
    sizes = [6, 5, 7, 4, 6, 8]
    texts = prompts(3, sizes, shared=2)
    all_keys = [keys_of(t) for t in texts]
    distinct = {k for ks in all_keys for k in ks}

    first = make_stack(url, host_slots=16, l1_pages=10, open_options=options)
    try:
        for i, keys in enumerate(all_keys):
            match, served = first.serve(("fill", i), keys)
            assert match.l2_pages == match.l3_pages == 0  # nothing anywhere yet beyond L1
            first.settle()  # every sealed page reaches L3 before L2 must make room
        assert first.l1.evictions > 0  # L1 spilled
        assert first.manager.stats.stores >= len(distinct)  # every page went to L2...
        assert first.controller.stats.pages_written == len(distinct)  # ...and on to L3
        assert first.manager.stats.l2_evictions > 0  # L2 spilled too
    finally:
        first.close()

    # Everything above L3 is gone: a fresh cache over the same medium.
    second = make_stack(url, host_slots=48, l1_pages=12, open_options=options)
    try:
        tiers = {"l2": 0, "l3": 0}
        for rnd in range(2):
            for i, keys in enumerate(all_keys):
                match, served = second.serve((rnd, i), keys)
                # the whole prompt is cached somewhere; nothing beyond it is ever claimed
                assert match.pages == len(keys)
                if rnd == 0 and i == 0:
                    assert match.l3_pages == len(keys)  # L3 only: nothing above it
                tiers["l2"] += served.l2_pages
                tiers["l3"] += served.l3_pages
                assert served.wrong_pages == 0
                second.settle()
        assert tiers["l3"] > 0 and tiers["l2"] > 0, tiers
        assert second.controller.stats.pages_read == tiers["l3"]
        assert second.controller.stats.pages_written == 0  # all already there: put-if-absent
    finally:
        second.close()


def test_many_requests_with_shared_prefixes_at_once(tmp_path):
    url = f"file://{tmp_path / 'l3'}"
    texts = prompts(5, [3 + i % 5 for i in range(24)], shared=2)
    all_keys = [keys_of(t) for t in texts]
    warm = make_stack(url, host_slots=16, l1_pages=8)
    try:
        for i, keys in enumerate(all_keys[::2]):  # half of them on L3 first
            warm.serve(("warm", i), keys)
            warm.settle()
    finally:
        warm.close()

    s = make_stack(url, host_slots=40, l1_pages=24, max_prefetch_slots=24)
    try:
        open_ids = list(range(len(all_keys)))
        decided: dict[int, object] = {}
        deadline = time.monotonic() + 30
        # Every request is looked up before any runs; they share prefixes and compete for slots.
        while len(decided) < len(open_ids):
            assert time.monotonic() < deadline
            for rid in open_ids:
                if rid not in decided and (m := s.l1.lookup(rid, all_keys[rid])) is not None:
                    decided[rid] = m
                    s.l1.start(rid)
        for rid in open_ids[::3]:  # a third are aborted with their prefetch possibly in flight
            s.l1.abort(rid)
        for rid in open_ids:
            if rid % 3 == 0:
                continue
            served = s.l1.run(rid)
            assert served.wrong_pages == 0 and served.verified_pages == served.l2_pages + served.l3_pages
            m = decided[rid]
            assert served.l2_pages + served.l3_pages <= m.l2_pages + m.l3_pages
        s.settle()
        assert s.manager.stats.prefetches_started > 0
    finally:
        s.close()


def test_prefetches_cancelled_midway(redis_server):
    """Prefetches over a slow medium aborted while their reads run: queued reads are dropped and
    the running one is cancelled (a Backend's cancelled get never writes into its slots later), so
    every slot comes back at once, and what is left is served right."""
    import secrets

    prefix = f"t{secrets.token_hex(4)}:"
    texts = prompts(9, [8] * 6)
    all_keys = [keys_of(t) for t in texts]
    warm = make_stack(redis_server.url, host_slots=64, l1_pages=8, open_options={"prefix": prefix})
    try:
        for i, keys in enumerate(all_keys):
            warm.serve(("warm", i), keys)
        warm.settle()
    finally:
        warm.close()

    # Replies trickle through a proxy: reads are still arriving when the requests go away.
    loop = LoopThread()
    proxy = loop.run(DelayProxy(redis_server.port, chunk=16384, delay_s=0.005).start())
    s = make_stack(proxy.url, host_slots=48, l1_pages=16, open_options={"prefix": prefix},
                   limits=ControllerLimits(read_workers=1, batch_pages=2), max_prefetch_slots=48)
    try:
        decided = set()
        while len(decided) < len(all_keys):
            for rid, keys in enumerate(all_keys):
                if rid not in decided and s.l1.lookup(rid, keys) is not None:
                    decided.add(rid)
        for rid in range(len(all_keys)):
            assert s.l1.start(rid) == len(all_keys[rid])
        time.sleep(0.02)  # the first read is under way
        held = s.host.num_slots - s.free_slots()
        assert held == sum(map(len, all_keys))
        for rid in range(len(all_keys)):
            s.l1.abort(rid)  # queued ones are dropped, the running one is cancelled
        st = s.manager.stats
        if s.controller is not None:  # the controller lives in this process: its reads were cancelled
            assert st.prefetches_cancelled == len(all_keys) and st.prefetches_timed_out == 0
            assert s.controller.stats.reads_cancelled == len(all_keys)
        else:  # the abort crosses a pipe: on a loaded host a prefetch may time out before it arrives
            assert st.prefetches_cancelled + st.prefetches_timed_out == len(all_keys)
        assert s.manager.wait_idle(20)
        assert s.free_slots() == s.host.num_slots
        # what is left is served right
        match, served = s.serve("after", all_keys[0])
        assert served.wrong_pages == 0
    finally:
        s.close()
        loop.run(proxy.close())
        loop.close()


@pytest.mark.parametrize("l3_kind", ["file", "redis"])  # mooncake: the same code path, ~3 s a client
def test_close_in_the_middle_of_work(l3_opener, l3_kind):
    url, options = l3_opener
    texts = prompts(11, [6] * 8, shared=1)
    all_keys = [keys_of(t) for t in texts]
    s = make_stack(url, host_slots=32, l1_pages=8, open_options=options)
    for i, keys in enumerate(all_keys[:4]):
        s.serve(i, keys)  # stores and puts are left in flight: no settle
    for i, keys in enumerate(all_keys[4:], 4):
        s.l1.lookup(i, keys)  # lookups (L3 exists) left pending
    s.close()  # asserts every slot free and no task pending
    with pytest.raises(PoolError, match="closed"):
        s.manager.lookup("late", all_keys[0])
