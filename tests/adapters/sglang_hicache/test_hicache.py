"""The tiered-kv HiCache backend against SGLang's real storage contract, host pools and factory.

Each test drives the backend as SGLang's cache controller does (``pools.sglang_*``): a backup writes
the DSA indexer sidecar with ``batch_set_v2`` and then the KV with ``batch_set_v1``; a prefetch asks
``batch_exists_v2`` (``batch_exists`` without sidecars), reads the KV with ``batch_get_v1``, then the
indexer with ``batch_get_v2``, and keeps the smaller hit. Bytes are compared through SGLang's own
``get_data_page`` of its host pools.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import zlib

import pytest
import torch

from . import pools as sgl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # SGLang warns that the CPU lacks CUDA

CASES = [(kind, layout) for kind, layouts in sgl.LAYOUTS.items() for layout in layouts]
#: Whether a page of each pool is one contiguous range of SGLang's host buffer in record order.
CONTIGUOUS = {"layer_first": False, "page_first": False, "page_first_direct": True, "page_head": False}


def salt_of(request) -> int:
    """A prompt of this test's own, so tests sharing one Redis never see each other's pages."""
    return zlib.crc32(request.node.nodeid.encode())


def assert_pages(pools, got_pages, want) -> None:
    for page, expected in zip(got_pages, want, strict=True):
        got = sgl.page_bytes(pools, page)
        assert got.keys() == expected.keys()
        for name in expected:
            assert torch.equal(got[name], expected[name]), f"pool {name!r}: host page {page} differs from what was written"


def assert_untouched(pools, pages) -> None:
    for page in pages:
        for name, raw in sgl.page_bytes(pools, page).items():
            assert not raw.any(), f"pool {name!r}: host page {page} was written by a read that missed"


def round_trip(backend, pools, kind: str, salt: int, pages=(1, 2, 3), targets=(4, 5, 6)) -> list[str]:
    keys = sgl.page_hashes(len(pages), sgl.PAGE[kind], salt)
    sgl.fill(pools, seed=salt % 1000)
    want = [sgl.page_bytes(pools, p) for p in pages]
    assert sgl.sglang_exists(backend, pools, keys) == 0
    assert sgl.sglang_set(backend, pools, keys, list(pages))
    assert sgl.sglang_exists(backend, pools, keys) == len(pages)
    sgl.wipe(pools)
    assert sgl.sglang_get(backend, pools, keys, list(targets)) == len(pages)
    assert_pages(pools, targets, want)
    return keys


@pytest.mark.parametrize(("kind", "layout"), CASES)
def test_every_host_layout_round_trips_through_sglangs_calls(make_backend, kind, layout, request):
    backend, pools = make_backend(kind, layout, "memory://")
    assert type(backend).__name__ == "HiCacheBackend"  # SGLang's factory loaded our class
    expected = {"kv": CONTIGUOUS[layout]}
    if kind == "dsa":  # the indexer's page_first is page-major already
        expected["indexer"] = layout != "layer_first"
    assert {name: v["contiguous"] for name, v in backend.layouts().items()} == expected
    # memory:// moves records in parts: pages move in place exactly where every pool is contiguous.
    assert {v["in_place"] for v in backend.layouts().values()} == {all(expected.values())}
    round_trip(backend, pools, kind, salt_of(request))


@pytest.fixture(params=["redis", "file", "mooncake"])
def l3_url(request, tmp_path):
    if request.param == "redis":
        return request.getfixturevalue("redis_server").url
    if request.param == "file":
        return f"file://{tmp_path}/l3"
    return request.getfixturevalue("mooncake_master").url(global_segment_bytes="64MiB", timeout_s=10)


@pytest.mark.parametrize(("kind", "layout"), [("dsa", "page_first"), ("mha", "layer_first"),
                                              ("dsa", "page_first_direct"), ("mha", "page_first_direct")])
def test_round_trip_on_real_l3(make_backend, l3_url, kind, layout, request):
    backend, pools = make_backend(kind, layout, l3_url)
    assert backend.layouts()["kv"]["in_place"] == (layout == "page_first_direct" and backend.backend.moves_parts)
    keys = round_trip(backend, pools, kind, salt_of(request))
    assert backend.backend.stats.puts >= len(keys)


def _staging_payloads(backend) -> list[bytes]:
    """The staging slots' own payload bytes (where a staged page is gathered and scattered)."""
    staging = backend._pages.staging.pool
    raw = staging.buffer.numpy()
    return [raw[slot * staging.slot_bytes + 4096:slot * staging.slot_bytes + 4096 + staging.spec.page_bytes].tobytes()
            for slot in range(staging.num_slots)]


