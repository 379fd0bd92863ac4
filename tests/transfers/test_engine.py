"""The transfer engine: every path against the reference, handles, validation, per-layer events.

CPU tests run every path (kernels through Triton's interpreter); GPU tests (marked) check the
streams and per-layer waits on a real device.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # kernels through Triton's interpreter on CPU-only machines
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from tiered_kv import ConfigError, HostPool, IndexValidationError, PoolError, SpecMismatchError, nsa_spec
from tiered_kv.transfers.torch_path import PageCopy, backup_pairs, load_pairs
from tiered_kv.transfers.engine import (
    COPY_PATHS,
    BackupHandle,
    LoadHandle,
    PATHS,
    CopyPath,
    LoadSplit,
    TransferEngine,
    TransferOptions,
    choose_path,
    _Issued,
)
from tiered_kv.transfers.policy import (
    AUTO_PATHS,
    KERNEL_LOADS,
    MIXED_LOADS_BESIDE_BACKUP,
    SINGLE_LAYER_WITHOUT_BATCH,
    MIXED_BACKUPS,
    MIXED_BACKUPS_BESIDE_LOAD,
    SCATTERED_LOADS,
    SCATTERED_LOADS_BESIDE_BACKUP,
    SCATTERED_LOADS_WITHOUT_BATCH,
    BackupSplit,
    choose_backup_split,
    choose_split,
    issue_threads,
)

from ..kernels.pools import check_copy, make_device_pool, make_host_pool, random_ids, small_specs, spans

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
                   lambda: handles.append(engine.load(slots, pages, layers=[layer])))
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


SPLITS = {
    "components": LoadSplit(by="components"),
    "components_scatter_ctas": LoadSplit(by="components", staging_ctas=3),
    "pages": LoadSplit(0.5),
    "all_ce": LoadSplit(1.0),
    "components_blocks": LoadSplit(by="components", layers_per_copy=2),
    "pages_blocks": LoadSplit(0.5, layers_per_copy=3),
    "components_batch": LoadSplit(by="components", ce_path="batch"),
    "pages_batch": LoadSplit(0.5, ce_path="batch"),
    "all_batch": LoadSplit(1.0, ce_path="batch"),
    "whole_slots": LoadSplit(1.0, layers_per_copy=1000),
    "ramp_blocks": LoadSplit(1.0, layers_per_copy=4, ramp=True),
    "pages_ramp_blocks": LoadSplit(0.5, layers_per_copy=2, ramp=True),
    "kernel_and_ce_blocks_differ": LoadSplit(0.5, layers_per_copy=2, kernel_blocks=3, ramp=True),
    "components_kernel_blocks": LoadSplit(by="components", kernel_blocks=2),
    "head_then_ramp_step_blocks": LoadSplit(0.5, layers_per_copy=3, kernel_blocks=2, ramp=True, ramp_step=1, head_layers=2),
    "head_then_components": LoadSplit(by="components", head_layers=1),
    "head_then_batch": LoadSplit(0.5, ce_path="batch", head_layers=3),
    "head_longer_than_the_load": LoadSplit(1.0, head_layers=99),
    "head_then_lead_blocks_in_waves": LoadSplit(1.0, layers_per_copy=2, head_layers=1, lead_blocks=2, plan_wave=1),
}


@pytest.mark.parametrize("spec_name", ["nsa", "mha", "odd"])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("split", sorted(SPLITS))
def test_mixed_load_splits(split, layout, spec_name):
    """Every way of splitting a mixed load (components, pages, blocks, heads) copies every byte once."""
    device, host = _pools(spec_name, layout)
    engine = TransferEngine(device.pool, host, path="mixed", options=TransferOptions(load_split=SPLITS[split]))
    slots, pages = random_ids(9, 0, 16), random_ids(9, 1, 20)
    pairs = [pair for layer in range(host.spec.num_layers) for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages))
    layer = host.spec.num_layers - 1
    check_copy(load_pairs(host, device.pool, layer), slots, pages, device.roots,
               lambda: engine.load(slots, pages, layers=[layer]))


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("fraction", [0.0, 0.4, 1.0])
def test_mixed_backup_splits_pages_between_copy_engines_and_kernel(fraction, layout):
    """A mixed backup with a copy-engine share writes every byte once, whatever the share."""
    device, host = _pools("nsa", layout)
    engine = TransferEngine(device.pool, host, path="mixed", options=TransferOptions(backup_ce_fraction=fraction))
    pages, slots = random_ids(9, 1, 20), torch.randperm(16)[:9]
    handles = []
    check_copy(backup_pairs(device.pool, host), pages, slots, [host.buffer],
               lambda: handles.append(engine.backup(pages, slots)))
    assert handles[0].path == "mixed" and handles[0].done()


@pytest.mark.parametrize("split", [None, LoadSplit(kernel_blocks=4), LoadSplit(kernel_blocks=3, ramp=True),
                                   LoadSplit(kernel_blocks=2, ramp=True, ramp_step=2)])
def test_kernel_loads_in_blocks_of_layers_copy_every_layer(split):
    """The kernel path launches blocks of layers (default ``KERNEL_LOADS``); every layer of a
    load of 9 layers, or of some layers in another order, lands whatever the blocks."""
    spec = nsa_spec(num_layers=9, page_size=4)
    device, host = make_device_pool(spec, 20, "cpu"), make_host_pool(spec, 16, "page_first")
    engine = TransferEngine(device.pool, host, path="kernel", options=TransferOptions(load_split=split))
    slots, pages = random_ids(7, 0, 16), random_ids(7, 1, 20)
    pairs = [pair for layer in range(9) for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages))
    layers = [5, 0, 8, 3]
    pairs = [pair for layer in layers for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages, layers=layers))


def test_backup_splits_follow_the_policy():
    """Scattered layer_first backups split (kernel + a copy-engine share); the rest staged; no
    batched copies: the kernel alone."""
    assert choose_backup_split(dense_host_rows=True, scattered=True) == MIXED_BACKUPS[(True, True)]
    assert 0 < MIXED_BACKUPS[(True, True)].ce_fraction < 0.5
    assert choose_backup_split(dense_host_rows=True, scattered=True, has_batch=False).ce_fraction == 0.0
    for key in ((False, False), (False, True), (True, False)):
        assert choose_backup_split(dense_host_rows=key[0], scattered=key[1]) is None
    assert BackupSplit(0.2).kernel_ctas is None


def test_backup_splits_beside_a_load_in_flight():
    """While a load of the engine is in flight, scattered layer_first backups go through the UVA
    kernel alone at its default CTAs (its 32-CTA split lost the link to the load's kernel); every
    other backup keeps its split."""
    beside = choose_backup_split(dense_host_rows=True, scattered=True, load_in_flight=True)
    assert beside == MIXED_BACKUPS_BESIDE_LOAD[(True, True)] != MIXED_BACKUPS[(True, True)]
    assert beside.ce_fraction == 0.0 and beside.kernel_ctas is None
    assert choose_backup_split(dense_host_rows=True, scattered=True, load_in_flight=False) == MIXED_BACKUPS[(True, True)]
    for key in ((False, False), (False, True), (True, False)):
        assert choose_backup_split(dense_host_rows=key[0], scattered=key[1], load_in_flight=True) is None


class _Landed:
    """A stand-in for a CUDA event that has completed."""

    def query(self) -> bool:
        return True


def test_load_handle_in_flight_asks_the_issue_and_every_layer():
    """A load is in flight while a library thread still issues it or any layer's event is
    pending (the head's layers land on a stream of their own); a failed issue is not in flight
    and asking never raises."""
    cpu = torch.device("cpu")
    assert not LoadHandle(cpu, [0, 1], None, None, "torch").in_flight()  # CPU loads are complete
    landed = {0: _Landed(), 1: _Landed(), 2: _Landed()}
    assert not LoadHandle(cpu, [0, 1, 2], landed, None, "mixed").in_flight()
    assert LoadHandle(cpu, [0, 1, 2], {**landed, 2: _Running()}, None, "mixed").in_flight()
    assert LoadHandle(cpu, [0, 1, 2], {**landed, 0: _Running()}, None, "mixed").in_flight()
    issued = _Issued()
    issued.add_jobs(1)
    assert LoadHandle(cpu, [0, 1, 2], landed, None, "mixed", issued).in_flight()
    issued.job_done(RuntimeError("issue failed"))
    assert not LoadHandle(cpu, [0, 1, 2], landed, None, "mixed", issued).in_flight()


def test_mixed_backup_beside_a_load_in_flight_takes_the_kernel_alone(monkeypatch):
    """The engine asks its last load: a scattered layer_first backup beside one sends no page
    through the copy engines, and both kinds of backup copy every byte."""
    device, host = _pools("nsa", "layer_first", pages=40, slots=64)
    engine = TransferEngine(device.pool, host, path="mixed")
    fractions = []
    split = engine._split
    monkeypatch.setattr(engine, "_split", lambda copy, path, fraction: fractions.append(fraction) or split(copy, path, fraction))
    pages, slots = random_ids(12, 1, 40), torch.arange(0, 48, 4)  # runs of one slot: scattered
    assert not engine._load_running()
    check_copy(backup_pairs(device.pool, host), pages, slots, [host.buffer], lambda: engine.backup(pages, slots))
    engine._last_load = LoadHandle(torch.device("cpu"), [0, 1], {0: _Landed(), 1: _Running()}, None, "mixed")
    assert engine._load_running()
    check_copy(backup_pairs(device.pool, host), pages, slots, [host.buffer], lambda: engine.backup(pages, slots))
    assert fractions == [MIXED_BACKUPS[(True, True)].ce_fraction, 0.0]
    host.close()


def test_load_blocks_ramp_up_to_their_size():
    """Ramped blocks: 1, 2, 4, ... layers up to ``layers_per_copy``, every layer once, in order."""
    from tiered_kv.transfers.engine import _blocks

    for layers, per in ((61, 8), (5, 4), (1, 8), (7, 1)):
        blocks = _blocks(layers, LoadSplit(layers_per_copy=per, ramp=True))
        assert [i for block in blocks for i in block] == list(range(layers))
        sizes = [len(block) for block in blocks]
        assert sizes[0] == 1 and max(sizes) <= per
        assert all(b == min(per, 2 * a) for a, b in zip(sizes, sizes[1:-1]))
    assert [len(b) for b in _blocks(61, LoadSplit(layers_per_copy=8))] == [8] * 7 + [5]


def test_ramp_step_grows_blocks_with_the_layer_index_across_a_head():
    """With ``ramp_step`` a block starting at layer index j has 1 + j // ramp_step layers (up to
    the block size), counted over the whole load: a body after a head continues the ramp."""
    from tiered_kv.transfers.engine import _blocks

    split = LoadSplit(layers_per_copy=8, ramp=True, ramp_step=5)
    whole = _blocks(61, split)
    assert [i for block in whole for i in block] == list(range(61))
    assert [len(b) for b in whole][:8] == [1, 1, 1, 1, 1, 2, 2, 2]
    assert max(len(b) for b in whole) == 8
    for block in whole:
        assert len(block) == min(8, 1 + block[0] // 5) or block[-1] == 60
    body = _blocks(61 - 6, split, offset=6)
    assert [len(b) for b in body][:3] == [2, 2, 3]  # layers 6-7, 8-9, 10-12 of the load
    assert [i for block in body for i in block] == list(range(55))


@pytest.mark.parametrize("head, expect", [(4, ([0, 1, 2, 3], [4, 5, 6, 7, 8])), (99, (list(range(8)), [8]))])
def test_head_layers_go_through_the_kernel_before_the_rest(monkeypatch, head, expect):
    """A load with ``head_layers`` copies its first layers by the UVA kernel, the rest by its
    path, the rest's ramp counted from the head; every byte lands once. A head as long as the
    load leaves its path the last layer; a load of one layer has no head."""
    from tiered_kv.transfers import engine as te

    spec = nsa_spec(num_layers=9, page_size=4)
    device, host = make_device_pool(spec, 20, "cpu"), make_host_pool(spec, 16, "page_first")
    engine = TransferEngine(device.pool, host, path="staged",
                            options=TransferOptions(load_split=LoadSplit(1.0, head_layers=head, ramp=True, ramp_step=2)))
    calls = []
    for name in ("kernel", "staged"):
        real = te.COPY_PATHS[name].load

        def spy(job, name=name, real=real):
            calls.append((name, list(job.layers), job.first_index))
            real(job)
        monkeypatch.setattr(te.COPY_PATHS[name], "load", spy)
    slots, pages = random_ids(7, 0, 16), random_ids(7, 1, 20)
    pairs = [pair for layer in range(9) for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages))
    head_layers, body_layers = expect
    assert calls == [("kernel", head_layers, 0), ("staged", body_layers, len(head_layers))]
    calls.clear()
    engine.load(slots, pages, layers=[3])
    assert calls == [("staged", [3], 0)]


@pytest.mark.parametrize("num_ctas", [None, 3])
def test_the_options_cta_budget_reaches_every_kernel_launch_of_a_load(monkeypatch, num_ctas):
    """``TransferOptions.num_ctas`` is the budget of a load's UVA launches, its head's and its
    kernel part's alike (None: each launch's measured default)."""
    from tiered_kv.kernels import uva_copy

    budgets = []
    launch = uva_copy.launch_uva
    monkeypatch.setattr(uva_copy, "launch_uva", lambda *a, **k: budgets.append(k["num_ctas"]) or launch(*a, **k))
    device, host = _pools("nsa", "page_first")
    split = LoadSplit(by="components", head_layers=1)
    engine = TransferEngine(device.pool, host, path="mixed", options=TransferOptions(load_split=split, num_ctas=num_ctas))
    slots, pages = random_ids(9, 0, 16), random_ids(9, 1, 20)
    pairs = [pair for layer in range(host.spec.num_layers) for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages))
    assert len(budgets) == host.spec.num_layers and set(budgets) == {num_ctas}


def test_component_split_sends_the_largest_component_to_the_copy_engines():
    device, host = _pools("nsa", "page_first")
    engine = TransferEngine(device.pool, host)
    assert engine._components(LoadSplit(by="components")) == ((1,), (0,))  # indexer -> kernel, latent -> CE
    assert engine._components(LoadSplit(0.5)) == (None, (0, 1))
    device, host = _pools("mha", "page_first")
    engine = TransferEngine(device.pool, host)  # k and v of one size: nothing to split by
    assert engine._components(LoadSplit(by="components")) == (None, (0, 1))
    # ... so the pages are split by ce_fraction, each page going one way only.
    copy = PageCopy(torch.arange(1, 11), torch.arange(10))
    (k_slots, _), (s_slots, _) = engine._parts(copy, "mixed", LoadSplit(0.6, by="components"))
    assert len(k_slots) == 4 and len(s_slots) == 6 and not set(k_slots.tolist()) & set(s_slots.tolist())


@pytest.mark.parametrize("bad", [{"by": "layers"}, {"ce_fraction": 1.5}, {"staging_ctas": 0}, {"layers_per_copy": 0},
                                 {"kernel_blocks": 0}, {"ce_path": "dma"}, {"head_layers": -1}, {"ramp_step": 0},
                                 {"ramp_step": 2}, {"lead_blocks": 0}, {"plan_wave": 0}, {"minor_lead_groups": 1}])
def test_load_split_rejects_nonsense(bad):
    with pytest.raises(ConfigError, match="LoadSplit"):
        LoadSplit(**bad)


def test_component_blocks_make_one_wide_row_per_page_first_slot():
    """Latent chunks of adjacent layers sit side by side in a page_first slot: one span, one copy."""
    device, host = _pools("nsa", "page_first")
    latent = [load_pairs(host, device.pool, layer)[0][0] for layer in (0, 1)]
    assert spans(latent) == [(latent[0].data_ptr(), 2 * latent[0].shape[1])]
    # Both components of a block of layers: one latent and one indexer piece per slot.
    assert host.spec.num_layers > 2
    block = [pair[0] for layer in (0, 1) for pair in load_pairs(host, device.pool, layer)]
    assert [width for _, width in spans(block)] == [2 * block[0].shape[1], 2 * block[1].shape[1]]
    device, host = _pools("nsa", "layer_first")  # dense rows already; no span across layers
    assert spans([load_pairs(host, device.pool, layer)[0][0] for layer in (0, 1)]) is None


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


def test_layer_indices_are_ints_only():
    """``True`` is not layer 1 and ``1.5`` is not layer 1: load, load_layer, wait_layer and
    layer_done refuse them, naming the value; numpy ints and 0-d int tensors are layers."""
    import numpy as np

    device, host = _pools()
    engine = TransferEngine(device.pool, host)
    before = [r.clone() for r in device.roots]
    for bad in (True, 1.5, "1", None):
        with pytest.raises(IndexValidationError, match="layer"):
            engine.load([1], [5], layers=[bad])
    with pytest.raises(IndexValidationError, match="layers"):
        engine.load([1], [5], layers="01")
    with pytest.raises(IndexValidationError, match="layers"):
        engine.load([1], [5], layers=1)
    assert all(torch.equal(a, b) for a, b in zip(before, device.roots))
    handle = engine.load([1], [5], layers=[np.int64(0), torch.tensor(1)])
    assert handle.layers == (0, 1)
    handle.wait_layer(np.int32(1))
    assert handle.layer_done(torch.tensor(0))
    for bad in (True, 0.0, np.bool_(True)):
        with pytest.raises(IndexValidationError, match="layer"):
            handle.wait_layer(bad)
        with pytest.raises(IndexValidationError, match="layer"):
            handle.layer_done(bad)


def test_pools_of_different_specs_are_rejected():
    device, _ = _pools()
    other = HostPool(nsa_spec(num_layers=3, page_size=8), 4, "page_first")
    with pytest.raises(SpecMismatchError):
        TransferEngine(device.pool, other)


def test_unknown_path_is_rejected():
    device, host = _pools()
    with pytest.raises(ConfigError, match="unknown transfer path"):
        TransferEngine(device.pool, host, path="fast")
    engine = TransferEngine(device.pool, host)
    with pytest.raises(ConfigError, match="unknown transfer path"):
        engine.backup([1], [0], path="nope")


def test_auto_rule_follows_runs():
    """Host slots and device pages in one run skip the staging hop; host runs with scattered pages
    go through the copy engines (staged backups, mixed loads), in both layouts."""
    run = torch.arange(100, 164)
    for dense in (False, True):
        def auto(pages, *, to_host, single=False):
            return choose_path(run, pages, to_host=to_host, dense_host_rows=dense, single_layer=single, has_batch=True)

        for to_host in (True, False):
            assert auto(torch.arange(1, 65), to_host=to_host) == "direct"
        assert auto(torch.randperm(64) + 1, to_host=True) == "staged"
        assert auto(torch.randperm(64) + 1, to_host=False) == "mixed"
        assert auto(torch.randperm(64) + 1, to_host=False, single=True) == "mixed"


def test_auto_rule_for_scattered_slots_follows_the_host_layout():
    """Scattered slots: page_first through the staging ring (whole-slot or layer-block rows),
    layer_first backups and loads mixed (kernel + batched copies, the kernel alone without
    batched copies); runs through the copy engines."""
    scattered, pages = torch.randperm(64)[:32] * 2, torch.randperm(32) + 1
    run = torch.arange(100, 132)

    def auto(slots, *, to_host, dense, single=False, batch=True):
        return choose_path(slots, pages, to_host=to_host, dense_host_rows=dense, single_layer=single, has_batch=batch)

    assert auto(scattered, to_host=True, dense=False) == "staged"
    assert auto(scattered, to_host=True, dense=True) == "mixed"
    assert auto(scattered, to_host=True, dense=True, batch=False) == "kernel"  # no batched copies here
    assert auto(scattered, to_host=False, dense=False) == "mixed"
    assert auto(scattered, to_host=False, dense=True) == "mixed"
    assert auto(scattered, to_host=False, dense=True, batch=False) == "kernel"
    assert auto(scattered, to_host=False, dense=False, batch=False) == "mixed"  # copy engines need no batch
    for dense in (False, True):
        assert auto(scattered, to_host=False, dense=dense, single=True) == "mixed"
        assert auto(scattered, to_host=False, dense=dense, single=True, batch=False) == "kernel"
        assert auto(run, to_host=True, dense=dense) == "staged"
        assert auto(run, to_host=False, dense=dense) == "mixed"
    assert set(AUTO_PATHS.values()) <= set(COPY_PATHS)


def test_scattered_splits_follow_the_policy():
    def split(**conditions):
        base = {"dense_host_rows": False, "num_layers": 61, "backup_in_flight": False, "scattered": True, "has_batch": True}
        return choose_split(**{**base, **conditions})

    # page_first: copy engines alone in ramped layer blocks after a kernel head, a wide staging
    # scatter and lead blocks; beside a backup the copy engines after a head in blocks of 8.
    assert split() == SCATTERED_LOADS[False] and split().ce_fraction == 1.0 and split().layers_per_copy > 1
    assert split().staging_ctas == 32 and split().lead_blocks == 3 and split().head_layers > 0
    assert split().ramp and split().kernel_blocks > 1
    assert split(backup_in_flight=True) == SCATTERED_LOADS_BESIDE_BACKUP[False] == MIXED_LOADS_BESIDE_BACKUP[False]
    # layer_first: the kernel and a batch share, also beside a backup; the kernel alone without batches.
    assert split(dense_host_rows=True) == SCATTERED_LOADS[True] and split(dense_host_rows=True).ce_path == "batch"
    assert split(dense_host_rows=True, backup_in_flight=True) == SCATTERED_LOADS[True]
    assert split(dense_host_rows=True, has_batch=False) == SCATTERED_LOADS_WITHOUT_BATCH
    assert SCATTERED_LOADS_WITHOUT_BATCH.ce_fraction == 0.0
    assert split(num_layers=1) == LoadSplit(by="components", ce_path="batch")  # one layer: as with runs
    assert split(scattered=False, backup_in_flight=True) == MIXED_LOADS_BESIDE_BACKUP[False]
    assert split(options=TransferOptions(ce_fraction=0.3)).ce_fraction == 0.3
    mine = LoadSplit(0.5, layers_per_copy=2)
    assert split(options=TransferOptions(load_split=mine)) == mine
    # Batch loads of several layers get library issue threads unless the options say otherwise.
    assert issue_threads("batch", 61, TransferOptions()) > 0
    assert issue_threads("batch", 1, TransferOptions()) == 0
    assert issue_threads("mixed", 61, TransferOptions()) == 1 and issue_threads("mixed", 1, TransferOptions()) == 0
    assert issue_threads("kernel", 61, TransferOptions()) == 0
    assert issue_threads("batch", 61, TransferOptions(issue_threads=0)) == 0
    assert issue_threads("kernel", 61, TransferOptions(issue_threads=2)) == 2


@pytest.mark.parametrize("bad", [{"ce_fraction": -0.1}, {"backup_ce_fraction": 1.5}, {"num_ctas": 0}, {"issue_threads": -1},
                                 {"issue_threads": 99}, {"batch_flags": -1}, {"beside_compute": 1}])
def test_options_reject_nonsense(bad):
    with pytest.raises(ConfigError, match="TransferOptions"):
        TransferOptions(**bad)


def test_options_are_frozen_and_per_call():
    import dataclasses

    options = TransferOptions(batch_flags=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.batch_flags = 0
    device, host = _pools("nsa", "page_first")
    engine = TransferEngine(device.pool, host, path="mixed", num_ctas=3)
    assert engine.options.num_ctas == 3
    slots, pages = random_ids(6, 0, 16), random_ids(6, 1, 20)
    pairs = [pair for layer in range(host.spec.num_layers) for pair in load_pairs(host, device.pool, layer)]
    one_call = TransferOptions(load_split=LoadSplit(0.5, ce_path="batch"))
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages, options=one_call))


def test_every_path_is_a_class_with_the_same_interface():
    assert set(COPY_PATHS) == set(PATHS) - {"auto"}
    for name, path in COPY_PATHS.items():
        assert isinstance(path, CopyPath) and path.name == name
        assert callable(path.backup) and callable(path.load)


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_scattered_auto_splits_copy_every_byte(layout):
    """The scattered splits (copy engines only, layer blocks) through the engine on CPU pools."""
    device, host = _pools("nsa", layout)
    engine = TransferEngine(device.pool, host, path="mixed",
                            options=TransferOptions(load_split=SCATTERED_LOADS[layout == "layer_first"]))
    slots, pages = torch.randperm(16)[:9], random_ids(9, 1, 20)
    pairs = [pair for layer in range(host.spec.num_layers) for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages))


# --- GPU ------------------------------------------------------------------------------------------

def read_each_layer_after_wait(handle, device_pool, pages, num_layers):
    """Copy each layer's pages on a fresh stream right after ``wait_layer``; synchronizes at the end."""
    got = []
    for layer in range(num_layers):
        reader = torch.cuda.Stream()
        handle.wait_layer(layer, reader)
        with torch.cuda.stream(reader):
            got.append([device_pool.chunk_view(ci, layer)[pages.cuda()].clone() for ci in range(2)])
    torch.cuda.synchronize()
    return got


