"""tiered-kv as SGLang's whole host tier and L3: a ``UnifiedCacheLinker``.

SGLang (0.5.23 and later) loads it with ``--enable-unified-cache-external-linker
--unified-cache-external-linker-backend dynamic --unified-cache-external-linker-config
'{"linker": "Linker", "linker_module_path": "tiered_kv.adapters.sglang.linker",
"linker_extra_config": {...}}'`` and calls it from the scheduler's thread, on device indices:

* ``lookup``   -> ``CacheManager.lookup`` (and, for an L3 hit, ``start_prefetch`` into L2),
* ``load``     -> ``CacheManager.prepare_load`` (queued), ``cancel_queued_load`` -> ``complete_load``,
* ``start_layer_wise_loading`` -> ``TransferHalf.load`` per queued request; the layer-done counter
  waits on the handles' per-layer events, ``finish_layer_wise_loading`` on the whole handles,
* ``offload``  -> ``CacheManager.prepare_store`` + ``TransferHalf.store``; ``num_completed_offloads``
  / ``pop_completed_offload`` -> ``TransferHalf.finished_stores`` + ``complete_store`` (L2 -> L3
  then follows the write policy on the L3 controller's own thread).

The engine's device tensors are wrapped, never copied or allocated; L2 is a ``HostPool`` of the
linker's own. It never raises a failing L3 into the scheduler: L3 turns degraded and L2 serves on.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker

from ...errors import ConfigError, TieredKVError
from ...hierarchy import CacheManager, L3Controller, Policies, TransferHalf
from ...model.host_pool import HostPool
from ...model.keys import Namespace
from .linker_counter import HandleLayerCounter
from .linker_pools import device_page_ids, device_pool_group, spec_and_device_pool


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"linker_extra_config.{what} must be a string, got {value!r:.60}")
    return value


def _url(value: object, what: str) -> str | None:
    return None if value is None else _text(value, what)


def _slots(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"linker_extra_config.{what} must be an int >= 1, got {value!r:.60}")
    return value


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 3600:
        raise ConfigError(f"linker_extra_config.{what} must be seconds in [0, 3600), got {value!r:.60}")
    return float(value)


#: linker_extra_config's keys: their check and their default.
_OPTIONS: dict[str, tuple[Any, Any]] = {
    "model": (_text, None),            # the namespace's model; default: --model-path
    "tenant_salt": (_text, ""),        # keeps the pages of two tenants apart
    "l2_slots": (_slots, 1024),        # pages the host pool holds
    "l3_url": (_url, None),            # file:///dir, redis://..., mooncake://...; None: no L3
    "write": (_text, "write_through"),  # L2 -> L3: write_through, write_through_selective, write_back
    "lookup_wait_s": (_seconds, 2.0),  # how long a lookup waits for L3's answer and its prefetch
}


def linker_options(extra: dict | None) -> dict[str, Any]:
    """``linker_extra_config`` checked: an unknown key or a bad value is a ConfigError naming it."""
    extra = dict(extra or {})
    unknown = sorted(set(extra) - set(_OPTIONS))
    if unknown:
        raise ConfigError(f"linker_extra_config: unknown key(s) {unknown}; known: {sorted(_OPTIONS)}")
    return {name: default if name not in extra else check(extra[name], name)
            for name, (check, default) in _OPTIONS.items()}


def tp_shard(params: Any) -> tuple[int, int]:
    """``(tp_size, tp_rank)`` of the attention group the KV pool is sharded over; (1, 0) alone."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    group = params.attn_tp_cache_group or params.tp_cache_group
    return dist.get_world_size(group=group), dist.get_rank(group=group)


def linker_namespace(spec: Any, model: str, tenant_salt: str, *, replicated: bool, tp: tuple[int, int],
                     first_layer: int = 0, cp: tuple[int, int] = (1, 0)) -> Namespace:
    """The keys' namespace: the spec's fingerprint, the model, this rank's layers (a pipeline
    stage), and for head-sharded MHA pools the TP shard, so two ranks' pages never share a key;
    replicated MLA / DSA pages are the same on every TP rank and share theirs."""
    fields: dict[str, Any] = {"tenant_salt": tenant_salt,
                              "layer_range": (first_layer, first_layer + spec.num_layers)}
    if not replicated and tp[0] > 1:
        fields["tp"] = tp
    if cp[0] > 1:  # context-parallel ranks hold different tokens of one page's sequence
        fields["tenant_salt"] = f"{tenant_salt}/cp{cp[1]}of{cp[0]}"
    return Namespace.for_spec(spec, model=model, **fields)


