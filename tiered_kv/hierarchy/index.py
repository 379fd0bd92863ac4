"""The index over L2 and L3: where each page lives, who uses it, and what may be evicted.

For each page key the index records its L2 slot (while the bytes land: ``storing``; once sealed and
verified: ``resident``), whether L3 holds it (set only after a put *succeeded*, so a failed or
partial put never reads as present), a lock count for pages in use, and the page's hit count (for
the selective write and the L3 admission rules). L2 residents are kept in least-recently-used order.

Eviction frees only pages that are unlocked, resident, have no L3 put in flight, and whose copies
have completed (the slot is freed through the allocator with the completion of the last copy that
touched it, so it is reused only afterwards). Under ``write_back`` a page whose last copy is on L2
and that L3 would admit is copied down first: eviction returns it as ``copy_down`` instead of
dropping it, and it becomes evictable once its put has returned. A page the index believes on L3
is dropped without asking L3 again: asking at eviction would keep every page hit since on L2 until
an answer came back, and evictions must make room now. What L3 says on its own (a lookup's
``exists``, a prefetch's misses) corrects the belief (``mark_l3_missing``).

Pure metadata: no bytes, no I/O, no clock, no torch; one thread (the scheduler's) owns it. The slot
allocator is anything with ``allocate(n)``, ``free(slots, completion)``, ``free_slots`` / ``free_count``
and ``reap()``: a ``HostPool`` in one process, a bare ``SlotAllocator`` on a scheduler that has no
host memory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import islice
from dataclasses import dataclass, field
from typing import Any

from ..model.completion import DONE, AllOf, Completion, as_completion
from ..errors import ConfigError, PoolError

STORING = "storing"
RESIDENT = "resident"


@dataclass(slots=True)
class Entry:
    """What the index knows of one page key."""

    slot: int | None = None
    state: str | None = None  # None (not on L2), STORING or RESIDENT
    on_l3: bool = False
    locks: int = 0
    hits: int = 0
    l3_put_in_flight: bool = False
    busy: Completion = field(default=DONE)  # copies that may still touch the slot


@dataclass(frozen=True)
class Eviction:
    """What one eviction pass did: slots it freed and pages it wants copied down first."""

    freed: int
    copy_down: list[str]


def free_slot_count(allocator: Any) -> int:
    """Free slots of a ``HostPool`` (``free_slots``) or a ``SlotAllocator`` (``free_count``)."""
    count = getattr(allocator, "free_slots", None)
    return count if count is not None else allocator.free_count


#: The most pages the index remembers as on L3 only (not on L2), whatever L3's size: at about
#: 300 B an entry with its key (tracemalloc, CPython 3.11, 2026-12-05), 2^20 take about 300 MB.
MAX_L3_ONLY = 1 << 20

#: Pages remembered as on L3 only per L2 slot, where L3 does not say its capacity in pages (Redis,
#: Mooncake, a file L3 without ``capacity_bytes``): the index then stays within a few times L2.
L3_ONLY_PER_L2_SLOT = 4


def l3_only_bound(l3: Any, l2_slots: int) -> int:
    """How many L3-only pages an index over ``l2_slots`` L2 slots and the L3 side ``l3`` (an
    ``L3Controller`` or ``L3Jobs``) remembers: L3's capacity in pages where its backend has one (``capacity_pages``: file with
    ``capacity_bytes``, memory, simulated), else ``L3_ONLY_PER_L2_SLOT`` per L2 slot; at most
    ``MAX_L3_ONLY``, at least 1. L3 holds no more than its capacity, so remembering more pages
    as on it than that only remembers pages it has already evicted."""
    capacity = getattr(l3, "capacity_pages", None)  # None over a pipe: the per-slot bound applies
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        capacity = L3_ONLY_PER_L2_SLOT * l2_slots
    return max(1, min(capacity, MAX_L3_ONLY))


class PageIndex:
    """L2 residency, L3 presence, locks, hits and LRU order of every page the cache knows.

    Its entries are bounded by what the tiers hold, not by what was ever written: pages on L2
    (at most the L2 slots), hit counts of pages on L1 (dropped when the engine evicts them,
    ``forget_unused``), and at most ``max_l3_only`` pages known only as on L3 (``l3_only_bound``),
    the least recently learned forgotten first. L3 evicts behind our back and never says so, so
    that memory is a hint: forgetting a page costs at most a put-if-absent that finds it present,
    never a wrong answer (a lookup asks L3 itself, ``exists``).
    """

    MAX_L3_ONLY = MAX_L3_ONLY

    def __init__(self, allocator: Any, *, max_l3_only: int = MAX_L3_ONLY) -> None:
        if isinstance(max_l3_only, bool) or not isinstance(max_l3_only, int) or max_l3_only <= 0:
            raise ConfigError(f"max_l3_only must be an int > 0, got {max_l3_only!r}")
        self.allocator = allocator
        self.entries: dict[str, Entry] = {}
        self._lru: OrderedDict[str, None] = OrderedDict()  # resident L2 pages, least recent first
        self._l3_only: OrderedDict[str, None] = OrderedDict()  # known on L3, not on L2; oldest first
        self.max_l3_only = max_l3_only

    # --- queries -----------------------------------------------------------------------------
    def entry(self, key: str) -> Entry | None:
        return self.entries.get(key)

    def is_resident(self, key: str) -> bool:
        e = self.entries.get(key)
        return e is not None and e.state == RESIDENT

    def l2_run(self, keys: Sequence[str], start: int = 0) -> int:
        """Length of the leading run of ``keys[start:]`` resident on L2."""
        run = 0
        entries = self.entries
        for k in keys[start:] if start else keys:
            e = entries.get(k)
            if e is None or e.state != RESIDENT:
                break
            run += 1
        return run

    def slots_of(self, keys: Sequence[str]) -> list[int]:
        out = []
        for k in keys:
            e = self.entries.get(k)
            if e is None or e.state != RESIDENT:
                raise PoolError(f"page {k[:32]} is not resident on L2")
            out.append(e.slot)  # type: ignore[arg-type]
        return out

    @property
    def resident_count(self) -> int:
        return len(self._lru)

    @property
    def l3_only_count(self) -> int:
        """Pages remembered as on L3 and not on L2 (at most ``max_l3_only``)."""
        return len(self._l3_only)

    @property
    def storing_count(self) -> int:
        return sum(1 for e in self.entries.values() if e.state == STORING)

    def lru_keys(self) -> list[str]:
        """Resident L2 pages, least recently used first (tests, stats)."""
        return list(self._lru)

    # --- hits, locks, recency ----------------------------------------------------------------
    def _get(self, key: str) -> Entry:
        e = self.entries.get(key)
        if e is None:
            e = self.entries[key] = Entry()
        return e

    def record_hits(self, keys: Iterable[str]) -> list[int]:
        """Count a hit on each key (known or not); returns the new hit counts."""
        out = []
        for k in keys:
            e = self._get(k)
            e.hits += 1
            out.append(e.hits)
        return out

    def touch(self, keys: Iterable[str]) -> None:
        for k in keys:
            if k in self._lru:
                self._lru.move_to_end(k)

    def lock(self, keys: Iterable[str]) -> None:
        for k in keys:
            e = self.entries.get(k)
            if e is None or e.state != RESIDENT:
                raise PoolError(f"cannot lock page {k[:32]}: not resident on L2")
            e.locks += 1

    def unlock(self, keys: Iterable[str], completion: object = None) -> None:
        """Release one lock per key; the slot stays busy until ``completion`` (the load) is done."""
        done = as_completion(completion)
        for k in keys:
            e = self.entries.get(k)
            if e is None or e.locks <= 0:
                raise PoolError(f"page {k[:32]} is not locked")
            e.locks -= 1
            if not done.done():
                e.busy = done if e.busy.done() else AllOf([e.busy, done])

    # --- L2 residency ------------------------------------------------------------------------
    def begin_store(self, key: str, slot: int) -> None:
        """``slot`` now receives ``key``'s bytes; it is not matchable until ``finish_store``."""
        e = self._get(key)
        if e.state is not None:
            raise PoolError(f"page {key[:32]} already has an L2 slot ({e.state})")
        e.slot, e.state = slot, STORING
        self._l3_only.pop(key, None)

    def finish_store(self, key: str, success: bool, completion: object = None) -> int | None:
        """End a store; on success the page is resident. Returns the slot to free on failure."""
        e = self.entries.get(key)
        if e is None or e.state != STORING:
            raise PoolError(f"page {key[:32]} has no store in progress")
        busy = as_completion(completion)  # a bad one is refused before the page changes state
        if success:
            e.state = RESIDENT
            e.busy = busy
            self._lru[key] = None
            return None
        slot = e.slot
        e.slot, e.state = None, None
        self._forget_if_unused(key, e)
        return slot

    def add_resident(self, key: str, slot: int, *, on_l3: bool = False) -> None:
        """A verified page landed in ``slot`` (an L3 prefetch)."""
        self.begin_store(key, slot)
        self.finish_store(key, True)
        if on_l3:
            self.entries[key].on_l3 = True

    # --- L3 presence -------------------------------------------------------------------------
    def begin_l3_put(self, keys: Iterable[str]) -> None:
        for k in keys:
            self.entries[k].l3_put_in_flight = True

    def finish_l3_put(self, keys: Sequence[str], stored: Sequence[bool]) -> None:
        for k, ok in zip(keys, stored):
            e = self.entries.get(k)
            if e is None:
                continue
            e.l3_put_in_flight = False
            e.on_l3 = e.on_l3 or bool(ok)
            self._forget_if_unused(k, e)

    def mark_l3_missing(self, keys: Iterable[str]) -> None:
        """L3 lost these pages behind our back (another instance's eviction, a restart)."""
        for k in keys:
            e = self.entries.get(k)
            if e is not None:
                e.on_l3 = False
                self._forget_if_unused(k, e)

    # --- eviction ----------------------------------------------------------------------------
    def evict(self, needed: int, *, copy_down_allowed: Any = None) -> Eviction:
        """Free L2 slots until ``needed`` are free, least recently used first.

        ``copy_down_allowed(entry) -> bool``: under write_back, whether a page whose only copy is on
        L2 must go to L3 before it goes; such pages are returned in ``copy_down`` and kept.
        """
        self.allocator.reap()
        freed = 0
        copy_down: list[str] = []
        if free_slot_count(self.allocator) >= needed:
            return Eviction(0, copy_down)
        # The LRU is walked in short snapshots, not copied whole: an L2 of 10^5 pages that needs
        # a few slots would otherwise copy every key on each allocation (the replay's hot spot).
        # Only drop_l2 changes the LRU here, so the visited keys still in it are the first ``kept``.
        # The free count is read after each drop only: a page kept changes nothing, and each read
        # reaps the allocator's pending frees (O(pending)), so reading it per key walked would cost
        # O(walked x pending) on an L2 full of locked pages.
        kept = 0
        enough = False
        while not enough:
            chunk = list(islice(self._lru, kept, kept + 256))
            if not chunk:
                break
            for key in chunk:
                e = self.entries[key]
                if e.locks or e.l3_put_in_flight:
                    kept += 1
                    continue
                if copy_down_allowed is not None and not e.on_l3 and copy_down_allowed(e):
                    copy_down.append(key)
                    kept += 1
                    continue
                self.drop_l2(key)
                freed += 1
                self.allocator.reap()
                if free_slot_count(self.allocator) >= needed:
                    enough = True
                    break
        return Eviction(freed, copy_down)

    def drop_l2(self, key: str) -> None:
        """Forget ``key``'s L2 copy; its slot is freed once its last copy completed."""
        e = self.entries[key]
        if e.locks or e.l3_put_in_flight or e.state != RESIDENT:
            raise PoolError(f"page {key[:32]} cannot leave L2 now (locks={e.locks}, put in flight={e.l3_put_in_flight}, {e.state})")
        del self._lru[key]
        slot, busy = e.slot, e.busy
        e.slot, e.state, e.busy = None, None, DONE
        self.allocator.free([slot], completion=None if busy.done() else busy)
        self._forget_if_unused(key, e)

    def _forget_if_unused(self, key: str, e: Entry) -> None:
        # Entries with nothing but a hit count are dropped once nothing refers to them, so the
        # index does not grow with every key ever seen; an L3 copy keeps its entry (write_back
        # needs to know it), bounded by max_l3_only (the oldest learned forgotten first).
        if e.state is not None or e.locks or e.l3_put_in_flight:
            return
        if not e.on_l3:
            self.entries.pop(key, None)
            self._l3_only.pop(key, None)
            return
        self._l3_only[key] = None
        self._l3_only.move_to_end(key)
        while len(self._l3_only) > self.max_l3_only:
            old, _ = self._l3_only.popitem(last=False)
            self.entries.pop(old, None)

    def forget_unused(self, keys: Iterable[str]) -> None:
        """Drop what the index keeps of ``keys`` beyond L2 and L3 (hit counts of pages that left
        L1): called when the engine evicts them, so hit-only entries do not pile up."""
        for k in keys:
            e = self.entries.get(k)
            if e is not None and not e.on_l3:
                self._forget_if_unused(k, e)

    def clear(self) -> None:
        """Free every slot the index holds that no store or load still uses (close), each once
        the copies that touched it completed. A page whose store is in flight (``storing``) or
        that a load still reads (locked) keeps its entry and its slot: ``finish_store`` /
        ``unlock`` and ``drop_l2`` release them when the caller completes that work."""
        kept: dict[str, Entry] = {}
        for key, e in list(self.entries.items()):
            e.l3_put_in_flight = False
            e.on_l3 = False  # nothing is known of L3 any more
            if e.state == STORING or (e.state == RESIDENT and e.locks):
                kept[key] = e
            elif e.state == RESIDENT:
                self.drop_l2(key)
        self.entries = kept
        self._lru = OrderedDict((k, None) for k in self._lru if k in kept)
        self._l3_only.clear()


__all__ = ["Entry", "Eviction", "L3_ONLY_PER_L2_SLOT", "MAX_L3_ONLY", "PageIndex", "RESIDENT", "STORING", "free_slot_count",
           "l3_only_bound"]
