"""The Mooncake Store backend against a real ``mooncake_master`` on loopback.

Covers the shared contract (over plain slots and over slots bound to an engine's memory, whose
records move in parts), records moving between bound and plain pools, sharing with a second process, the failures Mooncake has (master
killed mid-batch and restarted, segment holder exiting or killed, store full, no segment at all),
a get cancelled mid-transfer, records a foreign or broken writer left, the read lease, replicas,
the raw ceiling measurement, and bad URLs. Needs the ``mooncake`` module (``pip install
mooncake-transfer-engine-non-cuda`` on CPU machines): skipped when it is not installed; an
installed module that fails to load (missing ``libibverbs1`` / ``librdmacm1``) is an error.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time

import numpy as np
import pytest
import torch

if importlib.util.find_spec("mooncake") is None:
    pytest.skip("the mooncake module is not installed", allow_module_level=True)
import mooncake.store  # noqa: F401 - fail loudly when installed but broken

from tiered_kv import HostPool, nsa_spec
from tiered_kv.backends import open_backend
from tiered_kv.backends.mooncake import MooncakeBackend, disjoint_regions
from tiered_kv.model.bound_pool import BoundPool
from tiered_kv.model.record import HEADER_BYTES
from tiered_kv.ops.bench.raw_ceilings import measure_raw_ceiling, measure_raw_round
from tiered_kv.errors import BackendError, BackendTimeoutError, BackendUnavailableError, ConfigError

from .contract import SPEC, BackendContract, assert_settled, bound_pool, fill_and_seal, new_keys, record_of
from .mooncake_server import LOOPBACK_ENV, MooncakeMaster, RawClient, record_digest, run_reader, segment_holder


@pytest.fixture(scope="module", autouse=True)
def loopback_env():
    saved = {k: os.environ.get(k) for k in LOOPBACK_ENV}
    os.environ.update(LOOPBACK_ENV)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def master(loopback_env):
    server = MooncakeMaster().start()
    yield server
    server.stop()


@pytest.fixture
def own_master(loopback_env):
    """A master for tests that kill or restart it, or fill it.

    Its own eviction is off: with the defaults the master evicts 5 % of the objects whenever a put
    finds no room (and above 90 % use), so a test that fills the store would race the master's
    eviction thread for the pages that did fit. Off means: above a use ratio of 1.0, which never
    happens, and no eviction after a refused put (ratio 0).
    """
    server = MooncakeMaster("--eviction_high_watermark_ratio=1.0", "--eviction_ratio=0.0").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def shared_pool():
    with HostPool(SPEC, 256, "page_first") as pool:
        yield pool


def shared_store_client(pool, master):
    """One store client for a whole class, closed after it. It holds no event-loop state: each
    test's loop may drive it."""
    backend = open_backend(master.url(global_segment_bytes="64MiB", timeout_s=10), pool)
    yield backend
    asyncio.run(backend.aclose())


@pytest.fixture(scope="module")
def shared_backend(shared_pool, master):
    yield from shared_store_client(shared_pool, master)


class TestMooncakeContract(BackendContract):
    """One backend serves the whole class, as in an engine (a store client takes ~1 s to close)."""

    @pytest.fixture
    def pool(self, shared_pool):
        return shared_pool

    @pytest.fixture
    def backend(self, shared_backend):
        return shared_backend

    @pytest.fixture
    def same_medium(self, master):
        return lambda pool: open_backend(master.url(contribute_segment=False, timeout_s=10), pool)

    @pytest.fixture
    async def closable(self, master, pool):
        # Not the class's backend: the close test must leave that one open for the tests after it.
        backend = open_backend(master.url(global_segment_bytes="16MiB", timeout_s=10), pool)
        yield backend
        await backend.aclose()


@pytest.fixture(scope="class")
def shared_bound_pool():
    with bound_pool(SPEC, 256) as pool:
        yield pool


@pytest.fixture(scope="class")
def shared_bound_backend(shared_bound_pool, master):
    yield from shared_store_client(shared_bound_pool, master)


