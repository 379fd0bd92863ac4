"""The scheduler side's L3: every call a ``Job`` sent over a link, every answer a ``JobResult``.

``L3Jobs`` has the calls the ``CacheManager`` makes of L3 (``exists``, ``get_into``, ``put_from``,
``delete``, ``cancel``, ``degraded``, ``close``) and answers each with a
``concurrent.futures.Future`` of this process, resolved when the job's result comes back (from the
link's thread). The slots a job names are held in the allocator until its result says the worker
is done with them, so a slot freed under a running prefetch or put is not handed out again; a job
lost with its worker (the link broke) never says so, and its slots stay held: quarantined, counted
in ``lost_slots``, never reused while what the worker did to them is unknown.

``attach(link)`` puts a new worker side in place of a lost one, and L3 serves again. The
quarantined slots are released then only where the old link proves its worker can touch them no
more (``worker_gone``: its process has exited, so no write of it can still land); otherwise they
stay held for good.

A link is any object with ``start(on_results, on_lost)``, ``send(jobs)``, ``cancel(job_id) ->
bool`` (True only when the job is known dropped), ``degraded`` and ``close(drain, deadline)``, and
optionally ``poll()`` (results that nothing else hands back: ``LocalLink``'s copies); the
ones in ``tiered_kv.hierarchy.links`` run the worker side in this process or in a child process.

This module must never import torch, the controller or a backend: it is what the scheduler
process holds of L3.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, TieredKVError
from .jobs import Job, JobKind, JobResult

#: Set on a future answered without asking the backend (refused, degraded, lost).
_NOT_FROM_L3 = "_tiered_kv_not_from_l3"


def heard_from_l3(future: concurrent.futures.Future) -> bool:
    """Whether a finished future's answer came from the backend itself: a "miss" made up by the
    controller (queue full, closing, degraded tier, cancelled) or by a lost worker is no news
    about what L3 holds."""
    return (future.done() and not future.cancelled() and future.exception() is None
            and not getattr(future, _NOT_FROM_L3, False))


class JobFailedError(TieredKVError):
    """A job failed on the worker side with an error that is no answer (a bug there), as text."""


@dataclass(frozen=True)
class JobLimits:
    """What the manager reads of the L3 side's limits: the bound of a whole close."""

    drain_timeout_s: float = 30.0


class _ResultIn:
    """A job's slot hold: done once its result came back, never for a lost job."""

    __slots__ = ("_done",)

    def __init__(self) -> None:
        self._done = False

    def done(self) -> bool:
        return self._done


