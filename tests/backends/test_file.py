"""The file backend on a real disk: contract, restart, sharing, capacity, disk full, corruption,
path safety, cancelled and timed-out reads, bad URLs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tiered_kv import HostPool
from tiered_kv.backends import open_backend
from tiered_kv.backends.file import SUFFIX, TEMP_PREFIX, FileBackend
from tiered_kv.errors import BackendTimeoutError, ConfigError, PoolExhaustedError

from .contract import SPEC, BackendContract, fill_and_seal, new_keys


def page_files(root: Path) -> list[Path]:
    return sorted(root.rglob(f"*{SUFFIX}"))


def temp_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(f"{TEMP_PREFIX}*"))


class TestFileContract(BackendContract):
    @pytest.fixture(params=["buffered", "direct"])
    async def backend(self, request, pool, tmp_path):
        url = f"file://{tmp_path}/store?fsync=false&o_direct={'true' if request.param == 'direct' else 'false'}"
        async with open_backend(url, pool) as backend:
            yield backend

    @pytest.fixture
    def same_medium(self, tmp_path):
        return lambda pool: open_backend(f"file://{tmp_path}/store?fsync=false", pool)


@pytest.fixture
def pool():
    with HostPool(SPEC, 24) as pool:
        yield pool


async def test_pages_survive_a_restart(pool, tmp_path):
    keys = new_keys(3)
    slots = pool.allocate(3)
    records = fill_and_seal(pool, slots, keys)
    async with open_backend(f"file://{tmp_path}", pool, capacity_bytes="1GiB") as first:
        assert await first.put_from(keys, slots) == [True] * 3
        used = first.used_bytes
    async with open_backend(f"file://{tmp_path}", pool, capacity_bytes="1GiB") as second:
        assert second.used_bytes == used == 3 * pool.slot_bytes
        dst = pool.allocate(3)
        assert await second.get_into(keys, dst) == [True] * 3
        assert [bytes(pool.record_view(s)) for s in dst] == [records[k] for k in keys]


async def test_a_second_process_reads_what_the_first_wrote(pool, tmp_path):
    keys = new_keys(2)
    slots = pool.allocate(2)
    records = fill_and_seal(pool, slots, keys)
    async with open_backend(f"file://{tmp_path}", pool) as backend:
        await backend.put_from(keys, slots)
    script = textwrap.dedent(f"""
        import asyncio, hashlib, sys
        from tiered_kv import HostPool, nsa_spec
        from tiered_kv.backends import open_backend
        async def main():
            with HostPool(nsa_spec(num_layers=2), 4) as pool:
                async with open_backend("file://{tmp_path}", pool) as backend:
                    slots = pool.allocate(2)
                    print(await backend.get_into({keys!r}, slots))
                    for s in slots:
                        print(hashlib.sha256(pool.record_view(s)).hexdigest())
        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True).stdout.split()
    import hashlib

    assert out[:2] == ["[True,", "True]"]
    assert out[2:] == [hashlib.sha256(records[k]).hexdigest() for k in keys]


async def test_capacity_evicts_least_recently_used(pool, tmp_path):
    keys = new_keys(4)
    slots = pool.allocate(4)
    fill_and_seal(pool, slots, keys)
    async with open_backend(f"file://{tmp_path}", pool, capacity_bytes=3 * pool.slot_bytes) as backend:
        for key, slot in zip(keys[:3], slots[:3]):  # one at a time: a batch lands in any order
            await backend.put_from([key], [slot])
        await backend.get_into(keys[:1], pool.allocate(1))  # keys[0] becomes the most recent
        assert await backend.put_from(keys[3:], slots[3:]) == [True]
        assert [await backend.contains(k) for k in keys] == [True, False, True, True]
        assert len(page_files(tmp_path)) == 3 and backend.used_bytes == 3 * pool.slot_bytes


def assert_index_matches_disk(backend: FileBackend, root: Path, capacity: int) -> None:
    """The three invariants of a bounded store, walked on disk: bytes within the bound, every page
    file in the index, every indexed page on disk (and nothing half written left behind)."""
    on_disk = {p.name: p.stat().st_size for p in page_files(root)}
    assert sum(on_disk.values()) <= capacity
    assert set(on_disk) == set(backend.indexed())
    assert backend.used_bytes == sum(on_disk.values()) == sum(backend.indexed().values())
    assert temp_files(root) == []


