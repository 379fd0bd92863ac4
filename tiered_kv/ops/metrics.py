"""Prometheus metrics of one cache instance, read from its live stats objects at scrape time.

    registry = cache_registry(l1=l1_cache)                 # or manager=..., controller=..., worker=...
    server = serve_metrics(registry, "127.0.0.1", 9400)    # GET http://127.0.0.1:9400/metrics
    ...
    server.close()

Nothing is counted twice and nothing runs on the hot path: ``CacheCollector`` holds references to
the parts (``L1PrefixCache.stats``, ``CacheManager.stats``, ``L3Controller.stats`` and its queues,
the backend's ``BackendStats``, the transfer half's byte counters, the L2 allocator) and turns
their current numbers into metric families when Prometheus scrapes. Each cache instance gets a
``CollectorRegistry`` of its own, so two caches in one process never mix their series.

Every metric is one row of ``METRICS`` (name, type, labels, help, reader): ``docs/metrics.md``
lists them and a test keeps the two in step. A part the cache does not have (no L1 prefix cache
for an engine with its own, no L3 for a two-tier cache) leaves its metrics out of the exposition.
Metrics are off by default; ``tiered-kv replay --metrics-port N`` (or the config file's
``metrics`` section) serves them. ``prometheus_client`` is the optional extra ``metrics``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, MetricsServerError
from ..hierarchy.index import free_slot_count

TIERS = ("l1", "l2", "l3")
DIRECTIONS = ("read", "write")
#: Backend label values: the URL scheme, with the Redis transports folded into one.
BACKEND_LABELS = {"rediss": "redis", "unix": "redis"}
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9400

Sample = tuple[tuple[str, ...], float]


@dataclass
class CacheParts:
    """What one cache instance is made of; any part may be None (its metrics are left out)."""

    l1: Any = None  # L1PrefixCache
    manager: Any = None  # CacheManager
    controller: Any = None  # L3Controller
    worker: Any = None  # TransferHalf (L1 <-> L2 byte counters)

    @property
    def page_size(self) -> int | None:
        return None if self.manager is None else self.manager.page_size

    @property
    def backend(self) -> Any:
        return None if self.controller is None else getattr(self.controller, "backend", None)

    @property
    def backend_label(self) -> str:
        scheme = getattr(self.backend, "scheme", None) or "simulated"
        return BACKEND_LABELS.get(scheme, scheme)


@dataclass(frozen=True)
class Metric:
    """One metric family: ``read(parts)`` yields (label values, value), or nothing when the part
    it reads is missing."""

    name: str  # without the counter's ``_total`` (prometheus_client adds it)
    type: str  # "counter", "gauge" or "summary"
    labels: tuple[str, ...]
    help: str
    read: Callable[[CacheParts], Iterable[Any]]

    @property
    def exposed_name(self) -> str:
        """The name as scraped (counters end in ``_total``)."""
        return self.name + "_total" if self.type == "counter" else self.name


# --- readers: one per metric, each reads one part ----------------------------------------------
def _l1_pages(parts: CacheParts, per_page: int = 1, hits: bool = True) -> Iterator[Sample]:
    st = getattr(parts.l1, "stats", None)
    if st is None:
        return
    served = {"l1": st.l1_pages, "l2": st.l2_pages, "l3": st.l3_pages}
    asked = st.pages  # pages asked of a tier: those no tier above it served
    for tier in TIERS:
        if tier == "l3" and parts.controller is None:
            continue
        yield (tier,), (served[tier] if hits else asked - served[tier]) * per_page
        asked -= served[tier]


def _tokens(hits: bool) -> Callable[[CacheParts], Iterator[Sample]]:
    def read(parts: CacheParts) -> Iterator[Sample]:
        if parts.page_size is not None:
            yield from _l1_pages(parts, parts.page_size, hits)
    return read


def _field(part: str, attr: str) -> Callable[[CacheParts], Iterator[Sample]]:
    def read(parts: CacheParts) -> Iterator[Sample]:
        obj = _part(parts, part)
        if obj is not None:
            yield (), getattr(obj, attr)
    return read


def _by_label(part: str, attrs: dict[str, str]) -> Callable[[CacheParts], Iterator[Sample]]:
    """One sample per label value, each from an attribute of ``part``."""
    def read(parts: CacheParts) -> Iterator[Sample]:
        obj = _part(parts, part)
        if obj is not None:
            for value, attr in attrs.items():
                yield (value,), getattr(obj, attr)
    return read


def _backend_field(attr: str, *, of: str = "backend_stats") -> Callable[[CacheParts], Iterator[Sample]]:
    def read(parts: CacheParts) -> Iterator[Sample]:
        obj = _part(parts, of)
        value = None if obj is None else getattr(obj, attr, None)
        if value is not None:
            yield (parts.backend_label,), value
    return read


_PARTS: dict[str, Callable[[CacheParts], Any]] = {
    "l1": lambda p: p.l1,
    "l1_stats": lambda p: getattr(p.l1, "stats", None),
    "manager": lambda p: None if p.manager is None else p.manager.stats,
    "controller": lambda p: None if p.controller is None else p.controller.stats,
    "backend_stats": lambda p: getattr(p.backend, "stats", None),
}


def _part(parts: CacheParts, name: str) -> Any:
    return _PARTS[name](parts)


def _lookup_hits(parts: CacheParts) -> Iterator[Sample]:
    if parts.manager is not None:
        yield ("l2",), parts.manager.stats.l2_hit_pages
        if parts.controller is not None:
            yield ("l3",), parts.manager.stats.l3_hit_pages


def _transfer_bytes(parts: CacheParts) -> Iterator[Sample]:
    if parts.worker is not None:
        yield ("l2", "read"), parts.worker.bytes_loaded
        yield ("l2", "write"), parts.worker.bytes_stored
    if parts.controller is not None:
        yield ("l3", "read"), parts.controller.stats.bytes_read
        yield ("l3", "write"), parts.controller.stats.bytes_written


def _transfer_seconds(parts: CacheParts) -> Iterator[Sample]:
    # L1 <-> L2 copies run on CUDA streams and are not timed on the host: only L3 has busy seconds.
    if parts.controller is not None:
        yield ("l3", "read"), parts.controller.stats.read_seconds
        yield ("l3", "write"), parts.controller.stats.write_seconds


def _evictions(parts: CacheParts) -> Iterator[Sample]:
    if parts.l1 is not None:
        yield ("l1",), parts.l1.evictions
    if parts.manager is not None:
        yield ("l2",), parts.manager.stats.l2_evictions
    evicted = getattr(getattr(parts.backend, "stats", None), "evictions", None)
    if evicted is not None:  # backends that evict for room themselves (file, memory, simulated)
        yield ("l3",), evicted


def _l2_slots(parts: CacheParts) -> Iterator[Sample]:
    if parts.manager is not None:
        free = free_slot_count(parts.manager.allocator)
        yield ("free",), free
        yield ("held",), parts.manager.num_slots - free


def _l1_pages_state(parts: CacheParts) -> Iterator[Sample]:
    if parts.l1 is not None:
        yield ("used",), parts.l1.used_pages
        yield ("free",), parts.l1.free_pages


def _capacity(parts: CacheParts) -> Iterator[Sample]:
    if parts.l1 is not None:
        yield ("l1",), parts.l1.capacity
    if parts.manager is not None:
        yield ("l2",), parts.manager.num_slots
    l3 = getattr(parts.backend, "capacity_pages", None)
    if l3 is not None:  # backends with a capacity of their own (file with capacity_bytes, memory, simulated)
        yield ("l3",), l3


def _l2_resident(parts: CacheParts) -> Iterator[Sample]:
    if parts.manager is not None:
        yield (), parts.manager.index.resident_count


def _queue_depth(parts: CacheParts) -> Iterator[Sample]:
    if parts.controller is not None:
        for direction, depth in parts.controller.queue_depths().items():
            yield (direction,), depth


def _in_flight(parts: CacheParts) -> Iterator[Sample]:
    if parts.controller is not None:
        for direction, nbytes in parts.controller.bytes_in_flight().items():
            yield (direction,), nbytes


def _in_flight_limit(parts: CacheParts) -> Iterator[Sample]:
    if parts.controller is not None:
        limits = parts.controller.limits
        yield ("read",), limits.max_read_bytes_in_flight
        yield ("write",), limits.max_write_bytes_in_flight


def _backend_up(parts: CacheParts) -> Iterator[Sample]:
    if parts.controller is not None:
        yield (parts.backend_label,), 0 if parts.controller.degraded else 1


def _controller_by_backend(attr: str) -> Callable[[CacheParts], Iterator[Sample]]:
    def read(parts: CacheParts) -> Iterator[Sample]:
        if parts.controller is not None:
            yield (parts.backend_label,), getattr(parts.controller.stats, attr)
    return read


def _prefetch_seconds(parts: CacheParts) -> Iterator[Any]:
    if parts.manager is not None:
        stats = parts.manager.stats
        yield (), (stats.prefetches_completed, stats.prefetch_seconds_sum)


_DIR = {"read": "reads", "write": "writes"}

METRICS: tuple[Metric, ...] = (
    # hits and misses per tier, as served (the engine-side L1 prefix cache counts them)
    Metric("tiered_kv_requests", "counter", (), "Requests run through the L1 prefix cache.",
           _field("l1_stats", "requests")),
    Metric("tiered_kv_hit_pages", "counter", ("tier",),
           "Full prompt pages served by the tier (L1: already there; L2 / L3: loaded from it).",
           lambda p: _l1_pages(p, 1, True)),
    Metric("tiered_kv_miss_pages", "counter", ("tier",),
           "Full prompt pages asked of the tier (not served by a tier above it) that it did not serve.",
           lambda p: _l1_pages(p, 1, False)),
    Metric("tiered_kv_hit_tokens", "counter", ("tier",), "Prompt tokens served by the tier (hit pages x page size).",
           _tokens(True)),
    Metric("tiered_kv_miss_tokens", "counter", ("tier",),
           "Prompt tokens asked of the tier that it did not serve (miss pages x page size).", _tokens(False)),
    Metric("tiered_kv_computed_pages", "counter", (), "Pages the engine computed (prefill) because no tier had them.",
           _field("l1_stats", "computed_pages")),
    # the scheduler side (manager): lookups and what they decided
    Metric("tiered_kv_lookups", "counter", (), "Lookups that decided a hit length.", _field("manager", "lookups")),
    Metric("tiered_kv_lookups_pending", "counter", (), "Lookup answers 'not yet' (L3's exists was still out).",
           _field("manager", "lookups_pending")),
    Metric("tiered_kv_lookup_hit_pages", "counter", ("tier",),
           "Pages the lookups found on L2 / L3 beyond the engine's own L1 hit (before loading).",
           _lookup_hits),
    Metric("tiered_kv_below_min_hit", "counter", (), "Lookups whose hit was shorter than min_hit_tokens (recomputed).",
           _field("manager", "below_min_hit")),
    Metric("tiered_kv_agree_timeouts", "counter", (), "Lookups whose ranks did not agree before the deadline.",
           _field("manager", "agree_timeouts")),
    # prefetches L3 -> L2
    Metric("tiered_kv_prefetches_started", "counter", (), "Prefetches L3 -> L2 started.",
           _field("manager", "prefetches_started")),
    Metric("tiered_kv_prefetches_ended", "counter", ("outcome",),
           "Prefetches ended: completed (landed), cancelled before reading, timed_out (request ran first).",
           _by_label("manager", {"completed": "prefetches_completed", "cancelled": "prefetches_cancelled",
                                 "timed_out": "prefetches_timed_out"})),
    Metric("tiered_kv_prefetch_pages", "counter", ("outcome",),
           "Pages of completed prefetches: landed on L2, or missing (gone from L3 since the lookup).",
           _by_label("manager", {"landed": "prefetch_pages_landed", "missing": "prefetch_pages_missing"})),
    Metric("tiered_kv_prefetch_seconds", "summary", (), "Time from a prefetch's start to its completion.",
           _prefetch_seconds),
    # stores and evictions
    Metric("tiered_kv_l2_store_pages", "counter", ("outcome",),
           "Pages stored L1 -> L2: stored (resident), failed, skipped (no L2 slot free).",
           _by_label("manager", {"stored": "stores", "failed": "stores_failed", "skipped": "stores_skipped"})),
    Metric("tiered_kv_l3_put_pages", "counter", ("outcome",), "Pages put L2 -> L3: stored, or refused by the backend.",
           _by_label("manager", {"stored": "l3_puts", "refused": "l3_puts_failed"})),
    Metric("tiered_kv_load_pages", "counter", (), "Pages planned for loading L2 -> L1.", _field("manager", "load_pages")),
    Metric("tiered_kv_evictions", "counter", ("tier",),
           "Pages evicted from the tier (L3: where the backend evicts for room itself: file, memory, simulated).",
           _evictions),
    # bytes and bandwidth
    Metric("tiered_kv_transfer_bytes", "counter", ("tier", "direction"),
           "Bytes moved between the tier and the one above it: read = towards L1 (loads, prefetches), "
           "write = into the tier (stores, backups). L2 counts page payloads, L3 stored records.",
           _transfer_bytes),
    Metric("tiered_kv_transfer_seconds", "counter", ("tier", "direction"),
           "Busy seconds of the tier's transfers (summed over concurrent calls); bandwidth = rate(bytes) / "
           "rate(seconds).", _transfer_seconds),
    # the L3 controller
    Metric("tiered_kv_l3_queue_depth", "gauge", ("direction",), "L3 jobs waiting per direction.", _queue_depth),
    Metric("tiered_kv_l3_in_flight_bytes", "gauge", ("direction",), "Record bytes of the L3 jobs running now.",
           _in_flight),
    Metric("tiered_kv_l3_in_flight_limit_bytes", "gauge", ("direction",),
           "The controller's limit on record bytes in flight per direction.", _in_flight_limit),
    Metric("tiered_kv_l3_jobs_started", "counter", ("direction",), "L3 jobs (exists, get, put batches) started.",
           _by_label("controller", {d: f"{_DIR[d]}_started" for d in DIRECTIONS})),
    Metric("tiered_kv_l3_jobs_completed", "counter", ("direction",), "L3 jobs completed.",
           _by_label("controller", {d: f"{_DIR[d]}_completed" for d in DIRECTIONS})),
    Metric("tiered_kv_l3_reads_cancelled", "counter", (), "L3 reads cancelled before they started.",
           _field("controller", "reads_cancelled")),
    Metric("tiered_kv_l3_reads_degraded", "counter", (), "L3 reads answered 'miss' at once because the tier was degraded.",
           _field("controller", "reads_degraded")),
    Metric("tiered_kv_l3_writes_refused", "counter", (), "L3 writes refused (queue full) or dropped (close, retries spent).",
           _field("controller", "writes_refused")),
    Metric("tiered_kv_l3_reads_refused", "counter", (), "L3 reads answered 'miss' at once because the read queue was full.",
           _field("controller", "reads_refused")),
    Metric("tiered_kv_l3_pages", "counter", ("direction",), "Pages moved by L3 reads (gets) and writes (puts).",
           _by_label("controller", {"read": "pages_read", "write": "pages_written"})),
    # backend health
    Metric("tiered_kv_backend_up", "gauge", ("backend",), "1 while the L3 backend serves, 0 while the tier is degraded.",
           _backend_up),
    Metric("tiered_kv_backend_retries", "counter", ("backend",), "L3 writes retried after a backend error.",
           _controller_by_backend("writes_retried")),
    Metric("tiered_kv_backend_degraded_episodes", "counter", ("backend",), "Times the L3 tier went degraded.",
           _controller_by_backend("degraded_episodes")),
    Metric("tiered_kv_backend_recoveries", "counter", ("backend",), "Times the health probe brought the tier back.",
           _controller_by_backend("recoveries")),
    Metric("tiered_kv_backend_failures", "counter", ("backend",),
           "Backend errors the controller saw (calls and health probes).", _controller_by_backend("backend_errors")),
    # the backend's own record counts
    Metric("tiered_kv_backend_hits", "counter", ("backend",), "Records the backend read and verified.",
           _backend_field("hits")),
    Metric("tiered_kv_backend_misses", "counter", ("backend",), "Keys the backend read as misses (corrupt and foreign included).",
           _backend_field("misses")),
    Metric("tiered_kv_backend_corrupt_records", "counter", ("backend",),
           "Damaged, truncated, unreadable or misplaced (another page's) records read "
           "(deleted while the medium holds them as read).", _backend_field("corrupt")),
    Metric("tiered_kv_backend_foreign_records", "counter", ("backend",),
           "Intact records of another spec, or values that are no record (left in place).",
           _backend_field("foreign")),
    Metric("tiered_kv_backend_forged_records", "counter", ("backend",),
           "Records without a valid tag of the pool's record key: forged or tampered with (deleted; docs/security.md).",
           _backend_field("forged")),
    Metric("tiered_kv_backend_puts", "counter", ("backend",), "Records the backend stored.", _backend_field("puts")),
    Metric("tiered_kv_backend_puts_rejected", "counter", ("backend",), "Puts the backend refused (no room).",
           _backend_field("put_rejected")),
    Metric("tiered_kv_backend_read_bytes", "counter", ("backend",), "Record bytes the backend read.",
           _backend_field("bytes_read")),
    Metric("tiered_kv_backend_written_bytes", "counter", ("backend",), "Record bytes the backend wrote.",
           _backend_field("bytes_written")),
    Metric("tiered_kv_backend_errors", "counter", ("backend",), "Backend calls that failed.", _backend_field("errors")),
    # occupancy
    Metric("tiered_kv_l2_slots", "gauge", ("state",), "L2 slots free or held (resident pages, prefetches, stores).",
           _l2_slots),
    Metric("tiered_kv_l2_resident_pages", "gauge", (), "Pages resident on L2 (verifiable, evictable when unlocked).",
           _l2_resident),
    Metric("tiered_kv_l1_pages", "gauge", ("state",), "L1 prefix cache pages used or free.", _l1_pages_state),
    Metric("tiered_kv_capacity_pages", "gauge", ("tier",),
           "Capacity of the tier in pages (L3: where the backend has one: file with capacity_bytes, memory, simulated).",
           _capacity),
)


class CacheCollector:
    """A ``prometheus_client`` collector over one cache instance's parts (read at scrape time)."""

    def __init__(self, parts: CacheParts) -> None:
        self.parts = parts

    def describe(self) -> list[Any]:
        # Registration checks names through describe(): families without samples, no stats read.
        return [_family(m, empty=True) for m in METRICS]

    def collect(self) -> Iterator[Any]:
        for metric in METRICS:
            family = _family(metric)
            samples = list(metric.read(self.parts))
            if not samples:
                continue
            for labels, value in samples:
                _ADD[metric.type](family, labels, value)
            yield family


