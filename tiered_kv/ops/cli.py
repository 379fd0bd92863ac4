"""The ``tiered-kv`` command line.

    tiered-kv [--debug] [--version]
    tiered-kv plan --model deepseek-v3.2 [--layers N | --layer-range START:END] [--page-size N]
                   [--latent-dtype fp8|bf16] [--gpu-mem SIZE] [--host-mem SIZE] [--disk SIZE] [--json]
                   [--prefill-tokens-per-s RATE [--host-gbps GBPS] [--disk-gbps GBPS]]
    tiered-kv bench storage --backend URL [--pages N] [--batch N] [--json]
    tiered-kv bench transfer [--model M] [--layers N] [--pages N] [--layout L] [--path P] [--device D] [--json]
    tiered-kv inspect URL [--verify] [--json]
    tiered-kv config check FILE | config show [FILE] [--json]

Subcommands are listed in ``COMMANDS`` (name -> ``Command``: its line in the help and a function
that adds its arguments to its parser and sets ``func``, a function of the parsed arguments
returning the exit code). A new command is one entry there and one small function or module; it
raises the library's errors and leaves exit codes and messages to ``main``.

Only the command that runs has its module imported (``main`` builds the other commands' parsers
bare, from their help line): ``--version``, ``plan``, ``config`` and ``inspect`` load no torch, and
this module imports nothing heavy at the top, so an interrupt while a command's modules load is
caught by ``main`` like any other.

Exit codes: 0 success; 2 bad usage (argparse's convention) and bad argument values (the library's
``ConfigError`` / ``SpecError``: malformed sizes, impossible plans, bad URLs); 1 a failure while
running (backend unreachable, store too small: any other library error), and also an unexpected
exception, which is a bug; 130 interrupted (SIGINT), 143 terminated (SIGTERM). Both signals unwind
the command as an exception, so its cleanup runs (a replay's temporary L3 directory is removed),
and leave one line. ``tiered-kv`` with no command prints the help on stderr and exits 2, as any
other incomplete command line does. Errors are one line on stderr, ``tiered-kv: error: ...``;
``--debug`` (before or after the subcommand) adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from .. import __version__
from .cli_args import check_latent_dtype, latent_dtype_choices, positive_float, positive_int, positive_size
from ..errors import ConfigError, SpecError, TieredKVError
from ..model.sizes import format_size, parse_size


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that the command unwinds and cleans up as it does on
    Ctrl-C. A BaseException, like KeyboardInterrupt, so no ``except Exception`` swallows it."""


#: Exit code per error class, looked up along the exception's MRO (the most specific class wins):
#: wrong argument values are usage errors, every other library error a runtime failure.
EXIT_CODES: dict[type[BaseException], int] = {
    ConfigError: 2,
    SpecError: 2,
    TieredKVError: 1,
    KeyboardInterrupt: 130,
    Terminated: 128 + signal.SIGTERM,
}
BUG_EXIT_CODE = 1
#: The one line a signal leaves on stderr.
SIGNAL_MESSAGES: dict[type[BaseException], str] = {KeyboardInterrupt: "interrupted", Terminated: "terminated"}

#: argparse's "argument --flag: must be > 0, got -3" reads "--flag must be > 0, got -3".
_FLAG_MUST_BE = re.compile(r"^argument (\S+): (must be )")
#: Values that start with a dash and a digit are values (``--gpu-mem -3GiB``), not options; argparse
#: itself takes only plain numbers for values and calls ``-3GiB`` a missing argument.
_DASH_DIGIT = re.compile(r"^-\.?\d")


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with usage errors on one line like every other error (subparsers inherit it)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _DASH_DIGIT  # argparse's own hook (no option looks like -3)

    def error(self, message: str):  # type: ignore[override]
        message = _FLAG_MUST_BE.sub(r"\1 \2", " ".join(message.split()))
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


# --- argument types: tiered_kv.ops.cli_args (shared with the subcommand modules) ---------------------


def layer_range(text: str) -> tuple[int, int]:
    """``START:END``, end exclusive (``0:30`` is the first 30 layers)."""
    start, sep, end = text.partition(":")
    try:
        bounds = (int(start), int(end)) if sep else None
    except ValueError:
        bounds = None
    if bounds is None or not 0 <= bounds[0] < bounds[1]:
        raise argparse.ArgumentTypeError(f"expected START:END with 0 <= START < END, got {text!r}")
    return bounds


