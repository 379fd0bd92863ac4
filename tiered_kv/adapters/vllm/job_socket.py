"""The link between ``TieredKVSpec``'s two halves inside vLLM: a Unix socket of the engine.

vLLM builds the manager (scheduler) and the worker from the same config, in the EngineCore and in a
worker process, which may be one process or two; its connector metadata carries only load and
store specs. So L3's jobs (``EXISTS``, ``PREFETCH``, ``PUT``) and their results travel over a
socket of their own, named after vLLM's engine id and the worker's rank:

    scheduler -> worker   ("jobs", [Job, ...])
    worker -> scheduler   ("results", [JobResult, ...]) | ("degraded", bool) | ("closing", None)

The socket lives in Linux's abstract namespace (no file to leave behind) and both ends prove the
engine's key derived from the engine id, so no other engine or user feeds jobs into this one.
``SocketLink`` is the link of an ``L3Jobs`` (see ``tiered_kv.hierarchy.l3_jobs``); ``JobServer``
serves a ``JobWorker`` and its ``L3Controller``. Neither may block vLLM's scheduler: the scheduler
end connects lazily and never waits for an answer.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from typing import Any

from tiered_kv.hierarchy.jobs import Job, JobKind, JobResult

log = logging.getLogger(__name__)

#: How often the server looks at the controller's state, and how long a refused connect waits before the next.
POLL_S = 0.05
RECONNECT_S = 0.5


def socket_address(engine_id: str, rank: int) -> str:
    """The abstract socket of one engine's worker ``rank``."""
    digest = hashlib.blake2b(f"{engine_id}/{rank}".encode(), digest_size=12).hexdigest()
    return f"\0tiered-kv-vllm-{digest}"


def socket_key(engine_id: str) -> bytes:
    return hashlib.blake2b(f"tiered-kv-vllm-link/{engine_id}".encode(), digest_size=32).digest()


def _hang_up(conn: Any) -> None:
    """Close ``conn`` so that a thread blocked in its ``recv`` wakes up (a plain close may not wake it)."""
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
    except OSError:
        pass
    conn.close()


class SocketLink:
    """The scheduler's end: a link for ``L3Jobs`` that connects on first use."""

    def __init__(self, address: str, authkey: bytes) -> None:
        self.address = address
        self._authkey = authkey
        self._conn: Any = None
        self._next_try = 0.0
        self._send_lock = threading.Lock()
        self._receiver: threading.Thread | None = None
        self._on_results: Callable[[Sequence[JobResult]], None] = lambda results: None
        self._on_lost: Callable[[], None] = lambda: None
        self.degraded = False
        self._closed = False

    def start(self, on_results: Callable[[Sequence[JobResult]], None], on_lost: Callable[[], None]) -> None:
        self._on_results, self._on_lost = on_results, on_lost

    def ready(self) -> bool:
        """Connected to the worker (a try at most every ``RECONNECT_S`` until it is up); never blocks long."""
        if self._conn is not None or self._closed:
            return self._conn is not None
        now = time.monotonic()
        if now < self._next_try:
            return False
        self._next_try = now + RECONNECT_S
        try:
            self._conn = Client(self.address, family="AF_UNIX", authkey=self._authkey)
        except (OSError, EOFError, AuthenticationError):   # the worker is not up yet, or not this engine's
            return False
        self._receiver = threading.Thread(target=self._receive, args=(self._conn,), name="tkv-vllm-l3-results",
                                          daemon=True)
        self._receiver.start()
        return True

    def _receive(self, conn: Any) -> None:
        while True:
            try:
                op, payload = conn.recv()
            except (EOFError, OSError):
                break
            if op == "results":
                self._on_results(payload)
            elif op == "degraded":
                self.degraded = payload
            elif op == "closing":       # the engine shuts its worker down: no news
                self._closed = True
        if not self._closed:
            log.warning("tiered-kv: the worker's L3 link closed; L3 reads as down")
        self.degraded = True
        self._on_lost()

    def send(self, jobs: Sequence[Job]) -> None:
        if self._conn is None:
            raise OSError("the worker's L3 link is not connected")
        with self._send_lock:
            self._conn.send(("jobs", list(jobs)))

    def cancel(self, job_id: int) -> bool:
        return False   # the worker gives up queued puts of a degraded tier itself; their result ends them

    def close(self, *, drain: bool = True, deadline: float | None = None) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            _hang_up(conn)
        if self._receiver is not None:
            self._receiver.join(1.0)