def assert_layers_equal(got, expected):
    for layer, (got_layer, expected_layer) in enumerate(zip(got, expected, strict=True)):
        for ci, (a, b) in enumerate(zip(got_layer, expected_layer, strict=True)):
            assert torch.equal(a.cpu(), b), f"layer {layer} component {ci}"


def load_and_check_each_layer(engine, host, device_pool, slots, pages, num_layers):
    """Load ``slots`` into ``pages``, read each layer right after its ``wait_layer`` and check it
    against the host's bytes of before the load; returns the handle."""
    expected = [[host.chunk_view(ci, layer)[slots].clone() for ci in range(2)] for layer in range(num_layers)]
    handle = engine.load(slots, pages)
    assert_layers_equal(read_each_layer_after_wait(handle, device_pool, pages, num_layers), expected)
    return handle


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("path", ["kernel", "staged", "mixed", "direct", "batch", "torch", "auto"])
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
    got = read_each_layer_after_wait(handle, device.pool, pages, spec.num_layers)
    assert handle.done()
    assert_layers_equal(got, expected)
    host.close()


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("split", sorted(SPLITS))
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_gpu_split_loads_wait_layer(split, layout):
    """Each mixed-load split at a realistic size: every layer holds its bytes right after wait_layer."""
    spec = nsa_spec(num_layers=6, page_size=64)
    device = make_device_pool(spec, 300, "cuda")
    host = make_host_pool(spec, 260, layout)
    engine = TransferEngine(device.pool, host, path="mixed", options=TransferOptions(load_split=SPLITS[split]))
    slots, pages = torch.arange(3, 259), random_ids(256, 1, 300)
    load_and_check_each_layer(engine, host, device.pool, slots, pages, spec.num_layers)
    host.close()


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("path", ["kernel", "staged", "mixed", "direct", "batch", "auto"])
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


