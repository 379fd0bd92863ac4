"""Throughput of the tiered-kv HiCache backend against the bare tiered-kv backend, on the same pages.

``ours``: SGLang's own host pools (MHA, DSA with its indexer) and ``HiCacheBackend`` built by SGLang's
storage factory, driven as SGLang's cache controller drives it: a backup (``batch_set_v2`` of the
indexer, then ``batch_set_v1``) and a prefetch (``batch_get_v1``, then ``batch_get_v2``), each of
``--pages`` pages; where the layout lets pages move in place (``page_first_direct``), once in place
and once with ``"in_place": false`` (through a staging slot), to show what the copy costs. ``bare``:
the same L3 backend opened on a tiered-kv ``page_first`` HostPool holding the same records: seal +
``put_from``, and ``get_into`` (verified). Fresh page keys every repeat (a put of a present key is
skipped). Prints one JSON object (``--out FILE`` writes it there too): per (kind, host layout, L3,
in place or staged), median pages/s and GB/s of set and get over ``--repeats`` runs.

Runs on a CPU: SGLang 0.5.23 imports with the ``torchvision`` stub of ``tests/adapters/stubs``.
Usage: ``python benchmarks/sglang_hicache.py [--pages 64] [--repeats 5] [--l3 memory file redis]
[--redis-url redis://127.0.0.1:6379/0]`` (``redis`` needs a server; its keys are left to expire with
the server's own policy, so give it a scratch database).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
#: Per kind: the device pool's arguments (bf16), its page size and the host layouts measured.
KINDS = {
    "mha": ({"head_num": 8, "head_dim": 128}, 16, ("layer_first", "page_first", "page_first_direct")),
    "dsa": ({"kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_head_dim": 128, "kv_cache_dim": 576}, 64,
            ("layer_first", "page_first", "page_first_direct")),
}


def setup_sglang(layers: int) -> None:
    """Import SGLang with the torchvision stub and publish server arguments for a model of ``layers``."""
    sys.path.append(str(ROOT / "tests" / "adapters" / "stubs"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt import runtime_context
        from sglang.srt.server_args import ServerArgs

        model = Path(tempfile.mkdtemp(prefix="tkv-bench-model-"))
        (model / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 64,
            "intermediate_size": 64, "num_hidden_layers": layers, "num_attention_heads": 2, "num_key_value_heads": 2}))
        runtime_context.publish(ServerArgs(model_path=str(model), device="cpu", page_size=16, skip_server_warmup=True),
                                role="scheduler")


def host_pools(kind: str, layout: str, layers: int, pages: int) -> dict[str, Any]:
    """SGLang's host pools of ``kind`` in ``layout`` holding at least ``pages`` pages."""
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as assembler
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host import common

    dims, page_size, _ = KINDS[kind]
    published, register = assembler.get_memory, common._cuda_host_register

    class Memory:  # --hicache-mem-layout for this pool; ratio 2: the host holds twice the device's tokens
        hicache_mem_layout, hicache_ratio, hicache_size = layout, 2.0, 0

        def __getattr__(self, name: str) -> Any:
            return getattr(published(), name)

    args = {"size": pages * page_size, "page_size": page_size, "layer_num": layers, "device": "cpu",
            "enable_memory_saver": False, "dtype": torch.bfloat16, **dims}
    assembler.get_memory, common._cuda_host_register = Memory, lambda *a, **k: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if kind == "mha":
                return {"kv": assembler.build_kv_host_pool(kv_pool=MHATokenToKVPool(**args), page_size=page_size)}
            device = DSATokenToKVPool(**args)
            config = assembler.prepare_host_pool_config(
                decls=device.host_pool_decls(), full_layer_mapping={i: i for i in range(layers)},
                transfer_layer_id_max=layers, transfer_page_size=page_size, packed_draft_device_pools=())
            group = assembler.build_host_pool_group(config=config)
            return {"kv": group.get_pool(PoolName.KV), "indexer": group.get_pool(PoolName.INDEXER)}
    finally:
        assembler.get_memory, common._cuda_host_register = published, register


def attach(kind: str, pools: dict[str, Any], url: str, in_place: bool) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolName
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    extra = {"backend_name": "tiered_kv", "module_path": "tiered_kv.adapters.sglang.hicache",
             "class_name": "HiCacheBackend", "interface_v1": 1, "url": url, "in_place": in_place}
    config = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                  is_mla_model=kind != "mha", enable_storage_metrics=False, is_page_first_layout=False,
                                  model_name="bench", extra_config=extra)
    backend = StorageBackendFactory.create_backend("dynamic", config, pools["kv"])
    backend.register_mem_pool_host(pools["kv"])
    for name, host in pools.items():
        backend.register_mem_host_pool_v2(host, PoolName(name))
    backend.on_host_pools_registered()
    return backend


def fill(pools: dict[str, Any]) -> None:
    for name, host in pools.items():
        raw = (host.kv_buffer if name == "kv" else host.index_k_with_scale_buffer).view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8))