@pytest.mark.parametrize("direct", [False, True])
async def test_capacity_holds_under_concurrent_batches_gets_and_deletes(tmp_path, direct):
    """Many workers, batched puts over a few pages of room, gets and deletes at once: the bound
    holds and the index and the directory agree (a name entered the index before its file existed,
    was evicted by another worker, and the file was linked anyway: stray untracked files)."""
    pages, rounds = 48, 8
    with HostPool(SPEC, pages + 3 * 8) as pool:
        capacity = 3 * pool.slot_bytes
        root = tmp_path / "store"
        url = f"file://{root}?fsync=false&o_direct={str(direct).lower()}&workers=8"
        async with open_backend(url, pool, capacity_bytes=capacity) as backend:
            keys = new_keys(pages)
            src = pool.allocate(pages)
            records = fill_and_seal(pool, src, keys)

            async def writer(i: int) -> None:
                for r in range(rounds):
                    picked = [(i * 11 + r * 5 + j) % pages for j in range(16)]
                    await backend.put_from([keys[p] for p in picked], [src[p] for p in picked])

            async def reader(i: int) -> None:
                dst = pool.allocate(8)
                for r in range(rounds):
                    picked = [keys[(i * 3 + r * 7 + j) % pages] for j in range(8)]
                    for key, slot, hit in zip(picked, dst, await backend.get_into(picked, dst)):
                        assert not hit or bytes(pool.record_view(slot)) == records[key]
                pool.free(dst)

            async def deleter() -> None:
                for r in range(rounds):
                    await backend.delete([keys[(r * 13 + j) % pages] for j in range(4)])
                    await asyncio.sleep(0)

            await asyncio.gather(*(writer(i) for i in range(4)), *(reader(i) for i in range(3)), deleter())
            assert backend.stats.corrupt == 0
            assert_index_matches_disk(backend, root, capacity)
            # And a last batch of 16 on its own, as first seen: 3 pages stay, all tracked.
            assert sum(await backend.put_from(keys[:16], src[:16])) >= 3
            assert_index_matches_disk(backend, root, capacity)
            assert len(page_files(root)) == 3
        pool.free(src)
        assert pool.free_slots == pool.num_slots
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()] == []


async def test_page_larger_than_capacity_is_refused(pool, tmp_path):
    [key] = new_keys(1)
    slot = pool.allocate(1)
    fill_and_seal(pool, slot, [key])
    async with open_backend(f"file://{tmp_path}", pool, capacity_bytes=4096) as backend:
        assert await backend.put_from([key], slot) == [False]
        assert page_files(tmp_path) == [] and temp_files(tmp_path) == []


@pytest.fixture
def tiny_disk(tmp_path):
    """A real filesystem with room for about two pages (tmpfs as root); skipped where mount is refused."""
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mountpoint)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {result.stderr.decode().strip()}")
    yield mountpoint
    subprocess.run(["umount", str(mountpoint)], check=True)


async def test_disk_full_returns_false_and_keeps_existing_pages(pool, tiny_disk):
    keys = new_keys(5)
    slots = pool.allocate(5)
    records = fill_and_seal(pool, slots, keys)
    async with open_backend(f"file://{tiny_disk}", pool, workers=1) as backend:
        stored = await backend.put_from(keys, slots)
        assert stored[0] is True and False in stored
        assert temp_files(tiny_disk) == []
        assert len(page_files(tiny_disk)) == sum(stored)
        kept = [k for k, ok in zip(keys, stored) if ok]
        dst = pool.allocate(len(kept))
        assert await backend.get_into(kept, dst) == [True] * len(kept)
        assert [bytes(pool.record_view(s)) for s in dst] == [records[k] for k in kept]


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
async def test_a_damaged_file_is_a_counted_deleted_miss(pool, tmp_path, damage):
    [key] = new_keys(1)
    slot = pool.allocate(1)
    fill_and_seal(pool, slot, [key])
    async with open_backend(f"file://{tmp_path}", pool) as backend:
        await backend.put_from([key], slot)
        [path] = page_files(tmp_path)
        data = bytearray(path.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0x40
        path.write_bytes(data if damage == "flip" else data[:5000] if damage == "truncate" else b"")
        assert await backend.get_into([key], pool.allocate(1)) == [False]
        assert backend.stats.corrupt == 1
        assert not path.exists()
        assert await backend.exists([key]) == 0


async def test_keys_never_escape_the_directory(pool, tmp_path):
    store = tmp_path / "store"
    keys = ["../../escape", "/etc/passwd", "a/../../b", "..", "~root", "x" * 500]
    slots = pool.allocate(len(keys))
    fill_and_seal(pool, slots, keys)
    async with open_backend(f"file://{store}", pool) as backend:
        assert await backend.put_from(keys, slots) == [True] * len(keys)
        assert await backend.exists(keys) == len(keys)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) == len(keys)
    assert all(store in p.parents for p in written)


