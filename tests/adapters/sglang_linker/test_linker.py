"""The tiered-kv Linker against SGLang's real UnifiedCacheLinker contract and its real device pools.

Each test drives the linker as SGLang's ``UnifiedCacheLinkerWrapper`` does: ``offload`` of a
written chain, ``num_completed_offloads`` / ``pop_completed_offload``, the device pages dropped,
``lookup`` of the page hashes, ``load`` into fresh device indices, ``start_layer_wise_loading``,
the forward's ``set_consumer`` / ``wait_until`` per layer, ``finish_layer_wise_loading``; then the
bytes SGLang's own tensors hold are compared with what was offloaded (for DSA, latent and indexer).
"""

from __future__ import annotations

import inspect
import time

import pytest
import torch

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def sgl():
    from sglang.srt.mem_cache import hicache_storage
    from sglang.srt.mem_cache.unified_cache import unified_cache_linker
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    return hicache_storage, unified_cache_linker, get_storage_hash_str


def hashes(tokens: list[int], page_size: int) -> list[str]:
    """SGLang's own per-page storage hashes of ``tokens`` (the keys its tree hands a linker)."""
    return sgl()[2](tokens, None, page_size=page_size)


def token_indices(pages: list[int], page_size: int) -> torch.Tensor:
    return torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in pages]).to(torch.int64)


def kv_transfer(keys: list[str], pages: list[int] | None, page_size: int):
    hicache_storage = sgl()[0]
    indices = None if pages is None else token_indices(pages, page_size)
    return hicache_storage.PoolTransfer(name=hicache_storage.PoolName.KV, keys=list(keys), device_indices=indices)


def page_rows(linker, page: int) -> list[torch.Tensor]:
    """Every byte of ``page`` in SGLang's own tensors (each pool of its group, each layer buffer)."""
    out = []
    for entry in linker.pool_group.entries:
        rows = 1 if entry._row_span == 1 else entry.page_size
        first = page * rows
        for buffer in entry.kv_buffer:
            out.append(buffer[first:first + rows].view(torch.uint8))
    return out


def write_pages(linker, pages: list[int], seed: int) -> list[list[torch.Tensor]]:
    """The prefill: random bytes into ``pages``; returns a copy of each page's bytes."""
    gen = torch.Generator().manual_seed(seed)
    for page in pages:
        for rows in page_rows(linker, page):
            rows.copy_(torch.randint(0, 256, rows.shape, dtype=torch.uint8, generator=gen))
    return [[rows.clone() for rows in page_rows(linker, page)] for page in pages]


def drop_pages(linker, pages: list[int]) -> None:
    for page in pages:
        for rows in page_rows(linker, page):
            rows.zero_()


def assert_pages_hold(linker, pages: list[int], expected: list[list[torch.Tensor]]) -> None:
    for page, want in zip(pages, expected, strict=True):
        got = page_rows(linker, page)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert torch.equal(g, w), f"device page {page} differs from what was offloaded"


def offload_and_wait(linker, keys: list[str], pages: list[int]) -> bool:
    assert linker.offload([kv_transfer(keys, pages, linker.page_size)]) is True
    deadline = time.monotonic() + 10
    while not linker.num_completed_offloads():
        assert time.monotonic() < deadline, "the offload never completed"
        time.sleep(0.001)
    return linker.pop_completed_offload()


def load_layer_wise(linker, rid: str, keys: list[str], pages: list[int]) -> bool:
    """SGLang's flow: load queued, started with the batch, each layer waited for, then finished."""
    assert linker.load(rid, [kv_transfer(keys, pages, linker.page_size)]) is True
    index = linker.start_layer_wise_loading()
    assert index >= 0
    counter = linker.layer_done_counter
    counter.set_consumer(index)  # the worker names the batch its forward reads
    for layer in range(linker.num_layers):
        counter.wait_until(layer)  # what SGLang's KV pool calls before the layer's attention
        assert counter.layers_done(index) >= layer + 1
    return linker.finish_layer_wise_loading(index)


def restorable(linker, rid: str, keys: list[str]) -> list[int]:
    return linker.lookup(rid, [kv_transfer(keys, None, linker.page_size)])


# --- the contract ------------------------------------------------------------------------------------
def test_linker_is_a_real_subclass_loaded_by_sglangs_dynamic_backend(make_linker):
    _, unified_cache_linker, _ = sgl()
    from tiered_kv.adapters.sglang.linker import Linker

    linker, kvcache = make_linker("mha")
    assert type(linker) is Linker
    assert issubclass(Linker, unified_cache_linker.UnifiedCacheLinker)
    assert not inspect.isabstract(Linker)
    abstract = unified_cache_linker.UnifiedCacheLinker.__abstractmethods__
    assert abstract and all(getattr(Linker, name) is not getattr(unified_cache_linker.UnifiedCacheLinker, name)
                            for name in abstract)
    # The counter SGLang registers on its KV pool: consumer_index, set_consumer and wait_until.
    kvcache.register_layer_transfer_counter(linker.layer_done_counter)
    assert linker.layer_done_counter.consumer_index == -1
    assert linker.start_layer_wise_loading() == -1  # nothing queued: no batch
    assert linker.num_completed_offloads() == 0


