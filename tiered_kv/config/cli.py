"""``tiered-kv config check FILE`` and ``tiered-kv config show [FILE] [--json]``.

``check`` loads FILE as a run would (the file, then ``TIERED_KV_*`` variables) and prints ``ok`` and
a one-line summary; a bad config is the loader's one-line ConfigError, which ``tiered_kv.ops.cli.main``
prints and turns into exit code 2. An L3 backend whose extra is not installed (``redis://`` without
``tiered-kv[redis]``) is a MissingExtraError naming the extra: exit 1, as a run would fail.
``show`` prints every effective value and its source (default, file, env, argument); with no FILE,
``$TIERED_KV_CONFIG``, else the embedded default that ``tiered-kv replay`` runs without a file
(``tiered_kv.compose.embedded_config``), under the environment.
"""

from __future__ import annotations

import argparse

from .loader import config_file, load_config, show


def run_check(args: argparse.Namespace) -> int:
    config = load_config(args.file)
    if config.l3.url is not None:
        # A config a run cannot open on this install is no "ok": the missing extra, named.
        from ..backends import backend_class

        backend_class(config.l3.scheme).check_dependencies()
    print(f"ok: {args.file}: {config.summary()}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    defaults = None
    if config_file(args.file) is None:
        from ..compose import embedded_config

        defaults = embedded_config()  # what ``tiered-kv replay`` runs with no file
    print(show(load_config(args.file, defaults=defaults), as_json=args.json))
    return 0


def add_arguments(config: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """The ``tiered-kv config`` parser's subcommands; ``common`` is every parser's parent (``--debug``)."""
    commands = config.add_subparsers(dest="config_command", required=True, metavar="{check,show}")
    check = commands.add_parser("check", parents=[common],
                                help="validate a config file (exit 0 ok, 2 bad, 1 its backend's extra not installed)")
    check.add_argument("file", metavar="FILE", help="a YAML (.yaml, .yml) or TOML (.toml) config file")
    check.set_defaults(func=run_check)
    show_ = commands.add_parser("show", parents=[common], help="every effective value and where it came from")
    show_.add_argument("file", metavar="FILE", nargs="?", default=None,
                       help="a config file (default: $TIERED_KV_CONFIG, else the embedded default "
                            "'tiered-kv replay' runs, and the environment)")
    show_.add_argument("--json", action="store_true", help="one JSON object: key -> value, source, origin")
    show_.set_defaults(func=run_show)


__all__ = ["add_arguments", "run_check", "run_show"]