def ours(kind: str, pools: dict[str, Any], backend: Any, pages: int, run: int) -> tuple[float, float]:
    """Seconds of one SGLang backup and one prefetch of ``pages`` pages."""
    import secrets

    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    page_size = pools["kv"].page_size
    tag = secrets.token_hex(4)  # fresh keys on a medium that outlives the run (Redis)
    keys = [f"bench-{kind}-{tag}-{run}-{i}" for i in range(pages)]
    indices = torch.arange(page_size, (pages + 1) * page_size)  # host page 0 is a page like any other here
    started = time.perf_counter()
    if "indexer" in pools:
        backend.batch_set_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=indices, keys=keys)])
    assert all(backend.batch_set_v1(keys, indices))
    stored = time.perf_counter()
    assert all(backend.batch_get_v1(keys, indices))
    if "indexer" in pools:
        result = backend.batch_get_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=indices, keys=keys)])
        assert all(result[PoolName.INDEXER])
    return stored - started, time.perf_counter() - stored


def bare(spec: Any, url: str, pages: int, runs: int) -> list[tuple[float, float]]:
    """Seconds of seal + ``put_from`` and of ``get_into`` of ``pages`` records, per run, on the bare backend."""
    import secrets

    from tiered_kv.backends import open_backend
    from tiered_kv.model.host_pool import HostPool

    async def measure() -> list[tuple[float, float]]:
        with HostPool(spec, num_slots=pages, pin=False) as pool:
            slots = pool.allocate(pages)
            pool.buffer.copy_(torch.randint(0, 256, pool.buffer.shape, dtype=torch.uint8))
            times = []
            async with open_backend(url, pool) as backend:
                tag = secrets.token_hex(4)
                for run in range(runs):
                    keys = [f"bare-{spec.fingerprint[:8]}-{tag}-{run}-{i}" for i in range(pages)]
                    started = time.perf_counter()
                    for slot, key in zip(slots, keys):
                        pool.seal(slot, key)
                    assert all(await backend.put_from(keys, slots))
                    stored = time.perf_counter()
                    assert all(await backend.get_into(keys, slots))
                    times.append((stored - started, time.perf_counter() - stored))
            pool.free(slots)
            return times

    return asyncio.run(measure())


def rates(seconds: list[float], pages: int, page_bytes: int) -> dict[str, float]:
    median = statistics.median(seconds)
    return {"pages_per_s": round(pages / median, 1), "GB_per_s": round(pages * page_bytes / median / 1e9, 3),
            "median_s": round(median, 5)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=64, help="pages per set / get (default 64)")
    parser.add_argument("--layers", type=int, default=8, help="model layers (default 8)")
    parser.add_argument("--repeats", type=int, default=5, help="runs; the median counts (default 5)")
    parser.add_argument("--l3", nargs="+", default=["memory", "file"], choices=["memory", "file", "redis"])
    parser.add_argument("--redis-url", help="the Redis of --l3 redis (a scratch database)")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    if "redis" in args.l3 and not args.redis_url:
        parser.error("--l3 redis needs --redis-url")
    setup_sglang(args.layers)
    results = []
    with tempfile.TemporaryDirectory(prefix="tkv-bench-l3-") as directory:
        def url_of(l3: str, name: str) -> str:
            return {"memory": "memory://", "file": f"file://{directory}/{name}", "redis": args.redis_url}[l3]

        for kind in args.kinds:
            for layout in KINDS[kind][2]:
                for l3 in args.l3:
                    pools = host_pools(kind, layout, args.layers, args.pages + 1)
                    fill(pools)
                    bare_times = None
                    for in_place in (True, False):
                        if not in_place and not results[-1]["in_place"]:
                            break  # this layout stages either way: measured once
                        backend = attach(kind, pools, url_of(l3, f"{kind}-{layout}-{in_place}"), in_place)
                        try:
                            spec, layouts = backend.spec, backend.layouts()
                            moved_in_place = layouts["kv"]["in_place"]
                            timed = [ours(kind, pools, backend, args.pages, run) for run in range(args.repeats)]
                        finally:
                            backend.close()
                        if bare_times is None:
                            bare_times = bare(spec, url_of(l3, f"bare-{kind}-{layout}"), args.pages, args.repeats)
                        results.append({
                            "kind": kind, "layout": layout, "l3": l3, "page_bytes": spec.page_bytes,
                            "contiguous": {name: v["contiguous"] for name, v in layouts.items()},
                            "in_place": moved_in_place,
                            "ours": {"set": rates([t[0] for t in timed], args.pages, spec.page_bytes),
                                     "get": rates([t[1] for t in timed], args.pages, spec.page_bytes)},
                            "bare": {"set": rates([t[0] for t in bare_times], args.pages, spec.page_bytes),
                                     "get": rates([t[1] for t in bare_times], args.pages, spec.page_bytes)},
                        })
    report = {"benchmark": "sglang_hicache", "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
              "command": "python benchmarks/sglang_hicache.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "pages": args.pages, "layers": args.layers, "repeats": args.repeats, "results": results}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
