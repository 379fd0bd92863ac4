"""End to end: a small serving loop that computes with a real model on L1 and measures time to first token.

The loop uses tiered-kv as an engine does: the metadata half (``CacheManager`` with the write-through
and wait-complete policies, an ``L3Controller`` when there is an L3), the transfer half
(``TransferHalf`` with ``TransferOptions(beside_compute=True)``) and ``L1PrefixCache`` as the engine's
prefix cache over the model's own paged pool. A request goes

    lookup -> prefetch (L3 -> L2) -> run: the load of its L2 hit is issued, then the model computes
    the rest layer by layer, waiting for layer i of the load just before it reads layer i
    (``RequestKV.wait``) -> first token -> stores (write-through) -> the next request

one request at a time. Every full page the model computes holds ``PageOracle`` values (a pure
function of the page key), and every page loaded from L2 or L3 is checked against them after the
request's first token. Between requests the loop settles (stores copied, L3 writes landed), as the
replay does, so the hits per tier depend on the workload and the tiers alone; that time is counted
apart (``settle_s``), not in the request's time to first token.

``Stack`` is one configuration of tiers over one model and one L1 size; ``serve`` runs requests
through it; ``tier_probe`` and ``overlap_probe`` place a prefix on a chosen tier and time a request
that reuses it. Benchmark code: it must never run on a serving path.
"""

from __future__ import annotations

import concurrent.futures
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError
from ...hierarchy import (CacheManager, ControllerLimits, L1PrefixCache, L3Controller, NullTransferHalf, Policies, Prefill,
                         PrefetchPolicy, TransferHalf, WritePolicy)
from ...model.keys import Namespace, page_keys
from ...model.slot_allocator import SlotAllocator
from .e2e_kv import RequestKV
from .e2e_oracle import PageOracle

#: L1 only: no page is ever stored below L1 (write_through_selective after more hits than any run has).
_NEVER = 1 << 62


@dataclass(frozen=True)
class TierSetup:
    """Which tiers sit under L1: ``l2_pages`` 0 for L1 alone; ``l3_url`` None for no L3."""

    name: str
    l2_pages: int = 0
    l3_url: str | None = None

    def __post_init__(self) -> None:
        if self.l3_url is not None and self.l2_pages <= 0:
            raise ConfigError(f"tier setup {self.name!r}: an L3 needs an L2 (l2_pages > 0)")


@dataclass
class RequestRecord:
    """What one request got and how long it took (seconds unless named _ms)."""

    index: int
    tokens: int
    pages: int
    l1_pages: int
    l2_pages: int
    l3_pages: int
    computed_pages: int
    verified_pages: int
    wrong_pages: int
    ttft_s: float  # from its lookup to its first token on the host
    lookup_s: float  # lookup and prefetch (L3 -> L2), until it may run
    run_s: float  # load + compute, until the first token
    forward_ms: float = 0.0  # GPU time of the forward (waits included)
    wait_ms: float = 0.0  # of it, the stream waiting for loaded layers
    load_ms: float = 0.0  # GPU time from the forward's start until the last layer of the load landed
    layers_waited: int = 0
    l3_read_bytes: int = 0
    l3_read_s: float = 0.0  # prefetch wall time (start -> ready) when L3 pages were read
    settle_s: float = 0.0

    @property
    def compute_ms(self) -> float:
        return self.forward_ms - self.wait_ms


class LoadOnly:
    """A model that waits for every layer of the load and computes nothing (the load alone); the
    pages it should have computed still get their oracle KV, so what it stores is right."""

    def __init__(self, model: Any) -> None:
        self.spec = model.spec

    def prefill(self, tokens: torch.Tensor, kv: RequestKV) -> torch.Tensor:
        for layer in range(self.spec.num_layers):
            kv.wait(layer)
            kv.written(layer, kv.num_tokens)
        return torch.zeros(())


