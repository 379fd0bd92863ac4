"""The ctypes bindings of kernels/cudart.py against a fake CUDA runtime built here with the C
compiler: argument order, the ``cudaMemcpyAttributes`` layout and both ``cudaMemcpyBatchAsync``
signatures (CUDA 12.8-12.9 with ``failIdx``, 13 without) are checked on machines without a GPU.
Skipped where no C compiler is installed.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tiered_kv.kernels import cudart

SOURCE = Path(__file__).with_name("fake_cudart.c")
COMPILER = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C compiler to build the fake CUDA runtime")


def _build(tmp_path, monkeypatch, runtime: int, driver: int) -> ctypes.CDLL:
    library = tmp_path / f"libfakecudart{runtime}-{driver}.so"
    subprocess.run([COMPILER, "-shared", "-fPIC", "-O1", f"-DFAKE_VERSION={runtime}", f"-DFAKE_DRIVER={driver}",
                    "-o", str(library), str(SOURCE)], check=True)
    lib = ctypes.CDLL(str(library))
    cudart._declare(lib)
    monkeypatch.setattr(cudart, "_runtime", lambda: lib)
    cudart._batch_has_fail_idx.cache_clear()
    return lib


@pytest.fixture(params=[13000, 12080], ids=["cuda13", "cuda12.8"])
def fake_runtime(request, tmp_path, monkeypatch):
    lib = _build(tmp_path, monkeypatch, request.param, request.param)
    yield request.param, lib
    cudart._batch_has_fail_idx.cache_clear()


@pytest.mark.parametrize(("runtime", "driver", "usable"), [(13000, 13000, True), (12080, 13000, True),
                                                           (12080, 12040, False), (12060, 12080, False)])
def test_batch_needs_both_runtime_and_driver_at_12_8(tmp_path, monkeypatch, runtime, driver, usable):
    """A 12.8 runtime on a 12.4 driver (minor-version compatibility) has the symbol but cannot run
    it: the engine must then keep to the paths without batched copies."""
    _build(tmp_path, monkeypatch, runtime, driver)
    try:
        assert cudart.driver_version() == driver
        assert cudart.has_memcpy_batch() is usable
    finally:
        cudart._batch_has_fail_idx.cache_clear()


def _buffers(sizes):
    rng = np.random.default_rng(7)
    sources = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    targets = [np.zeros(n, dtype=np.uint8) for n in sizes]
    return sources, targets


def test_batch_copies_every_buffer_in_stream_order(fake_runtime):
    version, lib = fake_runtime
    assert cudart.runtime_version() == version and cudart.has_memcpy_batch()
    sizes = [1, 4096, 41984, 8448, 3]
    sources, targets = _buffers(sizes)
    address = np.array([t.ctypes.data for t in targets], dtype=np.uint64)
    cudart.memcpy_batch_async(address, np.array([s.ctypes.data for s in sources], dtype=np.uint64),
                              np.array(sizes, dtype=np.uint64), 0xABCDE, flags=cudart.FLAG_PREFER_OVERLAP_WITH_COMPUTE)
    assert all(np.array_equal(s, t) for s, t in zip(sources, targets))
    assert ctypes.c_void_p.in_dll(lib, "last_stream").value == 0xABCDE
    assert ctypes.c_int.in_dll(lib, "last_access_order").value == 1  # sources read in stream order
    assert ctypes.c_uint.in_dll(lib, "last_flags").value == cudart.FLAG_PREFER_OVERLAP_WITH_COMPUTE
    assert ctypes.c_size_t.in_dll(lib, "last_num_attrs").value == 1


def test_batch_failure_names_the_call_and_where(fake_runtime):
    version, _ = fake_runtime
    sizes = [16, 0, 16]  # the fake refuses an empty copy, as an invalid argument
    sources, targets = _buffers(sizes)
    where = "copy 1 of 3" if version < 13000 else "3 copies"
    with pytest.raises(cudart.CudaRuntimeError, match=rf"cudaMemcpyBatchAsync \({where}\) failed: invalid argument"):
        cudart.memcpy_batch_async(np.array([t.ctypes.data for t in targets], dtype=np.uint64),
                                  np.array([s.ctypes.data for s in sources], dtype=np.uint64),
                                  np.array(sizes, dtype=np.uint64), 1)


def test_pitched_copy_and_its_dense_shortcut(fake_runtime):
    source = np.arange(10 * 16, dtype=np.uint8)
    target = np.zeros(10 * 8, dtype=np.uint8)
    cudart.memcpy_2d_async(target.ctypes.data, 8, source.ctypes.data, 16, 8, 10, 5)
    assert np.array_equal(target.reshape(10, 8), source.reshape(10, 16)[:, :8])
    dense = np.zeros(10 * 16, dtype=np.uint8)
    cudart.memcpy_2d_async(dense.ctypes.data, 16, source.ctypes.data, 16, 16, 10, 5)  # one 1-D copy
    assert np.array_equal(dense, source)


def test_streams_are_made_non_blocking_at_the_clamped_priority(fake_runtime, monkeypatch):
    """``cudaStreamCreateWithPriority`` gets (out pointer, cudaStreamNonBlocking, priority) and the
    lender's maker gives a priority what torch's pool would (``LOAD_STREAM_PRIORITY`` -> -3 of the
    range [-5, 0]); the fake refuses anything outside that range."""
    from tiered_kv.kernels.owned_streams import CudaStreamMaker

    _, lib = fake_runtime
    assert cudart.stream_priority_range() == (0, -5)
    first, second = cudart.stream_create(-5), cudart.stream_create(0)
    assert (first, second) == (0x5000, 0x5001)
    assert ctypes.c_uint.in_dll(lib, "last_stream_flags").value == 1
    assert ctypes.c_int.in_dll(lib, "last_stream_priority").value == 0
    with pytest.raises(cudart.CudaRuntimeError, match="cudaStreamCreateWithPriority failed"):
        cudart.stream_create(-100)
    maker = CudaStreamMaker()
    maker._range.cache_clear()
    try:
        import torch

        from tests.fake_cuda import Nothing

        monkeypatch.setattr(torch.cuda, "device", Nothing)  # no device to make current on CPU
        assert [maker.priority(0, p) for p in (-100, -5, -1, 0, 3)] == [-3, -3, -1, 0, 0]
        assert maker.make(0, maker.priority(0, -100)) == 0x5002
        assert ctypes.c_int.in_dll(lib, "last_stream_priority").value == -3
    finally:
        maker._range.cache_clear()