@gpu
@pytest.mark.gpu
def test_gpu_backup_beside_a_load_in_flight(monkeypatch):
    """A scattered layer_first backup issued while a load of the same engine is in flight takes
    the kernel alone; both land every byte, and the engine sees the load finished afterwards."""
    spec = nsa_spec(num_layers=12, page_size=64)
    device = make_device_pool(spec, 600, "cuda")
    host = make_host_pool(spec, 1200, "layer_first")
    engine = TransferEngine(device.pool, host)
    calls = []  # (copy, fraction): the load's library thread splits its own copy meanwhile
    split = engine._split
    monkeypatch.setattr(engine, "_split", lambda copy, path, fraction: calls.append((copy, fraction)) or split(copy, path, fraction))
    slots, pages = torch.randperm(1200)[:512], torch.randperm(599)[:512] + 1
    load_slots, backup_slots, load_pages, backup_pages = slots[:256], slots[256:], pages[:256], pages[256:]
    to_load = [[host.chunk_view(ci, layer)[load_slots].clone() for ci in range(2)] for layer in range(12)]
    to_back_up = [[device.pool.chunk_view(ci, layer)[backup_pages.cuda()].cpu() for ci in range(2)] for layer in range(12)]
    torch.cuda._sleep(50_000_000)  # the load waits behind the caller's stream: surely in flight
    load = engine.load(load_slots, load_pages)
    assert engine._load_running()
    backup = engine.backup(backup_pages, backup_slots)
    assert backup.path == "mixed" and [fraction for copy, fraction in calls if copy is backup.copy] == [0.0]
    load.synchronize()
    backup.synchronize()
    assert not engine._load_running()
    for layer in range(12):
        for ci in range(2):
            assert torch.equal(device.pool.chunk_view(ci, layer)[load_pages.cuda()].cpu(), to_load[layer][ci])
            assert torch.equal(host.chunk_view(ci, layer)[backup_slots], to_back_up[layer][ci])
    host.close()


