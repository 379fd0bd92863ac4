"""A key-only L3 for ``replay --simulate``: which pages the disk would hold, no bytes.

It keeps the backend contract's async methods (``exists``, ``get_into``, ``put_from``, ``delete``,
``aclose``), so the real ``L3Controller`` drives it exactly as it drives a ``file://`` store, and
mirrors the file backend's capacity rule: at most ``capacity_pages`` pages, least recently used out
first; a read moves a page to the most recent end, ``exists`` does not, and a put of a page already
held succeeds without touching its recency (records are immutable). A whole trace at DeepSeek-V3.2
sizes fits in memory: one dict entry per page key.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from ..model.keys import check_keys


@dataclass
class SimulatedStats:
    hits: int = 0
    misses: int = 0
    puts: int = 0
    evictions: int = 0


class SimulatedL3:
    """``capacity_pages`` page keys with LRU eviction, behind the backend contract."""

    scheme = "simulated"

    def __init__(self, capacity_pages: int) -> None:
        if isinstance(capacity_pages, bool) or not isinstance(capacity_pages, int) or capacity_pages <= 0:
            raise ConfigError(f"simulated L3 capacity must be an int > 0 pages, got {capacity_pages!r}")
        self.capacity_pages = capacity_pages
        self._pages: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self.stats = SimulatedStats()
        self.closed = False

    def __len__(self) -> int:
        return len(self._pages)

    def __contains__(self, key: str) -> bool:
        return key in self._pages

    async def exists(self, keys: Sequence[str]) -> int:
        run = 0
        for k in check_keys(keys):
            if k not in self._pages:
                break
            run += 1
        return run

    async def get_into(self, keys: Sequence[str], slots: Sequence[int]) -> list[bool]:
        keys = check_keys(keys)
        if len(keys) != len(slots):
            raise ConfigError(f"get_into: {len(keys)} keys but {len(slots)} slots")
        out: list[bool] = []
        for k in keys:
            hit = k in self._pages and (not out or out[-1])  # the leading run only, as every backend
            if hit:
                self._pages.move_to_end(k)
            out.append(hit)
        hits = sum(out)
        self.stats.hits += hits
        self.stats.misses += len(out) - hits
        return out

    async def put_from(self, keys: Sequence[str], slots: Sequence[int]) -> list[bool]:
        keys = check_keys(keys)
        if len(keys) != len(slots):
            raise ConfigError(f"put_from: {len(keys)} keys but {len(slots)} slots")
        for k in keys:
            if k in self._pages:
                continue
            while len(self._pages) >= self.capacity_pages:
                self._pages.popitem(last=False)
                self.stats.evictions += 1
            self._pages[k] = None
            self.stats.puts += 1
        return [True] * len(keys)

    async def delete(self, keys: Sequence[str]) -> None:
        for k in check_keys(keys):
            self._pages.pop(k, None)

    async def aclose(self) -> None:
        self.closed = True


__all__ = ["SimulatedL3", "SimulatedStats"]
