"""Which CPUs sit on the GPU's NUMA node, so the host pool's memory can be placed there.

Linux places an anonymous page on the node of the CPU that first touches it. The host pool
populates its mapping while the allocating thread runs only on the GPU's node (``on_node``), so
PCIe transfers do not cross the socket interconnect. Everything here is best effort: on machines
without NUMA information or without CUDA it does nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

SYSFS = Path("/sys")


def parse_cpulist(text: str) -> set[int]:
    """``"0-3,8,10-11"`` -> ``{0, 1, 2, 3, 8, 10, 11}``."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def gpu_numa_node(device_index: int = 0, sysfs: Path = SYSFS) -> int | None:
    """NUMA node of a CUDA device from its PCI bus id, or None when unknown."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(device_index)
        bus_id = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        node = int((sysfs / "bus/pci/devices" / bus_id / "numa_node").read_text())
    except (OSError, ValueError, AttributeError, RuntimeError):
        return None
    return node if node >= 0 else None


def node_cpus(node: int, sysfs: Path = SYSFS) -> set[int]:
    try:
        return parse_cpulist((sysfs / f"devices/system/node/node{node}/cpulist").read_text())
    except (OSError, ValueError):  # no such node, or a list this parser cannot read: best effort
        return set()


@contextlib.contextmanager
def on_node(node: int | None, sysfs: Path = SYSFS) -> Iterator[bool]:
    """Run the block on the CPUs of ``node`` (yields True), restoring the affinity afterwards."""
    cpus = node_cpus(node, sysfs) if node is not None else set()
    allowed = os.sched_getaffinity(0)
    target = cpus & allowed
    if not target or target == allowed:
        yield bool(target)
        return
    os.sched_setaffinity(0, target)
    try:
        yield True
    finally:
        os.sched_setaffinity(0, allowed)
