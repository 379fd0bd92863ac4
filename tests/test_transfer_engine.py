"""The transfer engine: every path against the reference, handles, validation, per-layer events.

CPU tests run every path (kernels through Triton's interpreter); GPU tests (marked) check the
streams and per-layer waits on a real device.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # kernels through Triton's interpreter on CPU-only machines
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tiered_kv import HostPool, IndexValidationError, SpecMismatchError, nsa_spec  # noqa: E402
from tiered_kv.transfer import backup_pairs, load_pairs  # noqa: E402
from tiered_kv.transfer_engine import PATHS, TransferEngine, choose_path  # noqa: E402

from .kernels.pools import check_copy, make_device_pool, make_host_pool, random_ids, small_specs  # noqa: E402

SPECS = small_specs()
GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not GPU, reason="needs CUDA")


def _pools(spec_name="nsa", layout="page_first", pages=20, slots=16, device="cpu"):
    spec = SPECS[spec_name]
    return make_device_pool(spec, pages, device), make_host_pool(spec, slots, layout)


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("path", PATHS)
def test_backup_every_path(path, layout):
    device, host = _pools("nsa", layout)
    engine = TransferEngine(device.pool, host, path=path)
    pages, slots = random_ids(6, 1, 20), random_ids(6, 0, 16)
    handles = []
    check_copy(backup_pairs(device.pool, host), pages, slots, [host.buffer],
               lambda: handles.append(engine.backup(pages, slots)))
    assert handles[0].done() and handles[0].query()


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("path", PATHS)
def test_load_every_path_layer_by_layer(path, layout):
    device, host = _pools("mha", layout)
    engine = TransferEngine(device.pool, host, path=path)
    slots, pages = random_ids(5, 0, 16), random_ids(5, 1, 20)
    for layer in range(host.spec.num_layers):
        handles = []
        check_copy(load_pairs(host, device.pool, layer), slots, pages, device.roots,
                   lambda: handles.append(engine.load_layer(slots, pages, layer)))
        handle = handles[0]
        assert handle.done() and handle.layers == (layer,)
        handle.wait_layer(layer)  # complete on CPU: returns at once
        with pytest.raises(IndexValidationError, match="not part of this load"):
            handle.wait_layer((layer + 1) % host.spec.num_layers)


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("path", PATHS)
def test_load_all_layers_covers_every_component(path, layout):
    device, host = _pools("nsa", layout)
    engine = TransferEngine(device.pool, host, path=path, staging_bytes=3000)
    slots, pages = random_ids(7, 0, 16), random_ids(7, 1, 20)
    pairs = [pair for layer in range(host.spec.num_layers) for pair in load_pairs(host, device.pool, layer)]
    handles = []
    check_copy(pairs, slots, pages, device.roots, lambda: handles.append(engine.load(slots, pages)))
    assert handles[0].layers == tuple(range(host.spec.num_layers))


def test_empty_transfers_complete():
    device, host = _pools()
    engine = TransferEngine(device.pool, host, path="kernel")
    before = host.buffer.clone()
    assert engine.backup([], []).done()
    assert engine.load([], []).done()
    assert torch.equal(before, host.buffer)


@pytest.mark.parametrize(
    "pages, slots, match",
    [
        ([1, 2, 30], [0, 1, 2], "outside"),  # device page out of range
        ([1, 2, 3], [0, 1, 16], "outside"),  # host slot out of range
        ([1, 2, 3], [4, 5, 4], "repeats"),  # duplicate destination slot
        ([0, 2, 3], [0, 1, 2], "reserve"),  # the engine's reserved page
        ([1, 2], [0, 1, 2], "device pages but"),  # lengths differ
    ],
)
@pytest.mark.parametrize("path", ["kernel", "staged", "auto"])
def test_backup_rejects_bad_ids_and_writes_nothing(pages, slots, match, path):
    device, host = _pools()
    engine = TransferEngine(device.pool, host, path=path)
    before = host.buffer.clone()
    with pytest.raises(IndexValidationError, match=match):
        engine.backup(pages, slots)
    assert torch.equal(before, host.buffer)


def test_load_rejects_duplicate_destination_pages_and_bad_layers():
    device, host = _pools()
    engine = TransferEngine(device.pool, host, path="kernel")
    before = [r.clone() for r in device.roots]
    with pytest.raises(IndexValidationError, match="repeats"):
        engine.load([1, 2], [5, 5])
    with pytest.raises(IndexValidationError, match="layer"):
        engine.load([1], [5], layers=[host.spec.num_layers])
    with pytest.raises(IndexValidationError, match="repeat"):
        engine.load([1], [5], layers=[0, 0])
    assert all(torch.equal(a, b) for a, b in zip(before, device.roots))


def test_pools_of_different_specs_are_rejected():
    device, _ = _pools()
    other = HostPool(nsa_spec(num_layers=3, page_size=8), 4, "page_first")
    with pytest.raises(SpecMismatchError):
        TransferEngine(device.pool, other)


def test_unknown_path_is_rejected():
    device, host = _pools()
    with pytest.raises(ValueError, match="unknown transfer path"):
        TransferEngine(device.pool, host, path="fast")
    engine = TransferEngine(device.pool, host)
    with pytest.raises(ValueError, match="unknown transfer path"):
        engine.backup([1], [0], path="nope")


def test_auto_rule_follows_runs():
    scattered = torch.tensor([9, 2, 7, 4, 0, 12], dtype=torch.int64)
    run = torch.arange(100, 164)
    for to_host in (True, False):
        assert choose_path(scattered, torch.arange(1, 7), to_host=to_host) == "kernel"
        assert choose_path(run, torch.arange(1, 65), to_host=to_host) == "direct"
    assert choose_path(run, torch.randperm(64) + 1, to_host=True) == "staged"
    assert choose_path(run, torch.randperm(64) + 1, to_host=False) == "mixed"


# --- GPU ------------------------------------------------------------------------------------------

@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("path", ["kernel", "staged", "mixed", "direct", "torch", "auto"])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_gpu_wait_layer_orders_exactly_that_layer(path, layout):
    """Read each layer on a fresh stream right after wait_layer: it must hold the loaded bytes."""
    spec = nsa_spec(num_layers=12, page_size=64)
    device = make_device_pool(spec, 300, "cuda")
    host = make_host_pool(spec, 260, layout)
    engine = TransferEngine(device.pool, host, path=path)
    slots, pages = torch.arange(3, 259), random_ids(256, 1, 300)
    expected = [[host.chunk_view(ci, layer)[slots].clone() for ci in range(2)] for layer in range(spec.num_layers)]
    caller = torch.cuda.current_stream()
    assert engine.load_stream != caller and engine.backup_stream != caller
    handle = engine.load(slots, pages)
    readers = [torch.cuda.Stream() for _ in range(spec.num_layers)]
    got = []
    for layer, reader in enumerate(readers):
        handle.wait_layer(layer, reader)
        with torch.cuda.stream(reader):
            got.append([device.pool.chunk_view(ci, layer)[pages.cuda()].clone() for ci in range(2)])
    torch.cuda.synchronize()
    assert handle.done()
    for layer in range(spec.num_layers):
        for ci in range(2):
            assert torch.equal(got[layer][ci].cpu(), expected[layer][ci]), f"layer {layer} component {ci}"
    host.close()


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("path", ["kernel", "staged", "mixed", "direct", "auto"])
def test_gpu_backup_then_load_round_trip(path):
    spec = nsa_spec(num_layers=8, page_size=64)
    device = make_device_pool(spec, 1100, "cuda")
    host = make_host_pool(spec, 600, "page_first")
    engine = TransferEngine(device.pool, host, path=path)
    pages = random_ids(512, 1, 550)
    slots = torch.arange(40, 552)
    handles = []
    check_copy(backup_pairs(device.pool, host), pages, slots, [host.buffer],
               lambda: handles.append(engine.backup(pages, slots)))
    assert handles[0].done()
    # Back into other pages: they must then hold what the first pages held.
    targets = random_ids(512, 550, 1100)
    original = [[device.pool.chunk_view(ci, layer)[pages.cuda()].clone() for ci in range(2)] for layer in range(8)]
    engine.load(slots, targets).synchronize()
    for layer in range(8):
        for ci in range(2):
            assert torch.equal(device.pool.chunk_view(ci, layer)[targets.cuda()], original[layer][ci])
    host.close()


class _Running:
    """A stand-in for a CUDA event that has not completed yet."""

    def query(self) -> bool:
        return False


def test_mixed_loads_leave_the_link_to_copy_engines_while_a_backup_runs():
    device, host = _pools("nsa", "page_first")
    engine = TransferEngine(device.pool, host)
    idle = engine._ce_fraction(3)
    assert 0 < idle < 1  # page_first rows are pitched: copy engines and kernel share the load
    engine._last_backup = _Running()
    assert engine._ce_fraction(3) == 1.0
    engine.ce_fraction = 0.3
    assert engine._ce_fraction(3) == 0.3