def test_a_bad_linker_extra_config_is_a_config_error_naming_the_key(make_linker):
    from tiered_kv import ConfigError

    with pytest.raises(ConfigError, match="l2_slotz"):
        make_linker("mha", l2_slotz=8)
    with pytest.raises(ConfigError, match="l2_slots"):
        make_linker("mha", l2_slots=0)
    with pytest.raises(ConfigError, match="write"):
        make_linker("mha", write="sometimes")


@pytest.mark.parametrize("kind", ["mha", "mla", "dsa"])
def test_offload_drop_lookup_load_layer_wise_gives_the_same_bytes(make_linker, kind):
    linker, _ = make_linker(kind)
    ps = linker.page_size
    if kind == "dsa":  # SGLang's builder groups the latent and the indexer pools
        assert {p.value for p in linker.pools} == {"kv", "indexer"}
        assert [c.name for c in linker.spec.components] == ["kv_0", "indexer_0"]
    keys = hashes(list(range(3 * ps)), ps)
    written = write_pages(linker, [1, 2, 3], seed=1)
    assert offload_and_wait(linker, keys, [1, 2, 3]) is True
    drop_pages(linker, [1, 2, 3])
    assert restorable(linker, "r1", keys) == [1, 2, 3]
    assert restorable(linker, "r0", hashes(list(range(100, 100 + 3 * ps)), ps)) == []  # another prompt
    assert load_layer_wise(linker, "r1", keys, [2, 3, 1]) is True  # fresh indices, another order
    assert_pages_hold(linker, [2, 3, 1], written)
    # The same chain again is on L2 already: a completed, successful offload with nothing copied.
    stored = linker.worker.bytes_stored
    assert offload_and_wait(linker, keys, [2, 3, 1]) is True
    assert linker.worker.bytes_stored == stored


def test_a_cancelled_queued_load_writes_nothing_and_unlocks(make_linker):
    linker, _ = make_linker("mla")
    ps = linker.page_size
    keys = hashes(list(range(2 * ps)), ps)
    write_pages(linker, [1, 2], seed=2)
    assert offload_and_wait(linker, keys, [1, 2])
    assert restorable(linker, "r", keys) == [1, 2]
    assert linker.load("r", [kv_transfer(keys, [5, 6], ps)])
    assert linker.cancel_queued_load("r") is True
    assert linker.cancel_queued_load("r") is False
    assert linker.start_layer_wise_loading() == -1
    assert all(not rows.any() for page in (5, 6) for rows in page_rows(linker, page))


def _l3_round_trip(make_linker, url: str, kind: str = "dsa") -> None:
    writer, _ = make_linker(kind, l3_url=url)
    ps = writer.page_size
    keys = hashes(list(range(7, 7 + 3 * ps)), ps)
    written = write_pages(writer, [1, 2, 3], seed=3)
    assert offload_and_wait(writer, keys, [1, 2, 3])
    assert writer.wait_l3_idle()
    writer.close()  # its L2 is gone: only L3 holds the pages now
    reader, _ = make_linker(kind, l3_url=url)
    assert restorable(reader, "r", keys) == [1, 2, 3]  # L3 -> L2 during the lookup
    assert load_layer_wise(reader, "r", keys, [3, 1, 2])
    assert_pages_hold(reader, [3, 1, 2], written)


def test_l3_round_trip_through_files_after_l2_is_cleared(make_linker, tmp_path):
    _l3_round_trip(make_linker, f"file://{tmp_path}")


def test_l3_round_trip_through_redis_after_l2_is_cleared(make_linker, redis_server):
    _l3_round_trip(make_linker, redis_server.url, kind="mha")


