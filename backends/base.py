"""The L3 backend contract, and the machinery every backend shares.

Public, async, batch-first (single-key helpers are built on these):

    exists(keys) -> int               length of the leading run of keys present
    get_into(keys, slots) -> [bool]   records land in page_first slots and are verified there
    put_from(keys, slots) -> [bool]   sealed slots go out; put-if-absent (present = success)
    delete(keys)                      absent keys are fine
    aclose() / async with             stop the executor, close connections

Shared semantics, implemented here once so backends cannot drift:
- a miss is ``False``; a failure raises a ``BackendError`` (mapped with ``raise ... from``);
- a get counts only the leading run of hits: once a key misses, later ones are reported False;
- a slot counts as filled only after its record verifies (``record.verify``). A corrupt, truncated
  or unreadable record is counted (``stats.corrupt``), deleted from the backend and reported as a
  miss; where the backend can compare (``capabilities.compares_before_delete``), only while the
  medium still holds the bytes read, so a page put again since, or an intact one whose read was
  damaged on the way, stays (``_delete_corrupt``). An intact record that names another page key,
  of any spec (or of this spec with a payload size it never writes), is corrupt too
  (``record.MisplacedRecordError``): readers look for a page under its own key's name only, so it
  serves nobody there, and left in place it would be announced by ``exists``, missed by every get
  and never replaced by a put. A *foreign* one (intact, naming this key, but of another spec
  fingerprint: another reader's page, e.g. a pool of another model or layer range on the same
  medium) is counted apart
  (``stats.foreign``), reported as a miss and left where it is: a reader never deletes a page it
  merely cannot use. A pool with a record key (a tenant's secret) also refuses records without
  a valid tag of that key: forged ones are counted apart (``stats.forged``) and deleted as corrupt
  ones are; another secret's are foreign (docs/security.md). A refused record's bytes are wiped
  from the slot they landed in, so a reader never holds a page it was refused;
- only slots sealed for their key are put (``HostPool.is_sealed``), else UnsealedSlotError;
- keys are checked by the one validator (``tiered_kv.model.keys.check_keys``): PageKeyError;
- duplicate keys in one batch are fetched / stored once;
- blocking calls run on the backend's own bounded executor (``run_blocking``); when a caller
  is cancelled or times out, the slots of that call stay held in the pool (``HostPool.hold``)
  until the worker thread has returned, so no late write lands in a slot given to someone else
  and no late read takes bytes from a slot (or an engine's page it is bound to) reused meanwhile;
- hits, misses, corrupt and foreign records, bytes and errors are counted from the start (``stats``).
  ``stats.foreign`` counts misses on records that are intact but not this reader's (another spec
  fingerprint, or an object that is no record at all, see ``NotARecord``): each
  is left in place, never deleted, and the first one of a backend logs a warning, since two specs
  under one key mean two caches share a namespace (``tiered_kv.model.keys.Namespace``).

Key-only backends: ``open_backend(url, None)`` (``Backend(pool=None, ...)``) opens a backend that
holds no host memory, for the metadata half in a process of its own (the scheduler's, with a bare
``SlotAllocator`` for L2): ``exists`` and ``delete`` work as usual, over the same medium and keys
as the workers' backends; ``get_into`` / ``put_from`` raise ``NoHostPoolError`` (a ``PoolError``)
before touching anything. A backend needs its pool only in data calls (file's slot size for direct
I/O, Mooncake's buffer registration and record size): it connects, scans or sets up without one.

A backend subclass implements four primitives on distinct keys: ``_exists``, ``_get``, ``_put``,
``_delete`` (see their docstrings), a ``scheme``, ``capabilities`` and ``from_url``. ``_get`` tells
a stored value of another length than this pool's records (``OtherLength``) and an object that is
no record at all and not ours to delete (``NotARecord``) apart from a plain hit or miss (both
exported from ``tiered_kv.backends`` for backend authors). A subclass reads ``self.pool`` only in
``_get`` / ``_put`` and other data paths (``self.key_only`` says whether there is one), so that it
also opens key-only.

Records in parts: a backend reads and writes a slot's record through ``pool.record_parts(slot)``
(``part_addresses`` where it moves by address, ``record_contents`` / ``fill_record`` where it copies,
``memory_regions`` for what it registers). A plain pool gives one part; a ``BoundPool`` slot bound
to an engine's memory gives its header block and each payload range, so the engine's pages move
with no staging copy. A backend that does so sets ``moves_parts``; one that reads ``record_view``
leaves it False and is given plain slots only.

For inspection (``tiered-kv inspect``), a backend that can list its medium also implements ``scan``
(stored name and size of every object in its namespace) and ``read_stored`` (raw bytes by stored
name), with ``stored_name`` / ``stored_length`` saying where and how long a record of a key is
stored; ``open_for_reading`` opens it without changing anything. Benchmark ceilings of the media
live in ``tiered_kv.ops.bench``, not here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ..model import record
from ..errors import (BackendError, BackendTimeoutError, ConfigError, ForeignRecordError, ForgedRecordError, IndexValidationError,
                      NoHostPoolError, PoolError, RecordError, UnsealedSlotError)
from ..model.keys import check_keys

if TYPE_CHECKING:  # the host pool needs torch; listing or key-only use of a backend does not
    from ..model.host_pool import HostPool

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Capabilities:
    """What a backend can promise. Frozen: decided by the backend class and its config."""

    zero_copy: bool  # records move straight between host slots and the medium
    persistent: bool  # pages survive a restart of every process (and of the server)
    shared_across_processes: bool
    shared_across_nodes: bool
    # A corrupt record is deleted only while the medium still holds the bytes the get read
    # (``Backend._delete_corrupt``); False: deleted whatever is stored under the key by then.
    compares_before_delete: bool = False


@dataclass
class BackendStats:
    """Counters kept from the first call on. Read by metrics and benchmarks."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0  # damaged, truncated, unreadable or misplaced (another page's) records: deleted
    foreign: int = 0  # intact records of another spec, or no record at all: left in place
    forged: int = 0  # records without a valid tag of the pool's record key: deleted, not counted in corrupt
    puts: int = 0
    put_rejected: int = 0  # put returned False: no room, or the medium refused
    bytes_read: int = 0
    bytes_written: int = 0
    errors: int = 0
    #: Records the backend itself evicted to make room (file, memory); None where the medium evicts
    #: on its own and nothing here sees it (Redis' maxmemory, Mooncake's master).
    evictions: int | None = None


