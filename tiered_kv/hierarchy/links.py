"""Links between the scheduler side (``L3Jobs``) and the worker side (``JobWorker``).

- ``LocalLink``: the worker side in this process; jobs are submitted at once and results come back
  on the completing thread (the controller's), so the one-process cache behaves as before. Copies
  (L1 <-> L2) do not call back: their results come in when the scheduler side sends or ``poll``s.
- ``OutboxLink``: jobs wait in an outbox for the engine's own transport (``take_jobs()``); the
  engine hands the worker side's ``get_finished()`` back through ``L3Jobs.on_results``. This is
  what vLLM's connector would use: jobs ride in the scheduler's output to the workers, results in
  the workers' output back.
- ``PipeLink`` (``tiered_kv.hierarchy.process_link``): the worker side in a child process, jobs
  and results over a ``multiprocessing`` pipe.

Each link answers every job: with its result, or, when the worker side is gone, as lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .jobs import Job, JobResult
from .l3_jobs import L3Jobs

if TYPE_CHECKING:  # the worker side loads only where it runs (local_l3 imports it)
    from .controller import L3Controller
    from .job_worker import JobWorker

OnResults = Callable[[Sequence[JobResult]], None]


class LocalLink:
    """The worker side in this process."""

    def __init__(self, worker: "JobWorker") -> None:
        self.worker = worker
        self._on_results: OnResults | None = None
        self._polling = threading.RLock()  # the worker's polled copies are not thread-safe; a result's callback may send again

    @property
    def controller(self) -> "L3Controller | None":
        return self.worker.l3

    def start(self, on_results: OnResults, on_lost: Callable[[], None]) -> None:
        self._on_results = on_results
        self.worker.listener = lambda result: on_results([result])

    def send(self, jobs: Sequence[Job]) -> None:
        with self._polling:
            self.worker.submit(jobs)
        self.poll()

    def poll(self) -> None:
        """Hand back the results of the jobs without a callback (copies) that finished."""
        with self._polling:
            finished = self.worker.get_finished()
        if finished and self._on_results is not None:
            self._on_results(finished)

    def cancel(self, job_id: int) -> bool:
        return self.worker.cancel(job_id)

    @property
    def degraded(self) -> bool:
        return self.worker.l3 is not None and self.worker.l3.degraded

    @property
    def capacity_pages(self) -> int | None:
        return None if self.worker.l3 is None else self.worker.l3.capacity_pages

    def close(self, *, drain: bool = True, deadline: float | None = None) -> None:
        self.worker.close(drain=drain, deadline=deadline)


class OutboxLink:
    """Jobs wait for the engine's transport; results come back through ``L3Jobs.on_results``."""

    def __init__(self) -> None:
        self._outbox: list[Job] = []
        self.degraded = False  # the engine sets it from the worker side's results
        self._on_lost: Callable[[], None] | None = None

    def start(self, on_results: OnResults, on_lost: Callable[[], None]) -> None:
        self._on_lost = on_lost

    def send(self, jobs: Sequence[Job]) -> None:
        self._outbox.extend(jobs)

    def take_jobs(self) -> list[Job]:
        """The jobs queued since the last call, for the engine to ship to the worker side."""
        jobs, self._outbox = self._outbox, []
        return jobs

    def cancel(self, job_id: int) -> bool:
        return False  # shipped or not, its result ends it

    def close(self, *, drain: bool = True, deadline: float | None = None) -> None:
        """Jobs still open at close are lost (the engine closes its worker side itself)."""


def local_l3(controller: Any, transfers: Any = None) -> L3Jobs:
    """``L3Jobs`` over a ``JobWorker`` in this process, on ``controller``: what a ``CacheManager``
    given an ``L3Controller`` uses."""
    from .controller import L3Controller
    from .job_worker import JobWorker

    if not isinstance(controller, L3Controller):
        raise ConfigError(f"l3 must be an L3Controller (or None for a two-tier cache), got {type(controller).__name__}"
                          + (": open the backend through L3Controller(lambda: open_backend(url, pool), ...)"
                             if isinstance(controller, str) else ""))
    return L3Jobs(LocalLink(JobWorker(transfers, controller)), limits=controller.limits)


__all__ = ["LocalLink", "OutboxLink", "local_l3"]
