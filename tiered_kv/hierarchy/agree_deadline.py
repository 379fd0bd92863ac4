"""The ``agree`` hook under the policies' deadline: ranks that have not agreed by then recompute.

``CacheManager(agree=...)`` takes any callable ``agree(hit_pages) -> int`` (``TcpAgreement``, a
gloo ``all_reduce(MIN)``, a test's function). Some of them have no deadline of their own, and one
that blocks would hold the scheduler's thread for as long as it likes (SGLang 30760: a prefetch
all-reduce deadlocked at TP 4). ``DeadlineAgree`` runs the hook on a thread of its own and waits at
most ``deadline_s``; past it the caller gets ``AgreeTimeout`` (no hit: recompute) and the hook's
call is left to finish on its thread.

A hook with a deadline of its own (a ``deadline_s`` attribute, as ``TcpAgreement`` has) is called
directly (``agree_with_deadline``): its deadline ends the round on every rank alike, where a second
timer on one rank would give up while the hook went on to answer the other ranks, and the ranks
would load different hits.

Calls run one at a time, in the order they were made, so a hook that numbers its rounds (as
``TcpAgreement`` does) still sees them in sequence. A hook that never returns would queue every
later call behind it: beyond ``max_waiting`` calls not yet started, a call times out at once
instead of queueing. The thread is a daemon: a hook stuck for good never holds up the interpreter's
exit. Never swallows the hook's own errors: they reach the caller as they were raised.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable

from ..errors import TieredKVError

_STOP = object()


class AgreeTimeout(TieredKVError, TimeoutError):
    """The ranks did not agree on a hit length before the deadline: recompute, never hang."""


class DeadlineAgree:
    """``agree(pages)`` through ``hook`` on a thread of its own, waiting at most ``deadline_s``."""

    def __init__(self, hook: Callable[[int], int], deadline_s: float, *, max_waiting: int = 64) -> None:
        self.hook = hook
        self.deadline_s = deadline_s
        self.max_waiting = max_waiting
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting = 0  # calls queued and not started
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def __call__(self, pages: int) -> int:
        with self._lock:
            if self._waiting >= self.max_waiting:
                raise AgreeTimeout(f"agree: {self._waiting} calls still wait behind one that has not returned")
            self._waiting += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="tkv-agree", daemon=True)
            self._thread.start()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((pages, future))
        concurrent.futures.wait([future], timeout=self.deadline_s)
        if not future.done():
            raise AgreeTimeout(f"agree: the ranks did not agree within {self.deadline_s}s")
        return future.result()  # the hook's answer, or its own error (AgreeTimeout included)

    def _serve(self) -> None:
        while True:
            item = self._calls.get()
            if item is _STOP:
                return
            pages, future = item
            with self._lock:
                self._waiting -= 1
            try:
                future.set_result(self.hook(pages))
            except BaseException as exc:  # handed to the waiting caller (or dropped if it gave up)
                future.set_exception(exc)

    def close(self) -> None:
        """Stop the thread once the calls before this one have run (returns at once)."""
        if self._thread is not None:
            self._calls.put(_STOP)
            self._thread = None


class DirectAgree:
    """A hook that bounds itself, called on the caller's thread (see the module's docstring)."""

    def __init__(self, hook: Callable[[int], int]) -> None:
        self.hook = hook

    def __call__(self, pages: int) -> int:
        return self.hook(pages)

    def close(self) -> None:
        pass


def has_own_deadline(hook: object) -> bool:
    deadline = getattr(hook, "deadline_s", None)
    return isinstance(deadline, (int, float)) and not isinstance(deadline, bool) and deadline > 0


def agree_with_deadline(hook: Callable[[int], int], deadline_s: float) -> "DeadlineAgree | DirectAgree":
    """``hook`` as the manager calls it: directly when it has a deadline of its own, else on a
    thread of its own, waited for at most ``deadline_s``."""
    return DirectAgree(hook) if has_own_deadline(hook) else DeadlineAgree(hook, deadline_s)


__all__ = ["AgreeTimeout", "DeadlineAgree", "DirectAgree", "agree_with_deadline", "has_own_deadline"]
