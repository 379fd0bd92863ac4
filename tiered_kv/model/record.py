"""The page record: how one page is stored on L3 and how it is verified when it comes back.

A record is a 4 KiB header block followed by the payload (components in spec order, each
layer-major; see ``spec.KVSpec.chunk_offset``). Header block, little-endian:

    0     8s   magic b"TIEREDKV"
    8     u16  format version
    10    u16  checksum algorithm (1 = xxh3-128, 2 = keyed HMAC-SHA256-128)
    12    u16  key length in bytes
    14    u16  reserved (0)
    16    16s  spec fingerprint (raw bytes of ``KVSpec.fingerprint``)
    32    u64  payload length
    40    16s  payload checksum (1), or keyed tag (2)
    56    ...  page key (ASCII, at most MAX_KEY_BYTES), then zeros
    568   8s   key id of the secret that sealed it (2), else zeros
    4080  16s  header checksum over bytes [0, 4080)

Latent and indexer of a page are in one payload under one checksum, so they can only be
stored, found and lost together. ``verify`` checks everything and raises a ``RecordError``
subclass, which every caller treats as a miss; it never hands back bytes it has not verified.

xxh3 was chosen by measurement (docs/benchmarks.md, benchmarks/checksum.py): it releases the GIL
and runs at tens of GB/s per core, far above any L3 tier. It detects damage, not tampering.

Keyed records (``record_key``, a ``RecordKey`` made from a tenant's secret; docs/security.md):
the checksum field holds an HMAC-SHA256-128 tag over the header block (tag and header checksum
zeroed) and the payload, and the header names the secret's key id. A reader with a key takes only
records tagged with it: an untagged record, or a tag that does not match, is ForgedRecordError
(a corrupt record: deleted); a record tagged under another key id is ForeignRecordError (another
tenant's page: left in place). A reader without a key checks plain records as before and leaves
keyed ones in place (ForeignRecordError): it cannot tell them intact.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

from ..errors import (CorruptRecordError, ForeignRecordError, ForgedRecordError, MisplacedRecordError, NotARecordError,
                      RecordError, SpecError, TruncatedRecordError)
from .keys import MAX_KEY_BYTES, check_key
from .record_key import KEY_ID_BYTES, RecordKey
from .spec import FORMAT_VERSION

HEADER_BYTES = 4096
MAGIC = b"TIEREDKV"
CHECKSUM_XXH3_128 = 1
TAG_HMAC_SHA256_128 = 2
ALGORITHMS = {CHECKSUM_XXH3_128: "xxh3-128", TAG_HMAC_SHA256_128: "hmac-sha256-128"}
_FIXED = struct.Struct("<8sHHHH16sQ16s")  # 56 bytes
_SUM_OFFSET = 40  # the payload checksum / keyed tag field
_KEY_OFFSET = _FIXED.size
_KEY_ID_OFFSET = _KEY_OFFSET + MAX_KEY_BYTES
_HEADER_SUM_OFFSET = HEADER_BYTES - 16
_ZEROS = bytes(HEADER_BYTES)


def payload_parts(payload) -> tuple:
    """``payload`` as its parts in order: a contiguous buffer is one part; a list or tuple of
    buffers is a payload held in pieces (a page whose components lie in an engine's memory, see
    ``bound_pool``). Checksums and tags over the parts equal those over their concatenation."""
    return tuple(payload) if isinstance(payload, (list, tuple)) else (payload,)


def payload_checksum(payload) -> bytes:
    """16-byte xxh3-128 digest of a buffer, or of a list of buffers taken as their concatenation
    (releases the GIL while it runs)."""
    parts = payload_parts(payload)
    if len(parts) == 1:
        return xxhash.xxh3_128_digest(parts[0])
    digest = xxhash.xxh3_128()
    for part in parts:
        digest.update(part)
    return digest.digest()


def payload_length(payload) -> int:
    """Bytes of ``payload`` (a buffer, or a list of buffers)."""
    return sum(_bytes_of(part).nbytes for part in payload_parts(payload))


def _key_bytes(key: str) -> bytes:
    # The one validator (PageKeyError), so a key sealed into a record is one every backend takes.
    return check_key(key).encode("ascii")


@dataclass(frozen=True)
class RecordHeader:
    version: int
    fingerprint: str
    key: str
    payload_len: int
    checksum: bytes  # the xxh3-128 checksum, or the keyed tag
    algorithm: int = CHECKSUM_XXH3_128
    key_id: bytes = b""  # the sealing secret's key id (keyed records), else empty

    @property
    def keyed(self) -> bool:
        return self.algorithm == TAG_HMAC_SHA256_128


def _fingerprint_bytes(fingerprint: str) -> bytes:
    """The 16 raw bytes of a ``KVSpec.fingerprint`` (32 hex characters); SpecError for anything else,
    which ``struct`` would pad or cut into another spec's fingerprint."""
    try:
        raw = bytes.fromhex(fingerprint) if isinstance(fingerprint, str) and len(fingerprint) == 32 else None
    except ValueError:
        raw = None
    if raw is None:
        raise SpecError(f"a spec fingerprint is 32 hex characters (KVSpec.fingerprint), got {repr(fingerprint)[:80]}")
    return raw


