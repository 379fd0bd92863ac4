"""SGLang's real pools on a CPU, and a tiered-kv ``Linker`` built by SGLang's own dynamic loader.

SGLang 0.5.23 imports on a CPU-only torch with a ``torchvision`` import stub; its server arguments
need a model directory, for which a two-layer config (no weights) is enough. Without sglang these
tests skip, unless ``REQUIRE_ENGINE_TESTS`` names sglang: then a missing sglang is an error.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import pytest

#: A torchvision import stub for a CPU-only torch (the real one pulls a CUDA torch).
SGL_STUBS = Path(__file__).resolve().parent.parent / "stubs"
PAGE_MHA = 16
PAGE_DSA = 64  # DSA's indexer keeps one row per 64-token page


def _import_sglang():
    if SGL_STUBS.is_dir() and str(SGL_STUBS) not in sys.path:
        sys.path.append(str(SGL_STUBS))
    required = "sglang" in os.environ.get("REQUIRE_ENGINE_TESTS", "")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its quantisation modules warn that the CPU lacks CUDA
        if required:
            import sglang.srt.server_args as server_args
        else:
            server_args = pytest.importorskip("sglang.srt.server_args")
        from sglang.srt.mem_cache.unified_cache import linker_factory  # noqa: F401
    return server_args


@pytest.fixture(scope="session")
def sglang_args(tmp_path_factory):
    """SGLang's ServerArgs, published as SGLang's scheduler publishes them."""
    server_args = _import_sglang()
    from sglang.srt import runtime_context

    model = tmp_path_factory.mktemp("tiny-llama")
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 64,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
    }))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = server_args.ServerArgs(model_path=str(model), device="cpu", page_size=PAGE_MHA,
                                      skip_server_warmup=True)
        runtime_context.publish(args, role="scheduler")
    return args


def make_kvcache(kind: str, layers: int = 2):
    """SGLang's own device pool of ``kind`` (mha, mla, dsa) on the CPU: ``layers``, 256 tokens."""
    import torch
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool, MLATokenToKVPool

    common = {"size": 256, "layer_num": layers, "device": "cpu", "enable_memory_saver": False}
    makers = {
        "mha": lambda: MHATokenToKVPool(page_size=PAGE_MHA, dtype=torch.bfloat16, head_num=2, head_dim=64, **common),
        "mla": lambda: MLATokenToKVPool(page_size=PAGE_MHA, dtype=torch.bfloat16, kv_lora_rank=128,
                                        qk_rope_head_dim=32, **common),
        "dsa": lambda: DSATokenToKVPool(page_size=PAGE_DSA, dtype=torch.bfloat16, kv_lora_rank=128, qk_rope_head_dim=32,
                                        index_head_dim=128, kv_cache_dim=160, **common),
    }
    return makers[kind]()


@pytest.fixture
def make_linker(sglang_args):
    """``make_linker(kind, **linker_extra_config)``: a Linker over a fresh pool, made by SGLang's
    ``create_unified_cache_linker`` from the config JSON; closed afterwards with every slot free."""
    import torch
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_cache.linker_factory import create_unified_cache_linker

    made = []

    def make(kind: str, *, mtp_draft: bool = False, **extra):
        kvcache = make_kvcache(kind)
        allocator = PagedTokenToKVPoolAllocator(256, kvcache.page_size, torch.bfloat16, "cpu", kvcache, need_sort=False)
        params = CacheInitParams(disable=False, page_size=kvcache.page_size, token_to_kv_pool_allocator=allocator,
                                 req_to_token_pool=ReqToTokenPool(size=4, max_context_len=512, device="cpu",
                                                                  enable_memory_saver=False),
                                 mtp_draft_device_pools=(make_kvcache(kind, layers=1),) if mtp_draft else ())
        config = json.loads(json.dumps({"linker": "Linker", "linker_module_path": "tiered_kv.adapters.sglang.linker",
                                        "linker_extra_config": {"l2_slots": 8, "lookup_wait_s": 10.0, **extra}}))
        linker = create_unified_cache_linker(sglang_args, params, backend="dynamic", config=config,
                                             components={ComponentType.FULL})
        made.append(linker)
        return linker, kvcache

    yield make
    for linker in made:
        linker.close()
        pool = linker.host_pool
        assert pool.free_slots == pool.num_slots, f"{pool.num_slots - pool.free_slots} host slots still held"
