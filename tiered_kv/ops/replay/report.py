"""What a replay found: one summary (``summarize``), printed as a table or one JSON object, and a
plot of the hit rate per tier over the workload's time.

Hit tokens are whole pages served by a tier (``pages x page_size``); a prompt's incomplete last
page is always computed. ``prefill_tokens_saved`` counts the hits of all three tiers (tokens the
engine did not compute); ``..._beyond_l1`` those of L2 and L3 alone, what the hierarchy adds to an
engine's own prefix cache. Latencies are cache-side, per request: ``match`` from the first lookup
to a decided hit (L3's ``exists`` included), ``prefetch`` from its start until the policy let the
request run, ``load`` the run minus the prefill stand-in and the verification.

``outcome`` tells a run that failed (a wrong page, a request not served, an L3 still failing at
the end: exit 1) from one served through a fault (L3 degraded during the run and back before its
end, every request served and every page right: exit 0) and a clean one; ``faults`` counts them.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ...errors import ConfigError
from ...model.sizes import format_size
from .driver import ReplayResult

TIERS = ("l1", "l2", "l3")
DIRECTIONS = ("l2_to_l1", "l1_to_l2", "l3_to_l2", "l2_to_l3")
PERCENTILES = (50, 90, 99)

OK = "ok"
SERVED_THROUGH_FAULT = "served through a fault"
FAILED = "failed"


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {f"p{p}": 0.0 for p in PERCENTILES}
    arr = np.asarray(values) * 1000.0
    return {f"p{p}": round(float(np.percentile(arr, p)), 4) for p in PERCENTILES}


def _faults(result: ReplayResult) -> dict[str, Any]:
    """What went wrong with L3 during the run, from the controller's counters."""
    c = result.controller
    return {
        "degraded_episodes": c.get("degraded_episodes", 0),
        "recoveries": c.get("recoveries", 0),
        "backend_errors": c.get("backend_errors", 0),
        "reads_degraded": c.get("reads_degraded", 0),
        "writes_refused": c.get("writes_refused", 0),
        "l3_degraded_at_end": result.l3_degraded_at_end,
    }


def outcome(s: dict[str, Any]) -> str:
    """``failed`` for a wrong page, a request not served or an L3 still degraded at the end (a
    backend that failed and did not come back); ``served through a fault`` when L3 was degraded
    during the run but every request was served right; else ``ok``."""
    faults = s.get("faults", {})
    if s["pages_wrong"] or s.get("requests_unserved") or faults.get("l3_degraded_at_end"):
        return FAILED
    return SERVED_THROUGH_FAULT if faults.get("degraded_episodes") else OK


def summarize(result: ReplayResult, **extra: Any) -> dict[str, Any]:
    """The replay's numbers as one JSON-ready object (``--json`` prints it)."""
    reqs = result.requests
    ps = result.page_size
    hit = {t: sum(getattr(r, f"{t}_pages") for r in reqs) * ps for t in TIERS}
    input_tokens = sum(r.input_tokens for r in reqs)
    saved = sum(hit.values())
    wall = max(result.wall_s, 1e-9)
    summary = {
        "requests": len(reqs),
        "requests_unserved": result.unserved,
        "input_tokens": input_tokens,
        "hit_tokens": hit,
        "hit_rate": {**{t: round(hit[t] / input_tokens, 6) if input_tokens else 0.0 for t in TIERS},
                     "total": round(saved / input_tokens, 6) if input_tokens else 0.0},
        "prefill_tokens_saved": saved,
        "prefill_tokens_saved_beyond_l1": hit["l2"] + hit["l3"],
        "prefill_tokens_computed": input_tokens - saved,
        "pages_verified": sum(r.verified_pages for r in reqs),
        "pages_wrong": sum(r.wrong_pages for r in reqs),
        "bytes": dict(result.bytes),
        "gb_per_s": {d: round(result.bytes[d] / wall / 1e9, 4) for d in DIRECTIONS},
        "l3_busy_gb_per_s": {
            "l3_to_l2": round(result.bytes["l3_to_l2"] / result.l3_busy_s["read"] / 1e9, 4) if result.l3_busy_s["read"] else 0.0,
            "l2_to_l3": round(result.bytes["l2_to_l3"] / result.l3_busy_s["write"] / 1e9, 4) if result.l3_busy_s["write"] else 0.0,
        },
        "latency_ms": {
            "match": _percentiles([r.match_s for r in reqs]),
            "prefetch": _percentiles([r.prefetch_s for r in reqs]),
            "load": _percentiles([r.load_s for r in reqs]),
        },
        "wall_s": round(result.wall_s, 3),
        "simulate": result.simulate,
        "inflight": result.inflight,
        "page_size": ps,
        "tier_pages": dict(result.tiers),
        "spec": result.spec,
        "uncached_pages": sum(r.uncached_pages for r in reqs),
        "l1_evictions": result.l1_evictions,
        "l2_evictions": result.manager.get("l2_evictions", 0),
        "l3_pages_read": result.controller.get("pages_read", 0),
        "l3_pages_written": result.controller.get("pages_written", 0),
        "l3_writes_refused": result.controller.get("writes_refused", 0),
        "l3_degraded_episodes": result.controller.get("degraded_episodes", 0),
        "faults": _faults(result),
        "prefill_stand_in_s": round(result.fill_s, 3),
        "verify_s": round(result.verify_s, 3),
        **extra,
    }
    summary["outcome"] = outcome(summary)
    return summary


