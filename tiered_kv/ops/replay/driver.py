"""The replay's event loop: requests through the hierarchy in arrival order, as fast as it goes.

Each request goes the way a serving engine's scheduler takes it (``L1PrefixCache``):

    lookup  -> None while L3's ``exists`` is out: the request waits, the loop serves the others
    start   -> the manager's prefetch L3 -> L2
    ready   -> the prefetch policy says it may run (``wait_complete``: once the prefetch landed)
    run     -> L2 -> L1 loads, the "prefill" of the rest (oracle bytes), stores per the write policy

The requests go in steps of up to ``inflight``: the lookups of a step are sent together (L3's
``exists`` for all of them at once), each is decided and its prefetch started in arrival order, the
step's L3 reads run together, and then its requests run one by one in arrival order, each after the
L1 <-> L2 copies and L3 writes of the run before it have landed (``Hierarchy.settle``). So every
decision the hierarchy takes (hit lengths, L2 evictions, which pages L3 holds when it is asked) sees
the same state whatever the speed of the I/O: under ``wait_complete`` the hits per tier are a
function of the workload and the settings alone, the same run to run and the same with
``--simulate``. Bytes still move concurrently where no decision waits on them: the reads
of a whole step, and each request's writes over the controller's workers. ``best_effort`` and
``timeout`` run a request with what has landed by then, so their hits do depend on the I/O's speed.

Arrival order is kept and time is not: the trace's timestamps only order the requests, no request
waits for its trace millisecond. A request joins a step only if no request admitted before it in
the step computes a page of its prompt (their prompts share a page that no run has produced yet): a
conversation's next turn waits for the previous one, as a user waits for the answer, and no page is
computed twice at once. ``inflight=1`` is one request at a time.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError
from ...hierarchy import PrefetchPolicy
from ...model.keys import page_keys
from ...compose import Hierarchy
from .workload import Request

IDLE_SLEEP_S = 0.0005


@dataclass
class RequestResult:
    """What one request got, for the report and the plot."""

    index: int
    arrival_s: float
    input_tokens: int
    pages: int
    l1_pages: int
    l2_pages: int
    l3_pages: int
    computed_pages: int
    uncached_pages: int
    verified_pages: int
    wrong_pages: int
    match_s: float
    prefetch_s: float
    load_s: float
    done_s: float  # seconds since the replay started


@dataclass
class ReplayResult:
    """Per-request results plus the counters of every part, taken before the hierarchy closed."""

    requests: list[RequestResult]
    page_size: int
    wall_s: float
    simulate: bool
    inflight: int
    bytes: dict[str, int]
    l3_busy_s: dict[str, float]
    manager: dict[str, Any]
    controller: dict[str, Any]
    l1_evictions: int
    tiers: dict[str, int]  # capacities in pages
    spec: str
    fill_s: float = 0.0
    verify_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    unserved: int = 0  # requests of the workload that got no result
    l3_degraded_at_end: bool = False  # L3 was still degraded when the last request was served


@dataclass
class _Flight:
    req: Request
    keys: list[str]
    admitted: float
    matched: float | None = None
    started: float | None = None
    match: Any = None


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _decide(f: _Flight, l1: Any, clock: Callable[[], float], *, start_prefetch: bool) -> bool:
    """Ask for ``f``'s hit once more; once decided (and ``start_prefetch``), start its prefetch.
    True when its prefetch has started."""
    if f.started is not None:
        return True
    if f.match is None:
        f.match = l1.lookup(f.req.index, f.keys)
        if f.match is None:
            return False
        f.matched = clock()
    if not start_prefetch:
        return False
    l1.start(f.req.index)
    f.started = clock()
    return True


def _wait_for(future: concurrent.futures.Future | None, timeout_s: float | None = None) -> None:
    """Block on one L3 answer (None: nothing to wait for, or only a policy's clock)."""
    if future is None:
        if timeout_s:
            time.sleep(timeout_s)
        return
    concurrent.futures.wait([future], timeout=timeout_s)


def replay(h: Hierarchy, requests: Sequence[Request], *, inflight: int = 8,
           progress: Callable[[RequestResult], None] | None = None) -> ReplayResult:
    """Drive ``requests`` (in arrival order) through ``h``; the hierarchy stays open (close it).

    Steps of up to ``inflight`` requests: every request of a step is looked up and its prefetch
    started (L3's ``exists`` and reads of the whole step at once), then the requests run one by one
    in arrival order, each once the copies and L3 writes of the one before it have landed. Every
    decision of the hierarchy (hit lengths, L2 evictions, what L3 holds) is taken at a fixed point
    of that order with no I/O of another request half done, so under ``wait_complete`` the hits
    per tier are a function of the workload and the settings alone: the same run to run, and the
    same with ``--simulate``.
    """
    if isinstance(inflight, bool) or not isinstance(inflight, int) or inflight <= 0:
        raise ConfigError(f"inflight must be an int > 0, got {inflight!r}")
    l1, manager = h.l1, h.manager
    assert l1 is not None and manager is not None
    ns = h.namespace
    wait_complete = manager.policies.prefetch is PrefetchPolicy.WAIT_COMPLETE
    pending = deque(requests)
    computed: set[str] = set()  # every page key a run has produced (a prefix-closed set)
    results: list[RequestResult] = []
    clock = time.perf_counter
    start = clock()
    fill0, verify0 = h.fill_seconds, h.verify_seconds

    def conflicts(keys: list[str], flights: list[_Flight]) -> bool:
        for f in flights:
            common = _common_prefix(keys, f.keys)
            if common and f.keys[common - 1] not in computed:
                return True
        return False

    next_keys: list[str] | None = None
    while pending:
        # Admit: a request that shares a page no run has produced yet with one admitted before it
        # waits for the next step (a conversation's next turn waits for the answer).
        # A step also holds no more pages than L1 has, as an engine schedules a batch only while
        # its KV fits the GPU: requests whose pages are all held at once would otherwise find no
        # L1 room to load their own hits, and recompute them.
        flights: list[_Flight] = []
        held = 0
        while pending and len(flights) < inflight:
            if next_keys is None:
                next_keys = page_keys(ns, pending[0].tokens())
            if flights and (conflicts(next_keys, flights) or held + len(next_keys) > l1.capacity):
                break
            flights.append(_Flight(pending.popleft(), next_keys, clock()))
            held += len(next_keys)
            next_keys = None
        # Look up: the first call of each sends its L3 ``exists`` (all of them run at once); then
        # each is decided and its prefetch started strictly in arrival order, waiting for its own
        # answer (a matched L2 page that an earlier request's prefetch evicted meanwhile is read
        # back from L3 by this one's prefetch: CacheManager.start_prefetch).
        for f in flights:
            _decide(f, l1, clock, start_prefetch=False)
        for f in flights:
            while not _decide(f, l1, clock, start_prefetch=True):
                _wait_for(manager.pending_l3(f.req.index))
        if wait_complete:
            manager.wait_idle()  # every read of the step landed: no read beside the writes below
        for f in flights:
            rid = f.req.index
            while not l1.ready(rid):  # the timeout policy's wait (wait_complete: already landed)
                _wait_for(manager.pending_l3(rid), IDLE_SLEEP_S)
            ready = clock()
            fill_before, verify_before = h.fill_seconds, h.verify_seconds
            served = l1.run(rid)
            ran = clock()
            computed.update(f.keys[:served.l1_pages + served.l2_pages + served.l3_pages + served.computed_pages])
            side = (h.fill_seconds - fill_before) + (h.verify_seconds - verify_before)
            # The next run's L2 evictions depend on which puts are still in flight, and the next
            # step's lookups on what L3 holds: let this run's stores and puts land first.
            h.settle()
            result = RequestResult(
                index=rid, arrival_s=f.req.arrival_s, input_tokens=f.req.input_length, pages=len(f.keys),
                l1_pages=served.l1_pages, l2_pages=served.l2_pages, l3_pages=served.l3_pages,
                computed_pages=served.computed_pages, uncached_pages=served.uncached_pages,
                verified_pages=served.verified_pages, wrong_pages=served.wrong_pages,
                match_s=f.matched - f.admitted, prefetch_s=ready - f.started,  # type: ignore[operator]
                load_s=max(0.0, ran - ready - side), done_s=ran - start)
            results.append(result)
            if progress is not None:
                progress(result)
    manager.wait_idle()
    l1.poll()
    wall = clock() - start
    ctl = h.controller
    cstats = ctl.stats if ctl is not None else None
    results.sort(key=lambda r: r.index)
    mstats = {k: v for k, v in vars(manager.stats).items() if not isinstance(v, list)}
    return ReplayResult(
        requests=results,
        page_size=h.spec.page_size,
        wall_s=wall,
        simulate=h.simulate,
        inflight=inflight,
        bytes={
            "l2_to_l1": int(h.worker.bytes_loaded),
            "l1_to_l2": int(h.worker.bytes_stored),
            "l3_to_l2": int(cstats.bytes_read) if cstats and not h.simulate else 0,
            "l2_to_l3": int(cstats.bytes_written) if cstats and not h.simulate else 0,
        },
        l3_busy_s={"read": cstats.read_seconds if cstats else 0.0, "write": cstats.write_seconds if cstats else 0.0},
        manager=mstats,
        controller=dict(vars(cstats)) if cstats else {},
        l1_evictions=l1.evictions,
        tiers={"l1": l1.capacity, "l2": manager.num_slots,
               "l3": h.settings.l3_pages},
        spec=h.spec.describe(),
        fill_s=h.fill_seconds - fill0,
        verify_s=h.verify_seconds - verify0,
        unserved=len(requests) - len(results),
        l3_degraded_at_end=bool(ctl is not None and ctl.degraded),
    )


__all__ = ["IDLE_SLEEP_S", "ReplayResult", "RequestResult", "replay"]
