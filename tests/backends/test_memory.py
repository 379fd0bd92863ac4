"""The memory backend: the contract, capacity, corruption, and URL errors."""

from __future__ import annotations

import pytest

from tiered_kv.backends import open_backend
from tiered_kv.backends.memory import MemoryBackend
from tiered_kv.errors import ConfigError, PoolError
from tiered_kv import HostPool

from .contract import SPEC, BackendContract, fill_and_seal, new_keys


class TestMemoryContract(BackendContract):
    @pytest.fixture
    async def backend(self, pool):
        async with open_backend("memory://?capacity_bytes=64MiB", pool) as backend:
            yield backend

    @pytest.fixture
    def same_medium(self, backend):
        return backend.on_same_store


async def test_capacity_evicts_least_recently_used():
    with HostPool(SPEC, 8) as pool:
        async with open_backend("memory://", pool, capacity_bytes=3 * pool.record_bytes) as backend:
            keys = new_keys(4)
            slots = pool.allocate(4)
            fill_and_seal(pool, slots, keys)
            await backend.put_from(keys[:3], slots[:3])
            await backend.get_into(keys[:1], pool.allocate(1))  # keys[0] becomes most recent
            await backend.put_from(keys[3:], slots[3:])
            present = [await backend.contains(k) for k in keys]
            assert present == [True, False, True, True]
            assert backend.used_bytes == 3 * pool.record_bytes


async def test_record_larger_than_capacity_is_refused():
    with HostPool(SPEC, 4) as pool:
        async with open_backend("memory://", pool, capacity_bytes=1000) as backend:
            [key] = new_keys(1)
            slot = pool.allocate(1)
            fill_and_seal(pool, slot, [key])
            assert await backend.put_from([key], slot) == [False]
            assert backend.stats.put_rejected == 1


@pytest.mark.parametrize("offset", [0, 100, 4096, 50_000, -1])
async def test_corrupt_record_is_a_counted_deleted_miss(offset):
    with HostPool(SPEC, 4) as pool:
        backend = open_backend("memory://", pool)
        [key] = new_keys(1)
        slot = pool.allocate(1)
        fill_and_seal(pool, slot, [key])
        await backend.put_from([key], slot)
        backend.corrupt_for_tests(key, offset if offset >= 0 else pool.record_bytes - 1)
        assert await backend.get_into([key], pool.allocate(1)) == [False]
        assert backend.stats.corrupt == 1
        assert await backend.exists([key]) == 0
        await backend.aclose()


def test_bad_urls_and_pools():
    with HostPool(SPEC, 2) as pool:
        with pytest.raises(ConfigError, match="unknown backend scheme 'nosuch'"):
            open_backend("nosuch://x", pool)
        with pytest.raises(ConfigError, match="unknown option 'capacity'"):
            open_backend("memory://?capacity=1GiB", pool)
        with pytest.raises(ConfigError, match="malformed size"):
            open_backend("memory://?capacity_bytes=lots", pool)
        with pytest.raises(ConfigError, match="scheme://"):
            open_backend("memory", pool)
    with HostPool(SPEC, 2, "layer_first") as pool:
        with pytest.raises(PoolError, match="page_first"):
            MemoryBackend(pool)


async def test_every_corrupt_record_of_a_large_batch_is_found_counted_and_deleted():
    """Verification of one batch is spread over threads: each damaged record is still caught,
    counted once and deleted, the intact ones before the first damage are hits, and the intact
    ones after it stay stored."""
    pages = 12
    with HostPool(SPEC, 2 * pages) as pool:
        async with open_backend("memory://", pool) as backend:
            keys = new_keys(pages)
            slots = pool.allocate(pages)
            fill_and_seal(pool, slots, keys)
            await backend.put_from(keys, slots)
            damaged = [3, 7, 11]
            for i in damaged:
                backend.corrupt_for_tests(keys[i], 5000 + i)
            got = await backend.get_into(keys, pool.allocate(pages))
            assert got == [True] * 3 + [False] * (pages - 3)
            assert backend.stats.corrupt == len(damaged)
            present = [await backend.contains(k) for k in keys]
            assert present == [i not in damaged for i in range(pages)]


@pytest.mark.parametrize("url", ["memory://somehost", "memory://localhost:99999", "memory://:abc", "memory:///some/path",
                                 "memory://host/path?capacity_bytes=1GiB"])
def test_a_memory_url_with_a_host_or_path_is_refused(url):
    # memory:// stores in this process: a host, port or path named nothing and was silently ignored
    with HostPool(SPEC, 2) as pool:
        with pytest.raises(ConfigError, match="memory://"):
            open_backend(url, pool)