def _tagged_header(header) -> bytearray:
    """What a keyed tag covers of a header block: bytes [0, 4080) with the tag field zeroed."""
    covered = bytearray(header[:_HEADER_SUM_OFFSET])
    covered[_SUM_OFFSET:_KEY_OFFSET] = bytes(_KEY_OFFSET - _SUM_OFFSET)
    return covered


def write_header(header: memoryview, *, fingerprint: str, key: str, payload, record_key: RecordKey | None = None) -> None:
    """Fill the 4 KiB ``header`` block for ``payload`` (any contiguous buffer, or a list of them
    taken in order: ``payload_parts``).

    Written after the payload bytes have landed: this is what *sealing* a slot means. With
    ``record_key`` the record carries a keyed tag instead of the plain checksum.
    """
    if len(header) < HEADER_BYTES:
        raise RecordError(f"header block needs {HEADER_BYTES} bytes, got {len(header)}")
    raw_key = _key_bytes(key)
    raw_fingerprint = _fingerprint_bytes(fingerprint)
    payload_len = payload_length(payload)
    header[:HEADER_BYTES] = _ZEROS
    algorithm = CHECKSUM_XXH3_128 if record_key is None else TAG_HMAC_SHA256_128
    checksum = payload_checksum(payload) if record_key is None else bytes(16)
    _FIXED.pack_into(
        header, 0, MAGIC, FORMAT_VERSION, algorithm, len(raw_key), 0,
        raw_fingerprint, payload_len, checksum,
    )
    header[_KEY_OFFSET:_KEY_OFFSET + len(raw_key)] = raw_key
    if record_key is not None:
        header[_KEY_ID_OFFSET:_KEY_ID_OFFSET + KEY_ID_BYTES] = record_key.key_id
        header[_SUM_OFFSET:_KEY_OFFSET] = record_key.tag(_tagged_header(header), *payload_parts(payload))
    header[_HEADER_SUM_OFFSET:HEADER_BYTES] = xxhash.xxh3_128_digest(header[:_HEADER_SUM_OFFSET])


def encode(payload, *, fingerprint: str, key: str, record_key: RecordKey | None = None) -> bytearray:
    """A new record (header + copy of ``payload``), keyed with ``record_key`` where given."""
    data = _bytes_of(payload)
    out = bytearray(HEADER_BYTES + data.nbytes)
    view = memoryview(out)
    view[HEADER_BYTES:] = data
    write_header(view[:HEADER_BYTES], fingerprint=fingerprint, key=key, payload=view[HEADER_BYTES:],
                 record_key=record_key)
    return out


def _bytes_of(record) -> memoryview:
    """``record`` as a flat byte view; NotARecordError for what is no contiguous buffer."""
    try:
        return memoryview(record).cast("B")
    except TypeError:
        raise NotARecordError(f"a record is a contiguous bytes-like buffer (bytes, bytearray, memoryview, uint8 "
                              f"array), got {type(record).__name__}") from None


