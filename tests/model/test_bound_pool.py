"""BoundPool: a slot's record held as its header block plus ranges of memory the pool does not own.

The same page sealed through a bound slot and through a plain slot is the same record, byte for
byte, plain or keyed; verification over parts refuses what it refuses over one buffer; a part
outside the pool's regions, of the wrong size or not contiguous is a PoolError naming it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tiered_kv import HostPool, nsa_spec
from tiered_kv.errors import CorruptRecordError, ForeignSlotError, PoolError, TruncatedRecordError
from tiered_kv.model import record
from tiered_kv.model.bound_pool import BoundPool
from tiered_kv.model.record_key import RecordKey

SPEC = nsa_spec(num_layers=2)


@pytest.fixture
def engine():
    """Two buffers of an engine's host pool: a page's latent part in one, the rest in the other."""
    rng = np.random.default_rng(7)
    first = 5 * 4096 + 3
    latent = rng.integers(0, 256, (4, first), dtype=np.uint8)
    rest = rng.integers(0, 256, (4, SPEC.page_bytes - first), dtype=np.uint8)
    return latent, rest


@pytest.mark.parametrize("keyed", [False, True])
def test_a_bound_record_is_the_plain_record_byte_for_byte(engine, keyed):
    latent, rest = engine
    key = RecordKey(b"s" * 32) if keyed else None
    with BoundPool(SPEC, 2, [latent, rest], record_key=key) as bound, HostPool(SPEC, 2, record_key=key) as plain:
        [slot] = bound.allocate(1)
        bound.bind(slot, [latent[2], rest[2]])
        assert bound.is_bound(slot) and not bound.is_contiguous(slot)
        bound.seal(slot, "page-a")
        [other] = plain.allocate(1)
        plain.record_view(other)[record.HEADER_BYTES:] = np.concatenate([latent[2], rest[2]]).tobytes()
        plain.seal(other, "page-a")
        assert bytes(bound.record_contents(slot)) == bytes(plain.record_view(other))
        assert [len(p) for p in bound.record_parts(slot)] == [record.HEADER_BYTES, latent.shape[1], rest.shape[1]]
        assert bound.is_sealed(slot, "page-a") and not bound.is_sealed(slot, "page-b")
        bound.verify_slot(slot, "page-a")
        bound.free([slot])
        plain.free([other])


def test_verification_over_parts_refuses_a_flipped_byte_in_any_part(engine):
    latent, rest = engine
    with BoundPool(SPEC, 1, [latent, rest]) as pool:
        [slot] = pool.allocate(1)
        pool.bind(slot, [latent[0], rest[0]])
        pool.seal(slot, "page")
        for array in (latent, rest):
            array[0, 100] ^= 0x01
            with pytest.raises(CorruptRecordError, match="checksum"):
                pool.verify_slot(slot, "page")
            array[0, 100] ^= 0x01
        pool.verify_slot(slot, "page")
        pool.free([slot])


def test_a_short_payload_is_truncated():
    header = bytearray(record.HEADER_BYTES)
    payload = [memoryview(bytearray(10)), memoryview(bytearray(20))]
    record.write_header(memoryview(header), fingerprint=SPEC.fingerprint, key="k", payload=payload)
    with pytest.raises(TruncatedRecordError):
        record.verify_parts(header, payload[:1], fingerprint=SPEC.fingerprint, key="k", payload_len=30)
    record.verify_parts(header, payload, fingerprint=SPEC.fingerprint, key="k", payload_len=30)


def test_parts_checksum_equals_the_checksum_of_their_concatenation():
    data = np.random.default_rng(1).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    assert record.payload_checksum([data[:7], data[7:50_000], data[50_000:]]) == record.payload_checksum(data)


def test_an_unbound_slot_is_a_plain_slot_and_a_bound_one_has_no_single_view(engine):
    latent, rest = engine
    with BoundPool(SPEC, 2, [latent, rest]) as pool:
        slots = pool.allocate(2)
        pool.bind(slots[0], [latent[1], rest[1]])
        assert pool.is_contiguous(slots[1]) and len(pool.record_parts(slots[1])) == 1
        for view in (pool.record_view, pool.slot_view, pool.slot_address):
            with pytest.raises(PoolError, match="bound"):
                view(slots[0])
        assert pool.part_addresses(slots[0])[1] == (latent[1].__array_interface__["data"][0], latent.shape[1])
        pool.unbind(slots[0])
        assert pool.is_contiguous(slots[0]) and len(pool.record_view(slots[0])) == pool.record_bytes
        pool.free(slots)


def test_memory_regions_are_the_pools_own_and_the_engines(engine):
    latent, rest = engine
    with BoundPool(SPEC, 1, [latent, torch.from_numpy(rest)]) as pool:
        regions = pool.memory_regions()
        assert regions[0] == (pool.memory.address, pool.memory.size)
        assert regions[1:] == [(latent.__array_interface__["data"][0], latent.nbytes),
                               (rest.__array_interface__["data"][0], rest.nbytes)]


@pytest.mark.parametrize(("parts", "message"), [
    (lambda latent, rest, elsewhere: [latent[0], elsewhere], "outside the pool's regions"),
    (lambda latent, rest, elsewhere: [latent[0], rest[0][:-1]], "a page of this spec is"),
    (lambda latent, rest, elsewhere: [latent[:, :10], rest[0]], "contiguous"),
    (lambda latent, rest, elsewhere: [latent[0], "no buffer"], "CPU tensor or numpy array"),
])
def test_a_bad_part_is_a_pool_error_naming_it(engine, parts, message):
    latent, rest = engine
    elsewhere = np.zeros(rest.shape[1], dtype=np.uint8)
    with BoundPool(SPEC, 1, [latent, rest]) as pool:
        [slot] = pool.allocate(1)
        with pytest.raises(PoolError, match=message):
            pool.bind(slot, parts(latent, rest, elsewhere))
        assert not pool.is_bound(slot)
        pool.free([slot])


def test_a_strided_region_is_refused():
    strided = np.zeros((4, 8), dtype=np.uint8)[:, ::2]
    with pytest.raises(PoolError, match="contiguous"):
        BoundPool(SPEC, 1, [strided])


def test_seal_of_a_free_bound_slot_is_refused(engine):
    latent, rest = engine
    with BoundPool(SPEC, 1, [latent, rest]) as pool:
        pool.bind(0, [latent[0], rest[0]])
        with pytest.raises(ForeignSlotError):
            pool.seal(0, "page")


def test_wipe_zeroes_the_header_the_slots_own_memory_and_every_bound_part(engine):
    latent, rest = engine
    untouched = latent[1].copy(), rest[1].copy()
    with BoundPool(SPEC, 1, [latent, rest]) as pool:
        [slot] = pool.allocate(1)
        pool.own_slot_view(slot)[:] = b"\xab" * pool.slot_bytes  # e.g. a record bounced through it
        pool.bind(slot, [latent[0], rest[0]])
        pool.seal(slot, "page")
        pool.wipe(slot)
        assert not any(pool.record_parts(slot)[0])  # the header
        assert not any(pool.own_slot_view(slot))
        assert not latent[0].any() and not rest[0].any()
        assert (latent[1] == untouched[0]).all() and (rest[1] == untouched[1]).all()
        pool.unbind(slot)
        pool.own_slot_view(slot)[:] = b"\xcd" * pool.slot_bytes
        pool.wipe(slot)  # unbound: its own memory only
        assert not any(pool.own_slot_view(slot))
        assert (latent[1] == untouched[0]).all()
        pool.free([slot])


def test_engine_tensors_of_any_dtype_bind_as_bytes():
    """An engine's pools hold bf16 (or fp8): bound as their bytes, sealed over them in place."""
    half = SPEC.page_bytes // 2
    region = torch.randn(2, SPEC.page_bytes // 2, dtype=torch.bfloat16)  # two pages of bytes
    with BoundPool(SPEC, 1, [region]) as pool:
        [slot] = pool.allocate(1)
        pool.bind(slot, [region[1]])
        assert pool.part_addresses(slot)[1] == (region[1].data_ptr(), SPEC.page_bytes)
        pool.seal(slot, "page")
        pool.verify_slot(slot, "page")
        region[1, half // 4] += 1  # a changed value in the engine's tensor is a changed record
        with pytest.raises(CorruptRecordError):
            pool.verify_slot(slot, "page")
        with pytest.raises(PoolError, match="contiguous"):
            pool.bind(slot, [region[:, :half // 2].T])
        pool.free([slot])