class Stack:
    """One tier configuration over ``model`` with an L1 of ``l1_pages`` (plus page 0, reserved as
    engines do, and a scratch page for the partial tail page of the prompt being computed).

    ``host_pool``: an L2 to use (and leave open) instead of making one: configurations of one model
    share it one after the other, so its memory is pinned once.
    """

    def __init__(self, model: Any, setup: TierSetup, *, l1_pages: int, device: torch.device | str,
                 oracle: PageOracle | None = None, host_pool: Any = None, limits: ControllerLimits | None = None,
                 model_name: str = "e2e") -> None:
        self.model = model
        self.setup = setup
        self.spec = model.spec
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.tail_page = l1_pages + 1
        self.pool = model.make_pool(l1_pages + 2, self.device, (0, self.tail_page))
        self.oracle = oracle or PageOracle(self.spec, self.device)
        self.namespace = Namespace.for_spec(self.spec, model_name)
        self.limits = limits or ControllerLimits(read_workers=8, write_workers=4, batch_pages=8)
        self._own_host = False
        self.host_pool = None
        if setup.l2_pages:
            from ...model.host_pool import HostPool
            from ...transfers.policy import TransferOptions

            if host_pool is None:
                host_pool = HostPool(self.spec, setup.l2_pages, "page_first")
                self._own_host = True
            elif host_pool.num_slots < setup.l2_pages:
                raise ConfigError(f"tier setup {setup.name!r}: the shared L2 has {host_pool.num_slots} slots, "
                                  f"{setup.l2_pages} asked for")
            self.host_pool = host_pool
            self.worker: Any = TransferHalf(self.pool, host_pool, options=TransferOptions(beside_compute=True))
        else:
            self.worker = NullTransferHalf()
        self.controller: L3Controller | None = None
        self.manager: CacheManager | None = None
        self.l1: L1PrefixCache | None = None
        self._current: tuple[torch.Tensor, int] | None = None
        self._done: dict[str, Any] = {}
        self._new_manager()
        self._new_l1()

    # --- building and forgetting tiers -------------------------------------------------------
    def _new_manager(self) -> None:
        if self.host_pool is None:
            slots: Any = SlotAllocator(1)
            policies = Policies(write=WritePolicy.WRITE_THROUGH_SELECTIVE, selective_hits=_NEVER,
                                prefetch=PrefetchPolicy.WAIT_COMPLETE)
        else:
            slots = self.host_pool
            policies = Policies(write=WritePolicy.WRITE_THROUGH, prefetch=PrefetchPolicy.WAIT_COMPLETE)
        self.controller = None
        if self.setup.l3_url is not None:
            from ...backends import open_backend

            url, host = self.setup.l3_url, self.host_pool
            self.controller = L3Controller(lambda: open_backend(url, host), record_bytes=host.record_bytes,
                                           limits=self.limits)
        self.manager = CacheManager(slots, page_size=self.spec.page_size, policies=policies, l3=self.controller,
                                    max_prefetch_slots=slots.num_slots)

    def _new_l1(self) -> None:
        assert self.manager is not None
        self.l1 = L1PrefixCache(self.pool.num_pages, self.manager, self.worker, reserved=self.pool.reserved_pages,
                                prefill=self._prefill)

    def forget_l1(self) -> None:
        """Start L1 empty (its pages' stores land first); L2 and L3 keep what they hold."""
        assert self.l1 is not None
        self.settle()
        self._new_l1()

    def forget_l2(self) -> None:
        """Start L1 and L2 empty over the same L3 (a new engine instance sharing it)."""
        assert self.l1 is not None
        self.settle()
        self.l1.close()  # closes the manager (every L2 slot freed) and its controller
        self._new_manager()
        self._new_l1()

    def settle(self) -> float:
        """Wait until every copy and L3 write in flight landed; returns the seconds it took."""
        assert self.l1 is not None and self.manager is not None
        start = time.perf_counter()
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.l1.drain_stores()
        self.l1.poll()
        self.manager.wait_idle(timeout_s=600.0)
        self.l1.poll()
        return time.perf_counter() - start

    def close(self) -> None:
        if self.l1 is not None:
            self.l1.close()
            self.l1 = None
        engine = getattr(self.worker, "engine", None)
        if engine is not None:
            engine.close()
        if self._own_host and self.host_pool is not None:
            self.host_pool.close()

    # --- one request -------------------------------------------------------------------------
    def _prefill(self, p: Prefill) -> None:
        assert self._current is not None
        tokens, count = self._current
        loaded = p.load if p.loaded_pages else None
        kv = RequestKV(self.pool, self.oracle, p.keys, p.pages, present_pages=p.l1_pages + p.loaded_pages, load=loaded,
                       num_tokens=count, tail_page=self.tail_page, timing=self.cuda)
        events: dict[str, Any] = {}
        if self.cuda:
            events["start"] = torch.cuda.Event(enable_timing=True)
            events["start"].record()
            if loaded is not None:
                # A side stream marks when the load's last layer landed, without holding the model.
                side = torch.cuda.Stream(self.device)
                side.wait_stream(torch.cuda.current_stream(self.device))
                side.wait_event(loaded.event(self.spec.num_layers - 1))
                events["loaded"] = torch.cuda.Event(enable_timing=True)
                events["loaded"].record(side)
        out = self.model.prefill(tokens, kv)
        if self.cuda:
            events["end"] = torch.cuda.Event(enable_timing=True)
            events["end"].record()
            torch.cuda.synchronize(self.device)
        self._done = {"first_token": time.perf_counter(), "out": out, "kv": kv, "prefill": p, "events": events}

    def request(self, index: int, tokens: np.ndarray, *, verify: bool = True) -> tuple[RequestRecord, torch.Tensor]:
        """Serve one prompt (token ids); returns its record and the model's output for its last token."""
        assert self.l1 is not None and self.manager is not None
        l1, manager = self.l1, self.manager
        keys = page_keys(self.namespace, tokens)
        self._current = (torch.from_numpy(np.asarray(tokens, dtype=np.int64)).to(self.device), len(tokens))
        stats = self.controller.stats if self.controller is not None else None
        read0 = stats.bytes_read if stats is not None else 0
        start = time.perf_counter()
        while l1.lookup(index, keys) is None:
            _wait(manager.pending_l3(index))
        l1.start(index)
        started = time.perf_counter()
        while not l1.ready(index):
            _wait(manager.pending_l3(index), 0.0002)
        ready = time.perf_counter()
        self._done = {}
        served = l1.run(index)
        done = self._done
        first = done["first_token"]
        kv: RequestKV = done["kv"]
        p: Prefill = done["prefill"]
        events = done["events"]
        record = RequestRecord(
            index=index, tokens=len(tokens), pages=len(keys), l1_pages=served.l1_pages, l2_pages=served.l2_pages,
            l3_pages=served.l3_pages, computed_pages=served.computed_pages, verified_pages=0, wrong_pages=0,
            ttft_s=first - start, lookup_s=ready - start, run_s=first - ready)
        if stats is not None and stats.bytes_read > read0:
            record.l3_read_bytes = stats.bytes_read - read0
            record.l3_read_s = ready - started
        if events:
            record.forward_ms = events["start"].elapsed_time(events["end"])
            if "loaded" in events:
                record.load_ms = events["start"].elapsed_time(events["loaded"])
            waits = kv.wait_times_ms()
            record.wait_ms = sum(ms for _, ms in waits)
            record.layers_waited = len(waits)
        if verify and p.loaded_pages:
            lo, hi = p.l1_pages, p.l1_pages + p.loaded_pages
            ok = self.oracle.check(self.pool, p.keys[lo:hi], p.pages[lo:hi])
            record.verified_pages, record.wrong_pages = len(ok), len(ok) - sum(ok)
        record.settle_s = self.settle()
        return record, done["out"]