async def test_stale_temp_files_are_removed_on_open(pool, tmp_path):
    (tmp_path / "ab").mkdir()
    stale = tmp_path / "ab" / f"{TEMP_PREFIX}crashed"
    stale.write_bytes(b"half a page")
    os.utime(stale, (1, 1))
    fresh = tmp_path / "ab" / f"{TEMP_PREFIX}in-flight"
    fresh.write_bytes(b"being written by another process")
    async with open_backend(f"file://{tmp_path}", pool):
        assert not stale.exists() and fresh.exists()


def hold_reads(backend: FileBackend) -> threading.Event:
    """Hold every read of ``backend`` in its worker thread (as a stalled disk would) until the
    returned event is set; then it reads as usual."""
    gate = threading.Event()
    read_one = backend._read_one

    def held(key: str, slot: int):
        gate.wait(30)
        return read_one(key, slot)

    backend._read_one = held
    return gate


async def test_cancelled_get_keeps_its_slots_until_the_worker_returns(tmp_path):
    with HostPool(SPEC, 2) as pool:
        async with open_backend(f"file://{tmp_path}", pool, workers=1, o_direct=False) as backend:
            [key] = new_keys(1)
            gate = hold_reads(backend)
            [slot] = pool.allocate(1)
            task = asyncio.create_task(backend.get_into([key], [slot]))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            pool.free([slot])
            other = pool.allocate(1)
            assert other != [slot]  # the worker may still write into `slot`
            with pytest.raises(PoolExhaustedError):
                pool.allocate(1)
            gate.set()
            for _ in range(100):
                if pool.reap():
                    break
                await asyncio.sleep(0.02)
            assert pool.allocate(1) == [slot]


async def test_a_cancelled_put_keeps_its_slots_held_until_the_worker_has_read_them(tmp_path):
    """A put's thread reads the slot (an engine's pages, for a bound slot) until it returns: the
    slot must not be reused, nor an engine's page it points at, before then."""
    with HostPool(SPEC, 2) as pool:
        async with open_backend(f"file://{tmp_path}", pool, workers=1, o_direct=False) as backend:
            [key] = new_keys(1)
            gate = threading.Event()
            write_one = backend._write_one
            backend._write_one = lambda k, s: (gate.wait(30), write_one(k, s))[1]
            [slot] = pool.allocate(1)
            fill_and_seal(pool, [slot], [key])
            task = asyncio.create_task(backend.put_from([key], [slot]))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert pool.is_held(slot)
            pool.free([slot])
            assert pool.allocate(1) != [slot]
            gate.set()
            for _ in range(100):
                if not pool.is_held(slot):
                    break
                await asyncio.sleep(0.02)
            assert not pool.is_held(slot)


async def test_timed_out_get_raises_our_error_and_holds_slots(tmp_path):
    with HostPool(SPEC, 2) as pool:
        async with open_backend(f"file://{tmp_path}", pool, workers=1, timeout_s=0.3, o_direct=False) as backend:
            [key] = new_keys(1)
            gate = hold_reads(backend)
            [slot] = pool.allocate(1)
            with pytest.raises(BackendTimeoutError, match="longer than 0.3s"):
                await backend.get_into([key], [slot])
            assert backend.stats.errors == 1
            pool.free([slot])
            assert pool.free_slots == 1
            gate.set()


