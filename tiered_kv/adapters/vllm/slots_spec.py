"""The LoadStoreSpec that travels from the scheduler to the workers: L2 slot ids and their page keys.

It must stay plain data (vLLM pickles it into the connector's metadata).
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import BlockIDsLoadStoreSpec


class TieredSlotsSpec(BlockIDsLoadStoreSpec):
    """``block_ids`` are L2 slot ids; ``page_keys[i]`` names the page in slot ``block_ids[i]``."""

    def __init__(self, slots: list[int], page_keys: list[str]) -> None:
        super().__init__(slots)
        self.page_keys = list(page_keys)

    @property
    def chunk_ids(self):
        return self.block_ids
