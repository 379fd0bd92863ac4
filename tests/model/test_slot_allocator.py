"""The host slot allocator: runs of adjacent slots, completion-gated frees, misuse errors."""

from __future__ import annotations

import random
from concurrent.futures import Future

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered_kv.errors import DoubleFreeError, ForeignSlotError, PoolError, PoolExhaustedError
from tiered_kv.model.slot_allocator import SlotAllocator


class FakeEvent:
    """Stands in for a CUDA event: ``query()`` answers whether the GPU work is done."""

    def __init__(self) -> None:
        self.finished = False

    def query(self) -> bool:
        return self.finished


def test_fresh_allocations_are_one_run():
    alloc = SlotAllocator(100)
    slots = alloc.allocate(10)
    assert slots == list(range(slots[0], slots[0] + 10))
    assert alloc.free_count == 90


def test_prefers_a_run_that_fits_over_fragments():
    alloc = SlotAllocator(20)
    everything = alloc.allocate(20)
    alloc.free([1, 2, 5, 6, 7, 8, 12, 13, 14])  # runs of 2, 4 and 3
    got = alloc.allocate(3)
    assert got == [12, 13, 14]  # best fit: the run of exactly 3
    got = alloc.allocate(3)
    assert got == [5, 6, 7]
    assert set(everything) >= set(got)


def test_fragmented_allocation_takes_longest_runs_first():
    alloc = SlotAllocator(12)
    alloc.allocate(12)
    alloc.free([0, 3, 4, 5, 9, 10])
    got = alloc.allocate(5)
    assert got[:3] == [3, 4, 5]
    assert sorted(got) == [0, 3, 4, 5, 9] or sorted(got) == [3, 4, 5, 9, 10]


def test_exhaustion():
    alloc = SlotAllocator(4)
    alloc.allocate(3)
    with pytest.raises(PoolExhaustedError, match="need 2 host slots, 1 free of 4"):
        alloc.allocate(2)
    assert alloc.free_count == 1  # nothing was taken by the failed call


def test_double_free_and_foreign_ids():
    alloc = SlotAllocator(8)
    slots = alloc.allocate(2)
    alloc.free(slots[:1])
    with pytest.raises(DoubleFreeError, match=f"slot {slots[0]} is already free"):
        alloc.free(slots[:1])
    with pytest.raises(DoubleFreeError, match="freed twice"):
        alloc.free([slots[1], slots[1]])
    with pytest.raises(ForeignSlotError, match="slot 8"):
        alloc.free([8])
    with pytest.raises(ForeignSlotError, match="slot -1"):
        alloc.free([-1])
    with pytest.raises(ForeignSlotError, match="slot 7 was never handed out"):
        alloc.free([7])  # in range but never handed out
    # The failed calls freed nothing.
    assert alloc.free_count == 7
    alloc.free(slots[1:])
    assert alloc.free_count == 8


def test_never_handed_out_is_foreign_and_freed_again_is_a_double_free():
    alloc = SlotAllocator(4)
    [slot] = alloc.allocate(1)
    alloc.free([slot])
    with pytest.raises(DoubleFreeError, match=f"slot {slot} is already free"):
        alloc.free([slot])  # handed out once, free again
    with pytest.raises(ForeignSlotError, match="slot 3 was never handed out"):
        alloc.free([3])
    assert alloc.free_count == 4


@pytest.mark.parametrize("ids", [
    [np.int64(0), np.int32(1)],
    np.array([0, 1], dtype=np.uint16),
    torch.tensor([0, 1]),
    torch.tensor([0, 1], dtype=torch.int32),
    (i for i in (0, 1)),
    [torch.tensor(0), np.array(1)],
], ids=["numpy-ints", "numpy-array", "tensor", "int32-tensor", "generator", "0-d"])
def test_integer_ids_of_every_kind_are_freed(ids):
    alloc = SlotAllocator(3)
    assert alloc.allocate(2) == [0, 1]
    alloc.free(ids)
    assert alloc.free_count == 3
    assert alloc.runs() == [(0, 3)]


@pytest.mark.parametrize("ids, message", [
    ([True], "slot True \\(index 0\\) is not a slot id"),
    ([np.True_], "not a slot id"),
    ([1.0], "slot 1.0 \\(index 0\\) is not a slot id"),
    ([np.float64(1)], "not a slot id"),
    (np.array([True, False]), "expected integers, got bool"),
    (np.array([1.0]), "expected integers, got float64"),
    (torch.tensor([True]), "expected integers, got torch.bool"),
    (torch.tensor([1.0]), "expected integers, got torch.float32"),
    (torch.tensor([[1]]), "1-D"),
    ([0, None], "None \\(index 1\\)"),
    ("01", "iterable of ints, got str"),
    (1, "iterable of ints, got int"),
    ([0, 2**70], "outside|not a slot of this pool"),
])
def test_bools_floats_and_non_ids_are_refused_and_free_nothing(ids, message):
    alloc = SlotAllocator(3)
    alloc.allocate(2)  # 0 and 1 handed out: a bool True would name slot 1
    with pytest.raises(ForeignSlotError, match=message):
        alloc.free(ids)
    assert alloc.free_count == 1
    with pytest.raises(ForeignSlotError, match="not a slot id"):
        alloc.hold([True], None)
    with pytest.raises(ForeignSlotError, match="not a slot id"):
        alloc.is_allocated(True)
    assert alloc.is_allocated(np.int64(1)) and alloc.is_allocated(torch.tensor(1))


