"""The transfer half (worker side): page ids in, completion handles and per-layer waits out.

``TransferHalf`` carries out the metadata half's plans over the landed ``TransferEngine``: a
``LoadPlan`` (L2 slots -> the engine's L1 pages, one event per layer, so layer ``i`` can be used
while ``i+1`` is in flight) and a ``StorePlan`` (L1 pages -> L2 slots, all layers). A store's slots
are sealed (key and checksum written) only once its backup completed, and reported back through
``finished_stores``: the manager makes them resident then, never earlier. Slots and pages are
released only through the handles returned here.

Launches happen on the caller's thread (the engine's), never on the controller's loop.
``NullTransferHalf`` is the same interface with no bytes, for ``--simulate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..model.completion import DONE, Completion
from .manager import LoadPlan, StorePlan, check_copy_plan


class _NothingLoaded:
    """The handle of an empty load: every layer has landed."""

    def wait_layer(self, layer: int, stream: Any = None) -> None:
        return None

    def layer_done(self, layer: int) -> bool:
        return True

    def done(self) -> bool:
        return True

    query = done

    def synchronize(self) -> None:
        return None


NOTHING_LOADED = _NothingLoaded()


class TransferHalf:
    """Moves plans' pages between one device pool and one host pool."""

    moves_bytes = True

    def __init__(self, device_pool: Any, host_pool: Any, *, path: str = "auto", options: Any = None) -> None:
        """``path`` and ``options`` (a ``TransferOptions``) go to the engine as they are: a serving
        engine whose model computes while loads run passes ``TransferOptions(beside_compute=True)``,
        so ``auto`` takes the splits that leave the model its SMs."""
        from ..transfers.engine import TransferEngine  # torch / CUDA only on the worker side

        self.device_pool = device_pool
        self.host_pool = host_pool
        self.engine = TransferEngine(device_pool, host_pool, path=path, options=options)
        self._stores: list[tuple[StorePlan, Any]] = []
        self.bytes_loaded = 0
        self.bytes_stored = 0

    def load(self, plan: LoadPlan, device_pages: Sequence[int]) -> Any:
        """Every layer of ``plan``'s slots into ``device_pages``; a handle with ``wait_layer``."""
        check_copy_plan(plan, LoadPlan, device_pages, "load")
        if not len(plan):
            return NOTHING_LOADED
        self.bytes_loaded += len(plan) * self.host_pool.spec.page_bytes
        plan.handle = self.engine.load(plan.slots, list(device_pages))
        return plan.handle

    def store(self, plan: StorePlan, device_pages: Sequence[int]) -> Completion:
        """Back ``device_pages`` (one per plan key) up into the plan's slots; returns the completion
        that gates the reuse of those device pages."""
        check_copy_plan(plan, StorePlan, device_pages, "store")
        if not len(plan):
            return DONE
        handle = self.engine.backup(list(device_pages), plan.slots)
        plan.handle = handle
        self.bytes_stored += len(plan) * self.host_pool.spec.page_bytes
        self._stores.append((plan, handle))
        return handle

    def finished_stores(self) -> list[StorePlan]:
        """Plans whose backups completed, sealed now (non-blocking). A plan the manager ended
        already (``complete_store`` while its backup ran: its slots may be free by now) is
        neither sealed nor returned."""
        done, still = [], []
        for plan, handle in self._stores:
            (done if handle.done() else still).append((plan, handle))
        self._stores = still
        done = [(plan, handle) for plan, handle in done if not plan.completed]
        if self.host_pool.holds_records:
            for plan, _ in done:
                for key, slot in zip(plan.keys, plan.slots):
                    self.host_pool.seal(slot, key)
        return [plan for plan, _ in done]

    def drain(self) -> list[StorePlan]:
        """Wait for every store in flight (close, tests); returns them sealed."""
        for _, handle in self._stores:
            sync = getattr(handle, "synchronize", None)
            if sync is not None:
                sync()
        return self.finished_stores()


class NullTransferHalf:
    """The same interface, moving nothing: ``--simulate`` runs the index and policies alone."""

    moves_bytes = False
    bytes_loaded = 0
    bytes_stored = 0

    def __init__(self) -> None:
        self._stores: list[StorePlan] = []

    def load(self, plan: LoadPlan, device_pages: Sequence[int]) -> Any:
        return NOTHING_LOADED

    def store(self, plan: StorePlan, device_pages: Sequence[int]) -> Completion:
        if len(plan):
            self._stores.append(plan)
        return DONE

    def finished_stores(self) -> list[StorePlan]:
        done, self._stores = self._stores, []
        return [plan for plan in done if not plan.completed]

    drain = finished_stores


__all__ = ["NullTransferHalf", "TransferHalf"]