def test_a_corrupted_l3_record_is_a_miss(make_linker, tmp_path):
    from tiered_kv.backends.file import SUFFIX, page_name

    writer, _ = make_linker("dsa", l3_url=f"file://{tmp_path}")
    ps = writer.page_size
    keys = hashes(list(range(11, 11 + 3 * ps)), ps)
    written = write_pages(writer, [1, 2, 3], seed=4)
    assert offload_and_wait(writer, keys, [1, 2, 3])
    assert writer.wait_l3_idle()
    writer.close()
    second = writer.page_keys([kv_transfer(keys, None, ps)])[1]
    record = tmp_path / page_name(second)[:2] / (page_name(second) + SUFFIX)
    data = bytearray(record.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the page's payload
    record.write_bytes(bytes(data))
    reader, _ = make_linker("dsa", l3_url=f"file://{tmp_path}")
    assert restorable(reader, "r", keys) == [1]  # the run stops before the corrupted page
    assert load_layer_wise(reader, "r", keys[:1], [4])
    assert_pages_hold(reader, [4], written[:1])


def test_a_failing_l3_degrades_and_l2_keeps_serving(make_linker):
    from tests.backends.redis_server import REDIS_SERVER, RedisServer

    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        linker, _ = make_linker("mha", l3_url=server.url)
        server.kill()  # L3 goes away under a running linker
        ps = linker.page_size
        keys = hashes(list(range(21, 21 + 2 * ps)), ps)
        written = write_pages(linker, [1, 2], seed=5)
        assert offload_and_wait(linker, keys, [1, 2]) is True  # L2 took it; the put to L3 fails
        deadline = time.monotonic() + 30
        while not linker.manager.l3.degraded:
            assert time.monotonic() < deadline, "the failing L3 never turned degraded"
            linker.manager.poll()
            time.sleep(0.01)
        drop_pages(linker, [1, 2])
        longer = hashes(list(range(21, 21 + 4 * ps)), ps)
        assert restorable(linker, "r", longer) == [1, 2]  # L2's pages; the degraded L3 is not asked
        assert load_layer_wise(linker, "r", keys, [3, 4])
        assert_pages_hold(linker, [3, 4], written)


def test_a_load_that_cannot_be_issued_is_reported_by_finish_and_frees_its_slots(make_linker):
    linker, _ = make_linker("dsa")
    ps = linker.page_size
    keys = hashes(list(range(31, 31 + ps)), ps)
    write_pages(linker, [1], seed=6)
    assert offload_and_wait(linker, keys, [1])
    assert restorable(linker, "r", keys) == [1]
    assert linker.load("r", [kv_transfer(keys, [0], ps)])  # page 0: SGLang's padding page, never written
    index = linker.start_layer_wise_loading()
    assert linker.finish_layer_wise_loading(index) is False  # SGLang aborts the batch's requests
    assert restorable(linker, "r2", keys) == [1]  # the page stays on L2, unlocked


def test_dsa_pools_come_from_sglangs_own_pool_group_builder(make_linker):
    from sglang.srt.mem_cache.hybrid_cache import linker_pool_assembler

    linker, kvcache = make_linker("dsa")
    assert isinstance(linker.pool_group, linker_pool_assembler.DevicePoolGroup)
    by_name = {entry.name.value: entry for entry in linker.pool_group.entries}
    assert by_name["kv"].kv_buffer[0] is kvcache.kv_buffer[0]  # the engine's tensors, not copies
    assert by_name["indexer"].kv_buffer[1] is kvcache.index_k_with_scale_buffer[1]
    assert linker.spec.page_bytes == sum(
        buffer[:ps].nbytes if entry._row_span != 1 else buffer[:1].nbytes
        for entry in linker.pool_group.entries for buffer in entry.kv_buffer
        for ps in [entry.page_size])


@pytest.mark.parametrize("kind, shared", [("mha", False), ("dsa", True)])
def test_tp_ranks_share_keys_only_for_replicated_pools(make_linker, kind, shared):
    from tiered_kv.adapters.sglang.linker import linker_namespace

    linker, _ = make_linker(kind)
    replicated = bool(linker.pool_group.rank_replicated)
    assert replicated is shared  # SGLang's group says whether every rank holds the same bytes
    rank0, rank1 = (linker_namespace(linker.spec, "m", "", replicated=replicated, tp=(2, r)) for r in (0, 1))
    assert (rank0.root == rank1.root) is shared
    stage2 = linker_namespace(linker.spec, "m", "", replicated=replicated, tp=(2, 0), first_layer=2)
    assert stage2.root != rank0.root  # another pipeline stage's layers never share a key


def test_reset_finishes_the_offloads_in_flight_and_keeps_their_pages(make_linker):
    linker, _ = make_linker("mla")
    ps = linker.page_size
    keys = hashes(list(range(41, 41 + 2 * ps)), ps)
    write_pages(linker, [1, 2], seed=7)
    assert linker.offload([kv_transfer(keys, [1, 2], ps)])
    linker.reset()  # SGLang's flush: the offload's bytes are copied, its result is dropped
    assert linker.num_completed_offloads() == 0
    assert restorable(linker, "r", keys) == [1, 2]


def test_dsa_with_draft_layers_packed_onto_its_layers_is_a_config_error(make_linker):
    from tiered_kv import ConfigError

    with pytest.raises(ConfigError, match="every one of the 2 layers"):
        make_linker("dsa", mtp_draft=True)  # one MTP layer: SGLang packs it onto layer 0 only
