"""L2: the pinned host pool, its slots, and the page records that go to and come from L3.

``HostPool(spec, num_slots, layout)`` owns host memory of exactly the layout's size (see
``host_memory``), its slot allocator (runs of adjacent slots, completion-gated frees), and the
encode / seal / verify of page records in both layouts. In ``page_first`` the slot is the record:
``seal(slot, key)`` writes the header after the payload has landed, ``record_view(slot)`` is the
zero-copy buffer a backend puts or fills, and ``verify_slot(slot, key)`` checks what a backend
wrote there. ``layer_first`` gathers a record on ``encode_record`` and scatters on ``decode_record``.
A pool made with a ``record_key`` (a tenant's secret, ``record_key.RecordKey``) seals with keyed tags
and takes only records tagged with that key, wherever records are sealed or verified through it.

Nothing here touches the device: kernels and the transfer engine read ``chunk_view``s.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np
import torch

from . import record
from ..errors import ForeignSlotError, PoolError, RecordError
from .host_layouts import LAYOUTS
from .host_memory import HostMemory
from .record_key import RecordKey
from .device_pool import chunk_of
from .slot_allocator import SlotAllocator, check_count, slot_id
from .spec import KVSpec, check_spec


class HostPool:
    """``num_slots`` page slots of ``spec`` in host memory, laid out as ``layout``.

    Args:
        spec: what a page holds.
        num_slots: pages the pool holds.
        layout: ``"page_first"`` (what L3 wants) or ``"layer_first"``.
        pin: register with CUDA; default: when CUDA is available.
        numa_node: NUMA node for the memory; default: the current CUDA device's node, when pinned.
        own_slots: True: this pool's ``allocate`` hands the slots out, and ``seal`` refuses a slot
            it has not handed out. False: an allocator elsewhere does (a scheduler's
            ``SlotAllocator`` in another process), so the pool cannot tell a free slot from a used one.
        record_key: a tenant's ``RecordKey``: records are sealed with its keyed tag, and only
            records carrying it verify (docs/security.md). None: plain xxh3 checksums.

    Slot ids are what ``slot_allocator.slot_id`` takes: ints, numpy integers, 0-d integer arrays or
    tensors; bools and floats are refused with ForeignSlotError.
    """

    def __init__(self, spec: KVSpec, num_slots: int, layout: str = "page_first", *, pin: bool | None = None,
                 numa_node: int | None = None, own_slots: bool = True, record_key: RecordKey | None = None) -> None:
        check_spec(spec)
        if record_key is not None and not isinstance(record_key, RecordKey):
            raise PoolError(f"record_key must be a RecordKey (tiered_kv.model.record_key) or None, "
                            f"got {type(record_key).__name__}")
        try:
            layout_cls = LAYOUTS[layout]
        except (KeyError, TypeError):  # TypeError: an unhashable value (a list) is no layout name
            raise PoolError(f"unknown host layout {layout!r}; choose one of {sorted(LAYOUTS)}") from None
        num_slots = check_count(num_slots, "num_slots", minimum=1)
        self.spec = spec
        self.num_slots = num_slots
        self._layout = layout_cls(spec, num_slots)
        self.layout = layout
        self.memory = HostMemory(self._layout.total_bytes, pin=pin, numa_node=numa_node)
        self.buffer = self.memory.tensor
        self._array = self.buffer.numpy()
        self._views = self._layout.chunk_views(self.buffer)
        self._allocator = SlotAllocator(num_slots)
        self.own_slots = own_slots
        self._lock = threading.Lock()
        self.record_bytes = record.HEADER_BYTES + spec.page_bytes
        self.record_key = record_key

    # --- geometry ----------------------------------------------------------------------------
    @property
    def slot_bytes(self) -> int:
        """Bytes between two page_first slots (record padded to 4 KiB); the payload for layer_first."""
        return self._layout.slot_bytes

    @property
    def holds_records(self) -> bool:
        """True when a slot is itself a page record (page_first)."""
        return self._layout.holds_records

    @property
    def nbytes(self) -> int:
        return self.memory.size

    def chunk_view(self, component_index: int, layer: int) -> torch.Tensor:
        """``uint8 [num_slots, bytes_per_layer]`` for one (component, local layer)."""
        return chunk_of(self._views, component_index, layer)

    def check_slot(self, slot: int) -> int:
        """``slot`` as a Python int in range; ForeignSlotError for a bool, float, non-id or out of range."""
        return slot_id(slot, self.num_slots)

    def _require_records(self, what: str) -> None:
        if not self.holds_records:
            raise PoolError(f"{what} needs a page_first pool; this one is {self.layout}")

    def slot_address(self, slot: int) -> int:
        """Host address of a page_first slot (its header block); for zero-copy backends."""
        self._require_records("slot_address")
        return self.memory.address + self.check_slot(slot) * self.slot_bytes

    def record_view(self, slot: int) -> memoryview:
        """Writable zero-copy view of a page_first slot's record (header + payload, unpadded)."""
        self._require_records("record_view")
        start = self.check_slot(slot) * self.slot_bytes
        return self.memory.memoryview()[start:start + self.record_bytes]

    def slot_view(self, slot: int) -> memoryview:
        """Writable view of a whole padded page_first slot (a multiple of 4 KiB, for direct I/O)."""
        self._require_records("slot_view")
        start = self.check_slot(slot) * self.slot_bytes
        return self.memory.memoryview()[start:start + self.slot_bytes]

    # --- a slot's record as parts (what backends move; one part here, several in a bound pool) ---
    def record_parts(self, slot: int) -> list[memoryview]:
        """The writable buffers that hold ``slot``'s record, in order: here the one record view; a
        ``BoundPool`` slot bound to an engine's memory gives its header block, then each payload
        part. A backend that moves records by parts (``readv`` / ``writev``, one socket send per part,
        multi-buffer puts)
        serves both."""
        return [self.record_view(slot)]

    def part_addresses(self, slot: int) -> list[tuple[int, int]]:
        """``(address, bytes)`` of each of ``record_parts(slot)``, for backends that move by address."""
        return [(self.slot_address(slot), self.record_bytes)]

    def memory_regions(self) -> list[tuple[int, int]]:
        """``(address, bytes)`` of every memory a part of this pool's records may lie in: what a
        backend that must register memory (Mooncake) registers."""
        return [(self.memory.address, self.memory.size)]

    def is_contiguous(self, slot: int) -> bool:
        """Whether ``slot``'s record is one buffer (``record_view``, ``slot_view`` for direct I/O)."""
        self.check_slot(slot)
        return True

    def own_slot_view(self, slot: int) -> memoryview:
        """The padded slot of this pool's own memory (4 KiB aligned), also while a ``BoundPool``
        slot is bound elsewhere: an aligned buffer a backend may bounce a record through."""
        return HostPool.slot_view(self, slot)

    def record_contents(self, slot: int) -> memoryview | bytes:
        """``slot``'s record as one buffer: its view where it is one, else a copy of its parts."""
        parts = self.record_parts(slot)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def fill_record(self, slot: int, data) -> int:
        """Copy ``data``'s first bytes into ``slot``'s record parts, in order, up to the record's
        size; returns how many were copied (a shorter value fills only its length)."""
        source = memoryview(data).cast("B")
        done = 0
        for part in self.record_parts(slot):
            n = min(len(part), len(source) - done)
            if n <= 0:
                break
            part[:n] = source[done:done + n]
            done += n
        return done

    def copy_record(self, source: int, target: int) -> None:
        """Copy the record in slot ``source`` into slot ``target`` (duplicate keys of one get)."""
        self.fill_record(target, self.record_contents(source))

    def wipe(self, slot: int) -> None:
        """Zero every byte a record of ``slot`` may have landed in: the padded slot here; a
        ``BoundPool`` also zeroes the engine's ranges a bound slot points at."""
        view = self.slot_view(slot)
        view[:] = bytes(len(view))

    def _header_and_payload(self, slot: int) -> tuple[memoryview, list[memoryview]]:
        parts = self.record_parts(slot)
        head = parts[0]
        if len(parts) == 1:
            return head[:record.HEADER_BYTES], [head[record.HEADER_BYTES:]]
        return head, parts[1:]

    # --- records -----------------------------------------------------------------------------
    def seal(self, slot: int, key: str) -> None:
        """Write the record header of a page_first slot whose payload has landed.

        Raises ForeignSlotError for a slot that is not handed out (free, or waiting to be freed)
        when the pool owns its slots: a sealed free slot would be a record nobody holds.
        """
        header, payload = self._header_and_payload(slot)
        if self.own_slots and not self.is_allocated(slot):
            raise ForeignSlotError(f"seal of slot {self.check_slot(slot)}, which is not allocated (free or being freed)")
        record.write_header(header, fingerprint=self.spec.fingerprint, key=key, payload=payload,
                            record_key=self.record_key)

    def is_sealed(self, slot: int, key: str) -> bool:
        """Header-only check that a page_first slot was sealed for ``key`` under this spec (and key)."""
        return record.is_sealed_for(self.record_parts(slot)[0], fingerprint=self.spec.fingerprint, key=key,
                                    record_key=self.record_key)

    def verify_slot(self, slot: int, key: str) -> None:
        """Verify the record a backend wrote into a page_first slot; raises a RecordError."""
        header, payload = self._header_and_payload(slot)
        record.verify_parts(header, payload, fingerprint=self.spec.fingerprint, key=key,
                            payload_len=self.spec.page_bytes, record_key=self.record_key)

    def verify_record(self, data, key: str) -> memoryview:
        """Verify ``data`` as this pool's record of ``key`` (spec, size and, with a record key, its
        tag); returns the payload view. Raises a RecordError."""
        return record.verify(data, fingerprint=self.spec.fingerprint, key=key, payload_len=self.spec.page_bytes,
                             record_key=self.record_key)

    def encode_record(self, slot: int, key: str) -> bytearray:
        """A record of the page in ``slot`` (either layout), as a new buffer."""
        slot = self.check_slot(slot)
        out = bytearray(self.record_bytes)
        payload = np.frombuffer(out, dtype=np.uint8)[record.HEADER_BYTES:]
        self._layout.read_payload(self._array, slot, payload)
        view = memoryview(out)
        record.write_header(view[:record.HEADER_BYTES], fingerprint=self.spec.fingerprint, key=key,
                            payload=view[record.HEADER_BYTES:], record_key=self.record_key)
        return out

    def decode_record(self, slot: int, data, key: str) -> None:
        """Verify ``data`` as the record of ``key`` and, only if it is intact, write it into ``slot``.

        Raises a RecordError (the slot is untouched) for truncated, corrupt or foreign records, and
        ForeignSlotError for a slot that is being freed (its transfers may still read or write it)
        when the pool owns its slots. A free slot is written: nobody holds it.
        """
        slot = self.check_slot(slot)
        if self.own_slots and self.is_pending(slot):
            raise ForeignSlotError(f"decode_record into slot {slot}, which is being freed: "
                                   "a transfer of it may still be in flight")
        payload = self.verify_record(data, key)
        if self.holds_records:
            self.record_view(slot)[:] = memoryview(data).cast("B")[:self.record_bytes]
        else:
            self._layout.write_payload(self._array, slot, np.frombuffer(payload, dtype=np.uint8))

    # --- allocation --------------------------------------------------------------------------
    def allocate(self, count: int) -> list[int]:
        """``count`` free slots, in runs of adjacent slots when possible. Raises PoolExhaustedError."""
        with self._lock:
            return self._allocator.allocate(count)

    def free(self, slots: Iterable[int], completion: object = None) -> None:
        """Return ``slots`` once ``completion`` (CUDA event, future, or None = now) is done."""
        with self._lock:
            self._allocator.free(slots, completion)

    def hold(self, slots: Iterable[int], completion: object) -> None:
        """Keep ``slots`` from being reused until ``completion`` is done, even after ``free``."""
        with self._lock:
            self._allocator.hold(slots, completion)

    def is_held(self, slot: int) -> bool:
        """Whether work ``hold`` registered on ``slot`` (a backend's thread) may still touch it."""
        with self._lock:
            return self._allocator.is_held(self.check_slot(slot))

    def reap(self) -> int:
        """Release pending frees whose completion is done; returns how many slots came back."""
        with self._lock:
            return self._allocator.reap()

    @property
    def free_slots(self) -> int:
        with self._lock:
            return self._allocator.free_count

    def is_allocated(self, slot: int) -> bool:
        with self._lock:
            return self._allocator.is_allocated(self.check_slot(slot))

    def is_pending(self, slot: int) -> bool:
        """Whether ``slot`` was freed and waits for the completion of work that may still touch it."""
        with self._lock:
            return self._allocator.is_pending(self.check_slot(slot))

    def allocated_slots(self) -> list[int]:
        """Slots handed out and not waiting to be freed."""
        with self._lock:
            return self._allocator.allocated_slots()

    @property
    def pending_slots(self) -> int:
        """Slots freed but waiting for the completion of work that may still touch them."""
        with self._lock:
            return self._allocator.pending_count

    def close(self) -> None:
        """Unpin the memory. Further use of the pool is an error of the caller."""
        self.memory.release()

    def __enter__(self) -> "HostPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HostPool({self.spec.kind}, slots={self.num_slots}, layout={self.layout}, pinned={self.memory.pinned})"


__all__ = ["HostPool", "RecordError"]
