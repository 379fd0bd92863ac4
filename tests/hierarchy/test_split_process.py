"""The metadata half in a process of its own: no host pool, no CUDA there.

A worker (this test process) stores pages of a prompt on L3 through a backend over a HostPool.
A scheduler in a second process (``SCHEDULER``, run with ``python -c``) holds a ``CacheManager``
over a bare ``SlotAllocator`` for L2 and an ``L3Controller`` over a key-only backend
(``open_backend(url, None)``) on the same medium, computes the prompt's page keys itself and
answers ``lookup`` with the L3 hit length of the worker's pages: ``None`` (pending, at once) first,
then the ``Match``. Over Redis the server is paused (SIGSTOP) while the scheduler asks, so a lookup
that waited on L3 would hang there; it must keep answering "not yet" until the server is back.

The scheduler refuses (and counts) every ``HostPool`` / ``HostMemory`` construction, CUDA lazy
initialisation and ``Tensor.pin_memory`` call. ``torch`` itself is imported there all the same:
``tiered_kv/__init__.py`` imports ``tiered_kv.model.device_pool``, which imports torch, and
``backends/base.py`` imports ``tiered_kv.model.host_pool`` (torch too); so the test checks that torch is
loaded but CUDA was never initialised and no host memory was made, rather than torch's absence.
"""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tiered_kv import HostPool
from tiered_kv.backends import open_backend
from tiered_kv.model.keys import page_keys

from ..backends.contract import fill_and_seal
from ..backends.redis_server import REDIS_SERVER, RedisServer
from .conftest import NS, PAGE, SPEC, count_on_l3

REPO_ROOT = Path(__file__).resolve().parents[2]
SPEC_ARGS = {"num_layers": 2, "page_size": PAGE, "latent_dtype": "fp8"}  # conftest's SPEC, rebuilt there

SCHEDULER = r'''
import json, sys, time

args = json.loads(sys.argv[1])
refused = []

def refuse(what):
    def call(*_a, **_k):
        refused.append(what)
        raise AssertionError(f"{what} in the scheduler process")
    return call

# Guards first, before anything of the cache exists: host memory, pinning and CUDA are refused.
import torch
import tiered_kv.model.host_memory, tiered_kv.model.host_pool
tiered_kv.model.host_pool.HostPool.__init__ = refuse("HostPool")
tiered_kv.model.host_memory.HostMemory.__init__ = refuse("HostMemory")
torch.cuda._lazy_init = refuse("CUDA init")
torch.Tensor.pin_memory = refuse("pin_memory")

from tiered_kv.backends import open_backend
from tiered_kv.hierarchy import CacheManager, L3Controller
from tiered_kv.model.keys import Namespace, page_keys
from tiered_kv.model.record import HEADER_BYTES
from tiered_kv.model.slot_allocator import SlotAllocator
from tiered_kv.model.spec import nsa_spec

def send(**message):
    print(json.dumps(message), flush=True)

def command():
    return sys.stdin.readline().strip()

spec = nsa_spec(**args["spec"])
keys = page_keys(Namespace.for_spec(spec, args["model"]), args["tokens"])
opened = []

def open_l3():
    backend = open_backend(args["url"], None, **args["options"])
    opened.append(backend)
    return backend

slots = SlotAllocator(args["slots"])
l3 = L3Controller(open_l3, record_bytes=HEADER_BYTES + spec.page_bytes)
manager = CacheManager(slots, page_size=spec.page_size, l3=l3)
send(ready=True, keys=keys, key_only=opened[0].key_only)

def as_dict(match):
    return None if match is None else {"l1": match.l1_pages, "l2": match.l2_pages, "l3": match.l3_pages}

while (line := command()) != "close":
    op, request, l1_pages = line.split()
    l1_pages = int(l1_pages)
    if op == "ask":  # two lookups, the second a while after the first: what a scheduler's step sees
        answers, seconds = [], []
        for _ in range(2):
            start = time.perf_counter()
            answers.append(as_dict(manager.lookup(request, keys, l1_pages)))
            seconds.append(time.perf_counter() - start)
            time.sleep(0.3)
        send(answers=answers, seconds=seconds)
    else:  # "wait": poll until the match is decided
        deadline, pending = time.monotonic() + 30, 0
        while (match := manager.lookup(request, keys, l1_pages)) is None and time.monotonic() < deadline:
            pending += 1
            time.sleep(0.002)
        send(match=as_dict(match), pending=pending)

manager.close()
slots.reap()
send(refused=refused, cuda_initialized=torch.cuda.is_initialized(), torch_loaded="torch" in sys.modules,
     free=slots.free_count, num_slots=slots.num_slots, pending_tasks=l3.pending_tasks(), closed=l3.closed,
     lookups_pending=manager.stats.lookups_pending, lookups=manager.stats.lookups)
'''


