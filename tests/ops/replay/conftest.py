"""Shared pieces of the replay tests: small workloads and traces, and a checked replay.

``checked_replay`` builds the hierarchy from settings, drives the requests, closes it and asserts
what every in-process replay must end with: every L2 slot free and no task left on the
controller's loop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tiered_kv import nsa_spec
from tiered_kv.ops.replay import ChatWorkload, build, embedded_default, replay, summarize
from tiered_kv.ops.replay.workload import TRACE_BLOCK_TOKENS

#: A chat small enough for a test: 24 requests, 4 system pages, contexts of up to 15 pages.
TINY_CHAT = ChatWorkload(clients=6, rounds=4, system_tokens=256, turn_tokens=128, answer_tokens=64, rate=10, seed=1)
#: Tiers (pages of the embedded spec) below its working set of about 80 pages: hits on all three.
TINY_TIERS = {"l1_pages": 20, "l2_pages": 40, "l3_pages": 256}
PAGE = embedded_default().spec.page_size
#: In-process replays use a quarter of the embedded page (one layer, a 128-wide latent): the same
#: keys and hits, a quarter of the bytes to copy and check on a 2-core machine.
TEST_SPEC = nsa_spec(num_layers=1, page_size=PAGE, kv_lora_rank=128)
PAGES_PER_BLOCK = TRACE_BLOCK_TOKENS // PAGE


def checked_replay(requests: Sequence[Any], *, inflight: int = 8, after_build: Callable[[], None] | None = None,
                   **settings: Any) -> dict[str, Any]:
    """``after_build``: called once the hierarchy is built, before the first request (a test
    that takes the L3 server away after open)."""
    settings.setdefault("spec", TEST_SPEC)
    h = build(embedded_default(**settings))
    try:
        if after_build is not None:
            after_build()
        result = replay(h, requests, inflight=inflight)
    finally:
        close_checked(h)
    return summarize(result)


def close_checked(h: Any) -> None:
    """Close a built hierarchy and assert what every replay must leave: every L2 slot free, no task
    on the controller's loop, no temporary L3 directory; then give the host memory back."""
    h.close()
    try:
        assert h.l2_free_slots == h.manager.num_slots, "an L2 slot was not freed"
        assert h.controller.pending_tasks() == 0, "a task was left on the controller's loop"
        assert h.tempdir is None or not os.path.exists(h.tempdir), "the temporary L3 directory was left behind"
    finally:
        h.release_memory()


def trace_records(conversations: int = 3, rounds: int = 4, *, tail: int = 200) -> list[dict[str, Any]]:
    """Mooncake-format records of multi-turn conversations: block 0 is a system prompt shared by
    all, each turn repeats its conversation's earlier blocks and adds one; the last block of each
    prompt holds ``tail`` tokens (a partial block)."""
    records = []
    next_id = 1
    blocks: dict[int, list[int]] = {c: [0] for c in range(conversations)}
    t = 0
    for _ in range(rounds):
        for c in range(conversations):
            blocks[c].append(next_id)
            next_id += 1
            ids = list(blocks[c])
            records.append({"timestamp": t, "input_length": (len(ids) - 1) * TRACE_BLOCK_TOKENS + tail,
                            "output_length": 10, "hash_ids": ids})
            t += 250
    return records


def write_trace(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def expected_hit_pages(records: Sequence[dict[str, Any]]) -> list[int]:
    """Per request: the leading full pages whose page keys an earlier request produced, from the
    block ids alone (a page is named by the ids of its block and every block before it, and its
    place in its block; a partial last block shares the pages it has with the whole block)."""
    produced: set[tuple[tuple[int, ...], int]] = set()
    out = []
    for rec in records:
        ids = rec["hash_ids"]
        pages = [(tuple(ids[:p // PAGES_PER_BLOCK + 1]), p % PAGES_PER_BLOCK) for p in range(rec["input_length"] // PAGE)]
        hit = 0
        while hit < len(pages) and pages[hit] in produced:
            hit += 1
        out.append(hit)
        produced.update(pages)
    return out


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("TIERED_KV_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "tiered_kv.ops.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def tier_flags(spec: Any, *, l1_pages: int, l2_pages: int, l3_pages: int) -> list[str]:
    """``--gpu-mem / --host-mem / --disk`` in bytes that ``plan``'s arithmetic turns into these pages."""
    from tiered_kv.ops.plan import slot_bytes

    return ["--gpu-mem", str(l1_pages * spec.page_bytes), "--host-mem", str(l2_pages * slot_bytes(spec)),
            "--disk", str(l3_pages * slot_bytes(spec))]
