"""``LoadSplit.minor_layers_per_copy``: a staged copy-engine part moves the smaller components
(NSA: the indexer) in blocks of adjacent layers, each block with its first layer's group."""

from __future__ import annotations

import pytest
import torch

from tiered_kv import ConfigError, nsa_spec
from tiered_kv.transfers.torch_path import load_pairs
from tiered_kv.transfers.engine import TransferEngine, _blocks, staged_groups
from tiered_kv.transfers.policy import LoadSplit, TransferOptions

from ..kernels.pools import adjacent_ids, check_copy, make_device_pool, make_host_pool, random_ids, spans

LATENT, INDEXER = 0, 1
SIZES = [42, 8]  # bytes per layer of each component: only their order matters


def test_groups_without_minor_blocks_hold_every_component_of_their_layers():
    blocks = [[0], [1, 2], [3]]
    assert staged_groups(blocks, (0, 1), SIZES) == [[(0, 0), (0, 1)], [(1, 0), (1, 1), (2, 0), (2, 1)], [(3, 0), (3, 1)]]
    # One component, or components of one size: nothing to block.
    assert staged_groups(blocks, (0,), SIZES, 4) == [[(0, 0)], [(1, 0), (2, 0)], [(3, 0)]]
    assert staged_groups([[0], [1]], (0, 1), [8, 8], 2) == [[(0, 0), (0, 1)], [(1, 0), (1, 1)]]


def test_minor_blocks_ride_with_the_group_of_their_first_layer():
    blocks = [[i] for i in range(7)]
    groups = staged_groups(blocks, (LATENT, INDEXER), SIZES, 3)
    assert groups[0] == [(0, LATENT), (0, INDEXER), (1, INDEXER), (2, INDEXER)]
    assert groups[1] == [(1, LATENT)] and groups[2] == [(2, LATENT)]
    assert groups[3] == [(3, LATENT), (3, INDEXER), (4, INDEXER), (5, INDEXER)]
    assert groups[6] == [(6, LATENT), (6, INDEXER)]  # a short last block
    # One group ahead: the first block stays in the first group, the others move up one.
    ahead = staged_groups(blocks, (LATENT, INDEXER), SIZES, 3, lead=1)
    assert ahead[0] == groups[0] and ahead[3] == [(3, LATENT)]
    assert ahead[2] == [(2, LATENT), (3, INDEXER), (4, INDEXER), (5, INDEXER)]
    assert ahead[5] == [(5, LATENT), (6, INDEXER)]


@pytest.mark.parametrize("lead", [0, 1, 3])
@pytest.mark.parametrize("per, minor", [(1, 8), (3, 2), (2, 5), (8, 8), (1, 100)])
def test_every_pair_lands_once_and_never_after_its_own_layer(per, minor, lead):
    """For any blocks (ramped or not) and block size: each (layer, component) in exactly one
    group, the largest component in its own layer's group, none in a later group than its layer's."""
    for split in (LoadSplit(layers_per_copy=per), LoadSplit(layers_per_copy=per, ramp=True),
                  LoadSplit(layers_per_copy=per, ramp=True, ramp_step=2)):
        for num_layers in (1, 5, 61):
            blocks = _blocks(num_layers, split)
            group_of = {i: g for g, block in enumerate(blocks) for i in block}
            groups = staged_groups(blocks, (LATENT, INDEXER), SIZES, minor, lead)
            placed = [(g, pair) for g, group in enumerate(groups) for pair in group]
            assert sorted(pair for _, pair in placed) == [(i, c) for i in range(num_layers) for c in (LATENT, INDEXER)]
            for g, (i, c) in placed:
                assert g == group_of[i] if c == LATENT else g <= group_of[i]


def test_a_minor_block_is_one_wide_row_of_a_page_first_slot():
    """The fold the option exists for: the indexer rows of adjacent layers sit side by side in a
    page_first slot, so a group with a latent and a block of indexers is two pieces per slot."""
    spec = nsa_spec(num_layers=9, page_size=4)
    device, host = make_device_pool(spec, 8), make_host_pool(spec, 8, "page_first")
    blocks = [[i] for i in range(9)]
    group = staged_groups(blocks, (LATENT, INDEXER), [c.bytes_per_layer for c in spec.components], 4)[0]
    views = [load_pairs(host, device.pool, i)[c][0] for i, c in group]
    latent, indexer = spec.components[LATENT].bytes_per_layer, spec.components[INDEXER].bytes_per_layer
    assert sorted(width for _, width in spans(views)) == sorted([latent, 4 * indexer])


