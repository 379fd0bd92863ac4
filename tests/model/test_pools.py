"""DevicePool wraps engine tensors without copying; HostPool geometry and allocation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tiered_kv import DeviceBuffer, DevicePool, HostPool, allocate_engine_like, mha_spec, nsa_spec, torch_backup, torch_load_layer
from tiered_kv.errors import ForeignSlotError, IndexValidationError, PoolError, PoolExhaustedError, SpecError

NSA = nsa_spec(num_layers=3, page_size=64)


def sglang_nsa_tensors(pages: int, layers: int = 3):
    """Shapes as SGLang's NSATokenToKVPool has them: latent [tokens, 1, 656], indexer [pages+1, 8448]."""
    latent = [torch.zeros(pages * 64, 1, 656, dtype=torch.uint8) for _ in range(layers)]
    indexer = [torch.empty(pages + 1, 8448, dtype=torch.uint8) for _ in range(layers)]
    return latent, indexer


def test_wraps_sglang_shapes_without_copying():
    latent, indexer = sglang_nsa_tensors(10)
    pool = DevicePool(NSA, {"latent": DeviceBuffer.token_indexed(latent, 64),
                            "indexer": DeviceBuffer.page_indexed(indexer)}, reserved_pages=[0])
    assert pool.num_pages == 10  # the indexer's spare page is not exposed
    view = pool.chunk_view(0, 1)
    assert view.shape == (10, 41_984)
    assert view.data_ptr() == latent[1].data_ptr()
    view[3].fill_(7)  # writes land in the engine's tensor, tokens 192..255
    assert bool((latent[1][192:256] == 7).all())
    assert int(latent[1][:192].sum()) == 0 and int(latent[1][256:].sum()) == 0
    assert int(latent[0].sum()) == 0
    assert pool.chunk_view(1, 2).data_ptr() == indexer[2].data_ptr()
    assert pool.reserved_pages == frozenset({0})


def test_strided_vllm_style_buffers():
    spec = mha_spec(num_layers=2, page_size=16, num_kv_heads=2, head_dim=8, dtype="bf16")
    kv = [torch.zeros(5, 2, 16, 2, 8, dtype=torch.bfloat16) for _ in range(2)]  # [blocks, k|v, ...]
    pool = DevicePool(spec, {"k": DeviceBuffer.page_indexed([t[:, 0] for t in kv]),
                             "v": DeviceBuffer.page_indexed([t[:, 1] for t in kv])})
    pool.chunk_view(1, 0)[2].fill_(1)
    assert bool((kv[0][2, 1].view(torch.uint8) == 1).all())
    assert int(kv[0][2, 0].view(torch.uint8).sum()) == 0
    assert int(kv[0][1].view(torch.uint8).sum()) == 0 and int(kv[0][3].view(torch.uint8).sum()) == 0


def test_mismatched_tensors_are_named():
    latent, indexer = sglang_nsa_tensors(4)
    bad_latent = [torch.empty(4 * 64, 1, 640, dtype=torch.uint8) for _ in range(3)]
    with pytest.raises(SpecError, match=r"component 'latent' layer 0: .*\(256, 1, 640\).*40960 B, the spec says 41984 B"):
        DevicePool(NSA, {"latent": DeviceBuffer.token_indexed(bad_latent, 64), "indexer": DeviceBuffer.page_indexed(indexer)})
    with pytest.raises(SpecError, match="2 layer tensors, spec has 3"):
        DevicePool(NSA, {"latent": DeviceBuffer.token_indexed(latent[:2], 64), "indexer": DeviceBuffer.page_indexed(indexer)})
    with pytest.raises(SpecError, match="do not match the spec's components"):
        DevicePool(NSA, {"latent": DeviceBuffer.token_indexed(latent, 64)})
    with pytest.raises(SpecError, match="reserved pages"):
        DevicePool(NSA, {"latent": DeviceBuffer.token_indexed(latent, 64), "indexer": DeviceBuffer.page_indexed(indexer)},
                   reserved_pages=[4])
    strided = [torch.empty(64 * 4, 2, 656, dtype=torch.uint8)[:, 0] for _ in range(3)]
    with pytest.raises(SpecError, match="adjacent"):
        DevicePool(NSA, {"latent": DeviceBuffer.token_indexed(strided, 64), "indexer": DeviceBuffer.page_indexed(indexer)})


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_host_pool_geometry(layout):
    with HostPool(NSA, 5, layout) as pool:
        seen = set()
        for ci, c in enumerate(NSA.components):
            for layer in range(NSA.num_layers):
                view = pool.chunk_view(ci, layer)
                assert view.shape == (5, c.bytes_per_layer)
                for slot in range(5):
                    start = view[slot].data_ptr() - pool.buffer.data_ptr()
                    seen.add((start, start + c.bytes_per_layer))
        spans = sorted(seen)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # no two chunks overlap
        assert spans[-1][1] <= pool.nbytes
        assert pool.buffer.data_ptr() % 4096 == 0
        if layout == "page_first":
            assert pool.slot_bytes % 4096 == 0
            assert pool.nbytes == 5 * pool.slot_bytes  # exact size, no power-of-two rounding
            assert pool.chunk_view(0, 0)[2].data_ptr() == pool.slot_address(2) + 4096