class Scheduler:
    """The scheduler process: one JSON line per answer, read on a thread so no read blocks forever."""

    def __init__(self, args: dict) -> None:
        self.process = subprocess.Popen([sys.executable, "-W", "error", "-c", SCHEDULER, json.dumps(args)],
                                        cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:  # type: ignore[union-attr]
            self._lines.put(line)

    def send(self, line: str) -> None:
        self.process.stdin.write(line + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]

    def answer(self, timeout_s: float = 60.0) -> dict:
        try:
            return json.loads(self._lines.get(timeout=timeout_s))
        except queue.Empty:
            self.process.kill()
            raise AssertionError(f"the scheduler process did not answer; stderr:\n{self.process.communicate()[1]}") from None

    def finish(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=5)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            stream.close()  # type: ignore[union-attr]


@pytest.fixture(params=["file", pytest.param("redis", marks=pytest.mark.skipif(REDIS_SERVER is None,
                                                                               reason="redis-server not on PATH"))])
def medium(request, tmp_path):
    """``(url, options, pause, resume)`` of a medium the worker and the scheduler share."""
    if request.param == "file":
        yield f"file://{tmp_path}/l3", {}, None, None
        return
    with RedisServer() as server:
        # Long socket timeouts: the pause below must look like a slow server, not a dead one.
        yield server.url, {"prefix": "split:", "socket_timeout_s": 30}, server.pause, server.resume


async def _store_as_worker(url: str, options: dict, keys: list[str]) -> None:
    with HostPool(SPEC, len(keys)) as host:
        async with open_backend(url, host, **options) as backend:
            slots = host.allocate(len(keys))
            fill_and_seal(host, slots, keys)
            assert await backend.put_from(keys, slots) == [True] * len(keys)
            host.free(slots)
        assert host.free_slots == host.num_slots


def test_metadata_half_in_another_process_answers_l3_hits(medium):
    url, options, pause, resume = medium
    tokens = np.random.default_rng(10).integers(0, 50_000, 8 * PAGE + 5)  # 8 pages and a tail
    keys = page_keys(NS, tokens)
    assert len(keys) == 8
    stored = 5
    asyncio.run(_store_as_worker(url, options, keys[:stored]))

    scheduler = Scheduler({"url": url, "options": options, "spec": SPEC_ARGS, "model": "tests/hierarchy",
                           "tokens": tokens.tolist(), "slots": 16})
    try:
        ready = scheduler.answer()
        assert ready["keys"] == keys  # the same keys in every process
        assert ready["key_only"] is True

        if pause is not None:
            pause()  # L3 hangs: a lookup that waited on it would never come back
        try:
            scheduler.send("ask r1 0")
            asked = scheduler.answer()
        finally:
            if resume is not None:
                resume()
        # Pending, not blocking: a lookup that waited for the paused server would never have
        # answered (the server resumes only after this answer came back).
        assert asked["answers"][0] is None
        assert max(asked["seconds"]) < 1.0, asked
        if pause is not None:
            assert asked["answers"] == [None, None]  # still pending while the server hangs
        decided = sum(a is not None for a in asked["answers"])
        assert all(a == {"l1": 0, "l2": 0, "l3": stored} for a in asked["answers"][1:] if a is not None)
        scheduler.send("wait r1 0")
        assert scheduler.answer()["match"] == {"l1": 0, "l2": 0, "l3": stored}

        # The engine holds the first 2 pages on L1: L3 is asked only for the rest.
        scheduler.send("ask r2 2")
        asked = scheduler.answer()
        assert asked["answers"][0] is None
        decided += sum(a is not None for a in asked["answers"])
        scheduler.send("wait r2 2")
        assert scheduler.answer()["match"] == {"l1": 2, "l2": 0, "l3": stored - 2}

        scheduler.send("close")
        report = scheduler.answer()
    finally:
        scheduler.finish()
    assert scheduler.process.returncode == 0
    assert report["refused"] == []  # no HostPool, no HostMemory, no pinning, no CUDA init was attempted
    assert report["cuda_initialized"] is False
    assert report["torch_loaded"] is True  # tiered_kv/__init__ -> device_pool -> torch (see the docstring)
    assert report["free"] == report["num_slots"] == 16
    assert report["closed"] is True and report["pending_tasks"] == 0
    assert report["lookups"] == decided + 2  # every decided answer counted, the two waits included
    assert report["lookups_pending"] >= 2
    # The scheduler only asked: the worker's pages are all still there.
    assert count_on_l3(url, options, keys) == stored
