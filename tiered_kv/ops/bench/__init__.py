"""Benchmarks and their helpers, apart from the production modules they measure.

- ``raw_ceilings``: each medium's own throughput (direct I/O, ``redis-benchmark``, Mooncake's
  zero-copy calls), a table keyed by URL scheme, for ``bench storage`` to set beside ours;
- ``segment_holder``: a process contributing Mooncake store memory
  (``python -m tiered_kv.ops.bench.segment_holder hold-segment URL``), for the ceilings, the tests and
  the dev stack;
- ``transfer``: ``tiered-kv bench transfer``, L1 <-> L2 through the ``TransferEngine``.

``tiered-kv bench storage`` itself is ``tiered_kv.ops.bench.storage``. Nothing in the library's data
paths imports this package.
"""
