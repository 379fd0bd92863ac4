"""``TieredKVSpec``: the ``OffloadingSpec`` vLLM loads by ``spec_module_path``.

vLLM builds one instance in the EngineCore (``get_manager``) and one per worker (``get_worker``);
both derive the same slot count and namespace from the same config, so they agree without talking.
With ``l3_url``, the worker holds the L3 controller (it needs L2's memory) and serves the manager's
L3 jobs on a socket named after vLLM's engine id (``job_socket``).
It must never hand vLLM a manager and a worker that disagree on slot count or page keys.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingManager, OffloadingSpec, OffloadingWorker

from tiered_kv.backends import open_backend
from tiered_kv.errors import ConfigError
from tiered_kv.hierarchy.controller import L3Controller
from tiered_kv.hierarchy.job_worker import JobWorker
from tiered_kv.hierarchy.l3_jobs import L3Jobs
from tiered_kv.model.host_pool import HostPool
from tiered_kv.model.keys import Namespace

from .job_socket import JobServer, SocketLink, socket_address, socket_key
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
        if self.settings.l3_url is not None and config.parallel.world_size != 1:
            raise ConfigError(f"kv_connector_extra_config['l3_url'] takes one worker, got world_size "
                              f"{config.parallel.world_size}; under tensor parallelism use TieredL3Tier")
        self._manager: TieredKVManager | None = None
        self._worker: TieredKVWorker | None = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            l3, ready = None, (lambda: True)
            if self.settings.l3_url is not None:
                link = SocketLink(socket_address(self.config.engine_id, 0), socket_key(self.config.engine_id))
                l3, ready = L3Jobs(link), link.ready
            self._manager = TieredKVManager(self.settings.l2_slots, self.namespace, l3=l3, l3_ready=ready)
            register(self._manager)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            spec = vllm_kv_spec(kv_caches, self.block_tokens, str(self.config.model.dtype))
            l1 = wrap_vllm_caches(kv_caches, spec)
            l2 = HostPool(spec, self.settings.l2_slots, own_slots=False)
            server = None
            if self.settings.l3_url is not None:
                url = self.settings.l3_url
                controller = L3Controller(lambda: open_backend(url, l2), record_bytes=l2.record_bytes, name="vllm-l3")
                engine_id = self.config.engine_id
                server = JobServer(socket_address(engine_id, self.config.parallel.rank), socket_key(engine_id),
                                   JobWorker(None, controller))
            self._worker = TieredKVWorker(l1, l2, l3_server=server)
            register(self._worker)
        return self._worker