@dataclass(frozen=True)
class OtherLength:
    """``_get``'s answer for a stored value of ``length`` bytes where this pool's records are
    stored in ``expected``: the slot's record view holds the value's first bytes (its header,
    where it has one), and the base decides whether it is someone else's record or a damaged one."""

    length: int
    expected: int


def read_length(other: OtherLength | None, full: int) -> int:
    """The stored value's length a get saw: ``other``'s where ``_get`` answered ``OtherLength``,
    else the backend's full record length ``full`` (a hit)."""
    return other.length if other is not None else full


def matches_read(stored, stored_length: int, read, read_length: int) -> bool:
    """Whether a stored value is still the one a get read: ``stored`` its first bytes (at least as
    many as the get read), ``stored_length`` its length on the medium; ``read`` the slot's view the
    get filled and ``read_length`` the value's length the get saw. The same length, and the same
    bytes as far as the read went. ``_delete_corrupt`` deletes only where this holds."""
    stored, read = memoryview(stored).cast("B"), memoryview(read).cast("B")
    n = min(read_length, len(read))
    return stored_length == read_length and len(stored) >= n and stored[:n] == read[:n]


@dataclass(frozen=True)
class NotARecord:
    """``_get``'s answer for an object under the key that is no page record and not ours to delete
    (say, a Redis list): a counted foreign miss, left in place."""

    reason: str


