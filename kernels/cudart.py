"""The two CUDA runtime calls torch does not expose: 1-D and 2-D (pitched) async memcpy.

The copy-engine paths need ``cudaMemcpy2DAsync``: one call moves a layer's chunk out of a run of
``page_first`` host slots (pitch = slot size) into a dense device buffer. torch's ``copy_`` cannot
do this across devices without first making a contiguous CPU temporary, which costs a CPU memcpy
of the whole run. So this module binds the CUDA runtime that torch itself has loaded (found in
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


def _declare(lib: ctypes.CDLL) -> None:
    size_t, ptr = ctypes.c_size_t, ctypes.c_void_p
    lib.cudaMemcpyAsync.argtypes = [ptr, ptr, size_t, ctypes.c_int, ptr]
    lib.cudaMemcpyAsync.restype = ctypes.c_int
    lib.cudaMemcpy2DAsync.argtypes = [ptr, size_t, ptr, size_t, size_t, size_t, ctypes.c_int, ptr]
    lib.cudaMemcpy2DAsync.restype = ctypes.c_int
    lib.cudaGetErrorString.argtypes = [ctypes.c_int]
    lib.cudaGetErrorString.restype = ctypes.c_char_p


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
