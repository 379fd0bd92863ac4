"""The metadata half (scheduler side): page keys in, hit lengths and decisions out.

A two-phase protocol over page keys, as vLLM's offloading manager has it:

    match = manager.lookup(request_id, keys, l1_pages)   # None: L3's answer is not back, ask again
    manager.start_prefetch(request_id, keys, match)      # locks the L2 hit, L3 -> L2 for the rest
    manager.prefetch_ready(request_id)                   # may the request be scheduled (policy)?
    plan = manager.prepare_load(keys, request_id, l1_pages=l1_pages)  # lock the decided hit: slots out
    ... the worker loads plan.slots into L1 pages (TransferHalf.load: plan.handle is the load) ...
    manager.complete_load(plan)                          # unlocked; slots busy until the copy is done

    plan = manager.on_l1_inserted(keys)                  # write policy: a StorePlan or None
    ... the worker backs the pages up into plan.slots and seals them ...
    manager.complete_store(plan, success)                # resident only after a successful store

Rules it keeps (DESIGN.md, "What users of the anchors hit"):
- lookups are O(pages) and never wait on I/O: an L3 ``exists`` runs on the controller and the
  lookup says "not yet" (None) until it is back, for at most the policy's ``lookup_wait``: then it
  decides without L3 (``lookups_l3_late``), drops the ``exists`` and never waits for it again;
- only pages beyond the engine's own L1 hit are asked for and fetched, and a request's prefetch
  and load cover no more than its lookup decided (the minimum hit and the ranks' agreement);
- no prefetch starts before its hit length is decided, above ``min_hit_tokens`` and agreed by the
  ranks (``agree`` under ``policies.agree_deadline_s``: a rank that does not answer by then means
  no hit, never a hang);
- a page is present on L2 only after its store completed with success and on L3 only after a put
  returned True; a page gone from L3 between lookup and prefetch shortens the hit, and what L3's
  own answers say is gone (a lookup's ``exists``, a prefetch's misses) reads as gone from then on,
  so later stores put it again;
- slots are counted exactly: every slot a prefetch, store or resident holds is freed through the
  allocator, with the completion of the last copy that may touch it (a plan carries its worker's
  copy handle, so completing it without one is safe too; a store or load still in flight at
  ``close`` keeps its slots until it is completed).

Needs no CUDA and no host memory: ``slots`` is a ``HostPool`` in one process or a bare
``SlotAllocator`` where the scheduler lives elsewhere; L3 is ``L3Jobs`` (every call a plain job for
the worker side, every answer its result) or None. Given an ``L3Controller``, the manager runs its
worker side in this process over a ``LocalLink``.
One thread owns a manager: the scheduler's.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model.completion import AllOf, as_completion
from ..errors import ConfigError, IndexValidationError, PoolError
from ..model.integers import as_int
from ..model.keys import check_keys
from .agree_deadline import AgreeTimeout, DeadlineAgree, DirectAgree, agree_with_deadline
from .l3_jobs import L3Jobs, heard_from_l3
from .lookup_deadline import Deadlines
from .index import RESIDENT, Entry, PageIndex, free_slot_count, l3_only_bound
from .policies import Policies, WritePolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Match:
    """What a lookup found per tier, in prompt order: the first ``l1_pages`` on L1 (the engine's),
    then ``l2_pages`` on L2, then ``l3_pages`` that L3 holds. Pages of that last part may be on L2
    too (the head of a prefix left L2 before its tail did; under write_back a tail still on L2 is
    not on L3 yet): the prefetch reads only the pages L2 lacks and uses the others from L2. How
    many pages a load actually read from L3 is ``LoadPlan.pages_from_l3``."""

    l1_pages: int
    l2_pages: int
    l3_pages: int
    page_size: int

    def __post_init__(self) -> None:
        for name in ("l1_pages", "l2_pages", "l3_pages", "page_size"):
            value = getattr(self, name)
            if as_int(value) is None or value < (1 if name == "page_size" else 0):
                raise ConfigError(f"Match.{name} must be an int >= {1 if name == 'page_size' else 0}, got {value!r}")

    @property
    def pages(self) -> int:
        return self.l1_pages + self.l2_pages + self.l3_pages

    def tokens(self, tier: str) -> int:
        return getattr(self, f"{tier}_pages") * self.page_size


class _CarriesHandle:
    """A plan's ``handle``: the worker's copy of it in this process (``TransferHalf`` sets it),
    which ``complete_load`` / ``complete_store`` wait on when no completion is passed, so the
    plain call never frees a slot under a running copy. Plans pickle without it: a handle (a
    CUDA event) is of the process that made it."""

    handle: object

    def __getstate__(self) -> dict:
        return {**self.__dict__, "handle": None}


@dataclass
class LoadPlan(_CarriesHandle):
    """L2 -> L1: ``keys[i]`` is read from ``slots[i]``; the pages stay locked until completed.

    ``from_l3[i]``: whether the request's own prefetch read page ``i`` from L3 (False, or no entry:
    it was on L2 already), so engines and the replay count each loaded page on the tier it came
    from (``pages_from_l3`` / ``pages_from_l2``)."""

    keys: list[str]
    slots: list[int]
    from_l3: list[bool] = field(default_factory=list)
    completed: bool = field(default=False, repr=False, compare=False)  # complete_load ran
    handle: object = field(default=None, repr=False, compare=False)  # the worker's load (see _CarriesHandle)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def pages_from_l3(self) -> int:
        """Pages of this load the request's prefetch read from L3."""
        return sum(self.from_l3[:len(self.keys)])

    @property
    def pages_from_l2(self) -> int:
        """Pages of this load that were on L2 before the request's prefetch."""
        return len(self.keys) - self.pages_from_l3


