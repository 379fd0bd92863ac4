"""``TransferHalf``'s interface over jobs: L1 <-> L2 copies run by a worker side elsewhere.

An engine-side component written against ``TransferHalf`` (``load(plan, pages)``,
``store(plan, pages)``, ``finished_stores()``, ``drain()``), such as ``L1PrefixCache``, runs
unchanged when the bytes move in another process: each call becomes a LOAD or STORE job on the
scheduler side's ``L3Jobs`` link, and each handle is the job's future. Per-layer waits do not
cross a process, and need not: the load's bytes land in the worker's process (L1 is there), where
the engine's model runner waits on each layer through ``JobWorker.load_handle(job_id)``; here
``wait_layer`` waits for the whole load, which is what the scheduler side needs to know.

Plain data only: this module must never import torch, the controller or a backend.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

from .jobs import JobKind
from .l3_jobs import L3Jobs
from .manager import LoadPlan, StorePlan, check_copy_plan


#: How often a wait on a copy asks the link for results that nothing else hands back.
POLL_S = 0.0005


class JobHandle:
    """A copy's handle: its job's future (``done``), waited on whole. ``pump``: asks the link for
    results it holds until asked (``L3Jobs.poll``); without it a copy over a ``LocalLink`` that
    landed after its job was sent would never be answered."""

    def __init__(self, future: concurrent.futures.Future, pump: Callable[[], None] | None = None) -> None:
        self.future = future
        self.pump = pump

    def done(self) -> bool:
        if not self.future.done() and self.pump is not None:
            self.pump()
        return self.future.done()

    query = done

    def synchronize(self) -> None:
        if self.pump is None:
            concurrent.futures.wait([self.future])
            return
        while not self.done():
            concurrent.futures.wait([self.future], timeout=POLL_S)

    def wait_layer(self, layer: int, stream: Any = None) -> None:
        self.synchronize()

    def layer_done(self, layer: int) -> bool:
        return self.done()

    def moved(self) -> bool:
        """Whether every page of the copy landed (False too for a lost or failed job)."""
        f = self.future
        return f.done() and not f.cancelled() and f.exception() is None and all(f.result())


class _Landed:
    """An empty copy: done at once."""

    def done(self) -> bool:
        return True

    query = done

    def synchronize(self) -> None:
        return None

    def wait_layer(self, layer: int, stream: Any = None) -> None:
        return None

    def layer_done(self, layer: int) -> bool:
        return True


class JobTransferHalf:
    """L1 <-> L2 through ``jobs`` (see the module docstring). ``on_failed_store(plan)``: what to do
    with a store whose job failed or was lost (its slots stay the manager's: complete it as failed)."""

    moves_bytes = True

    def __init__(self, jobs: L3Jobs, *, page_bytes: int = 0,
                 on_failed_store: Callable[[StorePlan], None] | None = None) -> None:
        self.jobs = jobs
        self.page_bytes = page_bytes
        self.on_failed_store = on_failed_store
        self._stores: list[tuple[StorePlan, JobHandle]] = []
        self.bytes_loaded = 0
        self.bytes_stored = 0

    def load(self, plan: LoadPlan, device_pages: Sequence[int]) -> Any:
        check_copy_plan(plan, LoadPlan, device_pages, "load")
        if not len(plan):
            return _Landed()
        plan.handle = JobHandle(self.jobs.copy(JobKind.LOAD, plan.keys, plan.slots, list(device_pages)),
                                self.jobs.poll)
        self.bytes_loaded += len(plan) * self.page_bytes
        return plan.handle

    def store(self, plan: StorePlan, device_pages: Sequence[int]) -> Any:
        check_copy_plan(plan, StorePlan, device_pages, "store")
        if not len(plan):
            return _Landed()
        handle = JobHandle(self.jobs.copy(JobKind.STORE, plan.keys, plan.slots, list(device_pages)), self.jobs.poll)
        plan.handle = handle
        self.bytes_stored += len(plan) * self.page_bytes
        self._stores.append((plan, handle))
        return handle

    def finished_stores(self) -> list[StorePlan]:
        """Plans whose stores landed (the worker side sealed their slots); failed ones go to
        ``on_failed_store``."""
        if self._stores:
            self.jobs.poll()
        done, still = [], []
        for plan, handle in self._stores:
            (done if handle.done() else still).append((plan, handle))
        self._stores = still
        landed = []
        for plan, handle in done:
            if plan.completed:
                continue
            if handle.moved():
                landed.append(plan)
            elif self.on_failed_store is not None:
                self.on_failed_store(plan)
        return landed

    def drain(self) -> list[StorePlan]:
        for _, handle in self._stores:
            handle.synchronize()
        return self.finished_stores()


__all__ = ["JobHandle", "JobTransferHalf"]
