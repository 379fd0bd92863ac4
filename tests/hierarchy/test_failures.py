"""Failures: pages gone from L3 between match and load, a write flood while a prefetch waits,
and the L3 server killed during a run of requests (and coming back)."""

from __future__ import annotations

import asyncio
import gc
import os
import secrets
import statistics
import time

import pytest

from tiered_kv import HostPool
from tiered_kv.backends import open_backend
from tiered_kv.hierarchy import ControllerLimits

from ..backends.redis_server import REDIS_SERVER, RedisServer
from .conftest import SPEC, count_on_l3, keys_of, make_stack, prompts

# Every test here runs with the scheduler and worker sides in one process, then in two.
pytestmark = pytest.mark.usefixtures("stack_process")


def delete_behind_our_back(url: str, options: dict, keys: list[str]) -> None:
    """Another instance (its own pool and backend object) deletes ``keys`` from the medium."""
    async def go():
        with HostPool(SPEC, 1) as pool:
            async with open_backend(url, pool, **options) as other:
                await other.delete(keys)
                assert await other.exists(keys) == 0
    asyncio.run(go())


@pytest.mark.parametrize("l3_kind", ["file", "redis"])
def test_pages_deleted_from_l3_between_match_and_load(l3_kind, l3_opener):
    url, options = l3_opener
    keys = keys_of(prompts(31, [8])[0])
    warm = make_stack(url, open_options=options)
    try:
        warm.serve("warm", keys)
        warm.settle()
        assert warm.controller.stats.pages_written == len(keys)
    finally:
        warm.close()

    s = make_stack(url, open_options=options)
    try:
        while (m := s.l1.lookup("r", keys)) is None:
            time.sleep(0.0005)
        assert m.l3_pages == len(keys)
        delete_behind_our_back(url, options, keys[5:])  # after the match, before the load
        s.l1.start("r")
        deadline = time.monotonic() + 10
        while not s.manager.prefetch_done("r"):
            assert time.monotonic() < deadline, "a prefetch of missing pages hung"
            time.sleep(0.0005)
        # The miss dropped the stale mark at once (before anything recomputes and writes it back).
        assert not s.manager.index.entry(keys[5]) or not s.manager.index.entry(keys[5]).on_l3
        served = s.l1.run("r")
        assert (served.l3_pages, served.computed_pages) == (5, 3)  # shortened, the rest recomputed
        assert served.verified_pages == 5 and served.wrong_pages == 0
        assert s.manager.stats.prefetch_pages_missing == 3
        # Once the recomputed pages are written back the mark may be back: then the medium holds
        # them again (the index never claims L3 for a page the medium lacks).
        s.settle()
        for key in keys[5:]:
            entry = s.manager.index.entry(key)
            if entry is not None and entry.on_l3:
                assert count_on_l3(url, options, [key]) == 1, f"index marks {key} on L3, the medium lacks it"
    finally:
        s.close()


def _prefetch_latency(s, keys, rid) -> float:
    while (m := s.manager.lookup(rid, keys)) is None:
        time.sleep(0.0002)
    assert m.l3_pages == len(keys)
    t0 = time.perf_counter()
    s.manager.start_prefetch(rid, keys, m)
    while not s.manager.prefetch_done(rid):
        time.sleep(0.0001)
    elapsed = time.perf_counter() - t0
    plan = s.manager.prepare_load(keys, rid)
    assert len(plan) == len(keys)
    s.manager.complete_load(plan)
    for k in plan.keys:  # leave L2 so the next run reads L3 again
        s.manager.index.drop_l2(k)
    return elapsed


