"""The contract every L3 backend keeps, as a test class to subclass.

Usage in ``tests/backends/test_<name>.py``::

    class TestFileContract(BackendContract):
        @pytest.fixture
        async def backend(self, pool, tmp_path):
            async with open_backend(f"file://{tmp_path}", pool) as b:
                yield b

``pool`` (a small page_first NSA pool) comes from this module's fixture, once plain and once a
``BoundPool`` whose every slot is bound to two ranges of memory the pool does not own (an engine's
host pool), so each record moves in three parts; subclasses may override it.
"""

from __future__ import annotations

import asyncio
import secrets

import pytest
import torch

import numpy as np

from tiered_kv import HostPool, mha_spec, mla_spec, nsa_spec
from tiered_kv.model.bound_pool import BoundPool
from tiered_kv.errors import BackendError, ForeignSlotError, IndexValidationError, PageKeyError, PoolError, UnsealedSlotError

SPEC = nsa_spec(num_layers=2)  # 100,864 B payload: small enough for CI, same shape of record

# Readers of another spec on the same medium, as another engine's pool would be: bigger and
# smaller pages, and one of exactly this size (another fingerprint only).
FOREIGN_READERS = {
    "fewer_layers": nsa_spec(num_layers=1),  # smaller pages: our records are larger than its slot
    "more_layers": nsa_spec(num_layers=3),  # bigger pages
    "other_layer_range": nsa_spec(num_layers=61, layer_range=(10, 12)),  # same page size
    "bf16_latent": nsa_spec(num_layers=2, latent_dtype="bf16"),
    "other_model_mla": mla_spec(num_layers=2, page_size=64),
    "other_layout_mha": mha_spec(num_layers=1, page_size=16, num_kv_heads=2, head_dim=64),  # 8 KiB pages
}
BAD_KEYS = ["", "nul\0inside", "new\nline", "tab\there", "\x7f", "ключ", "x" * 513]


def bound_pool(spec, num_slots: int) -> BoundPool:
    """A ``BoundPool`` with every slot bound to two ranges of engine-like memory: the payload's
    first bytes in one array, the rest in another (an odd split, neither part 4 KiB aligned)."""
    first = 3 * 4096 + 17
    head = np.zeros((num_slots, first), dtype=np.uint8)
    tail = np.zeros((num_slots, spec.page_bytes - first), dtype=np.uint8)
    pool = BoundPool(spec, num_slots, [head, tail])
    for slot in range(num_slots):
        pool.bind(slot, [head[slot], tail[slot]])
    return pool


def record_of(pool: HostPool, slot: int) -> bytes:
    """The bytes of ``slot``'s record, whatever parts hold it."""
    return bytes(pool.record_contents(slot))


def flip(pool: HostPool, slot: int, offset: int) -> None:
    """Flip the record byte at ``offset`` of ``slot`` (in whichever part holds it)."""
    data = bytearray(record_of(pool, slot))
    data[offset] ^= 0xFF
    pool.fill_record(slot, data)


def fill_and_seal(pool: HostPool, slots: list[int], keys: list[str]) -> dict[str, bytes]:
    """Random payload in each slot, sealed for its key; returns key -> record bytes."""
    records = {}
    for slot, key in zip(slots, keys):
        payload = torch.randint(0, 256, (pool.spec.page_bytes,), dtype=torch.uint8).numpy().tobytes()
        pool.fill_record(slot, bytes(4096) + payload)
        pool.seal(slot, key)
        records[key] = record_of(pool, slot)
    return records


async def assert_round_trip(backend, pool: HostPool, n: int = 2) -> list[str]:
    """Put ``n`` fresh random pages, read them into other slots, compare bytes; returns the keys."""
    keys = new_keys(n)
    slots = pool.allocate(n)
    records = fill_and_seal(pool, slots, keys)
    assert await backend.put_from(keys, slots) == [True] * n
    dst = pool.allocate(n)
    assert await backend.get_into(keys, dst) == [True] * n
    assert [record_of(pool, s) for s in dst] == [records[k] for k in keys]
    return keys


def assert_settled(pool: HostPool, free_before: int) -> None:
    """The end of an async test: the slots it took are free again, and no task is left pending."""
    assert pool.free_slots == free_before
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert pending == []