@dataclass
class _Offload:
    """One ``offload`` call: its store plan (None: every page was on L2 already)."""

    plan: Any
    complete: bool  # False when L2 had no room for every page
    done: bool = False
    success: bool = False


@dataclass
class _QueuedLoad:
    plan: Any
    pages: list[int] = field(default_factory=list)


class Linker(UnifiedCacheLinker):
    """tiered-kv's L2 and L3 behind SGLang's unified radix cache."""

    def __init__(self, server_args: Any, params: Any, *, components: set, extra_config: dict | None = None,
                 forward_stream: Any = None) -> None:
        options = linker_options(extra_config)
        self.forward_stream = forward_stream
        self.page_size = params.page_size
        kvcache = params.token_to_kv_pool_allocator.get_kvcache()
        self.pool_group = device_pool_group(kvcache, params, self.page_size, components)
        self.pools = self.pool_group.entry_map
        self.num_layers = self.pool_group.num_layers
        self.spec, self.device_pool = spec_and_device_pool(self.pool_group, kind=f"sglang-{type(kvcache).__name__}")
        model = options["model"] or getattr(server_args, "model_path", None) or "sglang"
        self.tp = tp_shard(params)
        replicated = bool(self.pool_group.rank_replicated)
        self.namespace = linker_namespace(self.spec, model, options["tenant_salt"], replicated=replicated,
                                          tp=self.tp, first_layer=int(getattr(kvcache, "start_layer", 0) or 0),
                                          cp=(params.attn_cp_size, params.attn_cp_rank))
        self.lookup_wait_s = options["lookup_wait_s"]
        policies = Policies(write=options["write"], prefetch="wait_complete",
                            l3_writer=not replicated or self.tp[1] == 0)  # replicated pages: one rank writes L3
        self.host_pool = HostPool(self.spec, num_slots=options["l2_slots"])
        try:
            l3 = None
            if options["l3_url"] is not None:
                from ...backends import open_backend

                url, pool = options["l3_url"], self.host_pool
                l3 = L3Controller(lambda: open_backend(url, pool), record_bytes=pool.record_bytes)
            self.manager = CacheManager(self.host_pool, page_size=self.page_size, l3=l3, policies=policies)
        except BaseException:
            self.host_pool.close()  # an L3 that cannot be opened leaves no pinned pool behind
            raise
        self.worker = TransferHalf(self.device_pool, self.host_pool)
        self.layer_done_counter = HandleLayerCounter(self.num_layers)
        self._queued: dict[str, _QueuedLoad] = {}
        self._offloads: deque[_Offload] = deque()
        self._closed = False

    # --- keys ----------------------------------------------------------------------------------
    def page_keys(self, transfers: list[PoolTransfer]) -> list[str]:
        """The KV transfer's SGLang page hashes (chained already) as keys of this namespace."""
        kv = next((t for t in transfers if t.name == PoolName.KV), None)
        if kv is None or not kv.keys:
            return []
        return [self.namespace.engine_key(str(h).encode()) for h in kv.keys]

    @staticmethod
    def _kv_transfer(transfers: list[PoolTransfer]) -> PoolTransfer | None:
        return next((t for t in transfers if t.name == PoolName.KV), None)

    # --- lookups and loads (L2 -> device) ------------------------------------------------------
    def lookup(self, rid: str, transfers: list[PoolTransfer]) -> list[int]:
        keys = self.page_keys(transfers)
        if not keys:
            return []
        deadline = time.monotonic() + self.lookup_wait_s
        while (match := self.manager.lookup(rid, keys, l1_pages=0)) is None:
            if time.monotonic() >= deadline:
                self.manager.abort(rid)
                return []  # L3 did not answer in time: recompute
            time.sleep(0.0005)
        if not match.l3_pages:
            # ``load`` locks the resident run itself: a request SGLang never loads leaves nothing.
            self.manager.abort(rid)
            return list(range(1, match.l2_pages + 1))
        # L3's pages come into L2 first (a load reads L2 only); what landed becomes resident.
        self.manager.start_prefetch(rid, keys, match)
        while not self.manager.prefetch_ready(rid) and time.monotonic() < deadline:
            time.sleep(0.0005)
        landed = self.manager.prepare_load(keys, rid, l1_pages=0)
        self.manager.complete_load(landed, None)
        return list(range(1, len(landed) + 1))

    def load(self, rid: str, transfers: list[PoolTransfer]) -> bool:
        kv = self._kv_transfer(transfers)
        keys = self.page_keys(transfers)
        if kv is None or not keys or kv.device_indices is None:
            return False
        if rid in self._queued:
            raise ConfigError(f"a load for request {rid!r} is queued already")
        pages = device_page_ids(kv.device_indices, self.page_size)
        if len(pages) != len(keys):
            raise ConfigError(f"load of {rid!r}: {len(keys)} page keys for {len(pages)} device pages")
        plan = self.manager.prepare_load(keys, rid, l1_pages=0)
        if len(plan) < len(keys):  # a page left L2 since the lookup: recompute instead
            self.manager.complete_load(plan, None)
            return False
        self._queued[rid] = _QueuedLoad(plan, pages)
        return True

    def cancel_queued_load(self, rid: str) -> bool:
        queued = self._queued.pop(rid, None)
        if queued is None:
            return False
        self.manager.complete_load(queued.plan, None)
        return True

    def start_layer_wise_loading(self) -> int:
        if not self._queued:
            return -1
        queued, self._queued = self._queued, {}
        index = self.layer_done_counter.update_producer()
        for load in queued.values():
            try:
                handle = self.worker.load(load.plan, load.pages)
            except (TieredKVError, RuntimeError) as error:
                # Reported by finish_layer_wise_loading, after which SGLang aborts the batch's
                # requests: raising here would end the scheduler instead.
                self.manager.complete_load(load.plan, None)
                self.layer_done_counter.fail(index, error)
                continue
            self.layer_done_counter.add(index, handle)
            # Unlocked now: the slots are reused only once the handle is done.
            self.manager.complete_load(load.plan, handle)
        return index

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        return self.layer_done_counter.finish(counter_index)

    # --- offloads (device -> L2, then L3) ------------------------------------------------------
    def offload(self, transfers: list[PoolTransfer], session_id: str | None = None) -> bool:
        kv = self._kv_transfer(transfers)
        keys = self.page_keys(transfers)
        if kv is None or not keys or kv.device_indices is None:
            return False
        pages = device_page_ids(kv.device_indices, self.page_size)
        if len(pages) != len(keys):
            raise ConfigError(f"offload: {len(keys)} page keys for {len(pages)} device pages")
        skipped = self.manager.stats.stores_skipped
        plan = self.manager.prepare_store(keys)
        complete = self.manager.stats.stores_skipped == skipped  # L2 had room for every new page
        if not len(plan):
            self._offloads.append(_Offload(None, complete, done=True, success=complete))
            return True
        if self.forward_stream is not None:
            # The forward may still be writing these pages on its own stream.
            import torch

            torch.cuda.current_stream().wait_stream(self.forward_stream)
        self.worker.store(plan, [pages[i] for i in plan.positions])
        self._offloads.append(_Offload(plan, complete))
        return True

    def _collect_stores(self, finished_plans: list | None = None) -> None:
        """Make the offloads whose stores landed resident (``finished_plans``: those ``drain``
        returned; else the ones ``finished_stores`` has now)."""
        if finished_plans is None:
            finished_plans = self.worker.finished_stores()
        finished = {id(plan): plan for plan in finished_plans}
        for offload in self._offloads:
            if offload.done or id(offload.plan) not in finished:
                continue
            self.manager.complete_store(offload.plan, True)
            offload.done, offload.success = True, offload.complete

    def num_completed_offloads(self) -> int:
        self._collect_stores()
        count = 0
        for offload in self._offloads:  # in order: SGLang pops the oldest first
            if not offload.done:
                break
            count += 1
        return count

    def pop_completed_offload(self) -> bool:
        if not self.num_completed_offloads():
            raise IndexError("no completed offload to pop")
        return self._offloads.popleft().success

    # --- lifecycle -----------------------------------------------------------------------------
    def _quiesce(self) -> None:
        for queued in self._queued.values():
            self.manager.complete_load(queued.plan, None)
        self._queued.clear()
        self.layer_done_counter.reset()
        self._collect_stores(self.worker.drain())
        self._offloads.clear()

    def reset(self) -> None:
        self._quiesce()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._quiesce()
        self.manager.close()
        self.host_pool.close()

    # --- for tests and operators ---------------------------------------------------------------
    def wait_l3_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait until L3's writes are done (tests; an operator draining before a restart)."""
        return self.manager.wait_idle(timeout_s)
