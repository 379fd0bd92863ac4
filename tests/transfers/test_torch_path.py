"""L1 <-> L2 through the torch path, and through records: bit-exact, poisoned destinations,
untouched pages untouched, and validation that rejects bad indices before anything moves."""

from __future__ import annotations

import random

import pytest
import torch

from tiered_kv import HostPool, allocate_engine_like, mha_spec, mla_spec, nsa_spec, pages_from_token_indices
from tiered_kv.errors import IndexValidationError, SpecMismatchError
from tiered_kv.transfers.torch_path import torch_backup, torch_load, torch_load_layer

SPECS = {
    "nsa-fp8": nsa_spec(num_layers=3, page_size=64),
    "nsa-bf16": nsa_spec(num_layers=2, page_size=64, latent_dtype="bf16"),
    "mla": mla_spec(num_layers=2, page_size=16),
    "mha": mha_spec(num_layers=2, page_size=16, num_kv_heads=2, head_dim=32, dtype="bf16"),
}
POISON = 0xA5


def randomize_device(pool) -> None:
    for ci in range(len(pool.spec.components)):
        for layer in range(pool.spec.num_layers):
            view = pool.chunk_view(ci, layer)
            view.copy_(torch.randint(0, 256, view.shape, dtype=torch.uint8))


def poison(pool) -> None:
    for ci in range(len(pool.spec.components)):
        for layer in range(pool.spec.num_layers):
            pool.chunk_view(ci, layer).fill_(POISON)


def snapshot(pool) -> list[torch.Tensor]:
    return [pool.chunk_view(ci, layer).clone() for ci in range(len(pool.spec.components))
            for layer in range(pool.spec.num_layers)]


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_l1_l2_record_l2_l1_round_trip(name, layout):
    spec = SPECS[name]
    rng = random.Random()
    src_device = allocate_engine_like(spec, 12)
    dst_device = allocate_engine_like(spec, 12)
    randomize_device(src_device)
    poison(dst_device)
    with HostPool(spec, 10, layout) as host_a, HostPool(spec, 10, "page_first" if layout == "layer_first" else "layer_first") as host_b:
        poison(host_a)
        poison(host_b)
        n = rng.randint(1, 7)
        pages = rng.sample(range(1, 12), n)
        slots_a = host_a.allocate(n)
        torch_backup(src_device, host_a, pages, slots_a)
        # Every byte of the used slots was written, the others untouched.
        for ci in range(len(spec.components)):
            for layer in range(spec.num_layers):
                assert torch.equal(host_a.chunk_view(ci, layer)[slots_a], src_device.chunk_view(ci, layer)[pages])
                others = [s for s in range(10) if s not in slots_a]
                assert bool((host_a.chunk_view(ci, layer)[others] == POISON).all())
        keys = [f"page-{p}" for p in pages]
        records = [host_a.encode_record(s, k) for s, k in zip(slots_a, keys)]
        slots_b = rng.sample(range(10), n)
        for s, k, r in zip(slots_b, keys, records):
            host_b.decode_record(s, r, k)
        dst_pages = rng.sample(range(1, 12), n)
        before = snapshot(dst_device)
        torch_load(host_b, dst_device, slots_b, dst_pages)
        after = snapshot(dst_device)
        untouched = [p for p in range(12) if p not in dst_pages]
        for i, (ci, layer) in enumerate((ci, layer_) for ci in range(len(spec.components)) for layer_ in range(spec.num_layers)):
            assert torch.equal(after[i][dst_pages], src_device.chunk_view(ci, layer)[pages])
            assert torch.equal(after[i][untouched], before[i][untouched])


def test_load_one_layer_moves_every_component_of_that_layer_only():
    spec = SPECS["nsa-fp8"]
    src, dst = allocate_engine_like(spec, 6), allocate_engine_like(spec, 6)
    randomize_device(src)
    poison(dst)
    with HostPool(spec, 4) as host:
        torch_backup(src, host, [1, 2, 3], [3, 0, 1])
        torch_load_layer(host, dst, [3, 0, 1], [5, 4, 2], layer=1)
        for ci in range(2):
            assert torch.equal(dst.chunk_view(ci, 1)[[5, 4, 2]], src.chunk_view(ci, 1)[[1, 2, 3]])
            for layer in (0, 2):
                assert bool((dst.chunk_view(ci, layer) == POISON).all())


def test_token_indices_are_accepted_and_checked():
    assert pages_from_token_indices(list(range(128, 192)) + list(range(64, 128)), 64).tolist() == [2, 1]
    assert pages_from_token_indices(torch.arange(0, 0), 64).numel() == 0
    with pytest.raises(IndexValidationError, match="index 0 .*value 10.* not a multiple of the page size 64"):
        pages_from_token_indices(list(range(10, 74)), 64)
    broken = list(range(64, 128))
    broken[17] = 999
    with pytest.raises(IndexValidationError, match="index 17 .*value 999.* should be 81"):
        pages_from_token_indices(broken, 64)
    with pytest.raises(IndexValidationError, match="not a whole number of pages"):
        pages_from_token_indices(list(range(64, 100)), 64)

    spec = SPECS["nsa-fp8"]
    src, dst = allocate_engine_like(spec, 6), allocate_engine_like(spec, 6)
    randomize_device(src)
    with HostPool(spec, 4) as host:
        torch_backup(src, host, list(range(192, 256)), [2], token_indices=True)
        torch_load(host, dst, [2], torch.arange(320, 384), token_indices=True)
        assert torch.equal(dst.chunk_view(0, 2)[5], src.chunk_view(0, 2)[3])