async def all_or_nothing(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Run ``calls`` concurrently; on the first failure (or our cancellation) cancel the rest.

    Unlike ``asyncio.gather``, no call keeps running after this returns or raises: a caller that
    frees its slots after an error can be sure no request of this batch still writes into them.
    """
    tasks = [asyncio.ensure_future(c) for c in calls]
    if not tasks:
        return []
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        if not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]
    return [t.result() for t in tasks]


class Backend(ABC):
    """Base class of every L3 backend. One instance serves one page_first ``HostPool``, or none
    (``pool=None``: a key-only backend, see the module docstring)."""

    scheme: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    #: A cancelled ``get_into`` never writes into its slots afterwards (blocking reads hold them in
    #: the pool until their thread returned, loop-side receives stop): a controller may cancel a
    #: running read and let its slots go at once.
    cancels_reads_safely: ClassVar[bool] = True
    #: Reads and writes a slot's record through ``record_parts`` (a ``BoundPool`` slot in several
    #: buffers), not only through one ``record_view``.
    moves_parts: ClassVar[bool] = False

    def __init__(self, pool: HostPool | None, *, max_workers: int = 4, timeout_s: float | None = 30.0) -> None:
        if pool is not None:
            from ..model.host_pool import HostPool  # only with a pool: a key-only backend needs no torch

            if not isinstance(pool, HostPool):
                raise PoolError(f"an L3 backend serves a page_first HostPool or None (key-only), got {type(pool).__name__}")
            if not pool.holds_records:
                raise PoolError(f"L3 backends move whole page records and need a page_first host pool; got {pool.layout}")
        self._pool = pool
        self.timeout_s = timeout_s
        self.stats = BackendStats()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"tkv-{self.scheme}")
        self._closed = False

    # --- construction ------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def from_url(cls, url: str, pool: HostPool | None, **options: Any) -> "Backend":
        """Parse ``url`` (and keyword options) into a typed config and open the backend
        (key-only where ``pool`` is None)."""

    @classmethod
    def check_dependencies(cls) -> None:
        """Import what this backend needs beyond the base install; MissingExtraError naming the
        extra that brings it (``tiered-kv config check`` asks before anything is opened).
        Default: nothing beyond the base install."""

    @property
    def key_only(self) -> bool:
        """True for a backend opened without a host pool: ``exists`` and ``delete`` only."""
        return self._pool is None

    @property
    def pool(self) -> HostPool:
        """The host pool data calls move records through; NoHostPoolError on a key-only backend."""
        if self._pool is None:
            raise NoHostPoolError(f"{self.scheme} backend was opened without a host pool (key-only): it answers "
                                  "exists and delete; get_into / put_from need open_backend(url, pool)")
        return self._pool

    @classmethod
    def open_for_reading(cls, url: str) -> "Backend":
        """A key-only backend on ``url`` for tools that only look (``tiered-kv inspect``): opening
        it must change nothing on the medium. Default: ``from_url(url, None)``; a backend whose
        open writes (the file backend trims and tidies its directory) overrides this."""
        return cls.from_url(url, None)

    # --- listing, for inspection (read-only; never deletes, never verifies) -------------------
    async def scan(self) -> AsyncIterator[tuple[str, int | None]]:
        """Every object stored in this backend's namespace: ``(stored name, bytes)``, bytes None for
        an object that is no byte value (a Redis list, say). The stored name is what
        ``read_stored`` takes and ``stored_name(key)`` gives for a page key. Objects may come and
        go while it runs. Where the medium has no call that lists its objects, ConfigError."""
        raise ConfigError(f"{self.scheme}:// cannot list what it stores{self.cannot_list_because}")
        yield  # pragma: no cover - makes this an async generator, as the overrides are

    #: Why the medium cannot be listed (for ``scan``'s error), where a backend knows it.
    cannot_list_because: ClassVar[str] = ""

    async def read_stored(self, name: str, length: int | None = None) -> "bytes | None | NotARecord":
        """The stored bytes of ``name`` (from ``scan``): all of them, or the first ``length``;
        None if it is gone, ``NotARecord`` if it is no byte value. Reads only: nothing is verified,
        touched or deleted."""
        raise ConfigError(f"{self.scheme}:// cannot read stored objects by name{self.cannot_list_because}")

    def stored_name(self, key: str) -> str:
        """The name ``scan`` reports for the record of page ``key``. Default: the key itself."""
        return key

    def stored_length(self, record_bytes: int) -> int:
        """How many bytes this medium stores for a record of ``record_bytes``; a stored value of
        another length is no intact record here. Default: exactly the record."""
        return record_bytes

    async def __aenter__(self) -> "Backend":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._close()
        # Running workers finish on their own; nothing new starts.
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _close(self) -> None:
        """Release connections / files. Default: nothing."""

    async def check_health(self, probe_key: str) -> None:
        """Raise a BackendError unless this backend serves now: what a degraded tier's health probe
        asks before it calls the tier back (``L3Controller``). Default: ``exists`` of ``probe_key``,
        one round trip to the medium. A medium that answers reads while it refuses writes serves:
        its backend reports the refused puts as False (``file://``), so reads need not wait."""
        await self.exists([probe_key])

    # --- primitives a backend implements (distinct keys; may raise BackendError) -----------
    @abstractmethod
    async def _exists(self, keys: list[str]) -> list[bool]:
        """Presence of each key."""

    @abstractmethod
    async def _get(self, keys: list[str], slots: list[int]) -> list["bool | OtherLength | NotARecord"]:
        """Write each present key's stored record into its slot's record (``record_view``, or its
        ``record_parts`` where ``moves_parts``); False if absent.

        Need not verify: the base verifies every slot reported True before counting it. A value
        whose length is not this pool's record size is ``OtherLength`` (its first bytes in the
        slot); an object that is no record and must stay (another type, say) is ``NotARecord``.
        Never deletes or overwrites what it finds: the base decides.
        """

    @abstractmethod
    async def _put(self, keys: list[str], slots: list[int]) -> list[bool]:
        """Store each slot's record (``record_view``, or ``record_parts`` where ``moves_parts``)
        under its key unless present (present = True). A blocking put holds its slots like a get
        (``run_blocking``): it reads them until its thread returns."""

    @abstractmethod
    async def _delete(self, keys: list[str]) -> None:
        """Remove keys; absent keys are not an error."""

    async def _delete_corrupt(self, found: list[tuple[str, int, "OtherLength | None"]]) -> None:
        """Delete the corrupt records a get found: ``(key, slot, other)``, the slot holding what
        was read (``other``: its ``OtherLength``, None for a value of the record size).

        Between the read and this call another reader may have deleted the record and a writer
        put it again, intact; or the stored record was intact and only the read was damaged on
        its way. A backend that can compare (``capabilities.compares_before_delete``) deletes a
        record only while the medium still holds the bytes read (``matches_read``), atomically
        against other writers. Default: delete the keys, whatever they hold by now.
        """
        await self._delete([key for key, _, _ in found])

    # --- helpers for subclasses --------------------------------------------------------------
    async def run_blocking(self, fn: Callable[..., T], *args: Any, hold_slots: Sequence[int] = ()) -> T:
        """Run ``fn`` on this backend's executor, with this backend's timeout.

        ``hold_slots``: slots ``fn`` reads or writes (a get lands in them, a put reads them, or
        bounces them through the slot's own memory); if the caller is cancelled or times out they
        stay held in the pool until ``fn`` has returned, so no other call reuses them and an engine
        whose pages a bound slot points at can wait for ``is_held`` to end.
        """
        if self._closed:
            raise BackendError(f"{self.scheme} backend is closed")
        future = self._executor.submit(fn, *args)
        if hold_slots:
            self.pool.hold(hold_slots, future)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
        except TimeoutError as exc:
            raise BackendTimeoutError(f"{self.scheme}: {getattr(fn, '__name__', 'call')} took longer than {self.timeout_s}s") from exc

    # --- the public contract -----------------------------------------------------------------
    def _check_open(self) -> None:
        """BackendError once closed, for every backend alike: one that needs no thread or
        connection for a call (``memory://``) must not go on answering after ``aclose``."""
        if self._closed:
            raise BackendError(f"{self.scheme} backend is closed")

    async def exists(self, keys: Sequence[str]) -> int:
        """Length of the leading run of ``keys`` present in the backend."""
        self._check_open()
        keys = check_keys(keys)
        if not keys:
            return 0
        unique = list(dict.fromkeys(keys))
        present = dict(zip(unique, await self._guard(self._exists(unique))))
        run = 0
        for k in keys:
            if not present[k]:
                break
            run += 1
        return run

    async def get_into(self, keys: Sequence[str], slots: Sequence[int]) -> list[bool]:
        """Fill ``slots`` with the records of ``keys``; True only for the verified leading run."""
        self._check_open()
        self.pool  # noqa: B018 - NoHostPoolError on a key-only backend, before the keys are read
        keys, slots = self._check_batch(keys, slots)
        if not keys:
            return []
        if len(set(slots)) != len(slots):
            raise IndexValidationError("get_into: a slot appears twice in one batch")
        first_slot: dict[str, int] = {}
        for k, s in zip(keys, slots):
            first_slot.setdefault(k, s)
        unique = list(first_slot)
        got = await self._guard(self._get(unique, [first_slot[k] for k in unique]))
        landed: list[tuple[str, int, OtherLength | None]] = []
        for k, hit in zip(unique, got):
            if isinstance(hit, NotARecord):
                self._count_foreign(k, hit.reason)
            elif isinstance(hit, OtherLength):
                landed.append((k, first_slot[k], hit))
            elif hit:
                landed.append((k, first_slot[k], None))
        rejected = await self._verify_all(landed)
        verified = {k for k, _, other in landed if other is None and k not in rejected}
        ok = {k: k in verified for k in unique}
        corrupt = [(k, s, other) for k, s, other in landed if rejected.get(k) == "corrupt"]
        if corrupt:
            await self._guard(self._delete_corrupt(corrupt))
        for k, s, _ in landed:
            if k in rejected:  # after the delete, which compares the medium with the bytes read
                self._wipe(s)
        results: list[bool] = []
        for k, s in zip(keys, slots):
            hit = ok[k] and (not results or results[-1])
            if hit and s != first_slot[k]:
                self.pool.copy_record(first_slot[k], s)
            results.append(hit)
        hits = sum(results)
        self.stats.hits += hits
        self.stats.misses += len(results) - hits
        self.stats.bytes_read += hits * self.pool.record_bytes
        return results

    async def _verify_all(self, landed: list[tuple[str, int, OtherLength | None]]) -> dict[str, str]:
        """Verify every landed ``(key, slot, other_length)``; returns ``{key: "corrupt" | "foreign"}``
        for the records that are no hit.

        Checksums run on threads (xxh3 releases the GIL), so the event loop stays free and the
        next batch's transfer overlaps this one's verification; a batch is split over up to one
        thread per core, so the verification the caller waits for after the last transfer is
        short on a many-core host.
        """
        if not landed:
            return {}
        parts = min(len(landed), os.cpu_count() or 1)
        chunks = [landed[i::parts] for i in range(parts)]
        found = await asyncio.gather(*(asyncio.to_thread(self._rejected_in, chunk) for chunk in chunks))
        rejected: dict[str, str] = {}
        for part in found:
            for key, exc in part:
                if isinstance(exc, ForeignRecordError):
                    rejected[key] = "foreign"
                    self._count_foreign(key, str(exc))
                elif isinstance(exc, ForgedRecordError):
                    rejected[key] = "corrupt"
                    self.stats.forged += 1
                    log.warning("%s: dropping stored page %s, refused by the record key: %s", self.scheme, key[:32], exc)
                else:
                    rejected[key] = "corrupt"
                    self.stats.corrupt += 1
                    log.warning("%s: dropping stored page %s: %s", self.scheme, key[:32], exc)
        return rejected

    def _rejected_in(self, landed: list[tuple[str, int, OtherLength | None]]) -> list[tuple[str, RecordError]]:
        spec = self.pool.spec
        rejected: list[tuple[str, RecordError]] = []
        for key, slot, other in landed:
            try:
                if other is None:
                    self.pool.verify_slot(slot, key)  # with the pool's record key, where it has one
                else:
                    # The value's first bytes (its header, where it has one) are in the first part.
                    raise record.other_length_error(self.pool.record_parts(slot)[0], length=other.length,
                                                    expected=other.expected,
                                                    fingerprint=spec.fingerprint, key=key, payload_len=spec.page_bytes)
            except RecordError as exc:
                rejected.append((key, exc))
        return rejected

    def _wipe(self, slot: int) -> None:
        """Zero a slot a refused record landed in: another tenant's page must not stay readable there."""
        self.pool.wipe(slot)  # the padding too: a longer value's bytes may have landed there

    def _count_foreign(self, key: str, reason: str) -> None:
        """Count a foreign miss. The first one of a backend is a warning: pages of two specs under
        the same keys mean two caches share a namespace (see ``tiered_kv.model.keys.Namespace``)."""
        self.stats.foreign += 1
        level = logging.WARNING if self.stats.foreign == 1 else logging.DEBUG
        log.log(level, "%s: page %s is another reader's, left in place (a miss): %s", self.scheme, key[:32], reason)

    async def put_from(self, keys: Sequence[str], slots: Sequence[int]) -> list[bool]:
        """Store the sealed records in ``slots`` under ``keys``; per key, False if it did not fit."""
        self._check_open()
        self.pool  # noqa: B018 - NoHostPoolError on a key-only backend, before the keys are read
        keys, slots = self._check_batch(keys, slots)
        for k, s in zip(keys, slots):
            if not self.pool.is_sealed(s, k):
                raise UnsealedSlotError(f"put_from: slot {s} is not sealed for key {k[:64]!r}; seal it after its bytes land")
        first_slot: dict[str, int] = {}
        for k, s in zip(keys, slots):
            first_slot.setdefault(k, s)
        unique = list(first_slot)
        if not unique:
            return []
        stored = dict(zip(unique, await self._guard(self._put(unique, [first_slot[k] for k in unique]))))
        done = sum(stored.values())
        self.stats.puts += done
        self.stats.put_rejected += len(unique) - done
        self.stats.bytes_written += done * self.pool.record_bytes
        return [stored[k] for k in keys]

    async def delete(self, keys: Sequence[str]) -> None:
        self._check_open()
        keys = check_keys(keys)
        if keys:
            await self._guard(self._delete(list(dict.fromkeys(keys))))

    # --- single-key conveniences -------------------------------------------------------------
    async def get(self, key: str, slot: int) -> bool:
        return (await self.get_into([key], [slot]))[0]

    async def put(self, key: str, slot: int) -> bool:
        return (await self.put_from([key], [slot]))[0]

    async def contains(self, key: str) -> bool:
        return await self.exists([key]) == 1

    # --- internals ---------------------------------------------------------------------------
    def _check_batch(self, keys: Sequence[str], slots: Sequence[int]) -> tuple[list[str], list[int]]:
        keys = check_keys(keys)
        if isinstance(slots, (str, bytes)):
            raise IndexValidationError(f"slots must be a sequence of slot ids, got {type(slots).__name__}")
        try:
            items = list(slots)
        except TypeError:
            raise IndexValidationError(f"slots must be a sequence of slot ids, got {type(slots).__name__}") from None
        slot_list = [self.pool.check_slot(s) for s in items]
        if len(keys) != len(slot_list):
            raise IndexValidationError(f"{len(keys)} keys but {len(slot_list)} slots")
        return keys, slot_list

    async def _guard(self, call: "asyncio.Future[T] | Any") -> T:
        """Await a primitive, counting failures; only BackendError may leave a backend."""
        try:
            return await call
        except BackendError:
            self.stats.errors += 1
            raise

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.scheme}, pool={self._pool!r})"

