"""``mooncake://``: page records in a Mooncake Store, moved zero-copy from and into host slots.

URL (query options are ``MooncakeOptions`` fields)::

    mooncake://MASTER_HOST:RPC_PORT?metadata_server=http://HOST:PORT/metadata&protocol=tcp
        &local_hostname=10.0.0.5&contribute_segment=true&global_segment_bytes=64GiB
        &local_buffer_bytes=16MiB&replica_num=1&device_name=&workers=4&transfers_in_flight=1
        &timeout_s=30

How it works: every memory a record may lie in (``pool.memory_regions()``: the host pool, and for a
``BoundPool`` the engine's buffers its slots are bound to) is registered with the store once
(``register_buffer``, overlapping regions merged: the store refuses a range that overlaps one it
has). A slot whose record is one buffer is put by one ``batch_put_from`` of slot addresses and got
by one ``batch_get_into`` straight into the destination slots; a slot bound to an engine's memory
moves its parts (header block, then each payload range) with ``batch_put_from_multi_buffers`` /
``batch_get_into_multi_buffers``, zero-copy too; a batch of both kinds is split in two calls.
Slots are held by the pool until the call returns (see ``Backend.run_blocking``).

What the store is, and what that means here:
- objects live in memory *segments* that client processes contribute (``global_segment_bytes``);
  a writer's pages vanish when the process holding them exits, and above its high watermark
  (``--eviction_high_watermark_ratio``, 0.95) the master evicts objects to make room: a put is
  refused (False) only when one batch needs more room than is free at once. So the capability is
  not persistent. ``contribute_segment=false`` makes a pure client
  (say, when another process on the host already contributes: pages are not held twice in one
  host's RAM); ``python -m tiered_kv.ops.bench.segment_holder hold-segment URL`` runs such a process
  (until SIGTERM / SIGINT). A key-only backend (``open_backend(url, None)``, for a scheduler
  process) registers no buffer; open it with ``contribute_segment=false``, or the pages stored in
  its segment go when the scheduler does.
- a master restart loses every object; the client reconnects and remounts by itself, so the same
  backend object serves again (earlier pages read as misses). The master answers before the
  segment is mounted again, so the health check of a contributing client also puts (and removes)
  a small probe object: a tier is called back only once a put fits.
- a put of a key already present stores nothing (the store answers OK or OBJECT_ALREADY_EXISTS):
  success, as records are immutable and put-if-absent.
- the store has no compare-and-delete: a corrupt record is removed whatever the key holds by the
  time of the remove (``capabilities.compares_before_delete`` False; see ``Backend._delete_corrupt``).
- error codes: absent / evicted / not yet readable keys are misses; an object of another length
  is read up to the slot or, where the store refuses (a larger one; a shorter one into a bound
  slot's parts, whose gather read fails with TRANSFER_FAIL and writes nothing), its size and
  header only, and classified by the base: another spec's page is a foreign miss left in place, a
  damaged one is counted and deleted; RPC and transfer failures (master or segment holder gone)
  raise ``BackendUnavailableError``, anything else ``BackendError``.
- a read takes a lease (the master's ``--default_kv_lease_ttl``, 10 s by default) that blocks plain
  removal, so deletes are forced. A reader racing a forced delete gets at worst bytes that fail
  verification, i.e. a miss.
- in one process over TCP the store copies with memcpy instead of the network.

Server settings: ``mooncake_master --enable_http_metadata_server=true`` (its HTTP metadata server
is the default ``metadata_server``, port 8080 on the master's host); give every master its own
``--metrics_port``. Over TCP, set ``MC_TCP_BIND_ADDRESS`` to the address ``local_hostname`` names
(``127.0.0.1`` for a single host) in the environment of every client process.

The ``mooncake`` module (one of the wheels ``mooncake-transfer-engine``,
``-cuda13``, ``-non-cuda``) is imported only when a store is opened.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import secrets
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from ..errors import BackendError, BackendUnavailableError, ConfigError, MissingExtraError
from ..model.sizes import MAX_SIZE
from ..model.record import HEADER_BYTES
from .base import Backend, Capabilities, NotARecord, OtherLength
from .url_options import (MAX_WORKERS, ByteSize, HostName, TimeoutSeconds, Workers, check_host, check_fields,
                          options_from_url, split_url, url_port)

if TYPE_CHECKING:  # annotations only: the host pool needs torch, listing a store does not
    from ..model.host_pool import HostPool

log = logging.getLogger(__name__)

# Mooncake Store's ErrorCode values (mooncake-store/include/types.h) that this backend acts on.
OK = 0
BUFFER_OVERFLOW = -10
SEGMENT_NOT_FOUND = -101
CLIENT_NOT_FOUND = -103
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
REPLICA_IS_NOT_READY = -703
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
LEASE_EXPIRED = -707
REPLICA_NOT_FOUND = -710
REPLICA_IS_GONE = -712
TRANSFER_FAIL = -800
RPC_FAIL = -900
UNAVAILABLE_IN_CURRENT_STATUS = -1010

_NAMES = {
    -1: "INTERNAL_ERROR", BUFFER_OVERFLOW: "BUFFER_OVERFLOW", SEGMENT_NOT_FOUND: "SEGMENT_NOT_FOUND",
    CLIENT_NOT_FOUND: "CLIENT_NOT_FOUND", NO_AVAILABLE_HANDLE: "NO_AVAILABLE_HANDLE", -300: "INVALID_VERSION",
    -400: "INVALID_KEY", -500: "WRITE_FAIL", INVALID_PARAMS: "INVALID_PARAMS", -601: "ILLEGAL_CLIENT",
    -700: "INVALID_WRITE", -701: "INVALID_READ", -702: "INVALID_REPLICA", REPLICA_IS_NOT_READY: "REPLICA_IS_NOT_READY",
    OBJECT_NOT_FOUND: "OBJECT_NOT_FOUND", OBJECT_ALREADY_EXISTS: "OBJECT_ALREADY_EXISTS", -706: "OBJECT_HAS_LEASE",
    LEASE_EXPIRED: "LEASE_EXPIRED", REPLICA_NOT_FOUND: "REPLICA_NOT_FOUND", REPLICA_IS_GONE: "REPLICA_IS_GONE",
    TRANSFER_FAIL: "TRANSFER_FAIL", RPC_FAIL: "RPC_FAIL", UNAVAILABLE_IN_CURRENT_STATUS: "UNAVAILABLE_IN_CURRENT_STATUS",
}
# The store cannot be reached, or lost track of this client: the caller may retry later.
_UNAVAILABLE = {TRANSFER_FAIL, RPC_FAIL, UNAVAILABLE_IN_CURRENT_STATUS, CLIENT_NOT_FOUND, -1011}
# The key is not readable (absent, evicted, still being written, or its replica went away).
_MISSING = {OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY, LEASE_EXPIRED, REPLICA_NOT_FOUND, REPLICA_IS_GONE}
# A put that found no room: the page did not fit, which put_from reports as False.
_NO_ROOM = {NO_AVAILABLE_HANDLE, BUFFER_OVERFLOW, SEGMENT_NOT_FOUND}

DEFAULT_SEGMENT_BYTES = 1 << 30
_PROBE_BYTES = bytes(4096)  # the health probe's object: small, staged through the local buffer
_PROTOCOLS = ("tcp", "rdma")
_MIN_SEGMENT_BYTES = 1024  # the store refuses anything smaller but 0
_MAX_REPLICAS = 64  # copies of each object across segments; more is a typo


def code_name(code: int) -> str:
    return f"{_NAMES.get(code, 'error')} ({code})"


def mooncake_error(code: int, what: str) -> BackendError:
    """Our error for a negative Mooncake return ``code`` of operation ``what``."""
    cls = BackendUnavailableError if code in _UNAVAILABLE else BackendError
    return cls(f"mooncake: {what} failed with {code_name(code)}")


def new_replicate_config() -> Any:
    """A ``mooncake.store.ReplicateConfig`` (imported only once a store is opened)."""
    from mooncake.store import ReplicateConfig

    return ReplicateConfig()


def _import_store_class() -> Any:
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        raise MissingExtraError(
            "mooncake:// needs the mooncake module: pip install 'tiered-kv[mooncake]' "
            "(or the mooncake-cuda13 / mooncake-cpu extra)") from exc
    return MooncakeDistributedStore


@dataclass(frozen=True)
class MooncakeOptions:
    """One store client. ``master`` is ``host:port`` of the master's RPC service (from the URL)."""

    master: str
    metadata_server: str = ""  # default: the master's own HTTP metadata server, port 8080
    protocol: str = "tcp"
    local_hostname: HostName = "127.0.0.1"  # the address other clients reach this one's segment at
    contribute_segment: bool = True
    global_segment_bytes: ByteSize | None = None  # default: 1 GiB when contributing, else 0
    # staging for non-registered buffers; zero-copy needs little
    local_buffer_bytes: Annotated[int, Field(ge=_MIN_SEGMENT_BYTES, le=MAX_SIZE)] = 16 << 20
    replica_num: Annotated[int, Field(ge=1, le=_MAX_REPLICAS)] = 1
    device_name: str = ""  # RDMA devices, comma separated ("" = all / not rdma)
    workers: Workers = 4
    # batch puts / gets running at once; more only thrash small hosts
    transfers_in_flight: Annotated[int, Field(ge=1, le=MAX_WORKERS)] = 1
    timeout_s: TimeoutSeconds = 30.0

    def __post_init__(self) -> None:
        check_fields(self)  # each field against its annotation; what follows spans fields
        host, _, port = self.master.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"mooncake: the URL must name the master as host:port, got {self.master!r}")
        if self.protocol not in _PROTOCOLS:
            raise ConfigError(f"mooncake: protocol must be one of {_PROTOCOLS}, got {self.protocol!r}")
        if not self.local_hostname:
            raise ConfigError("mooncake: local_hostname must name this host's reachable address")
        if self.metadata_server and not (self.metadata_server.startswith(("http://", "etcd://", "redis://"))
                                         or self.metadata_server == "P2PHANDSHAKE"):
            raise ConfigError(f"mooncake: metadata_server must be an http://, etcd:// or redis:// address "
                              f"or P2PHANDSHAKE, got {self.metadata_server!r}")
        segment = self.global_segment_bytes
        if segment is not None and self.contribute_segment and segment < _MIN_SEGMENT_BYTES:
            raise ConfigError(f"mooncake: contribute_segment=true needs global_segment_bytes >= "
                              f"{_MIN_SEGMENT_BYTES}, got {segment}")
        if segment and not self.contribute_segment:
            raise ConfigError(f"mooncake: contribute_segment=false but global_segment_bytes={segment}; "
                              "a pure client contributes no memory (leave global_segment_bytes out or 0)")
        if self.transfers_in_flight > self.workers:
            raise ConfigError(f"mooncake: transfers_in_flight must be in 1..workers ({self.workers}), "
                              f"got {self.transfers_in_flight}")

    @classmethod
    def from_url(cls, url: str, overrides: dict[str, Any] | None = None) -> "MooncakeOptions":
        parts = split_url(url)
        if parts.scheme != "mooncake":
            raise ConfigError(f"not a mooncake:// URL: {url!r}")
        port = url_port(parts, url)
        if not parts.hostname or port is None:
            raise ConfigError(f"{url}: the URL must name the master as mooncake://host:port")
        try:
            check_host(parts.hostname)
        except ValueError as exc:
            raise ConfigError(f"{url}: master host {parts.hostname!r}: {exc}") from None
        return options_from_url(cls, url, overrides, master=f"{parts.hostname}:{port}")

    @property
    def master_host(self) -> str:
        return self.master.rpartition(":")[0]

    @property
    def segment_bytes(self) -> int:
        if not self.contribute_segment:
            return 0
        return DEFAULT_SEGMENT_BYTES if self.global_segment_bytes is None else self.global_segment_bytes

    def setup_config(self) -> dict[str, str]:
        """The dict ``MooncakeDistributedStore.setup`` takes."""
        return {
            "local_hostname": self.local_hostname,
            "metadata_server": self.metadata_server or f"http://{self.master_host}:8080/metadata",
            "global_segment_size": str(self.segment_bytes),
            "local_buffer_size": str(self.local_buffer_bytes),
            "protocol": self.protocol,
            "rdma_devices": self.device_name,
            "master_server_addr": self.master,
        }


