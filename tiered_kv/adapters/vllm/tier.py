"""``TieredL3Tier``: a vLLM ``SecondaryTierManager`` over any tiered-kv backend (file, Redis, Mooncake),
for deployments that keep vLLM's own CPU tier and put tiered-kv's L3 under it.

vLLM runs it in the scheduler process; it reads and writes vLLM's shared CPU region through a small
staging ``HostPool`` of its own, so every record on L3 is sealed (checksum, key, spec) and verified
on the way back. It must never block vLLM's scheduler or raise into it: I/O runs on an
``L3Controller``'s loop, a failing backend turns the tier degraded (lookups miss, jobs fail fast, the
queued ones too), a drain (vLLM's reset and shutdown wait in it) ends within ``drain_timeout_s``, and a record
that does not verify is a failed key, never bytes handed to the model.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Collection, Iterable
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
#: The bound of a drain (vLLM's reset and shutdown wait in it): what still runs then is given up.
DRAIN_TIMEOUT_S = 10.0


def _check(value: Any, key: str, kind: type, *, positive: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, kind) or (positive and value <= 0):
        raise ConfigError(f"secondary_tiers[TieredL3Tier][{key!r}] must be "
                          f"{'an int > 0' if positive else 'a ' + kind.__name__}, got {value!r}")
    return value


class TieredL3Tier(SecondaryTierManager):
    """tiered-kv's L3 as one of vLLM's secondary tiers (config: ``url``, ``staging_slots``, ``salt``,
    ``model``, ``drain_timeout_s``)."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector=None, *, url: str | None = None, staging_slots: int = 64,
                 salt: str = "", model: str | None = None, drain_timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view, tier_type=tier_type,
                         backpressure_detector=backpressure_detector)
        if url is None:
            raise ConfigError("secondary_tiers[TieredL3Tier]['url'] is required (file:///dir, redis://host:port/0, ...)")
        _check(url, "url", str)
        _check(staging_slots, "staging_slots", int, positive=True)
        _check(salt, "salt", str)
        if isinstance(drain_timeout_s, bool) or not isinstance(drain_timeout_s, (int, float)) or not 0 < drain_timeout_s < 3600:
            raise ConfigError(f"secondary_tiers[TieredL3Tier]['drain_timeout_s'] must be a number of seconds in (0, 3600), "
                              f"got {drain_timeout_s!r}")
        self.drain_timeout_s = float(drain_timeout_s)
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
        self.counters = {"l3_hits": 0, "l3_misses": 0, "stored": 0, "store_failed": 0, "loaded": 0, "load_failed": 0,
                         "given_up": 0}
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
    def _fail_now(self, job: TransferJob) -> None:
        """A job that never reached L3 (staging full, tier degraded): failed at once."""
        with self._lock:
            self._done.append(JobResult(job.job_id, False))

    def _settle(self, job_id: int, result: Callable[[], JobResult], slots: list[int]) -> None:
        """Once a job's future is done (controller thread): its result lands, unless a drain gave up
        on it already; then nothing of it may touch vLLM's memory. Under the lock, so a drain
        never returns while a load is copying into the primary region."""
        with self._lock:
            if self._jobs.pop(job_id, None) is not None:
                self._done.append(result())
        self.staging.free(slots)

    def _staging_slots(self, job: TransferJob) -> list[int] | None:
        if self.l3.degraded or len(job.keys) > self.staging.free_slots:
            self._fail_now(job)
            return None
        return self.staging.allocate(len(job.keys))

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

        def stored(f: concurrent.futures.Future) -> JobResult:
            ok = _per_key(f, len(keys))
            self.counters["stored"] += sum(ok)
            self.counters["store_failed"] += len(ok) - sum(ok)
            for key, flag in zip(job.keys, ok):
                if flag:
                    self._answers[key] = (True, time.monotonic())
            return JobResult(job.job_id, all(ok), successful_keys=[k for k, f_ in zip(job.keys, ok) if f_],
                             transfer_bytes=sum(ok) * self.block_size_bytes)

        with self._lock:
            self._jobs[job.job_id] = future
        future.add_done_callback(lambda f: self._settle(job.job_id, lambda: stored(f), slots))

    def submit_load(self, job_metadata: TransferJob) -> None:
        job = job_metadata
        slots = self._staging_slots(job)
        if slots is None:
            self.counters["load_failed"] += len(job.keys)
            return
        keys = [page_key(self.namespace, k) for k in job.keys]
        future = self.l3.get_into(keys, slots)
        chunk_ids = [int(c) for c in job.chunk_ids]

        def loaded(f: concurrent.futures.Future) -> JobResult:
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
            return JobResult(job.job_id, len(good) == len(ok), successful_keys=[keys_list[i] for i in good],
                             transfer_bytes=len(good) * self.block_size_bytes)

        with self._lock:
            self._jobs[job.job_id] = future
        future.add_done_callback(lambda f: self._settle(job.job_id, lambda: loaded(f), slots))

    def _give_up_queued(self) -> None:
        """While L3 is degraded, the controller keeps queued puts until the tier returns, and vLLM
        holds their chunks meanwhile: they fail now instead (as ``CacheManager`` gives up its
        queued puts). A job already running ends by the backend's own timeout."""
        with self._lock:
            futures = [f for f in self._jobs.values() if not f.done()]
        for future in futures:
            self.l3.cancel(future)       # a cancelled future runs its callback: the job fails

    def get_finished_jobs(self) -> Iterable[JobResult]:
        if self.l3.degraded and self._jobs:
            self._give_up_queued()
        with self._lock:
            done, self._done = self._done, []
        return done

    def has_pending_work(self) -> bool:
        with self._lock:
            jobs = bool(self._jobs)
        # A probe whose answer is in waits for a lookup of its key, which may never come.
        return jobs or any(not p.done() for p in self._probes.values())

    def drain_jobs(self) -> None:
        """Every job answered within ``drain_timeout_s``: jobs finish, queued ones of a degraded
        tier fail, and what still runs at the deadline is reported failed and may no longer
        touch the primary region (its staging slots stay held until its backend call returns)."""
        deadline = time.monotonic() + self.drain_timeout_s
        while True:
            with self._lock:
                futures = list(self._jobs.values())
            if not futures:
                return
            if self.l3.degraded:
                self._give_up_queued()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            concurrent.futures.wait(futures, timeout=min(left, 0.05), return_when=concurrent.futures.FIRST_COMPLETED)
        with self._lock:
            given_up, self._jobs = list(self._jobs), {}
            self._done.extend(JobResult(job_id, False) for job_id in given_up)
        self.counters["given_up"] += len(given_up)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def shutdown(self) -> None:
        self.drain_jobs()
        self.l3.close(deadline=time.monotonic() + self.drain_timeout_s)
        self._primary = None              # vLLM unmaps its region after this: no view of it may stay
        self.staging.close()


def _per_key(future: concurrent.futures.Future, count: int) -> list[bool]:
    """Per-key success of a controller future; an error is a failure of every key."""
    try:
        flags = future.result()
    except (TieredKVError, concurrent.futures.CancelledError):
        return [False] * count
    return [bool(f) for f in flags][:count] + [False] * max(0, count - len(flags))
