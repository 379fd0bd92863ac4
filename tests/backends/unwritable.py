"""Test helper: a directory that refuses writes, also to root (the suite runs as root, for whom
``chmod`` blocks nothing).

``read_only(directory)`` mounts a read-only tmpfs over ``directory`` (writes fail with EROFS, as
on a filesystem remounted read-only); where this sandbox may not mount, it sets the immutable
attribute on the directory and everything under it (``chattr -R +i``: EPERM). Both are undone on
exit; the test is skipped where neither works. Paths resolved after the switch meet the read-only
directory, so a backend opened before it finds its store unwritable from then on.

``frozen(directory)`` makes the directory read-only with what it holds still readable: a read-only
bind mount of itself (EROFS, as a filesystem remounted read-only after errors), else ``chattr``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _run(*command: str) -> bool:
    if shutil.which(command[0]) is None:
        return False
    return subprocess.run(command, capture_output=True).returncode == 0


@contextmanager
def read_only(directory: Path) -> Iterator[str]:
    """``directory`` (which must exist) refuses new entries while inside; yields how: "mount" or "chattr"."""
    d = str(directory)
    if _run("mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", d):
        try:
            yield "mount"
        finally:
            _run("umount", "-l", d)  # lazy: a backend may still hold the directory open
        return
    if _run("chattr", "-R", "+i", d):
        try:
            yield "chattr"
        finally:
            _run("chattr", "-R", "-i", d)
        return
    pytest.skip("this machine lets the test neither mount a read-only tmpfs nor set chattr +i")


@contextmanager
def frozen(directory: Path) -> Iterator[str]:
    """``directory`` and everything under it refuse writes while inside, and its files still read;
    yields how: "mount" or "chattr"."""
    d = str(directory)
    if _run("mount", "--bind", d, d):
        if _run("mount", "-o", "remount,ro,bind", d, d):
            try:
                yield "mount"
            finally:
                _run("umount", "-l", d)
            return
        _run("umount", "-l", d)
    if _run("chattr", "-R", "+i", d):
        try:
            yield "chattr"
        finally:
            _run("chattr", "-R", "-i", d)
        return
    pytest.skip("this machine lets the test neither bind-mount a directory read-only nor set chattr +i")