def test_host_pool_allocation_and_errors():
    with HostPool(NSA, 4) as pool:
        slots = pool.allocate(3)
        assert slots == [0, 1, 2]
        with pytest.raises(PoolExhaustedError):
            pool.allocate(2)
        pool.free(slots)
        assert pool.free_slots == 4
        with pytest.raises(ForeignSlotError):
            pool.record_view(4)
    with pytest.raises(PoolError, match="unknown host layout 'middle_first'"):
        HostPool(NSA, 4, "middle_first")
    with pytest.raises(PoolError, match="num_slots"):
        HostPool(NSA, 0)
    with HostPool(NSA, 2, "layer_first") as pool:
        with pytest.raises(PoolError, match="page_first"):
            pool.seal(0, "k")


def test_host_pool_is_not_pinned_without_cuda():
    with HostPool(NSA, 2) as pool:
        assert pool.memory.pinned == torch.cuda.is_available()


def test_allocate_engine_like_matches_spec():
    pool = allocate_engine_like(NSA, 6)
    assert pool.num_pages == 6 and pool.reserved_pages == {0}
    assert pool.chunk_view(0, 0).stride(0) == 41_984


# --- ids: one rule for slot and page ids ----------------------------------------------------
def test_host_pool_takes_numpy_and_tensor_ids_and_refuses_bools():
    with HostPool(NSA, 3) as pool:
        slots = pool.allocate(2)
        assert pool.check_slot(np.int64(1)) == 1 and pool.check_slot(torch.tensor(2)) == 2
        for bad in (True, np.True_, 1.0, np.float32(1), "1", None, torch.tensor(1.0), torch.tensor([1])):
            with pytest.raises(ForeignSlotError, match="not a slot id"):
                pool.check_slot(bad)
        with pytest.raises(ForeignSlotError, match="not a slot id"):
            pool.free([True])  # would free slot 1
        assert pool.is_allocated(1)
        pool.free(np.array(slots))
        assert pool.free_slots == 3


def test_seal_refuses_a_slot_that_is_not_handed_out():
    with HostPool(NSA, 2) as pool:
        with pytest.raises(ForeignSlotError, match="seal of slot 0, which is not allocated"):
            pool.seal(0, "k")  # never handed out
        [slot] = pool.allocate(1)
        pool.seal(slot, "k")
        assert pool.is_sealed(slot, "k")
        pool.free([slot])
        with pytest.raises(ForeignSlotError, match="not allocated"):
            pool.seal(slot, "k")  # handed out before, free now
        assert pool.free_slots == 2
    with HostPool(NSA, 2, own_slots=False) as worker:  # slots come from a scheduler elsewhere
        worker.seal(1, "k")
        assert worker.is_sealed(1, "k")


@pytest.mark.parametrize("pages, message", [
    ([1, True], "device pages: index 1 is True, not an int"),
    ([1.0, 2], "device pages: index 0 is 1.0, not an int"),
    (np.array([1.5, 2.5]), "expected integer indices, got float64"),
    (np.array([True, False]), "expected integer indices, got bool"),
    (torch.tensor([True, True]), "expected integer indices, got torch.bool"),
    ([1, 2**70], "index 1 is 1180591620717411303424, outside int64"),
    ([1, "2"], "index 1 is '2', not an int"),
    ("12", "expected a sequence of ints, got str"),
])
def test_device_page_ids_refuse_bools_and_floats(pages, message):
    device = allocate_engine_like(NSA, 4)
    with HostPool(NSA, 2) as host:
        with pytest.raises(IndexValidationError, match=message):
            torch_backup(device, host, pages, [0, 1])


