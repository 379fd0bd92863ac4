"""``TransferHalf``'s ``options``: a serving engine tells the transfer engine that its model
computes beside the loads; the bytes still land where the plan says, and bad options are refused."""

from __future__ import annotations

import pytest

from tiered_kv import ConfigError, HostPool, allocate_engine_like
from tiered_kv.hierarchy import TransferHalf
from tiered_kv.hierarchy.manager import LoadPlan, StorePlan
from tiered_kv.hierarchy.oracle import fill_pages, verify_pages
from tiered_kv.transfers.policy import TransferOptions

from .conftest import SPEC, keys_of, prompts


def test_beside_compute_store_and_load_back():
    host = HostPool(SPEC, 16)
    device = allocate_engine_like(SPEC, 20)
    worker = TransferHalf(device, host, options=TransferOptions(beside_compute=True))
    assert worker.engine.options.beside_compute is True
    keys = keys_of(prompts(3, [6])[0])
    assert len(keys) == 6
    source_pages, target_pages = [1, 2, 3, 4, 5, 6], [13, 9, 11, 7, 15, 8]
    fill_pages(device, keys, source_pages)
    slots = host.allocate(len(keys))
    store = StorePlan(keys, list(slots), list(range(len(keys))))
    worker.store(store, source_pages).synchronize()
    assert worker.drain() == [store]
    assert not any(verify_pages(device, keys, target_pages))  # nothing there before the load
    handle = worker.load(LoadPlan(keys, list(slots)), target_pages)
    for layer in range(SPEC.num_layers):
        handle.wait_layer(layer)
    handle.synchronize()
    assert verify_pages(device, keys, target_pages) == [True] * len(keys)
    worker.engine.close()
    host.free(slots)
    assert host.free_slots == host.num_slots and host.pending_slots == 0
    host.close()


@pytest.mark.parametrize("bad", [{"beside_compute": True}, "beside_compute", True])
def test_options_that_are_not_transfer_options_are_refused(bad):
    host = HostPool(SPEC, 4)
    device = allocate_engine_like(SPEC, 6)
    with pytest.raises(ConfigError, match="TransferOptions"):
        TransferHalf(device, host, options=bad)
    host.close()
