"""The end-to-end loop on CPU: a tiny model with real attention over the paged L1 pool, every tier.

The model reads every key and value from L1 pages, whether they were computed, held on L1, loaded
from L2 or read from L3 through L2, so its logits with a loaded prefix equal (bitwise) its logits
with the prefix recomputed only if the loaded pages are exactly the ones computed. Each test checks
that, that every loaded page is verified and none is wrong, and that every L2 slot is free after.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

from tiered_kv.ops.bench.e2e import Stack, TierSetup, overlap_probe, serve, summarize, tier_probe
from tiered_kv.ops.bench.e2e_kv import RequestKV
from tiered_kv.ops.bench.e2e_models import DeepSeekV32Flops, NSAStandIn, TinyAttentionLM
from tiered_kv.ops.bench.e2e_oracle import PageOracle
from tiered_kv.errors import ConfigError
from tiered_kv.ops.replay.workload import ChatWorkload, synthetic_chat

from ..backends.mooncake_server import segment_holder

PAGE = 16


def tokens(seed: int, count: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 100_000, count, dtype=np.uint32)


@pytest.fixture
def model() -> TinyAttentionLM:
    return TinyAttentionLM(layers=3, page_size=PAGE, chunk_tokens=PAGE)


PREFIX = tokens(1, 6 * PAGE)  # 6 full pages
SUFFIXES = (tokens(2, 9), tokens(3, 9))  # each prompt ends in a partial page of 9 tokens


def recomputed_logits(model: TinyAttentionLM, prompt: np.ndarray) -> torch.Tensor:
    stack = Stack(model, TierSetup("l1"), l1_pages=32, device="cpu")
    try:
        record, logits = stack.request(0, prompt)
    finally:
        stack.close()
    assert record.computed_pages == len(prompt) // PAGE  # nothing reused
    return logits


@pytest.fixture(scope="module")
def mooncake_url(mooncake_master):
    with segment_holder(mooncake_master, "128MiB"):  # a second process holds the pages
        yield mooncake_master.url(contribute_segment=False, timeout_s=10)


def l3_url(kind: str, tmp_path, mooncake_request) -> str:
    if kind == "file":
        return f"file://{tmp_path}/l3?capacity_bytes=64MiB"
    return mooncake_request.getfixturevalue("mooncake_url")


@pytest.mark.parametrize("tier, l3", [("l1", None), ("l2", None), ("l3", "file"), ("l3", "mooncake")])
def test_logits_with_a_loaded_prefix_equal_recomputed(model, tier, l3, tmp_path, request):
    """The prefix computed by one request, then held on L1, loaded from L2, or read from L3 (file,
    or Mooncake with its segment in a second process) into a fresh L1 and L2: the next prompt's
    logits equal those of the same prompt computed from scratch, bit for bit."""
    expected = recomputed_logits(model, np.concatenate([PREFIX, SUFFIXES[1]]))
    url = l3_url(l3, tmp_path, request) if l3 else None
    stack = Stack(model, TierSetup(tier, l2_pages=64, l3_url=url), l1_pages=32, device="cpu")
    try:
        first, second, logits = tier_probe(stack, tier, PREFIX, SUFFIXES)
    finally:
        stack.close()
    prefix_pages = len(PREFIX) // PAGE
    assert first.computed_pages == prefix_pages
    served = {"l1": second.l1_pages, "l2": second.l2_pages, "l3": second.l3_pages}[tier]
    assert served == prefix_pages and second.computed_pages == 0
    assert torch.equal(logits, expected)
    assert second.verified_pages == (0 if tier == "l1" else prefix_pages)
    assert second.wrong_pages == 0
    if stack.host_pool is not None:
        assert stack.host_pool.free_slots == stack.host_pool.num_slots


def test_a_wrong_page_is_caught(model):
    """The check the loop runs on loaded pages sees one flipped byte of one layer."""
    pool = model.make_pool(8, "cpu", (0,))
    oracle = PageOracle(model.spec, "cpu")
    keys, pages = ["c" * 32, "d" * 32], [3, 5]
    bases, index = oracle.bases(keys), torch.tensor(pages)
    for layer in range(model.spec.num_layers):
        oracle.fill(pool, bases, index, layer)
    assert oracle.check(pool, keys, pages) == [True, True]
    pool.chunk_view(1, 2)[5, 7] ^= 1
    assert oracle.check(pool, keys, pages) == [True, False]


def test_chat_workload_through_every_tier(model, tmp_path):
    """A multi-turn chat larger than L1 and L2: hits come from each tier, none wrong, slots all free."""
    work = ChatWorkload(clients=4, rounds=3, system_tokens=2 * PAGE, turn_tokens=3 * PAGE + 5, answer_tokens=2 * PAGE,
                        rate=100.0)
    prompts = [r.tokens() for r in synthetic_chat(work)]
    longest = max(len(p) for p in prompts) // PAGE
    stack = Stack(model, TierSetup("l3", l2_pages=32, l3_url=f"file://{tmp_path}?capacity_bytes=64MiB"),
                  l1_pages=longest + 2, device="cpu")
    try:
        summary = summarize(serve(stack, prompts), PAGE)
    finally:
        stack.close()
    assert summary["requests"] == len(prompts)
    assert all(summary["hit_tokens"][tier] > 0 for tier in ("l1", "l2", "l3")), summary["hit_tokens"]
    assert summary["pages_verified"] == (summary["hit_tokens"]["l2"] + summary["hit_tokens"]["l3"]) // PAGE
    assert summary["pages_wrong"] == 0
    assert stack.host_pool.free_slots == stack.host_pool.num_slots


def test_l1_only_never_stores():
    model = TinyAttentionLM(layers=2, page_size=PAGE)
    stack = Stack(model, TierSetup("l1"), l1_pages=8, device="cpu")
    try:
        prompts = [np.concatenate([PREFIX, SUFFIXES[0]]), tokens(7, 7 * PAGE), np.concatenate([PREFIX, SUFFIXES[1]])]
        records = serve(stack, prompts)
    finally:
        stack.close()
    # The second prompt pushed the first out of L1 (8 pages); nothing below L1 serves it again.
    assert [r.l1_pages + r.l2_pages + r.l3_pages for r in records] == [0, 0, 0]


def test_overlap_probe_on_cpu(model):
    stack = Stack(model, TierSetup("l2", l2_pages=64), l1_pages=32, device="cpu")
    try:
        result = overlap_probe(stack, PREFIX, [tokens(10 + i, 9) for i in range(4)])
    finally:
        stack.close()
    assert result["records"]["both"]["l2_pages"] == len(PREFIX) // PAGE
    assert result["records"]["compute"]["l1_pages"] == len(PREFIX) // PAGE
    assert result["wrong_pages"] == 0 and result["verified_pages"] == 2 * len(PREFIX) // PAGE


def test_nsa_stand_in_through_l2():
    """The NSA stand-in (latent + indexer pages, GEMMs per layer) on a small width: loaded pages
    are checked whole (both components), none wrong."""
    stand_in = NSAStandIn("cpu", num_layers=2, flops=DeepSeekV32Flops(hidden=64))
    stack = Stack(stand_in, TierSetup("l2", l2_pages=16), l1_pages=8, device="cpu")
    prefix = tokens(4, 2 * 64)
    try:
        first, second, _ = tier_probe(stack, "l2", prefix, (tokens(5, 10), tokens(6, 10)))
    finally:
        stack.close()
    assert first.computed_pages == 2 and second.l2_pages == 2
    assert second.verified_pages == 2 and second.wrong_pages == 0
    assert stand_in.gemm_flops > 0


def test_deepseek_flop_model():
    """The written FLOP model: 1.1985 GFLOP of projections and FFN per token and layer (73 GFLOP
    over 61 layers: DeepSeek-V3.2's 37B active parameters), an eighth of it per GPU of 8."""
    flops = DeepSeekV32Flops()
    assert flops.linear_per_token * 8 == pytest.approx(1.1985e9, rel=1e-3)
    assert flops.linear_per_token * 8 * 61 == pytest.approx(73.1e9, rel=1e-2)
    one = flops.layer(0, 1)
    assert one == pytest.approx(flops.linear_per_token + (2 * 128 * 1088 + 2 * 64 * 128) / 8)
    # Attention grows with the position: the indexer with every earlier key, the sparse part up to 2048.
    assert flops.layer(10_000, 10_001) - flops.layer(0, 1) == pytest.approx(
        (2 * 128 * 1088 * 2047 + 2 * 64 * 128 * 10_000) / 8)
    assert flops.layer(0, 4096) == pytest.approx(sum(flops.layer(p, p + 1) for p in range(4096)))


def test_chunks_are_page_aligned_and_the_last_token_is_always_computed(model):
    stack = Stack(model, TierSetup("l1"), l1_pages=16, device="cpu")
    try:
        keys = [f"{i:032x}" for i in range(3)]
        kv = RequestKV(stack.pool, stack.oracle, keys, [1, 2, 3], present_pages=1, load=None, num_tokens=3 * PAGE + 5,
                       tail_page=stack.tail_page)
        assert list(kv.chunks(PAGE)) == [(PAGE, 2 * PAGE), (2 * PAGE, 3 * PAGE), (3 * PAGE, 3 * PAGE + 5)]
        whole = RequestKV(stack.pool, stack.oracle, keys, [1, 2, 3], present_pages=3, load=None, num_tokens=3 * PAGE,
                          tail_page=stack.tail_page)
        assert whole.compute_from == 3 * PAGE - 1
    finally:
        stack.close()


def test_oracle_is_a_function_of_the_key_and_finite():
    model = TinyAttentionLM(layers=2, page_size=PAGE)
    oracle = PageOracle(model.spec, "cpu")
    bases = oracle.bases(["a" * 32, "b" * 32, "a" * 32])
    chunk = oracle.chunk(bases, 0, 1)
    assert torch.equal(chunk[0], chunk[2]) and not torch.equal(chunk[0], chunk[1])
    assert not torch.equal(chunk, oracle.chunk(bases, 1, 1)) and not torch.equal(chunk, oracle.chunk(bases, 0, 0))
    assert torch.isfinite(chunk.view(torch.float32)).all()


def test_an_l3_without_l2_is_refused():
    with pytest.raises(ConfigError, match="needs an L2"):
        TierSetup("bad", l2_pages=0, l3_url="file:///tmp/x")