@pytest.mark.parametrize("pages", [
    [np.int64(1), np.int32(2)], np.array([1, 2]), np.array([1, 2], dtype=np.uint8), torch.tensor([1, 2]),
    [torch.tensor(1), torch.tensor(2)],
], ids=["numpy-ints", "numpy-array", "uint8-array", "tensor", "0-d-tensors"])
def test_device_page_ids_take_numpy_and_tensors(pages):
    device = allocate_engine_like(NSA, 4)
    for layer in range(NSA.num_layers):
        device.chunk_view(0, layer).copy_(torch.randint(0, 256, device.chunk_view(0, layer).shape, dtype=torch.uint8))
    with HostPool(NSA, 2) as host:
        copy = torch_backup(device, host, pages, np.array([1, 0]))
        assert copy.device_pages.tolist() == [1, 2] and copy.host_slots.tolist() == [1, 0]
        assert torch.equal(host.chunk_view(0, 1)[1], device.chunk_view(0, 1)[1])
        assert torch.equal(host.chunk_view(0, 1)[0], device.chunk_view(0, 1)[2])


def test_layer_and_reserved_page_ids_refuse_bools_and_floats():
    device = allocate_engine_like(NSA, 4)
    with HostPool(NSA, 2) as host:
        for layer in (True, 1.0, "1", -1, 3):
            with pytest.raises(IndexValidationError, match="layer"):
                torch_load_layer(host, device, [0], [1], layer)
    latent, indexer = sglang_nsa_tensors(4)
    buffers = {"latent": DeviceBuffer.token_indexed(latent, 64), "indexer": DeviceBuffer.page_indexed(indexer)}
    for reserved, message in (([True], "index 0 is True"), ([0, 1.5], "index 1 is 1.5")):
        with pytest.raises(SpecError, match=message):
            DevicePool(NSA, buffers, reserved_pages=reserved)
    assert DevicePool(NSA, buffers, reserved_pages=np.array([0, 3])).reserved_pages == {0, 3}
    assert DevicePool(NSA, buffers, reserved_pages=torch.tensor([1])).reserved_pages == {1}


@pytest.mark.parametrize("num_slots", [True, 2.5, "4", 0, -1, 2**40, None])
def test_host_pool_sizes_are_checked_ints(num_slots):
    with pytest.raises(PoolError, match="num_slots must be an int"):
        HostPool(NSA, num_slots)


def test_host_memory_refuses_what_it_cannot_map_with_a_pool_error():
    from tiered_kv.model.host_memory import HostMemory

    for size in (2**70, 2**62):  # beyond ssize_t; beyond any machine's memory
        with pytest.raises(PoolError, match=f"cannot map {size} B"):
            HostMemory(size, pin=False)
    for size in (True, 4096.0, 0):
        with pytest.raises(PoolError, match="size must be an int > 0"):
            HostMemory(size, pin=False)
    for node in (True, -1, 0.0, "0"):
        with pytest.raises(PoolError, match="numa_node must be None or a node number"):
            HostPool(NSA, 2, numa_node=node)


def test_a_cpulist_numa_cannot_read_is_no_placement(tmp_path):
    from tiered_kv.model.numa import node_cpus, on_node

    node = tmp_path / "devices/system/node/node0"
    node.mkdir(parents=True)
    (node / "cpulist").write_text("0-x,\n")
    assert node_cpus(0, tmp_path) == set()
    with on_node(0, tmp_path) as placed:
        assert placed is False
    (node / "cpulist").write_text("0-1,3\n")
    assert node_cpus(0, tmp_path) == {0, 1, 3}


def test_chunk_views_name_a_bad_component_or_layer():
    device = allocate_engine_like(NSA, 4)
    with HostPool(NSA, 2) as host:
        for pool in (device, host):
            assert pool.chunk_view(1, NSA.num_layers - 1).shape[1] == NSA.components[1].bytes_per_layer
            for component, layer, message in ((2, 0, "component index 2"), (True, 0, "component index True"),
                                              (0, -1, "layer -1"), (0, 3, "layer 3"), (0, 1.0, "layer 1.0")):
                with pytest.raises(IndexValidationError, match=message):
                    pool.chunk_view(component, layer)


