"""``TieredL3Tier``: a vLLM ``SecondaryTierManager`` over any tiered-kv backend (file, Redis, Mooncake),
for deployments that keep vLLM's own CPU tier and put tiered-kv's L3 under it.

vLLM runs it in the scheduler process; it reads and writes vLLM's shared CPU region through a small
staging ``HostPool`` of its own, so every record on L3 is sealed (checksum, key, spec) and verified
on the way back. It must never block vLLM's scheduler or raise into it: I/O runs on an
``L3Controller``'s loop, a failing backend turns the tier degraded (lookups miss, stores fail fast),
and a record that does not verify is a failed key, never bytes handed to the model.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Collection, Iterable
from typing import Any, ClassVar

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from tiered_kv.backends import open_backend
from tiered_kv.errors import ConfigError, TieredKVError
from tiered_kv.hierarchy.controller import L3Controller
from tiered_kv.model.host_pool import HostPool
from tiered_kv.model.keys import Namespace
from tiered_kv.model.spec import Component, KVSpec

from .keys import layout_fingerprint, page_key
from .live import register

#: How long an L3 answer to a lookup stands before L3 is asked again (another instance may put it).
ANSWER_TTL_S = 2.0


def _check(value: Any, key: str, kind: type, *, positive: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, kind) or (positive and value <= 0):
        raise ConfigError(f"secondary_tiers[TieredL3Tier][{key!r}] must be "
                          f"{'an int > 0' if positive else 'a ' + kind.__name__}, got {value!r}")
    return value


class TieredL3Tier(SecondaryTierManager):
    """tiered-kv's L3 as one of vLLM's secondary tiers (config: ``url``, ``staging_slots``, ``salt``)."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector=None, *, url: str | None = None, staging_slots: int = 64,
                 salt: str = "", model: str | None = None) -> None:
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view, tier_type=tier_type,
                         backpressure_detector=backpressure_detector)
        if url is None:
            raise ConfigError("secondary_tiers[TieredL3Tier]['url'] is required (file:///dir, redis://host:port/0, ...)")
        _check(url, "url", str)
        _check(staging_slots, "staging_slots", int, positive=True)
        _check(salt, "salt", str)
        config = offloading_spec.config
        block_bytes = self.block_size_bytes
        tokens = int(offloading_spec.tokens_per_block[0]) * int(offloading_spec.blocks_per_chunk)
        fingerprint = layout_fingerprint(tokens_per_block=tokens, bytes_per_block=block_bytes,
                                         dtype=str(config.model.dtype), layout=config.kv_cache_layout)
        self.namespace = Namespace(model=_check(model, "model", str) if model is not None else str(config.model.name),
                                   spec_fingerprint=fingerprint, page_size=tokens, tenant_salt=salt)
        spec = KVSpec(kind="vllm", page_size=tokens, layer_start=0, layer_end=1,
                      components=(Component("chunk", block_bytes, "vllm cpu tier chunk"),),
                      dims=(("fingerprint", fingerprint),))
        self.staging = HostPool(spec, staging_slots, pin=False)
        self._staged = self.staging.chunk_view(0, 0)           # [slot, payload bytes], inside the records
        self._primary = torch.from_numpy(np.asarray(primary_kv_view).view(np.uint8).reshape(-1, block_bytes))
        self.l3 = L3Controller(lambda: open_backend(url, self.staging), record_bytes=self.staging.record_bytes,
                               name=f"vllm-{tier_type}")
        self._lock = threading.Lock()
        self._done: list[JobResult] = []
        self._jobs: dict[int, concurrent.futures.Future] = {}
        self._answers: dict[OffloadKey, tuple[bool, float]] = {}
        self._probes: dict[OffloadKey, concurrent.futures.Future] = {}
        self.counters = {"l3_hits": 0, "l3_misses": 0, "stored": 0, "store_failed": 0, "loaded": 0, "load_failed": 0}
        register(self)

    # --- lookups: never block; RETRY while L3's answer is out ----------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        now = time.monotonic()
        answer = self._answers.get(key)
        if answer is not None and now - answer[1] < ANSWER_TTL_S:
            return LookupResult.HIT if answer[0] else LookupResult.MISS
        probe = self._probes.get(key)
        if probe is None:
            self._probes[key] = self.l3.exists([page_key(self.namespace, key)])
            return LookupResult.RETRY
        if not probe.done():
            return LookupResult.RETRY
        del self._probes[key]
        try:
            present = probe.result() >= 1
        except TieredKVError:           # the controller turns the tier degraded; here it is a miss
            present = False
        self._answers[key] = (present, now)
        self.counters["l3_hits" if present else "l3_misses"] += 1
        return LookupResult.HIT if present else LookupResult.MISS

    # --- jobs -------------------------------------------------------------------------------------
    def _finish(self, result: JobResult, slots: list[int]) -> None:
        self.staging.free(slots)
        with self._lock:
            self._jobs.pop(result.job_id, None)
            self._done.append(result)

    def _staging_slots(self, job: TransferJob) -> list[int] | None:
        count = len(job.keys)
        if count > self.staging.free_slots:
            self._finish(JobResult(job.job_id, False), [])
            return None
        return self.staging.allocate(count)

    def submit_store(self, job_metadata: TransferJob) -> None:
        job = job_metadata
        slots = self._staging_slots(job)
        if slots is None:
            self.counters["store_failed"] += len(job.keys)
            return
        keys = [page_key(self.namespace, k) for k in job.keys]
        chunks = torch.from_numpy(np.asarray(job.chunk_ids, dtype=np.int64))
        self._staged[torch.tensor(slots)] = self._primary[chunks]    # vLLM pins the chunks for the job
        for slot, key in zip(slots, keys):
            self.staging.seal(slot, key)
        future = self.l3.put_from(keys, slots)

        def stored(f: concurrent.futures.Future) -> None:
            ok = _per_key(f, len(keys))
            self.counters["stored"] += sum(ok)
            self.counters["store_failed"] += len(ok) - sum(ok)
            for key, flag in zip(job.keys, ok):
                if flag:
                    self._answers[key] = (True, time.monotonic())
            self._finish(JobResult(job.job_id, all(ok), successful_keys=[k for k, f_ in zip(job.keys, ok) if f_],
                                   transfer_bytes=sum(ok) * self.block_size_bytes), slots)

        with self._lock:
            self._jobs[job.job_id] = future
        future.add_done_callback(stored)

    def submit_load(self, job_metadata: TransferJob) -> None:
        job = job_metadata
        slots = self._staging_slots(job)
        if slots is None:
            self.counters["load_failed"] += len(job.keys)
            return
        keys = [page_key(self.namespace, k) for k in job.keys]
        future = self.l3.get_into(keys, slots)
        chunk_ids = [int(c) for c in job.chunk_ids]

        def loaded(f: concurrent.futures.Future) -> None:
            ok = _per_key(f, len(keys))
            good = [i for i, flag in enumerate(ok) if flag]     # verified records only
            if good:
                self._primary[torch.tensor([chunk_ids[i] for i in good])] = self._staged[torch.tensor([slots[i] for i in good])]
            for i, flag in enumerate(ok):
                if not flag:
                    self._answers.pop(list(job.keys)[i], None)   # ask L3 again next time
            self.counters["loaded"] += len(good)
            self.counters["load_failed"] += len(ok) - len(good)
            keys_list = list(job.keys)
            self._finish(JobResult(job.job_id, len(good) == len(ok), successful_keys=[keys_list[i] for i in good],
                                   transfer_bytes=len(good) * self.block_size_bytes), slots)

        with self._lock:
            self._jobs[job.job_id] = future
        future.add_done_callback(loaded)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._lock:
            done, self._done = self._done, []
        return done

    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._jobs) or bool(self._probes)

    def drain_jobs(self) -> None:
        with self._lock:
            futures = list(self._jobs.values())
        concurrent.futures.wait(futures)
        deadline = time.monotonic() + 5.0            # the done callbacks run on the loop thread
        while time.monotonic() < deadline:
            with self._lock:
                if not self._jobs:
                    return
            time.sleep(0.001)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def shutdown(self) -> None:
        self.drain_jobs()
        self.l3.close()
        self._primary = None              # vLLM unmaps its region after this: no view of it may stay
        self.staging.close()


def _per_key(future: concurrent.futures.Future, count: int) -> list[bool]:
    """Per-key success of a controller future; an error is a failure of every key."""
    try:
        flags = future.result()
    except (TieredKVError, concurrent.futures.CancelledError):
        return [False] * count
    return [bool(f) for f in flags][:count] + [False] * max(0, count - len(flags))
