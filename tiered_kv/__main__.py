"""``python -m tiered_kv``: the same command line as the ``tiered-kv`` console script."""

from .ops.cli import main

raise SystemExit(main())
