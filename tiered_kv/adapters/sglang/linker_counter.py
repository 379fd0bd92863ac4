"""SGLang's layer-done counter driven by tiered-kv load handles.

SGLang's KV pools call ``wait_until(layer)`` before a layer's attention reads the cache, for the
batch the worker named with ``set_consumer(index)``. Here that wait is each load handle's
``wait_layer(layer)``: on a GPU the current stream waits for that layer's event (the host never
blocks), on a CPU the copies have landed already. It never frees a page or a slot: the linker ends
a batch through ``finish``.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


class HandleLayerCounter:
    """Per batch index, the load handles whose layers the forward waits for."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.producer_index = -1
        self.consumer_index = -1
        self._batches: dict[int, list[Any]] = {}
        self._failed: dict[int, BaseException] = {}

    def update_producer(self) -> int:
        self.producer_index += 1
        self._batches[self.producer_index] = []
        return self.producer_index

    def add(self, index: int, handle: Any) -> None:
        self._batches[index].append(handle)

    def fail(self, index: int, error: BaseException) -> None:
        """A load of batch ``index`` could not be issued; ``finish`` reports it."""
        self._failed[index] = error

    def set_consumer(self, index: int) -> None:
        self.consumer_index = index

    def wait_until(self, threshold: int) -> None:
        for handle in self._batches.get(self.consumer_index, ()):
            handle.wait_layer(threshold)

    def layers_done(self, index: int) -> int:
        """How many leading layers of batch ``index`` have landed (never blocks)."""
        handles = self._batches.get(index, ())
        for layer in range(self.num_layers):
            if not all(handle.layer_done(layer) for handle in handles):
                return layer
        return self.num_layers

    def finish(self, index: int) -> bool:
        """Wait for every layer of batch ``index``; True when all of them landed."""
        handles = self._batches.pop(index, [])
        for handle in handles:
            handle.synchronize()
        error = self._failed.pop(index, None)
        if error is not None:
            logger.error("tiered-kv linker: a load of batch %d failed: %s", index, error)
        return error is None

    def pending(self) -> list[int]:
        return list(self._batches)

    def reset(self) -> None:
        for index in self.pending():
            self.finish(index)
        self.producer_index = -1
        self.consumer_index = -1
