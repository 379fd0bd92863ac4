"""Copies of whole blocks between vLLM's KV blocks (L1, a ``DevicePool``) and L2 slots (a
``HostPool``), as jobs that vLLM's offloading worker submits and polls; no vLLM import here.

On a GPU worker every job goes through tiered-kv's ``TransferEngine``, on the engine's own streams
(ordered after the work already on the caller's stream), with one completion per job that is
polled without blocking. On vLLM's CPU platform the torch path copies at once and the job is
complete when its call returns.

It must never report a job finished before its bytes have landed, never seal a slot before its
store's copy completed (the seal reads the bytes), and never copy into or out of a block or slot
that the job does not name.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tiered_kv.errors import IndexValidationError
from tiered_kv.model.device_pool import DevicePool
from tiered_kv.model.host_pool import HostPool
from tiered_kv.transfers.torch_path import torch_backup, torch_load

#: What ``finished`` reports per job: (job id, success, bytes moved, seconds from submit to seen done).
Finished = tuple[int, bool, int, float]


@dataclass
class _Job:
    """A submitted job: its completion (None: complete), the slots to seal once it completed."""

    job_id: int
    handle: Any
    nbytes: int
    started: float
    seals: Sequence[tuple[int, str]] = ()

    def done(self) -> bool:
        return self.handle is None or self.handle.done()


class BlockCopies:
    """Store (L1 blocks -> L2 slots, sealed under their keys) and load (L2 slots -> L1 blocks) jobs."""

    def __init__(self, l1: DevicePool, l2: HostPool) -> None:
        self.l1 = l1
        self.l2 = l2
        self.on_gpu = l1.device.type == "cuda"
        self._engine = None
        if self.on_gpu:
            from tiered_kv.transfers.engine import TransferEngine  # CUDA only on a GPU worker

            self._engine = TransferEngine(l1, l2)
        self._pending: list[_Job] = []   # in submission order

    def store(self, job_id: int, blocks: Sequence[int], slots: Sequence[int], keys: Sequence[str]) -> None:
        """Copy ``blocks`` into ``slots``; each slot is sealed as the record of its key once the
        copy completed. A bad id raises ``IndexValidationError`` before anything moves."""
        started = time.perf_counter()
        blocks, slots, keys = list(blocks), list(slots), list(keys)
        if len(keys) != len(slots):
            raise IndexValidationError(f"store job {job_id}: {len(slots)} slots but {len(keys)} keys")
        handle = None
        if slots:
            if self._engine is not None:
                handle = self._engine.backup(blocks, slots)
            else:
                torch_backup(self.l1, self.l2, blocks, slots)
        elif blocks:
            raise IndexValidationError(f"store job {job_id}: {len(blocks)} blocks but no slots")
        self._pending.append(_Job(job_id, handle, len(slots) * self.l2.spec.page_bytes, started,
                                  tuple(zip(slots, keys))))

    def load(self, job_id: int, slots: Sequence[int], blocks: Sequence[int]) -> None:
        """Copy ``slots`` into ``blocks`` (every layer). A bad id raises ``IndexValidationError``
        before anything moves."""
        started = time.perf_counter()
        slots, blocks = list(slots), list(blocks)
        handle = None
        if slots:
            if self._engine is not None:
                handle = self._engine.load(slots, blocks)
            else:
                torch_load(self.l2, self.l1, slots, blocks)
        elif blocks:
            raise IndexValidationError(f"load job {job_id}: {len(blocks)} blocks but no slots")
        self._pending.append(_Job(job_id, handle, len(slots) * self.l2.spec.page_bytes, started))

    def finished(self) -> list[Finished]:
        """Jobs whose copies completed since the last call, in submission order (non-blocking);
        a store's slots are sealed here, after its copy completed."""
        done, still = [], []
        for job in self._pending:
            (done if job.done() else still).append(job)
        self._pending = still
        now = time.perf_counter()
        for job in done:
            for slot, key in job.seals:
                self.l2.seal(slot, key)
        return [(job.job_id, True, job.nbytes, now - job.started) for job in done]

    def in_flight(self) -> list[int]:
        """Ids of the jobs not reported by ``finished`` yet, in submission order."""
        return [job.job_id for job in self._pending]

    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until the copies of ``job_ids`` completed (``finished`` then reports them)."""
        wanted = set(job_ids)
        for job in self._pending:
            if job.job_id in wanted and job.handle is not None:
                job.handle.synchronize()

    def close(self) -> None:
        """Wait for every copy in flight (the host pool may be unpinned next: a copy still
        reading it would fault on the device), then stop the engine's issue threads."""
        for job in self._pending:
            if job.handle is not None:
                job.handle.synchronize()
        self._pending = []
        if self._engine is not None:
            self._engine.close()
