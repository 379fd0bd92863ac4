"""The composition root: the one place that builds a whole hierarchy from one settings value.

``ReplaySettings`` says what to build: the spec, each tier's capacity in pages, the L3 (a backend
URL, or None for a ``file://`` store in a temporary directory), the policies and the controller's
limits, and whether bytes move. ``build(settings)`` returns a ``Hierarchy``: the real parts wired
as an engine would wire them (``L1PrefixCache`` over a device pool, ``CacheManager`` over a
``HostPool``, ``L3Controller`` over the backend, ``TransferHalf`` between L1 and L2), or, for
``simulate``, the same index, policies and capacities with no memory reserved for any tier: a bare
``SlotAllocator`` for L2, ``NullTransferHalf``, the key-only ``SimulatedL3``, no fill / verify.
``tiered_kv.config`` turns a config file into settings (``replay_settings``); the replay, the
benchmarks and an engine of one's own build from here. Nothing else wires parts together.

``embedded_default()`` is what ``tiered-kv replay`` runs with no config and no sizing flags: a
two-layer DeepSeek-V3.2-shaped NSA spec (page 64), L1 on the GPU when there is one, else the CPU,
L2 in RAM, L3 a file store in a temporary directory (removed on close), sized below the default
chat workload's working set so that every tier serves hits.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import ConfigError
from .hierarchy import (CacheManager, ControllerLimits, L1PrefixCache, L3Controller, NullTransferHalf, Policies,
                         PrefetchPolicy, TransferHalf)
from .model.keys import Namespace
from .model.record_key import RecordKey
from .ops.plan import plan_tiers, record_bytes, slot_bytes
from .model.slot_allocator import SlotAllocator
from .model.spec import KVSpec, nsa_spec
from .backends.simulated import SimulatedL3

#: The embedded default's tiers, in pages of its spec (the default chat workload touches about
#: 1,300 distinct pages: L1 holds an eighth of them, L2 a third, L3 all).
DEFAULT_PAGES = {"l1": 160, "l2": 448, "l3": 8192}
DEFAULT_MODEL = "embedded-nsa-2l"


def default_spec() -> KVSpec:
    """DeepSeek-V3.2's per-layer page (fp8 latent + indexer keys, 64 tokens) over 2 layers."""
    return nsa_spec(num_layers=2, page_size=64, latent_dtype="fp8")


def default_policies() -> Policies:
    # The replay waits for its prefetches: a hit read from L3 is used, not dropped because the
    # scheduler ran first, so the hits per tier do not depend on how fast the machine is.
    return Policies(prefetch=PrefetchPolicy.WAIT_COMPLETE)


