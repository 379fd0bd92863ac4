"""``redis://``, ``rediss://``, ``unix://``: page records as Redis string values.

URLs::

    redis://[user[:password]@]host[:port][/db][?option=value...]
    rediss://...        TLS; ssl_ca_certs, ssl_certfile, ssl_keyfile, ssl_cert_reqs (none|optional|required)
    unix://[user[:password]@]/path/redis.sock?db=0

Options (query or keyword): ``prefix`` (key namespace, default ``tkv:``), ``ttl_s`` (0 = keep until
evicted), ``max_in_flight`` (requests at once = connections per pool), ``socket_timeout_s`` (one
request, send to last byte), ``connect_timeout_s``, ``zero_copy`` (default on; forced off for TLS),
``username`` / ``password`` (also from the URL's user info).

How it talks to the server:
- Control commands (``EXISTS`` pipelined per batch, ``DEL``) go through ``redis.asyncio`` and its
  connection pool, in a lane of their own: up to ``max_in_flight`` control commands and as many
  values at once, so a lookup's ``EXISTS`` never waits for a connection behind slow page values
  (the pool holds up to twice ``max_in_flight`` connections).
- Page values (~3 MB each) go through a small RESP client on raw non-blocking sockets: a ``GET``
  reply's bulk string is received with ``sock_recv_into`` straight into the slot's record view, and
  ``SET key <value> NX`` is sent from the slot's memoryview without joining it into a bytes object.
  redis-py copies every value two or three times and reached only 0.3-0.4 of ``redis-benchmark``
  on a 2-core machine; this path reaches 0.8-0.9 of its GET and matches its SET while the server
  evicts (docs/benchmarks.md, "L3 backends"). With TLS (asyncio's socket calls
  do not take SSL sockets) or ``zero_copy=false`` values go through redis-py and are copied.
- Each value is one request on a connection of its own (up to ``max_in_flight`` at once), not a
  pipeline on one connection: at ~3 MB a value the round trip is noise, and separate connections
  let the server and the kernel work on several values at once.
- A request that fails, times out or is cancelled closes its connection: a half-read reply or a
  half-sent value never meets the next request. After the server restarts, new connections are
  made on demand by the same backend object.
- A cancelled get never writes into its slots afterwards: every receive runs on the event loop and
  a cancelled receive is never completed, so the caller may free the slots as soon as it returns.

Semantics: put is ``SET key value NX [PX ttl]`` (a present key is success). A put refused for memory
(``-OOM``, maxmemory reached under ``noeviction``) returns False for that key, not an exception.
A stored value of another length lands as far as the slot reaches and goes to the base as such:
another spec's page is a foreign miss left in place, a damaged one is counted, deleted, a miss.
A key of another Redis type under the prefix (a list, a hash: someone else's) is absent for
``exists`` and a counted foreign miss for gets (``stats.foreign``), never an error of the batch.
Opening connects once to the server's address (``reach``): nothing listening there is
``BackendUnavailableError`` at open; a server that goes away later fails requests, which an
``L3Controller`` turns into a degraded tier. At the first request the backend reads
``CONFIG GET maxmemory*`` once and logs one warning when the server has no ``maxmemory`` or runs
``noeviction`` (see below); a refused CONFIG is skipped. Connection errors -> ``BackendUnavailableError``; timeouts ->
``BackendTimeoutError``; other server errors -> ``BackendError``; a server that rejects our config
(wrong password, db index out of range) -> ``ConfigError``.

Server settings it needs:
- ``maxmemory`` and an eviction policy, e.g. ``maxmemory 64gb`` + ``maxmemory-policy allkeys-lru``:
  without them Redis grows until the machine runs out of memory. Under ``noeviction`` puts beyond
  maxmemory return False and earlier pages stay readable. Use ``allkeys-lru``/``allkeys-lfu`` (not
  ``volatile-*``, which can only evict keys with a TTL, i.e. only with ``ttl_s`` set).
  A server still growing towards maxmemory stores pages at about half the speed of a full one
  that evicts: it faults in new memory for every page (measured in docs/benchmarks.md).
- Server heap: start the server with ``--disable-thp no`` and the environment
  ``MALLOC_CONF=thp:always,dirty_decay_ms:-1,muzzy_decay_ms:-1``: jemalloc then backs values with
  2 MiB pages and keeps the memory of deleted or evicted values mapped for the next ones, instead
  of handing it back to the kernel and faulting it in again for every new 3 MB value. On a 2-core
  VM huge pages lifted our put from 1.66 to 2.50 GB/s, and keeping freed memory from 2.75 to 3.60
  (0.97 of ``redis-benchmark`` SET on the same server; docs/benchmarks.md, "Redis server memory").
  Redis disables huge pages by default for the copy-on-write cost of fork-based persistence, which
  a cache without RDB/AOF does not pay; the kept memory stays below ``maxmemory`` plus allocator
  slack, which a cache reaches anyway.
- ``proto-max-bulk-len`` >= the record size (default 512 MB: fine for pages of a few MB).
- ``client-output-buffer-limit`` for normal clients must stay 0 0 0 (the default).
- Persistence: capabilities say ``persistent=False``; pages survive a server restart only if the
  server persists (RDB/AOF), which costs fork and disk time for a cache of many GiB.
- TLS: use ``rediss://`` and pass the certificate options through.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import BackendError, BackendTimeoutError, BackendUnavailableError, ConfigError, MissingExtraError
from .base import Backend, Capabilities, NotARecord, OtherLength, all_or_nothing, read_length
from .redis_options import RedisOptions, parse_redis_url
from .resp import RespConnection, RespError, encode_command

if TYPE_CHECKING:  # annotations only: the host pool needs torch, listing a store does not
    from ..model.host_pool import HostPool

T = TypeVar("T")
log = logging.getLogger(__name__)
_WRONG_TYPE = -2  # a GET's answer for a key holding another Redis type
_NOT_A_STRING = NotARecord("the key holds a Redis value of another type (not a string): someone else's")
# Deletes KEYS[1] only while it holds the value a get read: of length ARGV[1], its first ARGV[2]
# bytes hashing to ARGV[3] (SHA-1). A script runs atomically: no client writes the key in between.
_DELETE_IF_AS_READ = """
local value = redis.pcall('GET', KEYS[1])
if type(value) ~= 'string' or string.len(value) ~= tonumber(ARGV[1]) then return 0 end
if redis.sha1hex(string.sub(value, 1, tonumber(ARGV[2]))) ~= ARGV[3] then return 0 end
return redis.call('DEL', KEYS[1])
"""


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# --- mapping dependency errors ------------------------------------------------------------------
def _config_problem(message: str) -> bool:
    """Server errors that mean our configuration is wrong, not that the server is unwell."""
    return any(tag in message for tag in ("WRONGPASS", "NOAUTH", "invalid password", "DB index is out of range", "NOPERM"))


def _is_oom(message: str) -> bool:
    return message.startswith("OOM")


def _is_wrong_type(message: str) -> bool:
    return message.startswith("WRONGTYPE")


def reach(options: RedisOptions) -> None:
    """Connect once to the server's address (TCP, or the unix socket) and hang up: a server that
    cannot be reached at open is BackendUnavailableError naming its URL there, instead of a tier
    that is degraded from its first request to the end of the run. Blocking, at most
    ``connect_timeout_s``. Credentials and the db are checked by the first request (ConfigError);
    a server that goes away after this only degrades the tier, which comes back with it."""
    try:
        if options.path:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(options.connect_timeout_s)
                sock.connect(options.path)
        else:
            socket.create_connection((options.host, options.port), timeout=options.connect_timeout_s).close()
    except OSError as exc:  # refused, no route, no such socket, unknown host, timed out
        raise BackendUnavailableError(f"redis at {options.url} cannot be reached: {exc}") from exc


def _glob_escape(prefix: bytes) -> bytes:
    """``prefix`` as a literal in a Redis glob pattern (SCAN MATCH)."""
    return b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in prefix)


class RedisBackend(Backend):
    scheme = "redis"
    capabilities = Capabilities(zero_copy=True, persistent=False, shared_across_processes=True, shared_across_nodes=True,
                                compares_before_delete=True)
    moves_parts = True

    def __init__(self, pool: HostPool | None, options: RedisOptions) -> None:
        self.check_dependencies()
        import redis.asyncio  # only whoever opens a redis URL needs redis-py

        reach(options)
        super().__init__(pool, max_workers=1, timeout_s=options.socket_timeout_s)
        self.options = options
        if not options.zero_copy:
            self.capabilities = replace(type(self).capabilities, zero_copy=False)
        self._prefix = options.prefix.encode()
        self._gate = asyncio.Semaphore(options.max_in_flight)  # page values
        self._control_gate = asyncio.Semaphore(options.max_in_flight)  # EXISTS, DEL, CONFIG, SCAN...
        self._idle: list[RespConnection] = []
        self._client = redis.asyncio.Redis.from_pool(self._redis_py_pool(options))  # owns and closes the pool
        self._server_checked = False
        self._warned_no_scripts = False

    @classmethod
    def check_dependencies(cls) -> None:
        try:
            import redis.asyncio  # noqa: F401
        except ImportError as exc:
            raise MissingExtraError("redis://, rediss:// and unix:// need the redis module (redis-py): "
                                    "pip install 'tiered-kv[redis]'") from exc

    @staticmethod
    def _redis_py_pool(options: RedisOptions):
        import redis.asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError

        common: dict[str, Any] = dict(
            db=options.db, username=options.username or None, password=options.password or None,
            socket_timeout=options.socket_timeout_s, socket_connect_timeout=options.connect_timeout_s,
            max_connections=2 * options.max_in_flight,  # the control lane's and the copied values'
            # One immediate retry on a fresh connection: a pooled one may be stale after a server
            # restart. Safe, every command we send is idempotent (SET NX included). Timeouts are
            # not retried; our own timeout bounds the whole call anyway.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        if options.path:
            return redis.asyncio.ConnectionPool(connection_class=redis.asyncio.UnixDomainSocketConnection, path=options.path, **common)
        if options.tls:
            return redis.asyncio.ConnectionPool(connection_class=redis.asyncio.SSLConnection, host=options.host, port=options.port,
                                                **common, **options.redis_py_tls())
        return redis.asyncio.ConnectionPool(host=options.host, port=options.port, **common)

    @classmethod
    def from_url(cls, url: str, pool: HostPool | None, **options: Any) -> "RedisBackend":
        return cls(pool, parse_redis_url(url, options))

    def _key(self, key: str) -> bytes:
        return self._prefix + key.encode("ascii")

    # --- listing, for inspection (reads only) -------------------------------------------------
    async def scan(self) -> AsyncIterator[tuple[str, int | None]]:
        """``SCAN MATCH <prefix>*`` over this backend's key prefix, with each key's ``STRLEN``
        (bytes None for a key of another Redis type); names are the keys without the prefix."""
        pattern = _glob_escape(self._prefix) + b"*"
        cursor: int = 0
        while True:
            cursor, found = await self._py("SCAN", lambda c=cursor: self._client.scan(c, match=pattern, count=1000))
            if found:
                for name, size in zip(found, await self._py("STRLEN", lambda f=found: self._lengths(f))):
                    yield name[len(self._prefix):].decode("utf-8", "surrogateescape"), size
            if int(cursor) == 0:
                return

    async def _lengths(self, keys: list[bytes]) -> list[int | None]:
        import redis.exceptions as rex

        async with self._client.pipeline(transaction=False) as pipe:
            for k in keys:
                pipe.strlen(k)
            replies = await pipe.execute(raise_on_error=False)
        lengths: list[int | None] = []
        for reply in replies:
            if isinstance(reply, rex.ResponseError) and _is_wrong_type(str(reply)):
                lengths.append(None)
            elif isinstance(reply, Exception):
                raise reply
            else:
                lengths.append(int(reply))
        return lengths

    async def read_stored(self, name: str, length: int | None = None) -> bytes | None | NotARecord:
        import redis.exceptions as rex

        key = self._prefix + name.encode("utf-8", "surrogateescape")
        if length is not None and length <= 0:
            return b""

        async def run() -> bytes | None | NotARecord:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.exists(key)
                if length is None:
                    pipe.get(key)
                else:
                    pipe.getrange(key, 0, length - 1)
                present, value = await pipe.execute(raise_on_error=False)
            if isinstance(value, rex.ResponseError) and _is_wrong_type(str(value)):
                return _NOT_A_STRING
            for reply in (present, value):
                if isinstance(reply, Exception):
                    raise reply
            # GETRANGE answers "" for an absent key: EXISTS in the same round trip tells them apart.
            return bytes(value) if present and value is not None else None
        return await self._py("GET", run)

    # --- error mapping ----------------------------------------------------------------------
    async def _mapped(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run one request, mapping socket, redis-py and server errors onto our tree."""
        import redis.exceptions as rex

        where = f"redis at {self.options.address}"
        try:
            async with asyncio.timeout(self.options.socket_timeout_s):
                return await call()
        except (TimeoutError, rex.TimeoutError) as exc:
            raise BackendTimeoutError(f"{where}: {what} took longer than {self.options.socket_timeout_s}s") from exc
        except rex.AuthenticationError as exc:
            raise ConfigError(f"{where} refused our credentials: {exc}") from exc
        except (OSError, rex.ConnectionError) as exc:
            raise BackendUnavailableError(f"{where}: {what} failed: {exc}") from exc
        except (RespError, rex.ResponseError) as exc:
            if _config_problem(str(exc)):
                raise ConfigError(f"{where} (db {self.options.db}) rejected our settings: {exc}") from exc
            raise BackendError(f"{where}: {what}: server error: {exc}{self._hint(str(exc))}") from exc
        except (ValueError, rex.RedisError) as exc:  # int() of a garbled reply, other client errors
            raise BackendError(f"{where}: {what}: {exc}") from exc

    async def _raw(self, what: str, request: Callable[[RespConnection], Awaitable[T]]) -> T:
        """One request on a raw connection, at most ``max_in_flight`` at once.

        The connection goes back to the idle list only after a complete, successful exchange;
        any failure or cancellation closes it, so no later request reads a stale half reply.
        """
        self._check_open()
        async with self._gate:
            async def exchange() -> T:
                conn = await self._connection()
                try:
                    result = await request(conn)
                except BaseException:
                    conn.close()
                    raise
                if self._closed:
                    conn.close()
                else:
                    self._idle.append(conn)
                return result
            return await self._mapped(what, exchange)

    async def _connection(self) -> RespConnection:
        """An idle connection that is still good (stale ones after a server restart are dropped
        here, so the first request after a restart does not fail), else a new one."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.is_stale():
                return conn
            conn.close()
        return await RespConnection.open(self.options)

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError(f"redis backend for {self.options.address} is closed")

    async def _py(self, what: str, call: Callable[[], Awaitable[T]], *, value: bool = False) -> T:
        """One redis-py request: in the values' lane (``value``: a copied GET or SET) or the control lane."""
        self._check_open()
        async with self._gate if value else self._control_gate:
            return await self._mapped(what, call)

    async def _check_server_once(self) -> None:
        """Before the first request: one warning when the server's memory is unbounded
        (``maxmemory 0``) or it never evicts (``noeviction``); it then grows until it refuses
        every write. Quietly nothing when CONFIG is refused (managed servers, ACLs) or fails: the
        request itself reports an unreachable server."""
        if self._server_checked:
            return
        self._server_checked = True  # first, so concurrent first requests check once
        import redis.exceptions as rex

        try:
            async with self._control_gate, asyncio.timeout(self.options.socket_timeout_s):
                raw = await self._client.config_get("maxmemory*")
        except (rex.RedisError, OSError, TimeoutError):
            return
        config = {_text(k): _text(v) for k, v in raw.items()}
        maxmemory, policy = config.get("maxmemory"), config.get("maxmemory-policy")
        problems = []
        if maxmemory == "0":
            problems.append("maxmemory 0 (no bound)")
        if policy == "noeviction":
            problems.append("maxmemory-policy noeviction")
        if problems:
            log.warning("redis at %s runs with %s: it keeps every page until it refuses writes or the host runs "
                        "out of memory; set maxmemory and maxmemory-policy allkeys-lru for a cache",
                        self.options.address, " and ".join(problems))

    # --- primitives -------------------------------------------------------------------------
    async def _exists(self, keys: list[str]) -> list[bool]:
        await self._check_server_once()

        async def run() -> list[bool]:
            # TYPE, not EXISTS: a key of another Redis type is no page of ours.
            async with self._client.pipeline(transaction=False) as pipe:
                for k in keys:
                    pipe.type(self._key(k))
                return [_text(t) == "string" for t in await pipe.execute()]
        return await self._py("TYPE", run)

    async def _delete(self, keys: list[str]) -> None:
        await self._check_server_once()
        await self._py("DEL", lambda: self._client.delete(*(self._key(k) for k in keys)))

    async def _delete_corrupt(self, found: list[tuple[str, int, OtherLength | None]]) -> None:
        """One script per key (``_DELETE_IF_AS_READ``, atomic on the server): deleted only while it
        holds the value the get read. A server that refuses scripts (an ACL without EVAL) gets the
        plain DEL of before, with one warning."""
        import redis.exceptions as rex

        await self._check_server_once()
        calls = []
        for key, slot, other in found:
            view = self.pool.record_contents(slot)
            length = read_length(other, len(view))
            n = min(length, len(view))
            calls.append((self._key(key), length, n, hashlib.sha1(view[:n]).hexdigest()))

        async def run() -> None:
            async with self._client.pipeline(transaction=False) as pipe:
                for call in calls:
                    pipe.eval(_DELETE_IF_AS_READ, 1, *call)
                await pipe.execute()
        try:
            await self._py("EVAL", run)
        except (BackendError, ConfigError) as exc:
            if not isinstance(exc.__cause__, rex.ResponseError):
                raise
            if not self._warned_no_scripts:
                self._warned_no_scripts = True
                log.warning("redis at %s refused the compare-and-delete script (%s): corrupt pages are deleted "
                            "whatever the key holds by then", self.options.address, exc)
            await self._delete([key for key, _, _ in found])

    async def _get(self, keys: list[str], slots: list[int]) -> list[bool | OtherLength | NotARecord]:
        await self._check_server_once()
        fetch = self._get_zero_copy if self.options.zero_copy else self._get_copying
        return await all_or_nothing(fetch(k, s) for k, s in zip(keys, slots))

    async def _put(self, keys: list[str], slots: list[int]) -> list[bool]:
        await self._check_server_once()
        store = self._put_zero_copy if self.options.zero_copy else self._put_copying
        return await all_or_nothing(store(k, s) for k, s in zip(keys, slots))

    async def _get_zero_copy(self, key: str, slot: int) -> bool | OtherLength | NotARecord:
        parts = self.pool.record_parts(slot)
        size = self.pool.record_bytes
        command = encode_command(b"GET", self._key(key))

        async def request(conn: RespConnection) -> int:
            await conn.send(command)
            try:
                return await conn.read_bulk_into(parts)
            except RespError as exc:
                if _is_wrong_type(str(exc)):
                    return _WRONG_TYPE  # the whole error line was read: the connection stays good
                raise

        length = await self._raw("GET", request)
        if length == _WRONG_TYPE:
            return _NOT_A_STRING
        if length < 0:
            return False
        return True if length == size else OtherLength(length, size)

    async def _get_copying(self, key: str, slot: int) -> bool | OtherLength | NotARecord:
        import redis.exceptions as rex

        async def run() -> bytes | None | NotARecord:
            try:
                return await self._client.get(self._key(key))
            except rex.ResponseError as exc:
                if _is_wrong_type(str(exc)):
                    return _NOT_A_STRING
                raise

        value = await self._py("GET", run, value=True)
        if value is None or isinstance(value, NotARecord):
            return False if value is None else value
        self.pool.fill_record(slot, value)
        size = self.pool.record_bytes
        return True if len(value) == size else OtherLength(len(value), size)

    def _set_args(self) -> list[bytes]:
        return [b"NX", b"PX", str(self.options.ttl_ms).encode()] if self.options.ttl_ms else [b"NX"]

    async def _put_zero_copy(self, key: str, slot: int) -> bool:
        parts = self.pool.record_parts(slot)
        k = self._key(key)
        extra = self._set_args()
        # *N, SET, key, then the value's length line; the value itself goes out from the slot.
        head = b"*%d\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (3 + len(extra), len(k), k, self.pool.record_bytes)
        tail = b"\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in extra)

        async def request(conn: RespConnection) -> tuple[bytes, bytes]:
            await conn.send(head, *parts, tail)
            return await conn.read_reply()

        kind, reply = await self._raw("SET", request)
        if kind == b"-":
            message = reply.decode(errors="replace")
            if _is_oom(message):
                return False
            raise self._server_error("SET", message)
        return True  # +OK: stored; nil: already present, which counts as success

    async def _put_copying(self, key: str, slot: int) -> bool:
        import redis.exceptions as rex

        value = bytes(self.pool.record_contents(slot))
        px = self.options.ttl_ms or None

        async def run() -> bool:
            try:
                await self._client.set(self._key(key), value, nx=True, px=px)
            except rex.OutOfMemoryError:
                return False
            return True
        return await self._py("SET", run, value=True)

    def _server_error(self, what: str, message: str) -> Exception:
        if _config_problem(message):
            return ConfigError(f"redis at {self.options.address} rejected our settings: {message}")
        return BackendError(f"redis at {self.options.address}: {what}: server error: {message}{self._hint(message)}")

    def _hint(self, message: str) -> str:
        if "invalid bulk length" in message and not self.key_only:  # only a SET (a data call) meets it
            return f" (the server's proto-max-bulk-len is below the record size, {self.pool.record_bytes} B)"
        return ""

    async def _close(self) -> None:
        while self._idle:
            self._idle.pop().close()
        await self._client.aclose()