class _Running:
    """A stand-in for a CUDA event that has not completed yet."""

    def query(self) -> bool:
        return False


def test_mixed_loads_leave_the_link_to_copy_engines_while_a_backup_runs():
    device, host = _pools("nsa", "page_first")
    engine = TransferEngine(device.pool, host)
    # page_first rows are pitched: copy engines take the latent rows, the kernel the indexer rows;
    # one layer alone: the latent straight into the pages in one batch, the indexer by the kernel.
    assert engine._load_split(3).by == "components" and 0 < engine._load_split(3).ce_fraction < 1
    assert engine._load_split(3).ce_path == "staged"
    assert engine._load_split(1) == LoadSplit(by="components", ce_path="batch")
    engine._has_batch = False  # a CUDA runtime before 12.8: a staged page share
    assert engine._load_split(1) == SINGLE_LAYER_WITHOUT_BATCH[False] and 0 < engine._load_split(1).ce_fraction < 1
    engine._last_backup = BackupHandle(_Running(), None, "mixed")  # a backup still copying
    # Beside a backup: copy engines only, page_first rows in blocks of layers.
    assert engine._load_split(3) == MIXED_LOADS_BESIDE_BACKUP[False]
    assert engine._load_split(3).ce_fraction == 1.0 and engine._load_split(3).layers_per_copy > 1
    share = TransferOptions(ce_fraction=0.3)
    assert engine._load_split(3, share).ce_fraction == 0.3 and engine._load_split(3, share).by == "pages"
    split = TransferOptions(load_split=LoadSplit(by="components", layers_per_copy=2))
    assert engine._load_split(3, split) == LoadSplit(by="components", layers_per_copy=2)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("path", ["batch", "mixed", "kernel"])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_gpu_loads_issued_by_library_threads_wait_layer(layout, path, threads):
    """Loads issued by library threads: ordered after the caller's stream (the caller overwrites
    the host slots right before), and each layer holds its bytes right after wait_layer."""
    spec = nsa_spec(num_layers=12, page_size=64)
    device = make_device_pool(spec, 300, "cuda")
    host = make_host_pool(spec, 600, layout)
    engine = TransferEngine(device.pool, host, path=path, options=TransferOptions(issue_threads=threads))
    slots, pages = torch.randperm(600)[:256], random_ids(256, 1, 300)
    expected = [[host.chunk_view(ci, layer)[slots].clone() for ci in range(2)] for layer in range(spec.num_layers)]
    # Work on the caller's stream that the load must follow: pages poisoned after a long sleep.
    torch.cuda._sleep(20_000_000)
    for layer in range(spec.num_layers):
        for ci in range(2):
            device.pool.chunk_view(ci, layer)[pages.cuda()] = 0xA5
    handle = engine.load(slots, pages)
    got = read_each_layer_after_wait(handle, device.pool, pages, spec.num_layers)
    assert handle.done()
    assert_layers_equal(got, expected)
    engine.close()
    host.close()


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("op", ["backup", "load"])
def test_gpu_auto_with_scattered_slots(layout, op):
    spec = nsa_spec(num_layers=10, page_size=64)
    device = make_device_pool(spec, 600, "cuda")
    host = make_host_pool(spec, 700, layout)
    engine = TransferEngine(device.pool, host)
    pages, slots = random_ids(512, 1, 600), torch.randperm(700)[:512]
    if op == "backup":
        handles = []
        check_copy(backup_pairs(device.pool, host), pages, slots, [host.buffer],
                   lambda: handles.append(engine.backup(pages, slots)))
        assert handles[0].path == ("mixed" if layout == "layer_first" else "staged")
    else:
        handle = load_and_check_each_layer(engine, host, device.pool, slots, pages, spec.num_layers)
        assert handle.path == "mixed"
    engine.close()
    host.close()


