"""The worker side in a child process: ``PipeLink``, jobs and results over a ``multiprocessing`` pipe.

The parent (the scheduler) holds ``L3Jobs`` over a ``PipeLink``; the child (spawned, so it shares
nothing with the parent but the pipe) builds its worker side with a factory (a picklable,
importable function, e.g. ``stack_worker``) and serves:

    parent -> child   ("jobs", [Job, ...]) | ("call", id, name, args) | ("close", drain, deadline)
    child -> parent   ("ready", None) | ("failed", text) | ("results", [JobResult, ...]) | ("degraded", bool)
                      | ("answer", id, value) | ("closed", tasks left on the controller's loop)

L3 results go back from the controller's thread as they finish; copies are polled by the child's
loop. ``call`` runs ``cancel`` (``JobWorker.cancel``) or a function the factory named on the worker's own objects (the engine's model
work on L1, such as the replay's fill and check of pages): what a serving engine does in its worker
process anyway. When the child dies (killed, crashed), the parent's receiving thread sees the pipe
close and answers every open job as lost (``L3Jobs.on_lost``).

A serving engine would not use a pipe: jobs ride in the scheduler's output to its workers (vLLM's
connector metadata, SGLang's scheduler-to-worker queue) and results in the workers' output back
(``OutboxLink``). The pipe is the transport of the tests, the replay and the benchmark.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import multiprocessing
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, PoolError
from .jobs import Job, JobResult

#: How long a close waits, past its deadline, for the child to answer and exit.
CLOSE_GRACE_S = 5.0


@dataclass
class WorkerParts:
    """What a factory builds in the child: the worker side, the calls it offers, its own close."""

    worker: Any
    calls: dict[str, Callable[..., Any]] = field(default_factory=dict)
    close: Callable[[], None] = lambda: None


def _serve(conn: Any, factory: Callable[..., WorkerParts], args: tuple) -> None:
    """The child's loop (see the module docstring)."""
    lock = threading.Lock()

    def send(message: tuple) -> None:
        with lock:
            conn.send(message)

    try:
        parts = factory(*args)
    except Exception as exc:  # reported to the parent, which raises it there
        send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    worker = parts.worker
    worker.listener = lambda result: send(("results", [result]))
    send(("ready", None))
    degraded = False
    while True:
        if conn.poll(0.0002 if worker.in_flight() else 0.05):
            message = conn.recv()
            op = message[0]
            if op == "jobs":
                for job in message[1]:
                    try:
                        worker.submit([job])
                    except ConfigError as exc:  # no handler or tier for it here: the job fails, the worker goes on
                        send(("results", [JobResult.failed(job, error=str(exc))]))
            elif op == "call":
                _, call_id, name, call_args = message
                call = worker.cancel if name == "cancel" else parts.calls[name]
                send(("answer", call_id, call(*call_args)))
            elif op == "close":
                worker.close(drain=message[1], deadline=message[2])
                finished = worker.get_finished()
                if finished:
                    send(("results", finished))
                left_over = worker.l3.pending_tasks() if worker.l3 is not None else 0
                parts.close()
                send(("closed", left_over))
                return
        finished = worker.get_finished()
        if finished:
            send(("results", finished))
        now = bool(worker.l3 is not None and worker.l3.degraded)
        if now != degraded:
            degraded = now
            send(("degraded", now))


