"""Shared pieces of the hierarchy tests: a small NSA spec, real L3 servers, and a whole stack.

``Stack`` wires the pieces as an engine would (an engine-like device pool for L1, a HostPool for
L2, an ``L3Controller`` over a real backend, the ``CacheManager`` and the ``TransferHalf``, driven
by an ``L1PrefixCache`` whose prefill writes oracle bytes and whose loads are checked byte for
byte). ``Stack.close()`` closes everything and asserts what every test of the hierarchy must end
with: every host slot free and no task left on the controller's loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from tiered_kv import HostPool, allocate_engine_like, nsa_spec
from tiered_kv.backends import open_backend
from tiered_kv.hierarchy import CacheManager, ControllerLimits, L1PrefixCache, L3Controller, Policies, TransferHalf
from tiered_kv.hierarchy.index import free_slot_count
from tiered_kv.hierarchy.oracle import fill_pages, verify_pages
from tiered_kv.model.keys import Namespace, page_keys

from ..backends.mooncake_server import MooncakeMaster

PAGE = 16
SPEC = nsa_spec(num_layers=2, page_size=PAGE, latent_dtype="fp8")
NS = Namespace.for_spec(SPEC, "tests/hierarchy")
#: Whether ``make_stack`` puts the worker side (L1, L2 bytes, L3 controller) in a child process;
#: set by the ``stack_process`` fixture.
SPLIT = {"on": False}


def keys_of(tokens: Any, ns: Namespace = NS) -> list[str]:
    return page_keys(ns, tokens)


def sealed(pool: HostPool, keys: Sequence[str]) -> list[int]:
    """Fresh slots of ``pool`` sealed for ``keys`` (what the worker does once a store landed)."""
    slots = pool.allocate(len(keys))
    for k, s in zip(keys, slots):
        pool.seal(s, k)
    return slots


def decided_lookup(manager: CacheManager, rid: Any, keys: Sequence[str], l1_pages: int = 0, timeout_s: float = 10.0):
    """``manager.lookup`` asked again until L3's answer is back (as a scheduler does each step)."""
    deadline = time.monotonic() + timeout_s
    while (m := manager.lookup(rid, keys, l1_pages)) is None:
        assert time.monotonic() < deadline, "lookup never decided"
        time.sleep(0.0005)
    return m


def prompts(seed: int, pages: Sequence[int], shared: int = 0) -> list[np.ndarray]:
    """Token prompts of ``pages[i]`` full pages; the first ``shared`` pages are common to all.
    Under ``stack_process``'s two-process run the prompts differ from the one-process run's, so
    the two never meet on a medium shared by the whole test run (Mooncake keys have no per-test prefix)."""
    rng = np.random.default_rng([seed, 1] if SPLIT["on"] else seed)
    head = rng.integers(0, 50_000, shared * PAGE)
    return [np.concatenate([head, rng.integers(0, 50_000, (n - shared) * PAGE)]) for n in pages]


def assert_clean(host: Any, controller: L3Controller | None) -> None:
    """The end of every hierarchy test: nothing held, nothing running."""
    host.reap()
    free = host.free_slots if hasattr(host, "free_slots") else host.free_count
    assert free == host.num_slots, f"{host.num_slots - free} host slots still held after close"
    if controller is not None:
        assert controller.closed
        assert controller.pending_tasks() == 0


class SlowL3:
    """A key-only L3 whose ``exists`` answers "none" after 50 ms: a lookup sees its answer pending."""

    scheme = "slow"

    async def exists(self, keys):
        await asyncio.sleep(0.05)
        return 0

    async def aclose(self):
        pass


@dataclass
class Stack:
    """One cache: L1 over an engine-like pool, L2 over a HostPool, L3 through a controller."""

    host: HostPool
    controller: L3Controller | None
    manager: CacheManager
    l1: L1PrefixCache
    device: Any
    served: list = field(default_factory=list)
    link: Any = None  # the PipeLink to the worker side in a child process, if there is one

    def serve(self, request_id: Any, keys: list[str], *, timeout_s: float = 20.0):
        """One request through lookup / start / (wait for the prefetch) / run; asserts its bytes."""
        deadline = time.monotonic() + timeout_s
        while (match := self.l1.lookup(request_id, keys)) is None:
            assert time.monotonic() < deadline, "lookup never decided"
            time.sleep(0.0005)
        self.l1.start(request_id)
        while not self.manager.prefetch_done(request_id):
            assert time.monotonic() < deadline, "prefetch never finished"
            time.sleep(0.0005)
        served = self.l1.run(request_id)
        assert served.wrong_pages == 0, f"{served.wrong_pages} wrong pages served"
        assert served.verified_pages == served.l2_pages + served.l3_pages
        self.served.append((match, served))
        return match, served

    def settle(self) -> None:
        """Let stores land on L2 and puts on L3."""
        self.l1.drain_stores()  # a worker side in another process answers when it answers
        self.l1.poll()
        assert self.manager.wait_idle(30)
        self.l1.poll()

    def seal(self, slots: Sequence[int], keys: Sequence[str]) -> None:
        """Seal L2 ``slots`` for ``keys`` where the bytes live (this process or the worker's)."""
        if self.link is not None:
            self.link.call("seal", list(keys), list(slots))
            return
        for key, slot in zip(keys, slots):
            self.host.seal(slot, key)

    def put_from(self, keys: Sequence[str], slots: Sequence[int]):
        """An L3 put of sealed ``slots`` behind the manager's back (a write flood): its future."""
        if self.link is not None:
            return self.manager.l3.put_from(keys, slots)
        return self.controller.put_from(keys, slots)

    def free_slots(self) -> int:
        """L2 slots free now (a HostPool's or the scheduler's SlotAllocator's)."""
        self.host.reap()
        return free_slot_count(self.host)

    def close(self) -> None:
        self.l1.close()
        assert_clean(self.host, self.controller)