@pytest.mark.parametrize("kind", ["dsa", "mha"])
@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_in_place_pages_never_pass_through_a_staging_payload(make_backend, redis_server, kind, layout, request):
    """With page_first_direct host pools a page's record is sealed over SGLang's own ranges, sent
    from them and received into them (Redis): the staging slots' payloads stay as they were made
    (zeros). A staged layout gathers every page into one of them. (``file://`` under direct I/O
    bounces ranges that are not 4 KiB aligned through the slot's own memory: its own tests.)"""
    backend, pools = make_backend(kind, layout, redis_server.url)
    round_trip(backend, pools, kind, salt_of(request))
    touched = [payload.count(0) != len(payload) for payload in _staging_payloads(backend)]
    assert any(touched) == (layout != "page_first_direct")


def test_in_place_off_stages_every_page(make_backend, tmp_path, request):
    """``"in_place": false`` sends even page_first_direct pages through the staging slots."""
    backend, pools = make_backend("dsa", "page_first_direct", f"file://{tmp_path}/l3", in_place=False)
    assert not backend.layouts()["kv"]["in_place"]
    round_trip(backend, pools, "dsa", salt_of(request))
    assert any(payload.count(0) != len(payload) for payload in _staging_payloads(backend))


@pytest.mark.parametrize("kind", ["mha", "mla", "dsa"])
def test_the_record_is_the_linkers(make_backend, kind):
    """The spec built from SGLang's host pools is the one the tiered-kv linker builds from the device
    pools behind them: both write the same records under the same fingerprint."""
    from types import SimpleNamespace

    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    from tiered_kv.adapters.sglang.linker_pools import device_pool_group, spec_and_device_pool

    from ..sglang_linker.conftest import make_kvcache

    backend, _ = make_backend(kind, "page_first", "memory://")
    kvcache = make_kvcache(kind)
    params = SimpleNamespace(mtp_draft_device_pools=(), sidecar_draft_device_pools=())
    group = device_pool_group(kvcache, params, kvcache.page_size, {ComponentType.FULL})
    linker_spec, _ = spec_and_device_pool(group, kind=f"sglang-{type(kvcache).__name__}")
    assert backend.spec == linker_spec
    assert backend.spec.fingerprint == linker_spec.fingerprint


def _record_order(name: str, layout: str, page: torch.Tensor) -> torch.Tensor:
    """SGLang's ``get_data_page(flat=False)`` of an MLA / DSA page, layer-major (the record's order)."""
    if name == "kv":  # [L, ps, 1, d] / [ps, L, 1, d] / [1, L, ps, 1, d]
        orders = {"layer_first": lambda t: t, "page_first": lambda t: t.permute(1, 0, 2, 3), "page_first_direct": lambda t: t[0]}
        return orders[layout](page)
    return page[:, 0] if layout == "layer_first" else page[0, :, 0]  # [L, 1, row] / [1, L, 1, row]


@pytest.mark.parametrize(("written_as", "read_as"), [("page_first_direct", "layer_first"),
                                                    ("layer_first", "page_first_direct")])
def test_a_page_written_in_one_layout_reads_back_in_another(make_backend, tmp_path, written_as, read_as, request):
    """In place (page_first_direct) and staged (layer_first) pages are the same records."""
    url = f"file://{tmp_path}/l3"
    writer, written = make_backend("dsa", written_as, url)
    reader, read = make_backend("dsa", read_as, url)
    keys = sgl.page_hashes(2, sgl.PAGE["dsa"], salt_of(request))
    sgl.fill(written, seed=3)
    assert sgl.sglang_set(writer, written, keys, [1, 2])
    assert sgl.sglang_exists(reader, read, keys) == 2
    assert sgl.sglang_get(reader, read, keys, [3, 4]) == 2
    for source, target in ((1, 3), (2, 4)):
        for name in ("kv", "indexer"):
            want = written[name].get_data_page(source * 64, flat=False).contiguous().view(torch.uint8)
            got = read[name].get_data_page(target * 64, flat=False).contiguous().view(torch.uint8)
            assert torch.equal(_record_order(name, read_as, got), _record_order(name, written_as, want))


