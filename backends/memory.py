"""``memory://``: a bounded in-process store of page records, for tests and embedded use.

Same semantics as every backend (put-if-absent, verified reads, leading-run gets), bounded by
``capacity_bytes`` with least-recently-used eviction. Not persistent, not shared across processes;
``MemoryBackend.on_same_store(pool)`` opens a second backend on the same records for another pool
of this process (another spec, say), as two processes would share a file or Redis medium.
URL: ``memory://?capacity_bytes=1GiB``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from ..errors import ConfigError
from ..model.sizes import MAX_SIZE
from .base import Backend, Capabilities, OtherLength, matches_read, read_length
from .url_options import check_fields, options_from_url, split_url

if TYPE_CHECKING:  # annotations only: the host pool needs torch, listing a store does not
    from ..model.host_pool import HostPool


@dataclass(frozen=True)
class MemoryOptions:
    """Field constraints are pydantic ``Annotated`` metadata (see ``url_options``)."""

    capacity_bytes: Annotated[int, Field(gt=0, le=MAX_SIZE)] = 1 << 30

    def __post_init__(self) -> None:
        check_fields(self)


class _Store:
    """Records (key -> bytes, least recent first) and their total size; shared by backends made
    with ``on_same_store``. Touched only on the event loop, so it needs no lock."""

    def __init__(self) -> None:
        self.records: OrderedDict[str, bytes] = OrderedDict()
        self.bytes = 0


class MemoryBackend(Backend):
    scheme = "memory"
    capabilities = Capabilities(zero_copy=False, persistent=False, shared_across_processes=False, shared_across_nodes=False,
                                compares_before_delete=True)
    moves_parts = True

    def __init__(self, pool: HostPool | None, options: MemoryOptions = MemoryOptions(), *, store: "_Store | None" = None) -> None:
        super().__init__(pool, max_workers=1, timeout_s=None)
        self.options = options
        self._store = _Store() if store is None else store
        self.stats.evictions = 0  # it evicts for room itself: counted

    def on_same_store(self, pool: HostPool | None) -> "MemoryBackend":
        """Another backend, serving ``pool``, on this one's records and capacity (same options);
        ``pool=None``: a key-only one (``exists`` / ``delete``), as a scheduler process would open."""
        return type(self)(pool, self.options, store=self._store)

    @classmethod
    def from_url(cls, url: str, pool: HostPool | None, **options: Any) -> "MemoryBackend":
        parts = split_url(url)
        if parts.netloc or parts.path:
            raise ConfigError(f"{url}: a memory:// store lives in this process; it takes no host, port or path "
                              "(memory://?capacity_bytes=1GiB)")
        return cls(pool, options_from_url(MemoryOptions, url, options))

    @property
    def used_bytes(self) -> int:
        return self._store.bytes

    @property
    def capacity_pages(self) -> int | None:
        """Records of this pool's spec the capacity holds (None: key-only, no pool to size them)."""
        return None if self._pool is None else self.options.capacity_bytes // self._pool.record_bytes

    @property
    def _records(self) -> "OrderedDict[str, bytes]":
        return self._store.records

    async def _exists(self, keys: list[str]) -> list[bool]:
        return [k in self._records for k in keys]

    async def _get(self, keys: list[str], slots: list[int]) -> list[bool | OtherLength]:
        found = []
        for key, slot in zip(keys, slots):
            data = self._records.get(key)
            if data is None:
                found.append(False)
                continue
            self._records.move_to_end(key)
            self.pool.fill_record(slot, data)
            size = self.pool.record_bytes
            # Another length than ours: the base reads its header to tell whose it is.
            found.append(True if len(data) == size else OtherLength(len(data), size))
        return found

    async def _put(self, keys: list[str], slots: list[int]) -> list[bool]:
        stored = []
        for key, slot in zip(keys, slots):
            if key in self._records:
                stored.append(True)
                continue
            data = bytes(self.pool.record_contents(slot))
            if len(data) > self.options.capacity_bytes:
                stored.append(False)
                continue
            while self._store.bytes + len(data) > self.options.capacity_bytes:
                _, evicted = self._records.popitem(last=False)
                self._store.bytes -= len(evicted)
                self.stats.evictions += 1
            self._records[key] = data
            self._store.bytes += len(data)
            stored.append(True)
        return stored

    async def _delete(self, keys: list[str]) -> None:
        for key in keys:
            self._delete_now(key)

    async def _delete_corrupt(self, found: list[tuple[str, int, OtherLength | None]]) -> None:
        # One event loop step, no await: nothing can put the key between the compare and the delete.
        for key, slot, other in found:
            data = self._records.get(key)
            view = self.pool.record_contents(slot)
            if data is not None and matches_read(data, len(data), view, read_length(other, len(view))):
                self._delete_now(key)

    # --- listing, for inspection -------------------------------------------------------------
    async def scan(self) -> AsyncIterator[tuple[str, int | None]]:
        # A snapshot: records put or evicted while the caller iterates do not break the walk.
        for key, data in list(self._records.items()):
            yield key, len(data)

    async def read_stored(self, name: str, length: int | None = None) -> bytes | None:
        data = self._records.get(name)  # get, not move_to_end: looking is no use for the LRU
        if data is None:
            return None
        return data if length is None else data[:length]

    def store_for_tests(self, key: str, data: bytes) -> None:
        """Store raw ``data`` under ``key`` as a foreign or broken writer would (for tests)."""
        self._delete_now(key)
        self._records[key] = bytes(data)
        self._store.bytes += len(data)

    def _delete_now(self, key: str) -> None:
        data = self._records.pop(key, None)
        if data is not None:
            self._store.bytes -= len(data)

    def corrupt_for_tests(self, key: str, offset: int) -> None:
        """Flip one stored byte (for tests of verification)."""
        data = bytearray(self._records[key])
        data[offset] ^= 0xFF
        self._records[key] = bytes(data)
