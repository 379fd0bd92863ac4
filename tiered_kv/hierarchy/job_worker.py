"""The worker side of the job protocol: runs every byte move the scheduler side planned.

``JobWorker.submit(jobs)`` hands each ``Job`` to the handler of its ``(source, destination)``
tiers, looked up in one table:

    (L1, L2)  STORE      TransferEngine.backup; the slots are sealed once the bytes landed
    (L2, L1)  LOAD       TransferEngine.load; per-layer waits through ``load_handle(job_id)``
    (L3, L2)  PREFETCH   L3Controller.get_into
    (L2, L3)  PUT        L3Controller.put_from
    (L3, -)   EXISTS     L3Controller.exists
    (-, L3)   DELETE     L3Controller.delete

and reports each finished job as a plain ``JobResult``: through ``get_finished()`` (polled), and at
once through ``listener`` for the jobs whose completion calls back (the L3 ones, from the
controller's thread). A failing L3 degrades the controller only; L1 <-> L2 jobs go on.

It owns what moves bytes (the transfer engine, host pool, controller) and nothing of the
scheduler's: it never decides, allocates or frees a slot, and never holds an index.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ..errors import ConfigError
from .controller import L3Controller, heard_from_l3
from .jobs import Job, JobKind, JobResult, Tier


class Running(Protocol):
    """A job under way: ``done()`` without blocking, then ``result()`` once."""

    def done(self) -> bool: ...

    def result(self) -> JobResult: ...


Handler = Callable[[Job], Running]


class _FromFuture:
    """An L3 job over the controller's future."""

    def __init__(self, job: Job, future: concurrent.futures.Future, controller: L3Controller) -> None:
        self.job, self.future, self.controller = job, future, controller

    def done(self) -> bool:
        return self.future.done()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        self.future.add_done_callback(lambda _f: fn())

    def cancel(self) -> bool:
        return self.controller.cancel(self.future)

    def result(self) -> JobResult:
        job, future = self.job, self.future
        degraded = self.controller.degraded
        if future.cancelled():
            return JobResult.failed(job, cancelled=True, l3_degraded=degraded)
        exc = future.exception()
        if exc is not None:
            return JobResult.failed(job, l3_degraded=degraded, error=f"{type(exc).__name__}: {exc}")
        answer = future.result()
        heard = heard_from_l3(future)
        if job.kind is JobKind.EXISTS:
            count = int(answer)
            ok = (True,) * count + (False,) * (len(job.keys) - count)
        elif job.kind is JobKind.DELETE:
            ok, count = (True,) * len(job.keys), len(job.keys)
        else:
            ok = tuple(bool(x) for x in answer)
            count = sum(ok)
        return JobResult(job.job_id, job.kind, ok, count, heard, False, False, degraded)


class _Copy:
    """An L1 <-> L2 job over the transfer engine's completion; a store seals its slots on result."""

    def __init__(self, job: Job, handle: Any, seal: Callable[[], None] | None) -> None:
        self.job, self.handle, self.seal = job, handle, seal

    def done(self) -> bool:
        return bool(self.handle.done())

    def result(self) -> JobResult:
        if self.seal is not None:
            self.seal()
        return JobResult(self.job.job_id, self.job.kind, (True,) * len(self.job.keys), len(self.job.keys))


