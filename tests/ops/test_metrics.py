"""The metrics exposition: it parses, follows Prometheus' naming rules, agrees with the replay's own
totals, with docs/metrics.md and with the Grafana dashboard's queries; serving it over HTTP."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.ops.replay.conftest import TEST_SPEC, TINY_CHAT, TINY_TIERS
from tiered_kv.errors import ConfigError, MetricsServerError
from tiered_kv.ops.metrics import (BACKEND_LABELS, METRICS, cache_registry, check_address, exposition, metric_names,
                               serve_metrics)
from tiered_kv.ops.replay import build, embedded_default, replay, summarize
from tiered_kv.ops.replay.workload import synthetic_chat

REPO = Path(__file__).resolve().parents[2]
ALLOWED_LABELS = {
    "tier": {"l1", "l2", "l3"},
    "direction": {"read", "write"},
    "backend": {"file", "redis", "mooncake", "memory", "simulated"} | set(BACKEND_LABELS.values()),
    "outcome": {"completed", "cancelled", "timed_out", "landed", "missing", "stored", "failed", "skipped", "refused"},
    "state": {"free", "held", "used"},
}
UNITS = ("bytes", "seconds")


@pytest.fixture(scope="module")
def scraped():
    """One in-process replay with hits on all three tiers; its summary and its exposition."""
    # One request at a time and a smaller L2: hits on all three tiers, independent of timing.
    h = build(embedded_default(spec=TEST_SPEC, **{**TINY_TIERS, "l2_pages": 30}))
    registry = cache_registry(l1=h.l1)
    try:
        result = replay(h, synthetic_chat(TINY_CHAT), inflight=1)
        during = exposition(registry)
    finally:
        h.close()
    try:
        assert h.l2_free_slots == h.manager.num_slots, "an L2 slot was not freed"
        assert h.controller.pending_tasks() == 0, "a task was left on the controller's loop"
        after = exposition(registry)  # the closed cache's counters stay readable
    finally:
        h.release_memory()
    return summarize(result), during, after


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams, name: str, **labels: str) -> float:
    family = fams[name]
    values = [s.value for s in family.samples
              if s.name in (name, name + "_total") and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(values) == 1, f"{name}{labels}: {len(values)} samples"
    return values[0]


def test_exposition_parses_and_lists_every_metric(scraped):
    _, text, _ = scraped
    fams = families(text)
    # The parser names a counter family without _total; METRICS' names are the same.
    assert set(fams) == {m.name for m in METRICS}
    for m in METRICS:
        assert fams[m.name].type == m.type, m.name
        assert fams[m.name].samples, f"{m.name} has no sample"


def test_every_metric_follows_the_naming_conventions(scraped):
    _, text, _ = scraped
    exposed = {m.name: m for m in METRICS}
    for family in text_string_to_metric_families(text):
        m = exposed[family.name]
        assert re.fullmatch(r"tiered_kv_[a-z0-9]+(_[a-z0-9]+)*", family.name), family.name
        assert not family.name.endswith("_total"), f"{family.name}: _total is the counter's sample suffix"
        if m.type == "gauge":
            assert "_total" not in family.name
        for unit in UNITS:  # a unit is the name's last word (before _total)
            assert unit not in family.name.split("_")[:-1], f"{family.name}: {unit} must be the suffix"
        assert not re.search(r"(_ms|_kb|_mb|_gb|_percent|_count)$", family.name), family.name
        for sample in family.samples:
            suffix = sample.name[len(family.name):]
            allowed = {"counter": {"_total"}, "gauge": {""}, "summary": {"_count", "_sum"}}[m.type]
            assert suffix in allowed, sample.name
            assert set(sample.labels) == set(m.labels), sample
            for label, v in sample.labels.items():
                assert v in ALLOWED_LABELS[label], f"{sample.name}: {label}={v!r} is not a low-cardinality value"
            assert sample.value >= 0, sample


def test_hits_agree_with_the_replays_totals(scraped):
    summary, _, after = scraped
    fams = families(after)
    page = summary["page_size"]
    assert all(summary["hit_tokens"][t] > 0 for t in ("l1", "l2", "l3")), summary["hit_tokens"]
    for tier in ("l1", "l2", "l3"):
        assert value(fams, "tiered_kv_hit_tokens", tier=tier) == summary["hit_tokens"][tier]
        assert value(fams, "tiered_kv_hit_pages", tier=tier) * page == summary["hit_tokens"][tier]
    asked = value(fams, "tiered_kv_hit_pages", tier="l1") + value(fams, "tiered_kv_miss_pages", tier="l1")
    full_pages = sum(summary["hit_tokens"].values()) // page + value(fams, "tiered_kv_miss_pages", tier="l3")
    assert asked == full_pages
    assert value(fams, "tiered_kv_miss_pages", tier="l1") == (value(fams, "tiered_kv_hit_pages", tier="l2")
                                                               + value(fams, "tiered_kv_miss_pages", tier="l2"))
    assert value(fams, "tiered_kv_requests") == summary["requests"]
    assert value(fams, "tiered_kv_evictions", tier="l1") == summary["l1_evictions"]
    assert value(fams, "tiered_kv_evictions", tier="l2") == summary["l2_evictions"]
    assert value(fams, "tiered_kv_transfer_bytes", tier="l3", direction="read") == summary["bytes"]["l3_to_l2"]
    assert value(fams, "tiered_kv_transfer_bytes", tier="l2", direction="write") == summary["bytes"]["l1_to_l2"]
    assert value(fams, "tiered_kv_l3_pages", direction="write") == summary["l3_pages_written"]
    assert value(fams, "tiered_kv_backend_up", backend="file") == 1
    assert value(fams, "tiered_kv_l2_slots", state="held") == 0  # closed: every slot back
    assert value(fams, "tiered_kv_l2_slots", state="free") == summary["tier_pages"]["l2"]


def test_a_cache_without_l3_exposes_no_l3_series():
    from tiered_kv.hierarchy import CacheManager
    from tiered_kv.model.slot_allocator import SlotAllocator

    two_tier = CacheManager(SlotAllocator(8), page_size=64)
    try:
        text = exposition(cache_registry(manager=two_tier))
    finally:
        two_tier.close()
    fams = families(text)
    assert "tiered_kv_backend_up" not in fams and "tiered_kv_l3_queue_depth" not in fams
    assert not [s for f in fams.values() for s in f.samples if s.labels.get("tier") == "l3"]
    assert value(fams, "tiered_kv_l2_slots", state="free") == 8


def test_two_caches_keep_their_series_apart():
    a = build(embedded_default(spec=TEST_SPEC, simulate=True, **TINY_TIERS))
    b = build(embedded_default(spec=TEST_SPEC, simulate=True, l2_pages=64, l1_pages=20, l3_pages=256))
    try:
        ra, rb = cache_registry(l1=a.l1), cache_registry(l1=b.l1)
        replay(a, synthetic_chat(TINY_CHAT), inflight=4)
        assert ra.get_sample_value("tiered_kv_requests_total") == TINY_CHAT.clients * TINY_CHAT.rounds
        assert rb.get_sample_value("tiered_kv_requests_total") == 0
        assert rb.get_sample_value("tiered_kv_capacity_pages", {"tier": "l2"}) == 64
        assert ra.get_sample_value("tiered_kv_backend_up", {"backend": "simulated"}) == 1
    finally:
        a.close()
        b.close()


def test_docs_list_every_metric_with_its_type_and_labels():
    text = (REPO / "docs" / "metrics.md").read_text()
    rows = re.findall(r"^\| `(tiered_kv_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|", text, re.M)
    documented = {name: (kind, tuple(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}
    assert documented == {m.exposed_name: (m.type, m.labels) for m in METRICS}


def dashboard_queries() -> list[str]:
    dash = json.loads((REPO / "dashboards" / "tiered-kv.json").read_text())
    queries = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert queries, "the dashboard has no query"
    return queries


def test_every_dashboard_query_names_only_exposed_metrics():
    exposed = set(metric_names())
    exposed |= {m.name + suffix for m in METRICS if m.type == "summary" for suffix in ("_sum", "_count")}
    used = set()
    for expr in dashboard_queries():
        names = set(re.findall(r"\btiered_kv_[a-z0-9_]+", expr))
        assert names, f"query names no tiered_kv metric: {expr}"
        assert names <= exposed, f"{expr}: not exposed: {sorted(names - exposed)}"
        for label in re.findall(r"\b(?:by|without) \(([^)]*)\)", expr):
            assert {x.strip() for x in label.split(",")} <= set(ALLOWED_LABELS), expr
        used |= names
    # A panel for everything the library exposes.
    families = {re.sub(r"_(sum|count)$", "", n) if n.startswith("tiered_kv_prefetch_seconds") else n for n in used}
    assert families == set(metric_names())


def test_serve_metrics_answers_scrapes_and_refuses_bad_addresses():
    h = build(embedded_default(spec=TEST_SPEC, simulate=True, **TINY_TIERS))
    try:
        registry = cache_registry(l1=h.l1)
        with serve_metrics(registry, "127.0.0.1", 0) as server:
            assert server.port > 0
            with urllib.request.urlopen(server.url, timeout=5) as reply:
                body = reply.read().decode()
            assert value(families(body), "tiered_kv_capacity_pages", tier="l2") == TINY_TIERS["l2_pages"]
            with pytest.raises(MetricsServerError, match=f"127.0.0.1:{server.port}"):
                serve_metrics(registry, "127.0.0.1", server.port)  # in use: a runtime failure, not a bad value
        with socket.socket() as s:  # closed: the port answers no more
            assert s.connect_ex(("127.0.0.1", server.port)) != 0
    finally:
        h.close()
    for host, port, named in (("localhost", 9400, "host"), ("127.0.0.1", 70000, "port"), ("127.0.0.1", True, "port"),
                              (None, 9400, "host"), ("127.0.0.1", "9400", "port")):
        with pytest.raises(ConfigError, match=named):
            check_address(host, port)
    with pytest.raises(ConfigError, match="l1=, manager=, controller="):
        cache_registry()


@pytest.mark.parametrize("l3", ["file", "memory"])
def test_l3_evictions_and_capacity_are_exposed_for_backends_that_evict_themselves(l3):
    """Evictions per tier: an L3 that evicts for room (a file store with a capacity, a
    memory store) has its tier="l3" eviction series and its capacity in pages, not only the
    simulated one."""
    tiers = {**TINY_TIERS, "l3_pages": 24}  # far below the chat's ~80 distinct pages: L3 evicts
    url = None
    if l3 == "memory":
        from tiered_kv.ops.plan import record_bytes
        url = f"memory://?capacity_bytes={tiers['l3_pages'] * record_bytes(TEST_SPEC)}"
    h = build(embedded_default(spec=TEST_SPEC, l3_url=url, **tiers))
    registry = cache_registry(l1=h.l1)
    try:
        replay(h, synthetic_chat(TINY_CHAT))
        fams = families(exposition(registry))
        evicted = h.controller.backend.stats.evictions
    finally:
        h.close()
    assert h.l2_free_slots == h.manager.num_slots and h.controller.pending_tasks() == 0
    h.release_memory()
    assert evicted > 0
    assert value(fams, "tiered_kv_evictions", tier="l3") == evicted
    assert value(fams, "tiered_kv_capacity_pages", tier="l3") == tiers["l3_pages"]
    assert value(fams, "tiered_kv_capacity_pages", tier="l2") == tiers["l2_pages"]


def test_a_metrics_port_in_use_is_a_runtime_failure_exit_1(capsys):
    """Exit codes: 2 for bad usage or input, 1 for a failure at run time; a port someone else
    holds is the latter (the same flags work once it is free)."""
    from tiered_kv.ops.cli import main

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code = main(["replay", "--simulate", "--clients", "2", "--rounds", "2", "--json", "--quiet",
                     "--metrics-port", str(port)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"tiered-kv: error: metrics: cannot listen on 127.0.0.1:{port}") and err.count("\n") == 1
