"""The replay's event loop: requests through the hierarchy in arrival order, as fast as it goes.

Each request goes the way a serving engine's scheduler takes it (``L1PrefixCache``):

    lookup  -> None while L3's ``exists`` is out: the request waits, the loop serves the others
    start   -> the manager's prefetch L3 -> L2
    ready   -> the prefetch policy says it may run (``wait_complete``: once the prefetch landed)
    run     -> L2 -> L1 loads, the "prefill" of the rest (oracle bytes), stores per the write policy

Up to ``inflight`` requests are in flight at once, so lookups and prefetches of one overlap the
runs of others. Arrival order is kept and time is not: the trace's timestamps only order the
requests, no request waits for its trace millisecond. A request is admitted only once no request
in flight is still computing a page of its prompt (their prompts share a page that no run has
produced yet): a conversation's next turn waits for the previous one, as a user waits for the
answer, and no page is computed twice at once. With ``inflight=1`` the loop also waits for the L3
writes of each request before the next one, so the hits per tier do not depend on timing at all
(``--simulate`` and a byte-moving replay of the same workload then agree exactly).

When nothing can progress the loop sleeps 0.5 ms (the controller's thread is working).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..keys import page_keys
from .setup import Hierarchy
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


def replay(h: Hierarchy, requests: Sequence[Request], *, inflight: int = 8,
           progress: Callable[[RequestResult], None] | None = None) -> ReplayResult:
    """Drive ``requests`` (in arrival order) through ``h``; the hierarchy stays open (close it)."""
    if isinstance(inflight, bool) or not isinstance(inflight, int) or inflight <= 0:
        raise ConfigError(f"inflight must be an int > 0, got {inflight!r}")
    l1, manager = h.l1, h.manager
    assert l1 is not None and manager is not None
    ns = h.namespace
    serial = inflight == 1
    pending = deque(requests)
    flights: list[_Flight] = []
    computed: set[str] = set()  # every page key a run has produced (a prefix-closed set)
    results: list[RequestResult] = []
    clock = time.perf_counter
    start = clock()
    fill0, verify0 = h.fill_seconds, h.verify_seconds

    def conflicts(keys: list[str]) -> bool:
        for f in flights:
            common = _common_prefix(keys, f.keys)
            if common and f.keys[common - 1] not in computed:
                return True
        return False

    next_keys: list[str] | None = None
    while pending or flights:
        progressed = False
        while pending and len(flights) < inflight:
            if next_keys is None:
                next_keys = page_keys(ns, pending[0].tokens())
            if conflicts(next_keys):
                break
            flights.append(_Flight(pending.popleft(), next_keys, clock()))
            next_keys = None
            progressed = True
        for f in list(flights):
            rid = f.req.index
            if f.match is None:
                match = l1.lookup(rid, f.keys)
                if match is None:
                    continue
                f.match, f.matched = match, clock()
                l1.start(rid)
                f.started = clock()
                progressed = True
            if not l1.ready(rid):
                continue
            ready = clock()
            fill_before, verify_before = h.fill_seconds, h.verify_seconds
            served = l1.run(rid)
            ran = clock()
            computed.update(f.keys[:served.l1_pages + served.l2_pages + served.l3_pages + served.computed_pages])
            side = (h.fill_seconds - fill_before) + (h.verify_seconds - verify_before)
            flights.remove(f)
            result = RequestResult(
                index=rid, arrival_s=f.req.arrival_s, input_tokens=f.req.input_length, pages=len(f.keys),
                l1_pages=served.l1_pages, l2_pages=served.l2_pages, l3_pages=served.l3_pages,
                computed_pages=served.computed_pages, uncached_pages=served.uncached_pages,
                verified_pages=served.verified_pages, wrong_pages=served.wrong_pages,
                match_s=f.matched - f.admitted, prefetch_s=ready - f.started,  # type: ignore[operator]
                load_s=max(0.0, ran - ready - side), done_s=ran - start)
            results.append(result)
            if serial:
                manager.wait_idle()
                l1.poll()
            if progress is not None:
                progress(result)
            progressed = True
        if not progressed:
            time.sleep(IDLE_SLEEP_S)
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
    )


__all__ = ["IDLE_SLEEP_S", "ReplayResult", "RequestResult", "replay"]
