"""Host memory for the L2 pool: exact size, page aligned, pinned by registering it with CUDA.

torch's ``pin_memory=True`` rounds allocations up to a power of two (a 300 GiB pool would take
512 GiB), so the pool maps anonymous memory of exactly its size (4 KiB aligned, which direct I/O
needs) and registers that range with ``cudaHostRegister`` when CUDA is present. Without CUDA it is
plain memory, and placed on the GPU's NUMA node where the machine has one (``numa``). The range
stays registered until ``release()``. The mapping is populated up front
(``MAP_POPULATE``), as pinning would do anyway: a pool that faults its pages in during the first
transfer or L3 read runs that first transfer at a fraction of its speed.
"""

from __future__ import annotations

import mmap
import weakref

import torch

from ..errors import PoolError
from .numa import gpu_numa_node, on_node

# Portable: pinned for every CUDA context. Mapped: the device may address it (UVA kernels read and
# write it directly); with unified addressing the device pointer equals the host pointer.
_CUDA_HOST_REGISTER_FLAGS = 1 | 2


def _unregister(address: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(address)


class HostMemory:
    """An anonymous mapping of ``size`` bytes, viewed as a uint8 tensor, optionally CUDA-pinned."""

    def __init__(self, size: int, *, pin: bool | None = None, numa_node: int | None = None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise PoolError(f"host memory size must be an int > 0, got {size!r}")
        if numa_node is not None and (isinstance(numa_node, bool) or not isinstance(numa_node, int) or numa_node < 0):
            raise PoolError(f"numa_node must be None or a node number >= 0, got {numa_node!r}")
        self.size = size
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        if pin is None:
            pin = torch.cuda.is_available()
        elif pin and not torch.cuda.is_available():
            # Pinning registers the pages with the CUDA driver; without one there is nothing to
            # pin for, and torch's own AssertionError must not leave the library.
            raise PoolError("pin=True needs CUDA, which this process does not have "
                            "(pass pin=None to pin only when CUDA is present, or pin=False)")
        if numa_node is None and pin:
            numa_node = gpu_numa_node(torch.cuda.current_device())
        # First touch places pages: populate while running on the chosen node's CPUs.
        with on_node(numa_node) as self.placed_on_node:
            try:
                self._mmap = mmap.mmap(-1, size, flags=flags)
            except (OSError, OverflowError) as exc:  # ENOMEM, or more than the address space
                raise PoolError(f"cannot map {size} B of host memory: {exc}") from exc
        self.numa_node = numa_node if self.placed_on_node else None
        self.tensor = torch.frombuffer(self._mmap, dtype=torch.uint8)
        self.pinned = False
        if pin:
            self._register()

    def _register(self) -> None:
        cudart = torch.cuda.cudart()
        err = cudart.cudaHostRegister(self.tensor.data_ptr(), self.size, _CUDA_HOST_REGISTER_FLAGS)
        if int(err) != 0:
            raise PoolError(f"cudaHostRegister of {self.size} B failed with CUDA error {int(err)}")
        self.pinned = True
        # A pool dropped without release() must not stay pinned: unregister when it is collected.
        self._unpin = weakref.finalize(self, _unregister, self.tensor.data_ptr())

    @property
    def address(self) -> int:
        return self.tensor.data_ptr()

    def memoryview(self) -> memoryview:
        return memoryview(self._mmap)

    def release(self) -> None:
        """Unregister from CUDA. The mapping itself is freed when the last view goes away."""
        if self.pinned:
            self._unpin()
            self.pinned = False