@pytest.mark.parametrize(
    "url, message",
    [
        ("file://relative/dir", "not host 'relative'"),
        ("file://", "must be absolute"),
        ("file:///tmp/x?capacity_bytes=big", "malformed size"),
        ("file:///tmp/x?o_direct=maybe", "o_direct='maybe'"),
        ("file:///tmp/x?workers=0", "workers > 0"),
        ("file:///tmp/x?color=blue", "unknown option 'color'"),
    ],
)
def test_bad_urls(pool, url, message):
    with pytest.raises(ConfigError, match=message):
        open_backend(url, pool)


@pytest.mark.parametrize("path", ["/tmp/with%00nul", "/tmp/a\0b"])
def test_nul_byte_in_the_path_is_a_config_error(pool, path):
    with pytest.raises(ConfigError, match="NUL byte"):
        open_backend(f"file://{path}", pool)


def test_a_path_that_is_a_file_is_a_config_error(pool, tmp_path):
    (tmp_path / "plain").write_bytes(b"not a directory")
    with pytest.raises(ConfigError, match="cannot be the store's directory"):
        open_backend(f"file://{tmp_path}/plain", pool)
    with pytest.raises(ConfigError, match="cannot be the store's directory"):
        open_backend(f"file://{tmp_path}/plain/below", pool)


