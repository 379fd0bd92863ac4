"""tiered-kv: a three-tier KV cache (GPU pages, pinned CPU pool, SSD / Redis / Mooncake Store).

The core exports: specs (``KVSpec`` and presets), page keys (``Namespace``, ``page_keys``), the L1
``DevicePool`` wrapper, the L2 ``HostPool``, the torch transfer path and the ``TransferEngine`` with
its ``TransferOptions`` (the data model lives in ``tiered_kv.model``, the transfers in
``tiered_kv.transfers``; import these names from here). Backends live
in ``tiered_kv.backends``, the cache itself (index, policies, controller, the two halves, an L1
prefix cache) in ``tiered_kv.hierarchy``, GPU kernels in ``tiered_kv.kernels``, the config file in
``tiered_kv.config``.

Every name below is imported on first use (PEP 562 ``__getattr__``): ``import tiered_kv`` loads no
torch, so the command line and the config tools start without it. Only the tensor parts need it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Exported name -> the submodule that defines it (imported when the name is first read).
_EXPORTS: dict[str, str] = {
    **dict.fromkeys([
        "BackendError",
        "BackendNotWritableError",
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
        "MisplacedRecordError",
        "MissingExtraError",
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
    ], ".errors"),
    **dict.fromkeys(["Namespace", "check_key", "page_keys"], ".model.keys"),
    **dict.fromkeys(["FORMAT_VERSION", "Component", "KVSpec", "mha_spec", "mla_spec", "model_spec", "nsa_spec"], ".model.spec"),
    **dict.fromkeys(["DeviceBuffer", "DevicePool", "allocate_engine_like"], ".model.device_pool"),
    "HostPool": ".model.host_pool",
    "SlotAllocator": ".model.slot_allocator",
    "RecordKey": ".model.record_key",
    **dict.fromkeys(["pages_from_token_indices", "torch_backup", "torch_load", "torch_load_layer"], ".transfers.torch_path"),
    **dict.fromkeys(["TransferEngine", "TransferOptions"], ".transfers.engine"),
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from .model.device_pool import DeviceBuffer, DevicePool, allocate_engine_like
    from .errors import (BackendError, BackendNotWritableError, BackendTimeoutError, BackendUnavailableError, ConfigError,
                         CorruptRecordError, ForgedRecordError, MisplacedRecordError, MissingExtraError, DoubleFreeError,
                         ForeignRecordError, ForeignSlotError, IndexValidationError, MetricsServerError,
                         NoHostPoolError, NotARecordError, PageKeyError, PoolError, PoolExhaustedError, RecordError,
                         SpecError, SpecMismatchError, TieredKVError, TruncatedRecordError, UnsealedSlotError)
    from .model.host_pool import HostPool
    from .model.slot_allocator import SlotAllocator
    from .model.record_key import RecordKey
    from .model.keys import Namespace, check_key, page_keys
    from .model.spec import FORMAT_VERSION, Component, KVSpec, mha_spec, mla_spec, model_spec, nsa_spec
    from .transfers.torch_path import pages_from_token_indices, torch_backup, torch_load, torch_load_layer
    from .transfers.engine import TransferEngine, TransferOptions