def test_handle_event_refuses_layers_not_loaded():
    """``LoadHandle.event`` checks its layer as ``wait_layer`` and ``layer_done`` do (on a GPU it
    raised KeyError for a layer not loaded; on CPU it answered None for anything); the message of
    a layer outside a load names the load's layers (a load of no layers, or of layers 0 and 2)."""
    device, host = _pools()
    engine = TransferEngine(device.pool, host)
    handle = engine.load([1], [2], layers=[0, 2])
    for bad in (1, 3, -1):
        with pytest.raises(IndexValidationError, match=f"layer {bad} is not part of this load"):
            handle.event(bad)
    with pytest.raises(IndexValidationError, match="not a layer index"):
        handle.event("0")
    assert handle.event(2) is None  # CPU: complete, no event
    with pytest.raises(IndexValidationError, match=r"layer 1 is not part of this load \(layers \(0, 2\)\)"):
        handle.wait_layer(1)
    empty = engine.load([1], [2], layers=[])
    for query in (empty.wait_layer, empty.layer_done, empty.event):
        with pytest.raises(IndexValidationError, match=r"layer 0 is not part of this load \(layers \(\)\)"):
            query(0)


@pytest.mark.parametrize("options", [{"num_ctas": 2}, LoadSplit(), "auto"])
def test_options_that_are_not_transfer_options_are_refused(options):
    """``options=`` of the engine, a backup or a load must be a ``TransferOptions`` (a dict or a
    ``LoadSplit`` raised AttributeError), and nothing is written."""
    device, host = _pools()
    before = [root.clone() for root in device.roots], host.buffer.clone()
    with pytest.raises(ConfigError, match="options"):
        TransferEngine(device.pool, host, options=options)
    engine = TransferEngine(device.pool, host)
    with pytest.raises(ConfigError, match="options"):
        engine.backup([1, 2], [3, 4], options=options)
    with pytest.raises(ConfigError, match="options"):
        engine.load([1, 2], [3, 4], options=options)
    assert all(torch.equal(a, b) for a, b in zip(before[0], device.roots)) and torch.equal(before[1], host.buffer)


