"""Streams the library owns, so that nothing else in the process is ever handed one of them.

``torch.cuda.Stream()`` does not make a stream: it hands out one of a pool of 32 per priority and
device, round-robin, shared by the whole process. So a serving engine's "new" stream can be one of
the transfer engine's, and work put on either then waits for the other's (no wrong bytes, but a
backup held behind the model's work, or the other way round). On the H200 a 40 ms kernel put on
such a shared stream held a backup from the call to 70 ms instead of 31 (docs/benchmarks.md,
"Transfers on the H200").

So a GPU engine makes its streams itself (``cudaStreamCreateWithPriority``, non-blocking, as torch
makes its pool's) and wraps them in ``torch.cuda.ExternalStream``. It never destroys one: the
caching allocator remembers the streams ``record_stream`` named until their blocks are reused, and
CUDA may hand a destroyed stream's handle out again. A stream whose owner went away goes back to a
process-wide free list instead, per device and priority, and the next owner takes it from there.
So a process makes at most as many streams as its owners held at once, and a stream has one owner
at a time.

An owner holds a ``StreamLease``: ``take`` lends it a stream, ``give_back`` returns some early (an
engine's replaced issue threads), and everything goes back on ``release`` or when the lease is
collected with its owner. Where the CUDA runtime cannot be bound (no CUDA device, or a torch that
links the runtime statically), a lease hands out torch's pool streams instead
(``StreamLease.owned`` is False), which is also what CPU tests patch.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Iterable
from typing import Protocol

import torch

from . import cudart


class StreamMaker(Protocol):
    """Makes raw streams for a ``StreamLender`` (the CUDA runtime; a stand-in in CPU tests)."""

    def priority(self, device_index: int, priority: int) -> int:
        """The priority a stream asked for at ``priority`` gets (clamped to the device's range)."""

    def make(self, device_index: int, priority: int) -> int:
        """A new stream's handle."""

    def wrap(self, handle: int, device_index: int) -> torch.cuda.Stream:
        """The torch stream object of ``handle``."""


class CudaStreamMaker:
    """Streams from ``cudaStreamCreateWithPriority``, wrapped as ``torch.cuda.ExternalStream``."""

    @staticmethod
    @functools.cache
    def _range(device_index: int) -> tuple[int, int]:
        with torch.cuda.device(device_index):
            return cudart.stream_priority_range()

    def priority(self, device_index: int, priority: int) -> int:
        least, greatest = self._range(device_index)
        return torch_pool_priority(priority, least, greatest)

    def make(self, device_index: int, priority: int) -> int:
        with torch.cuda.device(device_index):
            return cudart.stream_create(priority)

    def wrap(self, handle: int, device_index: int) -> torch.cuda.Stream:
        return torch.cuda.ExternalStream(handle, device=torch.device("cuda", device_index))


#: Priorities torch's stream pool has at most (``c10::cuda::max_compile_time_stream_priorities``).
TORCH_POOL_PRIORITIES = 4


def torch_pool_priority(priority: int, least: int, greatest: int) -> int:
    """The CUDA priority ``torch.cuda.Stream(priority=priority)`` gets on a device whose range is
    [greatest, least]: torch makes pools at 0, -1, ... down to as many levels as the device has,
    at most ``TORCH_POOL_PRIORITIES``, and clamps a request into them (so ``LOAD_STREAM_PRIORITY``,
    -100, is -3 on an H200, whose range goes to -5). Owned streams keep exactly those priorities,
    so only their sharing changes, never their order against the model's streams."""
    levels = min(least - greatest + 1, TORCH_POOL_PRIORITIES)
    return least - min(max(least - int(priority), 0), levels - 1)


class StreamLender:
    """The process's owned streams: those lent out and those free, per (device, priority)."""

    def __init__(self, maker: StreamMaker) -> None:
        self.maker = maker
        self._lock = threading.Lock()
        self._free: dict[tuple[int, int], list[int]] = {}
        self._lent: set[int] = set()
        #: Streams made so far (never destroyed, so the process's total).
        self.made = 0

    def lend(self, device_index: int, priority: int) -> tuple[int, tuple[int, int], torch.cuda.Stream]:
        """A stream none else holds: (handle, its (device, priority) key, the torch stream)."""
        key = (device_index, self.maker.priority(device_index, priority))
        with self._lock:
            free = self._free.get(key)
            handle = free.pop() if free else None
            if handle is None:
                handle = self.maker.make(*key)
                self.made += 1
            self._lent.add(handle)
        return handle, key, self.maker.wrap(handle, device_index)

    def take_back(self, held: Iterable[tuple[int, tuple[int, int]]]) -> None:
        """(handle, key) pairs back to the free list; a handle not lent out is refused (a double
        give-back would lend one stream to two owners)."""
        with self._lock:
            for handle, key in held:
                if handle not in self._lent:
                    raise ValueError(f"stream {handle:#x} is not lent out (given back twice?)")
                self._lent.discard(handle)
                self._free.setdefault(key, []).append(handle)

    def free_count(self) -> int:
        with self._lock:
            return sum(len(free) for free in self._free.values())

    def lent_count(self) -> int:
        with self._lock:
            return len(self._lent)


@functools.cache
def default_lender() -> StreamLender | None:
    """The process's lender of CUDA-made streams; None where the runtime cannot be bound."""
    if not torch.cuda.is_available():
        return None
    try:
        cudart.stream_priority_range()
    except (cudart.CudaRuntimeError, AttributeError, OSError):
        return None  # no runtime library to bind: torch's pool
    return StreamLender(CudaStreamMaker())


def _return_all(lender: StreamLender, held: dict[int, tuple[int, int]]) -> None:
    pairs = list(held.items())
    held.clear()
    lender.take_back(pairs)


class StreamLease:
    """The streams one owner holds, lent by ``lender`` (the process's by default).

    Every stream goes back on ``release`` or when the lease is collected (with its owner); the
    owner must not use one after that. Without a lender (no CUDA runtime) ``take`` returns
    ``torch.cuda.Stream`` pool streams, which need no giving back.
    """

    def __init__(self, device: torch.device | str | int, lender: StreamLender | None = None) -> None:
        self.device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        self._lender = lender if lender is not None else default_lender()
        self._handles: dict[int, tuple[int, int]] = {}  # handle -> (device, priority): what goes back
        self._release = (weakref.finalize(self, _return_all, self._lender, self._handles)
                         if self._lender is not None else None)

    @property
    def owned(self) -> bool:
        """Whether the streams are the library's own (False: torch's pool)."""
        return self._lender is not None

    def _index(self) -> int:
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def take(self, priority: int = 0) -> torch.cuda.Stream:
        """A stream for this owner alone (``priority``: lower is more urgent, clamped to the device's)."""
        if self._lender is None:
            return torch.cuda.Stream(self.device, priority=priority)
        if not self._release.alive:
            raise RuntimeError("this stream lease was released")
        handle, key, stream = self._lender.lend(self._index(), priority)
        self._handles[handle] = key
        return stream

    def give_back(self, streams: Iterable[torch.cuda.Stream]) -> None:
        """Return ``streams`` (taken from this lease, no longer used) before the lease ends; after
        ``release`` there is nothing left to return."""
        if self._lender is None or not self._release.alive:
            return  # nothing lent, or everything went back already
        handles = [int(stream.cuda_stream) for stream in streams]
        unknown = [h for h in handles if h not in self._handles]
        if unknown:
            raise ValueError(f"streams {[hex(h) for h in unknown]} are not held by this lease")
        self._lender.take_back([(h, self._handles.pop(h)) for h in handles])

    def release(self) -> None:
        """Return every stream still held (once; later calls do nothing)."""
        if self._release is not None:
            self._release()

    def __len__(self) -> int:
        return len(self._handles)


@functools.cache
def _process_lease(device: torch.device) -> StreamLease:
    """The lease of the streams kept for the life of the process (never released)."""
    return StreamLease(device)


@functools.cache
def kept_stream(device: torch.device, priority: int = 0) -> torch.cuda.Stream:
    """A stream of the library's for the life of the process (one per device and priority)."""
    return _process_lease(device).take(priority)

__all__ = ["CudaStreamMaker", "StreamLease", "StreamLender", "StreamMaker", "default_lender", "kept_stream"]
