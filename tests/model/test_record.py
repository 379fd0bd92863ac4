"""Page records: round trips in both host layouts, and every kind of damage detected."""

from __future__ import annotations

import secrets

import pytest
import torch

from tiered_kv import HostPool, mha_spec, mla_spec, nsa_spec
from tiered_kv.model import record
from tiered_kv.errors import (CorruptRecordError, ForeignRecordError, MisplacedRecordError, NotARecordError, PageKeyError, RecordError,
                              SpecError, TruncatedRecordError)
from tiered_kv.model.spec import Component, KVSpec

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
        assert pool.allocate(2) == [0, 1]  # only allocated slots are sealed
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


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_what_is_no_buffer_is_a_record_error_and_the_slot_stays(layout):
    """decode_record("str") was a bare TypeError from memoryview: now NotARecordError (a
    RecordError, so a caller that counts bad records as misses counts it too), slot untouched."""
    with HostPool(TINY, 2, layout) as pool:
        before = pool.encode_record(1, "k")
        for bad in ("a str", None, 5, [1, 2, 3]):
            with pytest.raises(NotARecordError, match=type(bad).__name__):
                pool.decode_record(1, bad, "k")
            with pytest.raises(RecordError):
                record.verify(bad, fingerprint=TINY.fingerprint, key="k", payload_len=24)
        assert pool.encode_record(1, "k") == before


def test_another_fingerprint_is_foreign_another_key_of_any_spec_is_misplaced():
    other = KVSpec(kind="tiny", page_size=2, layer_start=0, layer_end=2,
                   components=(Component("a", 4), Component("b", 8)))  # same size, other layout
    with HostPool(TINY, 1, "page_first") as pool, HostPool(other, 1, "page_first") as foreign:
        data = pool.encode_record(0, "k")
        with pytest.raises(ForeignRecordError, match="spec"):
            foreign.decode_record(0, data, "k")
        # Under another page's name no reader of any spec looks for it.
        with pytest.raises(MisplacedRecordError, match="holds page 'k' under the name of 'other-key'"):
            foreign.decode_record(0, data, "other-key")
        with pytest.raises(MisplacedRecordError, match="holds page 'k' under the name of 'other-key'") as caught:
            pool.decode_record(0, data, "other-key")
        assert isinstance(caught.value, CorruptRecordError) and not isinstance(caught.value, ForeignRecordError)


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


@pytest.mark.parametrize("bad", [b"bytes", "", "nul\0", "line\nbreak", "\x1b[31m", "ключ", "x" * 513, 7])
def test_keys_are_validated_by_the_one_validator(bad):
    """seal (write_header) and encode_record refuse every key a backend refuses, with PageKeyError."""
    with HostPool(TINY, 1) as pool:
        assert pool.allocate(1) == [0]
        with pytest.raises(PageKeyError):
            pool.encode_record(0, bad)
        with pytest.raises(PageKeyError):
            pool.seal(0, bad)
        assert not pool.is_sealed(0, "k")


def test_longest_key_is_sealed_and_verified():
    with HostPool(TINY, 1) as pool:
        assert pool.allocate(1) == [0]
        key = "k" * 512
        pool.seal(0, key)
        pool.verify_slot(0, key)


def _tiny_record(key: str = "k", spec: KVSpec = TINY) -> bytes:
    with HostPool(spec, 1, "layer_first") as pool:
        randomize(pool, 0)
        return bytes(pool.encode_record(0, key))


@pytest.mark.parametrize("length_delta", [-10, +4096])
def test_other_length_of_this_very_page_is_damage(length_delta):
    good = _tiny_record()
    value = good[:length_delta] if length_delta < 0 else good + bytes(length_delta)
    exc = record.other_length_error(value, length=len(value), expected=len(good), fingerprint=TINY.fingerprint,
                                    key="k", payload_len=24)
    assert isinstance(exc, TruncatedRecordError if length_delta < 0 else CorruptRecordError)


