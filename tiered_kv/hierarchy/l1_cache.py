"""A small L1 prefix cache built on the two halves: the engine side for engines without one.

Pages of token chains (by page key) over an engine-like device pool, least recently used first out.
It reports the engine's L1 events to the manager (inserted, hit, about to be evicted), hands the
resulting store plans to the worker, and serves a request in the order a serving engine would:

    match = l1.lookup(request_id, keys)     # L1 hit + the manager's L2 / L3 hit; None: ask again
    l1.start(request_id, match)             # the manager's prefetch, L3 -> L2
    l1.ready(request_id)                    # the prefetch policy says the request may run
    served = l1.run(request_id)             # L2 -> L1 loads, the prefill of the rest, stores

The replay, the benchmarks and the tests use it; an engine with its own prefix tree calls the
manager and the worker the same way from its own scheduler and workers.

``fill(keys, pages)`` stands for the prefill (the model writing KV into the pages) and
``verify(keys, pages) -> [bool]`` checks loaded pages; both are optional (``--simulate`` has none).
An engine whose model really computes passes ``prefill(Prefill)`` instead: it is called in ``run``
after the load was issued and before any store, with the load's handle, so the model waits for
each layer of the loaded prefix just before it reads it (``load.wait_layer(i)``), and the stores
read the pages it wrote; ``verify`` then runs after it, so checking never serialises load and compute.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..model.completion import DONE, AllOf, Completion, as_completion
from ..errors import PoolError
from ..model.keys import check_keys
from .manager import CacheManager, LoadPlan, Match


@dataclass(frozen=True)
class Served:
    """What one request got: pages served from each tier (``l3_pages``: read from L3 by its
    prefetch, ``LoadPlan.pages_from_l3``; not the lookup's ``Match.l3_pages``), pages computed, and
    loaded pages that were wrong."""

    l1_pages: int
    l2_pages: int
    l3_pages: int
    computed_pages: int
    uncached_pages: int  # computed but not kept: L1 could not make room
    verified_pages: int
    wrong_pages: int


@dataclass(frozen=True)
class Prefill:
    """One request's prefill as ``L1PrefixCache.run`` hands it to the engine's model.

    ``keys[i]`` is held in device page ``pages[i]``: the first ``l1_pages`` were on L1 already, the
    next ``loaded_pages`` are being loaded (``load.wait_layer(layer)`` before reading a layer of
    them), the rest are the model's to compute (their KV written before ``prefill`` returns).
    """

    request_id: Any
    keys: list[str]
    pages: list[int]
    l1_pages: int
    loaded_pages: int
    load: Any

    @property
    def computed_pages(self) -> int:
        return len(self.pages) - self.l1_pages - self.loaded_pages


@dataclass
class L1Stats:
    """What the requests were served from, counted in ``run`` (metrics read it at scrape time)."""

    requests: int = 0
    pages: int = 0  # full pages of the prompts run
    l1_pages: int = 0
    l2_pages: int = 0
    l3_pages: int = 0
    computed_pages: int = 0


@dataclass
class _Request:
    keys: list[str]
    l1_pages: int
    match: Match | None = None


class L1PrefixCache:
    """L1 pages keyed by page key over ``num_pages`` engine pages (``reserved`` never used)."""

    def __init__(self, num_pages: int, manager: CacheManager, worker: Any, *, reserved: Iterable[int] = (),
                 fill: Callable[[list[str], list[int]], None] | None = None,
                 verify: Callable[[list[str], list[int]], list[bool]] | None = None,
                 prefill: Callable[[Prefill], None] | None = None) -> None:
        reserved = set(reserved)
        self.manager = manager
        self.worker = worker
        self.fill = fill
        self.verify = verify
        self.prefill = prefill
        self._free: list[int] = [p for p in range(num_pages) if p not in reserved][::-1]
        self.capacity = len(self._free)
        if self.capacity <= 0:
            raise PoolError(f"an L1 of {num_pages} pages with {len(reserved)} reserved holds nothing")
        self._pages: OrderedDict[str, int] = OrderedDict()  # key -> device page, least recent first
        self._locks: dict[str, int] = {}
        self._busy: dict[int, Completion] = {}  # device page -> stores that still read it
        self._pending: list[tuple[list[int], Completion]] = []
        self._requests: dict[Any, _Request] = {}
        self.evictions = 0
        self.stats = L1Stats()

    # --- queries -----------------------------------------------------------------------------
    @property
    def used_pages(self) -> int:
        return len(self._pages)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def match(self, keys: Sequence[str]) -> int:
        run = 0
        for k in keys:
            if k not in self._pages:
                break
            run += 1
        return run

    # --- the request flow --------------------------------------------------------------------
    def lookup(self, request_id: Any, keys: Sequence[str]) -> Match | None:
        """The request's hit on every tier; None while L3's answer is pending (ask again)."""
        req = self._requests.get(request_id)
        if req is None:
            keys = check_keys(keys)
            l1 = self.match(keys)
            self._lock(keys[:l1])  # our L1 hit must not be evicted for other requests meanwhile
            req = self._requests[request_id] = _Request(keys, l1)
        self.poll()
        match = self.manager.lookup(request_id, req.keys, req.l1_pages)
        req.match = match
        return match

    def start(self, request_id: Any) -> int:
        """Start the request's prefetch; returns the L3 pages asked for."""
        req = self._request(request_id)
        if req.match is None:
            raise PoolError(f"request {request_id!r} has no decided lookup yet")
        return self.manager.start_prefetch(request_id, req.keys, req.match)

    def ready(self, request_id: Any) -> bool:
        return self.manager.prefetch_ready(request_id)

    def run(self, request_id: Any) -> Served:
        """Schedule the request: load its L2 / L3 hit into L1, compute the rest, store per policy."""
        req = self._request(request_id)
        del self._requests[request_id]
        keys, l1 = req.keys, req.l1_pages
        match = req.match or Match(l1, 0, 0, self.manager.page_size)
        try:
            wanted = keys[l1:l1 + match.l2_pages + match.l3_pages]
            plan = self.manager.prepare_load(wanted, request_id)
            rest = keys[l1 + len(plan):]
            pages = self._allocate(len(plan) + len(rest), protect=keys[:l1])
            loaded_pages = pages[:len(plan)]
            if len(loaded_pages) < len(plan):  # L1 cannot hold the whole hit: load what fits
                cut = len(loaded_pages)
                self.manager.complete_load(LoadPlan(plan.keys[cut:], plan.slots[cut:], plan.from_l3[cut:]))
                plan = LoadPlan(plan.keys[:cut], plan.slots[:cut], plan.from_l3[:cut])
                rest = []
            handle = self.worker.load(plan, loaded_pages)
            self.manager.complete_load(plan, handle)
            computed_pages = pages[len(plan):]
            computed_keys = rest[:len(computed_pages)]
            if self.prefill is not None:
                held = [self._pages[k] for k in keys[:l1]]
                self.prefill(Prefill(request_id, keys[:l1] + plan.keys + computed_keys,
                                     held + loaded_pages + computed_pages, l1, len(plan), handle))
            wrong = verified = 0
            if self.verify is not None and len(plan):
                sync = getattr(handle, "synchronize", None)
                if sync is not None:
                    sync()
                ok = self.verify(plan.keys, loaded_pages)
                verified, wrong = len(ok), len(ok) - sum(ok)
            if self.fill is not None and computed_keys:
                self.fill(computed_keys, computed_pages)
            new_keys = plan.keys + computed_keys
            new_pages = loaded_pages + computed_pages
            for k, p in zip(new_keys, new_pages):
                if k in self._pages:
                    # Another request made this page meanwhile: keep its page, give ours back once
                    # the load that may still write into it is done.
                    self._pending.append(([p], as_completion(handle) if p in loaded_pages else DONE))
                    continue
                self._pages[k] = p
            self._touch(keys[:l1])
            if l1:
                self._store(self.manager.on_l1_hit(keys[:l1]), keys[:l1])
            if new_keys:
                self._store(self.manager.on_l1_inserted(new_keys), new_keys)
        finally:
            self._unlock(keys[:l1])
        self.poll()
        # Each loaded page counts on the tier it came from: read from L3 by this request's
        # prefetch, or on L2 already (the L2 hit, and pages of the L3 part that L2 still held).
        served = Served(l1, plan.pages_from_l2, plan.pages_from_l3, len(rest), len(rest) - len(computed_keys), verified, wrong)
        st = self.stats
        st.requests += 1
        st.pages += len(keys)
        st.l1_pages += served.l1_pages
        st.l2_pages += served.l2_pages
        st.l3_pages += served.l3_pages
        st.computed_pages += served.computed_pages
        return served

    def abort(self, request_id: Any) -> None:
        req = self._requests.pop(request_id, None)
        if req is not None:
            self._unlock(req.keys[:req.l1_pages])
        self.manager.abort(request_id)

    # --- stores and completions --------------------------------------------------------------
    def _store(self, plan, keys: Sequence[str]) -> None:
        if plan is None or not len(plan):
            return
        pages = [self._pages[keys[i]] for i in plan.positions]
        done = self.worker.store(plan, pages)
        for p in pages:
            previous = self._busy.get(p)
            self._busy[p] = done if previous is None or previous.done() else AllOf([previous, done])

    def poll(self) -> None:
        """Hand finished stores to the manager (they become resident on L2 now)."""
        self._hand_over(self.worker.finished_stores())
        self.manager.poll()
        self._reap()

    def drain_stores(self) -> None:
        """Wait for every store in flight and hand it to the manager: a store waited for is the
        manager's to complete, or its pages would never read as on L2."""
        self._hand_over(self.worker.drain())

    def _hand_over(self, plans) -> None:
        for plan in plans:
            self.manager.complete_store(plan, True)

    def _reap(self) -> None:
        if self._pending:
            still = []
            for pages, done in self._pending:
                if done.done():
                    self._free.extend(pages)
                else:
                    still.append((pages, done))
            self._pending = still

    # --- L1 allocation and eviction ----------------------------------------------------------
    def _allocate(self, count: int, protect: Sequence[str]) -> list[int]:
        """Up to ``count`` free pages, evicting unlocked pages least recently used first (and
        telling the manager first, so ``write_back`` can save them)."""
        self._reap()
        if len(self._free) < count:
            self._evict(count - len(self._free), set(protect))
            self._reap()
            if len(self._free) < count and self._pending:
                self.drain_stores()  # GPU: the evicted pages' backups must land before reuse
                self.poll()
        take = min(count, len(self._free))
        pages = [self._free.pop() for _ in range(take)]
        return pages

    def _evict(self, count: int, protect: set[str]) -> None:
        victims: list[tuple[str, int]] = []
        for k, p in self._pages.items():
            if len(victims) >= count:
                break
            if self._locks.get(k) or k in protect:
                continue
            victims.append((k, p))
        if not victims:
            return
        for k, _ in victims:
            del self._pages[k]
        self.evictions += len(victims)
        keys = [k for k, _ in victims]
        plan = self.manager.on_l1_evicting(keys)
        done: Completion = DONE
        if plan is not None and len(plan):
            done = self.worker.store(plan, [victims[i][1] for i in plan.positions])
        for _, p in victims:
            busy = self._busy.pop(p, None)
            gate = done if busy is None or busy.done() else AllOf([busy, as_completion(done)])
            self._pending.append(([p], gate))

    # --- locks -------------------------------------------------------------------------------
    def _lock(self, keys: Sequence[str]) -> None:
        for k in keys:
            self._locks[k] = self._locks.get(k, 0) + 1

    def _unlock(self, keys: Sequence[str]) -> None:
        for k in keys:
            n = self._locks.get(k, 0) - 1
            if n <= 0:
                self._locks.pop(k, None)
            else:
                self._locks[k] = n

    def _touch(self, keys: Sequence[str]) -> None:
        for k in keys:
            if k in self._pages:
                self._pages.move_to_end(k)

    def _request(self, request_id: Any) -> _Request:
        try:
            return self._requests[request_id]
        except KeyError:
            raise PoolError(f"unknown request {request_id!r}: call lookup first") from None

    # --- close -------------------------------------------------------------------------------
    def close(self) -> None:
        """Abort open requests, finish stores, close the manager (which frees every L2 slot)."""
        for request_id in list(self._requests):
            self.abort(request_id)
        self.drain_stores()
        self.manager.close()
        self._reap()


__all__ = ["L1PrefixCache", "L1Stats", "Prefill", "Served"]
