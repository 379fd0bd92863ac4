"""The CUDA runtime calls torch does not expose: 1-D, 2-D (pitched) and batched async memcpy.

The copy-engine paths need ``cudaMemcpy2DAsync``: one call moves a layer's chunk out of a run of
``page_first`` host slots (pitch = slot size) into a dense device buffer. torch's ``copy_`` cannot
do this across devices without first making a contiguous CPU temporary, which costs a CPU memcpy
of the whole run. The ``batch`` path needs ``cudaMemcpyBatchAsync`` (CUDA 12.8+): thousands of
scattered copies handed to the copy engines in one call, where one ``cudaMemcpyAsync`` per copy
would cost microseconds of CPU each. So this module binds the CUDA runtime that torch itself has loaded (found in
``/proc/self/maps``, so the versions always match) through ctypes, from the standard library.

Every call is asynchronous on the stream it is given and checks the returned status; it must
never be called without a current CUDA device (callers wrap launches in ``torch.cuda.device``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os


_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction inferred from the (unified) addresses


class CudaRuntimeError(RuntimeError):
    """A CUDA runtime call returned an error status."""


@functools.cache
def _runtime() -> ctypes.CDLL:
    import torch

    torch.cuda.init()  # loads libcudart into the process if torch links it dynamically
    candidates = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if "/" in line else ""
                if "libcudart.so" in os.path.basename(path) and path not in candidates:
                    candidates.append(path)
    except OSError:
        pass
    # Not mapped (a static build, or not loaded yet): the pip wheel's copy, then the system's.
    roots = [os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(torch.__file__))]
    for root in roots:
        candidates += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcudart.so*")))
        candidates += sorted(glob.glob(os.path.join(root, "lib", "libcudart*.so*")))
    found = ctypes.util.find_library("cudart")
    if found:
        candidates.append(found)
    errors = []
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
            continue
        _declare(lib)
        return lib
    raise CudaRuntimeError(f"cannot find the CUDA runtime library torch uses; tried {candidates or 'nothing'} {errors}")


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemcpyAttributes(ctypes.Structure):
    """``cudaMemcpyAttributes``: access order, two location hints (ignored for pinned and device
    memory), flags."""

    _fields_ = [("src_access_order", ctypes.c_int), ("src_loc_hint", _MemLocation),
                ("dst_loc_hint", _MemLocation), ("flags", ctypes.c_uint)]


_ACCESS_ORDER_STREAM = 1  # cudaMemcpySrcAccessOrderStream: the source is read in stream order
#: cudaMemcpyFlagPreferOverlapWithCompute: ask for copy engines rather than SMs.
FLAG_PREFER_OVERLAP_WITH_COMPUTE = 1


def _declare(lib: ctypes.CDLL) -> None:
    size_t, ptr = ctypes.c_size_t, ctypes.c_void_p
    for query in (lib.cudaRuntimeGetVersion, lib.cudaDriverGetVersion):
        query.argtypes = [ctypes.POINTER(ctypes.c_int)]
        query.restype = ctypes.c_int
    lib.cudaMemcpyAsync.argtypes = [ptr, ptr, size_t, ctypes.c_int, ptr]
    lib.cudaMemcpyAsync.restype = ctypes.c_int
    lib.cudaMemcpy2DAsync.argtypes = [ptr, size_t, ptr, size_t, size_t, size_t, ctypes.c_int, ptr]
    lib.cudaMemcpy2DAsync.restype = ctypes.c_int
    lib.cudaGetErrorString.argtypes = [ctypes.c_int]
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    lib.cudaStreamCreateWithPriority.argtypes = [ctypes.POINTER(ptr), ctypes.c_uint, ctypes.c_int]
    lib.cudaStreamCreateWithPriority.restype = ctypes.c_int
    lib.cudaDeviceGetStreamPriorityRange.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    lib.cudaDeviceGetStreamPriorityRange.restype = ctypes.c_int


def _check(status: int, what: str) -> None:
    if status != 0:
        message = _runtime().cudaGetErrorString(status).decode(errors="replace")
        raise CudaRuntimeError(f"{what} failed: {message} (cudaError {status})")


def memcpy_async(dst: int, src: int, nbytes: int, stream: int) -> None:
    """Copy ``nbytes`` from address ``src`` to ``dst`` on ``stream`` (a ``cudaStream_t`` as int)."""
    _check(_runtime().cudaMemcpyAsync(dst, src, nbytes, _MEMCPY_DEFAULT, stream), "cudaMemcpyAsync")


def memcpy_2d_async(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int, stream: int) -> None:
    """Copy ``height`` rows of ``width`` bytes between pitched buffers on ``stream``.

    Falls back to one 1-D copy when both sides are dense (the copy engine streams those best).
    """
    if height == 1 or (dst_pitch == width and src_pitch == width):
        memcpy_async(dst, src, width * height, stream)
        return
    _check(
        _runtime().cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, _MEMCPY_DEFAULT, stream),
        "cudaMemcpy2DAsync",
    )


_STREAM_NON_BLOCKING = 1  # cudaStreamNonBlocking: no implicit order with the legacy default stream (as torch's)


def stream_create(priority: int) -> int:
    """A new non-blocking stream of ``priority`` on the current device, as a ``cudaStream_t`` int.
    The caller owns it (``kernels.owned_streams`` never destroys one)."""
    handle = ctypes.c_void_p(0)
    _check(_runtime().cudaStreamCreateWithPriority(ctypes.byref(handle), _STREAM_NON_BLOCKING, int(priority)),
           "cudaStreamCreateWithPriority")
    return int(handle.value or 0)


def stream_priority_range() -> tuple[int, int]:
    """(least, greatest) stream priority of the current device; greatest is the lower number."""
    least, greatest = ctypes.c_int(0), ctypes.c_int(0)
    _check(_runtime().cudaDeviceGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest)),
           "cudaDeviceGetStreamPriorityRange")
    return least.value, greatest.value


def runtime_version() -> int:
    """The CUDA runtime's version as an int (12080 = 12.8)."""
    version = ctypes.c_int(0)
    _check(_runtime().cudaRuntimeGetVersion(ctypes.byref(version)), "cudaRuntimeGetVersion")
    return version.value


