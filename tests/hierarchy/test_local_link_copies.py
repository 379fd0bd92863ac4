"""Copies through ``LocalLink``: a store that lands after its job was sent still comes back.

A copy's completion does not call back (the transfer engine is polled), so over a link whose
worker side is in this process nothing would ever poll it: ``JobTransferHalf.drain`` would wait
forever on a store that landed. The link polls the worker side when the scheduler side asks.
"""

from __future__ import annotations

import threading

from tiered_kv.hierarchy.job_transfers import JobTransferHalf
from tiered_kv.hierarchy.job_worker import JobWorker
from tiered_kv.hierarchy.jobs import Job, JobKind, JobResult
from tiered_kv.hierarchy.l3_jobs import L3Jobs
from tiered_kv.hierarchy.links import LocalLink
from tiered_kv.hierarchy.manager import StorePlan
from tiered_kv.model.slot_allocator import SlotAllocator

from .conftest import keys_of, prompts


class LandsLater:
    """A copy under way until ``land()`` (as a device copy still running when its job was sent)."""

    def __init__(self, job: Job) -> None:
        self.job, self.landed = job, threading.Event()

    def done(self) -> bool:
        return self.landed.is_set()

    def result(self) -> JobResult:
        return JobResult(self.job.job_id, self.job.kind, (True,) * len(self.job.keys), len(self.job.keys))


def test_a_drain_of_stores_ends_once_they_land_over_a_local_link():
    running: list[LandsLater] = []

    def store(job: Job) -> LandsLater:
        running.append(LandsLater(job))
        return running[-1]

    jobs = L3Jobs(LocalLink(JobWorker(handlers={JobKind.STORE.route: store})))
    alloc = SlotAllocator(4)
    jobs.bind(alloc)
    half = JobTransferHalf(jobs)
    keys = keys_of(prompts(31, [2])[0])
    slots = alloc.allocate(2)
    plan = StorePlan(keys, slots, [0, 1])
    handle = half.store(plan, [1, 2])
    assert not handle.done()
    landed_plans: list = []
    drainer = threading.Thread(target=lambda: landed_plans.extend(half.drain()), daemon=True)
    drainer.start()
    running[0].landed.set()  # the copy lands after the drain began waiting
    drainer.join(10)
    assert not drainer.is_alive(), "the drain never saw the store land"
    assert landed_plans == [plan] and handle.moved()
    assert jobs.in_flight() == 0
    jobs.close()
    alloc.free(slots)
    alloc.reap()
    assert alloc.free_count == alloc.num_slots
