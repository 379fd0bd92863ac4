"""A replay served through a fault is told apart from one that failed: L3 degraded during the run
and back before its end, every request served and every page right, is exit 0 with the episode
in ``faults``; a wrong page, a request not served or an L3 still down at the end is exit 1."""

from __future__ import annotations

import json
import time

import pytest

from tiered_kv.hierarchy import Policies, PrefetchPolicy
from tiered_kv.ops.replay import build, embedded_default, replay, summarize, synthetic_chat
from tiered_kv.ops.replay.cli import exit_code
from tiered_kv.ops.replay.report import FAILED, OK, SERVED_THROUGH_FAULT, format_table, to_json

from ...backends.redis_server import REDIS_SERVER, RedisServer
from .conftest import TEST_SPEC, TINY_CHAT, TINY_TIERS, checked_replay


def _wait_until(condition, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "L3 did not come back"
        time.sleep(0.02)


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
def test_a_run_served_through_an_l3_outage_is_exit_0_with_the_fault_counted():
    # It exited 1 after any degraded episode, even with every request served and every page right.
    requests = synthetic_chat(TINY_CHAT)
    policies = Policies(prefetch=PrefetchPolicy.WAIT_COMPLETE)
    with RedisServer() as server:
        h = build(embedded_default(spec=TEST_SPEC, l3_url=server.url, policies=policies, **TINY_TIERS))
        served = []

        def outage(result) -> None:
            served.append(result)
            if len(served) == 6:
                server.kill()  # the next lookups find no server: the tier goes degraded
            elif len(served) == 12:
                assert h.controller.degraded
                server.start()  # back (empty): the health probe brings the tier back
                _wait_until(lambda: not h.controller.degraded)
        try:
            result = replay(h, requests, inflight=1, progress=outage)
        finally:
            h.close()
        assert h.l2_free_slots == h.manager.num_slots and h.controller.pending_tasks() == 0
        h.release_memory()
    s = summarize(result)
    assert s["requests"] == len(requests) and s["requests_unserved"] == 0 and s["pages_wrong"] == 0
    faults = s["faults"]
    assert faults["degraded_episodes"] >= 1 and faults["recoveries"] == faults["degraded_episodes"]
    assert faults["backend_errors"] >= 1 and not faults["l3_degraded_at_end"]
    assert s["l3_degraded_episodes"] == faults["degraded_episodes"]  # the existing key stays
    assert s["outcome"] == SERVED_THROUGH_FAULT and exit_code(s) == 0
    assert json.loads(to_json(s))["faults"] == faults
    table = format_table(s)
    assert "outcome: served through a fault" in table and "back each time" in table


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
def test_an_l3_still_down_at_the_end_is_a_failure_found():
    policies = Policies(prefetch=PrefetchPolicy.WAIT_COMPLETE, l3_admission_hits=1000)
    with RedisServer() as server:
        s = checked_replay(synthetic_chat(TINY_CHAT), l3_url=server.url, policies=policies, after_build=server.kill,
                           **TINY_TIERS)
    assert s["requests_unserved"] == 0 and s["pages_wrong"] == 0
    assert s["faults"]["l3_degraded_at_end"] and s["outcome"] == FAILED and exit_code(s) == 1
    assert "still degraded at the end" in format_table(s)


def test_a_clean_run_is_ok_with_no_fault():
    s = checked_replay(synthetic_chat(TINY_CHAT), inflight=1, simulate=True, verify=False, **TINY_TIERS)
    assert s["outcome"] == OK and exit_code(s) == 0
    assert s["faults"]["degraded_episodes"] == 0 and not s["faults"]["l3_degraded_at_end"]
