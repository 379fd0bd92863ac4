"""Key-only backends (opened without a host pool) over a medium a writer with a pool filled.

For memory (a shared store), file, redis (a real ``redis-server``) and mooncake (a real
``mooncake_master``): ``exists`` sees exactly the writer's pages, ``delete`` removes them for the
writer too, and the data calls raise ``NoHostPoolError`` (a ``PoolError``) before anything moves.
This is what the metadata half in a scheduler process relies on.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import secrets
from collections.abc import AsyncIterator, Callable

import pytest

from tiered_kv import HostPool
from tiered_kv.backends import Backend, open_backend
from tiered_kv.backends.memory import MemoryBackend
from tiered_kv.errors import NoHostPoolError, PoolError

from .contract import SPEC, assert_settled, fill_and_seal, new_keys
from .redis_server import REDIS_SERVER, RedisServer

HAVE_MOONCAKE = importlib.util.find_spec("mooncake") is not None


@pytest.fixture
def pool():
    with HostPool(SPEC, 16, "page_first") as pool:
        yield pool


@contextlib.asynccontextmanager
async def _memory(pool: HostPool, tmp_path) -> AsyncIterator[tuple[Backend, Backend]]:
    writer = MemoryBackend(pool)
    async with writer, writer.on_same_store(None) as reader:
        yield writer, reader


@contextlib.asynccontextmanager
async def _file(pool: HostPool, tmp_path) -> AsyncIterator[tuple[Backend, Backend]]:
    url = f"file://{tmp_path}/store"
    async with open_backend(url, pool) as writer, open_backend(url, None) as reader:
        yield writer, reader


@contextlib.asynccontextmanager
async def _redis(pool: HostPool, tmp_path) -> AsyncIterator[tuple[Backend, Backend]]:
    prefix = f"k{secrets.token_hex(4)}:"
    with RedisServer() as server:
        async with open_backend(server.url, pool, prefix=prefix) as writer, \
                open_backend(server.url, None, prefix=prefix) as reader:
            yield writer, reader


@contextlib.asynccontextmanager
async def _mooncake(pool: HostPool, tmp_path) -> AsyncIterator[tuple[Backend, Backend]]:
    from .mooncake_server import LOOPBACK_ENV, MooncakeMaster

    saved = {k: os.environ.get(k) for k in LOOPBACK_ENV}
    os.environ.update(LOOPBACK_ENV)
    master = MooncakeMaster().start()
    try:
        async with open_backend(master.url(global_segment_bytes="64MiB", timeout_s=10), pool) as writer, \
                open_backend(master.url(contribute_segment=False, timeout_s=10), None) as reader:
            yield writer, reader
    finally:
        master.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


MEDIA: dict[str, Callable] = {"memory": _memory, "file": _file, "redis": _redis, "mooncake": _mooncake}


@pytest.mark.parametrize("medium", [
    "memory",
    "file",
    pytest.param("redis", marks=pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server not on PATH")),
    pytest.param("mooncake", marks=pytest.mark.skipif(not HAVE_MOONCAKE, reason="the mooncake module is not installed")),
])
async def test_key_only_backend_over_a_writers_pages(medium, pool, tmp_path):
    free_before = pool.free_slots
    async with MEDIA[medium](pool, tmp_path) as (writer, reader):
        assert reader.key_only and not writer.key_only
        assert type(reader) is type(writer)
        count = 6
        keys = new_keys(count)
        src = pool.allocate(count)
        records = fill_and_seal(pool, src, keys)
        assert await writer.put_from(keys, src) == [True] * count

        # exists: exactly the writer's pages, as a leading run.
        assert await reader.exists(keys) == count
        assert await reader.exists(keys + new_keys(2)) == count
        assert await reader.exists(keys[:3] + new_keys(1) + keys[3:]) == 3
        assert await reader.exists(new_keys(1) + keys) == 0
        assert await reader.contains(keys[-1])

        # Data calls: the typed error, before any key is read or anything counted.
        stats_before = vars(reader.stats).copy()
        for call in (reader.get_into(keys[:2], src[:2]), reader.put_from(keys[:2], src[:2]),
                     reader.get(keys[0], src[0]), reader.put(keys[0], src[0])):
            with pytest.raises(NoHostPoolError, match="without a host pool"):
                await call
        with pytest.raises(PoolError):  # callers that catch the pool's errors catch it too
            await reader.get_into(["not a\nkey"], [0])
        with pytest.raises(NoHostPoolError):
            reader.pool  # noqa: B018
        assert vars(reader.stats) == stats_before

        # delete: gone for the writer too; the rest still reads back byte for byte.
        await reader.delete(keys[:2] + new_keys(1))  # an absent key is fine
        assert await writer.exists(keys) == 0
        assert await reader.exists(keys[:2]) == 0
        assert await reader.exists(keys[2:]) == count - 2
        dst = pool.allocate(count - 2)
        assert await writer.get_into(keys[2:], dst) == [True] * (count - 2)
        assert [bytes(pool.record_view(s)) for s in dst] == [records[k] for k in keys[2:]]
        assert reader.stats.errors == 0 and writer.stats.corrupt == 0
        await reader.delete(keys)
        assert await writer.exists(keys[2:]) == 0
        pool.free(src + dst)
    assert_settled(pool, free_before)


async def test_registry_opens_key_only_without_a_pool(tmp_path):
    # Opening needs no pool (redis and mooncake key-only opens against a real server are above;
    # a server nothing answers for is refused at open, with or without a pool: test_redis.py).
    async with open_backend("memory://", None) as memory, open_backend(f"file://{tmp_path}", None) as file:
        for backend in (memory, file):
            assert backend.key_only
            assert "pool=None" in repr(backend)
        assert file.file_bytes is None  # the slot size belongs to data calls only
        assert await memory.exists(new_keys(3)) == 0
        assert await file.exists(new_keys(3)) == 0
        await file.delete(new_keys(2))
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()] == []


def test_a_pool_that_is_no_host_pool_is_a_pool_error():
    class NotAPool:
        holds_records = True

    with pytest.raises(PoolError, match="NotAPool"):
        MemoryBackend(NotAPool())  # type: ignore[arg-type]
    with HostPool(SPEC, 2, "layer_first") as layer_first:
        with pytest.raises(PoolError, match="page_first"):
            MemoryBackend(layer_first)