def test_a_write_flood_does_not_delay_a_waiting_prefetch(tmp_path):
    url = f"file://{tmp_path / 'l3'}"
    runs = 7
    # 32 pages a prefetch: a read may wait for the one write call per worker already running when
    # it arrives (that much is by design); the flood's queue behind it must not delay it.
    chains = [keys_of(t) for t in prompts(41, [32] * (2 * runs + 1))]
    warm = make_stack(url, host_slots=64, l1_pages=40)
    try:
        for i, keys in enumerate(chains):
            warm.serve(i, keys)
            warm.settle()
    finally:
        warm.close()

    # Earlier tests leave dirty pages for the kernel to write back; flushed now, so the disk's
    # own backlog (which slows every fsync and O_DIRECT read alike) is not what is measured.
    os.sync()
    flood_pages = 192
    s = make_stack(url, host_slots=flood_pages + 64, l1_pages=8,
                   limits=ControllerLimits(write_workers=2, batch_pages=16))
    try:
        flood_slots = s.host.allocate(flood_pages)
        _prefetch_latency(s, chains[-1], "warm-up")  # first reads open files, fill caches
        idle, busy, behind = [], [], []
        # A collection of the whole suite's objects takes milliseconds: not part of what is timed.
        gc.collect()
        gc.disable()
        # Idle and flooded runs alternate, so whatever else the machine's disk is doing (the
        # writeback of earlier tests' files) weighs on both sides alike.
        for i in range(runs):
            idle.append(_prefetch_latency(s, chains[i], ("idle", i)))
            # fresh keys every round: put-if-absent would skip pages already written
            keys = [secrets.token_hex(16) for _ in flood_slots]
            s.seal(flood_slots, keys)
            puts = [s.put_from(keys[j:j + 16], flood_slots[j:j + 16]) for j in range(0, flood_pages, 16)]
            time.sleep(0.002)  # the flood is under way
            busy.append(_prefetch_latency(s, chains[runs + i], ("busy", i)))
            # Served ahead of the flood's queue: writes of the flood are still waiting when the
            # prefetch is done (a read queued behind the flood would find none left).
            behind.append(sum(not f.done() for f in puts))
            assert all(all(f.result(30)) for f in puts)  # the flood did land, after the reads
        gc.enable()
        idle_ms, busy_ms = statistics.median(idle) * 1e3, statistics.median(busy) * 1e3
        ahead = sum(n > 0 for n in behind)
        assert ahead >= runs - 2, (f"prefetches done before the flood's queue drained in {ahead} of {runs} rounds "
                                   f"(writes left {behind}; prefetch {busy_ms:.2f} ms flooded, {idle_ms:.2f} ms idle)")
    finally:
        gc.enable()
        s.host.free(flood_slots)
        s.close()


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
def test_backend_killed_during_a_run_and_back():
    with RedisServer() as server:
        chains = [keys_of(t) for t in prompts(51, [5] * 12, shared=1)]
        s = make_stack(server.url, host_slots=24, l1_pages=10,
                       limits=ControllerLimits(retry_base_s=0.02, retry_max_s=0.2))
        try:
            for i, keys in enumerate(chains[:4]):
                s.serve(("up", i), keys)
            s.settle()
            assert s.controller.stats.pages_written > 0
            server.kill()
            # Serving goes on from L1 / L2 (and recomputation); Stack.serve asserts every byte.
            for rnd in range(2):
                for i, keys in enumerate(chains):
                    s.serve(("down", rnd, i), keys, timeout_s=10)
            assert s.controller.degraded
            stats = s.controller.stats
            assert stats.backend_errors >= 1 and stats.degraded_episodes == 1
            assert sum(sv.l2_pages for _, sv in s.served[4:]) > 0  # L2 kept serving
            server.start()  # same port, empty (no persistence)
            deadline = time.monotonic() + 10
            while s.controller.degraded:
                assert time.monotonic() < deadline, "the tier never came back"
                time.sleep(0.01)
            stats = s.controller.stats  # read again: a split stack's stats are a copy of the child's
            assert stats.recoveries >= 1
            written = stats.pages_written
            for i, _keys in enumerate(chains[6:], 6):
                fresh = keys_of(prompts(60 + i, [4])[0])
                s.serve(("back", i), fresh)
            s.settle()
            assert s.controller.stats.pages_written > written  # the tier takes writes again
        finally:
            s.close()


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
@pytest.mark.parametrize("write", ["write_through", "write_back"])
def test_l2_keeps_taking_new_pages_while_l3_is_down(write):
    """Backups waiting for a dead L3 must not pin L2: during the outage new prompts are still
    stored on L2 (none skipped for lack of room) and served from it when they come again.
    (Before: every L2 slot ended up held by a page whose put waited for the tier, 66 of 90
    stores were skipped and the prompts seen last got no L2 hit until the server returned.)"""
    from tiered_kv.hierarchy import Policies

    with RedisServer() as server:
        s = make_stack(server.url, host_slots=24, l1_pages=10, policies=Policies(write=write),
                       limits=ControllerLimits(retry_base_s=0.02, retry_max_s=0.2))
        try:
            for i, keys in enumerate(keys_of(t) for t in prompts(71, [4] * 4)):
                s.serve(("up", i), keys)
            s.settle()
            server.kill()
            fresh = [keys_of(t) for t in prompts(72, [3] * 30)]
            for i, keys in enumerate(fresh):
                s.serve(("down", i), keys, timeout_s=10)
            assert s.controller.degraded
            assert s.manager.stats.stores_skipped == 0
            again = sum(s.serve(("again", i), keys)[1].l2_pages for i, keys in enumerate(fresh[-4:]))
            assert again > 0
            server.start()
            deadline = time.monotonic() + 10
            while s.controller.degraded:
                assert time.monotonic() < deadline, "the tier never came back"
                time.sleep(0.01)
            written = s.controller.stats.pages_written
            for i, keys in enumerate(keys_of(t) for t in prompts(73, [4] * 3)):
                s.serve(("back", i), keys)
            s.settle()
            assert s.controller.stats.pages_written > written
        finally:
            s.close()


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
def test_wait_idle_does_not_wait_for_puts_to_a_degraded_tier():
    """Puts queued for a tier that is down wait for the server (retried with backoff); the
    replay's end and tests call ``wait_idle``, which used to sit out its whole timeout (30 s)
    for them. It answers False (not idle) at once instead, and the puts stay queued."""
    with RedisServer() as server:
        s = make_stack(server.url, host_slots=24, l1_pages=10,
                       limits=ControllerLimits(retry_base_s=0.5, retry_max_s=2.0))
        try:
            s.serve(("up", 0), keys_of(prompts(81, [4])[0]))
            s.settle()
            server.kill()
            for i, keys in enumerate(keys_of(t) for t in prompts(82, [3] * 6)):
                s.serve(("down", i), keys, timeout_s=10)
            assert s.controller.degraded and s.manager._puts
            calls = []
            busy = s.manager.busy
            s.manager.busy = lambda: calls.append(1) or busy()
            assert s.manager.wait_idle(timeout_s=30) is False
            assert len(calls) <= 2  # answered at once, not after ~30k polls of 1 ms
            assert s.manager._puts  # nothing dropped by asking
        finally:
            s.close()


