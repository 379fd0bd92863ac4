"""A tenant's record key: the secret behind keyed record tags, so forged records are refused.

The plain record checksum (xxh3-128) detects damage, not tampering: anyone who can write to a
shared store can write a record with a correct checksum over wrong bytes. A ``RecordKey`` made
from a tenant's secret seals records with an HMAC-SHA256 tag (truncated to 128 bits) over the
header fields, the page key and the payload; a reader holding the same secret accepts only
records whose tag it can recompute. Without the secret nobody can produce such a tag, so a forged
or tampered record is a miss, never data (``record.verify``).

The secret is never stored, logged or shown: the object keeps only keys derived from it, and its
``repr`` names its public ``key_id`` (8 bytes in each record header that say which secret sealed
it, derived one-way, so that a reader tells another tenant's record from a forged one of its own).

HMAC-SHA256 was chosen by measurement (docs/security.md, benchmarks/checksum.py): OpenSSL runs it
with the CPU's SHA extensions and releases the GIL, faster per core than keyed BLAKE2b from hashlib.
Standard library only; it must never import torch or a backend.
"""

from __future__ import annotations

import hashlib
import hmac

from ..errors import ConfigError

#: The shortest secret taken: 128 bits of text (a random hex string of 32 characters and up).
MIN_SECRET_BYTES = 16
TAG_BYTES = 16
KEY_ID_BYTES = 8
_TAG_LABEL = b"tiered-kv record tag v1"
_KEY_ID_LABEL = b"tiered-kv record key id v1"


def _secret_bytes(secret: object) -> bytes:
    if isinstance(secret, str):
        raw = secret.encode("utf-8")
    elif isinstance(secret, (bytes, bytearray)):
        raw = bytes(secret)
    else:
        raise ConfigError(f"a record secret is text or bytes, got {type(secret).__name__}")
    if len(raw) < MIN_SECRET_BYTES:
        # The length only: an error message must never carry the secret.
        raise ConfigError(f"a record secret needs at least {MIN_SECRET_BYTES} bytes, got {len(raw)} "
                          f"(use a random string, e.g. python -c 'import secrets; print(secrets.token_hex(32))')")
    return raw


class RecordKey:
    """Seals and checks keyed record tags for one secret (a tenant's, or a namespace's)."""

    __slots__ = ("_tag_key", "key_id")

    def __init__(self, secret: str | bytes) -> None:
        raw = _secret_bytes(secret)
        # Two keys derived apart, so the public key id says nothing about the tag key.
        self._tag_key = hmac.digest(raw, _TAG_LABEL, "sha256")
        self.key_id: bytes = hmac.digest(raw, _KEY_ID_LABEL, "sha256")[:KEY_ID_BYTES]

    def tag(self, *parts) -> bytes:
        """The 16-byte tag over ``parts`` (contiguous buffers) in order; releases the GIL on large
        parts (OpenSSL's HMAC), so tags of many pages run in parallel on threads."""
        mac = hmac.new(self._tag_key, digestmod=hashlib.sha256)
        for part in parts:
            mac.update(part)
        return mac.digest()[:TAG_BYTES]

    def matches(self, expected: bytes, *parts) -> bool:
        """Whether ``expected`` is this key's tag over ``parts`` (compared in constant time)."""
        return hmac.compare_digest(self.tag(*parts), bytes(expected))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RecordKey) and hmac.compare_digest(self._tag_key, other._tag_key)

    def __hash__(self) -> int:
        return hash(self.key_id)

    def __repr__(self) -> str:
        return f"RecordKey(key_id={self.key_id.hex()})"

    def __copy__(self) -> "RecordKey":
        return self  # immutable

    def __deepcopy__(self, memo: dict) -> "RecordKey":
        return self

    def __reduce__(self):
        # Pickling would carry the derived tag key to wherever the pickle goes: refuse, so a
        # worker process gets its secret from its own config or environment.
        raise TypeError("a RecordKey is not pickled; give each process the secret through its config or environment")


def record_key(secret: str | bytes | None) -> RecordKey | None:
    """``RecordKey(secret)``, or None (plain checksums only) for no secret or an empty one."""
    if secret is None or (isinstance(secret, (str, bytes, bytearray)) and len(secret) == 0):
        return None
    return RecordKey(secret)


__all__ = ["KEY_ID_BYTES", "MIN_SECRET_BYTES", "RecordKey", "TAG_BYTES", "record_key"]
