"""The data model: what a page is and where it may live.

Specs (``KVSpec``: components x layers), page keys (``Namespace``, chained hashes), the page record
(header + payload, sealed and verified, keyed with a tenant's ``RecordKey`` where one is given),
the L1 ``DevicePool`` wrapper over the engine's tensors, the L2 ``HostPool`` and its layouts, the
slot allocator and the completions a free waits on.
Nothing here moves bytes between tiers or talks to a backend; it needs only torch, numpy, xxhash
and the standard library. Users import these names from ``tiered_kv``.
"""