def test_a_store_that_turns_read_only_keeps_its_tier_up_and_serving_reads(tmp_path):
    """The L3 directory turns read-only after open. Every write raised, the tier went degraded and
    its reads were answered "miss" (from ~600 down to ~10 L3 page hits a second in a replay) while
    the disk still served them. Now a refused write is a counted False: the tier stays up, its
    pages are read, and once the directory takes files again puts store."""
    from tiered_kv.hierarchy import L3Controller

    from ..backends.unwritable import frozen
    from .conftest import sealed

    root = tmp_path / "l3"
    root.mkdir()
    with HostPool(SPEC, 8) as host:
        ctl = L3Controller(lambda: open_backend(f"file://{root}?fsync=false", host), record_bytes=host.record_bytes,
                           limits=ControllerLimits(retry_base_s=0.01, retry_max_s=0.02, write_retries=0))
        try:
            keys = [secrets.token_hex(16) for _ in range(3)]
            slots = sealed(host, keys)
            assert ctl.put_from(keys[:1], slots[:1]).result(10) == [True]
            with frozen(root):
                assert ctl.put_from(keys[1:2], slots[1:2]).result(10) == [False]  # refused: not stored
                dst = host.allocate(1)
                assert ctl.get_into(keys[:1], dst).result(10) == [True]
                assert bytes(host.record_view(dst[0])) == bytes(host.record_view(slots[0]))
                assert ctl.exists(keys).result(10) == 1
                assert not ctl.degraded and ctl.stats.degraded_episodes == 0
            assert ctl.put_from(keys[1:], slots[1:]).result(10) == [True, True]
            assert ctl.exists(keys).result(10) == 3
            assert ctl.stats.degraded_episodes == 0
            host.free(slots + dst)
        finally:
            ctl.close()
        assert ctl.pending_tasks() == 0
        assert host.free_slots == host.num_slots