def test_other_length_of_another_spec_is_foreign_and_says_larger_than_the_slot():
    bigger = KVSpec(kind="tiny", page_size=2, layer_start=0, layer_end=4, components=(Component("a", 8), Component("b", 4)))
    theirs = _tiny_record(spec=bigger)
    mine = 4096 + 24
    exc = record.other_length_error(theirs[:mine], length=len(theirs), expected=mine, fingerprint=TINY.fingerprint,
                                    key="k", payload_len=24)
    assert isinstance(exc, ForeignRecordError)
    assert "larger than the slot" in str(exc) and "bad magic" not in str(exc)
    smaller = record.other_length_error(_tiny_record(key="k"), length=mine, expected=mine + 4096,
                                        fingerprint=bigger.fingerprint, key="k", payload_len=48)
    assert isinstance(smaller, ForeignRecordError) and "shorter" in str(smaller)


@pytest.mark.parametrize("length_delta", [-10, +4096])
def test_other_length_of_another_page_of_this_spec_is_misplaced(length_delta):
    good = _tiny_record(key="another-page")
    value = good[:length_delta] if length_delta < 0 else good + bytes(length_delta)
    exc = record.other_length_error(value, length=len(value), expected=len(good), fingerprint=TINY.fingerprint,
                                    key="k", payload_len=24)
    assert isinstance(exc, MisplacedRecordError) and "'another-page'" in str(exc)


@pytest.mark.parametrize("value", [b"", b"short", bytes(5000), b"\xff" * 9000])
def test_other_length_that_is_no_record_is_damage(value):
    exc = record.other_length_error(value, length=len(value), expected=4096 + 24, fingerprint=TINY.fingerprint,
                                    key="k", payload_len=24)
    assert isinstance(exc, (TruncatedRecordError, CorruptRecordError)) and not isinstance(exc, ForeignRecordError)


@pytest.mark.parametrize("fingerprint", ["ab", "zz" * 16, "ab" * 17, 5, None])
def test_a_fingerprint_that_is_no_spec_fingerprint_is_refused_when_encoding(fingerprint):
    # "ab" was silently padded to ab000..., "zz"*16 leaked ValueError from bytes.fromhex, 5 a TypeError
    with pytest.raises(SpecError, match="fingerprint"):
        record.encode(b"payload", fingerprint=fingerprint, key="k")


@pytest.mark.parametrize("payload", ["text", None, 5])
def test_a_payload_that_is_no_buffer_is_a_record_error_when_encoding(payload):
    with pytest.raises(NotARecordError):
        record.encode(payload, fingerprint=nsa_spec(num_layers=1).fingerprint, key="k")


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_decode_record_refuses_a_slot_being_freed_and_writes_a_free_one(layout):
    """A slot freed while its transfer may still run (a completion not done) is not written: the
    in-flight copy would read or land over the decoded page. Once the completion is done and reaped
    the slot is free, and a free slot (nobody holds it) is written as before."""
    import concurrent.futures

    from tiered_kv.errors import ForeignSlotError

    spec = PRESETS["nsa-bf16"]
    with HostPool(spec, 4, "page_first") as src, HostPool(spec, 4, layout) as pool:
        randomize(src, 1)
        data = src.encode_record(1, "k")
        slots = pool.allocate(2)
        randomize(pool, slots[0])
        before = slot_payload(pool, slots[0])
        in_flight = concurrent.futures.Future()
        pool.free(slots[:1], in_flight)
        assert pool.is_pending(slots[0]) and not pool.is_pending(slots[1])
        with pytest.raises(ForeignSlotError, match=f"slot {slots[0]}, which is being freed"):
            pool.decode_record(slots[0], data, "k")
        assert slot_payload(pool, slots[0]) == before
        pool.decode_record(slots[1], data, "k")  # allocated: written
        assert slot_payload(pool, slots[1]) == slot_payload(src, 1)
        in_flight.set_result(None)
        pool.reap()
        assert not pool.is_pending(slots[0])
        pool.decode_record(slots[0], data, "k")  # free now: written
        assert slot_payload(pool, slots[0]) == slot_payload(src, 1)
        pool.free(slots[1:])
