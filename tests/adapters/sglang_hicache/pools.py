"""SGLang's real HiCache host pools on a CPU, and the tiered-kv backend attached as SGLang attaches it.

Used by the tests and by the writer process they spawn, so it is a plain module (no fixtures).
SGLang 0.5.23 imports on a CPU-only torch with the ``torchvision`` stub of ``tests/adapters/stubs``;
its server arguments need a model directory, for which a two-layer config is enough. Host pools are
built by SGLang's own assembler; its host layout comes from the published server arguments, which
``host_layout`` overrides while a pool is built.
"""

from __future__ import annotations

import json
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

STUBS = Path(__file__).resolve().parent.parent / "stubs"
PAGE = {"mha": 16, "mla": 16, "dsa": 64}  # DSA's indexer keeps one row per 64-token page
#: The host layouts SGLang 0.5.23 builds for each pool kind (memory_pool_host / pool_host).
LAYOUTS = {
    "mha": ("layer_first", "page_first", "page_first_direct", "page_head"),
    "mla": ("layer_first", "page_first", "page_first_direct"),
    "dsa": ("layer_first", "page_first", "page_first_direct"),
}
MODULE = "tiered_kv.adapters.sglang.hicache"


def import_sglang() -> None:
    if str(STUBS) not in sys.path:
        sys.path.append(str(STUBS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its quantisation modules warn that the CPU lacks CUDA
        import sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler
        import sglang.srt.mem_cache.storage.backend_factory  # noqa: F401


def publish_args(model_dir: Path) -> Any:
    """SGLang's ServerArgs for a two-layer model config in ``model_dir``, published as its scheduler does."""
    import_sglang()
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    (model_dir / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 64,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
    }))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = ServerArgs(model_path=str(model_dir), device="cpu", page_size=PAGE["mha"], skip_server_warmup=True)
        runtime_context.publish(args, role="scheduler")
    return args


@contextmanager
def host_layout(layout: str):
    """SGLang's memory settings with ``--hicache-mem-layout layout`` while host pools are built, and
    its CUDA host registration (pinning) a no-op on this CPU."""
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as assembler
    from sglang.srt.mem_cache.pool_host import common

    published = assembler.get_memory

    class Memory:
        hicache_mem_layout = layout
        hicache_ratio = 2.0
        hicache_size = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(published(), name)

    register = common._cuda_host_register
    assembler.get_memory, common._cuda_host_register = Memory, lambda *args, **kwargs: None
    try:
        yield
    finally:
        assembler.get_memory, common._cuda_host_register = published, register


def host_pools(kind: str, layout: str) -> dict[str, Any]:
    """SGLang's device pool of ``kind`` (mha, mla, dsa; 2 layers, 256 tokens) and the host pools its
    assembler builds for it in ``layout``: ``{"kv": ..., "indexer": ...}`` (the indexer for DSA)."""
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as assembler
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool, MLATokenToKVPool

    common = {"size": 256, "layer_num": 2, "device": "cpu", "enable_memory_saver": False, "page_size": PAGE[kind]}
    with warnings.catch_warnings(), host_layout(layout):
        warnings.simplefilter("ignore")
        if kind == "mha":
            device = MHATokenToKVPool(dtype=torch.bfloat16, head_num=2, head_dim=64, **common)
            return {"kv": assembler.build_kv_host_pool(kv_pool=device, page_size=PAGE[kind])}
        if kind == "mla":
            device = MLATokenToKVPool(dtype=torch.bfloat16, kv_lora_rank=128, qk_rope_head_dim=32, **common)
            return {"kv": assembler.build_kv_host_pool(kv_pool=device, page_size=PAGE[kind])}
        device = DSATokenToKVPool(dtype=torch.bfloat16, kv_lora_rank=128, qk_rope_head_dim=32, index_head_dim=128,
                                  kv_cache_dim=160, **common)
        config = assembler.prepare_host_pool_config(decls=device.host_pool_decls(), full_layer_mapping={0: 0, 1: 1},
                                                    transfer_layer_id_max=2, transfer_page_size=PAGE[kind],
                                                    packed_draft_device_pools=())
        group = assembler.build_host_pool_group(config=config)
        return {"kv": group.get_pool(PoolName.KV), "indexer": group.get_pool(PoolName.INDEXER)}


