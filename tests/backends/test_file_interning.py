"""The file backend's per-page calls intern no string: a page name interned per call (as pathlib
does for every part of a path it builds) churns the interpreter's table of interned strings, whose
resizes land in the malloc arenas of the backend's worker threads and stay there free, so a
process writing pages for ever grows (benchmarks/soak.py; docs/reliability.md, Soak)."""

from __future__ import annotations

import sys
import threading

import pytest

from tiered_kv import HostPool
from tiered_kv.backends import open_backend

from .contract import SPEC, fill_and_seal, new_keys


@pytest.fixture
def pool():
    with HostPool(SPEC, 8) as pool:
        yield pool
        assert pool.free_slots == pool.num_slots


async def test_puts_gets_evictions_and_deletes_intern_no_page_name(pool, tmp_path, monkeypatch):
    keys = new_keys(24)
    slots = pool.allocate(4)
    # Room for 4 pages: the 24 puts below evict 20 of them.
    async with open_backend(f"file://{tmp_path}?fsync=false", pool, capacity_bytes=4 * pool.slot_bytes) as backend:
        interned: list[str] = []
        lock = threading.Lock()
        real_intern = sys.intern

        def counting_intern(s: str) -> str:
            with lock:
                interned.append(s)
            return real_intern(s)

        monkeypatch.setattr(sys, "intern", counting_intern)
        for start in range(0, len(keys), 4):
            batch = keys[start:start + 4]
            fill_and_seal(pool, slots, batch)
            assert await backend.put_from(batch, slots) == [True] * 4
        last = keys[-4:]
        assert await backend.exists(last) == 4
        assert await backend.get_into(last, slots) == [True] * 4
        await backend.delete(last)
        assert await backend.exists(last) == 0
        monkeypatch.undo()
        assert backend.stats.evictions == 20
    pool.free(slots)
    assert interned == []