def _prom() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError("metrics need prometheus_client: install the 'metrics' extra "
                          "(pip install 'tiered-kv[metrics]')") from None
    return prometheus_client


def _family(m: Metric, empty: bool = False) -> Any:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

    cls = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "summary": SummaryMetricFamily}[m.type]
    return cls(m.name, m.help, labels=list(m.labels))


_ADD: dict[str, Callable[[Any, tuple[str, ...], Any], None]] = {
    "counter": lambda f, labels, v: f.add_metric(list(labels), float(v)),
    "gauge": lambda f, labels, v: f.add_metric(list(labels), float(v)),
    "summary": lambda f, labels, v: f.add_metric(list(labels), count_value=v[0], sum_value=float(v[1])),
}


def cache_parts(*, l1: Any = None, manager: Any = None, controller: Any = None, worker: Any = None) -> CacheParts:
    """The parts, completed from each other (an L1 prefix cache knows its manager and worker, a
    manager its controller)."""
    if manager is None and l1 is not None:
        manager = l1.manager
    if worker is None and l1 is not None:
        worker = getattr(l1, "worker", None)
    if controller is None and manager is not None:
        controller = getattr(getattr(manager.l3, "link", None), "controller", None)  # the worker side's, in this process
    if l1 is None and manager is None and controller is None:
        raise ConfigError("metrics: give at least one of l1=, manager=, controller=")
    return CacheParts(l1=l1, manager=manager, controller=controller, worker=worker)