def read_header(record) -> RecordHeader:
    """Parse and check the header block (magic, header checksum, version); no payload check."""
    view = _bytes_of(record)
    if view.nbytes < HEADER_BYTES:
        raise TruncatedRecordError(f"record is {view.nbytes} bytes, shorter than its {HEADER_BYTES}-byte header")
    magic, version, algo, key_len, reserved, fp, payload_len, checksum = _FIXED.unpack_from(view, 0)
    if magic != MAGIC:
        raise CorruptRecordError(f"bad magic {magic!r}: not a tiered-kv page record")
    if xxhash.xxh3_128_digest(view[:_HEADER_SUM_OFFSET]) != bytes(view[_HEADER_SUM_OFFSET:HEADER_BYTES]):
        raise CorruptRecordError("header checksum mismatch: the header block is corrupted")
    if version != FORMAT_VERSION or algo not in ALGORITHMS or reserved != 0:
        raise CorruptRecordError(f"unsupported record format version {version} / checksum {algo}")
    if not 0 < key_len <= MAX_KEY_BYTES:
        raise CorruptRecordError(f"key length {key_len} out of range")
    key = bytes(view[_KEY_OFFSET:_KEY_OFFSET + key_len]).decode("ascii", errors="replace")
    key_id = bytes(view[_KEY_ID_OFFSET:_KEY_ID_OFFSET + KEY_ID_BYTES]) if algo == TAG_HMAC_SHA256_128 else b""
    return RecordHeader(version, fp.hex(), key, payload_len, bytes(checksum), algo, key_id)


def verify(record, *, fingerprint: str, key: str, payload_len: int, record_key: RecordKey | None = None) -> memoryview:
    """Check every field of ``record`` and return a view of its verified payload.

    ``record`` may be longer than the record (a padded slot); the bytes after it are ignored.
    ``record_key``: the reader's key; None takes plain records only (see the module docstring).
    Raises TruncatedRecordError, CorruptRecordError (MisplacedRecordError and ForgedRecordError among
    them) or ForeignRecordError.
    """
    header = read_header(record)
    check_owner(header, fingerprint=fingerprint, key=key, payload_len=payload_len)
    view = _bytes_of(record)
    if view.nbytes < HEADER_BYTES + payload_len:
        raise TruncatedRecordError(f"record is {view.nbytes} bytes, header says {HEADER_BYTES + payload_len}")
    payload = view[HEADER_BYTES:HEADER_BYTES + payload_len]
    _check_payload(header, view[:HEADER_BYTES], payload, record_key)
    return payload


def verify_parts(header_block, payload, *, fingerprint: str, key: str, payload_len: int,
                 record_key: RecordKey | None = None) -> None:
    """``verify`` for a record held in pieces: its 4 KiB ``header_block`` and its ``payload`` as a
    list of buffers in order (``payload_parts``), together ``payload_len`` bytes: fewer is a
    TruncatedRecordError, more fails the checksum or tag like any changed byte.
    Raises what ``verify`` raises; returns nothing (the payload stays where it is)."""
    header = read_header(header_block)
    check_owner(header, fingerprint=fingerprint, key=key, payload_len=payload_len)
    held = payload_length(payload)
    if held < payload_len:
        raise TruncatedRecordError(f"record payload is {held} bytes, header says {payload_len}")
    _check_payload(header, _bytes_of(header_block)[:HEADER_BYTES], payload, record_key)


