"""``tiered-kv replay``: a workload through the real hierarchy, then a table (or ``--json``).

    tiered-kv replay [--trace FILE [--limit N] [--duration S]]
                     [--clients N --rounds N --system-tokens N --turn-tokens N --answer-tokens N --rate R --seed N]
                     [--model NAME [--page-size N] [--layers N] [--latent-dtype D]]
                     [--gpu-mem SIZE] [--host-mem SIZE] [--disk SIZE]
                     [--config FILE] [--l3 URL] [--simulate] [--inflight N] [--prefetch POLICY] [--write POLICY]
                     [--no-verify] [--json] [--plot FILE.png] [--quiet]
                     [--metrics-port N [--metrics-host ADDR] [--hold-s S]]

With no config (``--config``, else ``$TIERED_KV_CONFIG``) it starts from the embedded default
(``tiered_kv.compose.embedded_config``); the ``TIERED_KV_*`` environment applies over the file or the
embedded default alike (file < environment < flags). ``--model`` switches to that preset's spec:
without a file the tiers are then sized like ``plan`` (64GiB / 512GiB / 4TiB); a file's or the
environment's sizes stay. Only the flags given win over the config. Exit codes: 0 ok (also a run
served through a fault: L3 degraded and back, every request served right), 1 a loaded page was
wrong (``pages_wrong`` > 0), a request not served, L3 still degraded at the end, or the run failed,
2 bad usage or input (a malformed trace line included, and a ``--plot`` path that cannot be
written, refused before the run). Progress: a bar on a terminal,
else a plain line every ``PROGRESS_EVERY_S`` seconds on stderr (a log); none with ``--quiet``.
``--metrics-port`` (or the config's ``metrics`` section) serves the run's Prometheus metrics
(``tiered_kv.ops.metrics``) while it runs and, with ``--hold-s``, that long after the summary is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Any

from ...errors import ConfigError
from ...hierarchy import PrefetchPolicy, WritePolicy
from ..cli_args import (check_latent_dtype, latent_dtype_choices, non_negative_int, positive_float, positive_int,
                        positive_size)
from ...model.spec import MODEL_PRESETS
from ...compose import ReplaySettings, build, embedded_config
from .workload import ChatWorkload, read_trace, synthetic_chat

#: Seconds between the plain progress lines printed where stderr is no terminal (a log, a pipe).
PROGRESS_EVERY_S = 5.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ChatWorkload()
    src = p.add_argument_group("workload (default: synthetic multi-turn chat)")
    src.add_argument("--trace", metavar="FILE", help="a Mooncake-format JSONL request trace instead of the synthetic chat")
    src.add_argument("--limit", type=positive_int, metavar="N", help="only the trace's first N requests")
    src.add_argument("--duration", type=positive_float, metavar="S", help="only the trace's first S seconds")
    src.add_argument("--clients", type=positive_int, default=d.clients, help=f"chat clients (default {d.clients})")
    src.add_argument("--rounds", type=positive_int, default=d.rounds, help=f"turns per client (default {d.rounds})")
    src.add_argument("--system-tokens", type=non_negative_int, default=d.system_tokens,
                     help=f"shared system prompt (default {d.system_tokens})")
    src.add_argument("--turn-tokens", type=non_negative_int, default=d.turn_tokens,
                     help=f"tokens of each user turn (default {d.turn_tokens})")
    src.add_argument("--answer-tokens", type=non_negative_int, default=d.answer_tokens,
                     help=f"tokens of each answer, added to the context (default {d.answer_tokens})")
    src.add_argument("--rate", type=positive_float, default=d.rate, help=f"requests per second, Poisson (default {d.rate})")
    src.add_argument("--seed", type=non_negative_int, default=d.seed, help=f"workload seed (default {d.seed})")
    size = p.add_argument_group("hierarchy (default: the embedded setup; flags win over --config)")
    size.add_argument("--config", metavar="FILE",
                      help="a tiered-kv config file (YAML or TOML; default: $TIERED_KV_CONFIG, else the embedded setup)")
    size.add_argument("--model", choices=sorted(MODEL_PRESETS), help="model preset; tiers sized as 'plan' sizes them")
    size.add_argument("--page-size", type=positive_int, default=None, help="tokens per page (with --model; default 64)")
    size.add_argument("--layers", type=positive_int, default=None, help="the model's first N layers (with --model)")
    size.add_argument("--latent-dtype", choices=latent_dtype_choices(), default=None,
                      help="latent dtype, for models with a latent (with --model; default: fp8 for NSA, bf16 for MLA)")
    size.add_argument("--gpu-mem", type=positive_size, metavar="SIZE", help="L1 capacity (with --model default 64GiB)")
    size.add_argument("--host-mem", type=positive_size, metavar="SIZE", help="L2 capacity (with --model default 512GiB)")
    size.add_argument("--disk", type=positive_size, metavar="SIZE", help="L3 capacity (with --model default 4TiB)")
    size.add_argument("--l3", metavar="URL", help="an L3 backend URL (default: a file:// store in a temporary directory)")
    size.add_argument("--prefetch", choices=[m.value for m in PrefetchPolicy],
                      help="prefetch policy (default: the config's policies.prefetch; without a config "
                           "file wait_complete, the embedded default's)")
    size.add_argument("--write", choices=[m.value for m in WritePolicy],
                      help="write policy (default: the config's policies.write, write_through unless set)")
    run_ = p.add_argument_group("run")
    run_.add_argument("--simulate", action="store_true",
                      help="same index, policies and capacities, no bytes moved and no tier memory reserved")
    run_.add_argument("--worker-process", action="store_true",
                      help="the worker side (L1 and L2 memory, every byte move, the L3 controller) in a child process; "
                           "jobs and results over a pipe")
    run_.add_argument("--inflight", type=positive_int, default=8,
                      help="requests looked up and prefetched together, then run in arrival order (default 8; "
                           "hits per tier do not depend on timing under wait_complete)")
    run_.add_argument("--no-verify", action="store_true", help="skip the oracle fill and the check of loaded pages")
    run_.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    run_.add_argument("--plot", metavar="FILE.png", help="draw the hit rate per tier over time (needs the 'plot' extra)")
    run_.add_argument("--quiet", action="store_true",
                      help=f"no progress (else a bar on a terminal, a line every {PROGRESS_EVERY_S:g} s elsewhere)")
    met = p.add_argument_group("metrics (default: the config's metrics section, else off)")
    met.add_argument("--metrics-port", type=non_negative_int, metavar="N",
                     help="serve Prometheus metrics on this port (0: any free port, printed on stderr)")
    met.add_argument("--metrics-host", metavar="ADDR", help="address to serve them on (default 127.0.0.1)")
    met.add_argument("--hold-s", type=positive_float, metavar="S",
                     help="keep serving metrics S seconds after the run, so a scraper reads the final values")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """For a command line without the shared ``common`` parent."""
    p = subparsers.add_parser("replay", help="replay a chat workload or a trace through the hierarchy")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def config_path(args: argparse.Namespace) -> str | None:
    """The config file of a run: ``--config``, else ``$TIERED_KV_CONFIG`` (as ``config show`` and
    ``load_config`` read it), else None: the embedded default."""
    return args.config or os.environ.get("TIERED_KV_CONFIG") or None


def run_config(args: argparse.Namespace) -> Any:
    """The run's ``Config``: the file (else the embedded default, ``setup.embedded_config``), the
    ``TIERED_KV_*`` environment over it, and ``--model`` / ``--layers`` / ``--page-size`` as explicit
    values over both (one precedence rule: ``tiered_kv.config.load_config``). ``--model`` names
    another spec: without a file the tiers then take the models' defaults (64GiB / 512GiB / 4TiB,
    as ``plan`` sizes them); a file's or the environment's sizes stay, counted in pages of it."""
    from ...config import load_config

    path = config_path(args)
    overrides: dict[str, Any] = {}
    defaults = embedded_config() if path is None else None  # --model drops its spec and sizes (load_config)
    if args.model is not None:
        model_layers = MODEL_PRESETS[args.model][1]
        if args.layers is not None and args.layers > model_layers:  # as plan refuses it, naming the flag
            raise ConfigError(f"--layers {args.layers}: {args.model} has {model_layers} layers")
        check_latent_dtype(args.model, args.latent_dtype)
        # The preset replaces the spec; of the file's spec only the page size is not the model's.
        overrides["spec"] = {"model": args.model, "kind": None, "layers": args.layers, "layer_range": None,
                             "latent_dtype": args.latent_dtype, "num_kv_heads": None, "head_dim": None, "name": None}
        if args.page_size is not None:
            overrides["spec"]["page_size"] = args.page_size
    elif args.page_size is not None or args.layers is not None or args.latent_dtype is not None:
        raise ConfigError("--page-size, --layers and --latent-dtype shape a --model preset; give --model too")
    return load_config(path, overrides, defaults=defaults)


def settings_from_args(args: argparse.Namespace, config: Any = None) -> ReplaySettings:
    """The settings the arguments describe: ``run_config`` (file or embedded default, environment,
    ``--model``), then the sizing and policy flags, which win: only the flags given."""
    from ...config import to_replay_settings

    settings = to_replay_settings(config if config is not None else run_config(args))
    sizes: dict[str, Any] = {"gpu_bytes": args.gpu_mem, "host_bytes": args.host_mem, "disk_bytes": args.disk}
    if any(v is not None for v in sizes.values()):
        settings = settings.with_sizes(**sizes)
    policies = settings.policies
    if args.prefetch is not None:
        policies = dataclasses.replace(policies, prefetch=PrefetchPolicy(args.prefetch))
    if args.write is not None:
        policies = dataclasses.replace(policies, write=WritePolicy(args.write))
    changes: dict[str, Any] = {"policies": policies, "simulate": bool(args.simulate),
                               "worker_process": bool(args.worker_process)}
    if args.l3 is not None:
        changes["l3_url"] = args.l3
    if args.no_verify or args.simulate:
        changes["verify"] = False
    if args.simulate and args.l3 is None:
        changes["l3_url"] = None
    return dataclasses.replace(settings, **changes)


def workload_from_args(args: argparse.Namespace) -> list:
    if args.trace is None:
        if args.limit is not None or args.duration is not None:
            raise ConfigError("--limit and --duration slice a --trace; give --trace too")
        return synthetic_chat(ChatWorkload(clients=args.clients, rounds=args.rounds, system_tokens=args.system_tokens,
                                           turn_tokens=args.turn_tokens, answer_tokens=args.answer_tokens,
                                           rate=args.rate, seed=args.seed))
    return read_trace(args.trace, limit=args.limit, duration_s=args.duration)


def _progress_bar(total: int, quiet: bool, page_size: int) -> tuple[Any, Any]:
    """(a bar to close or None, the driver's per-request callback or None)."""
    if quiet:
        return None, None
    if not sys.stderr.isatty():
        return None, _progress_lines(total)
    from tqdm import tqdm

    bar = tqdm(total=total, unit="req", file=sys.stderr, dynamic_ncols=True, leave=False)
    hits = {"in": 0, "hit": 0}

    def step(result) -> None:
        hits["in"] += result.input_tokens
        hits["hit"] += (result.l1_pages + result.l2_pages + result.l3_pages) * page_size
        bar.update(1)
        if hits["in"]:
            bar.set_postfix(hit=f"{hits['hit'] / hits['in']:.1%}", refresh=False)
    return bar, step


def _progress_lines(total: int) -> Any:
    """The callback that prints ``replay: 40/120 requests, 12.3 s`` at most every
    ``PROGRESS_EVERY_S`` seconds: a bar's redraws would fill a log with carriage returns."""
    start = time.monotonic()
    state = {"done": 0, "printed": start}

    def step(result) -> None:
        state["done"] += 1
        now = time.monotonic()
        if now - state["printed"] >= PROGRESS_EVERY_S:
            state["printed"] = now
            print(f"replay: {state['done']}/{total} requests, {now - start:.1f} s", file=sys.stderr, flush=True)
    return step


def run(args: argparse.Namespace) -> int:
    from .report import check_plot_target

    if args.plot:
        check_plot_target(args.plot)  # a missing extra or an unwritable path: before the run, not after it

    from .driver import replay
    from .report import format_table, plot, summarize, to_json

    config = run_config(args)
    settings = settings_from_args(args, config)
    requests = workload_from_args(args)
    address = metrics_address(args, config)
    h = build(settings)
    server = bar = None
    try:
        try:
            if address is not None:
                server = _serve(h, address)
            # After the build: the progress clock counts the requests' time, not the tiers' allocation.
            bar, step = _progress_bar(len(requests), args.quiet, settings.spec.page_size)
            result = replay(h, requests, inflight=args.inflight, progress=step)
        finally:
            if bar is not None:
                bar.close()
            h.close()
        summary = summarize(result, workload=("trace " + args.trace) if args.trace else "synthetic chat",
                            l3=("simulated" if settings.simulate else (settings.l3_url or "file:// (temporary directory)")))
        print(to_json(summary) if args.json else format_table(summary), flush=True)
        if args.plot:
            plot(result, args.plot)
        if server is not None and args.hold_s:
            time.sleep(args.hold_s)  # the closed hierarchy's counters stay readable: the final values
    finally:
        if server is not None:
            server.close()
        h.release_memory()
    return exit_code(summary)


def metrics_address(args: argparse.Namespace, config: Any = None) -> tuple[str, int] | None:
    """Where to serve metrics: the flags, else the run's ``metrics`` section (file, environment),
    else None."""
    from ..metrics import DEFAULT_HOST, check_address

    host, port = args.metrics_host, args.metrics_port
    if port is None:
        section = (config if config is not None else run_config(args)).metrics
        if section.enabled:
            host, port = host or section.host, section.port
    if port is None:
        if host is not None or args.hold_s is not None:
            raise ConfigError("--metrics-host and --hold-s go with --metrics-port (or metrics.enabled in --config "
                              "or TIERED_KV_METRICS__ENABLED)")
        return None
    return check_address(host or DEFAULT_HOST, port)


def _serve(h: Any, address: tuple[str, int]) -> Any:
    from ..metrics import cache_registry, serve_metrics

    server = serve_metrics(cache_registry(l1=h.l1), *address)
    print(f"metrics on {server.url}", file=sys.stderr, flush=True)
    return server


def exit_code(summary: dict[str, Any]) -> int:
    """1 when the run failed: a loaded page was wrong (a tier returned bytes that are not the
    page's), a request was not served, or L3 was still degraded at the end (its backend failed
    and did not come back); 0 for a clean run and for one served through a fault (L3 degraded
    and back, every request served right: ``outcome``, ``faults`` in the summary)."""
    from .report import FAILED, outcome

    return 1 if outcome(summary) == FAILED else 0


__all__ = ["add_arguments", "exit_code", "metrics_address", "add_parser", "run", "run_config", "settings_from_args",
           "workload_from_args"]
