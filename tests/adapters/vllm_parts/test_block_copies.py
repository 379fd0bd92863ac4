"""``BlockCopies`` (the copies of tiered-kv's vLLM worker) with real pools and no vLLM: L1 shaped
like vLLM's canonical KV tensors (one ``[blocks, page bytes]`` row per block and layer), L2 a
``HostPool`` whose slots the scheduler hands out (``own_slots=False``, as in the worker).

On CPU the torch path runs (what vLLM's CPU platform uses); the ``gpu`` tests run the transfer
engine's path on CUDA and check that no job is reported before its copy completed.
"""

from __future__ import annotations

import pytest
import torch

from tiered_kv import Component, DeviceBuffer, DevicePool, HostPool, KVSpec
from tiered_kv.adapters.vllm.block_copies import BlockCopies
from tiered_kv.errors import IndexValidationError

GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not GPU, reason="needs CUDA")

LAYERS, BLOCKS, SLOTS, PAGE_BYTES = 3, 12, 10, 256


def _pools(device: str = "cpu") -> tuple[list[torch.Tensor], DevicePool, HostPool]:
    """vLLM-like L1 (random bytes, rows viewed from bf16 tensors as the worker wraps them) and L2."""
    spec = KVSpec(kind="vllm", page_size=16, layer_start=0, layer_end=LAYERS,
                  components=(Component("kv", PAGE_BYTES, "vllm canonical block"),), dims=(("dtype", "bfloat16"),))
    tensors = [torch.randint(-100, 100, (BLOCKS, 2, PAGE_BYTES // 4), dtype=torch.int16, device=device)
               .view(torch.bfloat16) for _ in range(LAYERS)]
    rows = [t.view(torch.int8).view(-1, PAGE_BYTES) for t in tensors]
    l1 = DevicePool(spec, {"kv": DeviceBuffer.page_indexed(rows)})
    l2 = HostPool(spec, SLOTS, own_slots=False)
    l2.buffer.copy_(torch.randint(0, 256, l2.buffer.shape, dtype=torch.uint8))
    return rows, l1, l2


def _blocks(rows: list[torch.Tensor], blocks: list[int]) -> list[torch.Tensor]:
    return [r[blocks].cpu().clone() for r in rows]


def _slots(l2: HostPool, slots: list[int]) -> list[torch.Tensor]:
    return [l2.chunk_view(0, layer)[slots].clone() for layer in range(LAYERS)]


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b))


@pytest.fixture
def cpu_copies():
    rows, l1, l2 = _pools()
    copies = BlockCopies(l1, l2)
    yield rows, l1, l2, copies
    copies.close()
    assert copies.in_flight() == []
    l2.close()


def test_store_then_load_round_trips_byte_exact_and_seals(cpu_copies):
    rows, _, l2, copies = cpu_copies
    stored, slots, keys = [5, 2, 9], [7, 0, 3], ["k5", "k2", "k9"]
    before = _blocks(rows, stored)
    others_of_l2 = _slots(l2, [s for s in range(SLOTS) if s not in slots])
    copies.store(1, stored, slots, keys)
    assert copies.finished() == [(1, True, 3 * PAGE_BYTES * LAYERS, pytest.approx(0, abs=60))]
    assert _equal(_slots(l2, slots), before)
    assert _equal(_slots(l2, [s for s in range(SLOTS) if s not in slots]), others_of_l2)
    for slot, key in zip(slots, keys):
        l2.verify_slot(slot, key)
        assert not l2.is_sealed(slot, "another key")

    loaded_into = [1, 10, 4]
    untouched = [b for b in range(BLOCKS) if b not in loaded_into]
    rest = _blocks(rows, untouched)
    copies.load(2, slots, loaded_into)
    [(job, ok, nbytes, seconds)] = copies.finished()
    assert (job, ok, nbytes) == (2, True, 3 * PAGE_BYTES * LAYERS) and seconds >= 0
    assert _equal(_blocks(rows, loaded_into), before)
    assert _equal(_blocks(rows, untouched), rest)   # no block outside the job was written
    assert copies.finished() == []


def test_finished_reports_each_job_once_in_submission_order(cpu_copies):
    _, _, _, copies = cpu_copies
    copies.store(30, [1], [1], ["a"])
    copies.load(10, [1], [2])
    copies.store(20, [3, 4], [2, 3], ["b", "c"])
    assert copies.in_flight() == [30, 10, 20]
    assert [j for j, *_ in copies.finished()] == [30, 10, 20]
    assert copies.finished() == [] and copies.in_flight() == []
    copies.load(40, [2], [5])
    assert [j for j, *_ in copies.finished()] == [40]


def test_wait_returns_and_leaves_the_report_to_finished(cpu_copies):
    _, _, l2, copies = cpu_copies
    copies.store(1, [3], [4], ["k"])
    copies.wait({1, 99})   # an unknown id is no error: vLLM may wait on jobs already reported
    assert copies.in_flight() == [1]
    assert [j for j, *_ in copies.finished()] == [1]
    l2.verify_slot(4, "k")