@dataclass
class StorePlan(_CarriesHandle):
    """L1 -> L2: the page at ``positions[i]`` of the keys the engine passed goes to ``slots[i]``."""

    keys: list[str]
    slots: list[int]
    positions: list[int]
    completed: bool = field(default=False, repr=False, compare=False)  # complete_store ran
    handle: object = field(default=None, repr=False, compare=False)  # the worker's backup (see _CarriesHandle)

    def __len__(self) -> int:
        return len(self.keys)


def check_copy_plan(plan: Any, kind: type, device_pages: Sequence[int], what: str) -> None:
    """A worker side's check of the plan it is asked to copy: the kind of plan ``prepare_load`` /
    ``prepare_store`` made, and one device page per key."""
    if not isinstance(plan, kind):
        raise IndexValidationError(f"{what}: expected the {kind.__name__} the cache manager made, got {type(plan).__name__}")
    if len(device_pages) != len(plan):
        raise IndexValidationError(f"{what}: {len(plan)} slots but {len(device_pages)} device pages")


@dataclass
class _Prefetch:
    keys: list[str]
    slots: list[int]
    future: concurrent.futures.Future | None
    locked: list[str]  # the L2 hit (and the L3 part's pages on L2), locked until the request is scheduled
    started: float
    wait_s: float
    l1_pages: int = 0  # the match's L1 hit: the prompt's keys from here on were asked for
    start_key: str | None = None  # the prompt's key at l1_pages (None: the whole prompt is on L1)


@dataclass
class _Decision:
    """What a request's lookup decided: the L1 hit it looked beyond, and the keys of its L2 / L3
    hit after the minimum and the ranks' agreement. The request's prefetch and load cover no more."""

    l1_pages: int
    keys: list[str]


@dataclass
class ManagerStats:
    lookups: int = 0
    lookups_pending: int = 0  # "not yet" answers
    l2_hit_pages: int = 0  # as the lookups saw them: pages of the hit on L2
    l3_hit_pages: int = 0  # as the lookups saw them: pages of the hit to be read from L3
    below_min_hit: int = 0
    agree_timeouts: int = 0
    lookups_l3_late: int = 0  # decided without L3: its exists had not answered within the policy's lookup_wait
    prefetches_started: int = 0
    prefetches_completed: int = 0
    prefetches_cancelled: int = 0
    prefetches_timed_out: int = 0
    prefetch_pages_landed: int = 0
    prefetch_pages_missing: int = 0  # gone from L3 between lookup and prefetch
    stores: int = 0
    stores_failed: int = 0
    stores_skipped: int = 0  # no L2 slot free for them
    l2_evictions: int = 0
    l3_puts: int = 0
    l3_puts_failed: int = 0
    load_pages: int = 0
    prefetch_seconds_sum: float = 0.0  # over the completed prefetches (a counter, not a list: no growth)


