"""tiered-kv: a three-tier KV cache (GPU pages, pinned CPU pool, SSD / Redis / Mooncake Store).

The core exports: specs (``KVSpec`` and presets), page keys (``Namespace``, ``page_keys``), the L1
``DevicePool`` wrapper, the L2 ``HostPool``, page records, and the torch transfer path. Backends live
in ``tiered_kv.backends``, the cache itself (index, policies, controller, the two halves, an L1
prefix cache) in ``tiered_kv.hierarchy``, GPU kernels in ``tiered_kv.kernels``, the config file in
``tiered_kv.config``.
"""

from .model.device_pool import DeviceBuffer, DevicePool, allocate_engine_like
from .errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ConfigError,
    CorruptRecordError,
    DoubleFreeError,
    ForeignRecordError,
    ForeignSlotError,
    ForgedRecordError,
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
from .model.host_pool import HostPool
from .model.keys import Namespace, check_key, page_keys
from .model.record_key import RecordKey
from .model.spec import FORMAT_VERSION, Component, KVSpec, mha_spec, mla_spec, model_spec, nsa_spec
from .transfers.torch_path import pages_from_token_indices, torch_backup, torch_load, torch_load_layer

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
    "ForgedRecordError",
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
    "RecordKey",
    "check_key",
    "page_keys",
    "FORMAT_VERSION",
    "Component",
    "DeviceBuffer",
    "DevicePool",
    "HostPool",
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
