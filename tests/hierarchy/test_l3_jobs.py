"""The scheduler side's L3 as jobs and results only: no controller, no backend, no bytes."""

from __future__ import annotations

from tiered_kv.hierarchy import CacheManager
from tiered_kv.hierarchy.jobs import JobKind, JobResult
from tiered_kv.hierarchy.l3_jobs import L3Jobs
from tiered_kv.hierarchy.links import OutboxLink
from tiered_kv.model.slot_allocator import SlotAllocator

from .conftest import PAGE

KEYS = [f"{i:064x}" for i in range(1, 5)]


def _answered(job, ok):
    return JobResult(job.job_id, job.kind, tuple(ok), sum(ok))


def test_lookup_and_prefetch_as_jobs_and_results():
    link = OutboxLink()
    slots = SlotAllocator(8)
    manager = CacheManager(slots, page_size=PAGE, l3=L3Jobs(link))
    assert manager.lookup("r", KEYS) is None  # asked, not waited for
    (exists,) = link.take_jobs()
    assert exists.kind is JobKind.EXISTS and exists.keys == tuple(KEYS)
    manager.l3.on_results([_answered(exists, [True, True, True, False])])
    match = manager.lookup("r", KEYS)
    assert (match.l2_pages, match.l3_pages) == (0, 3)

    assert manager.start_prefetch("r", KEYS, match) == 3
    (prefetch,) = link.take_jobs()
    assert prefetch.kind is JobKind.PREFETCH and len(prefetch.slots) == 3
    assert not manager.prefetch_done("r")
    manager.abort("r")  # the request went away while the worker reads into its slots
    slots.reap()
    assert slots.free_count == 8 - 3  # freed, but held until the job's result says it is done
    manager.l3.on_results([_answered(prefetch, [True, True, True])])
    slots.reap()
    assert slots.free_count == 8
    manager.close()
    assert slots.free_count == 8 and manager.l3.in_flight() == 0


def test_a_lost_job_quarantines_its_slots():
    link = OutboxLink()
    slots = SlotAllocator(8)
    manager = CacheManager(slots, page_size=PAGE, l3=L3Jobs(link))
    assert manager.lookup("r", KEYS) is None
    manager.l3.on_results([_answered(link.take_jobs()[0], [True, True, False, False])])
    match = manager.lookup("r", KEYS)
    manager.start_prefetch("r", KEYS, match)
    (prefetch,) = link.take_jobs()
    manager.l3.on_lost()  # the worker died with the read running
    assert manager.prefetch_done("r") and manager.l3.degraded
    manager.abort("r")
    manager.close()
    slots.reap()
    assert sorted(manager.l3.lost_slots) == sorted(prefetch.slots)
    assert slots.free_count == 8 - len(prefetch.slots)  # never handed out again
    assert all(slots.is_pending(s) for s in prefetch.slots)
