"""Allocation of host pool slots: runs of adjacent slots, completion-gated frees.

Slots are integers ``0 .. num_slots-1``. ``allocate(n)`` prefers one run of ``n`` adjacent slots
(long copies are faster for copy engines, Mooncake and direct I/O), else the fewest, longest runs.
``free(slots, completion)`` returns slots only once ``completion.done()``: a slot is never handed to
a second user while a copy into or out of it may still run.

Slot ids are read by ``slot_id`` / ``slot_ids`` everywhere ids come in (here and in the host
pool): Python and numpy integers, integer numpy arrays and torch tensors are ids; bools (``True``
is not slot 1), floats and anything else are refused with ForeignSlotError naming the index.
Freeing a slot this allocator never handed out is a ForeignSlotError; freeing one that was handed
out and is free again (or already waiting to be freed) is a DoubleFreeError.

Not thread-safe by itself: the host pool (or the controller's loop) owns it. Needs no torch.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

import numpy as np

from .completion import AllOf, Completion, as_completion
from ..errors import DoubleFreeError, ForeignSlotError, PoolError, PoolExhaustedError
from .integers import as_int, integer_dtype, is_tensor

MAX_SLOTS = 2**32  # 16 TiB of host memory at the smallest (4 KiB) slot: more is a unit mix-up


def check_count(value: object, what: str, *, minimum: int, maximum: int = MAX_SLOTS) -> int:
    """``value`` as an int in ``minimum..maximum``; PoolError naming ``what`` (bools and floats too)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not minimum <= value <= maximum:
        raise PoolError(f"{what} must be an int in {minimum}..{maximum}, got {repr(value)[:40]}")
    return int(value)


def slot_id(value: object, num_slots: int, where: str = "") -> int:
    """``value`` as a slot id in ``0..num_slots-1``: a Python or numpy integer, or a 0-d integer
    array / tensor. Raises ForeignSlotError (``where`` says which position) for anything else."""
    slot = as_int(value)
    if slot is None:
        raise ForeignSlotError(f"slot {repr(value)[:80]}{where} is not a slot id: expected an int, got {type(value).__name__}")
    if not 0 <= slot < num_slots:
        raise ForeignSlotError(f"slot {value!r}{where} is not a slot of this pool (0..{num_slots - 1})")
    return slot


def slot_ids(slots: object, num_slots: int) -> list[int]:
    """``slots`` (an iterable of ids, or a 1-D integer numpy array / torch tensor) as a list of
    Python ints in ``0..num_slots-1``; ForeignSlotError naming the first bad position."""
    if is_tensor(slots) or isinstance(slots, np.ndarray):
        if slots.ndim != 1:  # type: ignore[attr-defined]
            raise ForeignSlotError(f"slot ids: expected a 1-D array, got shape {tuple(slots.shape)}")  # type: ignore[attr-defined]
        if not integer_dtype(slots):
            raise ForeignSlotError(f"slot ids: expected integers, got {slots.dtype}")  # type: ignore[attr-defined]
        slots = slots.tolist()  # type: ignore[attr-defined]
    elif isinstance(slots, (str, bytes, bytearray)) or not isinstance(slots, Iterable):
        raise ForeignSlotError(f"slot ids: expected an iterable of ints, got {type(slots).__name__}")
    return [slot_id(s, num_slots, f" (index {i})") for i, s in enumerate(slots)]