def cache_registry(**parts: Any) -> Any:
    """A ``CollectorRegistry`` of its own holding one ``CacheCollector`` over these parts."""
    prom = _prom()
    registry = prom.CollectorRegistry(auto_describe=True)
    registry.register(CacheCollector(cache_parts(**parts)))
    return registry


def exposition(registry: Any) -> str:
    """The registry's current metrics in the text format (what a scrape returns)."""
    return _prom().generate_latest(registry).decode()


class MetricsServer:
    """An HTTP server (a daemon thread) answering ``/metrics`` from one registry; ``close()`` stops it."""

    def __init__(self, server: Any, thread: Any) -> None:
        self._server = server
        self._thread = thread
        self.host, self.port = server.server_address[:2]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
        self._server = None

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_address(host: Any, port: Any) -> tuple[str, int]:
    """``host`` an IP address, ``port`` an int in 0..65535 (0: any free port), else ConfigError."""
    if not isinstance(host, str):
        raise ConfigError(f"metrics host must be an IP address, got {host!r}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"metrics host must be an IP address (127.0.0.1, 0.0.0.0, ::1), got {host!r}") from None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"metrics port must be an int in 0..65535, got {port!r}")
    return host, port


def serve_metrics(registry: Any, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> MetricsServer:
    """Serve ``registry`` on ``http://host:port/metrics`` until ``close()``; ConfigError for a
    malformed address, MetricsServerError when it cannot be bound (in use, not this machine's)."""
    host, port = check_address(host, port)
    prom = _prom()
    try:
        server, thread = prom.start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise MetricsServerError(f"metrics: cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    return MetricsServer(server, thread)


def metric_names() -> list[str]:
    """Every metric family name as scraped (counters with ``_total``)."""
    return [m.exposed_name for m in METRICS]


__all__ = ["BACKEND_LABELS", "CacheCollector", "CacheParts", "DEFAULT_HOST", "DEFAULT_PORT", "METRICS",
           "Metric", "MetricsServer", "cache_parts", "cache_registry", "check_address", "exposition",
           "metric_names", "serve_metrics"]
