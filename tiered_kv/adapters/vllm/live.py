"""The adapter's live parts in this process, for diagnostics and in-process tests.

vLLM keeps no handle on a spec and freezes the garbage collector's view of what it built at
start-up, so the parts register themselves here. Weak references: it must never keep one alive.
"""

from __future__ import annotations

import weakref

_LIVE: weakref.WeakSet = weakref.WeakSet()


def register(part: object) -> None:
    _LIVE.add(part)


def live_parts() -> list:
    """This process's live managers, workers and L3 tiers."""
    return list(_LIVE)