def _wait(future: concurrent.futures.Future | None, timeout_s: float | None = None) -> None:
    if future is None:
        if timeout_s:
            time.sleep(timeout_s)
        return
    concurrent.futures.wait([future], timeout=timeout_s)


def serve(stack: Stack, prompts: Sequence[np.ndarray], *, verify: bool = True,
          progress: Callable[[RequestRecord], None] | None = None) -> list[RequestRecord]:
    """Run ``prompts`` (token ids, in arrival order) one at a time through ``stack``."""
    records = []
    for i, tokens in enumerate(prompts):
        record, _ = stack.request(i, tokens, verify=verify)
        records.append(record)
        if progress is not None:
            progress(record)
    return records


# --- probes --------------------------------------------------------------------------------------
def tier_probe(stack: Stack, tier: str, prefix: np.ndarray, suffixes: tuple[np.ndarray, np.ndarray],
               *, index: int = 0) -> tuple[RequestRecord, RequestRecord, torch.Tensor]:
    """The prefix computed (with the first suffix), then placed on ``tier`` ("l1", "l2", "l3";
    "none": computed again), then a request of the prefix and the second suffix.

    "l2" starts L1 empty; "l3" starts L1 and L2 empty over the same L3 (another instance sharing
    it). Returns the two requests' records and the second one's output (its last token's logits).
    """
    first, _ = stack.request(index, np.concatenate([prefix, suffixes[0]]))
    moves = {"l1": (), "l2": (stack.forget_l1,), "l3": (stack.forget_l2,), "none": (stack.forget_l1,)}
    for move in moves[tier]:
        move()
    second, out = stack.request(index + 1, np.concatenate([prefix, suffixes[1]]))
    return first, second, out