class JobServer:
    """The worker's end: runs the scheduler's jobs on a ``JobWorker`` and sends results back.

    While the controller is degraded it gives up the puts still queued in it (they would wait for
    the tier's return while the scheduler holds their L2 slots), as ``CacheManager`` does.
    """

    def __init__(self, address: str, authkey: bytes, worker: Any) -> None:
        self.worker = worker
        self._authkey = authkey
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(address)
        self._listener.listen(4)
        self._listener.settimeout(POLL_S)   # accept wakes up to see a close
        self._conn: Any = None
        self._send_lock = threading.Lock()
        self._open: dict[int, JobKind] = {}
        self._open_lock = threading.Lock()
        self._stop = threading.Event()
        self._serving: list[threading.Thread] = []
        worker.listener = self._result
        self._threads = [threading.Thread(target=self._accept, name="tkv-vllm-l3-accept", daemon=True),
                         threading.Thread(target=self._watch, name="tkv-vllm-l3-watch", daemon=True)]
        for thread in self._threads:
            thread.start()

    def _send(self, message: tuple) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            with self._send_lock:
                conn.send(message)
        except (OSError, EOFError, ValueError):   # the scheduler went away; its jobs end with it
            pass

    def _result(self, result: JobResult) -> None:
        with self._open_lock:
            self._open.pop(result.job_id, None)
        self._send(("results", [result]))

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:   # the listener was closed
                return
            sock.setblocking(True)
            conn = Connection(sock.detach())
            try:
                deliver_challenge(conn, self._authkey)   # both ends prove the key, as Client expects
                answer_challenge(conn, self._authkey)
            except (AuthenticationError, OSError, EOFError):   # a peer without the engine's key
                conn.close()
                continue
            if self._conn is not None:   # a new scheduler end replaces the old one
                _hang_up(self._conn)
            self._conn = conn
            self._send(("degraded", self._degraded()))
            serving = threading.Thread(target=self._serve, args=(conn,), name="tkv-vllm-l3-jobs", daemon=True)
            self._serving.append(serving)
            serving.start()

    def _serve(self, conn: Any) -> None:
        while not self._stop.is_set():
            try:
                op, jobs = conn.recv()
            except (EOFError, OSError):
                return
            if op != "jobs":
                continue
            for job in jobs:
                with self._open_lock:
                    self._open[job.job_id] = job.kind
                self.worker.submit([job])

    def _degraded(self) -> bool:
        return bool(self.worker.l3 is not None and self.worker.l3.degraded)

    def _watch(self) -> None:
        degraded = False
        while not self._stop.wait(POLL_S):
            now = self._degraded()
            if now != degraded:
                degraded = now
                self._send(("degraded", now))
            if now:
                with self._open_lock:
                    puts = [job_id for job_id, kind in self._open.items() if kind is JobKind.PUT]
                for job_id in puts:
                    self.worker.cancel(job_id)

    def close(self, deadline: float) -> None:
        """Stop serving; every L3 job is answered (the controller's close) by ``deadline``."""
        self._send(("closing", None))
        self._stop.set()
        for thread in self._threads:
            thread.join(POLL_S * 4)
        self.worker.close(drain=False, deadline=deadline)
        self._listener.close()
        if self._conn is not None:
            _hang_up(self._conn)
        for thread in self._serving:
            thread.join(1.0)