class CacheManager:
    """The metadata half over one L2 (``slots``) and, optionally, one L3 (``l3``).

    Args:
        slots: the L2 slot allocator (``HostPool`` or ``SlotAllocator``) with ``num_slots``.
        page_size: tokens per page (for ``min_hit_tokens`` and the timeout policy); over a
            ``HostPool`` its ``spec.page_size`` (another is a ConfigError naming both).
        policies: write / prefetch / admission policies and their numbers.
        l3: ``L3Jobs`` over a link to the worker side (the scheduler's view of L3: every call a job);
            or an ``L3Controller``, whose worker side then runs in this process; None for a
            two-tier cache.
        agree: ``agree(hit_pages) -> int``, settling ranks on one hit length (the minimum); it runs
            on a thread of its own and the lookup waits for it at most ``policies.agree_deadline_s``
            (past that, or when it raises ``AgreeTimeout``: no hit, recompute).
        max_prefetch_slots: L2 slots prefetches may hold at once (default: half of L2).
        clock: ``time.monotonic`` or a test clock.
    """

    def __init__(self, slots: Any, *, page_size: int, policies: Policies = Policies(),
                 l3: L3Jobs | Any = None, agree: Callable[[int], int] | None = None,
                 max_prefetch_slots: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
            raise ConfigError(f"page_size must be an int > 0, got {page_size!r}")
        if not all(hasattr(slots, name) for name in ("num_slots", "allocate", "free", "reap")):
            raise ConfigError(f"slots must be a HostPool or a SlotAllocator, got {type(slots).__name__}")
        pool_page_size = getattr(getattr(slots, "spec", None), "page_size", page_size)
        if pool_page_size != page_size:  # hit lengths would count tokens of another page size
            raise ConfigError(f"page_size {page_size} differs from the host pool's page size {pool_page_size}: "
                              "pass the pool's spec.page_size")
        if not isinstance(policies, Policies):
            raise ConfigError(f"policies must be a Policies, got {type(policies).__name__}")
        if l3 is not None and not isinstance(l3, L3Jobs):
            # A controller here: its worker side runs in this process (imported only then, so a
            # scheduler given L3Jobs over a link never loads the controller).
            from .links import local_l3

            l3 = local_l3(l3)
        if agree is not None and not callable(agree):
            raise ConfigError(f"agree must be a callable agree(hit_pages) -> int, got {type(agree).__name__}")
        if max_prefetch_slots is not None and (isinstance(max_prefetch_slots, bool)
                                               or not isinstance(max_prefetch_slots, int)):
            raise ConfigError(f"max_prefetch_slots must be an int, got {max_prefetch_slots!r}")
        self.allocator = slots
        self.num_slots: int = slots.num_slots
        self.page_size = page_size
        self.policies = policies
        self.l3: L3Jobs | None = l3
        if l3 is not None:
            l3.bind(slots)  # a slot a job names stays held until the job's result is in
        self._agree: DeadlineAgree | DirectAgree | None = None
        self.agree = agree
        self.max_prefetch_slots = self.num_slots // 2 if max_prefetch_slots is None else max_prefetch_slots
        if not 0 <= self.max_prefetch_slots <= self.num_slots:
            raise ConfigError(f"max_prefetch_slots must be in 0..{self.num_slots}, got {self.max_prefetch_slots}")
        self.clock = clock
        self.index = PageIndex(slots, max_l3_only=l3_only_bound(l3, self.num_slots))
        self.stats = ManagerStats()
        self._lookups: dict[Any, _Lookup] = {}
        self._deadlines = Deadlines()
        self._prefetches: dict[Any, _Prefetch] = {}
        self._decided: dict[Any, _Decision] = {}  # until the request loads (prepare_load) or aborts
        self._orphans: list[tuple[list[int], concurrent.futures.Future]] = []  # cancelled, reads running
        self._puts: list[tuple[list[str], concurrent.futures.Future]] = []
        self._prefetch_slots = 0
        self._closed = False

    @property
    def agree(self) -> Callable[[int], int] | None:
        """The ``agree(hit_pages) -> int`` hook (None: a single rank); settable, e.g. once the
        process group exists."""
        return None if self._agree is None else self._agree.hook

    @agree.setter
    def agree(self, hook: Callable[[int], int] | None) -> None:
        if hook is not None and not callable(hook):
            raise ConfigError(f"agree must be a callable agree(hit_pages) -> int, got {type(hook).__name__}")
        if self._agree is not None:
            self._agree.close()
        self._agree = None if hook is None else agree_with_deadline(hook, self.policies.agree_deadline_s)

    # --- lookups -----------------------------------------------------------------------------
    def lookup(self, request_id: Any, keys: Sequence[str], l1_pages: int = 0) -> Match | None:
        """Hit lengths beyond the engine's ``l1_pages``; None while L3's answer is pending.

        ``keys``: the whole prompt's page keys (the first ``l1_pages`` are the engine's L1 hit).
        The answer is the request's decided hit: its prefetch and its load cover no more, so ranks
        that agreed on a length, and a hit below ``min_hit_tokens`` (none), load exactly that. It
        is kept until the request loads (``prepare_load``) or goes away (``abort``)."""
        self._check_open()
        _check_request_id(request_id)
        keys = check_keys(keys)
        # numpy ints count (an engine's page counts often are); bools and floats do not.
        count = as_int(l1_pages)
        if count is None or not 0 <= count <= len(keys):
            raise ConfigError(f"l1_pages must be an int in 0..{len(keys)}, got {l1_pages!r}")
        l1_pages = count
        self._decided.pop(request_id, None)  # an earlier answer is not this one's
        self.poll()
        l2 = self.index.l2_run(keys, l1_pages)
        rest = tuple(keys[l1_pages + l2:])
        l3 = 0
        if rest and self.l3 is not None and not self.l3.degraded:
            pending = self._lookups.get(request_id)
            if pending is None or pending.rest != rest:
                self._lookups[request_id] = self._ask_l3(rest)
                self.stats.lookups_pending += 1
                return None
            future = pending.future
            late = not future.done() and time.monotonic() >= pending.give_up_at
            if not future.done() and not late:
                self.stats.lookups_pending += 1
                return None
            del self._lookups[request_id]
            if late:  # L3 is slow or hung: decide without it, and stop asking
                self.stats.lookups_l3_late += 1
                self.l3.cancel(future)
            l3 = future.result() if future.done() and not future.cancelled() else 0
            if l3 < len(rest) and heard_from_l3(future):
                # L3 says rest[l3] is gone (an eviction elsewhere, a restart). Keys are chained, so
                # the pages after it cannot be hit until it is back: they read as gone too, and the
                # next stores put them again (put-if-absent: one present costs one check). An
                # answer older than a put that landed meanwhile costs the same, no more.
                self.index.mark_l3_missing(rest[l3:])
            # Pages L3 lacks but L2 still holds go on the hit (write_back keeps a tail on L2
            # only while its head, evicted first, went down to L3): no read needed for them.
            l3 += self.index.l2_run(rest, l3)
        self._lookups.pop(request_id, None)
        self.stats.lookups += 1
        match = self._decide(l1_pages, l2, l3, rest)
        self._decided[request_id] = _Decision(l1_pages, keys[l1_pages:match.pages])
        return match

    def _ask_l3(self, rest: tuple[str, ...]) -> _Lookup:
        """Send L3's ``exists`` for ``rest``, to be waited for at most the policy's lookup wait."""
        future = self.l3.exists(rest)  # type: ignore[union-attr]
        wait = self.policies.lookup_wait(len(rest) * self.page_size)
        give_up_at = time.monotonic() + wait
        waited = future if math.isinf(wait) else self._deadlines.bounded(future, give_up_at)
        return _Lookup(rest, future, waited, give_up_at)

    def _decide(self, l1: int, l2: int, l3: int, rest: Sequence[str] = ()) -> Match:
        if (l2 + l3) * self.page_size < self.policies.min_hit_tokens:
            if l2 + l3:
                self.stats.below_min_hit += 1
            l2 = l3 = 0
        if self._agree is not None:
            try:
                agreed = self._agree(l2 + l3)
            except TimeoutError:  # AgreeTimeout, or a process group's own timeout: no hit, no hang
                self.stats.agree_timeouts += 1
                agreed = 0
            pages = as_int(agreed)
            if pages is None:
                raise ConfigError(f"agree(hit_pages) must return an int, got {agreed!r}")
            agreed = max(0, min(pages, l2 + l3))
            if agreed * self.page_size < self.policies.min_hit_tokens:
                # Every rank gets the same answer and applies the same minimum: still one length.
                agreed = 0
            l2, l3 = min(l2, agreed), max(0, agreed - l2)
        # The L3 part's pages that L2 holds are hits on L2 (the prefetch reads only the others).
        on_l2 = sum(1 for k in rest[:l3] if self.index.is_resident(k))
        self.stats.l2_hit_pages += l2 + on_l2
        self.stats.l3_hit_pages += l3 - on_l2
        return Match(l1, l2, l3, self.page_size)

    # --- prefetch L3 -> L2 -------------------------------------------------------------------
    def start_prefetch(self, request_id: Any, keys: Sequence[str], match: Match) -> int:
        """Lock the L2 hit and the pages of the L3 hit that L2 holds, and start reading the others
        from L3 into fresh slots; returns the pages asked of L3."""
        self._check_open()
        _check_request_id(request_id)
        if request_id in self._prefetches:
            raise PoolError(f"request {request_id!r} already has a prefetch")
        keys = check_keys(keys)
        if not isinstance(match, Match):
            raise ConfigError(f"start_prefetch: match must be the Match lookup returned, got {type(match).__name__}")
        if match.page_size != self.page_size:
            raise ConfigError(f"start_prefetch: the match counts pages of {match.page_size} tokens, this cache's are {self.page_size}")
        if match.pages > len(keys):
            raise ConfigError(f"start_prefetch: the match covers {match.pages} pages but {len(keys)} keys were given")
        start = match.l1_pages
        decision = self._decided.get(request_id)
        if decision is not None:
            # A match larger than the lookup decided (another request's, or built by the caller)
            # would lock and read pages the load may not use.
            hit = min(match.l2_pages + match.l3_pages, _common_run(keys[start:], decision.keys))
            match = Match(start, min(match.l2_pages, hit), max(0, hit - match.l2_pages), self.page_size)
        l2_keys = keys[start:start + match.l2_pages]
        # Pages may have left L2 since the lookup (another request's allocation): keep the run.
        run = self.index.l2_run(l2_keys)
        l2_keys = l2_keys[:run]
        self.index.lock(l2_keys)
        l3_keys: list[str] = []  # read from L3 into fresh slots
        held: list[str] = []  # pages of the L3 part that L2 holds: locked and used, not read
        slots: list[int] = []
        # match.pages counts the L1 part too: the L3 part ends there, not l1_pages past it.
        part = self._read_part(keys[start + run:start + match.l2_pages], keys[start + match.l2_pages:match.pages])
        if part:
            l3_keys, held = self._l3_run(part, self._prefetch_budget())
            self.index.lock(held)  # before allocating: making room must not evict the tail
            slots = self._allocate(len(l3_keys), protect=l2_keys) if l3_keys else []
            if len(slots) < len(l3_keys):
                # L2 could not make room for every read: the run ends before the first read
                # without a slot, and the pages held after that point are not part of it.
                l3_keys, kept = self._l3_run(part, len(slots))
                self.index.unlock(held[len(kept):])
                held = kept
        future = None
        if l3_keys:
            future = self.l3.get_into(l3_keys, slots)  # type: ignore[union-attr]
            self._prefetch_slots += len(slots)
            self.stats.prefetches_started += 1
        # The timeout policy's tokens are those the request waits for: the ones read from L3.
        tokens = len(l3_keys) * self.page_size
        start_key = keys[start] if start < len(keys) else None
        self._prefetches[request_id] = _Prefetch(l3_keys, slots, future, l2_keys + held, self.clock(),
                                                 self.policies.prefetch_wait_s(tokens), start, start_key)
        return len(l3_keys)

    def _read_part(self, lost: Sequence[str], l3_part: Sequence[str]) -> list[str]:
        """What a prefetch serves beyond its L2 run: the pages of the L2 hit that left L2 since
        the lookup (another request's prefetch made room) and that the index still knows on L3,
        then, if all of them are, the match's L3 part. Without L3: nothing."""
        if self.l3 is None:
            return []
        for i, k in enumerate(lost):
            e = self.index.entry(k)
            if e is None or not (e.on_l3 or e.state == RESIDENT):
                return list(lost[:i])
        return [*lost, *l3_part]

    def _l3_run(self, part: Sequence[str], max_reads: int) -> tuple[list[str], list[str]]:
        """The leading run of a match's L3 part that one prefetch can serve, as (pages to read
        from L3, pages L2 holds). Pages resident on L2 are used where they are; the run ends at a
        page whose bytes are still landing on L2 (a store: it cannot be locked, and reading it
        again would put two slots on one key) or where a read beyond ``max_reads`` would start."""
        reads: list[str] = []
        held: list[str] = []
        for k in part:
            entry = self.index.entry(k)
            if entry is not None and entry.state == RESIDENT:
                held.append(k)
            elif (entry is not None and entry.state is not None) or len(reads) >= max_reads:
                break
            else:
                reads.append(k)
        return reads, held

    def _has_l2_slot(self, key: str) -> bool:
        entry = self.index.entry(key)
        return entry is not None and entry.state is not None

    def _prefetch_budget(self) -> int:
        return max(0, self.max_prefetch_slots - self._prefetch_slots)

    def prefetch_ready(self, request_id: Any) -> bool:
        """Whether the request may be scheduled now under the prefetch policy."""
        _check_request_id(request_id)
        p = self._prefetches.get(request_id)
        if p is None or p.future is None or p.future.done():
            return True
        if p.wait_s == 0.0:
            return True
        return not math.isinf(p.wait_s) and self.clock() - p.started >= p.wait_s

    def pending_l3(self, request_id: Any) -> concurrent.futures.Future | None:
        """The L3 work the request waits on now (its lookup's answer, else its prefetch's reads),
        None if nothing: what an asyncio caller awaits (``AsyncCacheManager``). Never cancel it:
        ``abort`` drops it."""
        _check_request_id(request_id)
        lookup = self._lookups.get(request_id)
        if lookup is not None and not lookup.future.done():
            return lookup.waited  # done by the lookup's deadline at the latest
        p = self._prefetches.get(request_id)
        if p is not None and p.future is not None and not p.future.done():
            return p.future
        return None

    def prefetch_wait_left(self, request_id: Any) -> float | None:
        """Seconds until ``prefetch_ready`` turns True by the policy's wait alone (0: ready now;
        None: only once the reads land, ``wait_complete``)."""
        _check_request_id(request_id)
        p = self._prefetches.get(request_id)
        if p is None or p.future is None or p.future.done() or p.wait_s == 0.0:
            return 0.0
        if math.isinf(p.wait_s):
            return None
        return max(0.0, p.wait_s - (self.clock() - p.started))

    def prefetch_done(self, request_id: Any) -> bool:
        _check_request_id(request_id)
        p = self._prefetches.get(request_id)
        return p is None or p.future is None or p.future.done()

    def _finish_prefetch(self, request_id: Any) -> list[str]:
        """Make the landed leading run resident; cancel or orphan the rest; unlock the L2 hit.
        Returns the keys its reads brought from L3 (the landed run)."""
        p = self._prefetches.pop(request_id, None)
        if p is None:
            return []
        self.index.unlock(p.locked)
        if p.future is None:
            return []
        if not p.future.done() and self.l3 is not None and self.l3.cancel(p.future):
            self.stats.prefetches_cancelled += 1
            self._prefetch_slots -= len(p.slots)
            self.allocator.free(p.slots)
            return []
        if not p.future.done():
            # Its reads are running: the slots come back once they have returned, and count
            # against max_prefetch_slots until then (poll).
            self.stats.prefetches_timed_out += 1
            self._orphans.append((p.slots, p.future))
            self.allocator.free(p.slots, completion=p.future)
            return []
        self._prefetch_slots -= len(p.slots)
        landed = self._landed(p.future, len(p.keys))
        self.stats.prefetches_completed += 1
        self.stats.prefetch_seconds_sum += self.clock() - p.started
        self.stats.prefetch_pages_landed += landed
        self.stats.prefetch_pages_missing += len(p.keys) - landed
        for k, s in zip(p.keys[:landed], p.slots[:landed]):
            if self._has_l2_slot(k):
                self.allocator.free([s])  # resident meanwhile through another request
            else:
                self.index.add_resident(k, s, on_l3=True)
        if landed < len(p.keys):
            self.allocator.free(p.slots[landed:])
            if heard_from_l3(p.future):  # the chain is broken at the first miss (see lookup)
                self.index.mark_l3_missing(p.keys[landed:])
        return p.keys[:landed]

    @staticmethod
    def _landed(future: concurrent.futures.Future, n: int) -> int:
        if future.cancelled() or future.exception() is not None:
            return 0
        run = 0
        for ok in future.result():
            if not ok:
                break
            run += 1
        return min(run, n)

    def abort(self, request_id: Any) -> None:
        """The request went away: drop its lookup and prefetch, free what they held."""
        _check_request_id(request_id)
        self._lookups.pop(request_id, None)
        self._decided.pop(request_id, None)
        self._finish_prefetch(request_id)

    # --- loads L2 -> L1 ----------------------------------------------------------------------
    def prepare_load(self, keys: Sequence[str], request_id: Any = None, *, l1_pages: int = 0) -> LoadPlan:
        """Lock the leading run of ``keys[l1_pages:]`` resident on L2 (after the request's
        prefetch) and return their slots for the worker; shorter when pages went missing.

        ``keys``: the pages to load, i.e. the prompt's keys beyond the engine's L1 hit; or the whole
        prompt's keys (as ``lookup`` and ``start_prefetch`` take them) with ``l1_pages`` the L1 hit.
        For a request whose lookup decided a hit beyond an L1 hit, whole keys given without
        ``l1_pages`` are recognised (keys are chained, so the hit's first key sits at one place
        only) and read with its L1 offset: they would otherwise load nothing.

        The load never exceeds what the request's lookup decided, whatever keys are passed: at
        most the decided hit's pages (the minimum hit and the ranks' agreement applied), none
        when the lookup never decided (it answered None and was not asked again). Keys passed
        without a decided lookup (no ``request_id``, or one never looked up) load their resident
        run under the same ``min_hit_tokens``; with an ``agree`` hook that is a PoolError, since
        the ranks never agreed on it.
        """
        self._check_open()
        keys = check_keys(keys)
        count = as_int(l1_pages)
        if count is None or not 0 <= count <= len(keys):
            raise ConfigError(f"prepare_load: l1_pages must be an int in 0..{len(keys)}, got {l1_pages!r}")
        decision: _Decision | None = None
        undecided = False  # looked up, never decided
        if request_id is not None:
            _check_request_id(request_id)
            decision = self._decided.get(request_id)
            undecided = decision is None and request_id in self._lookups
        if decision is None and not undecided and self._agree is not None:
            raise PoolError("prepare_load: the ranks agree on hits (an agree hook is set), and these keys have no "
                            "decided lookup: look the request up first and pass its request_id")
        if request_id is not None:
            count = count or self._l1_offset_of(keys, request_id, decision)
            self._decided.pop(request_id, None)
            self._lookups.pop(request_id, None)  # scheduled: an L3 answer still out is not waited for
        keys = keys[count:]
        read: set[str] = set(self._finish_prefetch(request_id)) if request_id is not None else set()
        if decision is not None:
            keys = keys[:_common_run(keys, decision.keys)]
        elif undecided:
            keys = []
        # One resident run: the L2 hit, the pages the prefetch read and those of the L3 part that
        # were on L2 already, in prompt order.
        run = keys[:self.index.l2_run(keys)]
        if decision is None and len(run) * self.page_size < self.policies.min_hit_tokens:
            run = []  # the lookup's own minimum, for keys no lookup decided
        self.index.lock(run)
        self.index.touch(run)
        self.index.record_hits(run)
        self.stats.load_pages += len(run)
        plan = LoadPlan(run, self.index.slots_of(run), [k in read for k in run])
        # A hit from L2 counts for L3 admission as an L1 hit does (the put only reads the slot,
        # beside the load).
        self._admit_to_l3(run)
        return plan

    def _l1_offset_of(self, keys: list[str], request_id: Any, decision: _Decision | None) -> int:
        """The L1 hit to skip when ``keys`` are the whole prompt of a looked-up (or prefetched)
        request (0 when they start where its hit does, or nothing says otherwise)."""
        if decision is not None:
            l1, start_key = decision.l1_pages, decision.keys[0] if decision.keys else None
        else:
            p = self._prefetches.get(request_id)
            l1, start_key = (0, None) if p is None else (p.l1_pages, p.start_key)
        if start_key is None or not l1 or not keys or keys[0] == start_key:
            return 0
        return l1 if len(keys) > l1 and keys[l1] == start_key else 0

    def complete_load(self, plan: LoadPlan, completion: object = None) -> None:
        """The worker's load was issued: unlock; the slots are reused only once ``completion``
        and the load the plan carries (``plan.handle``, set by ``TransferHalf.load``) are done.
        Where the worker runs in another process, pass its completion, or call this once its
        result is in. After ``close`` this frees the plan's slots (see ``close``)."""
        if not isinstance(plan, LoadPlan):
            raise ConfigError(f"complete_load: plan must be the LoadPlan prepare_load returned, got {type(plan).__name__}")
        if plan.completed:  # a second unlock would take another request's lock
            raise PoolError("complete_load: this load plan was already completed")
        completion = _copies_of(plan, completion)
        self.index.unlock(plan.keys, completion)
        plan.completed = True
        if self._closed:  # the load outlived the manager: its slots go once no load reads them
            for k in dict.fromkeys(plan.keys):
                entry = self.index.entry(k)
                if entry is not None and not entry.locks:
                    self.index.drop_l2(k)

    # --- stores L1 -> L2 ---------------------------------------------------------------------
    def prepare_store(self, keys: Sequence[str], protect: Sequence[str] = ()) -> StorePlan:
        """Reserve slots for those ``keys`` not yet on L2 (as many as L2 can make room for);
        the pages of ``protect`` (keys) on L2 are not evicted to make room."""
        self._check_open()
        return self._prepare_store(check_keys(keys), check_keys(protect, "protect"))

    def _prepare_store(self, keys: list[str], protect: Sequence[str] = ()) -> StorePlan:
        """``prepare_store`` of keys already checked (the L1 events check theirs once, first)."""
        wanted: list[tuple[int, str]] = []
        seen: set[str] = set()
        for i, k in enumerate(keys):
            if k not in seen and not self._has_l2_slot(k):
                wanted.append((i, k))
            seen.add(k)
        if not wanted:
            return StorePlan([], [], [])
        slots = self._allocate(len(wanted), protect=protect)
        if len(slots) < len(wanted):
            self.stats.stores_skipped += len(wanted) - len(slots)
            wanted = wanted[:len(slots)]
        for (_, k), s in zip(wanted, slots):
            self.index.begin_store(k, s)
        return StorePlan([k for _, k in wanted], slots, [i for i, _ in wanted])

    def complete_store(self, plan: StorePlan, success: bool | Sequence[bool] = True, completion: object = None) -> None:
        """End a store: successful pages become resident (and go on to L3 per policy); the slots
        of failed ones are freed once ``completion`` and the backup the plan carries
        (``plan.handle``, set by ``TransferHalf.store``: the copy that may still write) are done.
        After ``close`` this frees the plan's slots (see ``close``)."""
        if not isinstance(plan, StorePlan):
            raise ConfigError(f"complete_store: plan must be the StorePlan prepare_store returned, got {type(plan).__name__}")
        flags = _success_flags(success, len(plan))
        if len(flags) != len(plan):
            raise ConfigError(f"complete_store: {len(flags)} success flags for {len(plan)} pages")
        if plan.completed:  # its keys may be another plan's store by now
            raise PoolError("complete_store: this store plan was already completed")
        completion = _copies_of(plan, completion)
        plan.completed = True
        if self._closed:  # the store outlived the manager: nothing becomes resident, slots go
            flags = [False] * len(plan)
        to_l3 = []
        for k, ok in zip(plan.keys, flags):
            slot = self.index.finish_store(k, bool(ok), completion)
            if slot is not None:
                if not self._closed:
                    self.stats.stores_failed += 1
                self.allocator.free([slot], completion=completion)
                continue
            self.stats.stores += 1
            entry = self.index.entry(k)
            if self.policies.l3_on_seal and self._wants_l3(entry):
                to_l3.append(k)
        self._put_l3(to_l3)

    # --- L1 events from the engine -----------------------------------------------------------
    def on_l1_inserted(self, keys: Sequence[str]) -> StorePlan | None:
        """The engine inserted pages on L1 (prefill done). ``write_through`` stores them now."""
        self._check_open()
        keys = check_keys(keys)  # under every policy: a bad key is the engine's bug, say so now
        if self.policies.write is WritePolicy.WRITE_THROUGH:
            plan = self._prepare_store(keys)
            return plan if len(plan) else None
        return None

    def on_l1_hit(self, keys: Sequence[str]) -> StorePlan | None:
        """The engine reused pages from its L1. Counts hits; ``write_through_selective`` stores a
        page once it reached ``selective_hits``; pages now admitted go on to L3."""
        self._check_open()
        keys = check_keys(keys)
        counts = self.index.record_hits(keys)
        self._admit_to_l3(keys)
        if self.policies.write is WritePolicy.WRITE_THROUGH_SELECTIVE:
            hot = [k for k, n in zip(keys, counts) if n >= self.policies.selective_hits]
            plan = self._prepare_store(hot)
            if len(plan):
                # positions refer to the keys the engine passed, not to the hot subset
                where = {k: i for i, k in enumerate(keys)}
                plan.positions = [where[k] for k in plan.keys]
                return plan
        return None

    def on_l1_evicting(self, keys: Sequence[str]) -> StorePlan | None:
        """The engine is about to free these L1 pages. ``write_back`` stores them now; the engine
        frees its pages only once the worker's copy completed."""
        self._check_open()
        keys = check_keys(keys)
        plan = self._prepare_store(keys) if self.policies.write is WritePolicy.WRITE_BACK else None
        self.index.forget_unused(keys)  # their L1 hit counts go with them (unless on L2 / L3)
        return plan if plan is not None and len(plan) else None

    # --- L2 -> L3 ----------------------------------------------------------------------------
    def _wants_l3(self, entry: Entry | None) -> bool:
        return (entry is not None and self.l3 is not None and not entry.on_l3 and not entry.l3_put_in_flight
                and self.policies.admitted_to_l3(entry.hits))

    def _admit_to_l3(self, keys: Sequence[str]) -> None:
        """Put the resident pages among ``keys`` that a hit just admitted to L3 (policies that
        put sealed pages down)."""
        if self.policies.l3_on_seal:
            self._put_l3([k for k in keys if self.index.is_resident(k) and self._wants_l3(self.index.entry(k))])

    def _put_l3(self, keys: list[str]) -> None:
        if not keys or self.l3 is None:
            return
        self.index.begin_l3_put(keys)
        self._puts.append((keys, self.l3.put_from(keys, self.index.slots_of(keys))))

    def _allocate(self, count: int, protect: Sequence[str] = ()) -> list[int]:
        """Up to ``count`` free slots, evicting unlocked L2 pages least recently used first."""
        if count <= 0:
            return []
        # A degraded L3 takes no copy-down: the page would stay pinned on L2 for the whole outage.
        degraded = self.l3 is not None and self.l3.degraded
        copy_down = self._wants_l3 if self.policies.write is WritePolicy.WRITE_BACK and not degraded else None
        protected = [k for k in dict.fromkeys(protect) if self.index.is_resident(k)]
        self.index.lock(protected)  # the request's own L2 hit must not make room for its prefetch
        try:
            eviction = self.index.evict(count, copy_down_allowed=copy_down)
            freed = eviction.freed
            if degraded and free_slot_count(self.allocator) < count and self._give_up_queued_puts():
                # Backups waiting for a dead tier pin their pages; L2 serving goes first.
                freed += self.index.evict(count).freed
        finally:
            self.index.unlock(protected)
        self.stats.l2_evictions += freed
        self._put_l3(eviction.copy_down)
        free = free_slot_count(self.allocator)
        return self.allocator.allocate(min(count, free)) if free else []

    def _give_up_queued_puts(self) -> bool:
        """While L3 is degraded: drop the L3 puts still waiting in the controller's queue (they
        would wait there for the tier's return) so their pages may leave L2; True if any did.
        Their pages read as not on L3; a later hit or store puts them again."""
        still, dropped = [], False
        for keys, future in self._puts:
            if not future.done() and self.l3 is not None and self.l3.cancel(future):
                self.stats.l3_puts_failed += len(keys)
                self.index.finish_l3_put(keys, [False] * len(keys))
                dropped = True
            else:
                still.append((keys, future))
        self._puts = still
        return dropped

    # --- progress ----------------------------------------------------------------------------
    def poll(self) -> None:
        """Take in finished L3 puts and cancelled reads; cheap, called by every entry point."""
        if self._puts:
            still = []
            for keys, future in self._puts:
                if not future.done():
                    still.append((keys, future))
                    continue
                stored = [False] * len(keys) if future.cancelled() or future.exception() else future.result()
                self.stats.l3_puts += sum(bool(x) for x in stored)
                self.stats.l3_puts_failed += sum(not x for x in stored)
                self.index.finish_l3_put(keys, stored)
            self._puts = still
        if self._orphans:
            still = []
            for slots, future in self._orphans:
                if future.done():
                    self._prefetch_slots -= len(slots)
                else:
                    still.append((slots, future))
            self._orphans = still
        self.allocator.reap()

    def busy(self) -> bool:
        """Work in flight: lookups, prefetches, L3 puts or reads of cancelled prefetches."""
        self.poll()
        # A lookup whose answer is back is no work in flight, even if its request never asks again.
        return bool(self._puts or self._orphans or self._lookup_in_flight()
                    or any(p.future is not None and not p.future.done() for p in self._prefetches.values()))

    def _lookup_in_flight(self) -> bool:
        return any(not lookup.future.done() for lookup in self._lookups.values())

    def wait_idle(self, timeout_s: float = 30.0, step_s: float = 0.001) -> bool:
        """Block until no L3 work is in flight (tests, the replay's end, ``close``); False when the
        timeout ran out, or at once when all that is left is puts to a degraded tier (they wait
        for the server to come back, which no caller of this should wait for)."""
        deadline = time.monotonic() + timeout_s
        while self.busy():
            if time.monotonic() >= deadline or self._only_puts_to_a_degraded_tier():
                return False
            time.sleep(step_s)
        return True

    def _only_puts_to_a_degraded_tier(self) -> bool:
        return (self.l3 is not None and self.l3.degraded and not self._lookup_in_flight() and not self._orphans
                and all(p.future is None or p.future.done() for p in self._prefetches.values()))

    def touch(self, keys: Sequence[str]) -> None:
        """The engine used these pages (an L1 hit on them, say): on L2 they become the most
        recently used, so eviction takes others first. Keys not on L2 are ignored."""
        self._check_open()
        self.index.touch(check_keys(keys))

    def _check_open(self) -> None:
        if self._closed:
            raise PoolError("the cache manager is closed")

    def close(self, *, drain: bool = True) -> None:
        """Drop every prefetch, finish (``drain``) or refuse L3 work, close the controller, and
        free every slot this manager holds (each once the copies that may touch it returned).

        Bounded by the controller's ``limits.drain_timeout_s`` as a whole: the wait for L3 work
        here and the controller's own drain and close share one deadline (a backend still
        closing then gets ``controller.CLOSE_GRACE_S`` more); L3 work not done by then is
        cancelled, as with ``drain=False``.

        Closing in any order: stores and loads the worker still runs (prepared, not completed)
        keep their slots, and their ``complete_store`` / ``complete_load`` after the close free
        them (once their completion is done) without an error; a store completed then becomes
        resident nowhere. So the worker may be drained (``finished_stores`` / ``drain`` seal
        those slots, still the store's) before or after this call."""
        if self._closed:
            return
        deadline = time.monotonic() + (self.l3.limits.drain_timeout_s if self.l3 is not None else 0.0)
        for request_id in list(self._prefetches):
            self._finish_prefetch(request_id)
        self._lookups.clear()
        self._decided.clear()
        if drain and self.l3 is not None and not self.l3.degraded:
            if self.policies.write is WritePolicy.WRITE_BACK:
                # Closing frees every L2 copy: under write_back that is the last copy of each page
                # not yet on L3, which goes down first, as an eviction would send it.
                self._put_l3([k for k in self.index.lru_keys() if self._wants_l3(self.index.entry(k))])
            self.wait_idle(max(0.0, deadline - time.monotonic()))
        if self.l3 is not None:
            self.l3.close(drain=drain, deadline=deadline)  # every future of it is answered after this
        if self._agree is not None:
            self._agree.close()
        self._deadlines.close()
        self.poll()
        self.index.clear()
        self.allocator.reap()
        self._closed = True


@dataclass(frozen=True)
class _Lookup:
    """A lookup waiting for L3: the keys asked, L3's answer, what a caller waits on (done by
    ``give_up_at`` at the latest, a ``time.monotonic()`` value) and when the lookup gives up."""

    rest: tuple[str, ...]
    future: concurrent.futures.Future
    waited: concurrent.futures.Future
    give_up_at: float


def _check_request_id(request_id: Any) -> None:
    """Request ids key the manager's dicts: an unhashable one is the caller's error, named."""
    try:
        hash(request_id)
    except TypeError:
        raise ConfigError(f"request_id must be hashable (a str or an int), got {type(request_id).__name__}") from None


def _copies_of(plan: LoadPlan | StorePlan, completion: object) -> object:
    """What a plan's slots wait on: the completion passed and the handle the plan carries (each
    checked here, before anything changes state)."""
    carried = plan.handle
    if carried is None or carried is completion:
        return completion
    if completion is None:
        return as_completion(carried)
    return AllOf([as_completion(carried), as_completion(completion)])


def _common_run(keys: Sequence[str], decided: Sequence[str]) -> int:
    """Length of the leading run of ``keys`` that are the decided keys, in order."""
    run = 0
    for k, d in zip(keys, decided):
        if k != d:
            break
        run += 1
    return run


def _success_flags(success: object, count: int) -> list[bool]:
    """``complete_store``'s ``success``: one bool for the whole plan, or one per page (a sequence
    or a numpy array of bools). ints, None and text are no answer: a ConfigError names them."""
    def flag(value: object) -> bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise ConfigError(f"complete_store: success must be a bool or a sequence of bools, got {value!r:.80}")

    if isinstance(success, np.ndarray):
        return [flag(v) for v in success.reshape(-1)]
    if isinstance(success, Sequence) and not isinstance(success, (str, bytes)):
        return [flag(v) for v in success]
    return [flag(success)] * count


__all__ = ["AgreeTimeout", "CacheManager", "LoadPlan", "Match", "StorePlan"]
