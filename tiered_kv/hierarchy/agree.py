"""Ranks settling on one hit length over loopback (or any) TCP: the ``agree`` hook of the manager.

``TcpAgreement(rank, world_size, address, deadline_s)`` is a callable ``agree(hit_pages) -> int``.
Rank 0 listens on ``address``; every other rank connects, sends ``"<round> <pages>\n"`` and waits
for the minimum, which rank 0 sends back once all ranks of that round have answered. Rounds are
numbered per agreement object, so a late message from a round that timed out is ignored. When the
deadline passes first (a rank hung, died or is elsewhere), every waiting rank raises
``AgreeTimeout``: the manager then takes no L2 / L3 hit and the request is recomputed; nobody hangs.

Small and synchronous on purpose: it runs on the scheduler's thread at lookup time, once per
request, and moves a few bytes. Engines with a process group of their own (torch.distributed, a
gloo ``all_reduce(MIN)`` with a timeout) plug that in as ``agree`` instead.
"""

from __future__ import annotations

import socket
import time

from ..errors import ConfigError
from .manager import AgreeTimeout


class TcpAgreement:
    """``agree(pages)``: the minimum of every rank's ``pages`` for this round, or AgreeTimeout."""

    def __init__(self, rank: int, world_size: int, address: tuple[str, int], deadline_s: float = 2.0) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ConfigError(f"world_size must be an int >= 1, got {world_size!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ConfigError(f"rank must be an int in 0..{world_size - 1}, got {rank!r}")
        if not isinstance(deadline_s, (int, float)) or not 0 < deadline_s < float("inf"):
            raise ConfigError(f"deadline_s must be a finite number > 0, got {deadline_s!r}")
        self.rank, self.world_size, self.address, self.deadline_s = rank, world_size, tuple(address), float(deadline_s)
        self.round = 0
        self.timeouts = 0
        self._listener: socket.socket | None = None
        if rank == 0 and world_size > 1:
            self._listener = socket.create_server(self.address, backlog=max(16, 4 * world_size))

    @property
    def port(self) -> int:
        """The port rank 0 listens on (``address`` may have asked for port 0)."""
        assert self._listener is not None
        return self._listener.getsockname()[1]

    def __call__(self, pages: int) -> int:
        if isinstance(pages, bool) or not isinstance(pages, int) or pages < 0:
            raise ConfigError(f"agree: pages must be an int >= 0, got {pages!r}")
        self.round += 1
        if self.world_size == 1:
            return pages
        deadline = time.monotonic() + self.deadline_s
        try:
            return self._collect(pages, deadline) if self.rank == 0 else self._ask(pages, deadline)
        except AgreeTimeout:
            self.timeouts += 1
            raise

    # --- rank 0 ------------------------------------------------------------------------------
    def _collect(self, pages: int, deadline: float) -> int:
        assert self._listener is not None
        peers: list[socket.socket] = []
        values = [pages]
        try:
            while len(values) < self.world_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AgreeTimeout(f"agree round {self.round}: {len(values)} of {self.world_size} ranks "
                                       f"answered within {self.deadline_s}s")
                self._listener.settimeout(left)
                try:
                    conn, _ = self._listener.accept()
                except TimeoutError:
                    continue
                message = _read_line(conn, deadline)
                parsed = _parse(message)
                if parsed is None or parsed[0] != self.round:
                    conn.close()  # a late rank of an earlier round, or garbage
                    continue
                peers.append(conn)
                values.append(parsed[1])
            agreed = min(values)
            for conn in peers:
                try:
                    conn.sendall(f"{self.round} {agreed}\n".encode())
                except OSError:
                    pass  # that rank gave up already; it recomputes on its own
            return agreed
        finally:
            for conn in peers:
                conn.close()

    # --- other ranks -------------------------------------------------------------------------
    def _ask(self, pages: int, deadline: float) -> int:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AgreeTimeout(f"agree round {self.round}: rank 0 at {self.address} did not answer "
                                   f"within {self.deadline_s}s")
            try:
                conn = socket.create_connection(self.address, timeout=left)
                break
            except OSError:
                time.sleep(min(0.01, max(left, 0)))  # rank 0 not listening yet
        with conn:
            try:
                conn.sendall(f"{self.round} {pages}\n".encode())
            except OSError:
                raise AgreeTimeout(f"agree round {self.round}: rank 0 closed the connection") from None
            parsed = _parse(_read_line(conn, deadline))
        if parsed is None or parsed[0] != self.round:
            raise AgreeTimeout(f"agree round {self.round}: no answer from rank 0 within {self.deadline_s}s")
        return min(parsed[1], pages)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None


def _read_line(conn: socket.socket, deadline: float, limit: int = 64) -> bytes:
    data = b""
    while b"\n" not in data and len(data) < limit:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        conn.settimeout(left)
        try:
            chunk = conn.recv(limit)
        except (TimeoutError, OSError):
            break
        if not chunk:
            break
        data += chunk
    return data


def _parse(message: bytes) -> tuple[int, int] | None:
    try:
        round_text, pages_text = message.decode("ascii").split()
        round_no, pages = int(round_text), int(pages_text)
    except (UnicodeDecodeError, ValueError):
        return None
    return (round_no, pages) if pages >= 0 else None


__all__ = ["TcpAgreement"]
