"""tiered-kv: a three-tier KV cache (GPU pages, pinned CPU pool, SSD / Redis / Mooncake Store).

The core exports: specs (``KVSpec`` and presets), page keys (``Namespace``, ``page_keys``), the L1
``DevicePool`` wrapper, the L2 ``HostPool``, page records, and the torch transfer path. Backends live
in ``tiered_kv.backends``, the cache itself (index, policies, controller, the two halves, an L1
prefix cache) in ``tiered_kv.hierarchy``, GPU kernels in ``tiered_kv.kernels``, the config file in
``tiered_kv.config``.
"""

from .errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ConfigError,
    CorruptRecordError,
    DoubleFreeError,
    ForeignRecordError,
    ForeignSlotError,
    IndexValidationError,
    MetricsServerError,
    NoHostPoolError,
    PageKeyError,
    PoolError,
    PoolExhaustedError,
    NotARecordError,
    RecordError,
    SpecError,
    SpecMismatchError,
    TieredKVError,
    TruncatedRecordError,
    UnsealedSlotError,
)

# The rest loads on first use (PEP 562): a scheduler process that imports only the metadata half
# (tiered_kv.hierarchy.manager and what it needs) never loads torch through this package.
_LAZY = {
    "DeviceBuffer": ".model.device_pool", "DevicePool": ".model.device_pool", "allocate_engine_like": ".model.device_pool",
    "HostPool": ".model.host_pool", "SlotAllocator": ".model.slot_allocator",
    "Namespace": ".model.keys", "check_key": ".model.keys", "page_keys": ".model.keys",
    "FORMAT_VERSION": ".model.spec", "Component": ".model.spec", "KVSpec": ".model.spec", "mha_spec": ".model.spec",
    "mla_spec": ".model.spec", "model_spec": ".model.spec", "nsa_spec": ".model.spec",
    "pages_from_token_indices": ".transfers.torch_path", "torch_backup": ".transfers.torch_path",
    "torch_load": ".transfers.torch_path", "torch_load_layer": ".transfers.torch_path",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tiered_kv' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "BackendTimeoutError",
    "BackendUnavailableError",
    "ConfigError",
    "CorruptRecordError",
    "DoubleFreeError",
    "ForeignRecordError",
    "ForeignSlotError",
    "IndexValidationError",
    "MetricsServerError",
    "NoHostPoolError",
    "PageKeyError",
    "PoolError",
    "PoolExhaustedError",
    "NotARecordError",
    "RecordError",
    "SpecError",
    "SpecMismatchError",
    "TieredKVError",
    "TruncatedRecordError",
    "UnsealedSlotError",
    "Namespace",
    "check_key",
    "page_keys",
    "FORMAT_VERSION",
    "Component",
    "DeviceBuffer",
    "DevicePool",
    "HostPool",
    "SlotAllocator",
    "KVSpec",
    "allocate_engine_like",
    "mha_spec",
    "mla_spec",
    "model_spec",
    "nsa_spec",
    "pages_from_token_indices",
    "torch_backup",
    "torch_load",
    "torch_load_layer",
]
