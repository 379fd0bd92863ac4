"""Futures that are done by a deadline: what a caller waits on while a lookup waits for L3.

``Deadlines.bounded(future, at)`` returns a future that is done once ``future`` is done or the
monotonic clock passes ``at``, whichever comes first, so an engine (or the replay) that waits on a
lookup's pending L3 answer wakes up when the lookup's budget has run out and asks again. One timer
thread serves every deadline of a manager; it starts with the first deadline and stops at
``close``. It never touches the futures it bounds: it only resolves its own (with None).
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import threading
import time


class Deadlines:
    """One timer thread resolving bounded futures at their deadlines."""

    def __init__(self, name: str = "tkv-lookup-deadlines") -> None:
        self._name = name
        self._heap: list[tuple[float, int, concurrent.futures.Future]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def bounded(self, future: concurrent.futures.Future, at: float) -> concurrent.futures.Future:
        """A future done (None) when ``future`` is done or at the monotonic time ``at``."""
        out: concurrent.futures.Future = concurrent.futures.Future()
        future.add_done_callback(lambda _f: _resolve(out))
        if out.done():
            return out
        with self._cond:
            if self._closed:
                _resolve(out)
                return out
            heapq.heappush(self._heap, (at, next(self._order), out))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return out

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                while self._heap and (self._heap[0][0] <= now or self._heap[0][2].done()):
                    _resolve(heapq.heappop(self._heap)[2])
                self._cond.wait(None if not self._heap else self._heap[0][0] - now)

    def close(self) -> None:
        """Resolve every bounded future and stop the thread."""
        with self._cond:
            self._closed = True
            for _, _, out in self._heap:
                _resolve(out)
            self._heap.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=5.0)


def _resolve(out: concurrent.futures.Future) -> None:
    try:
        out.set_result(None)
    except concurrent.futures.InvalidStateError:  # the other side resolved it first
        pass


__all__ = ["Deadlines"]