class TestMooncakeBoundContract(TestMooncakeContract):
    """The contract over slots bound to two unaligned ranges of engine memory each
    (``contract.bound_pool``): every record moves in three parts, by the store's multi-buffer calls."""

    @pytest.fixture
    def pool(self, shared_bound_pool):
        return shared_bound_pool

    @pytest.fixture
    def backend(self, shared_bound_backend):
        return shared_bound_backend


def engine_pool(spec, num_slots: int) -> tuple[BoundPool, np.ndarray, np.ndarray]:
    """A ``BoundPool`` over engine-like memory, every slot bound: a page's first 5000 payload bytes
    in a CPU tensor's row, the rest in a numpy array's row. The array is given twice, the second
    time as a view from its 8th byte on (regions that overlap, as views an engine hands over may).
    Returns the pool and the two buffers, as arrays."""
    first = 5000
    head = torch.zeros((num_slots, first), dtype=torch.uint8)
    tail = np.zeros((num_slots, spec.page_bytes - first), dtype=np.uint8)
    pool = BoundPool(spec, num_slots, [head, tail, tail.reshape(-1)[8:]])
    for slot in range(num_slots):
        pool.bind(slot, [head[slot], tail[slot]])
    return pool, head.numpy(), tail


def engine_payload(head: np.ndarray, tail: np.ndarray, slot: int) -> bytes:
    return head[slot].tobytes() + tail[slot].tobytes()


def test_disjoint_regions_merges_what_overlaps_or_touches():
    assert disjoint_regions([(300, 50), (100, 100), (150, 20), (200, 10), (500, 0), (400, 5)]) == [
        (100, 110), (300, 50), (400, 5)]
    assert disjoint_regions([]) == []


async def test_a_record_moves_between_bound_and_plain_pools(master):
    """A page put from slots bound to an engine's memory reads back byte for byte into a plain
    pool through another client, and the reverse; a bound get writes the payload straight into
    the engine's buffers."""
    bound, head, tail = engine_pool(SPEC, 4)
    with bound, HostPool(SPEC, 4) as plain:
        async with (open_backend(master.url(global_segment_bytes="16MiB", timeout_s=10), bound) as engine_side,
                    open_backend(master.url(contribute_segment=False, timeout_s=10), plain) as plain_side):
            keys = new_keys(4)
            src = bound.allocate(2)
            written = fill_and_seal(bound, src, keys[:2])
            assert [engine_payload(head, tail, s) for s in src] == [written[k][HEADER_BYTES:] for k in keys[:2]]
            assert await engine_side.put_from(keys[:2], src) == [True, True]
            dst = plain.allocate(2)
            assert await plain_side.get_into(keys[:2], dst) == [True, True]
            assert [bytes(plain.record_view(s)) for s in dst] == [written[k] for k in keys[:2]]

            plain_src = plain.allocate(2)
            theirs = fill_and_seal(plain, plain_src, keys[2:])
            assert await plain_side.put_from(keys[2:], plain_src) == [True, True]
            bound_dst = bound.allocate(2)
            head[bound_dst] = 0xA5  # poison: the get must overwrite every byte of the engine's rows
            tail[bound_dst] = 0xA5
            assert await engine_side.get_into(keys[2:], bound_dst) == [True, True]
            assert [engine_payload(head, tail, s) for s in bound_dst] == [theirs[k][HEADER_BYTES:] for k in keys[2:]]
            assert [record_of(bound, s) for s in bound_dst] == [theirs[k] for k in keys[2:]]
            bound.free(src + bound_dst)
            plain.free(dst + plain_src)
            assert_settled(bound, bound.num_slots)
            assert_settled(plain, plain.num_slots)


