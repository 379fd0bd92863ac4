"""The Redis backend against real ``redis-server`` processes on loopback.

The contract runs over TCP with the zero-copy path, over TCP through redis-py (copying), and over a
unix socket. Then: sharing with a second process, namespaces, TTL, maxmemory, corrupt values, a
server killed / hung / restarted under the same backend object, a get cancelled while its reply
trickles through a delaying proxy, TLS with client certificates, URL errors, the redis-benchmark ceiling.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import shutil
import sys
import time
from pathlib import Path

import pytest
import redis

from tiered_kv import HostPool, nsa_spec
from tiered_kv.backends import open_backend
from tiered_kv.backends.redis import RedisBackend
from tiered_kv.ops.bench.raw_ceilings import measure_raw_ceiling
from tiered_kv.errors import BackendError, BackendTimeoutError, BackendUnavailableError, ConfigError

from .contract import SPEC, BackendContract, assert_round_trip, assert_settled, fill_and_seal, new_keys
from .redis_server import REDIS_SERVER, DelayProxy, RedisServer

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server():
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def own_server():
    """A server this test may kill, pause or restart."""
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def prefix() -> str:
    return f"t{secrets.token_hex(4)}:"


def raw_client(srv: RedisServer) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=srv.port)


class TestRedisContract(BackendContract):
    @pytest.fixture(params=["zero_copy", "redis_py", "unix"])
    async def backend(self, request, pool, server, prefix):
        url = server.unix_url if request.param == "unix" else server.url
        async with open_backend(url, pool, prefix=prefix, zero_copy=request.param != "redis_py") as backend:
            yield backend

    @pytest.fixture
    def same_medium(self, server, prefix, backend):
        # The reader takes the writer's path (zero-copy or through redis-py), so both are covered.
        return lambda pool: open_backend(server.url, pool, prefix=prefix, zero_copy=backend.options.zero_copy)


async def test_capabilities_and_paths(server):
    with HostPool(SPEC, 2) as pool:
        async with open_backend(server.url, pool) as fast, open_backend(server.url, pool, zero_copy=False) as slow:
            assert isinstance(fast, RedisBackend)
            assert fast.capabilities.zero_copy and not slow.capabilities.zero_copy
            assert fast.capabilities.shared_across_nodes and not fast.capabilities.persistent
            assert fast.options.prefix == "tkv:"


# --- sharing and namespaces ---------------------------------------------------------------------
_READER = """
import asyncio, hashlib, json, sys
from tiered_kv import HostPool, nsa_spec
from tiered_kv.backends import open_backend

async def main(url, prefix, keys):
    with HostPool(nsa_spec(num_layers=2), len(keys)) as pool:
        async with open_backend(url, pool, prefix=prefix) as backend:
            slots = pool.allocate(len(keys))
            hits = await backend.get_into(keys, slots)
            digests = [hashlib.sha256(pool.record_view(s)).hexdigest() for s in slots]
            print(json.dumps({"hits": hits, "digests": digests}))

asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
"""


async def test_second_process_reads_what_the_first_wrote(server, prefix):
    with HostPool(SPEC, 4) as pool:
        async with open_backend(server.url, pool, prefix=prefix) as backend:
            keys = new_keys(4)
            slots = pool.allocate(4)
            records = fill_and_seal(pool, slots, keys)
            assert await backend.put_from(keys, slots) == [True] * 4
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _READER, server.url, prefix, json.dumps(keys),
                cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
            seen = json.loads(out)
            assert seen["hits"] == [True] * 4
            assert seen["digests"] == [hashlib.sha256(records[k]).hexdigest() for k in keys]


async def test_prefixes_do_not_see_each_other(server):
    with HostPool(SPEC, 4) as pool:
        async with open_backend(server.url, pool, prefix="ns-a:") as a, open_backend(server.url, pool, prefix="ns-b:") as b:
            keys = new_keys(2)
            slots = pool.allocate(2)
            fill_and_seal(pool, slots, keys)
            assert await a.put_from(keys, slots) == [True, True]
            assert await b.exists(keys) == 0
            assert await b.get_into(keys, pool.allocate(2)) == [False, False]
            await b.delete(keys)
            assert await a.exists(keys) == 2
            assert raw_client(server).exists(*(f"ns-a:{k}" for k in keys)) == 2


async def test_ttl_expires_pages(server, prefix):
    with HostPool(SPEC, 2) as pool:
        async with open_backend(server.url + "?ttl_s=0.4", pool, prefix=prefix) as backend:
            [key] = new_keys(1)
            slot = pool.allocate(1)
            fill_and_seal(pool, slot, [key])
            assert await backend.put_from([key], slot) == [True]
            assert 0 < raw_client(server).pttl(prefix + key) <= 400
            assert await backend.exists([key]) == 1
            await asyncio.sleep(0.6)
            assert await backend.exists([key]) == 0


# --- memory limits and corrupt values -----------------------------------------------------------
@pytest.mark.parametrize("zero_copy", [True, False])
async def test_maxmemory_noeviction_refuses_puts_and_keeps_pages(zero_copy):
    """Decision: a put the server refuses for memory (OOM) is False, counted, not an exception."""
    with RedisServer(maxmemory="4mb", policy="noeviction") as srv, HostPool(SPEC, 96) as pool:
        async with open_backend(srv.url, pool, zero_copy=zero_copy) as backend:
            keys = new_keys(48)
            slots = pool.allocate(48)
            records = fill_and_seal(pool, slots, keys)
            stored = []
            for k, s in zip(keys, slots):  # one at a time, so the OOM point is exact
                stored += await backend.put_from([k], [s])
            assert 0 < sum(stored) < 48, "the server should take some pages and refuse the rest"
            assert backend.stats.put_rejected == stored.count(False)
            kept = [k for k, ok in zip(keys, stored) if ok]
            dst = pool.allocate(len(kept))
            assert await backend.get_into(kept, dst) == [True] * len(kept)
            assert all(bytes(pool.record_view(s)) == records[k] for k, s in zip(kept, dst))


async def test_maxmemory_allkeys_lru_evicts_old_pages():
    with RedisServer(maxmemory="4mb", policy="allkeys-lru") as srv, HostPool(SPEC, 49) as pool:
        async with open_backend(srv.url, pool) as backend:
            keys = new_keys(48)
            slots = pool.allocate(48)
            fill_and_seal(pool, slots, keys)
            assert await backend.put_from(keys, slots) == [True] * 48
            present = [await backend.contains(k) for k in keys]
            assert 0 < sum(present) < 48 and present[-1]
            gone = keys[present.index(False)]
            assert await backend.get_into([gone], pool.allocate(1)) == [False]  # evicted: a miss, not an error


@pytest.mark.parametrize("damage", ["flip_header", "flip_payload", "truncate", "extend", "garbage", "empty"])
@pytest.mark.parametrize("zero_copy", [True, False])
async def test_corrupt_value_is_a_counted_deleted_miss(server, prefix, damage, zero_copy):
    with HostPool(SPEC, 3) as pool:
        async with open_backend(server.url, pool, prefix=prefix, zero_copy=zero_copy) as backend:
            [key] = new_keys(1)
            src, dst, _ = pool.allocate(3)
            record = fill_and_seal(pool, [src], [key])[key]
            assert await backend.put_from([key], [src]) == [True]
            # A truncated value must not pass because the slot already holds the intact record.
            pool.record_view(dst)[:] = record
            value = bytearray(record)
            if damage == "flip_header":
                value[100] ^= 0x01
            elif damage == "flip_payload":
                value[-1] ^= 0x80
            elif damage == "truncate":
                value = value[:-10]
            elif damage == "extend":
                value += b"tail"
            elif damage == "garbage":
                value = bytearray(secrets.token_bytes(len(record)))
            else:
                value = bytearray()
            raw_client(server).set(prefix + key, bytes(value))
            assert await backend.get_into([key], [dst]) == [False]
            assert backend.stats.corrupt == 1
            assert raw_client(server).exists(prefix + key) == 0
            assert await backend.put_from([key], [src]) == [True]  # the page can be stored again
            assert await backend.get_into([key], [dst]) == [True]


@pytest.mark.parametrize("kind", ["list", "hash"])
@pytest.mark.parametrize("zero_copy", [True, False])
async def test_a_key_of_another_redis_type_is_a_counted_miss_not_an_error(server, prefix, kind, zero_copy):
    """Someone else's list or hash under our prefix: absent for exists, a foreign miss for gets,
    left in place; the rest of the batch (and the connection) still serve."""
    with HostPool(SPEC, 8) as pool:
        async with open_backend(server.url, pool, prefix=prefix, zero_copy=zero_copy) as backend:
            keys = new_keys(3)
            slots = pool.allocate(3)
            records = fill_and_seal(pool, slots, keys)
            assert await backend.put_from([keys[0], keys[2]], [slots[0], slots[2]]) == [True, True]
            client = raw_client(server)
            if kind == "list":
                client.lpush(prefix + keys[1], b"someone", b"else")
            else:
                client.hset(prefix + keys[1], b"field", b"value")
            assert await backend.exists(keys) == 1
            assert await backend.exists(keys[2:]) == 1
            dst = pool.allocate(3)
            assert await backend.get_into(keys, dst) == [True, False, False]
            assert (backend.stats.foreign, backend.stats.corrupt, backend.stats.errors) == (1, 0, 0)
            assert bytes(pool.record_view(dst[0])) == records[keys[0]]
            assert await backend.get_into(keys[2:], dst[2:]) == [True]
            assert bytes(pool.record_view(dst[2])) == records[keys[2]]
            assert await backend.put_from(keys[1:2], slots[1:2]) == [True]  # present: put-if-absent
            assert client.type(prefix + keys[1]) == kind.encode()  # never deleted nor overwritten
            pool.free(slots + dst)
        assert_settled(pool, pool.num_slots)


async def round_trip(backend, pool: HostPool) -> None:
    """Two pages out and back, compared; every slot it takes is free again after."""
    keys = new_keys(2)
    slots = pool.allocate(2)
    records = fill_and_seal(pool, slots, keys)
    assert await backend.put_from(keys, slots) == [True, True]
    dst = pool.allocate(2)
    assert await backend.get_into(keys, dst) == [True, True]
    assert [bytes(pool.record_view(s)) for s in dst] == [records[k] for k in keys]
    pool.free(slots + dst)


@pytest.mark.parametrize("maxmemory, policy, warned", [
    ("0", "allkeys-lru", "maxmemory 0"),
    ("4mb", "noeviction", "noeviction"),
    ("0", "noeviction", "maxmemory 0 (no bound) and maxmemory-policy noeviction"),
    ("64mb", "allkeys-lru", None),
])
async def test_one_warning_for_a_server_that_cannot_evict(maxmemory, policy, warned, caplog):
    with RedisServer(maxmemory=maxmemory, policy=policy) as srv, HostPool(SPEC, 4) as pool:
        with caplog.at_level("WARNING", logger="tiered_kv.backends.redis"):
            async with open_backend(srv.url, pool) as backend:
                await asyncio.gather(*(backend.exists(new_keys(1)) for _ in range(4)))  # first requests at once
                await round_trip(backend, pool)
                await backend.exists(new_keys(2))
        found = [r.getMessage() for r in caplog.records if r.name == "tiered_kv.backends.redis"]
        if warned is None:
            assert found == []
        else:
            assert len(found) == 1 and warned in found[0] and f"127.0.0.1:{srv.port}" in found[0]
        assert_settled(pool, pool.num_slots)


async def test_a_server_that_refuses_config_is_not_warned_about(caplog):
    with RedisServer(maxmemory="0", policy="noeviction", extra=("--rename-command", "CONFIG", "")) as srv, \
            HostPool(SPEC, 4) as pool:
        assert raw_client(srv).execute_command("PING")
        with caplog.at_level("WARNING", logger="tiered_kv.backends.redis"):
            async with open_backend(srv.url, pool) as backend:
                await round_trip(backend, pool)
                assert backend.stats.errors == 0
        assert [r for r in caplog.records if r.name == "tiered_kv.backends.redis"] == []
        assert_settled(pool, pool.num_slots)


@pytest.mark.parametrize("zero_copy", [True, False])
async def test_a_server_without_scripts_deletes_corrupt_pages_plainly_with_one_warning(zero_copy, caplog):
    """Where EVAL is refused (renamed away here, as an ACL or a managed server may), a corrupt
    page is still a counted miss and deleted with a plain DEL, as before the compare-and-delete
    script; one warning says so, and the get is no error."""
    with RedisServer(extra=("--rename-command", "EVAL", "")) as srv, HostPool(SPEC, 8) as pool:
        async with open_backend(srv.url, pool, zero_copy=zero_copy) as backend:
            keys = new_keys(2)
            slots = pool.allocate(2)
            fill_and_seal(pool, slots, keys)
            for slot in slots:  # sealed, then damaged: stored as it is
                view = pool.record_view(slot)
                view[7000] = view[7000] ^ 0xFF
            assert await backend.put_from(keys, slots) == [True, True]
            dst = pool.allocate(1)
            with caplog.at_level("WARNING", logger="tiered_kv.backends.redis"):
                for key in keys:
                    assert await backend.get_into([key], dst) == [False]
            assert backend.stats.corrupt == 2 and backend.stats.errors == 0
            assert await backend.exists(keys[:1]) == 0 and await backend.exists(keys[1:]) == 0
            warnings = [r.getMessage() for r in caplog.records if r.name == "tiered_kv.backends.redis"]
            assert len(warnings) == 1 and "compare-and-delete" in warnings[0]
            pool.free(slots + dst)
        assert_settled(pool, pool.num_slots)


# --- failures -----------------------------------------------------------------------------------
BIG = nsa_spec(num_layers=61)  # 3 MB pages: a batch takes long enough to kill the server under it


async def test_server_killed_mid_batch_then_restarted(own_server):
    with HostPool(BIG, 30) as pool:  # 24 to put, then 4 + 2 to read back
        async with open_backend(own_server.url, pool, socket_timeout_s=5) as backend:
            keys = new_keys(24)
            slots = pool.allocate(24)
            fill_and_seal(pool, slots, keys)
            watcher = raw_client(own_server)
            put = asyncio.create_task(backend.put_from(keys, slots))
            while watcher.dbsize() == 0:  # some pages are in, the rest are on their way
                await asyncio.sleep(0.001)
            own_server.kill()
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError):
                await put
            assert time.monotonic() - started < 5
            with pytest.raises(BackendUnavailableError, match="127.0.0.1"):
                await backend.exists(keys)
            assert backend.stats.errors >= 2

            own_server.start()  # same port, empty: the same object serves again
            assert await backend.exists(keys) == 0
            assert await backend.get_into(keys[:2], slots[:2]) == [False, False]
            assert await backend.put_from(keys[:4], slots[:4]) == [True] * 4
            assert await backend.get_into(keys[:4], pool.allocate(4)) == [True] * 4

            # Restarted while idle: pooled connections are stale, yet the next calls just work.
            own_server.restart()
            errors = backend.stats.errors
            assert await backend.put_from(keys[4:6], slots[4:6]) == [True, True]
            assert await backend.get_into(keys[4:6], pool.allocate(2)) == [True, True]
            assert await backend.exists(keys[4:6]) == 2
            assert backend.stats.errors == errors
        with pytest.raises(BackendError, match="closed"):
            await backend.exists(keys)


async def test_server_killed_mid_get_batch(own_server):
    """The server dies while a get batch streams in: our error at once, not a hang, and no page
    of the batch is reported as a hit."""
    with HostPool(BIG, 48) as pool:
        async with open_backend(own_server.url, pool, socket_timeout_s=5) as backend:
            keys = new_keys(24)
            slots = pool.allocate(24)
            fill_and_seal(pool, slots, keys)
            assert await backend.put_from(keys, slots) == [True] * 24
            dst = pool.allocate(24)
            for s in dst:
                pool.record_view(s)[:8] = b"\xa5" * 8
            get = asyncio.create_task(backend.get_into(keys, dst))
            while all(bytes(pool.record_view(s)[:8]) == b"\xa5" * 8 for s in dst):  # first bytes landed
                await asyncio.sleep(0.0005)
            assert not get.done()
            own_server.kill()
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError):
                await get
            assert time.monotonic() - started < 2
            assert backend.stats.hits == 0


async def test_hung_server_times_out_then_serves_again(own_server):
    with HostPool(SPEC, 4) as pool:
        async with open_backend(own_server.url, pool, socket_timeout_s=0.5) as backend:
            keys = new_keys(2)
            slots = pool.allocate(2)
            fill_and_seal(pool, slots, keys)
            assert await backend.put_from(keys, slots) == [True, True]
            own_server.pause()
            try:
                for call in (backend.get_into(keys, pool.allocate(2)), backend.put_from(keys, slots), backend.exists(keys)):
                    started = time.monotonic()
                    with pytest.raises(BackendTimeoutError):
                        await call
                    assert time.monotonic() - started < 2
            finally:
                own_server.resume()
            assert await backend.get_into(keys, slots) == [True, True]


@pytest.mark.parametrize("zero_copy", [True, False])
async def test_cancelled_get_never_writes_into_reused_slots(server, prefix, zero_copy):
    """Cancel a get while its reply trickles through a proxy; hand its slots to someone else; the
    rest of the reply must never land there, and the backend must go on serving."""
    proxy = await DelayProxy(server.port, chunk=4096, delay_s=0.005).start()
    try:
        with HostPool(SPEC, 8) as pool:
            async with open_backend(proxy.url, pool, prefix=prefix, zero_copy=zero_copy) as backend:
                keys = new_keys(2)
                src = pool.allocate(2)
                records = fill_and_seal(pool, src, keys)
                assert await backend.put_from(keys, src) == [True, True]
                dst = pool.allocate(2)
                get = asyncio.create_task(backend.get_into(keys, dst))
                while proxy.forwarded < 16 * 1024:  # midway through the replies
                    await asyncio.sleep(0.002)
                get.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await get
                assert proxy.forwarded < 2 * pool.record_bytes
                pool.free(dst)
                reused = pool.allocate(2)
                assert sorted(reused) == sorted(dst)
                pattern = secrets.token_bytes(64) * (pool.record_bytes // 64) + bytes(pool.record_bytes % 64)
                for s in reused:
                    pool.record_view(s)[:] = pattern
                await asyncio.sleep(0.5)  # long enough for the whole reply to have trickled in
                assert all(bytes(pool.record_view(s)) == pattern for s in reused)
                assert await backend.get_into(keys, reused) == [True, True]
                assert [bytes(pool.record_view(s)) for s in reused] == [records[k] for k in keys]
    finally:
        await proxy.close()


@pytest.mark.parametrize("cut", ["cancel", "timeout"])
async def test_put_cut_off_mid_value_stores_nothing(server, prefix, cut):
    """A put stopped while its value is on the wire: its connection is dropped (were it reused, the
    next command's bytes would complete the value with garbage), the server discards the partial
    command, and the same backend goes on storing whole pages."""
    proxy = await DelayProxy(server.port, chunk=16 * 1024, delay_s=0.002, upstream=True).start()
    try:
        # 10 MB records: more than the kernel buffers between us and the proxy can hold, so the
        # put is cut off with part of its value still in the slot, not yet sent.
        with HostPool(nsa_spec(num_layers=200), 3) as pool:
            async with open_backend(proxy.url, pool, prefix=prefix, socket_timeout_s=0.3, max_in_flight=1) as backend:
                keys = new_keys(2)
                src = pool.allocate(2)
                records = fill_and_seal(pool, src, keys)
                put = asyncio.create_task(backend.put_from(keys[:1], src[:1]))
                if cut == "cancel":
                    while proxy.forwarded < 64 * 1024:
                        await asyncio.sleep(0.002)
                    put.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await put
                else:
                    with pytest.raises(BackendTimeoutError):
                        await put
                seen = -1
                while seen != proxy.forwarded:  # until the proxy has passed on all it ever got
                    seen = proxy.forwarded
                    await asyncio.sleep(0.2)
                assert proxy.forwarded < len(records[keys[0]])
                proxy.delay_s = 0  # a fast link again
                assert await backend.put_from(keys[1:], src[1:]) == [True]
            with raw_client(server) as direct:
                assert direct.exists(prefix + keys[0]) == 0
                assert direct.get(prefix + keys[1]) == records[keys[1]]
    finally:
        await proxy.close()


# --- configuration errors -----------------------------------------------------------------------
@pytest.mark.parametrize("url, message", [
    ("redis://127.0.0.1:99999/0", "bad port"),
    ("redis://127.0.0.1:6379/abc", "bad db 'abc'"),
    ("redis://127.0.0.1:6379/0?db=1", "both in the path"),
    ("redis://127.0.0.1:6379/0?colour=red", "unknown option 'colour'"),
    ("redis://127.0.0.1:6379/0?max_in_flight=0", "max_in_flight"),
    ("redis://127.0.0.1:6379/0?ttl_s=soon", "ttl_s"),
    ("redis:///0", "no host"),
    ("unix://", "socket path"),
    ("rediss://127.0.0.1:6379/0?ssl_cert_reqs=maybe", "ssl_cert_reqs"),
    ("nosuch://127.0.0.1:6379", "unknown backend scheme"),
])
def test_bad_urls_are_config_errors(url, message):
    with HostPool(SPEC, 2) as pool, pytest.raises(ConfigError, match=message):
        open_backend(url, pool)


async def test_server_side_config_errors(own_server):
    with HostPool(SPEC, 2) as pool:
        async with open_backend(own_server.url.replace("/0", "/999"), pool) as backend:
            with pytest.raises(ConfigError, match="DB index is out of range"):
                await backend.get_into(new_keys(1), [0])  # raw connection
            with pytest.raises(ConfigError, match="DB index is out of range"):
                await backend.exists(new_keys(1))  # redis-py
        async with open_backend(f"redis://nobody:secret@127.0.0.1:{own_server.port}/0", pool) as backend:
            with pytest.raises(ConfigError, match="WRONGPASS|invalid"):
                await backend.get_into(new_keys(1), [0])
            with pytest.raises(ConfigError, match="WRONGPASS|invalid|credentials"):
                await backend.exists(new_keys(1))


@pytest.mark.parametrize("userinfo", [":s3cret", "default:s3cret"])
@pytest.mark.parametrize("zero_copy", [True, False])
async def test_password_and_db(userinfo, zero_copy):
    with RedisServer(extra=("--requirepass", "s3cret")) as srv, HostPool(SPEC, 4) as pool:
        url = f"redis://{userinfo}@127.0.0.1:{srv.port}/3"
        async with open_backend(url, pool, zero_copy=zero_copy) as backend:
            keys = await assert_round_trip(backend, pool)
            with redis.Redis(host="127.0.0.1", port=srv.port, password="s3cret", db=3) as direct:
                assert direct.exists(*(f"tkv:{k}" for k in keys)) == 2
            with redis.Redis(host="127.0.0.1", port=srv.port, password="s3cret", db=0) as direct:
                assert direct.dbsize() == 0


@pytest.mark.parametrize("where", ["tcp", "unix", "key_only"])
def test_nobody_listening_is_unavailable_at_open(where, tmp_path):
    """Opened, it answered every request with BackendUnavailableError, and a hierarchy over it ran
    its whole workload with the tier degraded. Refused at open, naming the server's URL (never the
    password)."""
    from .redis_server import free_port

    port = free_port()
    url, named = {
        "tcp": (f"redis://:s3cret@127.0.0.1:{port}/2", f"redis://127.0.0.1:{port}/2"),
        "unix": (f"unix://{tmp_path}/none.sock", f"unix://{tmp_path}/none.sock"),
        "key_only": (f"redis://127.0.0.1:{port}", f"redis://127.0.0.1:{port}/0"),
    }[where]
    with HostPool(SPEC, 2) as pool:
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError, match="cannot be reached") as caught:
            open_backend(url, None if where == "key_only" else pool, connect_timeout_s=1)
        assert time.monotonic() - started < 5
        assert named in str(caught.value) and "s3cret" not in str(caught.value)
        assert isinstance(caught.value, BackendError)


async def test_a_server_that_goes_away_after_open_is_unavailable_per_request(own_server):
    """Only the open is refused: a server gone after it fails each request (a degraded tier, under
    a controller), and serves the same backend object again once it is back."""
    with HostPool(SPEC, 4) as pool:
        async with open_backend(own_server.url, pool, connect_timeout_s=1) as backend:
            keys = await assert_round_trip(backend, pool, n=1)
            own_server.kill()
            with pytest.raises(BackendUnavailableError, match="127.0.0.1"):
                await backend.exists(keys)
            own_server.start()
            assert await backend.exists(keys) == 0  # a new, empty server (no persistence)


# --- TLS ----------------------------------------------------------------------------------------
needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl CLI makes the test certificates")


@needs_openssl
async def test_tls_with_client_certificates():
    with RedisServer(tls=True) as srv, HostPool(SPEC, 4) as pool:
        async with open_backend(srv.tls_url, pool) as backend:
            assert not backend.capabilities.zero_copy  # values go through redis-py's TLS streams
            keys = await assert_round_trip(backend, pool)
        unverified = (f"rediss://127.0.0.1:{srv.port}/0?ssl_cert_reqs=none"
                      f"&ssl_certfile={srv.certs['client.crt']}&ssl_keyfile={srv.certs['client.key']}")
        async with open_backend(unverified, pool) as backend:  # no CA given: server not verified
            assert await backend.exists(keys) == 2
        without_client_cert = f"rediss://127.0.0.1:{srv.port}/0?ssl_ca_certs={srv.certs['ca.crt']}"
        async with open_backend(without_client_cert, pool, connect_timeout_s=2) as backend:
            with pytest.raises(BackendUnavailableError):
                await backend.exists(keys)


@pytest.mark.skipif(shutil.which("redis-benchmark") is None, reason="redis-benchmark is not installed")
@pytest.mark.parametrize("where", ["tcp", "unix"])
def test_raw_ceiling_runs_redis_benchmark(server, where):
    url = server.unix_url if where == "unix" else server.url
    before = raw_client(server).dbsize()
    ceiling = measure_raw_ceiling(url + ("&" if "?" in url else "?") + "max_in_flight=2", page_bytes=100_000, pages=20)
    assert ceiling["raw_put_gbps"] > 0 and ceiling["raw_get_gbps"] > 0
    assert "-d 100000 -n 20 -c 2" in ceiling["raw_method"]
    assert raw_client(server).dbsize() == before  # its key was removed


@needs_openssl
@pytest.mark.skipif(shutil.which("redis-benchmark") is None, reason="redis-benchmark is not installed")
def test_raw_ceiling_over_tls():
    with RedisServer(tls=True) as srv:
        ceiling = measure_raw_ceiling(srv.tls_url + "&max_in_flight=2", page_bytes=50_000, pages=10)
        assert ceiling["raw_put_gbps"] > 0 and ceiling["raw_get_gbps"] > 0
        with redis.Redis(host="127.0.0.1", port=srv.port, ssl=True, ssl_ca_certs=srv.certs["ca.crt"],
                         ssl_certfile=srv.certs["client.crt"], ssl_keyfile=srv.certs["client.key"]) as direct:
            assert direct.dbsize() == 0
