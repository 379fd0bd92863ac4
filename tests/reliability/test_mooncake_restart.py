"""A Mooncake master killed halfway through a replay and started again: the tier degrades, and it is
called back only once this client's segment is mounted again, so no put after its return is
refused for want of space. Every request is served, no page is wrong."""

from __future__ import annotations

import asyncio
import importlib.util
import time

import pytest

if importlib.util.find_spec("mooncake") is None:
    pytest.skip("the mooncake module is not installed", allow_module_level=True)

from tiered_kv.backends import open_backend
from tiered_kv.compose import Hierarchy
from tiered_kv.errors import BackendError
from tiered_kv.ops.replay import synthetic_chat

from ..backends.mooncake_server import LOOPBACK_ENV, MooncakeMaster
from ..ops.replay.conftest import TINY_CHAT
from .conftest import guarded_replay, report

WAIT_S = 30.0


@pytest.fixture
def master(monkeypatch):
    for key, value in LOOPBACK_ENV.items():
        monkeypatch.setenv(key, value)
    server = MooncakeMaster().start()
    asyncio.run(_first_client_and_reconnect(server))
    yield server
    server.stop()


async def _first_client_and_reconnect(server: MooncakeMaster) -> None:
    """The store library's first client, and its first reconnect to a restarted master, open what
    the library keeps for the life of the process (event loops, timers, sockets; later clients and
    reconnects add none): made here, before the replay counts its file descriptors."""
    async with open_backend(server.url(global_segment_bytes="16MiB", timeout_s=5), None) as backend:
        server.restart()
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                await backend.check_health("reliability-probe")
                return
            except BackendError:
                assert time.monotonic() < deadline, "the first client never reconnected"
                await asyncio.sleep(0.05)


class RestartHalfway:
    """After request ``at``: kill the master, let the tier find it gone (an ``exists``), start the
    master again and time how long the tier takes to come back. The replay waits meanwhile."""

    def __init__(self, master: MooncakeMaster, at: int) -> None:
        self.master, self.at = master, at
        self.recover_s: float | None = None

    def __call__(self, h: Hierarchy, result) -> None:
        if result.index != self.at:
            return
        self.master.kill()
        h.controller.exists(["reliability-probe"]).result(WAIT_S)
        _until(lambda: h.controller.degraded, "the tier never degraded")
        self.master.start()
        back = time.monotonic()
        _until(lambda: not h.controller.degraded, "the tier never came back")
        self.recover_s = time.monotonic() - back


def _until(condition, message: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.005)


def test_a_master_restart_halfway_through_a_replay(master):
    requests = synthetic_chat(TINY_CHAT)
    restart = RestartHalfway(master, at=len(requests) // 2)
    run = guarded_replay(requests, master.url(global_segment_bytes="64MiB", timeout_s=5), during=restart)
    assert restart.recover_s is not None and run.summary["l3_degraded_episodes"] == 1
    assert run.backend.puts > 0
    assert run.backend.put_rejected == 0, "puts were refused after the tier came back"
    report({"requests": run.summary["requests"], "pages_wrong": run.summary["pages_wrong"],
                                "recover_s": round(restart.recover_s, 2), "puts": run.backend.puts,
                                "puts_refused": run.backend.put_rejected})