@pytest.mark.parametrize(
    "pages, slots, to_host, message",
    [
        ([1, 2], [0], True, "2 device pages but 1 host slots"),
        ([1, 6], [0, 1], True, "device pages: index 1 is 6, outside 0..5"),
        ([1, 2], [0, 4], True, "host slots: index 1 is 4, outside 0..3"),
        ([1, -1], [0, 1], True, "index 1 is -1"),
        ([0, 1], [0, 1], True, "index 0 is page 0, which the engine reserves"),
        ([1, 2, 3], [0, 1, 0], True, "host slots: index 2 repeats destination 0"),
        ([1, 2, 1], [0, 1, 2], False, "device pages: index 2 repeats destination 1"),
    ],
)
def test_validation_rejects_before_writing(pages, slots, to_host, message):
    spec = SPECS["mla"]
    device = allocate_engine_like(spec, 6)
    randomize_device(device)
    with HostPool(spec, 4) as host:
        poison(host)
        host_before, device_before = snapshot(host), snapshot(device)
        with pytest.raises(IndexValidationError, match=message):
            if to_host:
                torch_backup(device, host, pages, slots)
            else:
                torch_load(host, device, slots, pages)
        assert all(torch.equal(a, b) for a, b in zip(snapshot(host), host_before))
        assert all(torch.equal(a, b) for a, b in zip(snapshot(device), device_before))


def test_other_spec_and_bad_index_types():
    device = allocate_engine_like(SPECS["mla"], 4)
    with HostPool(SPECS["mha"], 4) as host:
        with pytest.raises(SpecMismatchError, match="differs"):
            torch_backup(device, host, [1], [0])
    with HostPool(SPECS["mla"], 4) as host:
        with pytest.raises(IndexValidationError, match="integer"):
            torch_backup(device, host, torch.tensor([1.0]), [0])
        with pytest.raises(IndexValidationError, match="1-D"):
            torch_backup(device, host, torch.tensor([[1]]), [0])
        with pytest.raises(IndexValidationError, match="layer 5"):
            torch_load_layer(host, device, [0], [1], layer=5)
        torch_backup(device, host, [], [])  # an empty copy is fine


@pytest.mark.parametrize("limit", [40, 100_000])  # the bitmap check and the sort check
def test_fast_id_check_agrees_with_the_torch_check(limit):
    """The numpy check that passes valid ids agrees, id set by id set, with the torch checks that
    name the offending index (out of range, repeats, reserved pages)."""
    from tiered_kv.errors import IndexValidationError
    from tiered_kv.transfers.torch_path import _check_ids, _ids_ok

    generator = torch.Generator().manual_seed(7)
    # Reserved pages inside the id space, and some outside it (below 0, at or above the limit).
    reserved_sets = (frozenset(), frozenset({0, 3}), frozenset({-1, 2, limit, limit + 5}))
    seen = {True: 0, False: 0}
    for k in range(300):
        n = int(torch.randint(1, 30, (1,), generator=generator))
        ids = torch.randint(-2, min(limit, 45) + 2, (2 * n,), generator=generator)
        # Contiguous and strided (every other element) int64 tensors: what ``_as_cpu_ids`` hands on.
        ids = ids[:n] if k % 2 else ids[::2]
        for unique in (True, False):
            for res in reserved_sets:
                ok = _ids_ok(ids, limit, unique=unique, reserved=res)
                seen[ok] += 1
                expect = ((ids >= 0) & (ids < limit)).all() and (not unique or ids.unique().numel() == n) \
                    and not any(int(i) in res for i in ids)
                assert ok == bool(expect), (ids.tolist(), unique, res)
                if not ok:
                    with pytest.raises(IndexValidationError):
                        _check_ids(ids, limit, "ids", unique=unique, reserved=res)
    assert seen[True] > 20 and seen[False] > 20


@pytest.mark.parametrize("page_size", [0, -1, True, 2.0, "64", None])
def test_token_indices_with_a_bad_page_size_are_refused_naming_it(page_size):
    # Unchecked, 0 would leak ZeroDivisionError, -1 a RuntimeError, 2.0 a TypeError, and True
    # would be taken as a page size of 1.
    with pytest.raises(IndexValidationError, match="page size"):
        pages_from_token_indices([0, 1], page_size)


def test_negative_token_indices_are_refused_naming_the_index():
    # [-2, -1] passed as page -1 (its first index -2 is a multiple of 2).
    with pytest.raises(IndexValidationError, match="index 0 .*value -2"):
        pages_from_token_indices([-2, -1], 2)
    with pytest.raises(IndexValidationError, match="index 2 .*value -4"):
        pages_from_token_indices(torch.tensor([4, 5, -4, -3]), 2)


def test_pools_in_the_wrong_order_or_missing_are_the_librarys_error():
    from tiered_kv.model import record as record
    from tiered_kv.errors import PoolError, RecordError

    spec = nsa_spec(2, 4)
    device = allocate_engine_like(spec, 4)
    with HostPool(spec, 4) as host:
        before = host.buffer.clone()
        with pytest.raises(PoolError, match="device_pool must be a DevicePool, got HostPool.*swapped"):
            torch_backup(host, device, [1], [0])
        with pytest.raises(PoolError, match="host_pool must be a HostPool, got NoneType"):
            torch_load(None, device, [0], [1])
        with pytest.raises(PoolError, match="device_pool must be a DevicePool"):
            torch_load_layer(device, host, [0], [1], 0)
        assert torch.equal(host.buffer, before)  # nothing moved
    with pytest.raises(RecordError, match="header block needs 4096 bytes, got 10"):
        record.write_header(memoryview(bytearray(10)), fingerprint=spec.fingerprint, key="k", payload=b"x")
