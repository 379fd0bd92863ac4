#!/usr/bin/env python3
"""Docker health checks of the dev stack's tiered-kv containers (no curl in the slim image).

    tiered-kv-healthcheck segment URL    the Mooncake master's metrics report contributed capacity
    tiered-kv-healthcheck metrics URL    a Prometheus endpoint answers with tiered_kv_ metrics
"""

import re
import sys
import urllib.request


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=3) as reply:
        return reply.read().decode()


def segment(url: str) -> bool:
    match = re.search(r"^master_total_capacity_bytes\s+(\S+)", _get(url), re.M)
    return match is not None and float(match.group(1)) > 0


def metrics(url: str) -> bool:
    return "tiered_kv_" in _get(url)


CHECKS = {"segment": segment, "metrics": metrics}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in CHECKS:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(0 if CHECKS[sys.argv[1]](sys.argv[2]) else 1)
    except OSError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
