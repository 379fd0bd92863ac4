"""Checks every test of the suite gets for free: host slots all free, no asyncio task left behind.

Each ``HostPool`` a test creates is tracked. After the test, the slots the test itself still has
allocated are given back (a test's own ``allocate`` calls are its business), and then every slot
must be free within a short wait: a slot that stays pending is held by work that never completed (a
backend thread still writing, a hold nobody released, a completion that never finishes), which is
exactly what the library must not leave behind. The hierarchy's tests check more strictly (every
slot free with nothing given back first, ``tests/hierarchy/conftest.py``). A test that means to end
with slots held says so with the marker ``holds_slots``. Each ``async def`` test must end with no task of its loop still pending other
than itself: a backend or controller that leaves a task running would otherwise go unnoticed.
"""

from __future__ import annotations

import asyncio
import os
import inspect
import time

import pytest

from tiered_kv.model.host_pool import HostPool

from .backends.mooncake_server import LOOPBACK_ENV, MooncakeMaster
from .backends.redis_server import REDIS_SERVER, RedisServer

try:  # the GPU machine has no pytest-asyncio; its GPU tests are synchronous
    import pytest_asyncio  # noqa: F401

    ASYNC_TESTS = True
except ImportError:
    ASYNC_TESTS = False


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "holds_slots: the test ends with host slots allocated on purpose")


@pytest.fixture(autouse=True)
def _every_host_slot_is_free_afterwards(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    created: list[HostPool] = []  # strong: a pool the test dropped is checked too
    original = HostPool.__init__

    def tracked(self, *args, **kwargs):
        original(self, *args, **kwargs)
        created.append(self)

    monkeypatch.setattr(HostPool, "__init__", tracked)
    if ASYNC_TESTS and inspect.iscoroutinefunction(getattr(request, "function", None)):
        request.getfixturevalue("_no_task_is_pending_afterwards")
    yield
    if request.node.get_closest_marker("holds_slots"):
        return
    pools = created
    for pool in pools:
        pool.free(pool.allocated_slots())
    deadline = time.monotonic() + 2.0
    while any(p.reap() is not None and p.free_slots != p.num_slots for p in pools) and time.monotonic() < deadline:
        time.sleep(0.01)
    held = [f"{p!r}: {p.num_slots - p.free_slots} of {p.num_slots} slots still pending" for p in pools
            if p.free_slots != p.num_slots]
    assert not held, "a test ended with host slots held by unfinished work: " + "; ".join(held)


@pytest.fixture
async def _no_task_is_pending_afterwards():
    yield
    me = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    assert not pending, f"an async test ended with {len(pending)} task(s) pending: {pending[:3]}"


# Real servers on loopback, one per test run, for every suite that needs one.
@pytest.fixture(scope="session")
def redis_server():
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def mooncake_master():
    import importlib.util

    if importlib.util.find_spec("mooncake") is None:
        pytest.skip("the mooncake module is not installed")
    saved = {k: os.environ.get(k) for k in LOOPBACK_ENV}
    os.environ.update(LOOPBACK_ENV)
    master = MooncakeMaster().start()
    yield master
    master.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
