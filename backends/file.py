"""``file://``: one file per page record under a directory meant for a local SSD.

URL: ``file:///mnt/nvme/kv?capacity_bytes=2TiB&o_direct=true&fsync=true&workers=8``.

- Names: a file is named by the sha-256 of its key (two hex levels of fan-out), so no key can
  escape the directory or collide with a path; the key itself is checked from the record header.
- Writes are atomic: the whole 4 KiB-padded slot goes to a temp file in the same directory, is
  fsynced (``fsync=true``), then hard-linked to its name. ``link`` fails if the name exists, which
  makes put-if-absent race-free across processes; there is never a half page under a real name.
  Disk full or a write error: the temp file is removed and the put reports False.
- Reads land directly in the host slot (``readinto`` the slot; with ``o_direct`` the whole padded
  slot, which is 4 KiB aligned in address and length). Where the filesystem refuses O_DIRECT
  (tmpfs) the backend falls back to buffered I/O and says so in ``direct_io``. A record in parts
  (a ``BoundPool`` slot over an engine's host pool) moves with one ``readv`` / ``writev`` of its
  parts: direct where every part is 4 KiB aligned; else reads are buffered, and writes under
  direct I/O go through the slot's own aligned memory (``_write_parts`` says why).
- Capacity in bytes with least-recently-used eviction; the index is rebuilt from the directory
  (mtime order) on open, so pages survive a restart of the process (and trimmed to the capacity).
  Under any concurrency of this backend's workers, the bytes of page and temp files stay within
  the capacity, every page file is in the index and every indexed page is on disk: a write first
  reserves its bytes (evicting least recently used pages, file and entry together), and its name
  enters the index only once its file is linked; with no room left (the rest reserved by writes in
  flight) the put reports False. Other processes may share the directory: they find each other's
  pages on disk; each evicts only within its own budget.
- A file of another length than this pool's (another spec's page) is read only as far as this
  pool's slot reaches and handed to the base as such, which leaves another reader's page alone.
- Anything else under a page name (a FIFO, a socket, a directory, a device, a symbolic link) is
  no page of any spec: a read answers at once with a counted foreign miss (opened with O_NOFOLLOW
  and O_NONBLOCK, checked with ``fstat``: never a reader stuck in a FIFO's ``open``, never an
  error that degrades the tier), and ``exists`` announces regular files only.
- A put over a name that holds something no reader can use there (no regular file, a dangling
  link, garbage, a record naming another page, of any spec) replaces it: the temp file is renamed
  over it (an empty directory is removed first), so one bad name never stops a page from being
  stored. What stays: this page (present is success), another reader's page (a record of another
  spec or secret naming this key: the put reports False) and a directory with entries (not ours to
  empty: False, with a warning).
- Batches are split across the backend's executor threads; many reads and writes are in flight.

On open, a probe file (created and removed) checks that the directory takes new files: a read-only
or unwritable one is ``BackendNotWritableError`` there, not a store that serves nothing. A store
that turns read-only (or loses its write permission) after open keeps serving what it holds: each
put it refuses reports False (counted in ``put_rejected``, a warning when it starts), never an error
that would put the tier in a degraded state and answer its reads "miss"; the health check of a
degraded tier asks for reads alone (the base's). Stale temp files (from a crash)
older than ``stale_temp_s`` are removed on open.
``FileBackend.open_for_reading(url)`` (for ``tiered-kv inspect``) opens the directory read-only and
key-only: no directory made, no probe file, no temp file removed, nothing evicted or deleted;
``scan`` lists the page files and ``read_stored`` reads them buffered.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import hashlib
import logging
import os
import secrets
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import unquote

from pydantic import Field

from ..errors import BackendError, BackendNotWritableError, BackendUnavailableError, ConfigError, PoolError, RecordError
from ..model import record
from ..model.sizes import ALIGN, round_up
from .base import Backend, Capabilities, NotARecord, OtherLength, matches_read, read_length
from .url_options import MAX_TTL_S, ByteSize, TimeoutSeconds, Workers, check_fields, options_from_url, split_url

if TYPE_CHECKING:  # annotations only: the host pool needs torch, listing a store does not
    from ..model.host_pool import HostPool

log = logging.getLogger(__name__)

SUFFIX = ".page"
TEMP_PREFIX = ".tmp-"
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# Writes refused for good: a read-only filesystem, a directory without write permission (or immutable).
_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
# mkdir of the store's directory failed because of the path itself, not the medium.
_BAD_PATH = (errno.EEXIST, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EINVAL)


@dataclass(frozen=True)
class FileOptions:
    """Field constraints are pydantic ``Annotated`` metadata (see ``url_options``)."""

    path: str
    capacity_bytes: ByteSize = 0  # 0: bounded only by the disk
    o_direct: bool = True  # L2 is the cache: the page cache would hold pages twice
    fsync: bool = True
    workers: Workers = 8
    timeout_s: TimeoutSeconds = 60.0
    # > 0: a temp file younger than this may be another process's write in progress.
    stale_temp_s: Annotated[float, Field(gt=0, le=MAX_TTL_S, allow_inf_nan=False)] = 600.0

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.path or not os.path.isabs(self.path):
            raise ConfigError(f"file backend: path must be absolute, got {self.path!r} (use file:///abs/dir)")

    @classmethod
    def from_url(cls, url: str, overrides: dict[str, Any] | None = None) -> "FileOptions":
        """The options of ``file:///abs/dir?key=value`` (then ``overrides``), without opening anything."""
        parts = split_url(url)
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"{url}: file URLs name a local directory (file:///abs/dir), not host {parts.netloc!r}")
        return options_from_url(cls, url, overrides, path=unquote(parts.path))


