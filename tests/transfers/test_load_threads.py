"""What a load hands to library threads: the rest of its head, and how its body's blocks are cut.

The head (``KernelPath.start_load``): when the body of a load goes to a library thread, the caller
launches only the head's first ``CALLER_HEAD_BLOCKS`` blocks and returns; the launches of the rest
of the head are handed to a second library thread. On CPU the kernel copies at once, so the split
is visible in the bytes: after ``start_load`` only the first blocks' layers have landed, after the
returned ``rest`` the whole head, and never a layer outside it. The thread and event logic runs
with stand-in streams and events.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch

if not torch.cuda.is_available():  # kernels through Triton's interpreter on CPU-only machines
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from tiered_kv import nsa_spec
from tiered_kv.transfers.torch_path import validate
from tiered_kv.transfers.engine import COPY_PATHS, TransferEngine, TransferOptions, _blocks, _head_split, _Load
from tiered_kv.transfers.policy import CALLER_HEAD_BLOCKS, HEAD, LoadSplit
import tiered_kv.transfers.policy as tp

from ..fake_cuda import FakeEvent, FakeStream, patch_cuda
from ..kernels.pools import make_device_pool, make_host_pool, random_fill, random_ids


def _landed(device, host, slots, pages, layer: int) -> bool:
    return all(torch.equal(device.pool.chunk_view(ci, layer)[pages], host.chunk_view(ci, layer)[slots])
               for ci in range(len(host.spec.components)))


@pytest.mark.parametrize("blocks", [None, 1, 2, 3, 50])
@pytest.mark.parametrize("split", [LoadSplit(**HEAD), LoadSplit(head_layers=4, ramp=True)])
def test_start_load_launches_the_first_blocks_and_rest_the_others(blocks, split):
    spec = nsa_spec(num_layers=9, page_size=4)
    device, host = make_device_pool(spec, 20, "cpu"), make_host_pool(spec, 16, "page_first")
    engine = TransferEngine(device.pool, host)
    slots, pages = random_ids(7, 0, 16), random_ids(7, 1, 20)
    copy = validate(device.pool, host, pages, slots, to_host=False)
    head = split.head_layers
    head_split = _head_split(split)
    random_fill(device.roots)
    job = _Load(engine, list(range(head)), copy, head_split, TransferOptions())
    rest = COPY_PATHS["kernel"].start_load(job, blocks)
    block_list = _blocks(head, head_split, kernel=True)
    now = head if blocks is None else sum(len(b) for b in block_list[:blocks])
    assert [_landed(device, host, slots, pages, layer) for layer in range(spec.num_layers)] == \
        [layer < now for layer in range(spec.num_layers)]
    assert (rest is None) == (now == head)  # nothing left for a thread: nothing handed over
    if rest is None:
        return
    rest()
    assert [_landed(device, host, slots, pages, layer) for layer in range(spec.num_layers)] == \
        [layer < head for layer in range(spec.num_layers)]
    rest()  # launching the rest again copies the same bytes again: nothing else changes
    assert not _landed(device, host, slots, pages, head)


@pytest.mark.parametrize("split", [LoadSplit(**HEAD), tp.SCATTERED_LOADS[False], tp.SCATTERED_LOADS[True]],
                         ids=["HEAD", "scattered page_first", "scattered layer_first"])
def test_the_caller_launches_the_first_two_layers_of_auto_s_head(split):
    """With ``HEAD`` (blocks 1, 1, 1, 1, 1, 2, 1), the scattered ``page_first`` split's head
    (1, 1, 1, 1, 2, 2) and the scattered ``layer_first`` one (8 single layers) the caller's share
    is layers 0 and 1: the layers a model waits on first, launched before the call returns; the
    rest of the head is left to a library thread."""
    blocks = _blocks(split.head_layers, _head_split(split), kernel=True)
    assert [layer for b in blocks[:CALLER_HEAD_BLOCKS] for layer in b] == [0, 1]
    assert len(blocks) > CALLER_HEAD_BLOCKS


def _threads_without_cuda(monkeypatch):
    """A CPU engine whose library threads run with stand-in streams and events (the thread and
    event logic of ``_load_on_threads``, no device), and a body path that records its jobs."""
    import types

    patch_cuda(monkeypatch)
    spec = nsa_spec(num_layers=9, page_size=4)
    engine = TransferEngine(make_device_pool(spec, 20, "cpu").pool, make_host_pool(spec, 16, "page_first"))
    streams = [FakeStream() for _ in range(4)]
    engine.load_stream, engine.load_copy_stream, engine.load_uva_stream, engine.load_head_stream = streams
    bodies: list = []
    monkeypatch.setitem(COPY_PATHS, "mixed", types.SimpleNamespace(load=bodies.append))
    return engine, streams[:3], bodies


def test_a_handed_over_head_fits_beside_the_most_issue_threads(monkeypatch):
    """``issue_threads=MAX_ISSUE_THREADS`` is a valid option: a non-batch body runs on one thread,
    so the head's rest needs no thread beyond the limit."""
    import types

    from tiered_kv.transfers.engine import _Issued
    from tiered_kv.transfers.policy import MAX_ISSUE_THREADS

    engine, load_streams, bodies = _threads_without_cuda(monkeypatch)
    job, ready, head = types.SimpleNamespace(issued=_Issued(), split=LoadSplit()), FakeEvent(), []
    try:
        engine._load_on_threads(job, "mixed", MAX_ISSUE_THREADS, ready, lambda: head.append(True))
        job.issued.wait()
    finally:
        engine.close()
    assert head == [True] and bodies == [job]
    assert ready.records == [engine.load_head_stream]
    assert all(s.waited == [(ready, 1)] for s in load_streams)  # after the head's record