def disjoint_regions(regions: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(address, bytes)`` ranges covering ``regions`` with none overlapping or touching another,
    in address order, empty ones dropped: the store refuses to register a range that overlaps one
    it already has (INVALID_PARAMS), and an engine may hand over views that share memory."""
    merged: list[list[int]] = []
    for start, size in sorted(r for r in regions if r[1] > 0):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], start + size)
        else:
            merged.append([start, start + size])
    return [(start, end - start) for start, end in merged]


def open_store(options: MooncakeOptions) -> Any:
    """A set-up ``MooncakeDistributedStore`` client, within ``options.timeout_s``.

    Blocking. The master's RPC port is probed first: the store's own setup retries for about 90 s
    when no master answers, far longer than any caller should wait.
    """
    store_cls = _import_store_class()
    host, _, port = options.master.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=min(options.timeout_s, 5.0)).close()
    except OSError as exc:
        raise BackendUnavailableError(f"mooncake: no master answers at {options.master}: {exc}") from exc
    store = store_cls()
    # setup() may still block (metadata server down, master going away): run it aside and wait
    # at most timeout_s; a late setup is closed by its own thread.
    runner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tkv-mooncake-setup")
    future = runner.submit(store.setup, options.setup_config())
    runner.shutdown(wait=False)
    try:
        rc = future.result(timeout=options.timeout_s)
    except concurrent.futures.TimeoutError as exc:
        future.add_done_callback(lambda _: store.close())
        raise BackendUnavailableError(f"mooncake: setup with master {options.master} took longer than "
                                      f"{options.timeout_s}s") from exc
    if rc != OK:
        store.close()
        raise BackendUnavailableError(f"mooncake: setup with master {options.master} failed with {code_name(rc)}; "
                                      "see the store's log above for the reason")
    return store


class MooncakeBackend(Backend):
    scheme = "mooncake"
    cannot_list_because = ": Mooncake Store's client has no call that lists its keys (only lookups by name)"
    capabilities = Capabilities(zero_copy=True, persistent=False, shared_across_processes=True, shared_across_nodes=True)
    moves_parts = True

    def __init__(self, pool: HostPool | None, options: MooncakeOptions) -> None:
        super().__init__(pool, max_workers=options.workers, timeout_s=options.timeout_s)
        self.options = options
        try:
            self._store = open_store(options)
        except BaseException:
            self._executor.shutdown(wait=False)
            raise
        # Once, for every memory a record may lie in: each slot (and each part of a bound one) is
        # then a valid source and target. A key-only backend (no pool) registers nothing: exists
        # and delete move no bytes.
        self._registered: list[int] = []
        for address, nbytes in ([] if pool is None else disjoint_regions(pool.memory_regions())):
            rc = self._store.register_buffer(address, nbytes)
            if rc != OK:
                self._unregister()
                self._store.close()
                self._executor.shutdown(wait=False)
                raise mooncake_error(rc, f"register_buffer of the pool's memory at {address:#x} ({nbytes} B)")
            self._registered.append(address)
        # One store batch already moves its pages in parallel; several at once contend for the
        # same cores and the same sockets (measured: four in flight on 2 cores, a third of one).
        self._transfer_slots = threading.BoundedSemaphore(options.transfers_in_flight)
        self._probe_id = secrets.token_hex(8)  # this client's health probe object
        self._replicate = None
        if options.replica_num != 1:
            self._replicate = new_replicate_config()
            self._replicate.replica_num = options.replica_num

    @classmethod
    def check_dependencies(cls) -> None:
        _import_store_class()

    @classmethod
    def from_url(cls, url: str, pool: HostPool | None, **options: Any) -> "MooncakeBackend":
        return cls(pool, MooncakeOptions.from_url(url, options))

    # --- primitives --------------------------------------------------------------------------
    async def _exists(self, keys: list[str]) -> list[bool]:
        codes = await self.run_blocking(self._store.batch_is_exist, keys)
        for code in codes:
            if code < 0:
                raise mooncake_error(code, f"batch_is_exist of {len(keys)} keys")
        return [code == 1 for code in codes]

    def _split(self, slots: list[int]) -> tuple[list[int], list[int]]:
        """Indices into ``slots`` of the slots whose record is one buffer, and of those in parts."""
        whole, parts = [], []
        for i, slot in enumerate(slots):
            (whole if self.pool.is_contiguous(slot) else parts).append(i)
        return whole, parts

    def _parts_of(self, slots: list[int]) -> tuple[list[list[int]], list[list[int]]]:
        """Each slot's part addresses and sizes, as the store's multi-buffer calls take them."""
        addresses, sizes = [], []
        for slot in slots:
            parts = self.pool.part_addresses(slot)
            addresses.append([address for address, _ in parts])
            sizes.append([size for _, size in parts])
        return addresses, sizes

    async def _each_kind(self, keys: list[str], slots: list[int], on_whole, on_parts) -> list:
        """``on_whole`` for the contiguous slots, ``on_parts`` for those in parts: answers in key order."""
        whole, parts = self._split(slots)
        answers: list = [False] * len(keys)
        for indices, call in ((whole, on_whole), (parts, on_parts)):
            if indices:
                for i, answer in zip(indices, await call([keys[i] for i in indices], [slots[i] for i in indices])):
                    answers[i] = answer
        return answers

    async def _get(self, keys: list[str], slots: list[int]) -> list[bool | OtherLength | NotARecord]:
        return await self._each_kind(keys, slots, self._get_whole, self._get_parts)

    async def _get_whole(self, keys: list[str], slots: list[int]) -> list[bool | OtherLength | NotARecord]:
        size = self.pool.record_bytes
        addresses = [self.pool.slot_address(s) for s in slots]
        codes = await self.run_blocking(self._transfer, self._store.batch_get_into, keys, addresses,
                                        [size] * len(keys), hold_slots=slots)
        # The store refuses to read an object larger than the buffer (INVALID_PARAMS).
        return await self._classify_get(keys, slots, codes, "batch_get_into", (INVALID_PARAMS,))

    async def _get_parts(self, keys: list[str], slots: list[int]) -> list[bool | OtherLength | NotARecord]:
        addresses, sizes = self._parts_of(slots)
        codes = await self.run_blocking(self._transfer, self._store.batch_get_into_multi_buffers, keys, addresses,
                                        sizes, hold_slots=slots)
        # The gather read refuses a larger object (INVALID_PARAMS) and fails the transfer of a
        # shorter one (TRANSFER_FAIL, nothing written): both are told apart by the object's size.
        return await self._classify_get(keys, slots, codes, "batch_get_into_multi_buffers",
                                        (INVALID_PARAMS, TRANSFER_FAIL))

    async def _classify_get(self, keys: list[str], slots: list[int], codes: list[int], call: str,
                            sized_apart: tuple[int, ...]) -> list[bool | OtherLength | NotARecord]:
        """A get's answer per key from the store's ``codes`` (bytes read, or a negative error);
        keys whose code is in ``sized_apart`` may hold an object of another length: their size is
        looked up and their header read apart."""
        size = self.pool.record_bytes
        found: list[bool | OtherLength | NotARecord] = []
        other = []
        for i, (key, code) in enumerate(zip(keys, codes)):
            if code == size:
                found.append(True)
            elif code in _MISSING:
                found.append(False)
            elif 0 <= code < size:
                # A shorter object (another spec's smaller page, or a broken one): its bytes landed
                # at the record's start; the base reads its header to tell whose it is.
                found.append(OtherLength(code, size))
            elif code in sized_apart:
                found.append(False)  # replaced below
                other.append(i)
            else:
                raise mooncake_error(code, f"{call} of key {key[:64]!r}")
        if other:
            heads = await self.run_blocking(self._read_headers, [keys[i] for i in other], [slots[i] for i in other],
                                            [codes[i] for i in other], call, hold_slots=[slots[i] for i in other])
            for i, answer in zip(other, heads):
                found[i] = answer
        return found

    def _read_headers(self, keys: list[str], slots: list[int], codes: list[int],
                      call: str) -> list[bool | OtherLength | NotARecord]:
        """For keys a get could not read (``codes``): where the object has another length than this
        pool's records (another spec's pages), its size, and its header read into the slot's first
        part, so the base can tell another reader's page (left in place) from a damaged one of
        ours. An object of the record's own size failed for another reason: its code is raised.
        Blocking."""
        size = self.pool.record_bytes
        answers: list[bool | OtherLength | NotARecord] = []
        for key, slot, code in zip(keys, slots, codes):
            length = self._store.get_size(key)
            if length in _MISSING:
                answers.append(False)  # gone since the get
                continue
            if length < 0:
                raise mooncake_error(length, f"get_size of key {key[:64]!r}")
            if length == size:
                raise mooncake_error(code, f"{call} of key {key[:64]!r}")
            wanted = min(length, HEADER_BYTES)  # the store refuses a range past the object's end
            got = self._read_header_into(key, slot, wanted)
            if got == wanted:
                answers.append(OtherLength(length, size))
            elif got in _MISSING:
                answers.append(False)  # gone since the size was read
            else:  # cannot tell whose it is: never a hit, and not ours to delete
                answers.append(NotARecord(f"object of {length} B, "
                                          f"{'larger' if length > size else 'shorter'} than the slot ({size} B), "
                                          f"header unreadable ({code_name(got) if got < 0 else f'{got} B'})"))
        return answers

    def _read_header_into(self, key: str, slot: int, length: int = HEADER_BYTES) -> int:
        """The first ``length`` bytes (at most HEADER_BYTES) of ``key``'s object into ``slot``'s
        first part (its header block): bytes read, or a negative code (-1 where this store client
        has no ranged reads or answers in another shape)."""
        ranged = getattr(self._store, "get_into_ranges", None)
        if ranged is None:
            return -1
        header_address = self.pool.part_addresses(slot)[0][0]
        reply = ranged([header_address], [[key]], [[[0]]], [[[0]]], [[[length]]])
        try:
            return int(reply[0][0][0])
        except (IndexError, TypeError, ValueError):
            return -1

    async def _put(self, keys: list[str], slots: list[int]) -> list[bool]:
        return await self._each_kind(keys, slots, self._put_whole, self._put_parts)

    async def _put_whole(self, keys: list[str], slots: list[int]) -> list[bool]:
        size = self.pool.record_bytes
        addresses = [self.pool.slot_address(s) for s in slots]
        args: tuple[Any, ...] = (keys, addresses, [size] * len(keys))
        if self._replicate is not None:
            args += (self._replicate,)
        codes = await self.run_blocking(self._transfer, self._store.batch_put_from, *args, hold_slots=slots)
        return self._classify_put(keys, codes, "batch_put_from")

    async def _put_parts(self, keys: list[str], slots: list[int]) -> list[bool]:
        addresses, sizes = self._parts_of(slots)
        args: tuple[Any, ...] = (keys, addresses, sizes)
        if self._replicate is not None:
            args += (self._replicate,)
        codes = await self.run_blocking(self._transfer, self._store.batch_put_from_multi_buffers, *args,
                                        hold_slots=slots)
        return self._classify_put(keys, codes, "batch_put_from_multi_buffers")

    @staticmethod
    def _classify_put(keys: list[str], codes: list[int], call: str) -> list[bool]:
        stored = []
        for key, code in zip(keys, codes):
            if code in (OK, OBJECT_ALREADY_EXISTS):
                stored.append(True)
            elif code in _NO_ROOM:
                stored.append(False)
            else:
                raise mooncake_error(code, f"{call} of key {key[:64]!r}")
        return stored

    async def check_health(self, probe_key: str) -> None:
        """The master answers, and, for a client that contributes a segment, the store takes a put
        again: after a master restart the master answers before the client has mounted its segment
        again, and a tier called back then had its next puts refused for want of space. A pure
        client mounts nothing; a put that finds no room there is a refused put, not ill health."""
        await super().check_health(probe_key)
        if self.options.contribute_segment:
            await self.run_blocking(self._probe_segment)

    def _probe_segment(self) -> None:
        """Put a small probe object (preferably into this client's own segment) and remove it.
        Blocking; BackendUnavailableError while no segment takes it."""
        key = f"tkv-health-probe-{self._probe_id}"
        config = new_replicate_config()
        config.preferred_segment = self._store.get_hostname()
        rc = self._store.put(key, _PROBE_BYTES, config)
        if rc in _NO_ROOM:
            raise BackendUnavailableError(f"mooncake: the master answers but takes no put yet ({code_name(rc)}): "
                                          "this client's segment is not mounted again")
        if rc not in (OK, OBJECT_ALREADY_EXISTS):
            raise mooncake_error(rc, "the health probe's put")
        rc = self._store.remove(key, True)
        if rc not in (OK, OBJECT_NOT_FOUND):
            raise mooncake_error(rc, "the health probe's remove")

    # --- for tools on this backend's own client (bench.raw_ceilings) ------------------------
    @property
    def store(self) -> Any:
        """The ``MooncakeDistributedStore`` client, for tools that call the store's own API on the
        pool this backend registered (the same-pages ceiling of ``bench storage``)."""
        return self._store

    def transfer_slot(self) -> threading.BoundedSemaphore:
        """One of the ``transfers_in_flight`` slots (``with backend.transfer_slot(): ...``, on a
        worker thread): a tool's own transfers then never overlap more than the backend's do."""
        return self._transfer_slots

    def _transfer(self, call: Any, *args: Any) -> list[int]:
        """Run a batch transfer in this worker thread, at most ``transfers_in_flight`` at once."""
        with self._transfer_slots:
            return call(*args)

    async def _delete(self, keys: list[str]) -> None:
        # force: a recent read's lease would refuse a plain remove for seconds (see module doc).
        codes = await self.run_blocking(self._store.batch_remove, keys, True)
        for key, code in zip(keys, codes):
            if code not in (OK, OBJECT_NOT_FOUND):
                raise mooncake_error(code, f"batch_remove of key {key[:64]!r}")

    async def _close(self) -> None:
        # The executor is still running here; the store's close may wait on an absent master.
        future = self._executor.submit(self._close_store)
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
        except TimeoutError:
            log.warning("mooncake: closing the store took longer than %ss; it finishes in the background", self.timeout_s)

    def _close_store(self) -> None:
        self._unregister()
        self._store.close()

    def _unregister(self) -> None:
        for address in self._registered:
            self._store.unregister_buffer(address)
        self._registered = []
