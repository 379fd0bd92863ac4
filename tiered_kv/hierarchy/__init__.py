"""The hierarchy: the index over L2 and L3, policies, the L3 controller, and the two halves.

    metadata half (scheduler side, no CUDA):  CacheManager over a PageIndex and Policies; its L3 is
                                              L3Jobs (plain Jobs out, JobResults in) over a link
                                              (AsyncCacheManager: the same for asyncio schedulers)
    transfer half (worker side):              JobWorker (one dispatch table by (source, destination)
                                              tiers) over the TransferEngine (TransferHalf) and the
                                              L3Controller
    links:                                    LocalLink (one process), PipeLink (a child process),
                                              OutboxLink (an engine's own transport)
    engine side example:                      L1PrefixCache (what the replay and benchmarks use)

Names load on first use, so a scheduler process that imports the metadata half never loads the
worker side (torch, the controller, a backend client).
"""

import importlib

_LAZY = {
    "AsyncCacheManager": ".async_manager",
    "attach_worker": ".reattach",
    "ControllerLimits": ".controller", "ControllerStats": ".controller", "L3Controller": ".controller",
    "PageIndex": ".index",
    "Job": ".jobs", "JobKind": ".jobs", "JobResult": ".jobs", "Tier": ".jobs",
    "JobWorker": ".job_worker",
    "JobTransferHalf": ".job_transfers",
    "L1PrefixCache": ".l1_cache", "Prefill": ".l1_cache", "Served": ".l1_cache",
    "L3Jobs": ".l3_jobs",
    "LocalLink": ".links", "OutboxLink": ".links",
    "AgreeTimeout": ".manager", "CacheManager": ".manager", "LoadPlan": ".manager", "Match": ".manager",
    "StorePlan": ".manager",
    "ChildController": ".process_link", "PipeLink": ".process_link", "WorkerParts": ".process_link",
    "stack_worker": ".process_link",
    "Policies": ".policies", "PrefetchPolicy": ".policies", "PrefetchTimeout": ".policies", "WritePolicy": ".policies",
    "NullTransferHalf": ".worker", "TransferHalf": ".worker",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tiered_kv.hierarchy' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = sorted(_LAZY)
