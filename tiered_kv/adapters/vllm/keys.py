"""vLLM offload keys (block hash + group index, bytes) -> tiered-kv page keys (32 hex characters).

A page key is a digest of the namespace's root and vLLM's key, so two models, two page layouts or two
salts never share a page. It must never depend on anything a process picks at random: another engine
process on the same L3 derives the same keys.
"""

from __future__ import annotations

import hashlib

from tiered_kv.model.keys import KEY_DIGEST_BYTES, Namespace



def page_key(namespace: Namespace, offload_key: bytes) -> str:
    """The tiered-kv page key of one vLLM offload key under ``namespace``."""
    return namespace.engine_key(bytes(offload_key))


def layout_fingerprint(*, tokens_per_block: int, bytes_per_block: int, dtype: str, layout: str | None) -> str:
    """What the scheduler knows of a page's bytes: pages that differ in any of these never mix."""
    text = f"vllm-offload/tokens={tokens_per_block}/bytes={bytes_per_block}/dtype={dtype}/layout={layout}"
    return hashlib.blake2b(text.encode(), digest_size=KEY_DIGEST_BYTES).hexdigest()
