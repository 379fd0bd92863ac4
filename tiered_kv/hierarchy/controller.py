"""The L3 controller: one asyncio loop (in a thread of its own) that moves pages L3 <-> L2.

Callers on plain threads (the scheduler) submit work and get ``concurrent.futures.Future``s back at
once; nothing here blocks them. On the loop:

- an ``exists`` (a lookup waits on it) starts at once in a lane of its own, never behind the
  reads and writes of pages (a slow or hung medium held lookups behind prefetch reads); at most
  ``queue_depth`` at once, beyond that answered "miss" at once and counted;
- reads (prefetches L3 -> L2) and writes (backups L2 -> L3) wait in two bounded queues
  (beyond ``queue_depth`` a read is answered "miss" and a write refused, at once and counted);
  workers always take a read first, and a write starts only while no read is waiting, so a flood of
  writes never delays a read a request waits on (SGLang 31398, LMCache 4983);
- bytes in flight are limited per direction, per backend call: a job larger than the limit goes in
  calls that fit it (one page at a time at worst), never over it;
- a prefetch or ``exists`` cancelled is dropped (its future is cancelled), also while it runs:
  its backend call is cancelled and ``cancel`` returns once it has stopped. A ``Backend`` keeps a
  cancelled get from writing into its slots later (``cancels_reads_safely``: a blocking call's
  slots stay held in the pool until its thread returned), so the caller may free them at once: a
  read the prefetch policy gave up on no longer holds L2 slots, the link and a close up until it
  ends. A running get of an object that does not promise it runs to its end (the caller frees its
  slots through the future);
- a ``BackendError`` puts the tier in a degraded state: reads answer "miss" at once, writes wait for
  the tier to return, a health probe with exponential backoff brings it back (once the backend's
  ``check_health`` passes: file:// reads, since refused writes are counted puts; mooncake://, that
  a put fits again). Workers never die of it and never hang a request: every future gets an answer.
  Errors that are not the library's (bugs) are handed to the job's future, not swallowed;
- ``close()`` drains (or cancels) every job and task, then closes the backend on the loop, all
  within ``drain_timeout_s`` (a backend whose own close is still out then gets ``CLOSE_GRACE_S``
  more): a hung backend never holds a close up.

Answers that did not come from the backend (refused, degraded) say nothing about what L3 holds:
``heard_from_l3(future)`` tells them apart, so the index only learns from real answers.

The loop never launches GPU work: it only calls the backend (whose blocking calls run on the
backend's own executor). The backend may be any object with the backend contract's async methods
(``exists``, ``get_into``, ``put_from``, ``delete``, ``aclose``): a ``Backend`` over a host pool,
or the key-only simulated tier of ``--simulate``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import BackendError, ConfigError, TieredKVError
from .l3_jobs import _NOT_FROM_L3, heard_from_l3

log = logging.getLogger(__name__)

READ = "read"
WRITE = "write"

#: How long a close waits, past its deadline, for the backend's own close (and the loop to stop).
CLOSE_GRACE_S = 0.5


@dataclass(frozen=True)
class ControllerLimits:
    """The controller's bounds. Bytes are record bytes (header + payload) of the pages in flight."""

    read_workers: int = 4
    write_workers: int = 2
    queue_depth: int = 4096  # jobs waiting per direction; beyond it a read is a miss, a write refused
    batch_pages: int = 16  # pages per backend call
    # pages per backend call of a backup: a read that arrives waits for at most one such call per
    # write worker (a 16-page put on a 2-core machine held a waiting prefetch up 4x)
    write_batch_pages: int = 4
    max_read_bytes_in_flight: int = 1 << 30
    max_write_bytes_in_flight: int = 512 << 20
    retry_base_s: float = 0.05
    retry_max_s: float = 2.0
    write_retries: int = 3  # a write that failed this often while the tier was up is dropped
    # The bound of a whole close (the manager's and the controller's): waiting for L3 work, then
    # cancelling what is left and closing the backend (see L3Controller.close).
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("read_workers", "write_workers", "queue_depth", "batch_pages", "write_batch_pages",
                     "max_read_bytes_in_flight", "max_write_bytes_in_flight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"controller limit {name} must be an int > 0, got {value!r}")
        for name in ("retry_base_s", "retry_max_s", "drain_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ConfigError(f"controller limit {name} must be a finite number > 0, got {value!r}")
        if isinstance(self.write_retries, bool) or not isinstance(self.write_retries, int) or self.write_retries < 0:
            raise ConfigError(f"controller limit write_retries must be an int >= 0, got {self.write_retries!r}")


@dataclass
class ControllerStats:
    """Counted from the start; read by metrics and the replay."""

    reads_started: int = 0
    reads_completed: int = 0
    reads_cancelled: int = 0
    reads_degraded: int = 0  # answered "miss" because the tier was degraded
    reads_refused: int = 0  # answered "miss" because the read queue was full
    writes_started: int = 0
    writes_completed: int = 0
    writes_refused: int = 0  # queue full, or dropped at close / after retries
    writes_retried: int = 0
    backend_errors: int = 0
    degraded_episodes: int = 0
    recoveries: int = 0
    pages_read: int = 0
    pages_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    read_seconds: float = 0.0
    write_seconds: float = 0.0
    read_bytes_peak: int = 0  # the most bytes of reads in flight at once (<= the limit, or one page)
    write_bytes_peak: int = 0


@dataclass
class _Job:
    kind: str  # READ or WRITE
    op: str  # "exists", "get", "put"
    keys: list[str]
    slots: list[int]
    nbytes: int
    future: concurrent.futures.Future
    attempts: int = 0
    retry_at: float = 0.0
    cancelled: bool = field(default=False)
    task: asyncio.Task | None = None  # while it runs in a task of its own (exists, get): to cancel it


class L3Controller:
    """Moves pages between one L3 backend and L2 on a loop of its own.

    Args:
        open_backend: called on the loop thread to create the backend (so loop-bound clients such
            as redis.asyncio are created on the loop that uses them); or a backend object.
        record_bytes: bytes of one stored page (for the in-flight limits and byte counters).
        probe_key: a valid key the health probe asks about (``Backend.check_health``, else ``exists``).
    """

    def __init__(self, open_backend: Callable[[], Any] | Any, *, record_bytes: int,
                 limits: ControllerLimits = ControllerLimits(), name: str = "l3",
                 probe_key: str = "tiered-kv-health-probe") -> None:
        if isinstance(record_bytes, bool) or not isinstance(record_bytes, int) or record_bytes <= 0:
            raise ConfigError(f"record_bytes must be an int > 0, got {record_bytes!r}")
        if not isinstance(limits, ControllerLimits):
            raise ConfigError(f"limits must be a ControllerLimits, got {type(limits).__name__}")
        self.limits = limits
        self.name = name
        self.record_bytes = record_bytes
        self.stats = ControllerStats()
        self.probe_key = probe_key
        self._degraded = False
        self._reads: deque[_Job] = deque()
        self._writes: deque[_Job] = deque()
        self._bytes_in_flight = {READ: 0, WRITE: 0}
        self._running = {READ: 0, WRITE: 0}
        self._room: dict[str, asyncio.Condition] = {}  # per direction: bytes in flight went down
        self._closing = False
        self._stopping = False  # workers return at their next turn (close)
        self._closed = False
        self._left_over = 0  # tasks still alive when the loop stopped (must be 0)
        self._loop = asyncio.new_event_loop()
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._probe: asyncio.Task | None = None
        self._lane: set[asyncio.Task] = set()  # exists calls running (their lane)
        self._deletes: set[asyncio.Task] = set()  # deletes running: a later exists waits for them
        self._running_reads: dict[int, _Job] = {}  # id(future) -> a get running, to cancel it
        self._thread = threading.Thread(target=self._run_loop, name=f"tkv-{name}-controller", daemon=True)
        started: concurrent.futures.Future = concurrent.futures.Future()
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(open_backend, started), self._loop)
        try:
            started.result(timeout=limits.drain_timeout_s)
        except BaseException:
            self._stop_loop()
            raise

    # --- lifecycle ---------------------------------------------------------------------------
    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    async def _start(self, open_backend: Callable[[], Any] | Any, started: concurrent.futures.Future) -> None:
        try:
            self.backend = open_backend() if callable(open_backend) and not hasattr(open_backend, "exists") else open_backend
        except BaseException as exc:  # handed to the constructor's caller
            started.set_exception(exc)
            return
        self._wake = asyncio.Event()
        self._room = {READ: asyncio.Condition(), WRITE: asyncio.Condition()}
        self._tasks = [asyncio.create_task(self._worker(READ), name=f"{self.name}-read-{i}")
                       for i in range(self.limits.read_workers)]
        self._tasks += [asyncio.create_task(self._worker(WRITE), name=f"{self.name}-write-{i}")
                        for i in range(self.limits.write_workers)]
        started.set_result(None)

    @property
    def degraded(self) -> bool:
        return self._degraded

    @property
    def capacity_pages(self) -> int | None:
        """Pages the backend holds at most, where it knows (file with a capacity, memory); else None."""
        return getattr(self.backend, "capacity_pages", None)

    @property
    def closed(self) -> bool:
        return self._closed

    def queue_depths(self) -> dict[str, int]:
        return {READ: len(self._reads), WRITE: len(self._writes)}

    def bytes_in_flight(self) -> dict[str, int]:
        return dict(self._bytes_in_flight)

    def pending_tasks(self) -> int:
        """Tasks still alive on the loop (0 after ``close``)."""
        if self._closed:
            return self._left_over
        return self._call(lambda: sum(1 for t in asyncio.all_tasks(self._loop)
                                     if not t.done() and t is not asyncio.current_task()))

    def _call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()

    def close(self, *, drain: bool = True, deadline: float | None = None) -> None:
        """Finish (``drain``) or cancel every queued job, stop the workers, close the backend.

        Returns by ``deadline`` (a ``time.monotonic()`` value; default: ``drain_timeout_s`` from
        now), and at most ``CLOSE_GRACE_S`` later when the backend's own close is still out: work
        not finished by then is cancelled (its future answered as refused or missed), and a
        backend call that hangs is left to its executor thread, whose slots it holds until it
        returned. The manager's close passes the deadline it started from, so one bound governs
        both."""
        if self._closed:
            return
        if deadline is None:
            deadline = time.monotonic() + self.limits.drain_timeout_s
        future = asyncio.run_coroutine_threadsafe(self._close(drain, deadline), self._loop)
        finished = False
        try:
            future.result(timeout=max(0.0, deadline - time.monotonic()) + CLOSE_GRACE_S)
            finished = True
        except concurrent.futures.TimeoutError:
            log.warning("%s: the close did not finish within drain_timeout_s=%ss; the loop is stopped anyway",
                        self.name, self.limits.drain_timeout_s)
        finally:
            self._stop_loop(CLOSE_GRACE_S, count_left_over=not finished)
            self._closed = True

    def _stop_loop(self, wait_s: float = 10.0, *, count_left_over: bool = False) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=wait_s)
        if count_left_over:  # the close was cut short: what it left on the loop is still there
            self._left_over = sum(1 for t in asyncio.all_tasks(self._loop) if not t.done())
        if not self._thread.is_alive():
            self._loop.close()

    async def _close(self, drain: bool, deadline: float) -> None:
        self._closing = True
        if drain and not self._degraded:
            while (self._reads or self._writes or any(self._running.values())) and time.monotonic() < deadline:
                self._wake_workers()
                await asyncio.sleep(0.005)
        for queue in (self._reads, self._writes):
            while queue:
                self._refuse(queue.popleft())
        # The flag, not only cancel(): Python 3.11's wait_for swallows a cancellation that arrives
        # as its awaitable completes (a wake-up at close), and the worker would loop on forever.
        self._stopping = True
        self._wake_workers()
        lane = list(self._lane) + list(self._deletes)
        for task in self._tasks + lane + ([self._probe] if self._probe else []):
            task.cancel()
        await asyncio.gather(*self._tasks, *lane, *([self._probe] if self._probe else []), return_exceptions=True)
        close = getattr(self.backend, "aclose", None)
        if close is not None:
            try:
                await asyncio.wait_for(close(), max(0.0, deadline - time.monotonic()) + CLOSE_GRACE_S)
            except TimeoutError:
                log.warning("%s: the backend did not close within drain_timeout_s=%ss", self.name,
                            self.limits.drain_timeout_s)
            except TieredKVError as exc:  # the tier is going away anyway; say so once
                log.warning("%s: closing the backend failed: %s", self.name, exc)
        me = asyncio.current_task()
        self._left_over = sum(1 for t in asyncio.all_tasks() if not t.done() and t is not me)

    # --- submission (any thread) -------------------------------------------------------------
    def exists(self, keys: Sequence[str]) -> concurrent.futures.Future:
        """Future of the length of the leading run of ``keys`` present on L3 (0 when degraded)."""
        return self._submit(READ, "exists", list(keys), [], 0)

    def get_into(self, keys: Sequence[str], slots: Sequence[int]) -> concurrent.futures.Future:
        """Future of per-key booleans (the verified leading run) for a prefetch into ``slots``."""
        return self._submit(READ, "get", list(keys), list(slots), len(keys) * self.record_bytes)

    def put_from(self, keys: Sequence[str], slots: Sequence[int]) -> concurrent.futures.Future:
        """Future of per-key booleans for a backup of sealed ``slots``; refused (all False) when the
        write queue is full or the controller is closing."""
        return self._submit(WRITE, "put", list(keys), list(slots), len(keys) * self.record_bytes)

    def delete(self, keys: Sequence[str]) -> concurrent.futures.Future:
        """Future of None once ``keys`` are dropped from L3 (a key-only call outside the queues:
        it moves no bytes). A backend error answers it with that error and degrades nothing."""
        if self._closed or self._closing:
            future: concurrent.futures.Future = concurrent.futures.Future()
            future.set_exception(BackendError(f"{self.name}: the controller is closing"))
            return future
        future = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._start_delete, list(keys), future)
        return future

    def _start_delete(self, keys: list[str], future: concurrent.futures.Future) -> None:
        """Start a delete on the loop, registered at once: an ``exists`` submitted after it waits
        for it (it runs at once in its lane and would otherwise race the delete)."""
        if future.cancelled():
            return
        task = self._loop.create_task(self.backend.delete(keys), name=f"{self.name}-delete")
        self._deletes.add(task)

        def done(t: asyncio.Task) -> None:
            self._deletes.discard(t)
            if future.cancelled():
                return
            if t.cancelled():
                future.cancel()
            elif t.exception() is not None:
                future.set_exception(t.exception())
            else:
                future.set_result(None)
        task.add_done_callback(done)

    def cancel(self, future: concurrent.futures.Future) -> bool:
        """Drop a read (``exists``, get) queued or running, or a write not started; True if it was
        dropped (its future is cancelled). A running read's backend call has stopped when this
        returns, and no byte of it lands in its slots later (the backend contract)."""
        if self._closed or future.done():
            return False
        try:
            return asyncio.run_coroutine_threadsafe(self._cancel(future), self._loop).result()
        except RuntimeError:  # the loop stopped meanwhile (a close): the close answers the job
            return False

    async def _cancel(self, future: concurrent.futures.Future) -> bool:
        if self._cancel_queued(future):
            return True
        job = self._running_reads.get(id(future))
        if job is None or job.task is None or job.future is not future or future.done():
            return False
        if job.op == "get" and not getattr(self.backend, "cancels_reads_safely", False):
            return False  # an object that does not promise it: its read runs to its end
        job.cancelled = True
        job.task.cancel()
        await asyncio.wait([job.task])
        return future.cancelled()

    def _submit(self, kind: str, op: str, keys: list[str], slots: list[int], nbytes: int) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        job = _Job(kind, op, keys, slots, nbytes, future)
        if self._closed or self._closing:
            self._refuse(job)
            return future
        self._loop.call_soon_threadsafe(self._enqueue, job)
        return future

    # --- on the loop -------------------------------------------------------------------------
    def _enqueue(self, job: _Job) -> None:
        if self._closing:
            self._refuse(job)
            return
        if job.kind == READ:
            if self._degraded:
                self._answer_degraded(job)
                return
            if job.op == "exists":
                self._start_in_lane(job)
                return
            if len(self._reads) >= self.limits.queue_depth:
                self.stats.reads_refused += 1
                self._answer_miss(job)
                return
            self._reads.append(job)
        else:
            if len(self._writes) >= self.limits.queue_depth:
                self._refuse(job)
                return
            self._writes.append(job)
        self._wake_workers()

    def _start_in_lane(self, job: _Job) -> None:
        """An ``exists`` runs at once in a task of its own (the lane), up to ``queue_depth`` at once."""
        if len(self._lane) >= self.limits.queue_depth:
            self.stats.reads_refused += 1
            self._answer_miss(job)
            return
        task = asyncio.get_running_loop().create_task(self._run_tracked(job, after=tuple(self._deletes)),
                                                      name=f"{self.name}-exists")
        job.task = task
        self._lane.add(task)
        task.add_done_callback(self._lane.discard)

    async def _run_tracked(self, job: _Job, after: Sequence[asyncio.Task] = ()) -> None:
        """Run a read in the task it was given, findable by its future for ``cancel``, once the
        tasks ``after`` (deletes submitted before it) are done."""
        self._running_reads[id(job.future)] = job
        try:
            if after:
                await asyncio.wait(after)
            await self._run(job)
        finally:
            self._running_reads.pop(id(job.future), None)

    def _wake_workers(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _cancel_queued(self, future: concurrent.futures.Future) -> bool:
        for queue in (self._reads, self._writes):
            for job in queue:
                if job.future is future:
                    queue.remove(job)
                    future.cancel()
                    if job.kind == READ:
                        self.stats.reads_cancelled += 1
                    else:
                        self.stats.writes_refused += 1  # dropped before it ran
                    return True
        return False

    def _refuse(self, job: _Job) -> None:
        if job.future.done():
            return
        if job.kind == WRITE:
            self.stats.writes_refused += 1
            setattr(job.future, _NOT_FROM_L3, True)
            job.future.set_result([False] * len(job.keys))
        else:
            self.stats.reads_cancelled += 1
            self._answer_miss(job)

    def _answer_degraded(self, job: _Job) -> None:
        self.stats.reads_degraded += 1
        self._answer_miss(job)

    @staticmethod
    def _answer_miss(job: _Job) -> None:
        """A read answered "miss" without asking the backend (marked so: see ``heard_from_l3``)."""
        if job.future.done():
            return
        setattr(job.future, _NOT_FROM_L3, True)
        job.future.set_result(0 if job.op == "exists" else [False] * len(job.keys))

    def _limit(self, kind: str) -> int:
        return self.limits.max_read_bytes_in_flight if kind == READ else self.limits.max_write_bytes_in_flight

    def _call_pages(self, kind: str) -> int:
        """Pages per backend call of ``kind``: the batch size, cut to what the byte limit holds (at
        least one page: a record larger than the limit still moves, alone)."""
        batch = self.limits.batch_pages if kind == READ else self.limits.write_batch_pages
        return max(1, min(batch, self._limit(kind) // self.record_bytes))

    def _next_job(self, kind: str) -> _Job | None:
        """The job a worker of ``kind`` may start now, or None."""
        if kind == READ:
            queue = self._reads
        else:
            # Reads first: a write starts only while no read waits and the tier is up.
            if self._reads or self._degraded:
                return None
            queue = self._writes
        if not queue:
            return None
        job = queue[0]
        if kind == WRITE and job.retry_at > time.monotonic():
            return None
        if not self._fits(kind, min(len(job.keys), self._call_pages(kind)) * self.record_bytes if job.nbytes else 0):
            return None  # its first call would go over the limit: wait for room
        return queue.popleft()

    def _fits(self, kind: str, nbytes: int) -> bool:
        in_flight = self._bytes_in_flight[kind]
        return not in_flight or in_flight + nbytes <= self._limit(kind)

    @contextlib.asynccontextmanager
    async def _moving(self, kind: str, nbytes: int) -> AsyncIterator[None]:
        """Count ``nbytes`` in flight for one backend call, once they fit under the limit."""
        room = self._room[kind]
        async with room:
            await room.wait_for(lambda: self._fits(kind, nbytes))
            self._bytes_in_flight[kind] += nbytes
            peak = "read_bytes_peak" if kind == READ else "write_bytes_peak"
            setattr(self.stats, peak, max(getattr(self.stats, peak), self._bytes_in_flight[kind]))
        try:
            yield
        finally:
            self._bytes_in_flight[kind] -= nbytes
            async with room:
                room.notify_all()
            self._wake_workers()

    async def _worker(self, kind: str) -> None:
        assert self._wake is not None
        while not self._stopping:
            job = self._next_job(kind)
            if job is None:
                self._wake.clear()
                # Woken by new jobs and finished ones; the timeout covers write retry times.
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self.limits.retry_base_s)
                except TimeoutError:
                    pass
                continue
            self._running[kind] += 1
            try:
                if kind == READ:  # a task of its own, so that cancel can stop it alone
                    job.task = asyncio.get_running_loop().create_task(self._run_tracked(job), name=f"{self.name}-get")
                    try:
                        await asyncio.wait([job.task])
                    finally:
                        if not job.task.done():  # the worker itself is cancelled (close)
                            job.task.cancel()
                            await asyncio.wait([job.task])
                else:
                    await self._run(job)
            finally:
                self._running[kind] -= 1
                self._wake_workers()

    async def _run(self, job: _Job) -> None:
        if job.future.cancelled():
            return
        started = time.perf_counter()
        try:
            result = await self._call_backend(job)
        except BackendError as exc:
            self.stats.backend_errors += 1
            self._enter_degraded(exc)
            if job.kind == WRITE and job.attempts < self.limits.write_retries and not self._closing:
                job.attempts += 1
                job.retry_at = time.monotonic() + self.limits.retry_base_s * (2 ** job.attempts)
                self.stats.writes_retried += 1
                self._writes.appendleft(job)
            elif job.kind == WRITE:
                self._refuse(job)
            else:
                self._answer_degraded(job)
            return
        except asyncio.CancelledError:
            if job.cancelled and not job.future.done():  # cancel(): the caller dropped it
                self.stats.reads_cancelled += 1
                job.future.cancel()
            else:
                self._refuse(job)
            raise
        except Exception as exc:  # not the library's: a bug; the caller gets it, the worker goes on
            job.future.set_exception(exc)
            return
        elapsed = time.perf_counter() - started
        self._count(job, result, elapsed)
        if not job.future.done():
            job.future.set_result(result)

    async def _call_backend(self, job: _Job) -> Any:
        backend = self.backend
        if job.op == "exists":
            self.stats.reads_started += 1
            return await backend.exists(job.keys)
        out: list[bool] = []
        if job.op == "get":
            self.stats.reads_started += 1
            step = self._call_pages(READ)
            for i in range(0, len(job.keys), step):
                keys = job.keys[i:i + step]
                async with self._moving(READ, len(keys) * self.record_bytes):
                    got = await backend.get_into(keys, job.slots[i:i + step])
                out.extend(got)
                if not all(got):  # only the leading run counts: stop reading past a miss
                    out.extend([False] * (len(job.keys) - len(out)))
                    break
            return out
        self.stats.writes_started += 1
        step = self._call_pages(WRITE)
        for i in range(0, len(job.keys), step):
            # Reads first, also within a backup: its next call waits while reads are queued or
            # running (they share the backend's threads, the link and the CPU).
            while (self._reads or self._running[READ]) and not self._stopping:
                await asyncio.sleep(0.0002)
            keys = job.keys[i:i + step]
            async with self._moving(WRITE, len(keys) * self.record_bytes):
                out.extend(await backend.put_from(keys, job.slots[i:i + step]))
        return out

    def _count(self, job: _Job, result: Any, elapsed: float) -> None:
        s = self.stats
        if job.op == "exists":
            s.reads_completed += 1
            return
        moved = sum(bool(x) for x in result)
        if job.kind == READ:
            s.reads_completed += 1
            s.pages_read += moved
            s.bytes_read += moved * self.record_bytes
            s.read_seconds += elapsed
        else:
            s.writes_completed += 1
            s.pages_written += moved
            s.bytes_written += moved * self.record_bytes
            s.write_seconds += elapsed

    # --- degraded tier -----------------------------------------------------------------------
    def _enter_degraded(self, exc: BaseException) -> None:
        if self._degraded:
            return
        self._degraded = True
        self.stats.degraded_episodes += 1
        log.warning("%s: tier degraded (%s); serving goes on from L1/L2, probing for its return", self.name, exc)
        while self._reads:  # nobody waits on a dead tier
            self._answer_degraded(self._reads.popleft())
        if not self._closing:
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_up(), name=f"{self.name}-probe")

    async def _probe_until_up(self) -> None:
        delay = self.limits.retry_base_s
        while not self._closing:
            await asyncio.sleep(delay)
            try:
                await self._ask_health()
            except BackendError:
                self.stats.backend_errors += 1
                delay = min(delay * 2, self.limits.retry_max_s)
                continue
            self._degraded = False
            self.stats.recoveries += 1
            log.warning("%s: tier is back", self.name)
            self._wake_workers()
            return

    async def _ask_health(self) -> None:
        """One health probe: a ``Backend``'s ``check_health`` (file://: reads; mooncake://: also
        that a put fits again), else ``exists`` of the probe key, for an
        object that has only the contract's data calls (the simulated tier of ``--simulate``)."""
        check = getattr(self.backend, "check_health", None)
        if check is None:
            await self.backend.exists([self.probe_key])
        else:
            await check(self.probe_key)


__all__ = ["CLOSE_GRACE_S", "ControllerLimits", "ControllerStats", "L3Controller", "heard_from_l3"]
