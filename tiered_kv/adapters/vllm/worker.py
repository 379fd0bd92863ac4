"""The worker half inside vLLM's worker process: L1 is vLLM's paged KV tensors wrapped as a
``DevicePool`` (no copy, vLLM's layout), L2 is a tiered-kv ``HostPool`` of sealed records.

Slots are handed out by the scheduler's manager, so the pool here never allocates (own_slots=False).
The copies themselves are ``BlockCopies`` (the transfer engine's streams on a GPU, torch on CPU).
With an L3, the worker also serves the manager's L3 jobs (``JobServer``: an ``L3Controller`` reading
records into, and writing them out of, the slots the manager names).
It must never copy into a GPU block vLLM has not handed to the job, and never report a job finished
before its bytes have landed.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

from tiered_kv.errors import ConfigError
from tiered_kv.model.device_pool import DeviceBuffer, DevicePool
from tiered_kv.model.host_pool import HostPool
from tiered_kv.model.spec import Component, KVSpec

from .block_copies import BlockCopies
from .slots_spec import TieredSlotsSpec

#: The bound of the L3 controller's close at shutdown.
L3_CLOSE_S = 10.0


def vllm_kv_spec(kv_caches: CanonicalKVCaches, tokens_per_block: int, dtype: str) -> KVSpec:
    """A tiered-kv page of vLLM's canonical caches: one component, one 'layer' per canonical tensor."""
    sizes = {t.page_size_bytes for t in kv_caches.tensors}
    if len(sizes) != 1:
        raise ConfigError(f"vLLM's KV tensors have pages of different sizes {sorted(sizes)}; "
                          "the tiered-kv spec wants one page size")
    return KVSpec(kind="vllm", page_size=tokens_per_block, layer_start=0, layer_end=len(kv_caches.tensors),
                  components=(Component("kv", sizes.pop(), "vllm canonical block"),),
                  dims=(("dtype", dtype),))


def wrap_vllm_caches(kv_caches: CanonicalKVCaches, spec: KVSpec) -> DevicePool:
    """vLLM's tensors as L1, viewed as rows of one block each (no copy)."""
    rows = [t.tensor.view(torch.int8).view(-1, t.page_size_bytes) for t in kv_caches.tensors]
    return DevicePool(spec, {"kv": DeviceBuffer.page_indexed(rows)})


class TieredKVWorker(OffloadingWorker):
    """vLLM's jobs as ``BlockCopies`` jobs: a store seals each slot as the record of its key."""

    def __init__(self, l1: DevicePool, l2: HostPool, *, l3_server: Any = None) -> None:
        self.l1 = l1
        self.l2 = l2
        self.l3_server = l3_server   # a JobServer, or None for L2 only
        self.copies = BlockCopies(l1, l2)

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        assert isinstance(dst_spec, TieredSlotsSpec)
        self.copies.store(job_id, list(map(int, src_spec.block_ids)), list(map(int, dst_spec.block_ids)),
                          dst_spec.page_keys)
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        assert isinstance(src_spec, TieredSlotsSpec)
        self.copies.load(job_id, list(map(int, src_spec.block_ids)), list(map(int, dst_spec.block_ids)))
        return True

    def get_finished(self) -> list[TransferResult]:
        return [TransferResult(*finished) for finished in self.copies.finished()]

    def wait(self, job_ids: set[int]) -> None:
        self.copies.wait(job_ids)

    def shutdown(self) -> None:
        if self.l3_server is not None:      # every L3 job ends before the pool's memory goes
            self.l3_server.close(deadline=time.monotonic() + L3_CLOSE_S)
        self.copies.close()                 # no copy still reads or writes the pool when it is unpinned
        self.l2.close()
