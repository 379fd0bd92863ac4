"""A page_first pool whose slots' payloads can lie in memory an engine owns: zero-copy records.

An engine with a host pool of its own (SGLang's HiCache host pools) may hold a page's payload in
place already: each component's bytes of one page one contiguous range, in record order (SGLang's
``page_first_direct`` layouts). ``BoundPool`` lets such a page be a record without copying it: a
slot keeps its own 4 KiB header block, and ``bind(slot, parts)`` points its payload at the engine's
ranges. Backends move a record by its ``record_parts`` (header block, then each part), with
``readv`` / ``writev``, one socket send per part or Mooncake's multi-buffer calls; sealing and
verifying run over the parts as over one buffer (``record.payload_parts``), so a record written
through a bound slot is byte for byte the one a plain slot writes, and reads back into either.

An unbound slot is a plain page_first slot with a payload of its own (the staging copy for an
engine layout that holds a page in many pieces). Parts must lie in the ``regions`` given at
construction (the engine's pool buffers): what backends that register memory (Mooncake) register,
and a check that a part is no stray pointer. This module never copies a bound payload, never
touches a device and never frees the engine's memory; the engine must keep it alive, and must
not reuse a page while a call that moves it runs: the call's future, then the slot's ``hold``
(``is_held``: a backend's thread still reading or writing it), must have ended.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from . import record
from ..errors import PoolError
from .host_pool import HostPool
from .record_key import RecordKey
from .spec import KVSpec


def _as_array(buffer) -> np.ndarray:
    """A CPU tensor or numpy array as a numpy array sharing its memory."""
    if isinstance(buffer, torch.Tensor):
        if buffer.device.type != "cpu":
            raise PoolError(f"a bound pool's memory is host memory; got a tensor on {buffer.device}")
        if not buffer.is_contiguous():
            raise PoolError(f"a bound part or region must be one contiguous range; got strides {buffer.stride()}")
        # Viewed as bytes first: numpy has no bfloat16 or fp8, the dtypes engines' pools use.
        return buffer.detach().view(-1).view(torch.uint8).numpy()
    if isinstance(buffer, np.ndarray):
        return buffer
    raise PoolError(f"a bound part is a CPU tensor or numpy array, got {type(buffer).__name__}")


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


class BoundPool(HostPool):
    """``num_slots`` page_first slots of ``spec`` whose payloads may be bound to ``regions``.

    Args:
        spec: what a page holds.
        num_slots: records in flight at once.
        regions: the engine's buffers (CPU tensors or numpy arrays) a bound part may lie in.
        record_key: as ``HostPool``'s.
        pin: as ``HostPool``'s (the header blocks and unbound payloads); default off.
    """

    def __init__(self, spec: KVSpec, num_slots: int, regions: Sequence[torch.Tensor | np.ndarray], *,
                 record_key: RecordKey | None = None, pin: bool = False) -> None:
        super().__init__(spec, num_slots, "page_first", pin=pin, record_key=record_key)
        self._regions: list[tuple[int, int]] = []
        for region in regions:
            array = _as_array(region)
            if not array.flags.c_contiguous:
                raise PoolError("a bound pool's region must be one contiguous buffer")
            self._regions.append((_address(array), array.nbytes))
        self._bound: dict[int, list[memoryview]] = {}
        self._addresses: dict[int, list[tuple[int, int]]] = {}

    # --- binding ------------------------------------------------------------------------------
    def bind(self, slot: int, parts: Sequence[torch.Tensor | np.ndarray]) -> None:
        """Make ``parts`` (contiguous buffers inside the pool's regions, together one page's
        payload in record order) the payload of ``slot``, until ``unbind`` or the next ``bind``."""
        slot = self.check_slot(slot)
        views, addresses = [], []
        for part in parts:
            array = _as_array(part)
            if not array.flags.c_contiguous:
                raise PoolError(f"a bound part must be one contiguous range; got strides {array.strides}")
            address, size = _address(array), array.nbytes
            if not any(start <= address and address + size <= start + length for start, length in self._regions):
                raise PoolError(f"a bound part at {address:#x} ({size} B) lies outside the pool's regions")
            views.append(memoryview(array).cast("B"))
            addresses.append((address, size))
        total = sum(size for _, size in addresses)
        if total != self.spec.page_bytes:
            raise PoolError(f"bound parts hold {total} B; a page of this spec is {self.spec.page_bytes} B")
        with self._lock:
            self._bound[slot] = views
            self._addresses[slot] = addresses

    def unbind(self, slot: int) -> None:
        """Give ``slot`` its own payload again (nothing is copied)."""
        slot = self.check_slot(slot)
        with self._lock:
            self._bound.pop(slot, None)
            self._addresses.pop(slot, None)

    def is_bound(self, slot: int) -> bool:
        with self._lock:
            return self.check_slot(slot) in self._bound

    # --- the record as parts ------------------------------------------------------------------
    def _header_block(self, slot: int) -> memoryview:
        start = slot * self.slot_bytes
        return self.memory.memoryview()[start:start + record.HEADER_BYTES]

    def record_parts(self, slot: int) -> list[memoryview]:
        slot = self.check_slot(slot)
        with self._lock:
            bound = self._bound.get(slot)
        if bound is None:
            return super().record_parts(slot)
        return [self._header_block(slot), *bound]

    def part_addresses(self, slot: int) -> list[tuple[int, int]]:
        slot = self.check_slot(slot)
        with self._lock:
            bound = self._addresses.get(slot)
        if bound is None:
            return super().part_addresses(slot)
        return [(self.memory.address + slot * self.slot_bytes, record.HEADER_BYTES), *bound]

    def memory_regions(self) -> list[tuple[int, int]]:
        return super().memory_regions() + list(self._regions)

    def is_contiguous(self, slot: int) -> bool:
        return not self.is_bound(slot)

    def record_view(self, slot: int) -> memoryview:
        """The record of an unbound slot; PoolError for a bound one (its record is in parts)."""
        if self.is_bound(slot):
            raise PoolError(f"slot {slot} is bound to an engine's memory: its record is in parts (record_parts)")
        return super().record_view(slot)

    def slot_view(self, slot: int) -> memoryview:
        if self.is_bound(slot):
            raise PoolError(f"slot {slot} is bound to an engine's memory: it has no padded slot view")
        return super().slot_view(slot)

    def slot_address(self, slot: int) -> int:
        if self.is_bound(slot):
            raise PoolError(f"slot {slot} is bound to an engine's memory: its record is in parts (part_addresses)")
        return super().slot_address(slot)

    def wipe(self, slot: int) -> None:
        """Zero the slot's own padded memory and, while bound, the engine's ranges it is bound to."""
        own = self.own_slot_view(slot)
        own[:] = bytes(len(own))
        with self._lock:
            bound = self._bound.get(self.check_slot(slot), ())
        for part in bound:
            part[:] = bytes(len(part))

    def __repr__(self) -> str:
        return f"BoundPool({self.spec.kind}, slots={self.num_slots}, regions={len(self._regions)})"


__all__ = ["BoundPool"]
