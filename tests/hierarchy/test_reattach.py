"""A fresh worker process attached after the old one was killed: L3 serves again.

The lost jobs' slots stay quarantined while the old worker is lost, and are released at
``attach_worker`` only because its process has exited (``PipeLink.worker_gone``); over a link that
cannot prove that, they stay held for good.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tiered_kv.errors import ConfigError
from tiered_kv.hierarchy import ControllerLimits, L1PrefixCache, Policies, attach_worker
from tiered_kv.hierarchy.job_transfers import JobTransferHalf
from tiered_kv.hierarchy.jobs import JobKind
from tiered_kv.hierarchy.l3_jobs import L3Jobs
from tiered_kv.hierarchy.links import OutboxLink
from tiered_kv.hierarchy.process_link import PipeLink, stack_worker
from tiered_kv.model.slot_allocator import SlotAllocator

from .conftest import SPEC, Stack, decided_lookup, keys_of, make_split_stack

HOST_SLOTS, L1_PAGES = 48, 40


def _split(url, options, **kw):
    args = dict(host_slots=HOST_SLOTS, l1_pages=L1_PAGES, policies=Policies(), limits=ControllerLimits(),
                max_prefetch_slots=40, agree=None, open_options=options, spec=SPEC)
    args.update(kw)
    return make_split_stack(url, **args)


def _prompt(seed: int, pages: int):
    import numpy as np

    return np.random.default_rng([seed, 77]).integers(0, 50_000, pages * SPEC.page_size)


def test_a_fresh_worker_attached_after_a_kill_serves_l3_again(l3_opener):
    url, options = l3_opener
    cold_keys, hot_keys = keys_of(_prompt(41, 24)), keys_of(_prompt(42, 4))
    warm = _split(url, options)
    try:
        warm.serve("warm", cold_keys)
        warm.settle()
    finally:
        warm.close()
    s = _split(url, options)
    manager, jobs = s.manager, s.manager.l3
    s.serve("hot", hot_keys)
    s.settle()
    match = decided_lookup(manager, "cold", cold_keys)
    assert match.l3_pages == len(cold_keys)
    os.kill(jobs.link.process.pid, signal.SIGSTOP)  # the read is certainly mid-job when the kill comes
    assert manager.start_prefetch("cold", cold_keys, match) == len(cold_keys)
    (prefetch,) = [job for job, _, _ in jobs._open.values()]
    assert prefetch.kind is JobKind.PREFETCH
    old_link = jobs.link
    old_link.kill()
    deadline = time.monotonic() + 10
    while not jobs.lost:
        assert time.monotonic() < deadline, "the lost worker was never noticed"
        time.sleep(0.001)
    manager.abort("cold")
    s.l1.drain_stores()
    # Served from what remains: L3 reads as down, the quarantined slots are never handed out.
    assert decided_lookup(manager, "cold-while-down", cold_keys).l3_pages == 0
    quarantined = sorted(jobs.lost_slots)
    assert quarantined == sorted(prefetch.slots)
    alloc = s.host
    alloc.reap()
    assert all(alloc.is_pending(slot) for slot in quarantined)

    new_link = PipeLink(stack_worker, SPEC, HOST_SLOTS, L1_PAGES, url, options, ControllerLimits())
    assert old_link.process.exitcode is not None  # what makes the release provably safe
    assert attach_worker(manager, new_link) == len(quarantined)
    assert jobs.lost_slots == [] and jobs.released_slots == len(quarantined) and not jobs.degraded
    assert alloc.free_count == alloc.num_slots  # nothing of the old worker's L2 is believed any more
    # The engine's L1 bookkeeping starts again with the new worker's empty L1.
    half = JobTransferHalf(jobs, page_bytes=SPEC.page_bytes,
                           on_failed_store=lambda plan: manager.complete_store(plan, False))
    l1 = L1PrefixCache(L1_PAGES + 1, manager, half, reserved=(0,),
                       fill=lambda k, p: new_link.call("fill", list(k), list(p)),
                       verify=lambda k, p: new_link.call("verify", list(k), list(p)))
    again = Stack(alloc, s.controller, manager, l1, None)
    try:
        match, served = again.serve("cold-again", cold_keys)
        assert match.l3_pages == len(cold_keys) and served.l3_pages == len(cold_keys)
        assert served.verified_pages == len(cold_keys)  # checked byte for byte in the new worker
        _, hot = again.serve("hot-again", hot_keys)  # never from the old worker's L2 slots
        assert hot.l2_pages == 0 and hot.wrong_pages == 0
        again.settle()
    finally:
        again.close()
    assert new_link.process.exitcode == 0 and jobs.in_flight() == 0


def test_quarantined_slots_stay_held_where_the_old_worker_is_not_proven_gone():
    alloc = SlotAllocator(4)
    jobs = L3Jobs(OutboxLink())
    jobs.bind(alloc)
    slots = alloc.allocate(2)
    future = jobs.get_into(["a" * 64, "b" * 64], slots)
    alloc.free(slots)
    jobs.on_lost()  # the engine's transport reports its worker side gone
    assert future.result(timeout=1) == [False, False]
    with pytest.raises(ConfigError, match="only once the old one was lost"):
        L3Jobs(OutboxLink()).attach(OutboxLink())
    assert jobs.attach(OutboxLink()) == 0  # an outbox cannot prove its worker exited
    alloc.reap()
    assert jobs.lost_slots == slots and all(alloc.is_pending(s) for s in slots)
    assert alloc.free_count == alloc.num_slots - len(slots)  # exactly the quarantined ones
    assert not jobs.degraded and jobs.exists(["c" * 64]) is not None
    jobs.close()
