"""``AsyncCacheManager``: the metadata half awaited from an asyncio scheduler, over a real L3
(memory:// through the controller's loop). Every test ends with every host slot free, the
controller's loop empty and no task of this loop left but the test's own."""

from __future__ import annotations

import asyncio

import pytest

from tiered_kv import HostPool
from tiered_kv.backends import open_backend
from tiered_kv.errors import PageKeyError, PoolError
from tiered_kv.hierarchy import AsyncCacheManager, CacheManager, L3Controller, Policies, PrefetchPolicy

from .conftest import PAGE, SPEC, assert_clean, keys_of, prompts

KEYS = keys_of(prompts(7, [12])[0])


def _manager(policies: Policies, slots: int = 8) -> tuple[HostPool, L3Controller, AsyncCacheManager]:
    host = HostPool(SPEC, slots)
    l3 = L3Controller(lambda: open_backend("memory://", host), record_bytes=host.record_bytes)
    return host, l3, AsyncCacheManager(CacheManager(host, page_size=PAGE, policies=policies, l3=l3))


def _store(am: AsyncCacheManager, host: HostPool, keys) -> None:
    plan = am.on_l1_inserted(keys)  # write_through: L2 now, L3 once sealed
    for k, s in zip(plan.keys, plan.slots):
        host.seal(s, k)
    am.complete_store(plan, True)
    assert am.wait_idle(10)


def _only_this_task_left() -> bool:
    return asyncio.all_tasks() == {asyncio.current_task()}


async def test_lookup_awaits_the_l3_answer_and_prefetch_awaits_the_reads():
    host, l3, am = _manager(Policies(prefetch=PrefetchPolicy.WAIT_COMPLETE))
    try:
        _store(am, host, KEYS[:4])
        _store(am, host, KEYS[4:12])  # L2 holds 8: the first four now live on L3 only
        assert not any(am.index.is_resident(k) for k in KEYS[:4])
        assert am.manager.lookup("probe", KEYS[:4]) is None  # the synchronous call says "not yet"
        am.abort("probe")
        match = await am.lookup("r", KEYS[:4])
        assert (match.l2_pages, match.l3_pages) == (0, 4)
        assert await am.prefetch("r", KEYS[:4], match) == 4
        assert am.prefetch_done("r") and am.pending_l3("r") is None
        plan = am.prepare_load(KEYS[:4], "r")
        assert len(plan) == 4 and all(am.index.is_resident(k) for k in KEYS[:4])
        am.complete_load(plan)
    finally:
        await am.aclose()
    assert_clean(host, l3)
    assert _only_this_task_left()
    with pytest.raises(PoolError, match="closed"):
        await am.lookup("r", KEYS[:4])


async def test_a_cancelled_lookup_leaves_the_l3_answer_running_and_abort_drops_it():
    host, l3, am = _manager(Policies())
    try:
        _store(am, host, KEYS[:4])
        _store(am, host, KEYS[4:12])
        task = asyncio.create_task(am.lookup("gone", KEYS[:4]))
        await asyncio.sleep(0)  # the task asked L3 and awaits its answer
        future = am.pending_l3("gone")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        if future is not None:
            assert not future.cancelled()  # awaiting never cancels L3 work
        am.abort("gone")
        assert am.pending_l3("gone") is None
        assert (await am.lookup("next", KEYS[:4])).l3_pages == 4  # the manager still answers
    finally:
        await am.aclose()
    assert_clean(host, l3)
    assert _only_this_task_left()


async def test_bad_input_is_the_managers_typed_error_and_nothing_is_held():
    host, l3, am = _manager(Policies())
    try:
        with pytest.raises(PageKeyError):
            await am.lookup("r", "not a list of keys")
        assert am.pending_l3("r") is None
        assert am.prefetch_wait_left("nobody") == 0.0  # no prefetch: ready now
        await am.wait_prefetch("nobody")
    finally:
        await am.aclose()
    assert_clean(host, l3)
    assert _only_this_task_left()
