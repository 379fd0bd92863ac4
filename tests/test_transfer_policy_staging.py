"""Loads of several layers with slots in runs: how many CTAs their staging scatter gets (layer_first 16,
page_first 32 beside its indexer blocks), and the other cases keep the copier's default."""

from tiered_kv import transfer_policy as tp


def test_layer_first_runs_scatter_with_16_ctas_and_page_first_runs_with_32():
    dense = tp.choose_split(dense_host_rows=True, num_layers=61, backup_in_flight=False, scattered=False, has_batch=True)
    pitched = tp.choose_split(dense_host_rows=False, num_layers=61, backup_in_flight=False, scattered=False, has_batch=True)
    assert dense.staging_ctas == 16
    assert pitched.staging_ctas == 32 and pitched.minor_layers_per_copy == 8 and pitched.minor_lead_groups == 1
    # Beside a backup, scattered slots and a single layer keep their own splits.
    for split in (tp.choose_split(dense_host_rows=True, num_layers=61, backup_in_flight=True, scattered=False, has_batch=True),
                  tp.choose_split(dense_host_rows=True, num_layers=61, backup_in_flight=False, scattered=True, has_batch=True),
                  tp.choose_split(dense_host_rows=True, num_layers=1, backup_in_flight=False, scattered=False, has_batch=True)):
        assert split.staging_ctas is None
    # A caller's own split wins.
    own = tp.LoadSplit(1.0, staging_ctas=3)
    assert tp.choose_split(dense_host_rows=True, num_layers=61, backup_in_flight=False, scattered=False, has_batch=True,
                           options=tp.TransferOptions(load_split=own)) is own
