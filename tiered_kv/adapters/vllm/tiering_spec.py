"""``TieredTieringSpec``: vLLM's own ``TieringOffloadingSpec`` (its CPU tier, its secondary tiers such
as ``TieredL3Tier``) with a worker that also runs on vLLM's CPU platform.

On CUDA-alike and XPU platforms it is vLLM's spec unchanged. Elsewhere the worker copies between
vLLM's KV tensors and the shared CPU region with torch. It must never change what vLLM stores where.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from tiered_kv.errors import ConfigError


class RegionCopyWorker(OffloadingWorker):
    """Synchronous torch copies between vLLM's blocks and its shared CPU region (one block a chunk)."""

    def __init__(self, kv_caches: CanonicalKVCaches, region: SharedOffloadRegion) -> None:
        self.region = region
        self._blocks = [t.tensor.view(torch.int8).view(-1, t.page_size_bytes) for t in kv_caches.tensors]
        self._chunks = [region.create_next_worker_view(t.page_size_bytes) for t in kv_caches.tensors]
        self._finished: list[TransferResult] = []

    def _copy(self, job_id: int, blocks, chunks, *, to_region: bool) -> bool:
        started = time.perf_counter()
        b = torch.from_numpy(np.asarray(blocks, dtype=np.int64))
        c = torch.from_numpy(np.asarray(chunks, dtype=np.int64))
        nbytes = 0
        for block_rows, chunk_rows in zip(self._blocks, self._chunks):
            if to_region:
                chunk_rows[c] = block_rows[b]
            else:
                block_rows[b] = chunk_rows[c]
            nbytes += len(b) * block_rows.shape[1]
        self._finished.append(TransferResult(job_id, True, nbytes, time.perf_counter() - started))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: BlockIDsLoadStoreSpec) -> bool:
        return self._copy(job_id, src_spec.block_ids, dst_spec.block_ids, to_region=True)

    def submit_load(self, job_id: int, src_spec: BlockIDsLoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._copy(job_id, dst_spec.block_ids, src_spec.block_ids, to_region=False)

    def get_finished(self) -> list[TransferResult]:
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return None      # every copy finished inside its submit

    def shutdown(self) -> None:
        self._chunks = []
        self.region.cleanup()


class TieredTieringSpec(TieringOffloadingSpec):
    """vLLM's tiering spec; on a platform its own worker refuses, a torch worker instead."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if current_platform.is_cuda_alike() or current_platform.is_xpu():
            return super().get_worker(kv_caches)
        if self._worker is None:
            if self.blocks_per_chunk != 1:
                raise ConfigError(f"the CPU-platform worker takes blocks_per_chunk 1, got {self.blocks_per_chunk}")
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            region = SharedOffloadRegion(engine_id=self._engine_id, num_chunks=self.num_chunks, rank=rank,
                                         kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                                         cpu_page_size=self.cpu_page_size_per_worker)
            self._worker = RegionCopyWorker(kv_caches, region)
        return self._worker
