"""Real Mooncake processes for tests: a master on free loopback ports, raw clients, a reader process.

``MooncakeMaster`` starts the ``mooncake_master`` binary of the installed wheel with its embedded
HTTP metadata server, everything bound to 127.0.0.1, and waits until both ports answer; ``kill``
and ``restart`` (same ports) are for failure tests. ``RawClient`` is a plain store client (no
tiered-kv record handling) that writes arbitrary bytes under a key, as a foreign or broken writer
would. ``python -m tests.backends.mooncake_server read URL KEY...`` is a second process that opens
the backend as a pure client and prints what it read as JSON (sha256 of each record, or null).

Clients need ``MC_TCP_BIND_ADDRESS=127.0.0.1`` in their environment (``LOOPBACK_ENV``).
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LOOPBACK_ENV = {"MC_TCP_BIND_ADDRESS": "127.0.0.1"}
REPO_ROOT = Path(__file__).resolve().parents[2]


def master_binary() -> str:
    """The wheel's own ``mooncake_master`` (the one on PATH may be a Python launcher around it)."""
    import mooncake

    path = Path(mooncake.__file__).with_name("mooncake_master")
    if path.is_file():
        return str(path)
    found = shutil.which("mooncake_master")
    if found is None:
        raise FileNotFoundError("mooncake_master is neither in the mooncake package nor on PATH")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


class MooncakeMaster:
    """A ``mooncake_master`` on 127.0.0.1 with its HTTP metadata server, on ports of its own."""

    def __init__(self, *extra_args: str) -> None:
        self.rpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.extra_args = extra_args
        self._logdir = tempfile.TemporaryDirectory(prefix="tkv-mooncake-")
        self.log_path = Path(self._logdir.name) / "master.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> "MooncakeMaster":
        args = [
            master_binary(), "--enable_http_metadata_server=true",
            "--rpc_address=127.0.0.1", f"--rpc_port={self.rpc_port}",
            "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={self.http_port}",
            "--metrics_host=127.0.0.1", f"--metrics_port={self.metrics_port}",
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not (_answers(self.rpc_port) and _answers(self.http_port)):
            if self.process.poll() is not None:
                raise RuntimeError(f"mooncake_master exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"mooncake_master not ready within {timeout_s}s:\n{self.log_tail()}")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would: no goodbye to the clients."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._logdir.cleanup()

    def restart(self) -> None:
        self.kill()
        self.start()

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def url(self, **options: Any) -> str:
        """A ``mooncake://`` URL for this master; ``options`` are added to the query."""
        query = {
            "metadata_server": f"http://127.0.0.1:{self.http_port}/metadata",
            "protocol": "tcp",
            "local_hostname": "127.0.0.1",
            **options,
        }
        text = "&".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in query.items())
        return f"mooncake://127.0.0.1:{self.rpc_port}?{text}"


class RawClient:
    """A plain Mooncake client without tiered-kv's records, for writing foreign or broken objects."""

    def __init__(self, master: MooncakeMaster, buffer_bytes: int = 4 << 20) -> None:
        from tiered_kv.backends.mooncake import MooncakeOptions, open_store

        self.store = open_store(MooncakeOptions.from_url(master.url(contribute_segment=False, timeout_s=10)))
        self.buffer = bytearray(buffer_bytes)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.buffer))
        assert self.store.register_buffer(self.address, len(self.buffer)) == 0

    def put(self, key: str, data: bytes) -> int:
        self.buffer[:len(data)] = data
        return self.store.batch_put_from([key], [self.address], [len(data)])[0]

    def close(self) -> None:
        self.store.unregister_buffer(self.address)
        self.store.close()


def segment_holder(master: MooncakeMaster, segment_bytes: str = "64MiB"):
    """A second process contributing ``segment_bytes`` to ``master``'s store (``with`` it)."""
    from tiered_kv.backends.mooncake import MooncakeOptions
    from tiered_kv.ops.bench.segment_holder import SegmentHolder

    return SegmentHolder(MooncakeOptions.from_url(master.url(global_segment_bytes=segment_bytes, timeout_s=10)))


def record_digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def run_reader(url: str, keys: list[str], timeout_s: float = 60.0) -> dict[str, str | None]:
    """Read ``keys`` through the backend in a second process; sha256 of each record (None = miss)."""
    env = {**os.environ, **LOOPBACK_ENV}
    done = subprocess.run([sys.executable, "-m", "tests.backends.mooncake_server", "read", url, *keys],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"reader process failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


async def _read(url: str, keys: list[str]) -> dict[str, str | None]:
    from tiered_kv import HostPool
    from tiered_kv.backends import open_backend

    from .contract import SPEC

    with HostPool(SPEC, len(keys), "page_first") as pool:
        async with open_backend(url, pool) as backend:
            slots = pool.allocate(len(keys))
            hits = await backend.get_into(keys, slots)
            return {k: record_digest(pool.record_view(s)) if hit else None for k, s, hit in zip(keys, slots, hits)}


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "read":
        sys.exit("usage: python -m tests.backends.mooncake_server read URL KEY...")
    print(json.dumps(asyncio.run(_read(sys.argv[2], sys.argv[3:]))), flush=True)
