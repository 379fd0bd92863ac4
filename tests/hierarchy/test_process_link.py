"""The worker side in a child process: jobs and results over a pipe, and a worker killed mid-job."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tiered_kv.errors import ConfigError
from tiered_kv.hierarchy import Policies
from tiered_kv.hierarchy.jobs import JobKind
from tiered_kv.hierarchy.process_link import PipeLink, stack_worker

from .conftest import SPEC, decided_lookup, keys_of, make_split_stack, prompts
from tiered_kv.hierarchy.controller import ControllerLimits


def _split(url, **kw):
    args = dict(host_slots=32, l1_pages=12, policies=Policies(), limits=ControllerLimits(), max_prefetch_slots=None,
                agree=None, open_options={}, spec=SPEC)
    args.update(kw)
    return make_split_stack(url, **args)


def test_a_worker_side_that_cannot_be_built_is_named(tmp_path):
    with pytest.raises(ConfigError, match="could not build its worker side"):
        PipeLink(stack_worker, SPEC, 4, 0, "nosuch://x")


def test_pages_go_down_and_come_back_through_the_child(tmp_path):
    url = f"file://{tmp_path}/l3"
    first = _split(url, host_slots=8, l1_pages=6)
    keys = keys_of(prompts(3, [5])[0])
    try:
        first.serve("a", keys)
        first.settle()
        assert first.controller.stats.pages_written == len(keys)
    finally:
        first.close()
    second = _split(url)
    try:
        match, served = second.serve("b", keys)
        assert match.l3_pages == len(keys) and served.l3_pages == len(keys) and served.verified_pages == len(keys)
        assert second.manager.l3.jobs_sent > 0 and second.manager.l3.in_flight() == 0
    finally:
        second.close()
    assert second.manager.l3.link.process.exitcode == 0


def test_a_worker_killed_mid_job_leaves_its_slots_quarantined(tmp_path):
    """SIGKILL the child while a prefetch reads into slots: the job is reported lost, its slots are
    never handed out again, and the scheduler side keeps answering from what it knows."""
    url = f"file://{tmp_path}/l3"
    warm = _split(url, host_slots=48, l1_pages=40)
    cold_keys = keys_of(prompts(4, [32])[0])
    try:
        warm.serve("warm", cold_keys)
        warm.settle()
    finally:
        warm.close()
    s = _split(url, host_slots=48, l1_pages=8, max_prefetch_slots=40)
    hot_keys = keys_of(prompts(5, [4])[0])
    manager, jobs = s.manager, s.manager.l3
    s.serve("hot", hot_keys)  # on L1 and (write_through) on L2 of this scheduler
    s.settle()
    match = decided_lookup(manager, "cold", cold_keys)
    assert match.l3_pages == len(cold_keys)
    os.kill(jobs.link.process.pid, signal.SIGSTOP)  # the worker holds still: the read is certainly mid-job
    assert manager.start_prefetch("cold", cold_keys, match) == len(cold_keys)
    (prefetch,) = [job for job, _, _ in jobs._open.values()]
    assert prefetch.kind is JobKind.PREFETCH
    jobs.link.kill()
    deadline = time.monotonic() + 10
    while not jobs.lost:
        assert time.monotonic() < deadline, "the lost worker was never noticed"
        time.sleep(0.001)
    assert manager.prefetch_done("cold") and jobs.degraded
    assert jobs.jobs_lost == 1 and sorted(jobs.lost_slots) == sorted(prefetch.slots)
    manager.abort("cold")
    # Still serving: lookups answer at once, from L2, with L3 read as down.
    start = time.perf_counter()
    again = manager.lookup("hot-again", hot_keys)
    assert time.perf_counter() - start < 0.01
    assert again is not None and again.l2_pages == len(hot_keys)
    assert manager.lookup("cold-again", cold_keys).l3_pages == 0  # degraded: no L3 hit promised
    alloc = s.host
    s.l1.close()
    alloc.reap()
    quarantined = set(jobs.lost_slots)
    assert alloc.free_count == alloc.num_slots - len(quarantined)
    assert all(alloc.is_pending(slot) for slot in quarantined)  # held, never handed out


def test_a_job_the_child_has_no_tier_for_fails_alone():
    """A worker side without L3 answers an L3 job with an error and goes on serving."""
    from tiered_kv.hierarchy.job_transfers import JobTransferHalf
    from tiered_kv.hierarchy.l3_jobs import JobFailedError, L3Jobs
    from tiered_kv.hierarchy.manager import StorePlan

    jobs = L3Jobs(PipeLink(stack_worker, SPEC, 4, 4))  # L1 and L2, no L3
    try:
        with pytest.raises(JobFailedError, match="no L3"):
            jobs.exists(["a" * 32]).result(timeout=30)
        keys = keys_of(prompts(9, [2])[0])
        jobs.link.call("fill", keys, [1, 2])
        store = JobTransferHalf(jobs).store(StorePlan(keys, [0, 1], [0, 1]), [1, 2])
        store.synchronize()
        assert store.moved()  # the same child still moves bytes
    finally:
        jobs.close()
    assert jobs.in_flight() == 0 and not jobs.lost
