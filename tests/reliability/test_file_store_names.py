"""A file store whose page names hold what no reader can use: FIFOs, sockets, directories, links to
a device or to nothing, garbage, another page's record. Replays over it are served in full, at
once (no read waits for a FIFO's writer, the tier never degrades), and their puts take the names
back, so the next replay hits L3 as one over an intact store does."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tiered_kv.backends.file import SUFFIX
from tiered_kv.ops.replay import synthetic_chat

from ..ops.replay.conftest import TINY_CHAT
from .conftest import Outcome, guarded_replay, report

#: One page name in this many gets the fault.
EVERY = 5


def _fifo(path: Path, _other: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path, _other: Path) -> None:
    short = Path(tempfile.mkdtemp(prefix="tkv-", dir="/tmp"))  # a socket's path is at most 107 bytes
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(short / "s"))
        sock.close()
        os.rename(short / "s", path)
    finally:
        short.rmdir()


def _empty_directory(path: Path, _other: Path) -> None:
    path.mkdir()


def _device_link(path: Path, _other: Path) -> None:
    path.symlink_to("/dev/zero")


def _dangling_link(path: Path, _other: Path) -> None:
    path.symlink_to(path.parent / "nowhere")


def _garbage(path: Path, _other: Path) -> None:
    path.write_bytes(os.urandom(path.stat(follow_symlinks=False).st_size if path.exists() else 4096))


def _another_pages_record(path: Path, other: Path) -> None:
    shutil.copyfile(other, path)


FAULTS: dict[str, Callable[[Path, Path], None]] = {
    "fifo": _fifo,
    "socket": _socket,
    "empty_directory": _empty_directory,
    "device_link": _device_link,
    "dangling_link": _dangling_link,
    "garbage": _garbage,
    "another_pages_record": _another_pages_record,
}


def page_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(f"*{SUFFIX}") if p.is_file() and not p.is_symlink())


def spoil(root: Path, make: Callable[[Path, Path], None]) -> int:
    """Put the fault under every ``EVERY``-th page name of the store; returns how many."""
    files = page_files(root)
    victims = files[::EVERY]
    for path in victims:
        other = files[(files.index(path) + 1) % len(files)]
        if make is _garbage or make is _another_pages_record:
            make(path, other)  # overwritten in place
            continue
        path.unlink()
        make(path, other)
    return len(victims)


@pytest.fixture(scope="module")
def intact(tmp_path_factory) -> Outcome:
    """A replay over a store an identical replay filled: the L3 hits of an intact store."""
    url = f"file://{tmp_path_factory.mktemp('intact')}/l3?fsync=false"
    guarded_replay(synthetic_chat(TINY_CHAT), url)
    return guarded_replay(synthetic_chat(TINY_CHAT), url)


@pytest.mark.parametrize("fault", FAULTS)
def test_bad_objects_under_page_names(tmp_path, intact, fault):
    root = tmp_path / "l3"
    url = f"file://{root}?fsync=false"
    guarded_replay(synthetic_chat(TINY_CHAT), url)  # fills the store
    spoiled = spoil(root, FAULTS[fault])
    assert spoiled > 0
    started = time.monotonic()
    faulted = guarded_replay(synthetic_chat(TINY_CHAT), url)
    faulted_s = time.monotonic() - started
    assert faulted.summary["l3_degraded_episodes"] == 0 and faulted.backend.errors == 0
    assert faulted_s < 15, "a read waited on a bad name"
    # The bad names were met as misses: ``exists`` counts regular files only, so a lookup's L3 run
    # ends before the first bad name (and a read that meets one counts it foreign or corrupt).
    assert faulted.l3_hit_tokens < intact.l3_hit_tokens
    healed = guarded_replay(synthetic_chat(TINY_CHAT), url)
    assert healed.l3_hit_tokens == intact.l3_hit_tokens, "a bad name was not taken back by a put"
    assert healed.backend.foreign + healed.backend.corrupt == 0
    report({"names_spoiled": spoiled, "requests": faulted.summary["requests"],
                                "pages_wrong": faulted.summary["pages_wrong"], "faulted_s": round(faulted_s, 2),
                                "l3_hit_tokens": [intact.l3_hit_tokens, faulted.l3_hit_tokens, healed.l3_hit_tokens],
                                "counted_misses": faulted.backend.foreign + faulted.backend.corrupt})