class PipeLink:
    """A link to a worker side in a spawned child process (see the module docstring)."""

    def __init__(self, factory: Callable[..., WorkerParts], *args: Any, start_timeout_s: float = 120.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, factory, args), name="tkv-worker-side", daemon=True)
        self.process.start()
        child.close()  # only the child holds its end: its death closes the pipe here
        self.degraded = False
        self.left_over_tasks: int | None = None  # tasks the child's controller left at close (must be 0)
        self._send_lock = threading.Lock()
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._call_ids = itertools.count(1)
        self._closed = threading.Event()
        self._on_results: Callable[[Sequence[JobResult]], None] = lambda results: None
        self._on_lost: Callable[[], None] = lambda: None
        self._receiver: threading.Thread | None = None
        try:
            if not self._conn.poll(start_timeout_s):
                raise PoolError(f"the worker process did not start within {start_timeout_s}s")
            op, payload = self._conn.recv()
        except (EOFError, OSError):
            self._kill()
            raise PoolError(f"the worker process died while starting (exit code {self.process.exitcode})") from None
        except BaseException:
            self._kill()
            raise
        if op != "ready":
            self._kill()
            raise ConfigError(f"the worker process could not build its worker side: {payload}")

    def start(self, on_results: Callable[[Sequence[JobResult]], None], on_lost: Callable[[], None]) -> None:
        self._on_results, self._on_lost = on_results, on_lost
        self._receiver = threading.Thread(target=self._receive, name="tkv-pipe-results", daemon=True)
        self._receiver.start()

    def _receive(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):  # the child is gone
                self._lose()
                return
            op = message[0]
            if op == "results":
                self._on_results(message[1])
            elif op == "degraded":
                self.degraded = message[1]
            elif op == "answer":
                future = self._calls.pop(message[1], None)
                if future is not None:
                    future.set_result(message[2])
            elif op == "closed":
                self.left_over_tasks = message[1]
                self._closed.set()
                return

    def _lose(self) -> None:
        self.degraded = True
        self._on_lost()
        for future in list(self._calls.values()):
            if not future.done():
                future.set_exception(PoolError("the worker process went away"))
        self._calls.clear()
        self._closed.set()

    def _send(self, message: tuple) -> None:
        with self._send_lock:
            self._conn.send(message)

    def send(self, jobs: Sequence[Job]) -> None:
        self._send(("jobs", list(jobs)))

    def cancel(self, job_id: int) -> bool:
        """Ask the child to drop the job and wait for its word (one round trip: cancels are rare,
        and a degraded tier's queued puts must go at once); True once it was dropped (its
        cancelled result came in first, on the same pipe)."""
        try:
            return bool(self.call("cancel", job_id))
        except (OSError, EOFError, PoolError, concurrent.futures.TimeoutError):
            return False

    def call(self, name: str, *args: Any, timeout_s: float = 60.0) -> Any:
        """Run the factory's call ``name`` in the child and return its value."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        call_id = next(self._call_ids)
        self._calls[call_id] = future
        self._send(("call", call_id, name, args))
        return future.result(timeout=timeout_s)

    def close(self, *, drain: bool = True, deadline: float | None = None) -> None:
        """Ask the child to close its worker side (answering every job) and exit; kill it past
        ``deadline`` and the grace (its open jobs are then lost)."""
        if deadline is None:
            deadline = time.monotonic() + 30.0
        try:
            self._send(("close", drain, deadline))
        except (OSError, EOFError):
            pass
        if not self._closed.wait(max(0.0, deadline - time.monotonic()) + CLOSE_GRACE_S):
            self._kill()
        if self._receiver is not None:
            self._receiver.join(CLOSE_GRACE_S)
        self.process.join(CLOSE_GRACE_S)
        if self.process.is_alive():
            self._kill()
        self._conn.close()

    @property
    def worker_gone(self) -> bool:
        """Whether the child has exited (reaped): nothing of it can still write a slot."""
        if self.process.exitcode is None and not self.process.is_alive():
            self.process.join(CLOSE_GRACE_S)
        return self.process.exitcode is not None

    def kill(self) -> None:
        """SIGKILL the child (tests: a worker that dies mid-job)."""
        self.process.kill()
        self.process.join(CLOSE_GRACE_S)

    def _kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(CLOSE_GRACE_S)


class ChildController:
    """The child's ``L3Controller`` as the parent sees it: ``stats`` copied by a call (read them
    before the close), the state through ``L3Jobs``, the tasks it left at close from the link."""

    def __init__(self, jobs: Any) -> None:
        self.jobs = jobs

    @property
    def stats(self) -> Any:
        return self.jobs.link.call("controller_stats")

    @property
    def degraded(self) -> bool:
        return self.jobs.degraded

    @property
    def closed(self) -> bool:
        return self.jobs.closed

    def pending_tasks(self) -> int | None:
        return self.jobs.link.left_over_tasks

    def close(self, *, drain: bool = True, deadline: float | None = None) -> None:
        self.jobs.close(drain=drain, deadline=deadline)


def stack_worker(spec: Any, host_slots: int, l1_pages: int = 0, l3_url: str | None = None,
                 open_options: dict | None = None, limits: Any = None, device: str = "cpu") -> WorkerParts:
    """A whole worker side in the child: an L2 ``HostPool`` of ``host_slots``, an engine-like L1
    pool of ``l1_pages`` (0: none) with its ``TransferHalf``, and an ``L3Controller`` over
    ``l3_url`` (None: none). Calls offered: ``fill`` and ``verify`` (oracle bytes on L1 pages),
    ``seal`` (keys, slots: L2 slots the caller filled are sealed for those keys, as a landed
    store's are), ``controller_stats``."""
    from .. import HostPool, allocate_engine_like
    from ..backends import open_backend
    from .controller import ControllerLimits, L3Controller
    from .job_worker import JobWorker
    from .oracle import fill_pages, verify_pages
    from .worker import TransferHalf

    host = HostPool(spec, host_slots)
    host.allocate(host_slots)  # every slot is the scheduler's to hand out: none is handed out here
    controller = None
    if l3_url is not None:
        options = open_options or {}
        controller = L3Controller(lambda: open_backend(l3_url, host, **options), record_bytes=host.record_bytes,
                                  limits=limits or ControllerLimits())
    transfers, calls = None, {}
    if l1_pages:
        pool = allocate_engine_like(spec, l1_pages + 1, device=device)
        transfers = TransferHalf(pool, host)
        calls = {"fill": lambda keys, pages: fill_pages(pool, keys, pages),
                 "verify": lambda keys, pages: verify_pages(pool, keys, pages)}
    calls["controller_stats"] = lambda: None if controller is None else controller.stats
    calls["seal"] = lambda keys, slots: [host.seal(slot, key) for key, slot in zip(keys, slots)] and None

    def close() -> None:
        host.close()

    return WorkerParts(JobWorker(transfers, controller), calls, close)


__all__ = ["CLOSE_GRACE_S", "ChildController", "PipeLink", "WorkerParts", "stack_worker"]
