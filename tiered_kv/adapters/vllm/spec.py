"""``TieredKVSpec``: the ``OffloadingSpec`` vLLM loads by ``spec_module_path``.

vLLM builds one instance in the EngineCore (``get_manager``) and one per worker (``get_worker``);
both derive the same slot count and namespace from the same config, so they agree without talking.
It must never hand vLLM a manager and a worker that disagree on slot count or page keys.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingManager, OffloadingSpec, OffloadingWorker

from tiered_kv.errors import ConfigError
from tiered_kv.model.host_pool import HostPool
from tiered_kv.model.keys import Namespace

from .keys import layout_fingerprint
from .live import register
from .manager import TieredKVManager
from .settings import read_settings
from .slots_spec import TieredSlotsSpec
from .worker import TieredKVWorker, vllm_kv_spec, wrap_vllm_caches

__all__ = ["TieredKVSpec", "TieredSlotsSpec"]



class TieredKVSpec(OffloadingSpec):
    """tiered-kv's L2 (verified records in a host pool) behind vLLM's KV blocks."""

    def __init__(self, config) -> None:
        super().__init__(config)
        if len(self.tokens_per_block) != 1:
            raise ConfigError(f"tiered-kv's vLLM spec takes one KV cache group, got {len(self.tokens_per_block)}")
        if self.blocks_per_chunk != 1:
            raise ConfigError(f"tiered-kv's vLLM spec takes blocks_per_chunk 1, got {self.blocks_per_chunk}")
        self.block_tokens = int(self.tokens_per_block[0])
        self.bytes_per_block = int(config.worker_kv_bytes_per_block)
        self.settings = read_settings(self.extra_config, bytes_per_chunk=self.bytes_per_block,
                                      model=str(config.model.name))
        fingerprint = layout_fingerprint(tokens_per_block=self.block_tokens, bytes_per_block=self.bytes_per_block,
                                         dtype=str(config.model.dtype), layout=config.kv_cache_layout)
        self.namespace = Namespace(model=self.settings.model, spec_fingerprint=fingerprint,
                                   page_size=self.block_tokens, tenant_salt=self.settings.salt)
        self._manager: TieredKVManager | None = None
        self._worker: TieredKVWorker | None = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            self._manager = TieredKVManager(self.settings.l2_slots, self.namespace)
            register(self._manager)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            spec = vllm_kv_spec(kv_caches, self.block_tokens, str(self.config.model.dtype))
            l1 = wrap_vllm_caches(kv_caches, spec)
            l2 = HostPool(spec, self.settings.l2_slots, own_slots=False)
            self._worker = TieredKVWorker(l1, l2, cuda=kv_caches.tensors[0].tensor.is_cuda)
            register(self._worker)
        return self._worker