def _checked_root(path: str) -> Path:
    """The store's directory as a Path; ConfigError for what no filesystem call takes."""
    if "\0" in path:
        raise ConfigError(f"file backend: path {path!r} contains a NUL byte")
    try:
        os.fsencode(path)
    except UnicodeError as exc:
        raise ConfigError(f"file backend: path {path!r} cannot be encoded for this filesystem: {exc}") from None
    return Path(path)


def page_name(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class FileBackend(Backend):
    scheme = "file"
    capabilities = Capabilities(zero_copy=True, persistent=True, shared_across_processes=True, shared_across_nodes=False,
                                compares_before_delete=True)
    moves_parts = True

    def __init__(self, pool: HostPool | None, options: FileOptions, *, read_only: bool = False) -> None:
        if read_only and pool is not None:
            raise PoolError("a read-only file backend is key-only: open it without a host pool")
        super().__init__(pool, max_workers=options.workers, timeout_s=options.timeout_s)
        self.options = options
        self.root = _checked_root(options.path)
        self._root_str = str(self.root)
        self.read_only = read_only
        if not read_only:
            self.stats.evictions = 0  # it evicts for room itself (capacity_bytes): counted
        if read_only:
            # For tools that only look: no directory made, no probe file, no stale temp file
            # removed, nothing evicted; there is no index to keep, nothing is written.
            self._index, self._used, self._in_flight, self._lock = OrderedDict(), 0, 0, threading.Lock()
            self.file_bytes = None
            self.direct_io = False
            if not self.root.is_dir():
                self._executor.shutdown(wait=False)
                raise ConfigError(f"file backend: {self.root} is no directory: there is no store to read")
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if exc.errno in _BAD_PATH:
                raise ConfigError(f"file backend: {self.root} cannot be the store's directory: {exc}") from exc
            raise BackendUnavailableError(f"file backend: cannot create {self.root}: {exc}") from exc
        # Whole padded slots, so direct I/O works both ways. Only data calls read it: a key-only
        # backend (no pool) finds pages by name alone.
        self.file_bytes = pool.slot_bytes if pool is not None else None
        # The capacity account, all under _lock: _index holds linked page files only (name ->
        # bytes, least recent first), _used is their sum, _in_flight the bytes reserved by writes
        # whose files are not linked yet, and _used + _in_flight <= capacity. A page file and its
        # entry are only added (link) or removed (evict, delete) together under the lock.
        self._index: OrderedDict[str, int] = OrderedDict()
        self._used = 0
        self._in_flight = 0
        self._lock = threading.Lock()
        self._writes_refused = False  # the store refused a write for good (read-only, say): logged once
        # A store that cannot take a page is refused here, once, rather than put in a degraded
        # tier by every write of the run (BackendNotWritableError).
        self.direct_io = probe_store(self.root, o_direct=options.o_direct)
        self._scan()

    @classmethod
    def from_url(cls, url: str, pool: HostPool | None, **options: Any) -> "FileBackend":
        return cls(pool, FileOptions.from_url(url, options))

    @classmethod
    def open_for_reading(cls, url: str) -> "FileBackend":
        """Read-only and key-only: ``scan`` / ``read_stored`` / ``exists``; the directory must exist."""
        return cls(None, FileOptions.from_url(url, {}), read_only=True)

    # --- layout on disk ----------------------------------------------------------------------
    def path_of(self, key: str) -> Path:
        name = page_name(key)
        return self.root / name[:2] / (name + SUFFIX)

    def _file_of(self, key: str) -> tuple[str, str, str]:
        """``key``'s fan-out directory, file name and path, as strings. The per-page calls use
        these, not ``path_of``: pathlib (CPython 3.11) interns every part of every path it builds,
        so a ``Path`` per page name churns the interpreter's table of interned strings, whose
        resizes (megabytes) then land in whichever worker thread's malloc arena made them, and
        each arena keeps that much free for good: the process grows with the pages written."""
        name = page_name(key) + SUFFIX
        directory = os.path.join(self._root_str, name[:2])
        return directory, name, os.path.join(directory, name)

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def capacity_pages(self) -> int | None:
        """Page files the capacity holds (None: bounded only by the disk, or no pool to size pages)."""
        if not self.options.capacity_bytes or not self.file_bytes:
            return None
        return self.options.capacity_bytes // self.file_bytes

    def indexed(self) -> dict[str, int]:
        """A snapshot of the LRU index: page file name -> bytes, least recently used first."""
        with self._lock:
            return dict(self._index)

    def _scan(self) -> None:
        """Rebuild the LRU index from the directory, trimmed to the capacity; drop stale temp files."""
        found = []
        now = time.time()
        try:
            for sub in os.scandir(self.root):
                if sub.name.startswith(TEMP_PREFIX):
                    self._remove_if_stale(Path(sub.path), now)
                    continue
                if len(sub.name) != 2 or not sub.is_dir():
                    continue
                for entry in os.scandir(sub.path):
                    if entry.name.startswith(TEMP_PREFIX):
                        self._remove_if_stale(Path(entry.path), now)
                    elif entry.name.endswith(SUFFIX) and entry.is_file(follow_symlinks=False):
                        try:
                            st = entry.stat()
                        except FileNotFoundError:
                            continue  # evicted by another process meanwhile
                        found.append((st.st_mtime, entry.name, st.st_size))
            for _, name, size in sorted(found):
                self._index[name] = size
                self._used += size
            with self._lock:
                while self.options.capacity_bytes and self._used > self.options.capacity_bytes:
                    self._evict_oldest()
        except OSError as exc:
            raise BackendUnavailableError(f"file backend: cannot read the store at {self.root}: {exc}") from exc

    def _remove_if_stale(self, path: Path, now: float) -> None:
        try:
            if now - path.stat().st_mtime > self.options.stale_temp_s:
                path.unlink()
        except FileNotFoundError:
            pass

    # --- listing, for inspection (reads only) -------------------------------------------------
    def stored_name(self, key: str) -> str:
        return str(self.path_of(key).relative_to(self.root))

    def stored_length(self, record_bytes: int) -> int:
        return round_up(record_bytes)  # whole 4 KiB-padded slots, as _write_one stores them

    async def scan(self) -> AsyncIterator[tuple[str, int | None]]:
        """Page files (``ab/<sha-256>.page``) with their sizes; temp files (writes in progress) and
        anything outside the two-hex fan-out are not the store's. Other files under a page name
        (a directory, a socket) are listed with bytes None."""
        subdirs = await self.run_blocking(self._fan_out_dirs)
        for sub in subdirs:
            for item in await self.run_blocking(self._pages_in, sub):
                yield item

    def _fan_out_dirs(self) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(self.root) if len(e.name) == 2 and e.is_dir(follow_symlinks=False))
        except OSError as exc:
            raise BackendUnavailableError(f"file backend: cannot list {self.root}: {exc}") from exc

    def _pages_in(self, sub: str) -> list[tuple[str, int | None]]:
        found: list[tuple[str, int | None]] = []
        try:
            entries = sorted(os.scandir(self.root / sub), key=lambda e: e.name)
        except FileNotFoundError:
            return found  # emptied and removed meanwhile
        except OSError as exc:
            raise BackendUnavailableError(f"file backend: cannot list {self.root / sub}: {exc}") from exc
        for entry in entries:
            if not entry.name.endswith(SUFFIX) or entry.name.startswith(TEMP_PREFIX):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # evicted meanwhile
            except OSError as exc:
                raise BackendUnavailableError(f"file backend: cannot stat {entry.path}: {exc}") from exc
            found.append((f"{sub}/{entry.name}", st.st_size if stat.S_ISREG(st.st_mode) else None))
        return found

    async def read_stored(self, name: str, length: int | None = None) -> bytes | None | NotARecord:
        sub, _, file_name = name.partition("/")
        if len(sub) != 2 or not file_name.endswith(SUFFIX) or "/" in file_name or file_name.startswith("."):
            raise ConfigError(f"file backend: {name!r} is no stored page name (ab/<sha-256>.page, as scan lists them)")
        return await self.run_blocking(self._read_stored, self.root / sub / file_name, length)

    @staticmethod
    def _read_stored(path: Path, length: int | None) -> bytes | None | NotARecord:
        # Buffered and read-only: a look at the store must not need aligned buffers, nor change it.
        try:
            fd = open_page_file(path, 0)
        except FileNotFoundError:
            return None
        except NotRegularFile as exc:
            return NotARecord(str(exc))
        except OSError as exc:
            raise BackendUnavailableError(f"file backend: opening {path}: {exc}") from exc
        try:
            st = os.fstat(fd)
            want = st.st_size if length is None else min(length, st.st_size)
            chunks, got = [], 0
            while got < want:
                chunk = os.pread(fd, want - got, got)
                if not chunk:
                    break  # the file shrank under us
                chunks.append(chunk)
                got += len(chunk)
            return b"".join(chunks)
        except OSError as exc:
            raise BackendUnavailableError(f"file backend: reading {path}: {exc}") from exc
        finally:
            os.close(fd)

    # --- blocking work, run on the executor --------------------------------------------------
    def _aligned_parts(self, slot: int) -> bool:
        """Whether every part of ``slot``'s record is 4 KiB aligned in address and length, as
        direct I/O needs (a plain slot always is; an engine's ranges may be)."""
        return all(address % ALIGN == 0 and size % ALIGN == 0 for address, size in self.pool.part_addresses(slot))

    def _read_parts(self, slot: int) -> tuple[list[memoryview], int, bool]:
        """Where a get reads a page file into ``slot``, the open flags, and whether what lands
        there is then copied into the slot's record parts: the whole padded slot for direct I/O
        (aligned reads), else the record's parts (one view, or a bound slot's header and ranges:
        read straight where they are aligned or direct I/O is off; with direct I/O and unaligned
        parts, into the slot's own aligned memory first, as ``_write_parts`` writes them)."""
        if self.pool.is_contiguous(slot):
            if self.direct_io:
                return [self.pool.slot_view(slot)], os.O_DIRECT, False
            return [self.pool.record_view(slot)], 0, False
        if not self.direct_io:
            return self.pool.record_parts(slot), 0, False
        if self._aligned_parts(slot):
            return self.pool.record_parts(slot), os.O_DIRECT, False
        return [self.pool.own_slot_view(slot)], os.O_DIRECT, True

    def _read_view(self, slot: int) -> memoryview | bytes:
        """What a get read into ``slot``, as one buffer (for the compare before a delete)."""
        if self.pool.is_contiguous(slot) and self.direct_io:
            return self.pool.slot_view(slot)
        return self.pool.record_contents(slot)

    def _write_parts(self, slot: int) -> tuple[list[memoryview], int]:
        """What a put writes for ``slot``, and the open flags: always ``file_bytes``, the record then
        its padding, whichever pool wrote it. A bound slot's parts go out as they are where they are
        aligned or direct I/O is off; with direct I/O and unaligned parts (DSA's indexer rows, an
        engine buffer off a page boundary) the record is first copied into the slot's own aligned
        memory: one contiguous copy, where buffered writes of the parts ran at a third to a half of
        the rate (docs/benchmarks.md, "SGLang HiCache storage backend")."""
        if self.pool.is_contiguous(slot):
            return [self.pool.slot_view(slot)], os.O_DIRECT if self.direct_io else 0
        if self.direct_io and self._aligned_parts(slot):
            return self.pool.record_parts(slot), os.O_DIRECT  # aligned lengths: no padding to add
        if self.direct_io:
            bounce = self.pool.own_slot_view(slot)
            done = 0
            for part in self.pool.record_parts(slot):
                bounce[done:done + len(part)] = part
                done += len(part)
            bounce[done:] = bytes(len(bounce) - done)
            return [bounce], os.O_DIRECT
        return [*self.pool.record_parts(slot), memoryview(bytes(self.file_bytes - self.pool.record_bytes))], 0

    def _read_one(self, key: str, slot: int) -> bool | OtherLength | NotARecord:
        _, name, path = self._file_of(key)
        parts, flags, bounced = self._read_parts(slot)
        try:
            fd = open_page_file(path, flags)
        except FileNotFoundError:
            return False
        except NotRegularFile as exc:
            return NotARecord(str(exc))
        try:
            st = os.fstat(fd)
            # Never past the slot: a larger file is another spec's page, of which the header
            # (its first bytes) is all the base needs. One read for a short file, so direct I/O
            # never reads from an unaligned offset.
            room = sum(len(part) for part in parts)
            want = min(st.st_size, room)
            got = 0
            while got < want:
                n = os.readv(fd, _after(parts, got, room))  # whole buffers: direct I/O reads aligned lengths
                if n == 0:
                    break  # the file shrank under us: what landed is all there is
                got += n
        finally:
            os.close(fd)
        if bounced:
            self.pool.fill_record(slot, parts[0][:min(got, self.pool.record_bytes)])
        with self._lock:
            if name in self._index:
                self._index.move_to_end(name)
        if st.st_size == self.file_bytes and got == want:
            return True
        return OtherLength(got if got < want else st.st_size, self.file_bytes)

    def _write_one(self, key: str, slot: int) -> bool:
        directory, file_name, path = self._file_of(key)
        try:
            occupant = self._occupant(path, key)
        except OSError as exc:
            if exc.errno in _NOT_WRITABLE:  # an empty directory it could not remove
                return self._refuse_write(path, exc)
            raise
        if occupant is not _Occupant.NOTHING and occupant is not _Occupant.UNUSABLE:
            return occupant is _Occupant.THIS_PAGE  # present is success; another reader's page stays
        size = self.file_bytes
        if not self._reserve(size):
            return False
        temp: str | None = None
        linked = False
        try:
            try:
                os.mkdir(directory)
            except FileExistsError:
                pass
            name = os.path.join(directory, f"{TEMP_PREFIX}{file_name}-{secrets.token_hex(6)}")
            parts, flags = self._write_parts(slot)
            fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | flags, 0o644)
            # Only a temp file that exists is removed below: on a read-only filesystem even the
            # unlink of an absent name fails (EROFS), and would turn a refused put into an error.
            temp = name
            try:
                total = sum(len(part) for part in parts)
                written = 0
                while written < total:
                    written += os.writev(fd, _after(parts, written, total))
                if self.options.fsync:
                    # Data (and the size) before the name: after a crash a name never points
                    # at a half page. The directory entry itself may be lost: it is a cache.
                    os.fdatasync(fd)
            finally:
                os.close(fd)
            with self._lock:
                if occupant is _Occupant.UNUSABLE:
                    # Atomically over the file, link, FIFO or socket no reader can use (an empty
                    # directory was removed): a page another writer put meanwhile is the same page.
                    os.rename(temp, path)
                    linked = True
                    replaced = self._index.pop(file_name, None)
                    self._used -= replaced or 0
                else:
                    try:
                        os.link(temp, path)
                    except FileExistsError:
                        pass  # another writer won: records are immutable, so that is success
                    else:
                        linked = True
                if self._writes_refused:
                    self._writes_refused = False
                    log.warning("file backend: %s takes pages again", self.root)
                if linked:
                    # The reservation becomes the page's entry, in the same step as its name.
                    self._in_flight -= size
                    self._index[file_name] = size
                    self._used += size
        except OSError as exc:
            if exc.errno in _FULL:
                return False
            if exc.errno in _NOT_WRITABLE:
                return self._refuse_write(path, exc)
            raise BackendUnavailableError(f"file backend: writing {path}: {exc}") from exc
        finally:
            try:
                if temp is not None:
                    _unlink_if_there(temp)
            finally:
                if not linked:  # only now: the temp file's bytes counted until it was gone
                    with self._lock:
                        self._in_flight -= size
        return True

    def _refuse_write(self, path: Path | str, exc: OSError) -> bool:
        """A put the medium refuses for good (a read-only remount, lost permission): False, a
        counted rejection, not an error. An error would put the tier in a degraded state, whose
        reads answer "miss" while this store could still serve every page it holds."""
        if not self._writes_refused:
            self._writes_refused = True
            log.warning("file backend: %s refuses writes (%s): puts are refused, reads go on", self.root,
                        exc.strerror or exc)
        return False

    def _occupant(self, path: Path | str, key: str) -> "_Occupant":
        """What holds ``key``'s name now, as a put must know: nothing, this page, another reader's
        page (a record of another spec or secret naming ``key``), or something no reader can use
        there (no regular file, garbage, a record naming another page, a damaged length). An empty
        directory is removed here; one with entries is ``BUSY_DIRECTORY``: not ours to empty."""
        try:
            fd = open_page_file(path, 0)
        except FileNotFoundError:
            return _Occupant.NOTHING
        except NotRegularFile:
            if not os.path.isdir(path) or os.path.islink(path):
                return _Occupant.UNUSABLE
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                log.warning("file backend: %s is a directory with entries under a page's name; its page is not "
                            "stored", path)
                return _Occupant.BUSY_DIRECTORY
            return _Occupant.NOTHING
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, record.HEADER_BYTES, 0)
        finally:
            os.close(fd)
        spec, record_key = self.pool.spec, self.pool.record_key
        if size == self.file_bytes and record.is_sealed_for(head, fingerprint=spec.fingerprint, key=key,
                                                            record_key=record_key):
            return _Occupant.THIS_PAGE
        try:
            header = record.read_header(head)
        except RecordError:
            return _Occupant.UNUSABLE
        own_secret = None if record_key is None else record_key.key_id
        if header.key == key and (header.fingerprint != spec.fingerprint
                                  or (header.keyed and header.key_id != own_secret)):
            return _Occupant.OTHER_READERS
        return _Occupant.UNUSABLE

    def _reserve(self, size: int) -> bool:
        """Reserve ``size`` bytes for a write, evicting least recently used pages if needed.

        False when the page cannot fit: larger than the capacity, or the room left is reserved
        by writes still in flight (only linked pages are ever victims).
        """
        capacity = self.options.capacity_bytes
        with self._lock:
            if capacity:
                if size > capacity:
                    return False
                while self._used + self._in_flight + size > capacity and self._index:
                    self._evict_oldest()
                if self._used + self._in_flight + size > capacity:
                    return False
            self._in_flight += size
        return True

    def _evict_oldest(self) -> None:
        """Remove the least recently used page, file and entry together. Caller holds ``_lock``."""
        name, size = next(iter(self._index.items()))
        _unlink_if_there(os.path.join(self._root_str, name[:2], name))  # raises: the entry stays, as the file may
        del self._index[name]
        self._used -= size
        self.stats.evictions = (self.stats.evictions or 0) + 1

    def _delete_one(self, key: str) -> None:
        _, name, path = self._file_of(key)
        with self._lock:  # so no put links the name between the unlink and the entry's removal
            _unlink_if_there(path)
            size = self._index.pop(name, None)
            if size is not None:
                self._used -= size

    def _delete_if_as_read(self, key: str, slot: int, other: OtherLength | None) -> None:
        """Delete ``key``'s file only while it holds what a get read into ``slot``. The file is
        renamed aside first (one atomic step against every process), compared there, and linked
        back under its name when it differs: a page put again since the read, or an intact one
        whose read was damaged, stays (and a page another process linked under the name
        meanwhile wins over the one linked back). Under ``_lock``, as ``_delete_one``: no put of
        this process links the name in between."""
        path = self.path_of(key)
        view = self._read_view(slot)
        aside = path.parent / f"{TEMP_PREFIX}{path.name}-corrupt-{secrets.token_hex(6)}"
        with self._lock:
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                return  # deleted meanwhile
            try:
                with open(aside, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    stored = f.read(len(view))  # never more than the slot: a huge file is read no further
                if matches_read(stored, size, view, read_length(other, self.file_bytes)):
                    entry = self._index.pop(path.name, None)
                    if entry is not None:
                        self._used -= entry
                    return
                try:
                    os.link(aside, path)
                except FileExistsError:
                    pass  # a newer page took the name: it stays, and the index still counts one page there
            finally:
                aside.unlink(missing_ok=True)

    def _batch(self, fn, keys: list[str], slots: list[int]) -> list:
        try:
            return [fn(k, s) for k, s in zip(keys, slots)]
        except BackendError:
            raise
        except OSError as exc:
            raise BackendUnavailableError(f"file backend at {self.root}: {exc}") from exc

    async def _spread(self, fn, keys: list[str], slots: list[int], *, hold: bool) -> list:
        """Split a batch over the executor's workers; results in key order."""
        workers = self.options.workers
        step = max(1, -(-len(keys) // workers))
        parts = [(keys[i:i + step], slots[i:i + step]) for i in range(0, len(keys), step)]
        results = await asyncio.gather(*(
            self.run_blocking(self._batch, fn, k, s, hold_slots=s if hold else ()) for k, s in parts
        ))
        return [r for part in results for r in part]

    # --- primitives --------------------------------------------------------------------------
    async def _exists(self, keys: list[str]) -> list[bool]:
        return await self.run_blocking(self._batch, lambda k, _s: is_page_file(self._file_of(k)[2]), keys, [0] * len(keys))

    async def _get(self, keys: list[str], slots: list[int]) -> list[bool | OtherLength | NotARecord]:
        return await self._spread(self._read_one, keys, slots, hold=True)

    async def _put(self, keys: list[str], slots: list[int]) -> list[bool]:
        # Held too: a write reads the slot's parts (an engine's pages, for a bound slot) and may
        # bounce them through the slot's own memory until its thread returns.
        return await self._spread(self._write_one, keys, slots, hold=True)

    async def _delete(self, keys: list[str]) -> None:
        if self.read_only:
            raise BackendError(f"file backend at {self.root} was opened read-only: it deletes nothing")
        await self._spread(lambda k, _s: self._delete_one(k), keys, [0] * len(keys), hold=False)

    async def _delete_corrupt(self, found: list[tuple[str, int, OtherLength | None]]) -> None:
        if self.read_only:
            await self._delete([key for key, _, _ in found])  # refused, as every delete of a read-only store
            return
        others = {key: other for key, _, other in found}
        # The slots hold what was read until the compare: held in the pool like a get's.
        await self._spread(lambda k, s: self._delete_if_as_read(k, s, others[k]), [k for k, _, _ in found],
                           [s for _, s, _ in found], hold=True)


def _after(parts: list[memoryview], done: int, total: int) -> list[memoryview]:
    """The buffers of ``parts`` from byte ``done`` up to byte ``total``, for the next ``readv`` /
    ``writev`` of a transfer that moved ``done`` bytes so far."""
    rest = []
    start = 0
    for part in parts:
        end = min(start + len(part), total)
        if end > done:
            rest.append(part[max(done - start, 0):end - start])
        start += len(part)
        if start >= total:
            break
    return rest


class NotRegularFile(OSError):
    """``open_page_file``'s answer for a name that holds no regular file: a FIFO, a socket, a
    directory, a device, a symbolic link (dangling or not). The store never makes one."""


# What open(2) answers for a name that is no regular file: a symbolic link under O_NOFOLLOW, a
# socket, a directory (under O_DIRECT, or opened for writing), a device without its driver.
_OPEN_NOT_A_FILE = (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EINVAL, errno.ENODEV, errno.EOPNOTSUPP)


def _unlink_if_there(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def is_page_file(path: Path | str) -> bool:
    """Whether ``path`` is a regular file (not following a symbolic link): what may hold a page."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def open_page_file(path: Path | str, flags: int) -> int:
    """Open ``path`` for reading (with extra ``flags``) only if it is a regular file; NotRegularFile
    otherwise, FileNotFoundError where nothing is there.

    Without following a symbolic link and without blocking: a FIFO under a page name would hold its
    reader in ``open`` until a writer came (for ever, after the backend's close); a socket (ENXIO)
    or a directory under O_DIRECT (EINVAL) would fail as if the medium did. ``fstat`` of the open
    file decides, so a name swapped between the two calls is caught too.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | flags)
    except OSError as exc:
        if exc.errno in _OPEN_NOT_A_FILE and os.path.lexists(path) and not is_page_file(path):
            raise NotRegularFile(exc.errno, f"{path} is not a regular file ({exc.strerror})") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, f"{path} is not a regular file ({stat.filemode(mode)})")
    return fd


class _Occupant(enum.Enum):
    """What a put finds under its page's name (``FileBackend._occupant``)."""

    NOTHING = "nothing"
    THIS_PAGE = "this page"
    OTHER_READERS = "another reader's page"  # stays; the put reports False
    BUSY_DIRECTORY = "a directory with entries"  # stays; the put reports False
    UNUSABLE = "no record any reader looks for here"  # the put replaces it


def probe_store(root: Path, *, o_direct: bool) -> bool:
    """Check that the directory ``root`` takes new files, with a probe file that is removed again;
    returns whether it also takes O_DIRECT (tmpfs does not), asked only where ``o_direct``.

    A directory that refuses the probe for good (read-only filesystem, no permission) is
    BackendNotWritableError, any other failure BackendUnavailableError. A full disk refuses the
    probe too, but not for good (eviction makes room): buffered I/O, no error.
    """
    probe = root / f"{TEMP_PREFIX}probe-{secrets.token_hex(4)}"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except OSError as exc:
        if exc.errno in _FULL:
            return False
        if exc.errno in _NOT_WRITABLE:
            raise BackendNotWritableError(f"file backend: {root} cannot be written ({exc.strerror}): a store must "
                                          "take pages; give it a writable directory") from exc
        raise BackendUnavailableError(f"file backend: cannot write a probe file in {root}: {exc}") from exc
    try:
        if not (o_direct and hasattr(os, "O_DIRECT")):
            return False
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_DIRECT))
        except OSError:
            return False
        return True
    finally:
        try:
            probe.unlink()
        except OSError as exc:
            raise BackendUnavailableError(f"file backend: cannot remove the probe file {probe}: {exc}") from exc


def direct_io_works(root: Path) -> bool:
    """Whether the filesystem under ``root`` takes O_DIRECT: ``probe_store``'s answer (and its
    errors for a directory that cannot be written)."""
    return probe_store(root, o_direct=True)
