"""Two tenants sharing one L3 (a real file directory, a real redis-server, an in-process store).

Each tenant has its own namespace salt (so the same prompt gives other page keys) and its own
secret (so its records carry a keyed tag only it can make). A tenant's pages are neither a hit
nor readable for another tenant, even one asking for their raw keys; a forger that writes records
behind the library's back (valid plain checksum over wrong bytes, or a copied header) gets a
counted miss and its record deleted, never data.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import xxhash

from tiered_kv import HostPool, Namespace, page_keys
from tiered_kv.backends import open_backend
from tiered_kv.model import record
from tiered_kv.model.record_key import RecordKey

from .contract import SPEC, assert_settled, fill_and_seal
from .redis_server import RedisServer

PROMPT = list(range(3 * SPEC.page_size))


@dataclass(frozen=True)
class Tenant:
    salt: str
    key: RecordKey | None

    def keys(self, tokens=PROMPT) -> list[str]:
        return page_keys(Namespace.for_spec(SPEC, "shared-model", tenant_salt=self.salt), tokens)

    def pool(self, slots: int = 8) -> HostPool:
        return HostPool(SPEC, slots, record_key=self.key)


ALICE = Tenant("tenant-alice", RecordKey(secrets.token_hex(32)))
BOB = Tenant("tenant-bob", RecordKey(secrets.token_hex(32)))
NO_SECRET = Tenant("tenant-alice", None)  # Alice's namespace, without her secret


class Medium:
    """One shared store: ``open(pool)`` a backend on it; ``forge`` writes raw bytes under a page's
    name as a writer with access to the medium, not through the library."""

    async def open(self, pool):
        raise NotImplementedError

    def forge(self, backend, key: str, data: bytes) -> None:
        raise NotImplementedError

    def stored(self, backend, key: str) -> bytes | None:
        raise NotImplementedError


class FileMedium(Medium):
    def __init__(self, root: Path) -> None:
        self.root = root

    def open(self, pool):
        return open_backend(f"file://{self.root}?fsync=false", pool)

    def forge(self, backend, key, data):
        path = self.root / backend.stored_name(key)
        path.parent.mkdir(exist_ok=True)
        temp = path.with_suffix(".forging")
        temp.write_bytes(data + bytes(backend.stored_length(len(data)) - len(data)))
        os.replace(temp, path)

    def stored(self, backend, key):
        path = self.root / backend.stored_name(key)
        return path.read_bytes()[:backend.pool.record_bytes] if path.exists() else None


class RedisMedium(Medium):
    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.prefix = f"iso{secrets.token_hex(3)}:"
        self.client = redis.Redis(host="127.0.0.1", port=server.port)

    def open(self, pool):
        return open_backend(self.server.url, pool, prefix=self.prefix)

    def forge(self, backend, key, data):
        self.client.set(self.prefix + key, data)

    def stored(self, backend, key):
        return self.client.get(self.prefix + key)


class MemoryMedium(Medium):
    def __init__(self) -> None:
        self.first = None

    @contextlib.asynccontextmanager
    async def open(self, pool):
        if self.first is None:
            async with open_backend("memory://", pool) as backend:
                self.first = backend
                yield backend
            return
        backend = self.first.on_same_store(pool)
        try:
            yield backend
        finally:
            await backend.aclose()

    def forge(self, backend, key, data):
        backend.store_for_tests(key, data)

    def stored(self, backend, key):
        return backend._records.get(key)


@pytest.fixture(params=["file", "redis", "memory"])
def medium(request, tmp_path):
    if request.param == "file":
        return FileMedium(tmp_path / "shared")
    if request.param == "redis":
        return RedisMedium(request.getfixturevalue("redis_server"))
    return MemoryMedium()


def wrong_record(key: str, seed: int = 1) -> bytes:
    """What a forger writes: another payload under a plain checksum that matches it."""
    body = os.urandom(SPEC.page_bytes) if seed else bytes(SPEC.page_bytes)
    return bytes(record.encode(body, fingerprint=SPEC.fingerprint, key=key))


def test_tenants_derive_other_keys_for_the_same_prompt():
    assert not set(ALICE.keys()) & set(BOB.keys())
    assert ALICE.keys() == NO_SECRET.keys()  # the salt names the namespace; the secret does not


async def test_another_tenant_neither_hits_nor_reads_a_page_by_its_raw_key(medium):
    with ALICE.pool() as alice_pool, BOB.pool() as bob_pool, NO_SECRET.pool() as plain_pool:
        async with medium.open(alice_pool) as alice, medium.open(bob_pool) as bob, medium.open(plain_pool) as plain:
            keys = ALICE.keys()
            src = alice_pool.allocate(len(keys))
            records = fill_and_seal(alice_pool, src, keys)
            assert await alice.put_from(keys, src) == [True] * len(keys)
            for reader, pool in ((bob, bob_pool), (plain, plain_pool)):
                dst = pool.allocate(len(keys))
                for s in dst:
                    pool.slot_view(s)[:] = b"\xa5" * pool.slot_bytes
                assert await reader.exists(keys) == len(keys)  # presence of a known key is no secret
                assert await reader.get_into(keys, dst) == [False] * len(keys)
                assert (reader.stats.hits, reader.stats.foreign, reader.stats.forged, reader.stats.corrupt) == (
                    0, len(keys), 0, 0)
                # Every record landed in a slot was refused and wiped: nothing of Alice's is readable there.
                assert all(bytes(pool.slot_view(s)) == bytes(pool.slot_bytes) for s in dst)
                pool.free(dst)
            # Alice's records were left in place, whole, and she still reads them.
            assert [medium.stored(alice, k) for k in keys] == [records[k] for k in keys]
            dst = alice_pool.allocate(len(keys))
            assert await alice.get_into(keys, dst) == [True] * len(keys)
            assert [bytes(alice_pool.record_view(s)) for s in dst] == [records[k] for k in keys]
            alice_pool.free(src + dst)
        for pool in (alice_pool, bob_pool, plain_pool):
            assert_settled(pool, pool.num_slots)


async def test_forged_record_with_a_valid_plain_checksum_is_a_counted_miss_and_deleted(medium):
    """The defect this guards against: without a secret, a forged record is served as a hit."""
    [key] = ALICE.keys()[:1]
    forged = wrong_record(key)
    with NO_SECRET.pool() as plain_pool, ALICE.pool() as alice_pool:
        async with medium.open(plain_pool) as plain, medium.open(alice_pool) as alice:
            medium.forge(alice, key, forged)
            [slot] = plain_pool.allocate(1)
            assert await plain.get_into([key], [slot]) == [True]  # the plain checksum cannot tell
            assert bytes(plain_pool.record_view(slot)) == forged
            plain_pool.free([slot])

            [slot] = alice_pool.allocate(1)
            assert await alice.get_into([key], [slot]) == [False]
            assert (alice.stats.forged, alice.stats.corrupt, alice.stats.foreign, alice.stats.hits) == (1, 0, 0, 0)
            assert bytes(alice_pool.slot_view(slot)) == bytes(alice_pool.slot_bytes)  # nothing of it stays
            assert await alice.exists([key]) == 0 and medium.stored(alice, key) is None  # deleted
            # The genuine page can be stored again and is served.
            genuine = fill_and_seal(alice_pool, [slot], [key])[key]
            assert await alice.put_from([key], [slot]) == [True]
            [dst] = alice_pool.allocate(1)
            assert await alice.get_into([key], [dst]) == [True]
            assert bytes(alice_pool.record_view(dst)) == genuine
            alice_pool.free([slot, dst])
        assert_settled(alice_pool, alice_pool.num_slots)
        assert_settled(plain_pool, plain_pool.num_slots)


async def test_a_genuine_header_over_forged_bytes_is_a_counted_miss(medium):
    """The forger copies Alice's genuine header (her key id and tag) and changes the payload."""
    key = ALICE.keys()[0]
    with ALICE.pool() as pool:
        async with medium.open(pool) as alice:
            [slot] = pool.allocate(1)
            genuine = fill_and_seal(pool, [slot], [key])[key]
            assert await alice.put_from([key], [slot]) == [True]
            forged = bytearray(medium.stored(alice, key))
            assert forged == genuine
            forged[record.HEADER_BYTES + 100] ^= 0xFF
            medium.forge(alice, key, bytes(forged))
            assert await alice.get_into([key], [slot]) == [False]
            assert (alice.stats.forged, alice.stats.hits) == (1, 0)
            assert medium.stored(alice, key) is None
            pool.free([slot])
        assert_settled(pool, pool.num_slots)


