"""Idle loads of several layers with slots in runs: which ones give their staging scatter 16 CTAs."""

import pytest
import torch

from tiered_kv import nsa_spec
from tiered_kv.transfers import policy as tp
from tiered_kv.transfers.torch_path import load_pairs
from tiered_kv.transfers.engine import TransferEngine

from ..kernels.pools import check_copy, make_device_pool, make_host_pool, random_ids


def test_layer_first_runs_scatter_with_16_ctas_and_page_first_keeps_the_copiers_default():
    dense = tp.choose_split(dense_host_rows=True, num_layers=61, backup_in_flight=False, scattered=False, has_batch=True)
    pitched = tp.choose_split(dense_host_rows=False, num_layers=61, backup_in_flight=False, scattered=False, has_batch=True)
    assert dense.staging_ctas == 16
    assert pitched.staging_ctas is None
    # Beside a backup, scattered slots and a single layer keep their own splits.
    for split in (tp.choose_split(dense_host_rows=True, num_layers=61, backup_in_flight=True, scattered=False, has_batch=True),
                  tp.choose_split(dense_host_rows=True, num_layers=61, backup_in_flight=False, scattered=True, has_batch=True),
                  tp.choose_split(dense_host_rows=True, num_layers=1, backup_in_flight=False, scattered=False, has_batch=True)):
        assert split.staging_ctas is None
    # A caller's own split wins.
    own = tp.LoadSplit(1.0, staging_ctas=3)
    assert tp.choose_split(dense_host_rows=True, num_layers=61, backup_in_flight=False, scattered=False, has_batch=True,
                           options=tp.TransferOptions(load_split=own)) is own


def test_beside_compute_takes_the_copy_engine_split_for_page_first_runs_only():
    """``TransferOptions.beside_compute``: page_first loads of several layers with slots in runs go
    through the copy engines with indexer blocks; every other case keeps its split."""
    beside = tp.TransferOptions(beside_compute=True)

    def split(**conditions):
        base = {"num_layers": 61, "backup_in_flight": False, "scattered": False, "has_batch": True}
        return tp.choose_split(options=beside, **{**base, **conditions})

    chosen = split(dense_host_rows=False)
    assert chosen is tp.PITCHED_RUNS_LOADS
    assert chosen.ce_fraction == 1.0 and chosen.by == "pages" and chosen.minor_layers_per_copy == 8
    assert chosen.staging_ctas == 32 and chosen.head_layers > 0
    idle = tp.choose_split(dense_host_rows=False, num_layers=61, backup_in_flight=False, scattered=False, has_batch=True)
    assert idle is tp.MIXED_LOADS[(False, True)] and idle.by == "components"
    # layer_first runs, one layer, scattered slots and loads beside a backup: as without the flag.
    assert split(dense_host_rows=True) is tp.MIXED_LOADS[(True, True)]
    assert split(dense_host_rows=False, num_layers=1) is tp.MIXED_LOADS[(False, False)]
    assert split(dense_host_rows=False, scattered=True) is tp.SCATTERED_LOADS[False]
    assert split(dense_host_rows=False, backup_in_flight=True) is tp.MIXED_LOADS_BESIDE_BACKUP[False]
    # A caller's own split still wins.
    own = tp.LoadSplit(0.5)
    assert tp.choose_split(dense_host_rows=False, num_layers=61, backup_in_flight=False, scattered=False, has_batch=True,
                           options=tp.TransferOptions(load_split=own, beside_compute=True)) is own


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_beside_compute_is_a_flag(bad):
    with pytest.raises(tp.ConfigError, match="TransferOptions.beside_compute"):
        tp.TransferOptions(beside_compute=bad)


@pytest.mark.parametrize("slots", ["runs", "scattered"])
def test_an_engine_beside_compute_copies_every_byte(slots):
    """Through the engine (CPU pools): the flag's split moves every byte of a load."""
    spec = nsa_spec(num_layers=12, page_size=4)
    device, host = make_device_pool(spec, 40, "cpu"), make_host_pool(spec, 36, "page_first")
    engine = TransferEngine(device.pool, host, options=tp.TransferOptions(beside_compute=True))
    ids = torch.arange(2, 34) if slots == "runs" else random_ids(32, 0, 36)
    pages = random_ids(32, 1, 40)
    assert engine._load_split(spec.num_layers) is tp.PITCHED_RUNS_LOADS
    pairs = [pair for layer in range(spec.num_layers) for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, ids, pages, device.roots, lambda: engine.load(ids, pages).synchronize())
    engine.close()
    host.close()
