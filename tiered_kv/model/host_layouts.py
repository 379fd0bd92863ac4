"""Where the bytes of each slot live inside a host pool's buffer, for each host layout.

    page_first   one slot per page: a 4 KiB header block, then the page payload (components in
                 spec order, each layer-major), padded to a multiple of 4 KiB. The slot *is* the
                 page record, so L3 reads and writes it with one pointer and one length.
    layer_first  per component ``[layers, slots, bytes_per_layer]``: one layer of many slots is
                 contiguous, which suits per-layer loads; records are gathered on encode.

A layout maps (component, layer) to a chunk view ``uint8 [slots, bytes_per_layer]`` and moves a
slot's payload to and from a contiguous buffer. Chosen by name from ``LAYOUTS``.
"""

from __future__ import annotations

import numpy as np
import torch

from .record import HEADER_BYTES
from .sizes import round_up
from .spec import KVSpec


class PageFirstLayout:
    name = "page_first"
    holds_records = True  # a slot is a record: seal in place, no gather

    def __init__(self, spec: KVSpec, num_slots: int) -> None:
        self.spec = spec
        self.num_slots = num_slots
        self.slot_bytes = round_up(HEADER_BYTES + spec.page_bytes)
        self.total_bytes = self.slot_bytes * num_slots

    def chunk_views(self, buffer: torch.Tensor) -> list[list[torch.Tensor]]:
        spec = self.spec
        return [
            [
                torch.as_strided(buffer, (self.num_slots, c.bytes_per_layer), (self.slot_bytes, 1),
                                 buffer.storage_offset() + HEADER_BYTES + spec.chunk_offset(ci, layer))
                for layer in range(spec.num_layers)
            ]
            for ci, c in enumerate(spec.components)
        ]

    def slot_offset(self, slot: int) -> int:
        return slot * self.slot_bytes

    def read_payload(self, array: np.ndarray, slot: int, out: np.ndarray) -> None:
        start = slot * self.slot_bytes + HEADER_BYTES
        out[:] = array[start:start + self.spec.page_bytes]

    def write_payload(self, array: np.ndarray, slot: int, payload: np.ndarray) -> None:
        start = slot * self.slot_bytes + HEADER_BYTES
        array[start:start + self.spec.page_bytes] = payload


class LayerFirstLayout:
    name = "layer_first"
    holds_records = False

    def __init__(self, spec: KVSpec, num_slots: int) -> None:
        self.spec = spec
        self.num_slots = num_slots
        self.slot_bytes = spec.page_bytes  # bytes a slot owns, spread over the component arrays
        self._component_starts = []
        position = 0
        for c in spec.components:
            self._component_starts.append(position)
            position += round_up(c.bytes_per_layer * spec.num_layers * num_slots)
        self.total_bytes = position

    def _chunk_start(self, ci: int, layer: int, slot: int) -> int:
        c = self.spec.components[ci]
        return self._component_starts[ci] + (layer * self.num_slots + slot) * c.bytes_per_layer

    def chunk_views(self, buffer: torch.Tensor) -> list[list[torch.Tensor]]:
        return [
            [
                torch.as_strided(buffer, (self.num_slots, c.bytes_per_layer), (c.bytes_per_layer, 1),
                                 buffer.storage_offset() + self._chunk_start(ci, layer, 0))
                for layer in range(self.spec.num_layers)
            ]
            for ci, c in enumerate(self.spec.components)
        ]

    def _chunks(self, slot: int):
        spec = self.spec
        for ci, c in enumerate(spec.components):
            for layer in range(spec.num_layers):
                yield self._chunk_start(ci, layer, slot), spec.chunk_offset(ci, layer), c.bytes_per_layer

    def read_payload(self, array: np.ndarray, slot: int, out: np.ndarray) -> None:
        for src, dst, n in self._chunks(slot):
            out[dst:dst + n] = array[src:src + n]

    def write_payload(self, array: np.ndarray, slot: int, payload: np.ndarray) -> None:
        for dst, src, n in self._chunks(slot):
            array[dst:dst + n] = payload[src:src + n]


LAYOUTS = {layout.name: layout for layout in (PageFirstLayout, LayerFirstLayout)}