@functools.cache
def _batch_has_fail_idx() -> bool | None:
    """None where the runtime has no ``cudaMemcpyBatchAsync``; else whether its signature has the
    ``failIdx`` out-parameter (CUDA 12.8-12.9; 13 dropped it). Declares the call's types."""
    lib = _runtime()
    if not hasattr(lib, "cudaMemcpyBatchAsync"):
        return None
    size_t, ptr = ctypes.c_size_t, ctypes.c_void_p
    fail_idx = runtime_version() < 13000
    lib.cudaMemcpyBatchAsync.argtypes = [ptr, ptr, ptr, size_t, ctypes.POINTER(_MemcpyAttributes), ptr, size_t,
                                         *([ctypes.POINTER(size_t)] if fail_idx else []), ptr]
    lib.cudaMemcpyBatchAsync.restype = ctypes.c_int
    return fail_idx


def driver_version() -> int:
    """The newest CUDA version the installed driver supports, as an int (12080 = 12.8)."""
    version = ctypes.c_int(0)
    _check(_runtime().cudaDriverGetVersion(ctypes.byref(version)), "cudaDriverGetVersion")
    return version.value


#: The first CUDA version with ``cudaMemcpyBatchAsync``.
BATCH_MIN_VERSION = 12080


def has_memcpy_batch() -> bool:
    """Whether ``cudaMemcpyBatchAsync`` can run here: the runtime has it (12.8 and later) and the
    driver is new enough for it (a newer runtime on an older driver, which CUDA's minor-version
    compatibility allows, would fail the call with "requires a newer driver")."""
    try:
        return _batch_has_fail_idx() is not None and driver_version() >= BATCH_MIN_VERSION
    except CudaRuntimeError:
        return False


def memcpy_batch_async(dsts, srcs, sizes, stream: int, *, flags: int = 0) -> None:
    """One ``cudaMemcpyBatchAsync``: ``count`` independent copies, sources read in stream order.

    ``dsts``, ``srcs``, ``sizes``: C-contiguous uint64 numpy arrays of one length (addresses and
    byte counts); the runtime reads them during the call, so they need not outlive it.
    """
    count = len(sizes)
    if count == 0:
        return
    fail_idx = _batch_has_fail_idx()
    if fail_idx is None:
        raise CudaRuntimeError(f"cudaMemcpyBatchAsync needs CUDA 12.8 or later; this runtime is {runtime_version()}")
    attrs = _MemcpyAttributes(_ACCESS_ORDER_STREAM, _MemLocation(0, 0), _MemLocation(0, 0), flags)
    first = (ctypes.c_size_t * 1)(0)  # one attribute entry, for copies 0..count-1
    args = [dsts.ctypes.data, srcs.ctypes.data, sizes.ctypes.data, count, ctypes.byref(attrs), ctypes.addressof(first), 1]
    fail = ctypes.c_size_t(0)
    if fail_idx:
        args.append(ctypes.byref(fail))
    status = _runtime().cudaMemcpyBatchAsync(*args, stream)
    if status != 0:
        where = f" (copy {fail.value} of {count})" if fail_idx else f" ({count} copies)"
        _check(status, "cudaMemcpyBatchAsync" + where)
