"""Keyed records: a tenant's secret makes forged records a miss, which the plain checksum cannot.

A forger here is anyone who can write bytes to the store: it knows the record format, the page
key and the spec, computes every unkeyed checksum itself, and may copy any header it has seen.
"""

from __future__ import annotations

import copy
import pickle
import secrets

import numpy as np
import pytest
import xxhash

from tiered_kv import HostPool, nsa_spec
from tiered_kv.errors import ConfigError, CorruptRecordError, ForeignRecordError, ForgedRecordError, PoolError, RecordError
from tiered_kv.model import record
from tiered_kv.model.record_key import MIN_SECRET_BYTES, RecordKey, record_key
from tiered_kv.model.spec import Component, KVSpec

TINY = KVSpec(kind="tiny", page_size=2, layer_start=0, layer_end=2, components=(Component("a", 8), Component("b", 4)))
SPEC = nsa_spec(num_layers=2)
SECRET_A = "tenant-a-" + "7" * 32
SECRET_B = "tenant-b-" + "9" * 32
KEY = "ab" * 16


def payload(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def fix_header_checksum(data: bytearray) -> bytearray:
    """What a forger does after editing a header: the header checksum is unkeyed, so it recomputes it."""
    data[record.HEADER_BYTES - 16:record.HEADER_BYTES] = xxhash.xxh3_128_digest(bytes(data[:record.HEADER_BYTES - 16]))
    return data


def check(data, key: RecordKey | None, page: str = KEY, spec: KVSpec = TINY) -> memoryview:
    return record.verify(data, fingerprint=spec.fingerprint, key=page, payload_len=spec.page_bytes, record_key=key)


def test_keyed_record_round_trips_and_names_its_key_id():
    key = RecordKey(SECRET_A)
    body = payload(TINY.page_bytes)
    data = record.encode(body, fingerprint=TINY.fingerprint, key=KEY, record_key=key)
    header = record.read_header(data)
    assert header.keyed and header.algorithm == record.TAG_HMAC_SHA256_128 and header.key_id == key.key_id
    assert bytes(check(data, key)) == body
    plain = record.read_header(record.encode(body, fingerprint=TINY.fingerprint, key=KEY))
    assert not plain.keyed and plain.key_id == b""


def test_forged_record_with_a_valid_plain_checksum_is_refused_by_a_keyed_reader():
    """The defect: a correct xxh3 checksum over wrong bytes verifies. Only a keyed reader refuses it."""
    wrong = payload(TINY.page_bytes, seed=1)
    forged = record.encode(wrong, fingerprint=TINY.fingerprint, key=KEY)  # anyone can compute this
    assert bytes(check(forged, None)) == wrong  # a plain reader serves it: the checksum detects damage only
    with pytest.raises(ForgedRecordError, match="no keyed tag"):
        check(forged, RecordKey(SECRET_A))
    assert issubclass(ForgedRecordError, CorruptRecordError)  # deleted as a corrupt record is


def test_tampered_payload_with_fixed_up_checksums_is_refused():
    key = RecordKey(SECRET_A)
    data = record.encode(payload(TINY.page_bytes), fingerprint=TINY.fingerprint, key=KEY, record_key=key)
    tampered = bytearray(data)
    tampered[record.HEADER_BYTES + 3] ^= 0x40
    fix_header_checksum(tampered)
    with pytest.raises(ForgedRecordError, match="keyed tag mismatch"):
        check(tampered, key)


def test_a_copied_header_over_other_bytes_is_refused():
    """A forger copies a genuine header (key id and tag included) and puts its own payload under it."""
    key = RecordKey(SECRET_A)
    genuine = record.encode(payload(TINY.page_bytes), fingerprint=TINY.fingerprint, key=KEY, record_key=key)
    forged = bytearray(genuine)
    forged[record.HEADER_BYTES:] = payload(TINY.page_bytes, seed=2)
    with pytest.raises(ForgedRecordError):
        check(forged, key)


def test_a_record_moved_to_another_page_key_is_refused():
    """The tag covers the page key: a genuine record re-labelled as another page does not verify."""
    key = RecordKey(SECRET_A)
    genuine = record.encode(payload(TINY.page_bytes), fingerprint=TINY.fingerprint, key="cd" * 16, record_key=key)
    moved = bytearray(genuine)
    moved[56:56 + 32] = KEY.encode()
    fix_header_checksum(moved)
    with pytest.raises(ForgedRecordError):
        check(moved, key)


def test_another_secrets_record_is_foreign_and_keyed_records_are_foreign_to_a_plain_reader():
    body = payload(TINY.page_bytes)
    of_b = record.encode(body, fingerprint=TINY.fingerprint, key=KEY, record_key=RecordKey(SECRET_B))
    with pytest.raises(ForeignRecordError, match="another secret"):
        check(of_b, RecordKey(SECRET_A))
    with pytest.raises(ForeignRecordError, match="does not hold"):
        check(of_b, None)
    assert bytes(check(of_b, RecordKey(SECRET_B))) == body


def test_every_single_bit_flip_of_a_keyed_record_is_refused():
    key = RecordKey(SECRET_A)
    good = record.encode(payload(TINY.page_bytes), fingerprint=TINY.fingerprint, key=KEY, record_key=key)
    check(good, key)
    for offset in range(len(good)):
        bad = bytearray(good)
        bad[offset] ^= 1 << (offset % 8)
        with pytest.raises(RecordError):
            check(bad, key)
        if record.HEADER_BYTES - 16 <= offset < record.HEADER_BYTES:
            continue  # the header checksum itself: fixing it up restores the genuine record
        # With the (unkeyed) header checksum fixed up, as a forger would, it is still refused.
        expected = ForgedRecordError if offset >= record.HEADER_BYTES or 40 <= offset < 56 else RecordError
        with pytest.raises(expected):
            check(fix_header_checksum(bad), key)


def test_record_key_never_shows_its_secret():
    with pytest.raises(ConfigError) as short:
        RecordKey("s3cr3t-short")
    assert "s3cr3t" not in str(short.value) and str(MIN_SECRET_BYTES) in str(short.value)
    with pytest.raises(ConfigError, match="text or bytes"):
        RecordKey(12345678901234567890)  # type: ignore[arg-type]
    key = RecordKey(SECRET_A)
    assert SECRET_A not in repr(key) and key.key_id.hex() in repr(key)
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(key)
    assert copy.deepcopy(key) is key
    assert RecordKey(SECRET_A) == RecordKey(SECRET_A.encode()) != RecordKey(SECRET_B)
    assert RecordKey(SECRET_A).key_id != RecordKey(SECRET_B).key_id
    assert record_key(None) is None and record_key("") is None and record_key(SECRET_A) == key


def test_keyed_host_pool_seals_and_takes_only_its_own_records():
    key_a = RecordKey(SECRET_A)
    with HostPool(SPEC, 3, record_key=key_a) as keyed, HostPool(SPEC, 2) as plain:
        slots = keyed.allocate(3)
        keyed.record_view(slots[0])[record.HEADER_BYTES:] = payload(SPEC.page_bytes, seed=3)
        keyed.seal(slots[0], KEY)
        assert keyed.is_sealed(slots[0], KEY)
        keyed.verify_slot(slots[0], KEY)
        sealed = bytes(keyed.record_view(slots[0]))
        assert record.read_header(sealed).key_id == key_a.key_id
        # A plain pool neither puts (not sealed as it seals) nor takes it.
        with pytest.raises(ForeignRecordError):
            plain.decode_record(0, sealed, KEY)
        # A plain record forged over other bytes: decode refuses it and leaves the slot untouched.
        forged = record.encode(payload(SPEC.page_bytes, seed=4), fingerprint=SPEC.fingerprint, key=KEY)
        keyed.record_view(slots[1])[:] = sealed
        with pytest.raises(ForgedRecordError):
            keyed.decode_record(slots[1], forged, KEY)
        assert bytes(keyed.record_view(slots[1])) == sealed
        # encode_record keys too, and a slot sealed plain is not "sealed" for the keyed pool.
        assert record.read_header(keyed.encode_record(slots[0], KEY)).keyed
        keyed.record_view(slots[2])[:] = forged
        assert not keyed.is_sealed(slots[2], KEY)
        with pytest.raises(PoolError, match="RecordKey"):
            HostPool(SPEC, 1, record_key=SECRET_A)  # type: ignore[arg-type]


def test_secret_bytes_not_text_and_random_secret_work():
    raw = secrets.token_bytes(32)
    key = RecordKey(raw)
    data = record.encode(payload(TINY.page_bytes), fingerprint=TINY.fingerprint, key=KEY, record_key=key)
    check(data, RecordKey(bytes(raw)))
