"""Test helpers: a real ``redis-server`` on a free loopback port, and a delaying TCP proxy.

``RedisServer`` starts ``redis-server`` from PATH bound to 127.0.0.1 (and a unix socket) in a
temp dir of its own (removed on exit), without persistence (``--save ''``, ``--appendonly no``),
with maxmemory and an eviction policy, optionally TLS-only with client certificates made by the
``openssl`` CLI. It waits until the server answers PING. It can be stopped, killed with SIGKILL,
paused (SIGSTOP: a hung server) and restarted on the same port, which the failure tests need.

``DelayProxy`` forwards loopback TCP to a server and trickles the server's replies back in small
chunks with a delay, so a test can cancel a request while its reply is still arriving.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(port: int, tls: ssl.SSLContext | None = None) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as raw:
            if tls is None:
                raw.sendall(b"PING\r\n")
                return raw.recv(64).startswith((b"+PONG", b"-NOAUTH"))  # NOAUTH: up, wants a password
            with tls.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def make_certificates(directory: Path) -> dict[str, str]:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate (openssl CLI)."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=tiered-kv test CA")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        (directory / f"{name}.ext").write_text(ext + "\n")
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    return {n: str(directory / n) for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


class RedisServer:
    """One ``redis-server`` process on ``127.0.0.1:port`` and ``<dir>/redis.sock``."""

    def __init__(self, *, maxmemory: str = "256mb", policy: str = "allkeys-lru",
                 extra: tuple[str, ...] = (), tls: bool = False) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server not found on PATH (apt-get install redis-server)")
        # Its own short temp dir: a unix socket path must stay under 108 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="tkv-redis-"))
        self.port = free_port()
        self.socket_path = str(self.dir / "redis.sock")
        self.args = ["--maxmemory", maxmemory, "--maxmemory-policy", policy, *extra]
        self.process: subprocess.Popen | None = None
        self.certs: dict[str, str] = {}
        self._tls: ssl.SSLContext | None = None
        if tls:  # TLS only, client certificates required: every TLS option of the backend is used
            self.certs = make_certificates(self.dir)
            self.args += ["--tls-port", str(self.port), "--tls-cert-file", self.certs["server.crt"],
                          "--tls-key-file", self.certs["server.key"], "--tls-ca-cert-file", self.certs["ca.crt"],
                          "--tls-auth-clients", "yes"]
            self._tls = ssl.create_default_context(cafile=self.certs["ca.crt"])
            self._tls.load_cert_chain(self.certs["client.crt"], self.certs["client.key"])

    @property
    def tls_url(self) -> str:
        c = self.certs
        return (f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={c['ca.crt']}"
                f"&ssl_certfile={c['client.crt']}&ssl_keyfile={c['client.key']}")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket_path}?db=0"

    def start(self, timeout_s: float = 10.0) -> "RedisServer":
        self.process = subprocess.Popen(
            [REDIS_SERVER, "--port", "0" if self._tls else str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", "--appendonly", "no", "--unixsocket", self.socket_path, "--unixsocketperm", "700",
             "--logfile", str(self.dir / "redis.log"), *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while not _ping(self.port, self._tls):
            if self.process.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.process.returncode}:\n{log}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING within {timeout_s}s")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-request, as after a crash."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def pause(self) -> None:
        """SIGSTOP: the server hangs; connections stay open and nothing answers."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def restart(self) -> None:
        """Kill and start again on the same port (no persistence: the data is gone)."""
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is None:
            return
        os.kill(self.process.pid, signal.SIGCONT)  # a paused server cannot handle SIGTERM
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class DelayProxy:
    """Loopback TCP proxy that trickles bytes in ``chunk``-byte pieces, one per ``delay_s``:
    server -> client by default, client -> server with ``upstream=True``. Start it with
    ``await proxy.start()``; ``forwarded`` counts the bytes trickled so far."""

    def __init__(self, target_port: int, *, chunk: int = 8192, delay_s: float = 0.01, upstream: bool = False) -> None:
        self.target_port = target_port
        self.chunk = chunk
        self.delay_s = delay_s
        self.upstream = upstream
        self.forwarded = 0
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> "DelayProxy":
        # Small buffers on the proxy's side (inherited by accepted sockets): a trickling proxy must
        # also hold the sender back, as a slow link would, instead of swallowing megabytes at once.
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        listener.bind(("127.0.0.1", 0))
        self._server = await asyncio.start_server(self._handle, sock=listener, limit=16 * 1024)
        self.port = listener.getsockname()[1]
        return self

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        up = asyncio.create_task(self._pipe(client_r, server_w, self.delay_s if self.upstream else 0.0))
        down = asyncio.create_task(self._pipe(server_r, client_w, 0.0 if self.upstream else self.delay_s))
        self._tasks |= {up, down}
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for t in (up, down):
            t.cancel()
        for w in (client_w, server_w):
            w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
        try:
            while data := await reader.read(self.chunk):
                if delay_s:
                    await asyncio.sleep(delay_s)
                    self.forwarded += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # either side went away: the handler closes both

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