def test_empty_jobs_finish_with_no_bytes(cpu_copies):
    rows, _, l2, copies = cpu_copies
    before_l1, before_l2 = _blocks(rows, list(range(BLOCKS))), l2.buffer.clone()
    copies.store(1, [], [], [])
    copies.load(2, [], [])
    assert [(j, ok, n) for j, ok, n, _ in copies.finished()] == [(1, True, 0), (2, True, 0)]
    assert _equal(_blocks(rows, list(range(BLOCKS))), before_l1) and torch.equal(l2.buffer, before_l2)


def test_a_load_of_a_slot_never_sealed_copies_its_bytes_as_they_are(cpu_copies):
    """The copies do not read seals (the manager only hands out sealed slots): the slot's payload
    is copied and the job reported as succeeded."""
    rows, _, l2, copies = cpu_copies
    payload = _slots(l2, [6])
    copies.load(1, [6], [8])
    assert [(j, ok) for j, ok, *_ in copies.finished()] == [(1, True)]
    assert _equal(_blocks(rows, [8]), payload)
    assert not l2.is_sealed(6, "k")


@pytest.mark.parametrize("job, error", [
    (lambda c: c.store(1, [1], [1], ["a", "b"]), "1 slots but 2 keys"),   # keys checked before the copy
    (lambda c: c.store(1, [1], [1, 2], ["a", "b"]), "1 device pages but 2 host slots"),
    (lambda c: c.store(1, [1], [SLOTS], ["a"]), f"outside 0..{SLOTS - 1}"),
    (lambda c: c.load(1, [1], [BLOCKS]), f"outside 0..{BLOCKS - 1}"),
    (lambda c: c.load(1, [1, 2], [3, 3]), "repeats destination 3"),
    (lambda c: c.load(1, [], [3]), "1 blocks but no slots"),
])
def test_a_bad_job_raises_before_anything_moves(cpu_copies, job, error):
    rows, _, l2, copies = cpu_copies
    before_l1, before_l2 = _blocks(rows, list(range(BLOCKS))), l2.buffer.clone()
    with pytest.raises(IndexValidationError, match=error):
        job(copies)
    assert copies.in_flight() == [] and copies.finished() == []
    assert _equal(_blocks(rows, list(range(BLOCKS))), before_l1) and torch.equal(l2.buffer, before_l2)


def _hold_the_stream() -> torch.cuda.Event:
    """About half a second of GPU work on the current stream: the engine's copies wait for it. The
    event returned is done once the hold is over."""
    torch.cuda._sleep(1_000_000_000)
    over = torch.cuda.Event()
    over.record()
    return over


@gpu
@pytest.mark.gpu
def test_gpu_jobs_run_on_the_engine_and_finish_only_once_their_bytes_landed():
    rows, l1, l2 = _pools("cuda")
    copies = BlockCopies(l1, l2)
    assert copies.on_gpu
    # Jobs of the same shapes first: a kernel compiled on first use must not outlast the hold below.
    copies.store(0, [3, 4, 6], [1, 2, 4], ["w3", "w4", "w6"])
    copies.load(0, [1, 2, 4], [7, 8, 11])
    copies.store(0, [6], [5], ["w6"])
    copies.wait({0})
    assert [j for j, *_ in copies.finished()] == [0, 0, 0]
    stored, slots, keys = [5, 2, 9], [7, 0, 3], ["k5", "k2", "k9"]
    before = _blocks(rows, stored)
    torch.cuda.synchronize()
    hold = _hold_the_stream()
    copies.store(1, stored, slots, keys)
    if not hold.query():  # the issue returned while the copy still waits behind the caller's stream
        assert copies.finished() == []
        assert not any(l2.is_sealed(s, k) for s, k in zip(slots, keys))
    reported = []
    while not reported:
        reported = copies.finished()        # polled, never blocking
    assert [(j, ok, n) for j, ok, n, _ in reported] == [(1, True, 3 * PAGE_BYTES * LAYERS)]
    assert _equal(_slots(l2, slots), before)   # read at once: no synchronize before this
    for slot, key in zip(slots, keys):
        l2.verify_slot(slot, key)

    loaded_into = [1, 10, 4]
    untouched = [b for b in range(BLOCKS) if b not in loaded_into]
    rest = _blocks(rows, untouched)
    torch.cuda.synchronize()
    hold = _hold_the_stream()
    copies.load(2, slots, loaded_into)
    copies.store(3, [6], [8], ["k6"])
    if not hold.query():
        assert copies.finished() == []
    copies.wait({2})
    got = copies.finished()
    assert [j for j, *_ in got][:1] == [2]
    on_other_stream = torch.cuda.Stream()   # not ordered after the engine's streams: bytes must be there
    with torch.cuda.stream(on_other_stream):
        assert _equal(_blocks(rows, loaded_into), before)
        assert _equal(_blocks(rows, untouched), rest)
    copies.wait({3})
    assert [j for j, *_ in got + copies.finished()] == [2, 3]
    l2.verify_slot(8, "k6")
    copies.close()
    l2.close()