def test_an_indexer_write_without_its_kv_write_stores_nothing(make_backend, tmp_path, request):
    """SGLang's backup dies between the indexer write and the KV write: the indexer never reaches L3
    alone, so a later reader finds neither part of the page."""
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    url = f"file://{tmp_path}/l3"
    writer, pools = make_backend("dsa", "page_first", url)
    keys = sgl.page_hashes(2, sgl.PAGE["dsa"], salt_of(request))
    sgl.fill(pools, seed=5)
    indices = sgl.host_indices([1, 2], 64)
    assert writer.batch_set_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=indices, keys=keys)]) == {
        PoolName.INDEXER: [True, True]}
    writer.close()  # the process is gone before its KV write
    reader, read = make_backend("dsa", "page_first", url)
    assert sgl.sglang_exists(reader, read, keys) == 0
    assert sgl.sglang_get(reader, read, keys, [3, 4]) == 0
    assert_untouched(read, [3, 4])


def _stored_file(backend, page_hash: str):
    return backend.backend.path_of(backend.record_key(page_hash))


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
@pytest.mark.parametrize("damage", ["partial_put", "flipped_byte"])
def test_a_damaged_record_is_a_miss_for_kv_and_indexer_alike(make_backend, tmp_path, damage, layout, request):
    """A record cut short (a put that died half way) or with a flipped payload byte: neither the KV nor
    the indexer of that page reads back, the pages before it do, and the damaged record is gone. Read
    in place, the damaged page's bytes and those of the page after it (read, but past the leading
    run) are not left in SGLang's host pages."""
    url = f"file://{tmp_path}/l3"
    backend, pools = make_backend("dsa", layout, url)
    keys = sgl.page_hashes(3, sgl.PAGE["dsa"], salt_of(request))
    sgl.fill(pools, seed=7)
    want = [sgl.page_bytes(pools, p) for p in (1, 2, 3)]
    assert sgl.sglang_set(backend, pools, keys, [1, 2, 3])
    path = _stored_file(backend, keys[1])
    data = bytearray(path.read_bytes())
    if damage == "partial_put":
        data = data[:len(data) // 2]
    else:
        data[len(data) // 2] ^= 0x40  # inside the latent's or the indexer's bytes: the payload checksum fails
    path.write_bytes(bytes(data))
    sgl.wipe(pools)
    assert sgl.sglang_exists(backend, pools, keys) == 3  # present until a read verifies it
    assert sgl.sglang_get(backend, pools, keys, [4, 5, 6]) == 1
    assert_pages(pools, [4], want[:1])
    assert_untouched(pools, [5, 6])
    assert backend.backend.stats.corrupt == 1
    assert sgl.sglang_exists(backend, pools, keys) == 1


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_a_killed_redis_answers_misses_and_never_raises(make_backend, layout, request):
    """Redis killed mid-backup (after the indexer write, before the KV write) and while reading: every
    call answers False / 0; restarted, the backend serves again."""
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    from ...backends.redis_server import REDIS_SERVER, RedisServer

    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        backend, pools = make_backend("dsa", layout, server.url, timeout_s=5)
        keys = sgl.page_hashes(2, sgl.PAGE["dsa"], salt_of(request))
        sgl.fill(pools, seed=9)
        indices = sgl.host_indices([1, 2], 64)
        assert backend.batch_set_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=indices, keys=keys)])
        server.kill()
        started = time.monotonic()
        assert backend.batch_set_v1(keys, indices) == [False, False]
        assert backend.batch_exists(keys) == 0
        result = backend.batch_exists_v2(keys, [PoolTransfer(name=PoolName.INDEXER, keys=keys)])
        assert (result.kv_hit_pages, result.extra_pool_hit_pages) == (0, {PoolName.INDEXER: 0})
        sgl.wipe(pools)
        assert backend.batch_get_v1(keys, sgl.host_indices([3, 4], 64)) == [False, False]
        assert backend.batch_get_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=sgl.host_indices([3, 4], 64),
                                                  keys=keys)]) == {PoolName.INDEXER: [False, False]}
        assert not backend.exists(keys[0])
        assert time.monotonic() - started < 30
        assert_untouched(pools, [3, 4])
        server.start()
        assert sgl.sglang_exists(backend, pools, keys) == 0  # the indexer alone was never stored
        round_trip(backend, pools, "dsa", salt_of(request) + 1)


