"""``tiered-kv replay``: synthetic multi-turn chat or a request trace through the real hierarchy.

    workload.py      requests as token ids: synthetic chat, Mooncake-format traces
    setup.py         the hierarchy from one settings value (embedded default, --simulate)
    driver.py        the event loop: lookups, prefetches and runs of requests in arrival order
    report.py        the summary, its table, --json and --plot
    simulated_l3.py  a key-only L3 with a capacity in pages (--simulate)
    cli.py           the subcommand
"""

from .driver import ReplayResult, RequestResult, replay
from .report import format_table, summarize
from .setup import Hierarchy, ReplaySettings, build, embedded_default
from .simulated_l3 import SimulatedL3
from .workload import ChatWorkload, Request, read_trace, synthetic_chat

__all__ = ["ChatWorkload", "Hierarchy", "ReplayResult", "ReplaySettings", "Request", "RequestResult", "SimulatedL3",
           "build", "embedded_default", "format_table", "read_trace", "replay", "summarize", "synthetic_chat"]