class SlotAllocator:
    """Free space as sorted, disjoint ``[start, end)`` runs, plus frees waiting on completions."""

    def __init__(self, num_slots: int) -> None:
        num_slots = check_count(num_slots, "num_slots", minimum=1)
        self.num_slots = num_slots
        self._starts: list[int] = [0]
        self._ends: list[int] = [num_slots]
        self._allocated = bytearray(num_slots)  # 1 = handed out (including pending frees)
        self._handed_out = bytearray(num_slots)  # 1 = handed out at least once: a free of it is no foreign id
        self._pending: list[tuple[Completion, list[int]]] = []
        self._pending_slots: set[int] = set()
        self._holds: dict[int, Completion] = {}  # slot -> work that may still write into it
        self._free_count = num_slots

    # --- queries -----------------------------------------------------------------------------
    @property
    def free_count(self) -> int:
        """Slots free right now, pending frees whose completion is done included: every query
        reaps first, so a count never lags behind the work it waited for."""
        self.reap()
        return self._free_count

    @property
    def pending_count(self) -> int:
        self.reap()
        return len(self._pending_slots)

    def is_allocated(self, slot: int) -> bool:
        """True while ``slot`` is handed out and not waiting to be freed."""
        # No reap: a pending free is "not allocated" before and after its completion.
        slot = slot_id(slot, self.num_slots)
        return bool(self._allocated[slot]) and slot not in self._pending_slots

    def is_pending(self, slot: int) -> bool:
        """True while ``slot`` was freed but waits for the completion of work that may still touch it."""
        slot = slot_id(slot, self.num_slots)
        self.reap()
        return slot in self._pending_slots

    def allocated_slots(self) -> list[int]:
        """Slots handed out and not waiting to be freed (for tests, stats and shutdown)."""
        pending = self._pending_slots
        return [s for s, used in enumerate(self._allocated) if used and s not in pending]

    def runs(self) -> list[tuple[int, int]]:
        """Free runs as ``(start, end)``; for tests and stats."""
        return list(zip(self._starts, self._ends))

    # --- allocation --------------------------------------------------------------------------
    def allocate(self, count: int) -> list[int]:
        """Hand out ``count`` slots, as few runs as possible. Raises PoolExhaustedError."""
        count = check_count(count, "count", minimum=0)
        if count == 0:
            return []
        if count > self._free_count:
            self.reap()
        if count > self._free_count:
            raise PoolExhaustedError(
                f"need {count} host slots, {self._free_count} free of {self.num_slots} "
                f"({len(self._pending_slots)} waiting for their transfers to complete)"
            )
        slots: list[int] = []
        # Best fit: the shortest run that holds everything keeps long runs for later.
        best = -1
        for i, (start, end) in enumerate(zip(self._starts, self._ends)):
            length = end - start
            if length >= count and (best < 0 or length < self._ends[best] - self._starts[best]):
                best = i
        if best >= 0:
            slots.extend(self._take(best, count))
        else:
            # Fragmented: take the longest runs first.
            while len(slots) < count:
                i = max(range(len(self._starts)), key=lambda j: self._ends[j] - self._starts[j])
                slots.extend(self._take(i, count - len(slots)))
        for s in slots:
            self._allocated[s] = 1
            self._handed_out[s] = 1
        self._free_count -= count
        return slots

    def _take(self, run_index: int, count: int) -> range:
        start, end = self._starts[run_index], self._ends[run_index]
        taken = min(count, end - start)
        if taken == end - start:
            del self._starts[run_index], self._ends[run_index]
        else:
            self._starts[run_index] = start + taken
        return range(start, start + taken)

    # --- freeing -----------------------------------------------------------------------------
    def free(self, slots: Iterable[int], completion: object = None) -> None:
        """Give ``slots`` (ids as ``slot_ids`` takes them) back once ``completion`` (event, future
        or None) is done.

        Raises ForeignSlotError for what is no id, ids outside the pool or never handed out,
        DoubleFreeError for a slot handed out before and free again, or already waiting to be
        freed; on error nothing is freed.
        """
        slot_list = slot_ids(slots, self.num_slots)
        self._check_freeable(slot_list)
        done = as_completion(completion)
        plain: list[int] = []
        for s in slot_list:
            hold = self._holds.pop(s, None)
            if hold is None or hold.done():
                plain.append(s)
            else:  # a worker may still write into it: wait for that too
                self._defer(AllOf([done, hold]), [s])
        if done.done():
            self._release(plain)
        elif plain:
            self._defer(done, plain)

    def _defer(self, done: Completion, slots: list[int]) -> None:
        self._pending.append((done, slots))
        self._pending_slots.update(slots)

    def _check_freeable(self, slots: Sequence[int]) -> None:
        seen: set[int] = set()
        for s in slots:
            if s in seen or s in self._pending_slots:
                raise DoubleFreeError(f"slot {s} freed twice")
            if not self._allocated[s]:
                if not self._handed_out[s]:
                    raise ForeignSlotError(f"slot {s} was never handed out by this pool")
                raise DoubleFreeError(f"slot {s} is already free")
            seen.add(s)

    def is_held(self, slot: int) -> bool:
        """Whether work that may still write into ``slot`` (a ``hold``) has not finished."""
        hold = self._holds.get(slot)
        return hold is not None and not hold.done()

    def hold(self, slots: Iterable[int], completion: object) -> None:
        """Mark allocated ``slots`` as possibly written by work that ends with ``completion``.

        A later ``free`` of those slots waits for it too: a cancelled or timed-out L3 read keeps its
        slots until its worker thread has returned. Slots not allocated here are ignored.
        """
        done = as_completion(completion)
        for s in slot_ids(slots, self.num_slots):
            if not self._allocated[s]:
                continue  # managed outside this allocator: nothing here could hand it out
            previous = self._holds.get(s)
            self._holds[s] = done if previous is None or previous.done() else AllOf([previous, done])

    def reap(self) -> int:
        """Release every pending free whose completion is done; returns the slots released."""
        released = 0
        still: list[tuple[Completion, list[int]]] = []
        for done, slots in self._pending:
            if done.done():
                self._pending_slots.difference_update(slots)
                self._release(slots)
                released += len(slots)
            else:
                still.append((done, slots))
        self._pending = still
        return released

    def _release(self, slots: Sequence[int]) -> None:
        for s in sorted(slots):
            self._allocated[s] = 0
            self._insert_free(s)
        self._free_count += len(slots)

    def _insert_free(self, slot: int) -> None:
        i = bisect.bisect_right(self._starts, slot)
        joins_left = i > 0 and self._ends[i - 1] == slot
        joins_right = i < len(self._starts) and self._starts[i] == slot + 1
        if joins_left and joins_right:
            self._ends[i - 1] = self._ends[i]
            del self._starts[i], self._ends[i]
        elif joins_left:
            self._ends[i - 1] = slot + 1
        elif joins_right:
            self._starts[i] = slot
        else:
            self._starts.insert(i, slot)
            self._ends.insert(i, slot + 1)
