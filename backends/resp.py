"""A minimal RESP (Redis protocol) client on a raw non-blocking socket, for page values.

Why it exists: redis-py copies every ~3 MB value two or three times. Here a ``GET`` reply's bulk
string is received with ``sock_recv_into`` straight into a caller's buffer (a host slot), and a
``SET`` value is sent from the caller's memoryview without being joined into one bytes object.
It speaks just what the Redis backend needs: AUTH / SELECT on connect, one request at a time,
simple / error / integer / bulk replies. A connection that fails or is cancelled midway must be
closed by its owner, never reused.
"""

from __future__ import annotations

import asyncio
import errno
import socket

from .redis_options import RedisOptions

_RECV_CHUNK = 64 * 1024  # small replies and the first bytes of a bulk reply
_DRAIN_CHUNK = 1 << 20


class RespError(Exception):
    """An error reply (``-ERR ...``) from the server, on the raw path."""


# --- the zero-copy value path -------------------------------------------------------------------
class RespConnection:
    """One raw, non-blocking socket to the server, with a tiny RESP2 reader.

    Only ever used by one request at a time. Any exception leaves it in an unknown state: the
    owner closes it (``RedisBackend._raw``) instead of returning it to the idle list.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()
        self._chunk = bytearray(_RECV_CHUNK)

    @classmethod
    async def open(cls, options: RedisOptions) -> "RespConnection":
        loop = asyncio.get_running_loop()
        if options.path:
            family, address = socket.AF_UNIX, options.path
        else:
            infos = await loop.getaddrinfo(options.host, options.port, type=socket.SOCK_STREAM)
            family, _, _, _, address = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            if family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            async with asyncio.timeout(options.connect_timeout_s):
                await loop.sock_connect(sock, address)
            conn = cls(sock)
            await conn._handshake(options)
        except BaseException:
            sock.close()
            raise
        return conn

    async def _handshake(self, options: RedisOptions) -> None:
        commands = []
        if options.password:
            user = [options.username.encode()] if options.username else []
            auth = [b"AUTH", *user, options.password.encode()]
            commands.append(auth)
        if options.db:
            commands.append([b"SELECT", str(options.db).encode()])
        if not commands:
            return
        await self.send(b"".join(encode_command(*c) for c in commands))
        for _ in commands:
            kind, value = await self.read_reply()
            if kind == b"-":
                raise RespError(value.decode(errors="replace"))

    def close(self) -> None:
        self.sock.close()

    def is_stale(self) -> bool:
        """True when an idle connection can no longer be used: the server closed it (restart,
        ``timeout`` setting) or sent something unasked. One non-blocking peek, no round trip."""
        try:
            self.sock.recv(1, socket.MSG_PEEK)  # b"": closed by the server; bytes: unasked data
            return True
        except BlockingIOError:
            return False  # alive, nothing pending: the normal case
        except OSError:
            return True

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    async def send(self, *parts: bytes | memoryview) -> None:
        for part in parts:
            await self.loop.sock_sendall(self.sock, part)

    async def _fill(self) -> None:
        n = await self.loop.sock_recv_into(self.sock, self._chunk)
        if n == 0:
            raise ConnectionResetError(errno.ECONNRESET, "redis closed the connection")
        self._buf += memoryview(self._chunk)[:n]

    async def _line(self) -> bytes:
        while True:
            end = self._buf.find(b"\r\n")
            if end >= 0:
                line = bytes(self._buf[:end])
                del self._buf[:end + 2]
                return line
            if len(self._buf) > _RECV_CHUNK:
                raise RespError("protocol: reply line too long")
            await self._fill()

    async def _exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            await self._fill()
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def read_reply(self) -> tuple[bytes, bytes]:
        """A simple reply: (``+``/``-``/``:``, line) or (``$``, small bulk value or b"" for nil)."""
        line = await self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"$":
            length = int(rest)
            if length < 0:
                return b"$", b""
            value = await self._exact(length + 2)
            return b"$", value[:-2]
        if kind not in (b"+", b"-", b":"):
            raise RespError(f"protocol: unexpected reply {line[:40]!r}")
        return kind, rest

    async def read_bulk_into(self, views: list[memoryview]) -> int:
        """Receive a bulk reply straight into ``views``, filled in order (a record's parts);
        returns its length, -1 for nil.

        A value of another length than the views together lands as far as they reach (its first
        bytes: a page record's header, so the caller can tell whose it is) and the rest is consumed
        and discarded; its length is returned, so the caller can tell.
        """
        line = await self._line()
        if line[:1] == b"-":
            raise RespError(line[1:].decode(errors="replace"))
        if line[:1] != b"$":
            raise RespError(f"protocol: expected a bulk reply, got {line[:40]!r}")
        length = int(line[1:])
        if length < 0:
            return -1
        take = min(length, sum(len(view) for view in views))
        left = take
        for view in views:
            if left <= 0:
                break
            await self._recv_into(view[:left])
            left -= min(len(view), left)
        if take < length:
            await self._discard(length - take)
        if await self._exact(2) != b"\r\n":
            raise RespError("protocol: bulk value not terminated by CRLF")
        return length

    async def _recv_into(self, view: memoryview) -> None:
        """Fill ``view`` exactly: first from what is buffered, then straight from the socket."""
        have = min(len(view), len(self._buf))
        view[:have] = self._buf[:have]
        del self._buf[:have]
        while have < len(view):
            n = await self.loop.sock_recv_into(self.sock, view[have:])
            if n == 0:
                raise ConnectionResetError(errno.ECONNRESET, "redis closed the connection mid-value")
            have += n

    async def _discard(self, n: int) -> None:
        take = min(n, len(self._buf))
        del self._buf[:take]
        n -= take
        scratch = bytearray(min(n, _DRAIN_CHUNK))
        while n > 0:
            got = await self.loop.sock_recv_into(self.sock, memoryview(scratch)[:min(n, len(scratch))])
            if got == 0:
                raise ConnectionResetError(errno.ECONNRESET, "redis closed the connection mid-value")
            n -= got


def encode_command(*args: bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)
