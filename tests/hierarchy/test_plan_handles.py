"""The worker's copy handle travels with its plan: ``complete_load(plan)`` and
``complete_store(plan, False)`` without a completion still free the slots only once the copy that
reads or writes them has landed (on a GPU it runs after the call returned).

Real HostPool and TransferHalf over an engine-like CPU pool, whose copies finish at once; the
engine's handles are wrapped in a gate that reports "done" only once the test opens it, as a copy
still running on a GPU would.
"""

from __future__ import annotations

import pickle
import threading

from tiered_kv import HostPool, allocate_engine_like
from tiered_kv.hierarchy import CacheManager, Policies, TransferHalf
from tiered_kv.hierarchy.oracle import fill_pages

from .conftest import PAGE, SPEC, assert_clean, decided_lookup, keys_of, prompts

KEYS = keys_of(prompts(101, [8])[0])


class Gated:
    """A copy handle that is done only once ``gate`` is set (and the real copy is)."""

    def __init__(self, handle, gate: threading.Event) -> None:
        self.handle, self.gate = handle, gate

    def done(self) -> bool:
        return self.gate.is_set() and self.handle.done()

    query = done

    def wait_layer(self, layer: int, stream=None) -> None:
        self.handle.wait_layer(layer, stream)

    def synchronize(self) -> None:
        self.gate.wait(10)


class Setup:
    def __init__(self) -> None:
        self.gate = threading.Event()
        self.host = HostPool(SPEC, 4)
        self.l1 = allocate_engine_like(SPEC, 9)
        self.worker = TransferHalf(self.l1, self.host)
        for name in ("load", "backup"):
            real = getattr(self.worker.engine, name)
            setattr(self.worker.engine, name, lambda *a, real=real, **kw: Gated(real(*a, **kw), self.gate))
        self.mgr = CacheManager(self.host, page_size=PAGE, policies=Policies(write="write_through"))

    def close(self) -> None:
        self.gate.set()
        self.mgr.close()
        assert_clean(self.host, None)
        self.host.close()


def test_complete_load_without_a_completion_waits_for_the_load_the_plan_carries():
    s = Setup()
    try:
        s.gate.set()  # the stores land at once
        fill_pages(s.l1, KEYS[:4], [1, 2, 3, 4])
        stored = s.mgr.on_l1_inserted(KEYS[:4])
        s.worker.store(stored, [1, 2, 3, 4])
        for finished in s.worker.finished_stores():
            s.mgr.complete_store(finished)
        s.gate.clear()  # the load below is still running
        decided_lookup(s.mgr, "r", KEYS[:4])
        plan = s.mgr.prepare_load(KEYS[:4], "r")
        s.worker.load(plan, [5, 6, 7, 8])
        s.mgr.complete_load(plan)  # no completion passed: the plan's own handle gates the slots
        other = s.mgr.prepare_store(KEYS[4:8])  # L2 is full: eviction drops the loaded pages
        assert len(other) == 0 and s.host.free_slots == 0  # their slots wait for the load
        s.gate.set()
        other = s.mgr.prepare_store(KEYS[4:8])
        assert len(other) == 4
        s.mgr.complete_store(other, False)
    finally:
        s.close()


def test_a_failed_store_without_a_completion_frees_its_slots_once_its_backup_landed():
    s = Setup()
    try:
        fill_pages(s.l1, KEYS[:4], [1, 2, 3, 4])
        plan = s.mgr.on_l1_inserted(KEYS[:4])
        s.worker.store(plan, [1, 2, 3, 4])
        s.mgr.complete_store(plan, False)  # e.g. the engine gave up on these pages
        s.host.reap()
        assert s.host.free_slots == 0  # the backup may still write into them
        s.gate.set()
        s.host.reap()
        assert s.host.free_slots == 4
        assert s.worker.finished_stores() == []  # ended already: nothing sealed, nothing to hand over
    finally:
        s.close()


def test_a_plan_with_a_handle_still_pickles_without_it():
    """Plans are plain data that cross processes; a handle is of the process that made it."""
    s = Setup()
    try:
        s.gate.set()
        fill_pages(s.l1, KEYS[:2], [1, 2])
        plan = s.mgr.on_l1_inserted(KEYS[:2])
        handle = s.worker.store(plan, [1, 2])
        assert plan.handle is handle
        copy = pickle.loads(pickle.dumps(plan))
        assert (copy.keys, copy.slots, copy.positions, copy.handle) == (plan.keys, plan.slots, plan.positions, None)
        for finished in s.worker.finished_stores():
            s.mgr.complete_store(finished)
    finally:
        s.close()
