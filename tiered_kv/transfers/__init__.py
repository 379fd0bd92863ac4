"""Moving pages between L1 (the engine's GPU pool) and L2 (the pinned host pool).

``engine.TransferEngine`` takes page ids and slot ids and returns completion handles and per-layer
waits; ``policy`` chooses a copy path by (direction, geometry, conditions) from a table;
``torch_path`` is the plain torch path CPU machines use and the reference for every kernel in
``tiered_kv.kernels``. Nothing here decides *what* moves (the hierarchy does) or touches L3.
Users import ``TransferEngine`` and ``TransferOptions`` from ``tiered_kv``.
"""
