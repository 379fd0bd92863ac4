"""The metadata half for asyncio schedulers: ``AsyncCacheManager`` over a ``CacheManager``.

``CacheManager`` is synchronous and never blocks, for engines that schedule from a plain thread:
a lookup whose L3 answer is pending returns None, a prefetch is asked ``prefetch_ready`` each step.
A scheduler that runs on an asyncio loop would rather await those answers. This facade turns the
two "not yet" answers into awaitables on the L3 controller's own futures (no polling), and hands
every other call (``prepare_load``, ``complete_store``, ``on_l1_inserted``, ...) to the manager as it is:
those never wait.

Awaiting never cancels L3 work: a task that awaits ``lookup`` or ``wait_prefetch`` and is cancelled
(its request went away) leaves the controller's future running, and ``abort`` drops it as with the
synchronous manager. Like the manager, the facade is not thread-safe: call it from one loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
from .manager import CacheManager, Match


async def _settled(future: concurrent.futures.Future, timeout_s: float | None = None) -> None:
    """Wait until ``future`` is done (or ``timeout_s`` passed) without raising its outcome and
    without cancelling it when the awaiting task is cancelled (``asyncio.wait`` cancels nothing)."""
    await asyncio.wait({asyncio.wrap_future(future)}, timeout=timeout_s)


class AsyncCacheManager:
    """``CacheManager``'s calls for asyncio callers; see the module docstring."""

    def __init__(self, manager: CacheManager) -> None:
        if not isinstance(manager, CacheManager):
            raise ConfigError(f"AsyncCacheManager wraps a CacheManager, got {type(manager).__name__}")
        self.manager = manager

    def __getattr__(self, name: str) -> Any:
        # Everything that never waits is the manager's own call.
        return getattr(self.manager, name)

    async def lookup(self, request_id: Any, keys: Sequence[str], l1_pages: int = 0) -> Match:
        """``CacheManager.lookup``, awaiting L3's answer instead of returning None."""
        while True:
            match = self.manager.lookup(request_id, keys, l1_pages)
            if match is not None:
                return match
            future = self.manager.pending_l3(request_id)
            if future is None:  # answered meanwhile: the next lookup decides
                await asyncio.sleep(0)
            else:
                await _settled(future)

    async def wait_prefetch(self, request_id: Any) -> None:
        """Return once the request may be scheduled under the prefetch policy (``prefetch_ready``):
        when its reads have landed, or when the policy's wait has run out, whichever comes first."""
        while not self.manager.prefetch_ready(request_id):
            future = self.manager.pending_l3(request_id)
            if future is None:
                await asyncio.sleep(0)
            else:
                await _settled(future, self.manager.prefetch_wait_left(request_id))

    async def prefetch(self, request_id: Any, keys: Sequence[str], match: Match) -> int:
        """``start_prefetch``, then ``wait_prefetch``; returns the pages asked of L3."""
        pages = self.manager.start_prefetch(request_id, keys, match)
        await self.wait_prefetch(request_id)
        return pages

    async def aclose(self, *, drain: bool = True) -> None:
        """``CacheManager.close`` on a worker thread: draining waits for L3 work (at most the
        controller's ``drain_timeout_s``), which must not hold up the loop (call nothing else on
        the manager meanwhile)."""
        await asyncio.to_thread(self.manager.close, drain=drain)


__all__ = ["AsyncCacheManager"]