@pytest.mark.parametrize(("field", "value"), [
    ("ce_fraction", "0.5"), ("ce_fraction", None), ("ce_fraction", True),
    ("staging_ctas", 0), ("staging_ctas", "x"), ("staging_ctas", 1.5), ("staging_ctas", True),
    ("layers_per_copy", 1.5), ("kernel_blocks", 2.0), ("ramp", "yes"), ("ramp", None),
    ("ramp_step", 1.5), ("head_layers", 1.5), ("head_layers", "1"),
    ("lead_blocks", 0), ("lead_blocks", 1.5), ("lead_blocks", "2"),
    ("head_ramp_step", "8"), ("head_ramp_step", 1.5),
    ("plan_wave", 0), ("plan_wave", 1.5), ("plan_wave", "2"), ("plan_wave", True),
    ("minor_layers_per_copy", 0), ("minor_layers_per_copy", "8"), ("minor_lead_groups", 1.5),
])
def test_load_split_fields_of_wrong_types_are_config_errors(field, value):
    """A ``LoadSplit`` field of the wrong type is a ConfigError naming the field, not a bare
    TypeError, nor taken and failing deep inside a load (a float count, a bool fraction)."""
    with pytest.raises(ConfigError, match=f"LoadSplit.{field}"):
        LoadSplit(**{field: value})