async def test_another_tenants_record_under_our_key_is_a_foreign_miss_left_in_place(medium):
    """Bob writes a page of his own under Alice's raw key: Alice gets a miss, never Bob's bytes,
    and leaves the record alone (a reader deletes only what claims to be its own)."""
    key = ALICE.keys()[1]
    with ALICE.pool() as alice_pool, BOB.pool() as bob_pool:
        async with medium.open(alice_pool) as alice, medium.open(bob_pool) as bob:
            [src] = bob_pool.allocate(1)
            bobs = fill_and_seal(bob_pool, [src], [key])[key]
            assert await bob.put_from([key], [src]) == [True]
            [dst] = alice_pool.allocate(1)
            assert await alice.get_into([key], [dst]) == [False]
            assert (alice.stats.foreign, alice.stats.forged, alice.stats.hits) == (1, 0, 0)
            assert bytes(alice_pool.slot_view(dst)) == bytes(alice_pool.slot_bytes)
            assert medium.stored(alice, key) == bobs
            alice_pool.free([dst])
            bob_pool.free([src])
        assert_settled(alice_pool, alice_pool.num_slots)
        assert_settled(bob_pool, bob_pool.num_slots)


def test_forged_plain_record_checks_its_own_checksums():
    """The forgery the tests use is a valid record by every unkeyed check (so the tests show the tag at work)."""
    key = ALICE.keys()[0]
    data = wrong_record(key)
    header = record.read_header(data)
    assert header.checksum == xxhash.xxh3_128_digest(data[record.HEADER_BYTES:])
    record.verify(data, fingerprint=SPEC.fingerprint, key=key, payload_len=SPEC.page_bytes)