def test_two_sglang_processes_share_l3(make_backend, redis_server, sglang_model, request):
    """Another SGLang-style process (spawned) writes pages to Redis; this one reads identical bytes."""
    salt = salt_of(request)
    pages = [1, 2, 3]
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    writer = context.Process(target=sgl.write_in_process,
                             args=(str(sglang_model), redis_server.url, "dsa", "page_first", pages, salt, out))
    writer.start()
    try:
        ok, written = out.get(timeout=100)
    finally:
        writer.join(timeout=30)
    assert ok and writer.exitcode == 0
    backend, pools = make_backend("dsa", "page_first", redis_server.url)
    keys = sgl.page_hashes(len(pages), sgl.PAGE["dsa"], salt)
    assert sgl.sglang_exists(backend, pools, keys) == len(pages)
    assert sgl.sglang_get(backend, pools, keys, [4, 5, 6]) == len(pages)
    for source, target in zip(pages, [4, 5, 6]):
        got = sgl.page_bytes(pools, target)
        assert {name: bytes(raw.numpy()) for name, raw in got.items()} == written[source]
    assert os.getpid() != writer.pid


@pytest.mark.parametrize(("extra", "message"), [
    ({"interface_v1": 0}, "interface_v1"),
    ({"url": None}, "url"),
    ({"colour": "blue"}, "unknown key"),
    ({"staging_slots": 0}, "staging_slots"),
    ({"in_place": "yes"}, "in_place"),
])
def test_a_bad_extra_config_is_a_config_error_naming_it(sglang_model, extra, message):
    from tiered_kv.errors import ConfigError

    config = sgl.storage_config("mha", "memory://")
    config.extra_config.update(extra)
    if extra.get("url", "") is None:
        del config.extra_config["url"]
    pools = sgl.host_pools("mha", "layer_first")
    with pytest.raises(ConfigError, match=message):
        sgl.attach(pools, config)


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_a_stalled_redis_answers_misses_in_time_and_its_slots_come_back(make_backend, layout, request):
    """Redis stops answering (SIGSTOP) mid-prefetch: the calls give up after ``timeout_s`` with a miss.
    Staged, the staging slots of the calls still out stay held until those return, then serve again.
    In place, a call returns only once nothing of it can write into SGLang's pages: it is cancelled,
    its slots are free when it returns and the pages it was to fill hold nothing of it."""
    from ...backends.redis_server import REDIS_SERVER, RedisServer

    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        backend, pools = make_backend("dsa", layout, server.url, timeout_s=1, staging_slots=2)
        keys = round_trip(backend, pools, "dsa", salt_of(request))
        staging = backend._pages.staging.pool
        sgl.wipe(pools)
        server.pause()
        try:
            started = time.monotonic()
            assert sgl.sglang_get(backend, pools, keys, [4, 5, 6]) == 0
            assert sgl.sglang_exists(backend, pools, keys) == 0
            assert time.monotonic() - started < 10
            staging.reap()
            if layout == "page_first_direct":
                assert staging.free_slots == staging.num_slots
                assert_untouched(pools, [4, 5, 6])
            else:
                assert staging.free_slots < staging.num_slots  # the stalled get still holds its slot
        finally:
            server.resume()
        deadline = time.monotonic() + 10
        while staging.reap() is not None and staging.free_slots != staging.num_slots and time.monotonic() < deadline:
            time.sleep(0.05)
        assert staging.free_slots == staging.num_slots
        assert sgl.sglang_get(backend, pools, keys, [4, 5, 6]) == 3


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_closing_during_a_stalled_call_cancels_it_and_later_calls_miss(make_backend, layout, request):
    """SGLang shuts down while a prefetch waits on a stalled Redis (timeout far off): ``close``
    returns promptly, the prefetch answers a miss that wrote nothing into its pages, and calls made
    after the close answer misses instead of raising into SGLang's threads."""
    import threading

    from ...backends.redis_server import REDIS_SERVER, RedisServer

    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        backend, pools = make_backend("dsa", layout, server.url, timeout_s=60)
        keys = round_trip(backend, pools, "dsa", salt_of(request))
        sgl.wipe(pools)
        hits = []
        server.pause()
        try:
            def get():
                try:
                    hits.append(sgl.sglang_get(backend, pools, keys, [4, 5, 6]))
                except BaseException as error:  # reported by the assertion below
                    hits.append(error)

            prefetch = threading.Thread(target=get)
            prefetch.start()
            time.sleep(0.5)
            assert prefetch.is_alive(), "the get ended before the close; the test proved nothing"
            started = time.monotonic()
            backend.close()
            prefetch.join(timeout=20)
            assert not prefetch.is_alive() and hits == [0]
            assert time.monotonic() - started < 20
        finally:
            server.resume()
        assert_untouched(pools, [4, 5, 6])
        assert sgl.sglang_get(backend, pools, keys, [4, 5, 6]) == 0
        assert sgl.sglang_exists(backend, pools, keys) == 0
        assert not sgl.sglang_set(backend, pools, keys, [1, 2, 3])


