"""Ranks and sharing across processes.

- Two processes with different local hits agree on the minimum (``TcpAgreement`` over loopback).
- A rank that never answers makes the other give up by the deadline: no hit, the request is
  recomputed (and still served right).
- Only the writer rank writes replicated pages to L3.
- Two caches in two processes over the same Redis, Mooncake store or directory: the second hits
  the first one's pages and verifies every byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiered_kv.hierarchy import CacheManager, Policies
from tiered_kv.hierarchy.agree import TcpAgreement
from tiered_kv.model.slot_allocator import SlotAllocator

from .conftest import PAGE, SPLIT, assert_clean, count_on_l3, keys_of, make_stack, prompts

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 3.0

_CHILD = """
import json, sys
from tests.hierarchy.conftest import PAGE, SPLIT, keys_of, make_stack, prompts
from tests.hierarchy.test_sharing import local_manager
role, cfg = sys.argv[1], json.loads(sys.argv[2])
SPLIT["on"] = cfg.get("split", False)  # the parent's mode: its prompts, its stacks
if role == "agree":
    from tiered_kv.hierarchy.agree import TcpAgreement
    agree = TcpAgreement(1, 2, ("127.0.0.1", cfg["port"]), cfg["deadline"])
    mgr, keys = local_manager(cfg["have"], agree)
    print("ready", flush=True)  # the parent looks up only now: interpreter start is not in the deadline
    m = mgr.lookup("r", keys)
    mgr.close()
    print(json.dumps({"l2": m.l2_pages}))
else:
    s = make_stack(cfg["url"], open_options=cfg["options"])
    for i, t in enumerate(prompts(cfg["seed"], cfg["sizes"])):
        s.serve(i, keys_of(t))
        s.settle()
    written = s.controller.stats.pages_written
    s.close()
    print(json.dumps({"written": written}))
"""

# Every test here runs with the scheduler and worker sides in one process, then in two.
pytestmark = pytest.mark.usefixtures("stack_process")


def child(role: str, cfg: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CHILD, role, json.dumps(cfg)], cwd=REPO, env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen, timeout_s: float = 60) -> dict:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def local_manager(have: int, agree) -> tuple[CacheManager, list[str]]:
    """A scheduler-side manager (bare allocator, no L3) holding the first ``have`` pages on L2."""
    keys = keys_of(prompts(71, [8])[0])
    mgr = CacheManager(SlotAllocator(16), page_size=PAGE, agree=agree)
    plan = mgr.prepare_store(keys[:have])
    mgr.complete_store(plan, True)
    return mgr, keys


def test_two_processes_agree_on_the_minimum():
    agree = TcpAgreement(0, 2, ("127.0.0.1", 0), DEADLINE_S)
    other = child("agree", {"port": agree.port, "deadline": DEADLINE_S, "have": 3})
    mgr, keys = local_manager(6, agree)
    try:
        # Both ranks must reach the lookup within the deadline; the child's interpreter start
        # (imports of torch and the library, seconds on a loaded 2-core machine) must not count.
        assert other.stdout.readline().strip() == "ready", other.stderr.read()[-3000:]
        m = mgr.lookup("r", keys)
        assert m.l2_pages == 3  # ours was 6, the other rank's 3
        assert result(other) == {"l2": 3}
        assert agree.timeouts == 0
    finally:
        if other.poll() is None:  # a failed check must not leave the child behind for later tests
            other.kill()
            other.communicate()
        mgr.close()
        agree.close()
        assert_clean(mgr.allocator, None)


def test_a_silent_rank_makes_the_other_give_up_by_the_deadline_and_recompute():
    deadline = 0.3
    agree = TcpAgreement(0, 2, ("127.0.0.1", 0), deadline)  # rank 1 never comes
    keys, other = (keys_of(t) for t in prompts(72, [6, 6]))
    s = make_stack(None, l1_pages=6)  # L2 only, no agreement while it fills
    try:
        s.serve("first", keys)
        s.serve("evicts-l1", other)  # L1 holds 6 pages: the first prompt is now on L2 only
        s.settle()
        assert s.manager.index.l2_run(keys) == len(keys) and s.l1.match(keys) == 0
        s.manager.agree = agree  # from now on the ranks must agree, and rank 1 is silent
        t0 = time.monotonic()
        match, served = s.serve("second", keys)
        waited = time.monotonic() - t0
        assert match.l2_pages == 0 and served.computed_pages == len(keys)  # recomputed, served right
        assert s.manager.stats.agree_timeouts == 1 and agree.timeouts == 1
        assert deadline * 0.9 <= waited <= deadline + 1.0
    finally:
        s.close()
        agree.close()


def test_only_the_writer_rank_writes_replicated_pages(tmp_path):
    url = f"file://{tmp_path / 'l3'}"
    keys = keys_of(prompts(73, [6])[0])
    reader = make_stack(url, policies=Policies(l3_writer=False))
    writer = make_stack(url, policies=Policies(l3_writer=True))
    try:
        reader.serve("r", keys)
        reader.settle()
        assert reader.manager.stats.stores == len(keys)  # on its L2...
        assert count_on_l3(url, {}, keys) == 0 and reader.controller.stats.writes_started == 0  # ...not on L3
        writer.serve("w", keys)
        writer.settle()
        assert count_on_l3(url, {}, keys) == len(keys)
    finally:
        reader.close()
        writer.close()
    again = make_stack(url, policies=Policies(l3_writer=False))
    try:
        match, served = again.serve("again", keys)  # the non-writer reads what the writer wrote
        assert served.l3_pages == len(keys) and served.wrong_pages == 0
    finally:
        again.close()


def test_a_second_process_hits_the_first_ones_pages(l3_kind, l3_opener):
    url, options = l3_opener
    sizes = [5, 7, 4]
    first = result(child("fill", {"url": url, "options": options, "seed": 74, "sizes": sizes, "split": SPLIT["on"]}),
                   timeout_s=90)
    assert first["written"] == sum(sizes)
    s = make_stack(url, open_options=options)
    try:
        for i, t in enumerate(prompts(74, sizes)):
            match, served = s.serve(i, keys_of(t))
            assert match.l3_pages == sizes[i]
            assert served.l3_pages == sizes[i] and served.verified_pages == sizes[i] and served.wrong_pages == 0
    finally:
        s.close()
