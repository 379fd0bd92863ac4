"""Page records: round trips in both host layouts, and every kind of damage detected."""

from __future__ import annotations

import secrets

import pytest
import torch

from tiered_kv import HostPool, mha_spec, mla_spec, nsa_spec
from tiered_kv import record
from tiered_kv.errors import CorruptRecordError, ForeignRecordError, RecordError, TruncatedRecordError
from tiered_kv.spec import Component, KVSpec

PRESETS = {
    "nsa-fp8-v32": nsa_spec(num_layers=61, page_size=64, latent_dtype="fp8"),
    "nsa-bf16": nsa_spec(num_layers=4, page_size=64, latent_dtype="bf16"),
    "mla-bf16": mla_spec(num_layers=3, page_size=32),
    "mha-bf16": mha_spec(num_layers=3, page_size=16, num_kv_heads=4, head_dim=64, dtype="bf16"),
}
TINY = KVSpec(kind="tiny", page_size=2, layer_start=0, layer_end=2,
              components=(Component("a", 8), Component("b", 4)))


def randomize(pool: HostPool, slot: int) -> None:
    for ci in range(len(pool.spec.components)):
        for layer in range(pool.spec.num_layers):
            row = pool.chunk_view(ci, layer)[slot]
            row.copy_(torch.randint(0, 256, row.shape, dtype=torch.uint8))


def slot_payload(pool: HostPool, slot: int) -> list[bytes]:
    return [bytes(pool.chunk_view(ci, layer)[slot].numpy())
            for ci in range(len(pool.spec.components)) for layer in range(pool.spec.num_layers)]


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("src_layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("dst_layout", ["page_first", "layer_first"])
def test_round_trip_between_layouts(name, src_layout, dst_layout):
    spec = PRESETS[name]
    with HostPool(spec, 3, src_layout) as src, HostPool(spec, 3, dst_layout) as dst:
        randomize(src, 1)
        key = secrets.token_hex(16)
        data = src.encode_record(1, key)
        assert len(data) == record.HEADER_BYTES + spec.page_bytes
        randomize(dst, 2)
        before_other = slot_payload(dst, 0)
        dst.decode_record(2, data, key)
        assert slot_payload(dst, 2) == slot_payload(src, 1)
        assert slot_payload(dst, 0) == before_other


def test_page_first_slot_is_the_record():
    spec = PRESETS["nsa-bf16"]
    with HostPool(spec, 2, "page_first") as pool:
        randomize(pool, 1)
        pool.seal(1, "page-key")
        assert bytes(pool.record_view(1)) == bytes(pool.encode_record(1, "page-key"))
        pool.verify_slot(1, "page-key")
        assert pool.slot_bytes % 4096 == 0 and pool.slot_bytes >= pool.record_bytes
        # A payload change after sealing breaks the seal.
        pool.chunk_view(1, 2)[1, 5] ^= 1
        with pytest.raises(CorruptRecordError, match="payload checksum"):
            pool.verify_slot(1, "page-key")


def test_every_single_byte_corruption_is_detected():
    with HostPool(TINY, 1, "layer_first") as pool:
        randomize(pool, 0)
        good = pool.encode_record(0, "k")
        assert len(good) == 4096 + 24
        record.verify(good, fingerprint=TINY.fingerprint, key="k", payload_len=24)
        for offset in range(len(good)):
            bad = bytearray(good)
            bad[offset] ^= 1 << (offset % 8)
            with pytest.raises(RecordError):
                record.verify(bad, fingerprint=TINY.fingerprint, key="k", payload_len=24)


def test_truncated_records():
    with HostPool(TINY, 1, "layer_first") as pool:
        good = pool.encode_record(0, "k")
        for length in (0, 10, 4095, 4096, len(good) - 1):
            with pytest.raises(TruncatedRecordError):
                record.verify(good[:length], fingerprint=TINY.fingerprint, key="k", payload_len=24)


def test_foreign_fingerprint_and_key():
    other = KVSpec(kind="tiny", page_size=2, layer_start=0, layer_end=2,
                   components=(Component("a", 4), Component("b", 8)))  # same size, other layout
    with HostPool(TINY, 1, "page_first") as pool, HostPool(other, 1, "page_first") as foreign:
        data = pool.encode_record(0, "k")
        with pytest.raises(ForeignRecordError, match="spec"):
            foreign.decode_record(0, data, "k")
        with pytest.raises(ForeignRecordError, match="expected 'other-key'"):
            pool.decode_record(0, data, "other-key")


def test_failed_decode_leaves_the_slot_untouched():
    for layout in ("page_first", "layer_first"):
        with HostPool(TINY, 2, layout) as pool:
            randomize(pool, 0)
            randomize(pool, 1)
            data = pool.encode_record(0, "k")
            data[-1] ^= 0xFF
            before = slot_payload(pool, 1)
            with pytest.raises(CorruptRecordError):
                pool.decode_record(1, data, "k")
            assert slot_payload(pool, 1) == before


def test_keys_are_validated():
    with HostPool(TINY, 1) as pool:
        with pytest.raises(TypeError):
            pool.encode_record(0, b"bytes")
        with pytest.raises(ValueError, match="ASCII"):
            pool.encode_record(0, "ключ")
        with pytest.raises(ValueError):
            pool.encode_record(0, "x" * 513)