def overlap_probe(stack: Stack, prefix: np.ndarray, suffixes: Sequence[np.ndarray], *, index: int = 0) -> dict[str, Any]:
    """How much of an L2 load hides behind the model's compute, for one shape of request.

    With the prefix on L2 and L1 empty: ``both`` (load + compute of the suffix), ``load`` (the load
    alone: a model that only waits for each layer), then with the prefix on L1: ``compute`` (the
    suffix alone). Hidden share = (load + compute - both) / load, from GPU times; 1 means the load
    cost nothing. Needs four distinct suffixes of one length.
    """
    stack.request(index, np.concatenate([prefix, suffixes[0]]))
    stack.forget_l1()
    both, _ = stack.request(index + 1, np.concatenate([prefix, suffixes[1]]))
    stack.forget_l1()
    model = stack.model
    stack.model = LoadOnly(model)
    try:
        load, _ = stack.request(index + 2, np.concatenate([prefix, suffixes[2]]))
    finally:
        stack.model = model
    compute, _ = stack.request(index + 3, np.concatenate([prefix, suffixes[3]]))
    load_ms, compute_ms, both_ms = load.forward_ms, compute.forward_ms, both.forward_ms
    layers = stack.spec.num_layers
    return {
        "prefix_tokens": len(prefix), "suffix_tokens": len(suffixes[0]),
        "load_ms": load_ms, "compute_ms": compute_ms, "both_ms": both_ms,
        "load_per_layer_ms": load_ms / layers, "compute_per_layer_ms": compute_ms / layers,
        "hidden_share": (load_ms + compute_ms - both_ms) / load_ms if load_ms > 0 else None,
        "stall_ms": both.wait_ms, "load_beside_compute_ms": both.load_ms,
        "records": {"both": asdict(both), "load": asdict(load), "compute": asdict(compute)},
        "wrong_pages": both.wrong_pages + load.wrong_pages, "verified_pages": both.verified_pages + load.verified_pages,
    }


# --- summaries -----------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else 0.0


def summarize(records: Sequence[RequestRecord], page_size: int) -> dict[str, Any]:
    """TTFT percentiles, requests per second, hit tokens per tier, waits against compute, pages checked."""
    ttft = [r.ttft_s for r in records]
    busy = sum(ttft)
    loaded = [r for r in records if r.load_ms > 0]
    l3 = [r for r in records if r.l3_read_bytes]
    out: dict[str, Any] = {
        "requests": len(records),
        "input_tokens": sum(r.tokens for r in records),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
        "ttft_mean_s": statistics.fmean(ttft) if ttft else 0.0,
        "requests_per_s": len(records) / busy if busy else 0.0,
        "hit_tokens": {tier: sum(getattr(r, f"{tier}_pages") for r in records) * page_size for tier in ("l1", "l2", "l3")},
        "computed_tokens": sum(r.tokens for r in records) - sum(
            (r.l1_pages + r.l2_pages + r.l3_pages) * page_size for r in records),
        "wait_ms": sum(r.wait_ms for r in records), "compute_ms": sum(r.compute_ms for r in records),
        "load_ms": sum(r.load_ms for r in records),
        "requests_with_load": len(loaded),
        "pages_verified": sum(r.verified_pages for r in records), "pages_wrong": sum(r.wrong_pages for r in records),
        "settle_s": sum(r.settle_s for r in records),
    }
    if loaded:
        out["hidden_share_of_loads"] = 1.0 - sum(r.wait_ms for r in loaded) / sum(r.load_ms for r in loaded)
        per_layer = [(r.wait_ms / max(1, r.layers_waited), r.compute_ms / max(1, r.layers_waited)) for r in loaded]
        out["wait_per_layer_ms_mean"] = statistics.fmean(w for w, _ in per_layer)
        out["compute_per_layer_ms_mean"] = statistics.fmean(c for _, c in per_layer)
    if l3:
        out["l3_read_gbps"] = sum(r.l3_read_bytes for r in l3) / sum(r.l3_read_s for r in l3) / 1e9
    return out


__all__ = ["LoadOnly", "RequestRecord", "Stack", "TierSetup", "overlap_probe", "percentile", "serve", "summarize",
           "tier_probe"]