def test_a_failed_head_hand_over_issues_no_body_unordered(monkeypatch):
    """When the rest of the head fails, ``ready`` is never recorded: the body must not run with
    its streams waiting on nothing (unordered after the caller's stream and the head)."""
    import types

    from tiered_kv.transfers.engine import _Issued

    engine, load_streams, bodies = _threads_without_cuda(monkeypatch)
    job, ready = types.SimpleNamespace(issued=_Issued(), split=LoadSplit()), FakeEvent()

    def broken_head() -> None:
        raise RuntimeError("uva launch failed")
    try:
        engine._load_on_threads(job, "mixed", 1, ready, broken_head)
        with pytest.raises(RuntimeError, match="uva launch failed"):
            job.issued.wait()
    finally:
        engine.close()  # joins the threads: both jobs returned
    assert ready.records == [] and bodies == []
    assert all((ready, 0) not in s.waited for s in load_streams)


def test_loads_take_the_head_streams_in_turn_and_record_ready_on_their_own(monkeypatch):
    """A handed-over head's rest is launched after its call returned; the next load's caller makes
    its head stream wait on the caller's stream, so it takes the other head stream, and each load's
    ready event is recorded on its own head stream."""
    import types

    from tiered_kv.transfers.engine import HEAD_STREAMS, _Issued

    engine, load_streams, bodies = _threads_without_cuda(monkeypatch)
    engine._head_streams, engine._head_turn = [FakeStream() for _ in range(HEAD_STREAMS)], 0
    turns = [engine._next_head_stream() for _ in range(2 * HEAD_STREAMS)]
    assert turns == engine._head_streams * 2 and len(set(map(id, turns[:HEAD_STREAMS]))) == HEAD_STREAMS
    jobs = [types.SimpleNamespace(issued=_Issued(), split=LoadSplit()) for _ in range(2)]
    readies = [FakeEvent() for _ in range(2)]
    try:
        for job, ready, stream in zip(jobs, readies, engine._head_streams):
            engine._load_on_threads(job, "mixed", 1, ready, lambda: None, stream)
        for job in jobs:
            job.issued.wait()
    finally:
        engine.close()
    assert [ready.records for ready in readies] == [[engine._head_streams[0]], [engine._head_streams[1]]]
    assert bodies == jobs


# --- the body's lead calls (``lead_blocks``) and waves (``plan_wave``) -------------------------------


