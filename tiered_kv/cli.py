"""The ``tiered-kv`` command line.

    tiered-kv plan --model deepseek-v3.2 [--layers N] [--page-size N] [--latent-dtype fp8|bf16]
                   [--gpu-mem SIZE] [--host-mem SIZE] [--disk SIZE] [--json]
    tiered-kv bench storage --backend URL [--pages N] [--batch N] [--json]

Exit codes: 0 success, 2 bad arguments (argparse's convention, also for malformed sizes and
unknown models), 1 a failure while running.
"""

from __future__ import annotations

import argparse
import json
import sys

from .errors import ConfigError, SpecError
from .plan import plan_json, plan_tiers
from .sizes import format_size, parse_size
from .spec import MODEL_PRESETS, model_spec


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="bytes per token and page, and what fits in each tier")
    p.add_argument("--model", default="deepseek-v3.2", choices=sorted(MODEL_PRESETS), help="model preset (default deepseek-v3.2)")
    p.add_argument("--layers", type=_positive_int, default=None, help="layers (default: the model's)")
    p.add_argument("--page-size", type=_positive_int, default=64, help="tokens per page (default 64)")
    p.add_argument("--latent-dtype", choices=["fp8", "bf16"], default="fp8", help="NSA latent dtype (default fp8)")
    p.add_argument("--gpu-mem", type=_size, default=parse_size("64GiB"), metavar="SIZE", help="GPU memory for KV pages (default 64GiB)")
    p.add_argument("--host-mem", type=_size, default=parse_size("512GiB"), metavar="SIZE", help="pinned host pool (default 512GiB)")
    p.add_argument("--disk", type=_size, default=parse_size("4TiB"), metavar="SIZE", help="L3 capacity (default 4TiB)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run_plan)


def _run_plan(args: argparse.Namespace) -> int:
    spec = model_spec(args.model, num_layers=args.layers, page_size=args.page_size, latent_dtype=args.latent_dtype)
    tiers = plan_tiers(spec, gpu_bytes=args.gpu_mem, host_bytes=args.host_mem, disk_bytes=args.disk)
    if args.json:
        print(json.dumps(plan_json(spec, tiers, args.model)))
        return 0
    print(f"model         {args.model}: {spec.describe()}")
    print(f"per token     {spec.bytes_per_token} B")
    print(f"per page      {spec.page_bytes} B ({format_size(spec.page_bytes)}), stored {tiers[1].bytes_per_page} B")
    print()
    print(f"{'tier':<6}{'capacity':>14}{'pages':>14}{'tokens':>16}")
    for t in tiers:
        print(f"{t.name:<6}{format_size(t.capacity_bytes):>14}{t.pages:>14,}{t.tokens(spec.page_size):>16,}")
    return 0


def _add_bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    storage = bench.add_parser("storage", help="put/get throughput of an L3 backend against its medium's ceiling")
    try:
        from . import storage_bench
    except ImportError:  # the benchmark module is optional until it lands
        storage.set_defaults(func=lambda args: (print("storage benchmark not available", file=sys.stderr), 1)[1])
        return
    storage_bench.add_arguments(storage)
    storage.set_defaults(func=storage_bench.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiered-kv", description="A three-tier KV cache for LLM serving engines.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_plan(sub)
    _add_bench(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, SpecError) as exc:
        print(f"tiered-kv: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