SPLITS = {
    "all_ce": LoadSplit(1.0, minor_layers_per_copy=4),
    "after_a_head": LoadSplit(1.0, head_layers=2, ramp=True, ramp_step=3, minor_layers_per_copy=3),
    "half_of_pages_blocks_of_layers": LoadSplit(0.5, layers_per_copy=2, ramp=True, minor_layers_per_copy=5),
    "scatter_ctas": LoadSplit(1.0, staging_ctas=2, minor_layers_per_copy=2),
    "waves": LoadSplit(1.0, plan_wave=1, lead_blocks=2, minor_layers_per_copy=3),
    "one_group_ahead": LoadSplit(1.0, head_layers=1, minor_layers_per_copy=4, minor_lead_groups=1),
    "far_ahead_in_blocks": LoadSplit(1.0, layers_per_copy=2, minor_layers_per_copy=3, minor_lead_groups=5),
}


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("slots_kind", ["runs", "scattered"])
@pytest.mark.parametrize("name", sorted(SPLITS))
def test_loads_with_minor_blocks_copy_every_byte(name, slots_kind, layout):
    spec = nsa_spec(num_layers=9, page_size=4)
    device, host = make_device_pool(spec, 24), make_host_pool(spec, 20, layout)
    engine = TransferEngine(device.pool, host, path="mixed", options=TransferOptions(load_split=SPLITS[name]))
    slots = adjacent_ids(11, 0, 20) if slots_kind == "runs" else random_ids(11, 0, 20)
    pages = random_ids(11, 1, 24)  # page 0 is the engine's reserved page
    pairs = [pair for layer in range(spec.num_layers) for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages).synchronize())
    layers = [1, 2, 3, 6, 8]  # not adjacent everywhere: blocks of non-adjacent layers still copy right
    pairs = [pair for layer in layers for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages, layers=layers).synchronize())
    engine.close()
    host.close()


@pytest.mark.parametrize("bad", [{"minor_layers_per_copy": 0}, {"minor_layers_per_copy": 2.0},
                                 {"minor_layers_per_copy": True},
                                 {"minor_layers_per_copy": 2, "by": "components"},
                                 {"minor_layers_per_copy": 2, "ce_path": "batch"}, {"minor_lead_groups": 1},
                                 {"minor_layers_per_copy": 2, "minor_lead_groups": -1}])
def test_minor_blocks_reject_nonsense(bad):
    with pytest.raises(ConfigError, match="LoadSplit.minor_l"):
        LoadSplit(**bad)


def test_the_option_survives_a_caller_share_of_pages():
    """``TransferOptions.ce_fraction`` over a split keeps its minor blocks (by pages either way)."""
    from tiered_kv.transfers.policy import choose_split

    own = LoadSplit(1.0, minor_layers_per_copy=8)
    split = choose_split(dense_host_rows=False, num_layers=61, backup_in_flight=False, scattered=False, has_batch=True,
                         options=TransferOptions(load_split=own, ce_fraction=0.5))
    assert split.minor_layers_per_copy == 8 and split.ce_fraction == 0.5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", sorted(SPLITS))
@pytest.mark.parametrize("slots_kind", ["runs", "scattered"])
def test_gpu_each_layer_holds_its_bytes_right_after_wait_layer(name, slots_kind):
    """On the device the minor blocks land before their first layer's event: every layer, read on
    a fresh stream right after ``wait_layer``, holds both of its components."""
    from .test_engine import load_and_check_each_layer

    spec = nsa_spec(num_layers=12, page_size=64)
    device, host = make_device_pool(spec, 300, "cuda"), make_host_pool(spec, 260, "page_first")
    split = SPLITS[name]
    engine = TransferEngine(device.pool, host, path="mixed", options=TransferOptions(load_split=split))
    slots = torch.arange(3, 259) if slots_kind == "runs" else random_ids(256, 0, 260)
    handle = load_and_check_each_layer(engine, host, device.pool, slots, random_ids(256, 1, 300), spec.num_layers)
    handle.synchronize()
    engine.close()