@pytest.mark.parametrize(("lead", "calls"), [(1, [1, 10]), (3, [1, 1, 1, 8]), (20, [1] * 11)])
def test_lead_blocks_plans_the_first_blocks_one_call_each(monkeypatch, lead, calls):
    """``staged_part`` calls the ring once per lead block, then once for the rest (never an empty
    call), and every layer is finished once, in order. 20 layers in ramped 2-layer blocks: 11
    blocks (1, then 2 each, then 1)."""
    spec = nsa_spec(num_layers=20, page_size=4)
    device, host = make_device_pool(spec, 20, "cpu"), make_host_pool(spec, 16, "page_first")
    engine = TransferEngine(device.pool, host)
    seen = []

    def groups_done(groups, host_ids, device_ids, *, on_group_done=None, **_):
        seen.append(len(groups))
        for g in range(len(groups)):
            if on_group_done is not None:
                on_group_done(g)
    monkeypatch.setattr(engine.staging_copier("load"), "to_device_groups", groups_done)
    copy = validate(device.pool, host, random_ids(6, 1, 20), random_ids(6, 0, 16), to_host=False)
    split = LoadSplit(1.0, layers_per_copy=2, ramp=True, lead_blocks=lead)
    job = _Load(engine, list(range(20)), copy, split, TransferOptions())
    finished = []
    monkeypatch.setattr(job, "finish_layer", finished.append)
    job.staged_part((copy.host_slots, copy.device_pages), (0, 1))
    assert seen == calls and finished == list(range(20))


@pytest.mark.parametrize(("lead", "wave", "ctas"), [(1, None, None), (1, 1, 16), (3, 2, 32)])
def test_staged_part_hands_its_plan_wave_and_scatter_ctas_to_every_call_into_the_ring(monkeypatch, lead, wave, ctas):
    """``LoadSplit.plan_wave`` and ``staging_ctas`` reach the staging ring's calls (lead blocks and
    the rest alike)."""
    spec = nsa_spec(num_layers=20, page_size=4)
    device, host = make_device_pool(spec, 20, "cpu"), make_host_pool(spec, 16, "page_first")
    engine = TransferEngine(device.pool, host)
    seen = []

    def run(groups, host_ids, device_ids, *, on_group_done=None, first_wave="missing", num_ctas="missing", **_):
        seen.append((first_wave, num_ctas))
        for g in range(len(groups)):
            if on_group_done is not None:
                on_group_done(g)
    monkeypatch.setattr(engine.staging_copier("load"), "to_device_groups", run)
    copy = validate(device.pool, host, random_ids(6, 1, 20), random_ids(6, 0, 16), to_host=False)
    split = LoadSplit(1.0, layers_per_copy=2, lead_blocks=lead, plan_wave=wave, staging_ctas=ctas)
    job = _Load(engine, list(range(20)), copy, split, TransferOptions())
    monkeypatch.setattr(job, "finish_layer", lambda index: None)
    job.staged_part((copy.host_slots, copy.device_pages), (0, 1))
    assert seen == [(wave, ctas)] * (lead + 1)


def test_a_kernel_part_without_pages_plans_and_uploads_nothing(monkeypatch):
    """A ``mixed`` split whose copy engines take every page (``ce_fraction`` 1) leaves the kernel
    part empty: no plans, no upload (about 1 ms of the body's thread on the H200's host), no launch."""
    from tiered_kv.kernels import uva_copy

    spec = nsa_spec(num_layers=6, page_size=4)
    device, host = make_device_pool(spec, 20, "cpu"), make_host_pool(spec, 16, "layer_first")
    engine = TransferEngine(device.pool, host)
    copy = validate(device.pool, host, random_ids(6, 1, 20), random_ids(6, 0, 16), to_host=False)
    uploads = []
    monkeypatch.setattr(uva_copy, "upload", lambda *a, **k: uploads.append(a))
    monkeypatch.setattr(engine, "_load_plan", lambda *a, **k: pytest.fail("planned a kernel part without pages"))
    job = _Load(engine, list(range(6)), copy, LoadSplit(1.0), TransferOptions())
    job.kernel_part((copy.host_slots[:0], copy.device_pages[:0]), None, None)
    assert job.uva is None and uploads == []


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("split", [
    LoadSplit(0.8, layers_per_copy=8, kernel_blocks=8, ramp=True, head_layers=8),
    LoadSplit(0.8, layers_per_copy=4, kernel_blocks=4, ramp=True, head_layers=2, lead_blocks=3),
    LoadSplit(1.0, layers_per_copy=2, ramp=True, lead_blocks=4),
    LoadSplit(0.8, layers_per_copy=4, kernel_blocks=4, ramp=True, ramp_step=2, head_layers=6, head_ramp_step=6),
    tp.SCATTERED_LOADS[False],
    tp.SCATTERED_LOADS[True],
    replace(tp.MIXED_LOADS[(True, True)], plan_wave=2, lead_blocks=2),
], ids=["head 8", "head 2 lead 3", "lead 4", "head's own ramp", "pf scattered", "lf scattered",
        "lf runs, lead 2, waves of 2"])
