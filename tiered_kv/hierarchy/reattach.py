"""A new worker side for a scheduler whose worker process died: L3 serves again.

``attach_worker(manager, link)`` hands the manager's ``L3Jobs`` a new link (``L3Jobs.attach``) and
makes the manager's index forget what L2 held: a new worker process starts with empty L1 and L2
memory, so a page the index believed resident there would be loaded from a slot that holds
nothing. What is known of L3 is asked of L3 again (its lookups' ``exists``). The engine drops its
L1 bookkeeping for the same reason (the pages died with the worker) before it calls this.

The quarantined slots of the lost jobs are released only where the old link proves its process
exited (``PipeLink.worker_gone``): no write of it can land any more, in its own memory or in the
new worker's. Otherwise they stay held for good.

This module must never import torch, the controller or a backend (the scheduler process runs it).
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .l3_jobs import L3Jobs


def attach_worker(manager: Any, link: Any) -> int:
    """Serve through ``link`` in place of the lost worker side; returns the quarantined slots
    released (see the module docstring). Raises ``ConfigError`` when the manager has no
    ``L3Jobs`` or its worker side was not lost."""
    jobs = manager.l3
    if not isinstance(jobs, L3Jobs):
        raise ConfigError(f"attach_worker needs a manager over L3Jobs, got l3={type(jobs).__name__}")
    if not jobs.lost:
        raise ConfigError("attach_worker takes a new worker side only once the old one was lost")
    manager.poll()  # the lost jobs' answers are taken in first (failed stores, prefetches)
    released = jobs.attach(link)
    manager.index.clear()  # the old worker's L2 bytes died with it
    manager.allocator.reap()
    return released


__all__ = ["attach_worker"]