async def test_a_batch_of_bound_and_unbound_slots(master):
    """One batch over slots of both kinds (an engine page in place, a staged copy) is split in a
    contiguous and a multi-buffer call; the answers come back in the batch's order."""
    pool, head, tail = engine_pool(SPEC, 12)
    with pool:
        async with open_backend(master.url(global_segment_bytes="16MiB", timeout_s=10), pool) as backend:
            slots = pool.allocate(12)
            for slot in slots[1:4:2] + slots[5:7] + slots[8:11:2]:
                pool.unbind(slot)
            keys = new_keys(4)
            src = slots[:4]  # bound, unbound, bound, unbound
            records = fill_and_seal(pool, src, keys)
            assert await backend.put_from(keys, src) == [True] * 4
            dst = [slots[5], slots[4], slots[6], slots[7]]  # unbound, bound, unbound, bound
            for slot in dst:
                pool.fill_record(slot, b"\xa5" * pool.record_bytes)
            assert await backend.get_into(keys, dst) == [True] * 4
            assert [record_of(pool, s) for s in dst] == [records[k] for k in keys]
            assert [engine_payload(head, tail, s) for s in (slots[4], slots[7])] == [
                records[k][HEADER_BYTES:] for k in (keys[1], keys[3])]
            # Per key and in order, misses among them (the primitive: no leading-run cut).
            [absent] = new_keys(1)
            mixed = [keys[3], absent, keys[0], keys[1], absent + "x", keys[2]]
            into = [slots[8], slots[9], slots[10], slots[11], slots[5], slots[4]]
            assert [pool.is_bound(s) for s in into] == [False, True, False, True, False, True]
            assert await backend._get(mixed, into) == [True, False, True, True, False, True]
            assert [record_of(pool, into[i]) for i in (0, 2, 3, 5)] == [records[k] for k in (keys[3], keys[0], keys[1], keys[2])]
            pool.free(slots)
        assert pool.free_slots == pool.num_slots


async def test_capabilities(master):
    with HostPool(SPEC, 2) as pool:
        async with open_backend(master.url(global_segment_bytes="16MiB"), pool) as backend:
            assert isinstance(backend, MooncakeBackend)
            caps = backend.capabilities
            assert caps.zero_copy and not caps.persistent
            assert caps.shared_across_processes and caps.shared_across_nodes


async def test_second_process_reads_what_the_first_wrote(master):
    """The writer contributes the segment and stays alive; the reader is a pure client elsewhere."""
    with HostPool(SPEC, 8) as pool:
        async with open_backend(master.url(global_segment_bytes="64MiB"), pool) as writer:
            keys = new_keys(5)
            slots = pool.allocate(5)
            records = fill_and_seal(pool, slots, keys)
            assert await writer.put_from(keys[:4], slots[:4]) == [True] * 4
            read = await asyncio.to_thread(run_reader, master.url(contribute_segment=False), keys)
    assert read == {k: (record_digest(records[k]) if i < 4 else None) for i, k in enumerate(keys)}


async def test_pure_client_uses_another_process_segment(own_master):
    # Its own master: on a shared one, pages may land in segments other tests keep mounted.
    with HostPool(SPEC, 8) as pool:
        async with open_backend(own_master.url(contribute_segment=False, timeout_s=10), pool) as client:
            keys = new_keys(4)
            slots = pool.allocate(4)
            records = fill_and_seal(pool, slots, keys)
            with segment_holder(own_master, "32MiB"):
                assert await client.put_from(keys, slots) == [True] * 4
                dst = pool.allocate(4)
                assert await client.get_into(keys, dst) == [True] * 4
                assert [bytes(pool.record_view(s)) for s in dst] == [records[k] for k in keys]
            # The holder's segment went with it: its pages are gone (not persistent). The holder
            # unmounts on exit; should that be cut short on a loaded machine, the master drops
            # the segment once the client's TTL (10 s) runs out.
            deadline = time.monotonic() + 20
            while await client.exists(keys) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert await client.exists(keys) == 0
            assert await client.get_into(keys, dst) == [False] * 4


