"""The scheduler half inside vLLM's EngineCore: which offload keys sit in which L2 slot.

It holds slot ids and page keys only, never bytes, and never blocks. It must never raise into vLLM's
scheduler for a state vLLM can reach: a full L2 with every slot in use answers ``None`` (no store).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)

from tiered_kv.model.keys import Namespace

from .keys import page_key
from .slots_spec import TieredSlotsSpec


@dataclass
class _Entry:
    slot: int
    ready: bool = False   # the store's bytes have landed (complete_store(success=True))
    readers: int = 0      # loads in flight out of the slot


class TieredKVManager(OffloadingManager):
    """LRU over ``num_slots`` L2 slots; a slot under a load or a store is never evicted."""

    def __init__(self, num_slots: int, namespace: Namespace) -> None:
        self.num_slots = num_slots
        self.namespace = namespace
        self._entries: OrderedDict[OffloadKey, _Entry] = OrderedDict()
        self._free = list(range(num_slots - 1, -1, -1))
        self._events: list[OffloadingEvent] = []
        self.counters = {"lookups": 0, "hits": 0, "stored": 0, "evicted": 0, "store_refused": 0}

    def _spec(self, keys: Iterable[OffloadKey]) -> TieredSlotsSpec:
        keys = list(keys)
        return TieredSlotsSpec([self._entries[k].slot for k in keys], [page_key(self.namespace, k) for k in keys])

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self.counters["lookups"] += 1
        entry = self._entries.get(key)
        if entry is None:
            return LookupResult.MISS
        if not entry.ready:
            return LookupResult.HIT_PENDING
        self.counters["hits"] += 1
        return LookupResult.HIT

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        for key in keys:
            self._entries[key].readers += 1
            self._entries.move_to_end(key)
        return self._spec(keys)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:
            if key in self._entries:
                self._entries.move_to_end(key)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.readers > 0:
                entry.readers -= 1

    def _evict(self, count: int, protected: set[OffloadKey]) -> list[OffloadKey] | None:
        victims = [k for k, e in self._entries.items() if e.ready and e.readers == 0 and k not in protected][:count]
        if len(victims) < count:
            return None
        for key in victims:
            self._free.append(self._entries.pop(key).slot)
        return victims

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        keys = list(keys)
        new = [k for k in keys if k not in self._entries]
        evicted: list[OffloadKey] = []
        if len(new) > len(self._free):
            victims = self._evict(len(new) - len(self._free), set(keys))
            if victims is None:
                self.counters["store_refused"] += 1
                return None
            evicted = victims
            self.counters["evicted"] += len(victims)
            self._events.append(OffloadingEvent(keys=victims, medium=Medium.CPU, removed=True))
        for key in new:
            self._entries[key] = _Entry(self._free.pop())
        return PrepareStoreOutput(keys_to_store=new, store_spec=self._spec(new), evicted_keys=evicted)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        stored = []
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or entry.ready:
                continue
            if success:
                entry.ready = True
                stored.append(key)
            else:
                self._free.append(self._entries.pop(key).slot)
        self.counters["stored"] += len(stored)
        if stored:
            self._events.append(OffloadingEvent(keys=stored, medium=Medium.CPU, removed=False))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def take_events(self) -> Iterable[OffloadingEvent]:
        events, self._events = self._events, []
        yield from events

    def reset_cache(self) -> None:
        # vLLM fences every job of the old generation before new ones start (see its CPU manager).
        self._entries.clear()
        self._free = list(range(self.num_slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free)
