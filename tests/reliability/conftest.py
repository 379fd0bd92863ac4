"""The replay every reliability test runs: ``guarded_replay`` builds the hierarchy over a given L3
URL, lets the test inject its fault once it is open, drives the requests with the byte oracle,
closes it, and asserts what must hold whatever the fault: every request served with each of its
pages accounted for, no page wrong, every host slot free, no task pending, no thread or file
descriptor left over. It must never hide a failure by retrying a replay."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tiered_kv.backends.base import BackendStats
from tiered_kv.compose import Hierarchy
from tiered_kv.ops.replay import build, embedded_default, replay, summarize
from tiered_kv.ops.replay.workload import Request

from ..ops.replay.conftest import TEST_SPEC, TINY_TIERS, close_checked

log = logging.getLogger(__name__)

#: How long threads and descriptors of a closed hierarchy get to go away (idle executor workers
#: leave once they see their executor shut down).
SETTLE_S = 5.0


@dataclass
class Outcome:
    """A replay's summary (``tiered_kv.ops.replay.summarize``) and its L3 backend's counters."""

    summary: dict[str, Any]
    backend: BackendStats
    requests: list[Any]  # the driver's ``RequestResult`` of each request, in order

    @property
    def l3_hit_tokens(self) -> int:
        return self.summary["hit_tokens"]["l3"]


def report(figures: dict[str, Any]) -> None:
    """Log what a scenario measured (docs/reliability.md quotes it): shown with
    ``-o log_cli=true --log-cli-level=INFO``."""
    log.info("figures %s", json.dumps(figures, sort_keys=True))


def one_after_another(*workloads: Sequence[Request]) -> list[Request]:
    """The requests of ``workloads``, each workload arriving after the one before it ends."""
    out: list[Request] = []
    offset = 0.0
    for requests in workloads:
        for r in requests:
            out.append(dataclasses.replace(r, index=len(out), arrival_s=offset + r.arrival_s))
        offset = out[-1].arrival_s + 1.0
    return out


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def describe(fds: set[int]) -> dict[int, str]:
    out = {}
    for fd in sorted(fds):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            out[fd] = "closed meanwhile"
    return out


def _settled(before_threads: set[int], before_fds: set[int]) -> tuple[list[str], set[int]]:
    deadline = time.monotonic() + SETTLE_S
    while True:
        extra_threads = [t.name for t in threading.enumerate() if t.ident not in before_threads and t.is_alive()]
        extra_fds = open_fds() - before_fds
        if (not extra_threads and not extra_fds) or time.monotonic() > deadline:
            return extra_threads, extra_fds
        time.sleep(0.02)


def guarded_replay(requests: Sequence[Any], l3_url: str, *, inject: Callable[[Hierarchy], None] | None = None,
                   during: Callable[[Hierarchy, Any], None] | None = None, **settings: Any) -> Outcome:
    """Replay ``requests`` over ``l3_url``; ``inject(h)`` runs once the hierarchy is open, before the
    first request, ``during(h, request_result)`` after each request (on the replay's thread: the
    next request waits for it). Asserts the invariants of the module docstring."""
    threads_before = {t.ident for t in threading.enumerate()}
    fds_before = open_fds()
    h = build(embedded_default(**{"spec": TEST_SPEC, "l3_url": l3_url, **TINY_TIERS, **settings}))
    try:
        if inject is not None:
            inject(h)
        result = replay(h, requests, progress=None if during is None else (lambda r, h=h: during(h, r)))
    finally:
        close_checked(h)
    stats = h.controller.backend.stats
    del h
    extra_threads, extra_fds = _settled(threads_before, fds_before)
    assert extra_threads == [], f"threads left after close: {extra_threads}"
    assert extra_fds == set(), f"file descriptors left after close: {describe(extra_fds)}"
    s = summarize(result)
    assert s["requests"] == len(requests) == len(result.requests)
    for r in result.requests:  # served: each page of each prompt came from a tier or was computed
        assert r.l1_pages + r.l2_pages + r.l3_pages + r.computed_pages == r.pages, r
    assert s["pages_wrong"] == 0 and s["pages_verified"] > 0
    return Outcome(s, stats, result.requests)