async def test_full_store_refuses_what_does_not_fit(own_master):
    # DeepSeek-V3.2 pages (3 MiB): ten of them do not fit the smallest segment the store takes.
    # Its own master: no segment left over from another test may add room.
    with HostPool(nsa_spec(), 16) as pool:
        async with open_backend(own_master.url(contribute_segment=False, timeout_s=10), pool) as client:
            with segment_holder(own_master, "16MiB"):
                keys = new_keys(10)
                slots = pool.allocate(10)
                records = fill_and_seal(pool, slots, keys)
                stored = await client.put_from(keys, slots)
                assert 0 < sum(stored) < 10
                assert client.stats.put_rejected == stored.count(False)
                kept = [k for k, ok in zip(keys, stored) if ok]
                dst = pool.allocate(len(kept))
                assert await client.get_into(kept, dst) == [True] * len(kept)
                assert [bytes(pool.record_view(s)) for s in dst] == [records[k] for k in kept]


async def test_no_segment_anywhere_is_a_refused_put(own_master):
    with HostPool(SPEC, 2) as pool:
        async with open_backend(own_master.url(contribute_segment=False, timeout_s=10), pool) as client:
            keys = new_keys(1)
            slots = pool.allocate(1)
            fill_and_seal(pool, slots, keys)
            assert await client.put_from(keys, slots) == [False]


async def test_master_killed_mid_batch_then_restarted(own_master):
    timeout_s = 5
    with HostPool(SPEC, 48) as pool:
        async with open_backend(own_master.url(global_segment_bytes="64MiB", timeout_s=timeout_s), pool) as backend:
            keys = new_keys(24)
            src = pool.allocate(24)
            fill_and_seal(pool, src, keys)
            assert await backend.put_from(keys, src) == [True] * 24
            dst = pool.allocate(24)

            async def traffic() -> BaseException:
                # Reads and writes without pause until the master's death surfaces as our error.
                while True:
                    try:
                        await backend.get_into(keys, dst)
                        await backend.exists(keys)
                        more = new_keys(8)
                        fill_and_seal(pool, src[:8], more)
                        await backend.put_from(more, src[:8])
                    except BackendError as exc:
                        return exc

            task = asyncio.create_task(traffic())
            await asyncio.sleep(0.3)
            killed_at = time.monotonic()
            await asyncio.to_thread(own_master.kill)
            error = await asyncio.wait_for(task, 3 * timeout_s)
            assert isinstance(error, (BackendUnavailableError, BackendTimeoutError))
            assert time.monotonic() - killed_at < 2 * timeout_s + 1
            with pytest.raises((BackendUnavailableError, BackendTimeoutError)):
                await backend.exists(keys)
            assert backend.stats.errors >= 2

            await asyncio.to_thread(own_master.start)
            # The same backend object serves again once the client has re-registered.
            fresh = new_keys(2)
            fill_and_seal(pool, src[:2], fresh)
            deadline = time.monotonic() + 30
            while True:
                try:
                    if await backend.put_from(fresh, src[:2]) == [True, True]:
                        break
                except BackendError:
                    pass
                assert time.monotonic() < deadline, "backend did not serve again after the master restarted"
                await asyncio.sleep(0.5)
            assert await backend.get_into(fresh, dst[:2]) == [True, True]
            assert await backend.exists(keys) == 0  # the master's restart lost every object


async def test_health_passes_only_once_the_segment_is_mounted_again(own_master):
    """After a master restart the health check passed as soon as the master answered, before the
    client had mounted its segment again: the tier was called back and its next puts were refused
    for want of space (364 in 0.36 s in a replay). Healthy now means a put fits: the check mounts
    the segment again where it is missing, and the first batch after it is stored whole."""
    with HostPool(SPEC, 40) as pool:
        async with open_backend(own_master.url(global_segment_bytes="16MiB", timeout_s=5), pool) as backend:
            await backend.check_health("probe")
            await asyncio.to_thread(own_master.restart)
            deadline = time.monotonic() + 30
            while True:
                try:
                    await backend.check_health("probe")
                    break
                except BackendError:
                    assert time.monotonic() < deadline, "the store never passed its health check again"
                    await asyncio.sleep(0.05)
            keys = new_keys(32)
            src = pool.allocate(32)
            fill_and_seal(pool, src, keys)
            assert await backend.put_from(keys, src) == [True] * 32
            assert backend.stats.put_rejected == 0
            dst = pool.allocate(8)
            assert await backend.get_into(keys[:8], dst) == [True] * 8
            pool.free(src + dst)
        assert pool.free_slots == pool.num_slots