async def pages_on_l3(url: str, options: dict, keys: Sequence[str]) -> int:
    """How many of ``keys`` (their leading run) a client of its own finds on the L3 at ``url``:
    what another instance sharing the medium would see, not this stack's index."""
    async with open_backend(url, None, **options) as backend:
        return await backend.exists(list(keys))


def count_on_l3(url: str, options: dict, keys: Sequence[str]) -> int:
    """``pages_on_l3`` from synchronous test code."""
    return asyncio.run(pages_on_l3(url, options, keys))


@pytest.fixture(params=["one-process", "two-processes"])
def stack_process(request):
    """Runs a test with ``make_stack``'s scheduler and worker sides in one process, then in two.
    A test marked ``in_process_parts`` (it reaches into the host pool or the controller itself)
    runs in one only."""
    if request.param == "two-processes" and request.node.get_closest_marker("in_process_parts"):
        pytest.skip("reaches into the worker side's own objects")
    SPLIT["on"] = request.param == "two-processes"
    yield request.param
    SPLIT["on"] = False


def make_split_stack(l3_url: str, *, host_slots: int, l1_pages: int, policies: Policies, limits: ControllerLimits,
                     max_prefetch_slots: int | None, agree: Callable[[int], int] | None, open_options: dict | None,
                     spec: Any) -> Stack:
    """The scheduler side here (a ``CacheManager`` over a bare ``SlotAllocator``, L3Jobs over a
    ``PipeLink``, the ``L1PrefixCache`` with a ``JobTransferHalf``), every byte in a child process."""
    from tiered_kv.hierarchy.job_transfers import JobTransferHalf
    from tiered_kv.hierarchy.l3_jobs import L3Jobs
    from tiered_kv.hierarchy.process_link import ChildController, PipeLink, stack_worker
    from tiered_kv.model.slot_allocator import SlotAllocator

    link = PipeLink(stack_worker, spec, host_slots, l1_pages, l3_url, open_options or {}, limits)
    jobs = L3Jobs(link, limits=limits)
    alloc = SlotAllocator(host_slots)
    manager = CacheManager(alloc, page_size=spec.page_size, policies=policies, l3=jobs, agree=agree,
                           max_prefetch_slots=max_prefetch_slots)
    worker = JobTransferHalf(jobs, page_bytes=spec.page_bytes, on_failed_store=lambda plan: manager.complete_store(plan, False))
    l1 = L1PrefixCache(l1_pages + 1, manager, worker, reserved=(0,),
                       fill=lambda k, p: link.call("fill", list(k), list(p)),
                       verify=lambda k, p: link.call("verify", list(k), list(p)))
    return Stack(alloc, ChildController(jobs), manager, l1, None, link=link)


def make_stack(l3_url: str | None, *, host_slots: int = 64, l1_pages: int = 32,
               policies: Policies = Policies(), limits: ControllerLimits = ControllerLimits(),
               max_prefetch_slots: int | None = None, agree: Callable[[int], int] | None = None,
               open_options: dict | None = None, spec: Any = SPEC) -> Stack:
    if SPLIT["on"] and l3_url is not None:
        return make_split_stack(l3_url, host_slots=host_slots, l1_pages=l1_pages, policies=policies, limits=limits,
                                max_prefetch_slots=max_prefetch_slots, agree=agree, open_options=open_options, spec=spec)
    host = HostPool(spec, host_slots)
    controller = None
    if l3_url is not None:
        options = open_options or {}
        controller = L3Controller(lambda: open_backend(l3_url, host, **options), record_bytes=host.record_bytes,
                                  limits=limits)
    manager = CacheManager(host, page_size=spec.page_size, policies=policies, l3=controller, agree=agree,
                           max_prefetch_slots=max_prefetch_slots)
    device = allocate_engine_like(spec, l1_pages + 1)
    worker = TransferHalf(device, host)
    l1 = L1PrefixCache(device.num_pages, manager, worker, reserved=device.reserved_pages,
                       fill=lambda k, p: fill_pages(device, k, p), verify=lambda k, p: verify_pages(device, k, p))
    return Stack(host, controller, manager, l1, device)


def mooncake_url(master: MooncakeMaster, segment: str = "64MiB") -> str:
    return master.url(global_segment_bytes=segment, timeout_s=10)


@pytest.fixture(scope="session")
def mooncake_store(mooncake_master):
    """The master plus a segment holder process, so pages outlive the clients that wrote them;
    returns the URL of a pure client (contributes nothing)."""
    from ..backends.mooncake_server import segment_holder

    with segment_holder(mooncake_master, "128MiB"):
        yield mooncake_master.url(contribute_segment=False, timeout_s=10)


@pytest.fixture(params=["file", "redis", "mooncake"])
def l3_kind(request):
    return request.param


@pytest.fixture
def l3_opener(l3_kind, request, tmp_path):
    """``(url, open_options)`` of a fresh, empty L3 medium of ``l3_kind``; two caches opened with
    the same pair share it."""
    import secrets

    if l3_kind == "file":
        return f"file://{tmp_path / 'l3'}", {}
    if l3_kind == "redis":
        server = request.getfixturevalue("redis_server")
        return server.url, {"prefix": f"t{secrets.token_hex(4)}:"}
    url = request.getfixturevalue("mooncake_store")
    return url, {}


class LoopThread:
    """An asyncio loop in a thread, for helpers that are coroutines (the delaying proxy)."""

    def __init__(self) -> None:
        import asyncio
        import threading

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout_s: float = 30.0):
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