def test_loads_of_these_splits_land_every_byte(layout, split):
    """Loads with a head, lead blocks, the head's own ramp, or waves (on CPU only the bytes: the
    ordering is tested with stand-in streams above)."""
    from ..kernels.pools import check_copy
    from tiered_kv.transfers.torch_path import load_pairs

    spec = nsa_spec(num_layers=13, page_size=4)
    device, host = make_device_pool(spec, 20, "cpu"), make_host_pool(spec, 16, layout)
    engine = TransferEngine(device.pool, host, path="mixed", options=TransferOptions(load_split=split))
    slots, pages = torch.randperm(16)[:9], random_ids(9, 1, 20)
    pairs = [pair for layer in range(13) for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages))


def test_a_ramp_step_body_continues_the_heads_ramp():
    """With ``ramp_step`` the body's blocks grow with the layer's index in the whole load (one
    layer more every ``ramp_step`` layers), continuing the head's ramp; a doubling ramp starts
    again at one layer after the head."""
    split = LoadSplit(0.8, layers_per_copy=8, kernel_blocks=8, ramp=True, ramp_step=4, head_layers=8)
    body = _blocks(53, split, offset=8)
    assert [i for block in body for i in block] == list(range(53))
    assert [len(b) for b in body] == [min(8, 1 + (8 + b[0]) // 4) for b in body][:-1] + [len(body[-1])]
    assert len(body[0]) == 3 and len(_blocks(8, _head_split(split), kernel=True)[0]) == 1
    doubling = LoadSplit(0.8, layers_per_copy=8, kernel_blocks=8, ramp=True, head_layers=8)
    for kernel in (False, True):
        assert [len(b) for b in _blocks(53, doubling, kernel=kernel, offset=8)][:5] == [1, 2, 4, 8, 8]


# --- the head's own ramp (``LoadSplit.head_ramp_step``) -------------------------------------------
def test_auto_s_scattered_layer_first_head_is_single_layers():
    split = tp.SCATTERED_LOADS[True]
    assert [len(b) for b in _blocks(split.head_layers, _head_split(split), kernel=True)] == [1] * 8
    assert tp.SCATTERED_LOADS_BESIDE_BACKUP[True] == split


def test_auto_s_idle_staged_bodies_plan_in_waves_and_loads_beside_a_backup_in_one_call():
    """``auto``'s several-layer loads whose body goes through the staging ring start their waves at
    one block (``plan_wave`` 1); beside a backup (not measured with waves) and single layers they
    keep one call."""
    def split(**case):
        return tp.choose_split(num_layers=61, has_batch=True, **case)

    for dense in (False, True):
        for scattered in (False, True):
            idle = split(dense_host_rows=dense, scattered=scattered, backup_in_flight=False)
            assert idle.plan_wave == (1 if idle.ce_path == "staged" else None), (dense, scattered)
            assert split(dense_host_rows=dense, scattered=scattered, backup_in_flight=True).plan_wave is None
    assert tp.choose_split(dense_host_rows=True, scattered=False, backup_in_flight=False, num_layers=1,
                           has_batch=True).plan_wave is None


def test_head_ramp_step_changes_the_heads_blocks_and_not_the_bodys():
    """A head of 8 at ``head_ramp_step`` 8 is 8 single-layer blocks where ``ramp_step`` 4 gave
    1, 1, 1, 1, 2, 2; the body after it keeps ``ramp_step``'s blocks (they continue from layer 8)."""
    split = tp.SCATTERED_LOADS[False]
    assert split.ramp_step == 4 and split.head_layers == 8
    single = replace(split, head_ramp_step=8)
    assert [len(b) for b in _blocks(8, _head_split(split), kernel=True)] == [1, 1, 1, 1, 2, 2]
    assert [len(b) for b in _blocks(8, _head_split(single), kernel=True)] == [1] * 8
    for kernel in (False, True):
        assert _blocks(53, single, kernel=kernel, offset=8) == _blocks(53, split, kernel=kernel, offset=8)


@pytest.mark.parametrize("bad", [0, -2, True, 2.5])
@pytest.mark.parametrize("name", ["head_ramp_step"])
def test_head_counts_are_positive_ints_or_none(name, bad):
    from tiered_kv import ConfigError

    with pytest.raises(ConfigError, match=name):
        LoadSplit(0.8, ramp=True, head_layers=4, **{name: bad})
    assert getattr(LoadSplit(0.8, ramp=True, head_layers=4, **{name: None}), name) is None