# --- what the pools are built from: typed errors, never AttributeError / TypeError / RuntimeError ---
@pytest.mark.parametrize("spec", [None, "nsa", 64])
def test_pools_need_a_spec(spec):
    # Was AttributeError ('NoneType' object has no attribute 'page_bytes').
    with pytest.raises(SpecError, match="KVSpec"):
        HostPool(spec, 2)
    with pytest.raises(SpecError, match="KVSpec"):
        DevicePool(spec, {})
    with pytest.raises(SpecError, match="KVSpec"):
        allocate_engine_like(spec, num_pages=2)


def test_one_tensor_where_per_layer_tensors_belong_is_refused():
    kv, idx = sglang_nsa_tensors(pages=3, layers=3)
    # A [pages, bytes] tensor iterates as rows: 3 pages passed as 3 "layers" before.
    with pytest.raises(SpecError, match="list of per-layer tensors"):
        DeviceBuffer.page_indexed(idx[0])
    with pytest.raises(SpecError, match="list of per-layer tensors"):
        DeviceBuffer.page_indexed([1, 2, 3])
    with pytest.raises(SpecError, match="list of per-layer tensors"):
        DeviceBuffer.token_indexed(5, page_size=64)
    with pytest.raises(SpecError, match="rows per page"):
        DeviceBuffer.token_indexed(kv, page_size=0)
    with pytest.raises(SpecError, match="DeviceBuffer"):
        DevicePool(nsa_spec(num_layers=3), {"latent": kv, "indexer": idx})


@pytest.mark.parametrize("num_pages", [0, -1, True, 2.0])
def test_allocate_engine_like_counts_pages_in_ints(num_pages):
    with pytest.raises(SpecError, match="num_pages"):
        allocate_engine_like(nsa_spec(num_layers=2), num_pages=num_pages)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a device this machine cannot reach")
@pytest.mark.parametrize("device", ["cuda", "tpu"])
def test_allocate_engine_like_on_a_device_torch_cannot_reach(device):
    # Was AssertionError ("Torch not compiled with CUDA enabled") / RuntimeError.
    with pytest.raises(SpecError, match=device):
        allocate_engine_like(nsa_spec(num_layers=2), num_pages=2, device=device)


@pytest.mark.parametrize("reserved", [3, None, 2.5])
def test_reserved_pages_that_are_no_collection_are_a_spec_error(reserved):
    # a bare int or None leaked TypeError: 'int' object is not iterable
    latent, indexer = sglang_nsa_tensors(4)
    buffers = {"latent": DeviceBuffer.token_indexed(latent, 64), "indexer": DeviceBuffer.page_indexed(indexer)}
    with pytest.raises(SpecError, match="reserved pages"):
        DevicePool(NSA, buffers, reserved_pages=reserved)


@pytest.mark.parametrize("layout", [["page_first"], None, 1])
def test_a_host_layout_that_is_no_name_is_a_pool_error(layout):
    # a list leaked TypeError: unhashable type: 'list'
    with pytest.raises(PoolError, match="unknown host layout"):
        HostPool(NSA, 4, layout)


def test_host_pool_free_slots_follow_a_completion_without_reap():
    from concurrent.futures import Future

    with HostPool(nsa_spec(1, 4), 4) as pool:
        slots = pool.allocate(4)
        done: Future = Future()
        pool.free(slots[:2], completion=done)
        assert (pool.free_slots, pool.pending_slots) == (0, 2)
        done.set_result(None)
        assert (pool.free_slots, pool.pending_slots, pool.is_pending(slots[0])) == (2, 0, False)
        assert pool.allocate(2) == slots[:2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="pinning works where CUDA is present")
def test_pinned_host_pool_without_cuda_is_a_pool_error():
    with pytest.raises(PoolError, match="pin=True needs CUDA"):
        HostPool(nsa_spec(1, 4), 2, pin=True)
    with HostPool(nsa_spec(1, 4), 2) as pool:  # the default pins only where CUDA is present
        assert not pool.memory.pinned