def new_keys(n: int) -> list[str]:
    prefix = secrets.token_hex(6)
    return [f"{prefix}-{i:04d}-{secrets.token_hex(8)}" for i in range(n)]


class BackendContract:
    """Behaviour shared by every backend. Subclasses provide the ``backend`` fixture."""

    @pytest.fixture(params=["plain", "bound"])
    def pool(self, request):
        with (HostPool(SPEC, 48, "page_first") if request.param == "plain" else bound_pool(SPEC, 48)) as pool:
            yield pool

    async def test_round_trip_random_pages(self, backend, pool):
        keys = new_keys(6)
        src = pool.allocate(6)
        records = fill_and_seal(pool, src, keys)
        assert await backend.put_from(keys, src) == [True] * 6
        dst = pool.allocate(6)
        for s in dst:  # poison: a hit must overwrite every byte
            pool.fill_record(s, b"\xa5" * pool.record_bytes)
        assert await backend.get_into(keys, dst) == [True] * 6
        for key, slot in zip(keys, dst):
            assert record_of(pool, slot) == records[key]

    async def test_exists_counts_leading_run(self, backend, pool):
        keys = new_keys(5)
        slots = pool.allocate(5)
        fill_and_seal(pool, slots, keys)
        await backend.put_from([keys[0], keys[1], keys[3]], [slots[0], slots[1], slots[3]])
        assert await backend.exists(keys) == 2
        assert await backend.exists(keys[:2]) == 2
        assert await backend.exists([keys[2], keys[0]]) == 0
        assert await backend.exists([]) == 0

    async def test_get_counts_only_leading_run(self, backend, pool):
        keys = new_keys(3)
        slots = pool.allocate(3)
        fill_and_seal(pool, slots, keys)
        await backend.put_from([keys[0], keys[2]], [slots[0], slots[2]])
        dst = pool.allocate(3)
        assert await backend.get_into(keys, dst) == [True, False, False]

    async def test_put_is_put_if_absent(self, backend, pool):
        [key] = new_keys(1)
        first, second, dst = pool.allocate(3)
        original = fill_and_seal(pool, [first], [key])[key]
        fill_and_seal(pool, [second], [key])  # different bytes, same key
        assert await backend.put_from([key], [first]) == [True]
        assert await backend.put_from([key], [second]) == [True]
        assert await backend.get_into([key], [dst]) == [True]
        assert record_of(pool, dst) == original

    @pytest.fixture
    def closable(self, backend):
        """A backend this test may close: ``backend`` where each test gets its own; a subclass
        whose ``backend`` serves the whole class gives a fresh one here."""
        return backend

    async def test_every_call_after_aclose_is_a_backend_error(self, closable, pool):
        # memory:// went on answering after aclose (no thread or connection to notice it closed).
        backend = closable
        keys = new_keys(1)
        slots = pool.allocate(1)
        fill_and_seal(pool, slots, keys)
        await backend.aclose()
        for call in (lambda: backend.exists(keys), lambda: backend.get_into(keys, slots),
                     lambda: backend.put_from(keys, slots), lambda: backend.delete(keys)):
            with pytest.raises(BackendError, match="closed"):
                await call()
        await backend.aclose()  # closing twice is fine
        pool.free(slots)

    async def test_delete(self, backend, pool):
        keys = new_keys(2)
        slots = pool.allocate(2)
        fill_and_seal(pool, slots, keys)
        await backend.put_from(keys, slots)
        await backend.delete([keys[0], "absent-key"])
        assert await backend.exists(keys) == 0
        assert await backend.exists(keys[1:]) == 1
        dst = pool.allocate(1)
        assert await backend.get_into(keys[:1], dst) == [False]
        await backend.delete([])

    async def test_empty_batches(self, backend, pool):
        assert await backend.put_from([], []) == []
        assert await backend.get_into([], []) == []
        assert await backend.exists([]) == 0

    async def test_duplicate_keys_in_one_batch(self, backend, pool):
        [key] = new_keys(1)
        slots = pool.allocate(2)
        fill_and_seal(pool, slots, [key, key])
        assert await backend.put_from([key, key], slots) == [True, True]
        dst = pool.allocate(2)
        assert await backend.get_into([key, key], dst) == [True, True]
        assert record_of(pool, dst[0]) == record_of(pool, dst[1])
        assert await backend.exists([key, key]) == 2

    async def test_many_tasks_at_once(self, backend, pool):
        keys = new_keys(16)
        src = pool.allocate(16)
        records = fill_and_seal(pool, src, keys)
        puts = await asyncio.gather(*(backend.put_from([k], [s]) for k, s in zip(keys, src)))
        assert all(r == [True] for r in puts)
        dst = pool.allocate(16)
        gets = await asyncio.gather(*(backend.get_into(keys[i:i + 4], dst[i:i + 4]) for i in range(0, 16, 4)))
        assert all(r == [True] * 4 for r in gets)
        for key, slot in zip(keys, dst):
            assert record_of(pool, slot) == records[key]

    async def test_unsealed_slot_is_refused(self, backend, pool):
        free_before = pool.free_slots
        keys = new_keys(2)
        slots = pool.allocate(2)
        fill_and_seal(pool, slots[:1], keys[:1])
        pool.fill_record(slots[1], bytes(4096))
        with pytest.raises(UnsealedSlotError, match="not sealed") as caught:
            await backend.put_from(keys, slots)
        assert isinstance(caught.value, PoolError) and isinstance(caught.value, ValueError)
        with pytest.raises(UnsealedSlotError, match="not sealed"):  # sealed for another key
            await backend.put_from([keys[1]], [slots[0]])
        assert await backend.exists(keys[:1]) == 0  # nothing of a refused batch was stored
        pool.free(slots)
        assert_settled(pool, free_before)

    async def test_bad_arguments(self, backend, pool):
        slots = pool.allocate(2)
        with pytest.raises(PageKeyError, match=r"keys\[0\]"):
            await backend.get_into([b"bytes-key"], slots[:1])
        with pytest.raises(PageKeyError):
            await backend.exists("a-single-string")
        with pytest.raises(IndexValidationError, match="2 keys but 1 slots"):
            await backend.get_into(new_keys(2), slots[:1])
        with pytest.raises(ForeignSlotError):
            await backend.get_into(new_keys(1), [pool.num_slots])
        for not_slots in (slots[0], None, "01"):
            with pytest.raises(IndexValidationError, match="slots must be a sequence"):
                await backend.put_from(new_keys(1), not_slots)

    @pytest.mark.parametrize("bad", BAD_KEYS)
    async def test_bad_keys_are_page_key_errors_everywhere(self, backend, pool, bad):
        """The one validator (tiered_kv.model.keys): seal refuses what backends refuse, with PageKeyError."""
        free_before = pool.free_slots
        [good] = new_keys(1)
        slots = pool.allocate(2)
        fill_and_seal(pool, slots[:1], [good])
        with pytest.raises(PageKeyError):
            pool.seal(slots[1], bad)
        for call in (lambda: backend.exists([good, bad]), lambda: backend.get_into([good, bad], slots),
                     lambda: backend.put_from([good, bad], [slots[0], slots[0]]), lambda: backend.delete([bad])):
            with pytest.raises(PageKeyError, match=r"keys\[\d\]"):
                await call()
        assert await backend.exists([good]) == 0  # a refused batch stores nothing
        pool.free(slots)
        assert_settled(pool, free_before)

    async def test_stats_are_counted(self, backend, pool):
        keys = new_keys(2)
        slots = pool.allocate(2)
        fill_and_seal(pool, slots, keys)
        before = (backend.stats.hits, backend.stats.misses, backend.stats.bytes_written)
        await backend.put_from(keys[:1], slots[:1])
        await backend.get_into(keys, pool.allocate(2))
        assert backend.stats.hits - before[0] == 1
        assert backend.stats.misses - before[1] == 1
        assert backend.stats.bytes_written - before[2] == pool.record_bytes

    @pytest.fixture
    def same_medium(self):
        """``pool -> async context manager``: another backend on this backend's medium, serving
        ``pool`` (as a second process would). None where the medium is not shared (memory)."""
        return None

    @pytest.mark.parametrize("reader", FOREIGN_READERS)
    async def test_a_foreign_reader_misses_and_leaves_the_page(self, backend, pool, same_medium, reader, caplog):
        """A reader whose pool has another spec (another model, layer range, dtype or layout:
        bigger, smaller or equal pages) meets our records under its keys: each is a miss counted
        as foreign (not corrupt), never a slot filled with a wrong page, and left in place, so the
        writer still reads its page afterwards."""
        if same_medium is None:
            pytest.skip("this medium is not shared between backends")
        free_before = pool.free_slots
        keys = new_keys(2)
        slots = pool.allocate(2)
        records = fill_and_seal(pool, slots, keys)
        assert await backend.put_from(keys, slots) == [True, True]
        corrupt_before = backend.stats.corrupt
        with HostPool(FOREIGN_READERS[reader], 4) as other:
            assert other.spec.fingerprint != pool.spec.fingerprint
            async with same_medium(other) as reader_backend:
                dst = other.allocate(2)
                with caplog.at_level("DEBUG", logger="tiered_kv.backends.base"):
                    assert await reader_backend.get_into(keys, dst) == [False, False]
                assert (reader_backend.stats.foreign, reader_backend.stats.corrupt, reader_backend.stats.hits) == (2, 0, 0)
                assert reader_backend.stats.misses == 2
                messages = [r.getMessage() for r in caplog.records if "another reader's" in r.getMessage()]
                assert len(messages) == 2 and not any("dropping" in r.getMessage() for r in caplog.records)
                if other.record_bytes < pool.record_bytes:
                    assert all("larger than the slot" in m and "bad magic" not in m for m in messages)
                assert await reader_backend.exists(keys) == 2  # still there for the reader too
                other.free(dst)
            assert other.free_slots == other.num_slots
        assert await backend.exists(keys) == 2
        back = pool.allocate(2)
        assert await backend.get_into(keys, back) == [True, True]
        assert [record_of(pool, s) for s in back] == [records[k] for k in keys]
        assert backend.stats.corrupt == corrupt_before
        pool.free(slots + back)
        assert_settled(pool, free_before)

    # --- a corrupt record is deleted only while it is what the get read (``_delete_corrupt``) ----
    async def test_a_damaged_read_of_an_intact_record_deletes_nothing(self, backend, pool, monkeypatch):
        """The stored record is intact and only what the get read is damaged (on the wire, in a
        faulty buffer): a corrupt miss, and the stored page stays where the backend can compare,
        so the next get hits. A backend that cannot compare deletes it (documented)."""
        free_before = pool.free_slots
        keys = new_keys(1)
        slots = pool.allocate(1)
        records = fill_and_seal(pool, slots, keys)
        assert await backend.put_from(keys, slots) == [True]
        real_get = backend._get

        async def damaged_get(keys, slots):
            found = await real_get(keys, slots)
            for slot in slots:
                flip(pool, slot, 5000)
            return found
        monkeypatch.setattr(backend, "_get", damaged_get)
        corrupt = backend.stats.corrupt
        dst = pool.allocate(1)
        assert await backend.get_into(keys, dst) == [False]
        assert backend.stats.corrupt == corrupt + 1
        monkeypatch.setattr(backend, "_get", real_get)
        if backend.capabilities.compares_before_delete:
            assert await backend.exists(keys) == 1
            assert await backend.get_into(keys, dst) == [True]
            assert record_of(pool, dst[0]) == records[keys[0]]
        else:
            assert await backend.exists(keys) == 0
        pool.free(slots + dst)
        assert_settled(pool, free_before)

    async def test_a_page_put_again_after_the_corrupt_read_stays(self, backend, pool, monkeypatch):
        """A corrupt stored record is read; before the get deletes it, another reader deletes it
        and a writer puts the page again, intact. The get is a corrupt miss, and the new page stays
        where the backend can compare (its next get returns the new bytes); a backend that cannot
        compare deletes it (documented). A corrupt record nobody replaced is still deleted."""
        free_before = pool.free_slots
        keys = new_keys(2)
        slots = pool.allocate(2)
        fill_and_seal(pool, slots, keys)
        for slot in slots:  # sealed, then damaged: stored as it is (put checks the header only)
            flip(pool, slot, 6000)
        assert await backend.put_from(keys, slots) == [True, True]
        fresh = pool.allocate(1)
        again = fill_and_seal(pool, fresh, keys[:1])
        real_verify = backend._verify_all

        async def verify_then_replace(landed):
            rejected = await real_verify(landed)
            await backend.delete(keys[:1])
            assert await backend.put_from(keys[:1], fresh) == [True]
            return rejected
        monkeypatch.setattr(backend, "_verify_all", verify_then_replace)
        corrupt = backend.stats.corrupt
        dst = pool.allocate(2)
        assert await backend.get_into(keys, dst) == [False, False]
        assert backend.stats.corrupt == corrupt + 2
        monkeypatch.setattr(backend, "_verify_all", real_verify)
        assert await backend.exists(keys[1:]) == 0  # the damaged page nobody replaced is gone
        if backend.capabilities.compares_before_delete:
            assert await backend.exists(keys[:1]) == 1
            assert await backend.get_into(keys[:1], dst[:1]) == [True]
            assert record_of(pool, dst[0]) == again[keys[0]]
        else:
            assert await backend.exists(keys[:1]) == 0
        pool.free(slots + fresh + dst)
        assert_settled(pool, free_before)

    # --- a record under a key's name that names another page -----------------------------------
    async def test_a_record_of_another_key_under_a_keys_name_is_corrupt_and_deleted(self, backend, pool):
        """An intact record of this spec that names another page sits under ``key``'s name (a
        writer's bug, a rename on the medium): no reader can ever use it, since a reader of
        ``key`` wants ``key``'s page and the other page's readers look under the other name. A
        miss counted as corrupt (not foreign), deleted, so ``exists`` stops announcing it and a
        put of the real page takes the name."""
        free_before = pool.free_slots
        key, other_key = new_keys(2)
        wrong, right, dst = pool.allocate(3)
        fill_and_seal(pool, [wrong], [other_key])
        # Under key's name, as no put_from would store it (put_from checks the seal): the primitive.
        assert await backend._put([key], [wrong]) == [True]
        assert await backend.exists([key]) == 1
        corrupt, foreign = backend.stats.corrupt, backend.stats.foreign
        assert await backend.get_into([key], [dst]) == [False]
        assert (backend.stats.corrupt - corrupt, backend.stats.foreign - foreign) == (1, 0)
        assert await backend.exists([key]) == 0
        records = fill_and_seal(pool, [right], [key])
        assert await backend.put_from([key], [right]) == [True]
        assert await backend.get_into([key], [dst]) == [True]
        assert record_of(pool, dst) == records[key]
        await backend.delete([key])
        pool.free([wrong, right, dst])
        assert_settled(pool, free_before)

    @pytest.mark.parametrize("its_key", ["same", "other"])
    async def test_a_record_of_another_spec_under_a_keys_name(self, backend, pool, same_medium, its_key):
        """A record of another spec naming ``key`` is another reader's page: a foreign miss, left in
        place. One naming another page is of use to no reader under ``key``'s name (that page's
        readers look under its own name), whatever its spec: corrupt and deleted, as
        ``tiered-kv inspect`` calls it, so a put of ``key`` takes the name back."""
        if same_medium is None:
            pytest.skip("this medium is not shared between backends")
        free_before = pool.free_slots
        key, other_key = new_keys(2)
        with HostPool(FOREIGN_READERS["other_layer_range"], 2) as other:
            async with same_medium(other) as writer:
                theirs = other.allocate(1)
                records = fill_and_seal(other, theirs, [key if its_key == "same" else other_key])
                assert await writer._put([key], theirs) == [True]
                dst = pool.allocate(1)
                corrupt, foreign = backend.stats.corrupt, backend.stats.foreign
                assert await backend.get_into([key], dst) == [False]
                if its_key == "same":
                    assert (backend.stats.corrupt - corrupt, backend.stats.foreign - foreign) == (0, 1)
                    assert await backend.exists([key]) == 1
                    back = other.allocate(1)
                    assert await writer._get([key], back) == [True]  # its bytes, untouched
                    assert bytes(other.record_view(back[0])) == next(iter(records.values()))
                    await writer.delete([key])
                    other.free(back)
                else:
                    assert (backend.stats.corrupt - corrupt, backend.stats.foreign - foreign) == (1, 0)
                    assert await backend.exists([key]) == 0
                other.free(theirs)
        pool.free(dst)
        assert_settled(pool, free_before)
