"""The controller's bounds hold: bytes in flight per direction and the read queue's depth.
Real HostPool, real memory:// and file backends."""

from __future__ import annotations

import time

from tiered_kv import HostPool
from tiered_kv.backends import open_backend
from tiered_kv.hierarchy import ControllerLimits, L3Controller

from .conftest import SPEC, assert_clean, keys_of, prompts, sealed

KEYS = keys_of(prompts(51, [8])[0])


def test_a_job_larger_than_the_byte_limit_goes_in_calls_within_it(tmp_path):
    """8-page backups and prefetches under a 2-page limit per direction. Before: a job larger
    than the limit ran alone as one unit, 8 pages in flight each way."""
    pool = HostPool(SPEC, 24)
    rb = pool.record_bytes
    ctl = L3Controller(lambda: open_backend(f"file://{tmp_path / 'l3'}", pool), record_bytes=rb,
                       limits=ControllerLimits(max_read_bytes_in_flight=2 * rb, max_write_bytes_in_flight=2 * rb))
    try:
        src = sealed(pool, KEYS)
        puts = [ctl.put_from(KEYS[:4], src[:4]), ctl.put_from(KEYS, src)]
        assert [f.result(10) for f in puts] == [[True] * 4, [True] * 8]
        dst = pool.allocate(16)
        gets = [ctl.get_into(KEYS, dst[:8]), ctl.get_into(KEYS, dst[8:])]
        assert [f.result(10) for f in gets] == [[True] * 8] * 2
        assert all(bytes(pool.record_view(a)) == bytes(pool.record_view(b)) for a, b in zip(src, dst[:8]))
        assert 0 < ctl.stats.write_bytes_peak <= 2 * rb
        assert 0 < ctl.stats.read_bytes_peak <= 2 * rb
        pool.free(src + dst)
    finally:
        ctl.close()
    assert_clean(pool, ctl)
    pool.close()


def test_reads_beyond_the_queue_depth_are_misses_at_once():
    """Only the write queue was bounded: L3 lookups piled up without limit."""
    from tiered_kv.hierarchy.controller import heard_from_l3  # (inside: the old code lacks it)

    pool = HostPool(SPEC, 8)
    ctl = L3Controller(lambda: open_backend("memory://", pool), record_bytes=pool.record_bytes,
                       limits=ControllerLimits(read_workers=1, queue_depth=2))
    try:
        src = sealed(pool, KEYS)
        assert ctl.put_from(KEYS, src).result(10) == [True] * 8
        # Hold the loop so the ten submissions are all queued before any worker runs.
        ctl._loop.call_soon_threadsafe(time.sleep, 0.2)
        futures = [ctl.exists(KEYS) for _ in range(10)]
        answers = [f.result(10) for f in futures]
        assert answers[:2] == [8, 8] and answers[2:] == [0] * 8
        assert ctl.stats.reads_refused == 8
        assert all(heard_from_l3(f) for f in futures[:2]) and not any(heard_from_l3(f) for f in futures[2:])
        pool.free(src)
    finally:
        ctl.close()
    assert_clean(pool, ctl)
    pool.close()
