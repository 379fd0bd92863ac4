"""``memory://``: a bounded in-process store of page records, for tests and embedded use.

Same semantics as every backend (put-if-absent, verified reads, leading-run gets), bounded by
``capacity_bytes`` with least-recently-used eviction. Not shared, not persistent.
URL: ``memory://?capacity_bytes=1GiB``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..host_pool import HostPool
from .base import Backend, Capabilities
from .url_options import options_from_url


@dataclass(frozen=True)
class MemoryOptions:
    capacity_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        if self.capacity_bytes <= 0:
            raise ConfigError(f"memory backend: capacity_bytes must be > 0, got {self.capacity_bytes}")


class MemoryBackend(Backend):
    scheme = "memory"
    capabilities = Capabilities(zero_copy=False, persistent=False, shared_across_processes=False, shared_across_nodes=False)

    def __init__(self, pool: HostPool, options: MemoryOptions = MemoryOptions()) -> None:
        super().__init__(pool, max_workers=1, timeout_s=None)
        self.options = options
        self._records: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    @classmethod
    def from_url(cls, url: str, pool: HostPool, **options: Any) -> "MemoryBackend":
        return cls(pool, options_from_url(MemoryOptions, url, options))

    @property
    def used_bytes(self) -> int:
        return self._bytes

    async def _exists(self, keys: list[str]) -> list[bool]:
        return [k in self._records for k in keys]

    async def _get(self, keys: list[str], slots: list[int]) -> list[bool]:
        found = []
        for key, slot in zip(keys, slots):
            data = self._records.get(key)
            if data is None:
                found.append(False)
                continue
            self._records.move_to_end(key)
            view = self.pool.record_view(slot)
            n = min(len(data), len(view))
            view[:n] = data[:n]
            found.append(True)
        return found

    async def _put(self, keys: list[str], slots: list[int]) -> list[bool]:
        stored = []
        for key, slot in zip(keys, slots):
            if key in self._records:
                stored.append(True)
                continue
            data = bytes(self.pool.record_view(slot))
            if len(data) > self.options.capacity_bytes:
                stored.append(False)
                continue
            while self._bytes + len(data) > self.options.capacity_bytes:
                _, evicted = self._records.popitem(last=False)
                self._bytes -= len(evicted)
            self._records[key] = data
            self._bytes += len(data)
            stored.append(True)
        return stored

    async def _delete(self, keys: list[str]) -> None:
        for key in keys:
            data = self._records.pop(key, None)
            if data is not None:
                self._bytes -= len(data)

    def corrupt_for_tests(self, key: str, offset: int) -> None:
        """Flip one stored byte (for tests of verification)."""
        data = bytearray(self._records[key])
        data[offset] ^= 0xFF
        self._records[key] = bytes(data)
