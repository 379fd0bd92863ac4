"""The scheduler side loads nothing of the worker side: no torch, no controller, no backend client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

SCHEDULER = r'''
import json, sys
from tiered_kv.hierarchy import CacheManager, L3Jobs, OutboxLink, Policies
from tiered_kv.hierarchy.async_manager import AsyncCacheManager
from tiered_kv.hierarchy.job_transfers import JobTransferHalf
from tiered_kv.hierarchy.jobs import JobResult
from tiered_kv.model.slot_allocator import SlotAllocator

link = OutboxLink()
manager = CacheManager(SlotAllocator(8), page_size=16, policies=Policies(), l3=L3Jobs(link))
keys = [f"{i:064x}" for i in range(1, 4)]
first = manager.lookup("r", keys)
(job,) = link.take_jobs()
manager.l3.on_results([JobResult(job.job_id, job.kind, (True, True, False), 2)])
match = manager.lookup("r", keys)
manager.close()
worker_side = ("torch", "triton", "redis", "mooncake", "tiered_kv.backends", "tiered_kv.hierarchy.controller",
               "tiered_kv.hierarchy.job_worker", "tiered_kv.hierarchy.worker", "tiered_kv.transfers",
               "tiered_kv.model.host_pool", "tiered_kv.model.device_pool")
loaded = sorted(m for m in sys.modules if any(m == w or m.startswith(w + ".") for w in worker_side))
print(json.dumps({"first": first, "l3_pages": match.l3_pages, "loaded": loaded}))
'''


def test_the_scheduler_side_loads_no_worker_side_module():
    out = subprocess.run([sys.executable, "-W", "error", "-c", SCHEDULER], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["first"] is None and report["l3_pages"] == 2  # it worked, through jobs alone
    assert report["loaded"] == []
