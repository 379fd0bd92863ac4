"""A quick soak (benchmarks/soak.py): 20k page operations through all three tiers keep the page
index within what the tiers hold, open no file descriptor beyond the warm-up's and start no more
threads than its pools may (``soak.pool_threads``). Not a timing test: the RSS target is the full soak's (docs/reliability_soak.md)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import soak


def test_a_quick_soak_keeps_the_index_bounded_and_no_fd_or_thread_grows():
    result = soak.soak(20_000, sample_every=4_000, warmup_ops=8_000)
    assert result["ops"] >= 20_000 and result["pages_wrong"] == 0 and result["pages_verified"] > 0
    ops = result["page_ops"]
    assert all(ops[d] > 0 for d in ("l1_to_l2", "l2_to_l1", "l2_to_l3", "l3_to_l2"))  # every tier moved pages
    capacity = result["tier_capacity_pages"]
    # L3 evicted (it holds far fewer pages than were written) and the index forgot with it.
    assert result["l3_evictions"] > 0 and ops["l2_to_l3"] > capacity["l3"] + capacity["l2"]
    assert result["index_bound"]["max_l3_only"] == capacity["l3"]
    for s in result["samples"]:
        assert s["index_entries"] <= result["index_bound"]["entries_at_most"], s
        assert s["index_l3_only"] <= capacity["l3"] and s["index_l2_resident"] <= capacity["l2"], s
        assert s["l3_pages_held"] <= capacity["l3"], s
    assert result["fds"]["end"] <= result["fds"]["after_warmup"]
    # Pools start threads as their work overlaps, up to their sizes (soak.pool_threads): no more.
    assert all(s["threads"] <= result["threads"]["at_most"] for s in result["samples"])