@dataclass(frozen=True)
class ReplaySettings:
    """Everything ``build`` needs. Capacities are in pages of ``spec``."""

    spec: KVSpec = field(default_factory=default_spec)
    model: str = DEFAULT_MODEL  # the namespace's model name (page keys depend on it)
    l1_pages: int = DEFAULT_PAGES["l1"]
    l2_pages: int = DEFAULT_PAGES["l2"]
    l3_pages: int = DEFAULT_PAGES["l3"]
    l3_url: str | None = None  # None: a file:// store in a temporary directory
    policies: Policies = field(default_factory=default_policies)
    limits: ControllerLimits = ControllerLimits()
    host_layout: str = "page_first"
    device: str | None = None  # None: "cuda" when available, else "cpu"
    simulate: bool = False
    verify: bool = True  # fill computed pages with oracle bytes and check every loaded page
    tenant: str = ""  # the namespace's tenant salt: tenants sharing L3 get other page keys
    record_key: RecordKey | None = None  # keyed record tags (docs/security.md); None: plain checksums
    # The worker side (L1 and L2 memory, every byte move, the L3 controller) in a child process,
    # the scheduler side here: jobs and results over a multiprocessing pipe.
    worker_process: bool = False

    def __post_init__(self) -> None:
        for name in ("l1_pages", "l2_pages", "l3_pages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"replay: {name} must be an int > 0, got {value!r}")
        if self.l3_url is not None and self.simulate:
            raise ConfigError("replay --simulate moves no bytes and uses no L3 backend; drop the L3 URL")
        if self.worker_process and self.simulate:
            raise ConfigError("replay --simulate moves no bytes: there is no worker side to put in a process of its own")

    def with_sizes(self, *, gpu_bytes: int | None = None, host_bytes: int | None = None,
                   disk_bytes: int | None = None) -> "ReplaySettings":
        """The same settings with the tiers given in bytes turned into pages the way ``plan`` does
        (L1 in page payloads, L2 and L3 in padded slots); None keeps a tier as it is."""
        tiers = plan_tiers(self.spec, gpu_bytes=gpu_bytes or 0, host_bytes=host_bytes or 0, disk_bytes=disk_bytes or 0)
        changes: dict[str, int] = {}
        for flag, given, tier, name in (("--gpu-mem", gpu_bytes, tiers[0], "l1_pages"),
                                        ("--host-mem", host_bytes, tiers[1], "l2_pages"),
                                        ("--disk", disk_bytes, tiers[2], "l3_pages")):
            if given is None:
                continue
            if tier.pages <= 0:
                raise ConfigError(f"{flag} {given:,} B holds no page of {tier.bytes_per_page:,} B "
                                  f"({self.model}, page size {self.spec.page_size})")
            changes[name] = tier.pages
        batch = self.limits.batch_pages
        if host_bytes is not None and tiers[1].pages < batch:  # as the config refuses l2.size
            raise ConfigError(f"--host-mem {host_bytes:,} B holds {tiers[1].pages} pages of {tiers[1].bytes_per_page:,} B, "
                              f"fewer than one controller batch (controller.batch_pages = {batch})")
        return replace(self, **changes)


def embedded_default(**changes: Any) -> ReplaySettings:
    return replace(ReplaySettings(), **changes)


def embedded_config() -> dict[str, Any]:
    """The embedded default as config keys: what ``tiered-kv replay`` and ``tiered-kv config show``
    start from when no config file is given, under the ``TIERED_KV_*`` environment and the flags
    (``load_config(..., defaults=embedded_config())``). The same spec, tiers (in bytes that hold
    exactly ``DEFAULT_PAGES``), namespace name and prefetch policy as ``embedded_default()``."""
    spec = default_spec()
    return {
        "spec": {"kind": spec.kind, "layers": spec.num_layers, "page_size": spec.page_size,
                 "latent_dtype": dict(spec.dims)["latent_dtype"], "name": DEFAULT_MODEL},
        "l1": {"size": DEFAULT_PAGES["l1"] * spec.page_bytes},
        "l2": {"size": DEFAULT_PAGES["l2"] * slot_bytes(spec)},
        "l3": {"size": DEFAULT_PAGES["l3"] * slot_bytes(spec)},
        "policies": {"prefetch": default_policies().prefetch.value},
    }


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class Hierarchy:
    """The built parts; ``close()`` frees every tier and removes a temporary L3 directory."""

    def __init__(self, settings: ReplaySettings) -> None:
        self.settings = settings
        spec = settings.spec
        self.spec = spec
        self.namespace = Namespace.for_spec(spec, settings.model, tenant_salt=settings.tenant)
        self.device_pool: Any = None
        self.host_pool: Any = None
        self.tempdir: str | None = None
        self.l3_url: str | None = None
        self.controller: L3Controller | None = None
        self.manager: CacheManager | None = None
        self.l1: L1PrefixCache | None = None
        self.fill_seconds = 0.0
        self.verify_seconds = 0.0
        self._closed = False
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        s, spec = self.settings, self.spec
        if s.simulate:
            self.allocator: Any = SlotAllocator(s.l2_pages)
            self.controller = L3Controller(SimulatedL3(s.l3_pages), record_bytes=record_bytes(spec), limits=s.limits)
            self.worker: Any = NullTransferHalf()
            self.manager = CacheManager(self.allocator, page_size=spec.page_size, policies=s.policies, l3=self.controller)
            self.l1 = L1PrefixCache(s.l1_pages, self.manager, self.worker)
            return
        if s.worker_process:
            self._build_split()
            return
        import torch  # the worker side only

        from . import HostPool, allocate_engine_like
        from .backends import open_backend
        from .hierarchy.oracle import fill_pages, verify_pages

        device = s.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = device
        needed = s.l2_pages * slot_bytes(spec) + (s.l1_pages * spec.page_bytes if device == "cpu" else 0)
        memory = _physical_memory()
        if memory is not None and needed > 0.8 * memory:
            raise ConfigError(f"replay: L1 and L2 would take {needed / 2**30:.1f} GiB of this machine's "
                              f"{memory / 2**30:.1f} GiB of RAM; use --simulate for sizes this large")
        self.device_pool = allocate_engine_like(spec, s.l1_pages + 1, device=device, reserved_pages=(0,))
        self.host_pool = HostPool(spec, s.l2_pages, s.host_layout, record_key=s.record_key)
        self.allocator = self.host_pool
        url = s.l3_url
        if url is None:
            self.tempdir = tempfile.mkdtemp(prefix="tiered-kv-replay-")
            url = f"file://{self.tempdir}?capacity_bytes={s.l3_pages * self.host_pool.slot_bytes}"
        self.l3_url = url
        host = self.host_pool
        self.controller = L3Controller(lambda: open_backend(url, host), record_bytes=host.record_bytes, limits=s.limits)
        self.worker = TransferHalf(self.device_pool, host)
        self.manager = CacheManager(host, page_size=spec.page_size, policies=s.policies, l3=self.controller)
        dev = self.device_pool
        fill = verify = None
        if s.verify:
            import time

            def fill(keys: list[str], pages: list[int]) -> None:
                t0 = time.perf_counter()
                fill_pages(dev, keys, pages)
                self.fill_seconds += time.perf_counter() - t0

            def verify(keys: list[str], pages: list[int]) -> list[bool]:
                t0 = time.perf_counter()
                try:
                    return verify_pages(dev, keys, pages)
                finally:
                    self.verify_seconds += time.perf_counter() - t0
        self.l1 = L1PrefixCache(dev.num_pages, self.manager, self.worker, reserved=dev.reserved_pages,
                                fill=fill, verify=verify)

    def _build_split(self) -> None:
        """The scheduler side here (manager over a bare ``SlotAllocator``, ``L3Jobs`` over a
        ``PipeLink``, the L1 prefix cache over ``JobTransferHalf``); every byte in the child."""
        import time

        from .hierarchy.job_transfers import JobTransferHalf
        from .hierarchy.l3_jobs import L3Jobs
        from .hierarchy.process_link import ChildController, PipeLink, stack_worker

        s, spec = self.settings, self.spec
        self.device = s.device or "cpu"
        url = s.l3_url
        if url is None:
            self.tempdir = tempfile.mkdtemp(prefix="tiered-kv-replay-")
            url = f"file://{self.tempdir}?capacity_bytes={s.l3_pages * slot_bytes(spec)}"
        self.l3_url = url
        link = PipeLink(stack_worker, spec, s.l2_pages, s.l1_pages, url, {}, s.limits, self.device)
        jobs = L3Jobs(link, limits=s.limits)
        self.allocator = SlotAllocator(s.l2_pages)
        self.manager = manager = CacheManager(self.allocator, page_size=spec.page_size, policies=s.policies, l3=jobs)
        self.controller = ChildController(jobs)  # type: ignore[assignment]
        self.worker = JobTransferHalf(jobs, page_bytes=spec.page_bytes,
                                      on_failed_store=lambda plan: manager.complete_store(plan, False))
        fill = verify = None
        if s.verify:
            def fill(keys: list[str], pages: list[int]) -> None:
                t0 = time.perf_counter()
                link.call("fill", list(keys), list(pages))
                self.fill_seconds += time.perf_counter() - t0

            def verify(keys: list[str], pages: list[int]) -> list[bool]:
                t0 = time.perf_counter()
                try:
                    return link.call("verify", list(keys), list(pages))
                finally:
                    self.verify_seconds += time.perf_counter() - t0
        self.l1 = L1PrefixCache(s.l1_pages + 1, manager, self.worker, reserved=(0,), fill=fill, verify=verify)

    @property
    def simulate(self) -> bool:
        return self.settings.simulate

    @property
    def l2_free_slots(self) -> int:
        """Free L2 slots now (all of them once closed: nothing leaked)."""
        count = getattr(self.allocator, "free_slots", None)
        return count if count is not None else self.allocator.free_count

    def settle(self) -> None:
        """Wait for every copy and L3 write in flight and hand their outcomes to the hierarchy, so
        that what it decides next depends on the calls made so far, not on how fast they ran: a
        store still copying is not resident on L2, a put still running pins its page on L2 and is
        not on L3, a slot still read by a load is not free."""
        assert self.l1 is not None and self.manager is not None
        if getattr(self, "device", "cpu") != "cpu" and not self.settings.worker_process:  # a child's copies: drained below
            import torch

            torch.cuda.synchronize(self.device)
        self.l1.drain_stores()
        self.l1.poll()
        self.manager.wait_idle()
        self.l1.poll()

    def close(self) -> None:
        """Abort open requests, finish stores and L3 work, close the controller and the backend,
        free the host pool and remove a temporary L3 directory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.l1 is not None:
                self.l1.close()  # closes the manager, which closes the controller
            elif self.manager is not None:
                self.manager.close()
            elif self.controller is not None:
                self.controller.close()
        finally:
            if self.tempdir is not None:
                shutil.rmtree(self.tempdir, ignore_errors=True)

    def release_memory(self) -> None:
        """Give the host pool's memory back (after ``close`` and any check of its free slots)."""
        if self.host_pool is not None:
            self.host_pool.close()

    def __enter__(self) -> "Hierarchy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self.release_memory()


def build(settings: ReplaySettings) -> Hierarchy:
    return Hierarchy(settings)


__all__ = ["DEFAULT_PAGES", "Hierarchy", "ReplaySettings", "build", "default_policies", "default_spec",
           "embedded_config", "embedded_default"]