def test_an_in_place_call_never_wipes_pages_its_slots_were_bound_to_before(make_backend, tmp_path, request):
    """A staging slot keeps its binding to the pages of its last call. A read that fails before it
    bound its own pages must not zero those earlier ones (SGLang may hold other data there by now)."""
    from tiered_kv.errors import PoolError

    backend, pools = make_backend("dsa", "page_first_direct", f"file://{tmp_path}", staging_slots=2)
    salt = salt_of(request)
    keys = sgl.page_hashes(3, sgl.PAGE["dsa"], salt)
    sgl.fill(pools, seed=salt % 1000)
    assert sgl.sglang_set(backend, pools, keys, [1, 2, 3])  # the slots stay bound to pages among 1-3
    want = [sgl.page_bytes(pools, p) for p in (1, 2, 3)]
    pages = backend._pages

    def failing_bind(slot, host_pages):
        raise PoolError("a bind that fails before this read's pages are bound")

    pages.bind = failing_bind
    assert sgl.sglang_get(backend, pools, keys, [4, 5, 6]) == 0
    assert_pages(pools, [1, 2, 3], want)
    del pages.bind
    assert sgl.sglang_get(backend, pools, keys, [4, 5, 6]) == 3
    assert_pages(pools, [4, 5, 6], want)


def test_sglangs_prefetch_and_backup_threads_share_the_staging_slots(make_backend, request):
    """SGLang's backup and prefetch threads call at once; two staging slots serve both, page by page."""
    import threading

    backend, pools = make_backend("dsa", "page_first", "memory://", staging_slots=2)
    salt = salt_of(request)
    keys = sgl.page_hashes(6, sgl.PAGE["dsa"], salt)
    sgl.fill(pools, seed=11)
    want = [sgl.page_bytes(pools, p) for p in range(1, 7)]
    assert sgl.sglang_set(backend, pools, keys[:3], [1, 2, 3])
    errors, hits = [], []

    def backup():
        try:
            assert sgl.sglang_set(backend, pools, keys[3:], [4, 5, 6])
        except AssertionError as error:  # reported by the test's thread below
            errors.append(error)

    def prefetch():
        hits.append(sgl.sglang_get(backend, pools, keys[:3], [7, 8, 0]))

    threads = [threading.Thread(target=backup), threading.Thread(target=prefetch)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors and hits == [3]
    assert_pages(pools, [7, 8, 0], want[:3])
    assert sgl.sglang_exists(backend, pools, keys) == 6