def format_table(s: dict[str, Any]) -> str:
    """The summary as the text table ``tiered-kv replay`` prints."""
    lines = []
    mode = "simulated (no bytes moved)" if s["simulate"] else "bytes moved and verified"
    lines.append(f"replay        {s['requests']:,} requests, {s['input_tokens']:,} input tokens, {mode}, "
                 f"{s['wall_s']:.2f} s wall, {s['inflight']} in flight")
    lines.append(f"spec          {s['spec']}")
    lines.append("")
    lines.append(f"{'tier':<6}{'capacity':>12}{'hit tokens':>16}{'hit rate':>10}")
    for t in TIERS:
        cap = f"{s['tier_pages'][t]:,} p"
        lines.append(f"{t:<6}{cap:>12}{s['hit_tokens'][t]:>16,}{s['hit_rate'][t] * 100:>9.1f}%")
    lines.append(f"{'all':<6}{'':>12}{s['prefill_tokens_saved']:>16,}{s['hit_rate']['total'] * 100:>9.1f}%")
    lines.append(f"prefill tokens saved {s['prefill_tokens_saved']:,} (beyond L1: {s['prefill_tokens_saved_beyond_l1']:,}); "
                 f"computed {s['prefill_tokens_computed']:,}")
    lines.append("")
    if not s["simulate"]:
        lines.append(f"{'moved':<12}{'bytes':>14}{'GB/s (wall)':>14}")
        for d in DIRECTIONS:
            lines.append(f"{d.replace('_to_', ' -> '):<12}{format_size(s['bytes'][d]):>14}{s['gb_per_s'][d]:>14.3f}")
        busy = s["l3_busy_gb_per_s"]
        lines.append(f"(L3 over its busy time: read {busy['l3_to_l2']:.3f} GB/s, write {busy['l2_to_l3']:.3f} GB/s)")
        lines.append("")
    lines.append(f"{'latency ms':<12}" + "".join(f"{f'p{p}':>10}" for p in PERCENTILES))
    for name, pct in s["latency_ms"].items():
        lines.append(f"{name:<12}" + "".join(f"{pct[f'p{p}']:>10.3f}" for p in PERCENTILES))
    lines.append("")
    lines.append(f"pages verified {s['pages_verified']:,}, pages wrong {s['pages_wrong']:,}"
                 + ("" if s["simulate"] else " (must be 0)"))
    faults = s.get("faults", {})
    if s.get("requests_unserved"):
        lines.append(f"requests not served {s['requests_unserved']:,} (must be 0)")
    if faults.get("degraded_episodes"):
        back = ("still degraded at the end: the backend failed and did not come back" if faults["l3_degraded_at_end"]
                else f"back each time ({faults['recoveries']:,} recoveries)")
        lines.append(f"L3 degraded {faults['degraded_episodes']:,} time(s), {back}; "
                     f"{faults['reads_degraded']:,} reads answered miss, {faults['writes_refused']:,} writes refused")
    lines.append(f"outcome: {s.get('outcome', outcome(s))}")
    return "\n".join(lines)