@pytest.mark.parametrize("count", [True, 1.0, "1", -1, None, 2**70])
def test_counts_are_checked_ints(count):
    alloc = SlotAllocator(4)
    with pytest.raises(PoolError, match="count must be an int"):
        alloc.allocate(count)
    assert alloc.free_count == 4
    with pytest.raises(PoolError, match="num_slots must be an int"):
        SlotAllocator(count if count not in (1.0, -1) else 0)
    assert alloc.allocate(np.int64(2)) == [0, 1]


def test_free_waits_for_event_completion():
    alloc = SlotAllocator(4)
    slots = alloc.allocate(4)
    event = FakeEvent()
    alloc.free(slots[:2], event)
    assert alloc.free_count == 0
    with pytest.raises(PoolExhaustedError, match="2 waiting"):
        alloc.allocate(1)
    with pytest.raises(DoubleFreeError):
        alloc.free(slots[:1])  # already waiting to be freed
    event.finished = True
    assert alloc.allocate(2) == slots[:2]


def test_free_waits_for_future_and_holds():
    alloc = SlotAllocator(3)
    slots = alloc.allocate(3)
    future: Future = Future()
    worker: Future = Future()
    alloc.hold(slots[2:], worker)  # a cancelled read whose thread still runs
    alloc.free(slots[:1], future)
    alloc.free(slots[1:])  # slot 1 now; slot 2 only once the worker returns
    assert alloc.free_count == 1
    future.set_result(None)
    assert alloc.reap() == 1
    assert alloc.free_count == 2
    worker.set_result(None)
    assert alloc.reap() == 1
    assert alloc.runs() == [(0, 3)]


def test_hold_rejects_foreign_slots_and_ignores_unallocated():
    alloc = SlotAllocator(3)
    with pytest.raises(ForeignSlotError):
        alloc.hold([3], None)
    worker: Future = Future()
    alloc.hold([1], worker)  # not handed out by this allocator: nothing to protect
    assert alloc.allocate(3) == [0, 1, 2]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 6)), max_size=40), st.integers(0, 2**32))
def test_random_sequences_keep_invariants(ops, seed):
    rng = random.Random(seed)
    alloc = SlotAllocator(32)
    owned: set[int] = set()
    for is_alloc, n in ops:
        if is_alloc:
            try:
                got = alloc.allocate(n)
            except PoolExhaustedError:
                assert alloc.free_count < n
                continue
            assert len(got) == n and not owned & set(got)
            owned |= set(got)
        elif owned:
            give = rng.sample(sorted(owned), min(n, len(owned)))
            alloc.free(give)
            owned -= set(give)
        assert alloc.free_count == 32 - len(owned)
        runs = alloc.runs()
        assert all(a < b for a, b in runs)
        assert all(runs[i][1] < runs[i + 1][0] for i in range(len(runs) - 1))  # disjoint, merged
        assert sum(b - a for a, b in runs) == alloc.free_count


def test_allocated_slots_lists_what_is_handed_out_and_not_pending():
    from tiered_kv import HostPool, nsa_spec

    class Flag:
        is_done = False

        def done(self):
            return self.is_done

    with HostPool(nsa_spec(num_layers=1, page_size=16), 6) as pool:
        a = pool.allocate(4)
        assert sorted(pool.allocated_slots()) == sorted(a) and pool.pending_slots == 0
        flag = Flag()
        pool.free(a[:2], completion=flag)
        assert sorted(pool.allocated_slots()) == sorted(a[2:]) and pool.pending_slots == 2
        flag.is_done = True
        pool.free(a[2:])
        pool.reap()
        assert pool.allocated_slots() == [] and pool.pending_slots == 0 and pool.free_slots == 6


@pytest.mark.parametrize("completion", [5, "done", object()])
def test_a_completion_that_is_none_is_the_librarys_error_and_frees_nothing(completion):
    # Was a bare TypeError from the completion adapter.
    allocator = SlotAllocator(4)
    slots = allocator.allocate(2)
    with pytest.raises(PoolError, match="completion"):
        allocator.free(slots, completion=completion)
    assert allocator.allocated_slots() == slots
    allocator.free(slots)
    assert allocator.free_count == 4


def test_queries_count_a_pending_free_as_free_once_its_completion_is_done():
    """No reap between the completion and the queries: the counts follow the work, not the
    allocator's bookkeeping."""
    alloc = SlotAllocator(4)
    slots = alloc.allocate(4)
    done: Future = Future()
    alloc.free(slots[:2], done)
    assert (alloc.free_count, alloc.pending_count, alloc.is_pending(slots[0])) == (0, 2, True)
    done.set_result(None)
    assert (alloc.free_count, alloc.pending_count, alloc.is_pending(slots[0])) == (2, 0, False)
    assert not alloc.is_allocated(slots[0]) and alloc.allocated_slots() == slots[2:]


def test_is_held_while_the_work_of_a_hold_runs():
    alloc = SlotAllocator(4)
    a, b = alloc.allocate(2)
    work = Future()
    alloc.hold([a], work)
    assert alloc.is_held(a) and not alloc.is_held(b)
    work.set_result(None)
    assert not alloc.is_held(a)
