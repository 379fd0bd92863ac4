"""A Redis L3 that hangs (SIGSTOP), dies (SIGKILL) and comes back, or sits behind a slow link.

Lookups must stay fast whatever L3 does: a lookup whose ``exists`` has not answered within the
prefetch policy's ``lookup_wait`` decides without L3, an ``exists`` never queues behind page reads,
and reads the policy gave up on are cancelled, not waited for. Every replay serves every request
with no page wrong (``guarded_replay``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from tiered_kv.compose import Hierarchy, build, embedded_default
from tiered_kv.hierarchy import Policies, PrefetchPolicy
from tiered_kv.model.keys import page_keys
from tiered_kv.ops.replay import replay, synthetic_chat

from ..backends.redis_server import REDIS_SERVER, RedisServer
from ..ops.replay.conftest import PAGE, TEST_SPEC, TINY_CHAT, TINY_TIERS, close_checked
from .conftest import guarded_replay, report

if REDIS_SERVER is None:
    pytest.skip("redis-server is not installed", allow_module_level=True)

WAIT_S = 30.0
SOCKET_TIMEOUT_S = 3  # what a hung server costs a call before the tier degrades


@pytest.fixture
def redis():
    with RedisServer() as server:
        yield server


def _policies(prefetch: str) -> Policies:
    return Policies(prefetch=PrefetchPolicy(prefetch))


def _until(condition, message: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.005)


def _decided_lookup(h: Hierarchy, request_id: str, keys: list[str]) -> tuple[object, float]:
    """Look ``keys`` up as the replay does (waiting on ``pending_l3`` between asks): the match and
    the seconds it took."""
    started = time.monotonic()
    while (match := h.manager.lookup(request_id, keys)) is None:
        future = h.manager.pending_l3(request_id)
        if future is not None:
            concurrent.futures.wait([future], timeout=WAIT_S)
    return match, time.monotonic() - started


@pytest.mark.parametrize("prefetch", ["best_effort", "timeout"])
def test_a_hung_server_does_not_hold_lookups(redis, prefetch):
    url = f"{redis.url}?socket_timeout_s={SOCKET_TIMEOUT_S}"
    h = build(embedded_default(spec=TEST_SPEC, l3_url=url, policies=_policies(prefetch), **TINY_TIERS))
    try:
        keys = page_keys(h.namespace, list(range(7, 7 + 8 * PAGE)))
        match, healthy_s = _decided_lookup(h, "healthy", keys)
        h.manager.abort("healthy")
        assert match.l3_pages == 0 and h.manager.stats.lookups_l3_late == 0  # L3 answered: none held
        redis.pause()
        match, hung_s = _decided_lookup(h, "hung", keys)
        h.manager.abort("hung")
        budget = h.manager.policies.lookup_wait(len(keys) * PAGE)
        assert hung_s < budget + 0.5, f"a lookup waited {hung_s:.2f}s for a hung L3 (budget {budget}s)"
        assert match.l3_pages == 0 and h.manager.stats.lookups_l3_late == 1
        report({"prefetch": prefetch, "lookup_s_healthy": round(healthy_s, 4), "lookup_s_hung": round(hung_s, 4)})
    finally:
        redis.resume()
        close_checked(h)


class Signals:
    """After request ``at``: ``first(server)``; after request ``until``: ``then(server)``. Records
    the lookup time (``match_s``) of the requests in between."""

    def __init__(self, server: RedisServer, at: int, until: int, first, then) -> None:
        self.server, self.at, self.until, self.first, self.then = server, at, until, first, then
        self.match_s: list[float] = []
        self.recover_s: float | None = None

    def __call__(self, h: Hierarchy, result) -> None:
        if self.at < result.index <= self.until:
            self.match_s.append(result.match_s)
        if result.index == self.at:
            self.first(self.server)
        elif result.index == self.until:
            self.then(self.server)
            back = time.monotonic()
            h.controller.exists(["reliability-probe"]).result(WAIT_S)  # a degraded tier probes on its own
            _until(lambda: not h.controller.degraded, "the tier never came back")
            self.recover_s = time.monotonic() - back


def test_a_server_paused_and_resumed_mid_replay(redis):
    requests = synthetic_chat(TINY_CHAT)
    signals = Signals(redis, at=7, until=15, first=RedisServer.pause, then=RedisServer.resume)
    run = guarded_replay(requests, f"{redis.url}?socket_timeout_s={SOCKET_TIMEOUT_S}", during=signals,
                         policies=_policies("best_effort"))
    assert len(signals.match_s) == 8
    budget = _policies("best_effort").lookup_wait(0)
    assert budget + 0.5 < SOCKET_TIMEOUT_S  # a lookup that waited for the socket timeout fails below
    assert max(signals.match_s) < budget + 0.5, f"lookups waited on the hung server: {signals.match_s}"
    assert run.summary["l3_degraded_episodes"] >= 1  # the hung puts timed out
    assert not run.summary["faults"]["l3_degraded_at_end"]
    report({"requests": run.summary["requests"], "pages_wrong": run.summary["pages_wrong"],
            "max_lookup_s_while_paused": round(max(signals.match_s), 3), "recover_s": round(signals.recover_s, 3),
            "l3_hit_tokens": run.l3_hit_tokens})


def test_a_server_killed_and_restarted_mid_replay(redis):
    requests = synthetic_chat(TINY_CHAT)
    signals = Signals(redis, at=7, until=11, first=RedisServer.kill, then=RedisServer.start)
    run = guarded_replay(requests, redis.url, during=signals, policies=_policies("wait_complete"))
    assert run.summary["l3_degraded_episodes"] >= 1
    assert signals.recover_s is not None and signals.recover_s < 5.0
    assert run.backend.puts > 0
    report({"requests": run.summary["requests"], "pages_wrong": run.summary["pages_wrong"],
            "recover_s": round(signals.recover_s, 3), "puts": run.backend.puts,
            "l3_hit_tokens": run.l3_hit_tokens})


class ThrottleProxy:
    """A loopback TCP proxy where each chunk of up to 64 KiB waits ``delay_s_per_64k`` x its share
    of 64 KiB, both ways: a slow link in front of Redis. Runs on a thread of its own."""

    def __init__(self, target_port: int, *, delay_s_per_64k: float) -> None:
        self.target_port = target_port
        self.seconds_per_byte = delay_s_per_64k / 65536
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="throttle-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> "ThrottleProxy":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        up = asyncio.create_task(self._pipe(client_r, server_w, self.seconds_per_byte))
        down = asyncio.create_task(self._pipe(server_r, client_w, self.seconds_per_byte))
        self._tasks |= {up, down}
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for t in (up, down):
            t.cancel()
        for w in (client_w, server_w):
            w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, per_byte: float) -> None:
        try:
            while data := await reader.read(65536):
                if per_byte:
                    await asyncio.sleep(per_byte * len(data))
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def _fill(url: str, requests) -> None:
    h = build(embedded_default(spec=TEST_SPEC, l3_url=url, **TINY_TIERS))
    try:
        replay(h, requests)
    finally:
        close_checked(h)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@pytest.mark.parametrize("prefetch", ["best_effort", "timeout"])
def test_a_slow_link_does_not_hold_lookups_or_requests(redis, prefetch):
    requests = synthetic_chat(TINY_CHAT)
    _fill(redis.url, requests)  # L3 holds the chat: the replay below has L3 hits to read
    with ThrottleProxy(redis.port, delay_s_per_64k=0.1) as proxy:
        started = time.monotonic()
        run = guarded_replay(requests, proxy.url, policies=_policies(prefetch))
        wall = time.monotonic() - started
    lookups = [r.match_s for r in run.requests]
    p50, p99 = _percentile(lookups, 0.5), _percentile(lookups, 0.99)
    report({"prefetch": prefetch, "requests_per_s": round(len(requests) / wall, 1), "lookup_p50_ms": round(p50 * 1e3, 1),
            "lookup_p99_ms": round(p99 * 1e3, 1), "l3_hit_tokens": run.l3_hit_tokens,
            "prefetches_cancelled": run.summary.get("prefetches_cancelled")})
    budget = Policies(prefetch=PrefetchPolicy(prefetch)).lookup_wait(8 * PAGE)
    assert p99 < budget + 0.1, f"lookup p99 {p99:.3f}s behind a slow link"
    assert run.l3_hit_tokens > 0, "no page came from L3 through the slow link"
    # Reads the policy gave up on are cancelled, not read to their end for nothing: every page
    # read from L3 landed for a request.
    assert run.summary["l3_pages_read"] * PAGE <= run.l3_hit_tokens + run.summary["hit_tokens"]["l2"], run.summary


def test_an_exists_does_not_wait_behind_slow_reads_and_a_running_read_is_cancelled(redis):
    requests = synthetic_chat(TINY_CHAT)
    _fill(redis.url, requests)
    with ThrottleProxy(redis.port, delay_s_per_64k=3.0) as proxy:  # about 1.3 s a page
        h = build(embedded_default(spec=TEST_SPEC, l3_url=proxy.url, **TINY_TIERS))
        try:
            keys = page_keys(h.namespace, requests[0].tokens())[:8]
            assert h.controller.exists(keys).result(WAIT_S) == len(keys)
            slots = h.manager.allocator.allocate(len(keys))
            reads = [h.controller.get_into([k], [s]) for k, s in zip(keys, slots)]  # more than the read workers
            time.sleep(0.1)
            started = time.monotonic()
            assert h.controller.exists(keys).result(WAIT_S) == len(keys)
            exists_s = time.monotonic() - started
            started = time.monotonic()
            assert all(h.controller.cancel(f) for f in reads)
            cancel_s = time.monotonic() - started
            assert all(f.cancelled() for f in reads) and h.controller.stats.pages_read == 0
            h.manager.allocator.free(slots)
            report({"exists_s_behind_reads": round(exists_s, 3), "cancel_s": round(cancel_s, 3)})
            assert exists_s < 0.5, f"an exists waited {exists_s:.2f}s behind page reads"
            assert cancel_s < 0.5, f"cancelling running reads took {cancel_s:.2f}s"
        finally:
            close_checked(h)
