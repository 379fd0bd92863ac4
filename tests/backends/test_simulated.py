"""The key-only L3 of --simulate keeps the backend contract and the file store's capacity rule."""

from __future__ import annotations

import pytest

from tiered_kv.errors import ConfigError, PageKeyError
from tiered_kv.hierarchy import L3Controller
from tiered_kv.backends.simulated import SimulatedL3

KEYS = [f"{i:032x}" for i in range(8)]


async def test_leading_runs_and_lru_eviction():
    l3 = SimulatedL3(3)
    assert await l3.put_from(KEYS[:3], [0, 1, 2]) == [True] * 3
    assert await l3.exists(KEYS[:4]) == 3
    # A read makes KEYS[0] the most recent; exists does not touch KEYS[1].
    assert await l3.get_into([KEYS[0], KEYS[5], KEYS[1]], [0, 1, 2]) == [True, False, False]
    assert await l3.exists([KEYS[1]]) == 1
    await l3.put_from([KEYS[3]], [0])  # evicts the least recently used: KEYS[1]
    assert KEYS[1] not in l3 and KEYS[0] in l3 and len(l3) == 3
    assert l3.stats.evictions == 1
    # A put of a page held already succeeds and leaves its recency alone.
    assert await l3.put_from([KEYS[2]], [0]) == [True]
    await l3.put_from([KEYS[4]], [0])
    assert KEYS[2] not in l3
    await l3.delete([KEYS[0]])
    assert await l3.exists([KEYS[0]]) == 0
    await l3.aclose()
    assert l3.closed


async def test_bad_input_is_refused():
    with pytest.raises(ConfigError, match="capacity"):
        SimulatedL3(0)
    l3 = SimulatedL3(2)
    with pytest.raises(PageKeyError):
        await l3.exists(["bad\nkey"])
    with pytest.raises(ConfigError, match="2 keys but 1 slots"):
        await l3.put_from(KEYS[:2], [0])


def test_the_controller_drives_it():
    l3 = SimulatedL3(4)
    ctl = L3Controller(l3, record_bytes=4096)
    try:
        assert ctl.put_from(KEYS[:2], [0, 1]).result(timeout=10) == [True, True]
        assert ctl.exists(KEYS[:3]).result(timeout=10) == 2
        assert ctl.get_into(KEYS[:2], [2, 3]).result(timeout=10) == [True, True]
        assert ctl.stats.pages_read == 2 and ctl.stats.pages_written == 2
    finally:
        ctl.close()
    assert ctl.pending_tasks() == 0 and l3.closed
