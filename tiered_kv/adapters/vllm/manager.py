"""The scheduler half inside vLLM's EngineCore: which offload keys sit in which L2 slot, and L3.

It holds slot ids and page keys only, never bytes, and never blocks. It must never raise into vLLM's
scheduler for a state vLLM can reach: a full L2 with every slot in use answers ``None`` (no store).

With an L3 (``L3Jobs`` over the worker's link), a key not on L2 is asked of L3 (an ``EXISTS`` job)
and ``lookup`` answers ``RETRY`` (vLLM asks again next step) until the answer is in; a key L3 holds
is read into a free L2 slot (``PREFETCH``), still ``RETRY``, and is a ``HIT`` only once the worker
verified the record: a record that does not verify is a miss. A store that landed on L2 is backed
up to L3 (``PUT``). A slot an L3 job reads or writes is never evicted or handed out until the
job's result is in; a job lost with its worker keeps its slot for good.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

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


#: How long an L3 answer to a lookup stands before L3 is asked again (another instance may put it).
ANSWER_TTL_S = 2.0
#: Answers kept before the stale ones are dropped.
MAX_ANSWERS = 1 << 16


@dataclass
class _Entry:
    slot: int
    ready: bool = False     # the bytes have landed (a store completed, or a prefetch verified)
    readers: int = 0        # loads in flight out of the slot
    fetching: bool = False  # a PREFETCH into the slot is in flight
    putting: bool = False   # a PUT out of the slot is in flight


@dataclass
class _L3Op:
    """An L3 job in flight: its keys, the L2 slots it touches, and the reset generation it began in."""

    kind: str               # "exists", "prefetch" or "put"
    keys: list[OffloadKey]
    slots: list[int]
    future: concurrent.futures.Future
    generation: int
    entries: list[_Entry] = field(default_factory=list)


class TieredKVManager(OffloadingManager):
    """LRU over ``num_slots`` L2 slots; a slot under a load or a store is never evicted."""

    def __init__(self, num_slots: int, namespace: Namespace, l3: Any = None,
                 l3_ready: Callable[[], bool] = lambda: True) -> None:
        self.num_slots = num_slots
        self.namespace = namespace
        self.l3 = l3                    # an L3Jobs, or None for L2 only
        self._l3_ready = l3_ready       # the link to the worker is up
        self._entries: OrderedDict[OffloadKey, _Entry] = OrderedDict()
        self._free = list(range(num_slots - 1, -1, -1))
        self._events: list[OffloadingEvent] = []
        self._evicted: list[OffloadKey] = []
        self._ops: list[_L3Op] = []
        self._asking: dict[OffloadKey, _L3Op] = {}
        self._answers: dict[OffloadKey, tuple[bool, float]] = {}
        self._generation = 0
        self.lost_slots: list[int] = []
        self.counters = {"lookups": 0, "hits": 0, "stored": 0, "evicted": 0, "store_refused": 0,
                         "l3_exists": 0, "l3_prefetched": 0, "l3_prefetch_failed": 0, "l3_put": 0,
                         "l3_put_failed": 0, "l3_lost": 0}

    def _spec(self, keys: Iterable[OffloadKey]) -> TieredSlotsSpec:
        keys = list(keys)
        return TieredSlotsSpec([self._entries[k].slot for k in keys], [page_key(self.namespace, k) for k in keys])

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self.counters["lookups"] += 1
        self.poll_l3()
        entry = self._entries.get(key)
        if entry is None:
            return self._lookup_l3(key)
        if entry.fetching:
            return LookupResult.RETRY      # not a hit before the record verified
        if not entry.ready:
            return LookupResult.HIT_PENDING
        self.counters["hits"] += 1
        return LookupResult.HIT

    # --- L3 ---------------------------------------------------------------------------------------
    def _l3_up(self) -> bool:
        return self.l3 is not None and not self.l3.degraded and self._l3_ready()

    def _lookup_l3(self, key: OffloadKey) -> LookupResult:
        if key in self._asking:
            return LookupResult.RETRY
        if not self._l3_up():
            return LookupResult.MISS
        answer = self._answers.get(key)
        if answer is None or time.monotonic() - answer[1] >= ANSWER_TTL_S:
            future = self.l3.exists([page_key(self.namespace, key)])
            op = _L3Op("exists", [key], [], future, self._generation)
            self._asking[key] = op
            self._ops.append(op)
            self.counters["l3_exists"] += 1
            self.poll_l3()                  # a link that answered at once
            return LookupResult.RETRY if key in self._asking else self._lookup_l3_answered(key)
        return self._lookup_l3_answered(key)

    def _lookup_l3_answered(self, key: OffloadKey) -> LookupResult:
        if key in self._entries:
            return LookupResult.RETRY
        present, _ = self._answers[key]
        if not present:
            return LookupResult.MISS
        slots = self._take_slots(1, set())
        if slots is None:
            return LookupResult.MISS        # L2 is full of pages in use: L3's page waits for later
        entry = _Entry(slots[0], fetching=True)
        self._entries[key] = entry
        future = self.l3.get_into([page_key(self.namespace, key)], slots)
        self._ops.append(_L3Op("prefetch", [key], slots, future, self._generation, [entry]))
        self._asking[key] = self._ops[-1]
        return LookupResult.RETRY

    def _put(self, keys: list[OffloadKey]) -> None:
        if not keys or not self._l3_up():
            return
        entries = [self._entries[k] for k in keys]
        for entry in entries:
            entry.putting = True
        slots = [e.slot for e in entries]
        future = self.l3.put_from([page_key(self.namespace, k) for k in keys], slots)
        self._ops.append(_L3Op("put", keys, slots, future, self._generation, entries))

    def poll_l3(self) -> None:
        """Take in the L3 jobs whose results came back (cheap; every entry point calls it)."""
        if not self._ops:
            return
        still = []
        for op in self._ops:
            if op.future.done():
                self._finish(op)
            else:
                still.append(op)
        self._ops = still

    def _finish(self, op: _L3Op) -> None:
        future = op.future
        failed = future.cancelled() or future.exception() is not None
        lost = self.l3 is not None and self.l3.lost     # a lost job reads as failed; L3Jobs says which
        current = op.generation == self._generation
        if op.kind == "exists":
            if self._asking.get(op.keys[0]) is op:
                del self._asking[op.keys[0]]
            if current and not failed:
                if len(self._answers) >= MAX_ANSWERS:
                    now = time.monotonic()
                    self._answers = {k: a for k, a in self._answers.items() if now - a[1] < ANSWER_TTL_S}
                self._answers[op.keys[0]] = (future.result() >= 1, time.monotonic())
            return
        ok = [False] * len(op.keys) if failed else [bool(x) for x in future.result()]
        if op.kind == "prefetch":
            key, entry = op.keys[0], op.entries[0]
            if self._asking.get(key) is op:
                del self._asking[key]
            entry.fetching = False
            self.counters["l3_prefetched" if ok[0] else "l3_prefetch_failed"] += 1
            if ok[0]:
                entry.ready = True
            else:
                self._answers[key] = (False, time.monotonic())
        else:
            self.counters["l3_put"] += sum(ok)
            self.counters["l3_put_failed"] += len(ok) - sum(ok)
            for entry in op.entries:
                entry.putting = False
        for key, slot, entry, landed in zip(op.keys, op.slots, op.entries, ok):
            if lost:
                # What the worker did to the slot is unknown: it is never handed out again.
                self.counters["l3_lost"] += 1
                self.lost_slots.append(slot)
                if self._entries.get(key) is entry:
                    del self._entries[key]
            elif not current or self._entries.get(key) is not entry:
                self._free.append(slot)     # its entry went with a reset: the slot comes back now
            elif op.kind == "prefetch" and not landed:
                del self._entries[key]
                self._free.append(slot)

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
        victims = [k for k, e in self._entries.items()
                   if e.ready and e.readers == 0 and not e.putting and k not in protected][:count]
        if len(victims) < count:
            return None
        for key in victims:
            self._free.append(self._entries.pop(key).slot)
        return victims

    def _take_slots(self, count: int, protected: set[OffloadKey]) -> list[int] | None:
        """``count`` free slots, evicting ready unused pages least recently used first; None when
        the pages in use leave too few."""
        if count > len(self._free):
            victims = self._evict(count - len(self._free), protected)
            if victims is None:
                return None
            self._evicted.extend(victims)
            self.counters["evicted"] += len(victims)
            self._events.append(OffloadingEvent(keys=victims, medium=Medium.CPU, removed=True))
        return [self._free.pop() for _ in range(count)]

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        self.poll_l3()
        keys = list(keys)
        new = [k for k in keys if k not in self._entries]
        self._evicted: list[OffloadKey] = []
        slots = self._take_slots(len(new), set(keys))
        if slots is None:
            self.counters["store_refused"] += 1
            return None
        for key, slot in zip(new, slots):
            self._entries[key] = _Entry(slot)
        evicted, self._evicted = self._evicted, []
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
            self._put(stored)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def take_events(self) -> Iterable[OffloadingEvent]:
        events, self._events = self._events, []
        yield from events

    def has_pending_work(self) -> bool:
        self.poll_l3()
        return bool(self._ops)

    def reset_cache(self) -> None:
        # vLLM fences its own jobs of the old generation before new ones start (see its CPU
        # manager); L3 jobs still in flight keep their slots until their results are in.
        self.poll_l3()
        self._generation += 1
        busy = {slot for op in self._ops for slot in op.slots} | set(self.lost_slots)
        self._entries.clear()
        self._asking.clear()
        self._answers.clear()
        self._free = [s for s in range(self.num_slots - 1, -1, -1) if s not in busy]

    def shutdown(self) -> None:
        if self.l3 is not None:
            self.l3.close(drain=False, deadline=time.monotonic() + 5.0)

    @property
    def free_slots(self) -> int:
        return len(self._free)