@pytest.mark.parametrize(("field", "value"), [
    ("load_split", "x"), ("load_split", {}), ("ce_fraction", "0.5"), ("ce_fraction", True),
    ("backup_ce_fraction", "1"), ("batch_flags", "0"), ("batch_flags", -1), ("batch_flags", 1.5),
    ("batch_flags", None), ("batch_flags", True), ("num_ctas", 1.5), ("num_ctas", "2"), ("num_ctas", True),
    ("issue_threads", 2.0), ("issue_threads", "2"), ("beside_compute", 1), ("beside_compute", "yes"),
])
def test_transfer_options_fields_of_wrong_types_are_config_errors(field, value):
    """The same for ``TransferOptions`` (and the engine's ``num_ctas``, which goes through it)."""
    with pytest.raises(ConfigError, match=f"TransferOptions.{field}"):
        TransferOptions(**{field: value})
    if field == "num_ctas":
        device, host = _pools()
        with pytest.raises(ConfigError, match="TransferOptions.num_ctas"):
            TransferEngine(device.pool, host, num_ctas=value)


def test_load_split_and_options_keep_valid_values():
    """Ints stay ints (numpy ints and 0-d tensors become Python ints), fractions floats."""
    import numpy as np

    split = LoadSplit(ce_fraction=1, layers_per_copy=np.int64(2), head_layers=torch.tensor(1), ramp=True, ramp_step=2,
                      staging_ctas=4)
    assert (split.ce_fraction, split.layers_per_copy, split.head_layers) == (1.0, 2, 1)
    assert type(split.layers_per_copy) is int and type(split.head_layers) is int
    options = TransferOptions(load_split=split, ce_fraction=0, num_ctas=np.int32(3), batch_flags=0,
                              issue_threads=np.int64(2))
    assert options.num_ctas == 3 and type(options.num_ctas) is int and options.ce_fraction == 0.0
    assert options.issue_threads == 2 and type(options.issue_threads) is int


def test_uint64_ids_beyond_int64_are_named_as_such():
    """numpy uint64 ids above int64 wrapped to negative numbers, named with the wrong value."""
    import numpy as np

    device, host = _pools()
    engine = TransferEngine(device.pool, host)
    with pytest.raises(IndexValidationError, match=f"device pages: index 1 is {2**63 + 5}, outside int64"):
        engine.backup(np.array([1, 2**63 + 5], dtype=np.uint64), [3, 4])


@pytest.mark.parametrize("which", ["device", "host"])
def test_an_engine_over_what_is_no_pool_is_a_pool_error(which):
    from tiered_kv import PoolError

    device, host = _pools("nsa", "page_first")
    args = ("not a pool", host) if which == "device" else (device.pool, None)
    with pytest.raises(PoolError, match="DevicePool and a HostPool"):
        TransferEngine(*args)


