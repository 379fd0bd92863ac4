"""``prefetch_pages_missing`` counts pages L3 lost between a lookup and its prefetch: with a
simulated L3 that never evicts (and no fault), no page can be lost, so the count must be 0."""

from __future__ import annotations

from tiered_kv.ops.replay import ChatWorkload, build, embedded_default, replay, synthetic_chat

#: Requests with L1 hits and L3 hits at once (the embedded default's tiers: 160 / 448 / 8,192
#: pages), and an L3 that holds the whole chat.
BUSY_CHAT = ChatWorkload(clients=32, rounds=8, seed=1)


def test_a_simulated_run_whose_l3_never_evicts_counts_no_page_missing():
    # It counted 2,426 pages "gone from L3" here: a prefetch read its match's L3 part plus as many
    # pages past it as the request had on L1 (pages no run had produced yet, never on L3).
    h = build(embedded_default(simulate=True, verify=False))
    try:
        result = replay(h, synthetic_chat(BUSY_CHAT), inflight=8)
        backend = h.controller.backend
        evictions, held = backend.stats.evictions, len(backend)
    finally:
        h.close()
    assert h.controller.pending_tasks() == 0 and h.l2_free_slots == h.manager.num_slots
    h.release_memory()
    assert evictions == 0 and held > 0  # the premise: L3 kept every page it was given
    assert result.manager["prefetch_pages_landed"] > 0  # prefetches ran
    assert result.manager["prefetch_pages_missing"] == 0