async def test_something_else_under_a_page_name_is_a_foreign_miss_left_alone(pool, tmp_path):
    """A device (not a regular file) under a page's name is nobody's page of ours: a counted
    foreign miss, not read as zeros and then deleted as corrupt."""
    free_before = pool.free_slots
    async with open_backend(f"file://{tmp_path}", pool, o_direct=False) as backend:
        [key] = new_keys(1)
        path = backend.path_of(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to("/dev/zero")
        dst = pool.allocate(1)
        assert await backend.get_into([key], dst) == [False]
        assert (backend.stats.foreign, backend.stats.corrupt) == (1, 0)
        assert path.is_symlink()
        pool.free(dst)
    assert pool.free_slots == free_before


async def test_reopening_with_a_smaller_capacity_trims_to_it(pool, tmp_path):
    keys = new_keys(4)
    slots = pool.allocate(4)
    records = fill_and_seal(pool, slots, keys)
    async with open_backend(f"file://{tmp_path}", pool) as backend:
        for key, slot in zip(keys, slots):  # one at a time: mtime order = put order
            assert await backend.put_from([key], [slot]) == [True]
            os.utime(backend.path_of(key), (1000 + len(backend.indexed()),) * 2)
    capacity = 2 * pool.slot_bytes
    async with open_backend(f"file://{tmp_path}", pool, capacity_bytes=capacity) as backend:
        assert_index_matches_disk(backend, tmp_path, capacity)
        assert [await backend.contains(k) for k in keys] == [False, False, True, True]  # the oldest went
        dst = pool.allocate(2)
        assert await backend.get_into(keys[2:], dst) == [True, True]
        assert [bytes(pool.record_view(s)) for s in dst] == [records[k] for k in keys[2:]]
        pool.free(dst)
    pool.free(slots)
    assert pool.free_slots == pool.num_slots


# --- a directory that cannot be written -----------------------------------------------------------
@pytest.mark.parametrize("o_direct", ["true", "false"])
@pytest.mark.parametrize("with_pool", [True, False], ids=["data", "key_only"])
async def test_a_store_that_cannot_be_written_is_refused_at_open(pool, tmp_path, o_direct, with_pool):
    """A read-only directory ended in "OSError: Read-only file system" from the O_DIRECT probe's
    cleanup; with o_direct=false it opened, and every write of a run put the tier in a degraded
    state. Refused at open now, one typed error naming the directory; inspecting it still works."""
    from tiered_kv.errors import BackendError, BackendNotWritableError

    from .unwritable import read_only

    root = tmp_path / "kv"
    root.mkdir()
    with read_only(root):
        with pytest.raises(BackendNotWritableError, match=f"{root} cannot be written") as caught:
            open_backend(f"file://{root}?o_direct={o_direct}", pool if with_pool else None)
        assert isinstance(caught.value, BackendError)
        async with FileBackend.open_for_reading(f"file://{root}") as reader:  # a look needs no write
            assert await reader.exists(new_keys(1)) == 0
    async with open_backend(f"file://{root}?o_direct={o_direct}", pool if with_pool else None) as backend:
        assert await backend.exists(new_keys(1)) == 0  # writable again: opens
    assert temp_files(root) == []  # no probe file left behind


async def test_a_store_that_turns_read_only_keeps_serving_reads_and_refuses_puts(pool, tmp_path):
    """A store remounted read-only after open made every put raise, which degraded the tier: reads
    were answered "miss" while the disk could still serve them. A put now reports False (counted in
    ``put_rejected``, not an error), reads hit, and the health check passes (the store serves);
    once writable again, puts store."""
    from .unwritable import frozen

    root = tmp_path / "kv"
    root.mkdir()
    keys = new_keys(4)
    slots = pool.allocate(4)
    records = fill_and_seal(pool, slots, keys)
    async with open_backend(f"file://{root}?fsync=false", pool) as backend:
        assert await backend.put_from(keys[:2], slots[:2]) == [True, True]
        backend.path_of(keys[2]).parent.mkdir(exist_ok=True)  # one refused put meets its fan-out directory
        with frozen(root):
            assert await backend.put_from(keys[2:], slots[2:]) == [False, False]
            assert (backend.stats.put_rejected, backend.stats.errors) == (2, 0)
            dst = pool.allocate(2)
            assert await backend.get_into(keys[:2], dst) == [True, True]
            assert [bytes(pool.record_view(s)) for s in dst] == [records[k] for k in keys[:2]]
            await backend.check_health("probe")
            assert await backend.exists(keys) == 2
        assert await backend.put_from(keys[2:], slots[2:]) == [True, True]
        assert await backend.exists(keys) == 4
        pool.free(dst)
    pool.free(slots)
    assert pool.free_slots == pool.num_slots
    assert temp_files(root) == []


@pytest.mark.parametrize("aligned", [True, False])
async def test_a_bound_record_moves_by_direct_io_aligned_or_through_the_slot(tmp_path, aligned):
    """Under direct I/O, a bound slot whose parts are 4 KiB aligned (address and length) is read and
    written straight from its parts; unaligned parts go through the slot's own aligned memory. Either
    way the file is the plain record, and the bytes land in the engine's memory."""
    import mmap

    import numpy as np

    from tiered_kv import mha_spec
    from tiered_kv.model.bound_pool import BoundPool

    spec = mha_spec(num_layers=4, page_size=16, num_kv_heads=2, head_dim=64)  # 32 KiB pages: whole blocks
    first = 4096 * 5 if aligned else 4096 * 5 + 8
    backing = mmap.mmap(-1, 2 * 4096 * 64)  # page-aligned memory, as pinned engine buffers are
    memory = np.frombuffer(backing, dtype=np.uint8)
    head, tail = memory[:first], memory[4096 * 64:4096 * 64 + spec.page_bytes - first]
    with BoundPool(spec, 2, [memory]) as bound, HostPool(spec, 2) as plain:
        async with open_backend(f"file://{tmp_path}/l3", bound) as backend, \
                open_backend(f"file://{tmp_path}/l3", plain) as other:
            if not backend.direct_io:
                pytest.skip("this filesystem refuses O_DIRECT")
            [slot] = bound.allocate(1)
            bound.bind(slot, [head, tail])
            head[:] = np.random.default_rng(1).integers(0, 256, head.size, dtype=np.uint8)
            tail[:] = np.random.default_rng(2).integers(0, 256, tail.size, dtype=np.uint8)
            want = bytes(head) + bytes(tail)
            bound.seal(slot, "page")
            parts, flags, bounced = backend._read_parts(slot)
            assert (flags == os.O_DIRECT, bounced) == (True, not aligned)
            assert await backend.put_from(["page"], [slot]) == [True]
            [back] = plain.allocate(1)
            assert await other.get_into(["page"], [back]) == [True]
            assert bytes(plain.record_view(back))[4096:] == want
            head[:] = 0
            tail[:] = 0
            assert await backend.get_into(["page"], [slot]) == [True]
            assert bytes(head) + bytes(tail) == want
            bound.free([slot])
            plain.free([back])