# --- plan ----------------------------------------------------------------------------------------

def plan_arguments(p: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    from ..model.spec import MODEL_PRESETS

    p.add_argument("--model", default="deepseek-v3.2", choices=sorted(MODEL_PRESETS), help="model preset (default deepseek-v3.2)")
    layers = p.add_mutually_exclusive_group()
    layers.add_argument("--layers", type=positive_int, default=None, help="the model's first N layers (default: all)")
    layers.add_argument("--layer-range", type=layer_range, default=None, metavar="START:END",
                        help="the layers this cache holds, end exclusive (a pipeline stage)")
    p.add_argument("--page-size", type=positive_int, default=64, help="tokens per page (default 64)")
    p.add_argument("--latent-dtype", choices=latent_dtype_choices(), default=None,
                   help="latent dtype, for models with a latent (default: fp8 for NSA, bf16 for MLA)")
    p.add_argument("--gpu-mem", type=positive_size, default=parse_size("64GiB"), metavar="SIZE",
                   help="GPU memory for KV pages (default 64GiB)")
    p.add_argument("--host-mem", type=positive_size, default=parse_size("512GiB"), metavar="SIZE", help="pinned host pool (default 512GiB)")
    p.add_argument("--disk", type=positive_size, default=parse_size("4TiB"), metavar="SIZE", help="L3 capacity (default 4TiB)")
    p.add_argument("--trace", metavar="FILE", default=None,
                   help="also replay this Mooncake-format trace with --simulate at these sizes: hit rate per tier")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N", help="with --trace: its first N requests")
    p.add_argument("--prefill-tokens-per-s", type=positive_float, default=None, metavar="RATE",
                   help="the model's measured prefill rate on this machine: print the read bandwidth above which a "
                        "tier's hit beats recomputing it")
    p.add_argument("--host-gbps", type=positive_float, default=None, metavar="GBPS",
                   help="with --prefill-tokens-per-s: the measured L2 -> GPU bandwidth (GB/s)")
    p.add_argument("--disk-gbps", type=positive_float, default=None, metavar="GBPS",
                   help="with --prefill-tokens-per-s: the measured L3 read bandwidth (GB/s)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_plan)


def _plan_spec(args: argparse.Namespace):
    """The spec the arguments describe; ConfigError naming the argument for impossible ones."""
    from ..model.spec import MODEL_PRESETS, model_spec

    model_layers = MODEL_PRESETS[args.model][1]
    check_latent_dtype(args.model, args.latent_dtype)
    if args.layers is not None and args.layers > model_layers:
        raise ConfigError(f"--layers {args.layers}: {args.model} has {model_layers} layers")
    bounds = args.layer_range or (0, args.layers or model_layers)
    if bounds[1] > model_layers:
        raise ConfigError(f"--layer-range {bounds[0]}:{bounds[1]}: {args.model} has layers 0..{model_layers - 1}"
                          f" (END is exclusive, at most {model_layers})")
    return model_spec(args.model, page_size=args.page_size, latent_dtype=args.latent_dtype, layer_range=bounds)


_TIER_ARGUMENT = {"gpu": "--gpu-mem", "host": "--host-mem", "disk": "--disk"}


def run_plan(args: argparse.Namespace) -> int:
    from .plan import crossovers, describe_page_sizes, plan_json, plan_tiers

    spec = _plan_spec(args)
    tiers = plan_tiers(spec, gpu_bytes=args.gpu_mem, host_bytes=args.host_mem, disk_bytes=args.disk)
    for t in tiers:
        if t.pages == 0:
            raise ConfigError(f"{_TIER_ARGUMENT[t.name]} {format_size(t.capacity_bytes)}: holds no page of "
                              f"{t.bytes_per_page:,} B ({args.model}, page size {spec.page_size})")
    if args.limit is not None and args.trace is None:
        raise ConfigError("--limit slices a --trace; give --trace too")
    if args.prefill_tokens_per_s is None and (args.host_gbps is not None or args.disk_gbps is not None):
        raise ConfigError("--host-gbps / --disk-gbps compare a tier with recomputing: give --prefill-tokens-per-s too")
    trace = _simulate_trace(args, spec) if args.trace else None
    versus = (crossovers(spec, args.prefill_tokens_per_s, host_gbps=args.host_gbps, disk_gbps=args.disk_gbps)
              if args.prefill_tokens_per_s is not None else None)
    if args.json:
        out = plan_json(spec, tiers, args.model)
        if trace is not None:
            out["trace"] = trace
        if versus is not None:
            out["crossover"] = {"prefill_tokens_per_s": args.prefill_tokens_per_s,
                                "tiers": {c.tier: c.as_json() for c in versus}}
        print(json.dumps(out))
        return 0
    parts = ", ".join(f"{c.name} {c.bytes_per_layer:,} B" for c in spec.components)
    print(f"model         {args.model}: {spec.kind}, layers [{spec.layer_start}, {spec.layer_end}), "
          f"{spec.page_size} tokens a page; per layer of a page: {parts}")
    print(f"per token     {spec.bytes_per_token:,} B")
    print(f"per page      {describe_page_sizes(spec)}")
    print()
    print(f"{'tier':<6}{'capacity':>14}{'B per page':>14}{'pages':>14}{'tokens':>16}")
    for t in tiers:
        print(f"{t.name:<6}{format_size(t.capacity_bytes):>14}{t.bytes_per_page:>14,}{t.pages:>14,}{t.tokens(spec.page_size):>16,}")
    print("(gpu: page payloads; host and disk: padded slots of one stored record each, as the host pool and the file\n"
          " backend hold them; Redis and Mooncake keep records unpadded, so they fit a few more)")
    if trace is not None:
        rates = trace["hit_rate"]
        print()
        print(f"trace         {args.trace}: {trace['requests']:,} requests, {trace['input_tokens']:,} input tokens "
              f"(replayed with --simulate at these sizes)")
        print(f"hit rate      l1 {rates['l1']:.1%}, l2 {rates['l2']:.1%}, l3 {rates['l3']:.1%}, all {rates['total']:.1%}")
    if versus is not None:
        print()
        print(f"crossover     recomputing {args.prefill_tokens_per_s:,.0f} tokens/s takes "
              f"{versus[0].recompute_s_per_1k_tokens * 1e3:.1f} ms per 1k tokens; a tier's hit beats it above:")
        for c in versus:
            line = f"  {c.tier:<5} {c.crossover_gbps:8.2f} GB/s ({c.bytes_per_token:,.0f} B per token)"
            if c.gbps is not None:
                verdict = "beats recompute" if c.beats_recompute else "slower than recompute"
                line += (f"; at {c.gbps:.2f} GB/s a hit loads in {c.load_s_per_1k_tokens * 1e3:.1f} ms per 1k tokens: "
                         f"{verdict} ({c.gbps / c.crossover_gbps:.2f}x)")
            print(line)
    return 0


def _simulate_trace(args: argparse.Namespace, spec) -> dict:
    """``replay --simulate`` of ``args.trace`` at the plan's sizes: the hits capacity planning needs."""
    import dataclasses

    from .replay.driver import replay
    from .replay.report import summarize
    from ..compose import build, embedded_default
    from .replay.workload import read_trace

    requests = read_trace(args.trace, limit=args.limit)
    settings = dataclasses.replace(embedded_default(), spec=spec, model=args.model, simulate=True, verify=False,
                                   l3_url=None)
    settings = settings.with_sizes(gpu_bytes=args.gpu_mem, host_bytes=args.host_mem, disk_bytes=args.disk)
    with build(settings) as h:
        result = replay(h, requests)
    summary = summarize(result, workload="trace " + args.trace, l3="simulated")
    return {k: summary[k] for k in ("requests", "input_tokens", "hit_tokens", "hit_rate", "prefill_tokens_saved",
                                    "tier_pages")}


# --- bench ---------------------------------------------------------------------------------------
def _bench_storage_arguments(p: argparse.ArgumentParser) -> None:
    from .bench import storage as storage_bench

    storage_bench.add_arguments(p)
    p.set_defaults(func=storage_bench.run)


def _bench_transfer_arguments(p: argparse.ArgumentParser) -> None:
    from .bench import transfer

    transfer.add_arguments(p)
    p.set_defaults(func=transfer.run)


#: ``tiered-kv bench`` subcommands: name -> (help, function adding its arguments).
BENCHES: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "storage": ("put/get throughput of an L3 backend against its medium's ceiling", _bench_storage_arguments),
    "transfer": ("L1 <-> L2 copies through the transfer engine: backup, load, one layer (GB/s)", _bench_transfer_arguments),
}


def bench_arguments(p: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    bench = p.add_subparsers(dest="bench", required=True, metavar="{" + ",".join(BENCHES) + "}")
    for name, (help_, arguments) in BENCHES.items():
        arguments(bench.add_parser(name, parents=[common], help=help_))


# --- the other commands: each module fills its parser --------------------------------------------
def replay_arguments(p: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    from .replay import cli as replay_cli

    replay_cli.add_arguments(p)
    p.set_defaults(func=replay_cli.run)


def config_arguments(p: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    from ..config import cli as config_cli

    config_cli.add_arguments(p, common)


def inspect_arguments(p: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    from . import store_inspect as inspect_cli

    inspect_cli.add_arguments(p)


# --- the command line ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    """A subcommand: its line in ``tiered-kv --help``, and the function that adds its arguments to
    its parser (given with ``parents=[common]``, for ``--debug``) and sets ``func``. The function
    imports the command's modules: it runs only for the command given, or for ``build_parser()``."""

    help: str
    arguments: Callable[[argparse.ArgumentParser, argparse.ArgumentParser], None]


COMMANDS: dict[str, Command] = {
    "plan": Command("bytes per token and page, and what fits in each tier", plan_arguments),
    "bench": Command("benchmarks", bench_arguments),
    "replay": Command("replay a chat workload or a trace through the hierarchy", replay_arguments),
    "config": Command("check a config file, or show the effective values", config_arguments),
    "inspect": Command("count and verify the records of an L3 store (read-only)", inspect_arguments),
}


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser; ``commands`` names the commands whose arguments it knows (None: all of them).
    The others are there with their help line only, so their modules stay unimported."""
    parser = ArgumentParser(prog="tiered-kv", description="A three-tier KV cache for LLM serving engines.",
                                     epilog="exit codes: 0 ok, 1 failure while running, 2 bad usage or argument values")
    parser.add_argument("--version", action="version", version=f"tiered-kv {__version__}")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error")
    # Also accepted after the subcommand; SUPPRESS keeps a subparser from resetting the top-level value.
    common = ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="print the traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, parents=[common], help=command.help)
        if commands is None or name in commands:
            command.arguments(p, common)
    return parser


def command_named(argv: list[str]) -> str | None:
    """The command ``argv`` runs: its first word that is no option (no top-level option takes a
    value), where that is a command's name."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _exit_code(exc: BaseException) -> int | None:
    return next((EXIT_CODES[cls] for cls in type(exc).__mro__ if cls in EXIT_CODES), None)


def _raise_terminated(signum: int, frame: object) -> None:
    # A second SIGTERM during the cleanup ends the process at once, as SIGTERM does by default.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated()


def _on_sigterm(handler: Any) -> Any:
    """Install ``handler`` for SIGTERM and return the one it replaces; nothing off the main thread,
    where Python takes no handlers (``main`` called from a thread keeps the default)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.signal(signal.SIGTERM, handler)
    return signal.SIG_DFL if previous is None else previous  # None: a handler set outside Python


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv  # before parsing: an interrupt may come before the arguments are read
    previous = _on_sigterm(_raise_terminated)
    try:
        name = command_named(argv)
        parser = build_parser([name] if name else [])
        args = parser.parse_args(argv)
        debug = args.debug
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        code = args.func(args)
        # Output to a pipe is block-buffered: a reader that went away shows at this flush, inside
        # the handler below, instead of in the interpreter's final flush (exit 120 and a message).
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (``tiered-kv replay --json | head -c 100``): nothing is wrong with
        # the command, so no "internal error" line; stdout goes to /dev/null so that the
        # interpreter's final flush does not raise the same error again (Python's documented way).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (Exception, KeyboardInterrupt, Terminated) as exc:
        code = _exit_code(exc)
        if debug:
            traceback.print_exc()
        signalled = next((m for cls, m in SIGNAL_MESSAGES.items() if isinstance(exc, cls)), None)
        if signalled is not None:
            print(f"tiered-kv: {signalled}", file=sys.stderr)
        elif code is None:
            # Not one of the library's errors: a bug. Still one line; the traceback is one flag away.
            print(f"tiered-kv: internal error: {type(exc).__name__}: {_one_line(exc)} (a bug; rerun with --debug "
                  f"for the traceback)", file=sys.stderr)
        else:
            print(f"tiered-kv: error: {_one_line(exc)}", file=sys.stderr)
        return BUG_EXIT_CODE if code is None else code
    finally:
        if previous is not None:
            _on_sigterm(previous)


if __name__ == "__main__":
    sys.exit(main())
