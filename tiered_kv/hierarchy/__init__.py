"""The hierarchy: the index over L2 and L3, policies, the L3 controller, and the two halves.

    metadata half (scheduler side, no CUDA):  CacheManager over a PageIndex, Policies, L3Controller
                                              (AsyncCacheManager: the same for asyncio schedulers)
    transfer half (worker side):              TransferHalf over the TransferEngine
    engine side example:                      L1PrefixCache (what the replay and benchmarks use)
"""

from .async_manager import AsyncCacheManager
from .controller import ControllerLimits, ControllerStats, L3Controller
from .index import PageIndex
from .l1_cache import L1PrefixCache, Prefill, Served
from .manager import AgreeTimeout, CacheManager, LoadPlan, Match, StorePlan
from .policies import Policies, PrefetchPolicy, PrefetchTimeout, WritePolicy
from .worker import NullTransferHalf, TransferHalf

__all__ = [
    "AgreeTimeout", "AsyncCacheManager", "CacheManager", "ControllerLimits", "ControllerStats", "L1PrefixCache", "L3Controller",
    "LoadPlan", "Match", "NullTransferHalf", "PageIndex", "Policies", "Prefill", "PrefetchPolicy", "PrefetchTimeout",
    "Served", "StorePlan", "TransferHalf", "WritePolicy",
]