def _check_payload(header: RecordHeader, header_block, payload, record_key: RecordKey | None) -> None:
    """Check ``payload`` against ``header`` (read from ``header_block``) as a reader holding
    ``record_key`` (None: no secret) takes records; raises what ``verify`` names."""
    page = header.key[:64]
    if record_key is None:
        if header.keyed:
            raise ForeignRecordError(f"record of page {page!r} is sealed with a secret (key id {header.key_id.hex()}) "
                                     "this reader does not hold: another tenant's page")
        if payload_checksum(payload) != header.checksum:
            raise CorruptRecordError(f"payload checksum mismatch for page {page!r}")
        return
    if not header.keyed:
        raise ForgedRecordError(f"record of page {page!r} has no keyed tag (plain {ALGORITHMS[header.algorithm]} "
                                "checksum): a reader with a secret takes only records sealed with it")
    if header.key_id != record_key.key_id:
        raise ForeignRecordError(f"record of page {page!r} is sealed with another secret (key id "
                                 f"{header.key_id.hex()}, this reader's {record_key.key_id.hex()}): another tenant's page")
    if not record_key.matches(header.checksum, _tagged_header(header_block), *payload_parts(payload)):
        raise ForgedRecordError(f"keyed tag mismatch for page {page!r}: forged, tampered with or corrupted")


def check_owner(header: RecordHeader, *, fingerprint: str, key: str, payload_len: int) -> None:
    """Raise unless ``header`` is of spec ``fingerprint``, page ``key`` and ``payload_len``.

    A record naming another page than ``key`` is MisplacedRecordError, whatever its spec: every
    reader looks for a page under its own key's name only, so a record under another page's name
    serves no reader there (``tiered-kv inspect`` says "stored elsewhere" of it). A record naming
    ``key`` of another fingerprint is ForeignRecordError: another reader's page. This fingerprint
    with a payload size it never writes is MisplacedRecordError too.
    """
    if header.key != key:
        raise MisplacedRecordError(f"record holds page {header.key[:64]!r} under the name of "
                                   f"{key[:64]!r}: of use to no reader")
    if header.fingerprint != fingerprint:
        raise ForeignRecordError(f"record written for spec {header.fingerprint}, expected {fingerprint}")
    if header.payload_len != payload_len:
        raise MisplacedRecordError(f"record of this spec says its payload is {header.payload_len} bytes, the "
                                   f"spec's page is {payload_len}")


def other_length_error(prefix, *, length: int, expected: int, fingerprint: str, key: str, payload_len: int) -> RecordError:
    """Why a stored value of ``length`` bytes, where this reader's records take ``expected``, is no hit.

    ``prefix`` holds the value's first ``min(length, len(prefix))`` bytes (its header, where the
    value has one). An intact header of another spec makes it ForeignRecordError: someone else's
    page, which the reader must leave alone. A value that is no readable record, this very page at
    the wrong length, or a record of this spec naming another page (``MisplacedRecordError``) is
    TruncatedRecordError / CorruptRecordError.
    """
    if length > expected:
        size = f"larger than the slot ({length} B > {expected} B)"
    else:
        size = f"shorter than this reader's records ({length} B < {expected} B)"
    try:
        header = read_header(memoryview(prefix).cast("B")[:min(length, memoryview(prefix).nbytes)])
    except RecordError as exc:
        return type(exc)(f"stored value {size} is no readable record: {exc}")
    try:
        check_owner(header, fingerprint=fingerprint, key=key, payload_len=payload_len)
    except ForeignRecordError as exc:
        return ForeignRecordError(f"record {size}, another reader's: {exc}")
    except MisplacedRecordError as exc:
        return MisplacedRecordError(f"record {size}: {exc}")
    cls = TruncatedRecordError if length < expected else CorruptRecordError
    return cls(f"record of page {key[:64]!r} is {size}: damaged")


def is_sealed_for(record, *, fingerprint: str, key: str, record_key: RecordKey | None = None) -> bool:
    """Cheap check (header only) that a slot was sealed for ``key``, as a holder of ``record_key``
    seals (keyed with its key id, or plain for None): used before every put, so a writer never
    publishes a record its own readers would refuse."""
    try:
        header = read_header(record)
    except (CorruptRecordError, TruncatedRecordError):
        return False
    sealed_as = header.key_id if header.keyed else None
    return header.fingerprint == fingerprint and header.key == key and sealed_as == (
        None if record_key is None else record_key.key_id)