def _closed_host_engine(monkeypatch):
    """A CPU engine that takes itself for a GPU one, over a host pool that is not pinned (a
    closed pool on a GPU): the check runs before anything is enqueued."""
    device, host = _pools()
    engine = TransferEngine(device.pool, host)
    monkeypatch.setattr(engine, "on_gpu", True)
    assert not host.memory.pinned
    return device, host, engine


@pytest.mark.parametrize("op", ["load", "backup"])
def test_a_gpu_engine_refuses_a_host_pool_that_was_closed(monkeypatch, op):
    """Copies through an unpinned (closed) host pool would fault on the device and end the CUDA
    context; the engine refuses them with a PoolError naming the pool, and nothing moves."""
    device, host, engine = _closed_host_engine(monkeypatch)
    before = ([r.clone() for r in device.roots], host.buffer.clone())
    with pytest.raises(PoolError, match="closed and is no longer pinned"):
        getattr(engine, op)([1, 2], [3, 4])
    assert all(torch.equal(a, b) for a, b in zip(before[0], device.roots)) and torch.equal(before[1], host.buffer)


@gpu
@pytest.mark.gpu
def test_gpu_engine_after_its_host_pool_closed_raises_pool_error():
    spec = nsa_spec(num_layers=4, page_size=16)
    device = make_device_pool(spec, 20, "cuda")
    host = make_host_pool(spec, 16, "page_first")
    engine = TransferEngine(device.pool, host)
    engine.load(torch.arange(4), torch.arange(1, 5)).synchronize()
    host.close()
    for op in (engine.load, engine.backup):
        with pytest.raises(PoolError, match="closed"):
            op(torch.arange(4), torch.arange(1, 5))



# --- a head's kernel tables kept on the device, ids through a pinned ring -----------------------

@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_a_heads_tables_stay_on_the_device(layout):
    """A load's head keeps its blocks' tables on the device (its upload is on the caller's path to
    layer 0): after a load exactly the head's blocks are kept, a second load of other ids reuses
    them, the body's tables travel with each call, and both land every byte; a kept table is the
    plan's, word for word."""
    from tiered_kv.transfers.torch_path import load_pairs
    from tiered_kv.transfers.engine import _blocks, _head_split

    spec = nsa_spec(num_layers=9, page_size=4)
    device, host = make_device_pool(spec, 20, "cpu"), make_host_pool(spec, 16, layout)
    split = LoadSplit(0.0, kernel_blocks=2, head_layers=3, ramp=True)
    engine = TransferEngine(device.pool, host, path="mixed", options=TransferOptions(load_split=split))
    pairs = [pair for layer in range(9) for pair in load_pairs(host, device.pool, layer)]
    slots, pages = torch.randperm(16)[:7], random_ids(7, 1, 20)
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages))
    head_blocks = {tuple(block) for block in _blocks(3, _head_split(split), kernel=True)}
    assert {layers for layers, _ in engine._device_tables} == head_blocks
    kept = dict(engine._device_tables)
    slots, pages = torch.randperm(16)[:5], random_ids(5, 1, 20)
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages))
    assert engine._device_tables.keys() == kept.keys()
    assert all(engine._device_tables[k] is t for k, t in kept.items())
    for (layers, components), table in kept.items():
        assert torch.equal(table.cpu(), engine._load_plan(layers, components).table.reshape(-1))


def test_derived_splits_are_made_once_per_split():
    """The body's and the head's splits come from a cache: equal splits give the same objects,
    and each says what it should (the body without the head; the head ramped through the kernel)."""
    from tiered_kv.transfers.engine import _body_split, _head_split

    split = LoadSplit(0.5, head_layers=8, ramp=True, ramp_step=5, head_ramp_step=8)
    assert _body_split(split) is _body_split(LoadSplit(0.5, head_layers=8, ramp=True, ramp_step=5, head_ramp_step=8))
    assert _body_split(split).head_layers == 0 and _body_split(split).ce_fraction == 0.5
    head = _head_split(split)
    assert head is _head_split(split)
    assert (head.ramp, head.ramp_step, head.kernel_blocks) == (True, 8, KERNEL_LOADS.kernel_blocks)
    assert _head_split(LoadSplit(head_layers=2, ramp=True, ramp_step=3)).ramp_step == 3
    assert _head_split(LoadSplit(head_layers=2)) is not head


@gpu
@pytest.mark.gpu
def test_gpu_ids_ring_wraps_and_falls_back_without_blocking():
    """Every upload lands its ids, around the ring many times; a row whose copy has not run yet is
    not written (the upload falls back), and ids longer than a row fall back too."""
    from tiered_kv.kernels.ids_ring import IdsRing

    ring = IdsRing("cuda", rows=4, row_ids=64)
    stream = torch.cuda.Stream()
    for i in range(20):
        a, b = torch.arange(i, i + 10), torch.arange(100 + i, 130 + i)
        with torch.cuda.stream(stream):
            got = ring.upload([a, b])
        stream.synchronize()
        assert torch.equal(got[0].cpu(), a) and torch.equal(got[1].cpu(), b)
    assert ring.fallbacks == 0
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)  # the stream busy: the next copies queue behind it
        outs = [ring.upload([torch.full((8,), i)]) for i in range(6)]
    assert ring.fallbacks >= 2  # rows 0..3 taken, then their copies have not run
    stream.synchronize()
    assert all(torch.equal(o[0].cpu(), torch.full((8,), i)) for i, o in enumerate(outs))
    long = torch.arange(100)
    assert torch.equal(ring.upload([long])[0].cpu(), long) and ring.fallbacks >= 3
