"""``tiered-kv replay``: synthetic multi-turn chat or a request trace through the real hierarchy.

    workload.py      requests as token ids: synthetic chat, Mooncake-format traces
    driver.py        the event loop: lookups, prefetches and runs of requests in arrival order
    report.py        the summary, its table, --json and --plot
    cli.py           the subcommand

The hierarchy it drives is built by ``tiered_kv.compose`` (the composition root); ``--simulate`` uses
the key-only ``tiered_kv.backends.simulated.SimulatedL3``.
"""

from ...backends.simulated import SimulatedL3
from ...compose import Hierarchy, ReplaySettings, build, embedded_default
from .driver import ReplayResult, RequestResult, replay
from .report import format_table, summarize
from .workload import ChatWorkload, Request, read_trace, synthetic_chat

__all__ = ["ChatWorkload", "Hierarchy", "ReplayResult", "ReplaySettings", "Request", "RequestResult", "SimulatedL3",
           "build", "embedded_default", "format_table", "read_trace", "replay", "summarize", "synthetic_chat"]
