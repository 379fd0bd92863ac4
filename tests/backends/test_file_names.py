"""The file backend when something other than its own page file sits under a page's name: a FIFO, a
socket, a directory, a symbolic link (to a device, or dangling), garbage bytes, another page's record.

Reads answer at once with a counted miss (never a hang, never a degraded tier), ``exists`` announces
only regular files, and a put of the page takes the name back.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tiered_kv import HostPool
from tiered_kv.backends import open_backend
from tiered_kv.backends.file import FileBackend

from .contract import FOREIGN_READERS, SPEC, assert_settled, fill_and_seal, new_keys


@pytest.fixture
def pool():
    with HostPool(SPEC, 8) as pool:
        yield pool


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    # Bound under a short name (a socket's path is limited to 107 bytes), then moved in place.
    short = Path(tempfile.mkdtemp(prefix="tkv-", dir="/tmp"))
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(short / "s"))
        sock.close()  # the socket file stays; nobody listens on it (ENXIO on open)
        os.rename(short / "s", path)
    finally:
        short.rmdir()


def _directory(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_bytes(b"someone's file")


def _empty_directory(path: Path) -> None:
    path.mkdir()


def _device_link(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _dangling_link(path: Path) -> None:
    path.symlink_to(path.parent / "nowhere")


NOT_FILES: dict[str, Callable[[Path], None]] = {
    "fifo": _fifo,
    "socket": _socket,
    "directory": _directory,
    "empty_directory": _empty_directory,
    "device_link": _device_link,
    "dangling_link": _dangling_link,
}


def place(backend: FileBackend, key: str, make: Callable[[Path], None]) -> Path:
    path = backend.path_of(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    make(path)
    return path


@contextmanager
def unblocking(path: Path) -> Iterator[None]:
    """On exit, open a FIFO at ``path`` for writing once, which releases a reader blocked in its
    open (a backend without the fix), so a failing test cannot keep the process from exiting."""
    try:
        yield
    finally:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader waits (ENXIO), or the FIFO is gone


def own_threads(settle_s: float = 0.0) -> set[threading.Thread]:
    """The file backend's worker threads alive, after giving those of a closed backend up to
    ``settle_s`` to return (an idle worker leaves once it sees the executor shut down)."""
    deadline = time.monotonic() + settle_s
    while True:
        alive = {t for t in threading.enumerate() if t.name.startswith("tkv-file")}
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.01)


@pytest.mark.parametrize("o_direct", ["false", "true"])
@pytest.mark.parametrize("what", NOT_FILES)
async def test_a_read_of_a_non_regular_name_is_a_prompt_counted_miss(pool, tmp_path, what, o_direct):
    """A FIFO under a page name held every read until ``timeout_s`` (then a degraded tier, and a
    thread stuck in ``open`` after close); a socket (ENXIO) or a directory under O_DIRECT (EINVAL)
    raised. Now each is a counted foreign miss at once, and ``exists`` does not announce it."""
    threads_before = own_threads()
    async with open_backend(f"file://{tmp_path}/store?fsync=false&o_direct={o_direct}&timeout_s=3", pool) as backend:
        key, after = new_keys(2)
        path = place(backend, key, NOT_FILES[what])
        with unblocking(path):
            dst = pool.allocate(1)
            started = time.monotonic()
            assert await backend.get_into([key], dst) == [False]
            assert time.monotonic() - started < 1.0
            assert (backend.stats.foreign, backend.stats.corrupt, backend.stats.errors) == (1, 0, 0)
            assert await backend.exists([key, after]) == 0
            assert os.path.lexists(path)  # not ours to remove on a read
            pool.free(dst)
    assert own_threads(settle_s=2.0) <= threads_before  # no reader left behind in the FIFO's open
    assert pool.free_slots == pool.num_slots


async def test_inspect_lists_a_fifo_apart_without_blocking(pool, tmp_path):
    """``read_stored`` on a name that turned into a FIFO after it was listed answers at once."""
    async with open_backend(f"file://{tmp_path}/store?fsync=false", pool) as backend:
        [key] = new_keys(1)
        path = place(backend, key, _fifo)
    reader = FileBackend.open_for_reading(f"file://{tmp_path}/store")
    reader.timeout_s = 3
    async with reader:
        with unblocking(path):
            listed = [item async for item in reader.scan()]
            assert listed == [(reader.stored_name(key), None)]
            value = await reader.read_stored(reader.stored_name(key))
            assert "not a regular file" in value.reason



# --- a put takes the name back ------------------------------------------------------------------
def _garbage_of_a_records_length(backend: FileBackend, path: Path) -> None:
    path.write_bytes(os.urandom(backend.file_bytes))


def _garbage_short(_backend: FileBackend, path: Path) -> None:
    path.write_bytes(b"no page record at all")


def _record_of(pool_spec, key: str) -> bytes:
    with HostPool(pool_spec, 1) as other:
        slots = other.allocate(1)
        return fill_and_seal(other, slots, [key])[key]


def _padded(record: bytes, length: int) -> bytes:
    return record + bytes(max(0, length - len(record)))


NOT_PAGES: dict[str, Callable] = {
    **{what: (lambda make: lambda _backend, path: make(path))(make) for what, make in NOT_FILES.items()
       if what != "directory"},
    "garbage_of_a_records_length": _garbage_of_a_records_length,
    "garbage_short": _garbage_short,
}


@pytest.mark.parametrize("what", [*NOT_PAGES, "another_pages_record", "another_specs_record_of_another_page"])
async def test_a_put_replaces_what_no_reader_can_use_under_the_name(pool, tmp_path, what):
    """Anything under a page's name that is no record any reader looks for there (no regular file,
    garbage, a record naming another page, of this spec or another) used to make every put report
    True while it stored nothing: the name was lost for good. A put replaces it now."""
    free_before = pool.free_slots
    async with open_backend(f"file://{tmp_path}/store?fsync=false&o_direct=false", pool) as backend:
        key, other_key = new_keys(2)
        path = backend.path_of(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        if what in NOT_PAGES:
            NOT_PAGES[what](backend, path)
        else:
            spec = SPEC if what == "another_pages_record" else FOREIGN_READERS["other_layer_range"]
            path.write_bytes(_padded(_record_of(spec, other_key), backend.file_bytes))
        src, dst = pool.allocate(2)
        records = fill_and_seal(pool, [src], [key])
        assert await backend.put_from([key], [src]) == [True]
        assert backend.stats.put_rejected == 0
        assert await backend.exists([key]) == 1
        assert await backend.get_into([key], [dst]) == [True]
        assert bytes(pool.record_view(dst)) == records[key]
        assert backend.indexed() == {path.name: backend.file_bytes} and backend.used_bytes == backend.file_bytes
        assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
        pool.free([src, dst])
    assert_settled(pool, free_before)


async def test_a_directory_with_files_under_a_page_name_refuses_the_put(pool, tmp_path):
    """A directory that holds files is not removed (they are nobody's to delete here): the put is
    refused (False, counted), and the directory stays as it was."""
    free_before = pool.free_slots
    async with open_backend(f"file://{tmp_path}/store?fsync=false&o_direct=false", pool) as backend:
        [key] = new_keys(1)
        path = place(backend, key, _directory)
        src = pool.allocate(1)
        fill_and_seal(pool, src, [key])
        assert await backend.put_from([key], src) == [False]
        assert (backend.stats.put_rejected, backend.stats.errors) == (1, 0)
        assert (path / "inside").read_bytes() == b"someone's file"
        assert backend.used_bytes == 0
        pool.free(src)
    assert_settled(pool, free_before)


async def test_another_readers_page_under_the_name_stays_and_the_put_says_so(pool, tmp_path):
    """An intact record of another spec naming this very key is another reader's page: it stays,
    and the put reports False (nothing of ours was stored) instead of True."""
    free_before = pool.free_slots
    async with open_backend(f"file://{tmp_path}/store?fsync=false&o_direct=false", pool) as backend:
        [key] = new_keys(1)
        path = backend.path_of(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        theirs = _record_of(FOREIGN_READERS["other_layer_range"], key)
        path.write_bytes(_padded(theirs, backend.file_bytes))
        src = pool.allocate(1)
        fill_and_seal(pool, src, [key])
        assert await backend.put_from([key], src) == [False]
        assert backend.stats.put_rejected == 1
        assert path.read_bytes()[:len(theirs)] == theirs
        pool.free(src)
    assert_settled(pool, free_before)


async def test_one_bad_name_no_longer_cuts_the_run_of_every_later_page(pool, tmp_path):
    """Keys are chained: a page missing from L3 ends the run ``exists`` reports for every later one.
    A FIFO and a garbage file under two names of a run are replaced by the run's put."""
    free_before = pool.free_slots
    async with open_backend(f"file://{tmp_path}/store?fsync=false&o_direct=false", pool) as backend:
        keys = new_keys(6)
        place(backend, keys[1], _fifo)
        backend.path_of(keys[3]).parent.mkdir(parents=True, exist_ok=True)
        backend.path_of(keys[3]).write_bytes(os.urandom(4096))
        src = pool.allocate(6)
        records = fill_and_seal(pool, src, keys)
        assert await backend.put_from(keys, src) == [True] * 6
        assert await backend.exists(keys) == 6
        pool.free(src)
        dst = pool.allocate(6)
        assert await backend.get_into(keys, dst) == [True] * 6
        assert [bytes(pool.record_view(s)) for s in dst] == [records[k] for k in keys]
        pool.free(dst)
    assert_settled(pool, free_before)


async def test_reads_and_inspect_give_one_verdict(pool, tmp_path):
    """What ``tiered-kv inspect`` calls corrupt, a read counts as corrupt (and deletes); what it
    lists as no record, a read counts as a foreign miss (and leaves): for a FIFO, and for another
    spec's record under a name that is not its page's."""
    from tiered_kv.ops.store_inspect import inspect_backend

    free_before = pool.free_slots
    url = f"file://{tmp_path}/store?fsync=false&o_direct=false"
    async with open_backend(url, pool) as backend:
        fifo_key, misplaced_key, its_key = new_keys(3)
        fifo = place(backend, fifo_key, _fifo)
        misplaced = backend.path_of(misplaced_key)
        misplaced.parent.mkdir(parents=True, exist_ok=True)
        misplaced.write_bytes(_record_of(FOREIGN_READERS["other_layer_range"], its_key))
    async with FileBackend.open_for_reading(f"file://{tmp_path}/store") as reader:
        found = await inspect_backend(reader, verify=True)
    assert [f.name for f in found.not_records] == [reader.stored_name(fifo_key)]
    assert [f.name for f in found.corrupt] == [reader.stored_name(misplaced_key)]
    async with open_backend(url, pool) as backend:
        dst = pool.allocate(2)
        assert await backend.get_into([fifo_key], dst[:1]) == [False]
        assert await backend.get_into([misplaced_key], dst[1:]) == [False]
        assert (backend.stats.foreign, backend.stats.corrupt) == (1, 1)
        assert fifo.exists() and not misplaced.exists()
        pool.free(dst)
    assert_settled(pool, free_before)
