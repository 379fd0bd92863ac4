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

from .contract import SPEC, fill_and_seal, new_keys


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