class JobWorker:
    """Runs jobs on one L1 <-> L2 transfer half and one L3 controller (either may be None).

    Args:
        transfers: a ``TransferHalf`` (its engine and host pool) for STORE / LOAD, or None.
        l3: the ``L3Controller`` for PREFETCH / PUT / EXISTS / DELETE, or None.
        handlers: replaces entries of the dispatch table (tests: fake handlers on CPU).
        listener: called with each result whose completion calls back (L3 jobs), on the thread
            that completed it; those results are not returned by ``get_finished`` again.
    """

    def __init__(self, transfers: Any = None, l3: L3Controller | None = None, *,
                 handlers: dict[tuple[Tier | None, Tier | None], Handler] | None = None,
                 listener: Callable[[JobResult], None] | None = None) -> None:
        self.transfers = transfers
        self.l3 = l3
        self.listener = listener
        self.handlers: dict[tuple[Tier | None, Tier | None], Handler] = {
            JobKind.STORE.route: self._store,
            JobKind.LOAD.route: self._load,
            JobKind.PREFETCH.route: lambda job: self._l3_job(job, lambda c: c.get_into(job.keys, job.slots)),
            JobKind.PUT.route: lambda job: self._l3_job(job, lambda c: c.put_from(job.keys, job.slots)),
            JobKind.EXISTS.route: lambda job: self._l3_job(job, lambda c: c.exists(job.keys)),
            JobKind.DELETE.route: lambda job: self._l3_job(job, lambda c: c.delete(job.keys)),
        }
        self.handlers.update(handlers or {})
        self._lock = threading.Lock()
        self._polled: dict[int, Running] = {}  # completions without a callback (copies)
        self._called_back: dict[int, Running] = {}  # L3 jobs, until their callback ran
        self._finished: list[JobResult] = []
        self._loads: dict[int, Any] = {}  # job id -> the load's handle, for per-layer waits

    # --- submission --------------------------------------------------------------------------
    def submit(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            if not isinstance(job, Job):
                raise ConfigError(f"JobWorker.submit takes Jobs, got {type(job).__name__}")
            handler = self.handlers.get(job.kind.route)
            if handler is None:
                raise ConfigError(f"no handler for {job.kind.name} ({job.kind.route})")
            running = handler(job)
            if hasattr(running, "add_done_callback"):
                with self._lock:
                    self._called_back[job.job_id] = running
                running.add_done_callback(lambda job_id=job.job_id: self._called(job_id))
            else:
                self._polled[job.job_id] = running

    def _called(self, job_id: int) -> None:
        with self._lock:
            running = self._called_back.pop(job_id, None)
        if running is None:
            return
        result = running.result()
        if self.listener is not None:
            self.listener(result)
        else:
            with self._lock:
                self._finished.append(result)

    def cancel(self, job_id: int) -> bool:
        """Drop a job that has not started (L3 jobs only); its result then says ``cancelled``."""
        with self._lock:
            running = self._called_back.get(job_id)
        cancel = getattr(running, "cancel", None)
        return bool(cancel()) if cancel is not None else False

    # --- results -----------------------------------------------------------------------------
    def get_finished(self) -> list[JobResult]:
        """Results of the jobs finished since the last call (non-blocking)."""
        done = [job_id for job_id, running in self._polled.items() if running.done()]
        results = [self._polled.pop(job_id).result() for job_id in done]
        for job_id in done:
            self._loads.pop(job_id, None)
        with self._lock:
            results += self._finished
            self._finished = []
        return results

    def in_flight(self) -> int:
        with self._lock:
            return len(self._polled) + len(self._called_back)

    def load_handle(self, job_id: int) -> Any:
        """The handle of a LOAD still in flight (``wait_layer(i)``, ``layer_done(i)``); None once
        its result was taken."""
        return self._loads.get(job_id)

    # --- handlers ----------------------------------------------------------------------------
    def _need_transfers(self, job: Job) -> Any:
        if self.transfers is None:
            raise ConfigError(f"{job.kind.name} job {job.job_id}: this worker has no L1 <-> L2 transfer half")
        return self.transfers

    def _store(self, job: Job) -> Running:
        transfers = self._need_transfers(job)
        host = transfers.host_pool
        handle = transfers.engine.backup(list(job.pages), list(job.slots))
        transfers.bytes_stored += len(job.keys) * host.spec.page_bytes

        def seal() -> None:
            if host.holds_records:
                for key, slot in zip(job.keys, job.slots):
                    host.seal(slot, key)
        return _Copy(job, handle, seal)

    def _load(self, job: Job) -> Running:
        transfers = self._need_transfers(job)
        handle = transfers.engine.load(list(job.slots), list(job.pages))
        transfers.bytes_loaded += len(job.keys) * transfers.host_pool.spec.page_bytes
        self._loads[job.job_id] = handle
        return _Copy(job, handle, None)

    def _l3_job(self, job: Job, call: Callable[[L3Controller], concurrent.futures.Future]) -> Running:
        if self.l3 is None:
            raise ConfigError(f"{job.kind.name} job {job.job_id}: this worker has no L3")
        return _FromFuture(job, call(self.l3), self.l3)

    def close(self, *, drain: bool = True, deadline: float | None = None) -> None:
        """Close the controller (every L3 job answered); copies in flight are the engine's."""
        if self.l3 is not None:
            self.l3.close(drain=drain, deadline=deadline)


__all__ = ["Handler", "JobWorker", "Running"]