def storage_config(kind: str, url: str, **options: Any) -> Any:
    """SGLang's HiCacheStorageConfig for one TP rank, with our backend in its dynamic extra config."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    extra = {"backend_name": "tiered_kv", "module_path": MODULE, "class_name": "HiCacheBackend",
             "interface_v1": 1, "url": url, **options}
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                is_mla_model=kind != "mha", enable_storage_metrics=False, is_page_first_layout=False,
                                model_name="tiny-llama", extra_config=json.loads(json.dumps(extra)))


def attach(pools: dict[str, Any], config: Any) -> Any:
    """The backend as SGLang's cache controller attaches it: built by the storage backend factory
    (``dynamic``), the anchor pool registered, then every pool of the group by name, then the end
    of the registration burst."""
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    backend = StorageBackendFactory.create_backend("dynamic", config, pools["kv"])
    try:
        backend.register_mem_pool_host(pools["kv"])
        for name, host in pools.items():
            backend.register_mem_host_pool_v2(host, PoolName(name))
        backend.on_host_pools_registered()
    except BaseException:
        backend.close()
        raise
    return backend


def buffers(pools: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {name: host.kv_buffer if name == "kv" else host.index_k_with_scale_buffer for name, host in pools.items()}


def fill(pools: dict[str, Any], seed: int) -> None:
    """Random bytes in every host pool (every page)."""
    gen = torch.Generator().manual_seed(seed)
    for buffer in buffers(pools).values():
        raw = buffer.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))


def wipe(pools: dict[str, Any]) -> None:
    for buffer in buffers(pools).values():
        buffer.view(torch.uint8).zero_()


def page_bytes(pools: dict[str, Any], page: int) -> dict[str, torch.Tensor]:
    """SGLang's own view of host ``page`` in each pool (``get_data_page``), as bytes (bf16 NaNs
    would make an equal page compare unequal)."""
    return {name: host.get_data_page(page * host.page_size).contiguous().view(torch.uint8).clone()
            for name, host in pools.items()}


def host_indices(pages: list[int], page_size: int) -> torch.Tensor:
    return torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in pages]).to(torch.int64)


def page_hashes(count: int, page_size: int, salt: int = 0) -> list[str]:
    """SGLang's own chained page hashes of a prompt of ``count`` pages."""
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    tokens = [(salt * 7919 + i) % 50000 for i in range(count * page_size)]
    return get_storage_hash_str(tokens, None, page_size=page_size)


def sglang_set(backend: Any, pools: dict[str, Any], keys: list[str], pages: list[int]) -> bool:
    """SGLang's backup of ``pages``: the indexer (a KV-derived sidecar) first, then the KV."""
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    indices = host_indices(pages, pools["kv"].page_size)
    ok = True
    if "indexer" in pools:
        result = backend.batch_set_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=indices, keys=list(keys))])
        ok = all(result[PoolName.INDEXER])
    return all(backend.batch_set_v1(list(keys), indices)) and ok


def sglang_get(backend: Any, pools: dict[str, Any], keys: list[str], pages: list[int]) -> int:
    """SGLang's prefetch of ``pages``: the KV, then the KV-derived indexer; the smaller hit counts."""
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer, count_pool_hits

    indices = host_indices(pages, pools["kv"].page_size)
    kv = backend.batch_get_v1(list(keys), indices)
    kv_hits = kv.index(False) if False in kv else len(kv)
    hits = [kv_hits]
    if "indexer" in pools:
        result = backend.batch_get_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=indices, keys=list(keys))])
        hits += count_pool_hits(result).values()
    return min(hits)


def sglang_exists(backend: Any, pools: dict[str, Any], keys: list[str]) -> int:
    """SGLang's existence query: ``batch_exists_v2`` with the indexer's transfer where there is one;
    asserts it agrees with ``batch_exists`` and with the indexer's own count."""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    plain = backend.batch_exists(list(keys))
    if "indexer" not in pools:
        return plain
    result = backend.batch_exists_v2(list(keys), [PoolTransfer(name=PoolName.INDEXER, keys=list(keys),
                                                               hit_policy=PoolHitPolicy.ALL_PAGES)])
    assert result.kv_hit_pages == plain == result.extra_pool_hit_pages[PoolName.INDEXER], (plain, result)
    return plain


def write_in_process(model_dir: str, url: str, kind: str, layout: str, pages: list[int], salt: int, out: Any) -> None:
    """A second SGLang-style process: its own pools filled from ``salt``, ``pages`` written to ``url``
    under SGLang's hashes of prompt ``salt``; puts ``(ok, {page: {pool: bytes}})`` on ``out``."""
    publish_args(Path(model_dir))
    pools = host_pools(kind, layout)
    fill(pools, salt)
    backend = attach(pools, storage_config(kind, url))
    try:
        ok = sglang_set(backend, pools, page_hashes(len(pages), PAGE[kind], salt), pages)
    finally:
        backend.close()
    out.put((ok, {page: {name: bytes(raw.numpy()) for name, raw in page_bytes(pools, page).items()} for page in pages}))
