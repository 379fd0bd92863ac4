"""``tiered-kv bench transfer``: L1 <-> L2 page copies through the ``TransferEngine``, in GB/s.

For a model preset (``--model``, ``--layers``, ``--page-size``), ``--pages`` pages in a device pool
shaped as an engine's (``allocate_engine_like``) on the GPU, or on the CPU where there is none, and
a host pool of ``--layout``: the backup of every layer (device -> host), the load of every layer
(host -> device, one event per layer, waited for whole) and the load of one layer alone, through
``--path`` (default ``auto``). Each figure is the median of ``--repeat`` timed runs after
``--warmup`` untimed ones; a run is timed from issue to completion (the handle's ``synchronize``),
so on a GPU it includes the CPU's issue time. GB/s counts payload bytes (no record header).

Every run also checks what it moved: the loaded pages must equal the pages backed up, byte for
byte (``pages_wrong``, which must be 0; the command exits 1 otherwise). For the finer GPU study
(ceilings, every path side by side, CTA sweeps) see ``benchmarks/transfer_gpu.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from ...errors import ConfigError
from ...model.spec import MODEL_PRESETS, KVSpec, model_spec
from ...transfers.policy import PATHS

DEVICES = ("auto", "cpu", "cuda")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli_args import non_negative_int, positive_int

    p.add_argument("--model", default="deepseek-v3.2", choices=sorted(MODEL_PRESETS), help="model preset (default deepseek-v3.2)")
    p.add_argument("--layers", type=positive_int, default=None, help="the model's first N layers (default: all)")
    p.add_argument("--page-size", type=positive_int, default=64, help="tokens per page (default 64)")
    p.add_argument("--pages", type=positive_int, default=32, help="pages moved each way (default 32)")
    p.add_argument("--layout", choices=["page_first", "layer_first"], default="page_first",
                   help="host pool layout (default page_first, what L3 wants)")
    p.add_argument("--path", choices=PATHS, default="auto", help="transfer path (default auto)")
    p.add_argument("--device", choices=DEVICES, default="auto", help="where L1 lives (default: the GPU if there is one)")
    p.add_argument("--repeat", type=positive_int, default=5, help="timed runs, median reported (default 5)")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed runs first (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available (use --device cpu)")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def measure(spec: KVSpec, *, pages: int, layout: str = "page_first", path: str = "auto", device: str = "auto",
            repeat: int = 5, warmup: int = 1) -> dict:
    """Backup of every layer, load of every layer and load of one layer of ``pages`` pages of
    ``spec``; GB/s (medians), the paths ``auto`` chose, and ``pages_wrong`` (loaded pages that
    differ from the pages backed up: must be 0)."""
    from ...model.device_pool import allocate_engine_like
    from ...model.host_pool import HostPool
    from ...transfers.engine import TransferEngine

    where = _device(device)
    # Page 0 stays reserved, as an engine's padding page; sources, then the loads' destinations.
    try:
        device_pool = allocate_engine_like(spec, 2 * pages + 1, where)
    except RuntimeError as exc:  # the allocator's (torch.OutOfMemoryError is one): an impossible size
        raise ConfigError(f"--pages {pages}: a device pool of {2 * pages + 1} pages of {spec.page_bytes:,} B does not fit "
                          f"on {where} ({' '.join(str(exc).split())[:160]})") from None
    src = list(range(1, pages + 1))
    dst = list(range(pages + 1, 2 * pages + 1))
    generator = torch.Generator(device=where).manual_seed(0)
    chunks = [(ci, layer) for ci in range(len(spec.components)) for layer in range(spec.num_layers)]
    for ci, layer in chunks:
        device_pool.chunk_view(ci, layer).random_(0, 256, generator=generator)
    layer_bytes = sum(c.bytes_per_layer for c in spec.components)
    one_layer = spec.num_layers // 2  # a middle layer: neither end of the host slot's payload
    with HostPool(spec, pages, layout) as host_pool:
        engine = TransferEngine(device_pool, host_pool, path=path)
        try:
            slots = host_pool.allocate(pages)
            runs: dict[str, Callable[[], object]] = {
                "backup": lambda: engine.backup(src, slots),
                "load": lambda: engine.load(slots, dst),
                "load_one_layer": lambda: engine.load(slots, dst, layers=[one_layer]),
            }
            seconds: dict[str, list[float]] = {name: [] for name in runs}
            chosen: dict[str, str] = {}
            for index in range(warmup + repeat):
                for name, issue in runs.items():
                    _synchronize(where)
                    start = time.perf_counter()
                    handle = issue()
                    handle.synchronize()
                    elapsed = time.perf_counter() - start
                    chosen[name] = handle.path
                    if index >= warmup:
                        seconds[name].append(elapsed)
            # After the last full load (the one-layer load rewrote only its own layer, with the
            # same bytes): every loaded page must equal its source, component by component.
            engine.load(slots, dst).synchronize()
            wrong = _pages_wrong(device_pool, spec, src, dst)
        finally:
            engine.close()
    moved = {"backup": pages * spec.page_bytes, "load": pages * spec.page_bytes, "load_one_layer": pages * layer_bytes}
    result: dict = {f"{name}_gbps": moved[name] / statistics.median(s) / 1e9 for name, s in seconds.items()}
    result.update({f"{name}_path": chosen[name] for name in runs})
    result.update({
        "device": str(where) if where.type == "cpu" else torch.cuda.get_device_name(where),
        "spec": spec.describe(),
        "fingerprint": spec.fingerprint,
        "pages": pages,
        "page_bytes": spec.page_bytes,
        "layers": spec.num_layers,
        "one_layer": one_layer,
        "layer_bytes": layer_bytes,
        "layout": layout,
        "path": path,
        "repeat": repeat,
        "warmup": warmup,
        "pages_wrong": wrong,
    })
    return result


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pages_wrong(device_pool, spec: KVSpec, src: list[int], dst: list[int]) -> int:
    wrong = torch.zeros(len(src), dtype=torch.bool, device=device_pool.device)
    src_ids = torch.tensor(src, device=device_pool.device)
    dst_ids = torch.tensor(dst, device=device_pool.device)
    for ci in range(len(spec.components)):
        for layer in range(spec.num_layers):
            view = device_pool.chunk_view(ci, layer)
            wrong |= (view[src_ids] != view[dst_ids]).any(dim=1)
    return int(wrong.sum())


def run(args: argparse.Namespace) -> int:
    kind, model_layers, _ = MODEL_PRESETS[args.model]
    if args.layers is not None and args.layers > model_layers:
        raise ConfigError(f"--layers {args.layers}: {args.model} has {model_layers} layers")
    spec = model_spec(args.model, num_layers=None, page_size=args.page_size,
                      layer_range=(0, args.layers) if args.layers else None)
    result = measure(spec, pages=args.pages, layout=args.layout, path=args.path, device=args.device,
                     repeat=args.repeat, warmup=args.warmup)
    result["model"] = args.model
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.model} on {result['device']}: {result['pages']} pages of {result['page_bytes']:,} B "
              f"({result['layers']} layers, {result['layer_bytes']:,} B a layer), host layout {result['layout']}, "
              f"path {result['path']}, median of {result['repeat']}")
        print(f"{'':<22}{'GB/s':>8}   path")
        for name, label in (("backup", "backup (all layers)"), ("load", "load (all layers)"),
                            ("load_one_layer", f"load (layer {result['one_layer']})")):
            print(f"{label:<22}{result[f'{name}_gbps']:>8.2f}   {result[f'{name}_path']}")
        print(f"pages wrong: {result['pages_wrong']}")
    return 0 if result["pages_wrong"] == 0 else 1