async def test_unreachable_master_fails_fast():
    with HostPool(SPEC, 2) as pool:
        start = time.monotonic()
        with pytest.raises(BackendUnavailableError, match="no master answers"):
            open_backend("mooncake://127.0.0.1:9?metadata_server=http://127.0.0.1:9/metadata&timeout_s=2", pool)
        assert time.monotonic() - start < 5


def _foreign_records(pool: HostPool, key: str) -> dict[str, bytes]:
    """Broken objects a store may hold under ``key`` (another page's record of this spec among them)."""
    [slot] = pool.allocate(1)
    fill_and_seal(pool, [slot], [key])
    good = record_of(pool, slot)
    flipped = bytearray(good)
    flipped[5000] ^= 0x40
    fill_and_seal(pool, [slot], [key + "-other"])
    other_key = record_of(pool, slot)
    pool.free([slot])
    return {
        "corrupt": bytes(flipped),
        "other_key": other_key,
        "truncated": good[:-100],
        "shorter_than_a_header": good[:1000],
        "longer": good + b"\0" * 4096,
        "not_a_record": os.urandom(len(good)),
    }


@pytest.fixture(scope="module")
def raw_client(master):
    client = RawClient(master)
    yield client
    client.close()


@pytest.fixture(scope="module", params=["plain", "bound"])
def shared(master, request):
    """A pool and a backend that several tests share (a store client takes ~1 s to close): once
    plain, once with every slot bound to an engine's memory (its reads go by parts)."""
    with (HostPool(SPEC, 64) if request.param == "plain" else bound_pool(SPEC, 64)) as pool:
        backend = open_backend(master.url(global_segment_bytes="32MiB", timeout_s=10), pool)
        yield pool, backend
        asyncio.run(backend.aclose())


@pytest.mark.parametrize("kind", ["corrupt", "other_key", "truncated", "shorter_than_a_header", "longer", "not_a_record"])
async def test_broken_record_is_a_counted_deleted_miss(shared, raw_client, kind):
    pool, backend = shared
    free_before = pool.free_slots
    [key] = new_keys(1)
    assert raw_client.put(key, _foreign_records(pool, key)[kind]) == 0
    assert await backend.exists([key]) == 1
    [dst] = pool.allocate(1)
    pool.fill_record(dst, b"\x5a" * pool.record_bytes)
    corrupt, foreign, hits = backend.stats.corrupt, backend.stats.foreign, backend.stats.hits
    assert await backend.get_into([key], [dst]) == [False]
    assert (backend.stats.corrupt - corrupt, backend.stats.foreign - foreign, backend.stats.hits - hits) == (1, 0, 0)
    assert await backend.exists([key]) == 0  # deleted despite the read's lease
    pool.free([dst])
    assert pool.free_slots == free_before


@pytest.mark.parametrize("kind", ["bigger_spec", "smaller_spec"])
async def test_foreign_record_is_a_counted_miss_left_in_place(shared, raw_client, kind):
    """A record of another spec with bigger or smaller pages (the store refuses to read a larger
    object into the slot, and a gather read into a bound slot's parts fails on a shorter one: its
    size and header are read apart): a foreign miss."""
    pool, backend = shared
    free_before = pool.free_slots
    [key] = new_keys(1)
    records = _foreign_records(pool, key)
    for layers, name in ((3, "bigger_spec"), (1, "smaller_spec")):
        with HostPool(nsa_spec(num_layers=layers), 1) as other:
            theirs = other.allocate(1)
            fill_and_seal(other, theirs, [key])
            records[name] = bytes(other.record_view(theirs[0]))
    assert raw_client.put(key, records[kind]) == 0
    [dst] = pool.allocate(1)
    corrupt, foreign = backend.stats.corrupt, backend.stats.foreign
    assert await backend.get_into([key], [dst]) == [False]
    assert (backend.stats.corrupt - corrupt, backend.stats.foreign - foreign) == (0, 1)
    assert await backend.exists([key]) == 1  # left for its owner
    await backend.delete([key])
    pool.free([dst])
    assert pool.free_slots == free_before