class L3Jobs:
    """L3 as the scheduler sees it over a ``link`` to the worker side (see the module docstring)."""

    def __init__(self, link: Any, *, limits: Any = JobLimits()) -> None:
        self.link = link
        self.limits = limits
        self.allocator: Any = None
        self.lost_slots: list[int] = []
        self.released_slots = 0  # quarantined slots released by ``attach`` once provably unused
        self._lost_holds: list[_ResultIn] = []
        self.jobs_sent = 0
        self.jobs_lost = 0
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._open: dict[int, tuple[Job, concurrent.futures.Future, _ResultIn]] = {}
        self._by_future: dict[int, int] = {}  # id(future) -> job id, for cancel
        self._lost = False
        self._closed = False
        link.start(self.on_results, self.on_lost)

    def bind(self, allocator: Any) -> None:
        """The L2 slot allocator whose slots the jobs name (the manager binds its own)."""
        self.allocator = allocator

    @property
    def degraded(self) -> bool:
        return self._lost or bool(self.link.degraded)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def capacity_pages(self) -> int | None:
        """L3's capacity in pages where the link knows it (the worker side in this process); else None."""
        return getattr(self.link, "capacity_pages", None)

    @property
    def lost(self) -> bool:
        """The worker side went away; every job of it was answered as lost."""
        return self._lost

    def in_flight(self) -> int:
        with self._lock:
            return len(self._open)

    def poll(self) -> None:
        """Take in the results the link holds until asked (a copy over a ``LocalLink``)."""
        poll = getattr(self.link, "poll", None)
        if poll is not None and not self._lost and not self._closed:
            poll()

    # --- calls -------------------------------------------------------------------------------
    def exists(self, keys: Sequence[str]) -> concurrent.futures.Future:
        """Future of the length of the leading run of ``keys`` present on L3."""
        return self._submit(JobKind.EXISTS, keys)

    def get_into(self, keys: Sequence[str], slots: Sequence[int]) -> concurrent.futures.Future:
        """Future of per-key booleans (the verified leading run) for a prefetch into ``slots``."""
        return self._submit(JobKind.PREFETCH, keys, slots)

    def put_from(self, keys: Sequence[str], slots: Sequence[int]) -> concurrent.futures.Future:
        """Future of per-key booleans for a backup of sealed ``slots``."""
        return self._submit(JobKind.PUT, keys, slots)

    def delete(self, keys: Sequence[str]) -> concurrent.futures.Future:
        """Future of None once ``keys`` are dropped from L3."""
        return self._submit(JobKind.DELETE, keys)

    def cancel(self, future: concurrent.futures.Future) -> bool:
        """Drop a job that has not started; True only when it is known dropped (its future is
        cancelled then). Over a link that cannot say at once, False: the job's result ends it."""
        with self._lock:
            job_id = self._by_future.get(id(future))
        if job_id is None or self._lost or self._closed:
            return False
        return bool(self.link.cancel(job_id)) and future.cancelled()

    def copy(self, kind: JobKind, keys: Sequence[str], slots: Sequence[int],
             pages: Sequence[int]) -> concurrent.futures.Future:
        """An L1 <-> L2 job (STORE or LOAD) over the same link: future of per-key booleans."""
        if kind not in (JobKind.STORE, JobKind.LOAD):
            raise ConfigError(f"copy takes STORE or LOAD, got {kind.name}")
        return self._submit(kind, keys, slots, pages)

    def _submit(self, kind: JobKind, keys: Sequence[str], slots: Sequence[int] = (),
                pages: Sequence[int] = ()) -> concurrent.futures.Future:
        job = Job(next(self._ids), kind, tuple(keys), tuple(slots), tuple(pages))
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self._closed or self._lost:
            _answer(future, JobResult.failed(job, lost=self._lost))
            return future
        held = _ResultIn()
        with self._lock:
            self._open[job.job_id] = (job, future, held)
            self._by_future[id(future)] = job.job_id
        if job.slots and self.allocator is not None:
            self.allocator.hold(job.slots, held)
        self.jobs_sent += 1
        try:
            self.link.send([job])
        except (OSError, EOFError):  # the link is gone: this job and every other open one are lost
            self.on_lost()
        return future

    # --- answers (the link's thread) ---------------------------------------------------------
    def on_results(self, results: Sequence[JobResult]) -> None:
        """Take the worker side's results in: resolve each job's future, release its slot hold."""
        for result in results:
            with self._lock:
                entry = self._open.pop(result.job_id, None)
                if entry is not None:
                    self._by_future.pop(id(entry[1]), None)
            if entry is None:
                continue
            _, future, held = entry
            if not result.lost:
                held._done = True
            _answer(future, result)

    def on_lost(self) -> None:
        """The worker side went away: every open job is answered as lost; their slots stay held."""
        with self._lock:
            self._lost = True
            entries = list(self._open.values())
            self._open.clear()
            self._by_future.clear()
        for job, future, held in entries:
            self.lost_slots.extend(job.slots)
            if job.slots:
                self._lost_holds.append(held)
            self.jobs_lost += 1
            _answer(future, JobResult.failed(job, lost=True))

    def attach(self, link: Any) -> int:
        """Serve L3 (and copies) through ``link``, a new worker side, in place of the lost one.

        The old link is closed. Returns how many quarantined slots were released: all of them when
        the old link says ``worker_gone`` (its process exited: nothing of it can still write a
        slot), else none (they stay held). Raises ``ConfigError`` while the old worker side is not
        lost, or after ``close``.
        """
        if self._closed:
            raise ConfigError("attach after close: this L3Jobs is closed")
        if not self._lost:
            raise ConfigError("attach takes a new worker side only once the old one was lost")
        old = self.link
        try:
            old.close(drain=False, deadline=0.0)
        except (OSError, EOFError):
            pass
        released = 0
        if getattr(old, "worker_gone", False):
            for held in self._lost_holds:
                held._done = True
            released = len(self.lost_slots)
            self.released_slots += released
            self.lost_slots, self._lost_holds = [], []
            if self.allocator is not None and hasattr(self.allocator, "reap"):
                self.allocator.reap()
        self.link = link
        with self._lock:
            self._lost = False
        link.start(self.on_results, self.on_lost)
        return released

    def close(self, *, drain: bool = True, deadline: float | None = None) -> None:
        """Close the link (the worker side answers or refuses every job first); a job still open
        after that is lost."""
        if self._closed:
            return
        try:
            self.link.close(drain=drain, deadline=deadline)
        finally:
            if self.in_flight():
                self.on_lost()
            self._closed = True


def _answer(future: concurrent.futures.Future, result: JobResult) -> None:
    """Resolve ``future`` as the controller would have: cancelled, an error, or the value."""
    if future.done():
        return
    if result.cancelled:
        future.cancel()
        return
    if result.error is not None:
        future.set_exception(JobFailedError(result.error))
        return
    if not result.heard:
        setattr(future, _NOT_FROM_L3, True)
    if result.kind is JobKind.EXISTS:
        future.set_result(result.count)
    elif result.kind is JobKind.DELETE:
        future.set_result(None)
    else:
        future.set_result(list(result.ok))


__all__ = ["JobFailedError", "JobLimits", "L3Jobs", "heard_from_l3"]