def to_json(s: dict[str, Any]) -> str:
    return json.dumps(s, sort_keys=False)


def hit_rate_series(result: ReplayResult, buckets: int = 60) -> dict[str, Any]:
    """Hit rate per tier in ``buckets`` windows of the workload's time (arrival seconds): ``t`` the
    windows' middles, ``width`` their length in seconds, and per tier the fraction of the window's
    input tokens it served. A window no input arrived in has no hit rate: NaN, not 0%."""
    reqs = result.requests
    if not reqs:
        return {"t": [], "width": 1.0, **{t: [] for t in TIERS}}
    arrivals = np.array([r.arrival_s for r in reqs])
    span = float(arrivals.max() - arrivals.min())
    n = max(1, min(buckets, len(reqs)))
    edges = np.linspace(arrivals.min(), arrivals.max() + (span / n if span else 1.0) * 1e-9, n + 1)
    which = np.clip(np.searchsorted(edges, arrivals, side="right") - 1, 0, n - 1)
    tokens = np.bincount(which, weights=[r.input_tokens for r in reqs], minlength=n)
    out: dict[str, Any] = {"t": ((edges[:-1] + edges[1:]) / 2).tolist(), "width": span / n if span else 1.0}
    for t in TIERS:
        hits = np.bincount(which, weights=[getattr(r, f"{t}_pages") * result.page_size for r in reqs], minlength=n)
        out[t] = np.divide(hits, tokens, out=np.full(n, np.nan), where=tokens > 0).tolist()
    return out


def require_matplotlib() -> Any:
    """The ``matplotlib`` module, or ConfigError naming the extra that installs it."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib: install the 'plot' extra (pip install 'tiered-kv[plot]')") from None
    return matplotlib


def check_plot_target(path: str) -> None:
    """ConfigError where ``--plot path`` could not be drawn: the 'plot' extra missing, or a path
    that cannot be written (opened for appending to find out: an existing file keeps its bytes, a
    new one is removed again)."""
    require_matplotlib()
    existed = os.path.lexists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise ConfigError(f"--plot {path}: cannot write ({exc.strerror or exc})") from None
    if not existed:
        os.unlink(path)


def plot(result: ReplayResult, path: str, title: str = "tiered-kv replay") -> None:
    """Hit rate per tier over the workload's time, as a PNG at ``path``."""
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")  # files only; no display on servers
    import matplotlib.pyplot as plt

    series = hit_rate_series(result)
    # One stacked bar per window that had input; a window without any stays empty (a gap), where
    # a line through it would claim a 0% hit rate.
    drawn = ~np.isnan(np.asarray(series["l1"], dtype=float))
    t = np.asarray(series["t"], dtype=float)[drawn]
    fig, ax = plt.subplots(figsize=(8, 4))
    try:
        bottom = np.zeros(len(t))
        for tier in TIERS:
            height = np.asarray(series[tier], dtype=float)[drawn] * 100
            ax.bar(t, height, width=series["width"], bottom=bottom, label=tier.upper(), linewidth=0)
            bottom += height
        ax.set_xlabel("workload time (s)")
        ax.set_ylabel("hit rate (% of input tokens)")
        ax.set_ylim(0, 100)
        ax.set_title(title)
        ax.legend(loc="upper left")
        try:
            fig.savefig(path, dpi=100)
        except OSError as exc:
            raise ConfigError(f"--plot {path}: cannot write ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)


__all__ = ["DIRECTIONS", "FAILED", "OK", "SERVED_THROUGH_FAULT", "TIERS", "check_plot_target", "format_table",
           "hit_rate_series", "outcome", "plot", "require_matplotlib", "summarize", "to_json"]