async def test_delete_right_after_a_read(shared):
    """A read's lease blocks a plain remove for seconds; delete must still take effect now."""
    pool, backend = shared
    keys = new_keys(2)
    slots = pool.allocate(2)
    fill_and_seal(pool, slots, keys)
    await backend.put_from(keys, slots)
    assert await backend.get_into(keys, pool.allocate(2)) == [True, True]
    await backend.delete(keys)
    assert await backend.exists(keys[:1]) == 0 and await backend.exists(keys[1:]) == 0


async def test_cancelled_get_never_writes_into_reused_slots(master):
    """Cancel a get while Mooncake moves pages over TCP into its slots; hand the slots out again:
    they come back only after the worker has returned, and no late byte lands in them."""
    with HostPool(nsa_spec(), 40) as pool:
        async with open_backend(master.url(contribute_segment=False, timeout_s=20), pool) as client:
            with segment_holder(master, "128MiB"):
                keys = new_keys(20)
                src = pool.allocate(20)
                fill_and_seal(pool, src, keys)
                assert await client.put_from(keys, src) == [True] * 20
                dst = pool.allocate(20)
                get = asyncio.create_task(client.get_into(keys, dst))
                await asyncio.sleep(0.005)  # the 60 MB read is under way
                get.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await get
                pool.free(dst)
                held = pool.free_slots == 0  # dst still held while the worker runs
                deadline = time.monotonic() + 20
                while pool.reap() == 0 and pool.free_slots < 20:
                    assert time.monotonic() < deadline, "cancelled read never released its slots"
                    await asyncio.sleep(0.01)
                reused = pool.allocate(20)
                assert sorted(reused) == sorted(dst)
                pattern = os.urandom(4096) * (pool.record_bytes // 4096) + bytes(pool.record_bytes % 4096)
                for s in reused:
                    pool.record_view(s)[:] = pattern
                await asyncio.sleep(0.2)
                assert all(bytes(pool.record_view(s)) == pattern for s in reused)
                assert await client.get_into(keys[:2], reused[:2]) == [True, True]  # still serving
                assert held, "the read finished before it was cancelled; the test proved nothing"


async def test_raw_round_moves_the_same_slots_through_the_backends_client(shared_backend, shared_pool):
    """The same-pages ceiling: the slots' bytes go out and come back into the other slots by the
    store's own calls on the backend's client."""
    pool = shared_pool
    src, dst = pool.allocate(5), pool.allocate(5)
    try:
        for s in src:
            pool.record_view(s)[:] = os.urandom(pool.record_bytes)
        for s in dst:
            pool.record_view(s)[:] = bytes(pool.record_bytes)
        before = shared_backend.stats.bytes_written
        result = await measure_raw_round(shared_backend, src, dst, batch=2)
        assert result["raw_put_s"] > 0 and result["raw_get_s"] > 0
        assert [bytes(pool.record_view(d)) for d in dst] == [bytes(pool.record_view(s)) for s in src]
        assert shared_backend.stats.bytes_written == before  # not counted as our traffic
    finally:
        pool.free(src + dst)


def test_raw_ceiling_is_measured(master):
    result = measure_raw_ceiling(master.url(timeout_s=20), page_bytes=256 << 10, pages=8)
    for name in ("raw_put_gbps", "raw_get_gbps", "naive_put_gbps", "naive_get_gbps", "raw_put_cold_gbps", "raw_get_cold_gbps"):
        assert result[name] > 0.001, name
    assert "batch_put_from" in result["raw_method"]


@pytest.mark.parametrize(("url", "message"), [
    ("mooncake://127.0.0.1", "host:port"),
    ("mooncake://127.0.0.1:notaport", "port"),
    ("mooncake://127.0.0.1:70000", "port"),
    ("mooncake://:5000", "host:port"),
    ("mooncake://127.0.0.1:5000?segment=1GiB", "unknown option 'segment'"),
    ("mooncake://127.0.0.1:5000?protocol=udp", "protocol"),
    ("mooncake://127.0.0.1:5000?global_segment_bytes=lots", "global_segment_bytes"),
    ("mooncake://127.0.0.1:5000?global_segment_bytes=10", "global_segment_bytes >= 1024"),
    ("mooncake://127.0.0.1:5000?contribute_segment=false&global_segment_bytes=1GiB", "pure client"),
    ("mooncake://127.0.0.1:5000?contribute_segment=maybe", "contribute_segment"),
    ("mooncake://127.0.0.1:5000?replica_num=0", "replica_num"),
    ("mooncake://127.0.0.1:5000?timeout_s=0", "timeout_s"),
    ("mooncake://127.0.0.1:5000?metadata_server=127.0.0.1:8080", "metadata_server"),
    ("mooncake://127.0.0.1:5000?local_buffer_bytes=1", "local_buffer_bytes"),
    ("mooncake://127.0.0.1:5000?transfers_in_flight=0", "transfers_in_flight"),
    ("mooncake://127.0.0.1:5000?workers=2&transfers_in_flight=3", "transfers_in_flight"),
    ("mooncake://127.0.0.1:5000?workers=two", "workers"),
])
def test_bad_url_is_a_clear_config_error(url, message):
    with HostPool(SPEC, 2) as pool:
        with pytest.raises(ConfigError, match=message):
            open_backend(url, pool)


async def test_segment_holder_killed(loopback_env):
    """The process holding the pages dies (SIGKILL): reads fail with our error or miss, never hang;
    once the master has expired it, the pages read as misses and the store serves again."""
    server = MooncakeMaster("--client_ttl=2").start()
    try:
        with HostPool(SPEC, 8) as pool:
            async with open_backend(server.url(contribute_segment=False, timeout_s=5), pool) as client:
                keys = new_keys(4)
                slots = pool.allocate(4)
                fill_and_seal(pool, slots, keys)
                with segment_holder(server, "16MiB") as holder:
                    assert await client.put_from(keys, slots) == [True] * 4
                    holder.process.kill()
                    holder.process.wait()
                    dst = pool.allocate(4)
                    start = time.monotonic()
                    try:
                        got = await client.get_into(keys, dst)
                    except (BackendUnavailableError, BackendTimeoutError):
                        got = None
                    assert time.monotonic() - start < 6
                    assert got in (None, [False] * 4)
                    print("read from a killed holder:", "our error" if got is None else "misses")
                with segment_holder(server, "16MiB"):
                    deadline = time.monotonic() + 20
                    while any([await client.exists([k]) for k in keys]):
                        assert time.monotonic() < deadline, "the dead holder's pages never expired"
                        await asyncio.sleep(0.5)
                    assert await client.get_into(keys, dst) == [False] * 4
                    assert await client.put_from(keys[:1], slots[:1]) == [True]
                    assert await client.get_into(keys[:1], dst[:1]) == [True]
    finally:
        server.stop()


async def test_replica_num_places_copies_in_distinct_segments(master, raw_client):
    with HostPool(SPEC, 4) as pool:
        async with open_backend(master.url(contribute_segment=False, replica_num=2, timeout_s=10), pool) as client:
            with segment_holder(master, "16MiB"), segment_holder(master, "16MiB"):
                keys = new_keys(2)
                slots = pool.allocate(2)
                fill_and_seal(pool, slots, keys)
                assert await client.put_from(keys, slots) == [True, True]
                assert [len(raw_client.store.get_replica_desc(k)) for k in keys] == [2, 2]
