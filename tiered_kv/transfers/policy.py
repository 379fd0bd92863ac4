"""How the transfer engine splits a copy between paths: the measured policy, apart from the mechanics.

``TransferEngine`` issues copies; this module decides which path (``choose_path``: by direction,
host-slot runs, host layout and single layer), how a load through the copy engines shares its
bytes between copy engines and the UVA kernel (``choose_split``: ``LoadSplit`` and the tables
below; conditions: a backup in flight, scattered slots, a model computing beside the load), how a
``mixed`` backup is split (``choose_backup_split``) and from which thread a load is issued
(``issue_threads``); ``TransferOptions`` holds the knobs that override them. Every number here was
chosen by a measurement on the H200 recorded in docs/benchmarks.md, section "Transfers on the
H200"; change them only with a new measurement.
Pure CPU logic on CPU id tensors: nothing here touches a device.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..errors import ConfigError
from ..model.integers import as_int

PATHS = ("auto", "kernel", "direct", "batch", "staged", "mixed", "torch")

#: Stream priority of loads (``TransferEngine(high_priority_loads=True)``): below any device's
#: range, which torch maps to the device's highest priority.
LOAD_STREAM_PRIORITY = -100


def _fraction(value_of, name: str, *, optional: bool) -> None:
    """Field ``name`` of a frozen options value: a real number in [0, 1] (no bool, no text), kept
    as a float; None where ``optional``. ConfigError naming the field otherwise."""
    value = getattr(value_of, name)
    if value is None and optional:
        return
    kind = type(value_of).__name__
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{kind}.{name} must be a number in [0, 1], got {value!r}: {value_of}")
    object.__setattr__(value_of, name, float(value))


def _flag(value_of, name: str) -> None:
    """Field ``name``: True or False (no 0 / 1, no text); ConfigError naming the field otherwise."""
    if not isinstance(getattr(value_of, name), bool):
        raise ConfigError(f"{type(value_of).__name__}.{name} must be True or False: {value_of}")


def _count(value_of, name: str, *, low: int, optional: bool, high: int | None = None) -> None:
    """Field ``name``: an int in ``low..high`` (``as_int``: numpy ints and 0-d integer tensors
    too, never bools or floats), kept as a Python int; None where ``optional``."""
    value = getattr(value_of, name)
    if value is None and optional:
        return
    count = as_int(value)
    if count is None or count < low or (high is not None and count > high):
        span = f"in {low}..{high}" if high is not None else f">= {low}"
        raise ConfigError(f"{type(value_of).__name__}.{name} must be an int {span}, got {value!r}: {value_of}")
    object.__setattr__(value_of, name, count)


#: ``LoadSplit``'s counts: (lowest, may be None).
_SPLIT_COUNTS = {
    "layers_per_copy": (1, False), "kernel_blocks": (1, False), "head_layers": (0, False),
    "staging_ctas": (1, True), "ramp_step": (1, True), "lead_blocks": (1, False), "head_ramp_step": (1, True),
    "plan_wave": (1, True), "minor_layers_per_copy": (1, True), "minor_lead_groups": (0, False),
}


@dataclass(frozen=True)
class LoadSplit:
    """How a ``mixed`` load shares its bytes between the copy engines and the UVA kernel.

    by: ``"pages"`` sends the first ``ce_fraction`` of the pages (in host-slot order) through the
        copy engines and the rest through the kernel; ``"components"`` sends every page's largest
        component (NSA: the 42 KB latent) through the copy engines and the others (the 8 KB
        indexer) through the kernel, so no copy engine moves small pitched rows (specs with one
        component, or components of one size, fall back to ``"pages"`` with ``ce_fraction``).
    staging_ctas: CTAs of the staging scatter (None: the copier's).
    ce_path: how the copy-engine part moves: ``"staged"`` (2-D copies into the staging ring, then
        a scatter kernel) or ``"batch"`` (one ``cudaMemcpyBatchAsync`` per layer, straight into
        the device pages: no staging hop, more CPU per layer).
    layers_per_copy: adjacent layers the staged part moves as one group; with ``"components"``
        and ``page_first`` slots (components layer-major) that is one ``layers_per_copy`` x 42 KB
        row per slot and copy instead of one 42 KB row per layer. The events of a block's layers
        are recorded once the whole block landed, so the first layers are ready later.
    ramp: blocks grow 1, 2, 4, ... layers up to ``layers_per_copy`` (and ``kernel_blocks``), so
        the first layers are ready after one layer's copy (a model waiting on layer 0 starts
        early) and the rest move in wide rows / few launches.
    kernel_blocks: adjacent layers the UVA kernel part (and the ``kernel`` path) moves in one
        launch; a block's layers are ready together.
    ramp_step: with ``ramp``, the block starting at the load's layer index j has
        ``1 + j // ramp_step`` layers (up to the block size) instead of doubling: a model
        consuming layers about as fast as they land reaches a block's first layer only a little
        after the block started, so blocks may only grow as fast as the load gets ahead (None: 1,
        2, 4, ...).
    head_layers: the load's first layers go through the UVA kernel from the caller's thread
        before anything else of the load is planned or issued, so layer 0 lands about one
        layer's copy after the call (the model waits for it anyway: the kernel's SMs cost it
        nothing then); the rest follows on its path, its copies ordered after the head's.
    lead_blocks: blocks of a staged copy-engine part that are each planned and enqueued by a
        call of their own before the rest go in one call (planned whole, or in waves with
        ``plan_wave``): copying starts while the issuing thread plans what follows; each call
        costs a sort of the ids and a table upload.
    head_ramp_step: the head's kernel blocks grow by one layer every this many layers (None:
        ``ramp_step``); the body's blocks continue ``ramp_step``'s ramp from the head's end either
        way. Beside the model the head lands about as fast as the model consumes it, so a head
        block of two layers keeps the model waiting about one layer's copy at its first layer.
    plan_wave: every call of a staged copy-engine part into the staging ring (the lead blocks'
        calls and the rest's) plans, uploads and enqueues its blocks in waves of this many blocks,
        then twice as many each time, instead of planning every block before its first copy
        (None); the uploads then go on the ring's own stream. Planned whole, the body's later
        blocks kept the link idle for milliseconds while only its first block was copying.
    minor_layers_per_copy: where the copy engines take every component of a page (``by``
        ``"pages"``), the smaller components (NSA: the 8 KB indexer rows) of a staged copy-engine
        part move in blocks of this many adjacent layers of the load, each block with the staged
        group of its first layer (None: with their own layer, like the largest component). In a
        ``page_first`` slot a component's layers lie side by side, so a block is one wide row per
        slot (8 layers: 67 KB) instead of one 8 KB row per layer, which the copy engines move
        slowly; the largest component keeps its groups (``layers_per_copy``), so its layers are
        still ready one by one. A block's rows land with its first layer, before any of its
        layers is ready, and the layers after it are ready as their largest component lands.
    minor_lead_groups: with ``minor_layers_per_copy``, each block goes this many staged groups
        ahead of its first layer's (as far as the load's first group): that layer's group then
        carries only its own rows, so a model waiting on it does not wait for the block's too.
    """

    ce_fraction: float = 1.0
    by: str = "pages"
    staging_ctas: int | None = None
    layers_per_copy: int = 1
    ce_path: str = "staged"
    ramp: bool = False
    kernel_blocks: int = 1
    ramp_step: int | None = None
    head_layers: int = 0
    lead_blocks: int = 1
    head_ramp_step: int | None = None
    plan_wave: int | None = None
    minor_layers_per_copy: int | None = None
    minor_lead_groups: int = 0

    def __post_init__(self) -> None:
        # Types first, so the range checks below compare numbers: counts are ints (``as_int``),
        # kept as Python ints.
        _fraction(self, "ce_fraction", optional=False)
        for name, (low, optional) in _SPLIT_COUNTS.items():
            _count(self, name, low=low, optional=optional)
        _flag(self, "ramp")
        if self.ramp_step is not None and not self.ramp:
            raise ConfigError(f"LoadSplit.ramp_step applies to a ramp: set ramp=True as well: {self}")
        if self.by not in ("pages", "components"):
            raise ConfigError(f"LoadSplit.by must be 'pages' or 'components': {self}")
        if self.ce_path not in ("staged", "batch"):
            raise ConfigError(f"LoadSplit.ce_path must be 'staged' or 'batch': {self}")
        if self.minor_layers_per_copy is not None and (self.by != "pages" or self.ce_path != "staged"):
            raise ConfigError("LoadSplit.minor_layers_per_copy applies where a staged copy-engine part takes every "
                              f"component (by='pages', ce_path='staged'): {self}")
        if self.minor_lead_groups and self.minor_layers_per_copy is None:
            raise ConfigError(f"LoadSplit.minor_lead_groups applies to minor blocks: set minor_layers_per_copy as well: {self}")


#: Loads of several layers start with a head: the first 8 layers through the UVA kernel from the
#: caller's thread, in blocks that grow by a layer every 5 layers, the rest ordered after it. Layer
#: 0 then lands about 2 ms after the call instead of 4, and beside the model's matmuls more of the
#: load is hidden, at about 1% of idle rate.
HEAD = {"head_layers": 8, "ramp": True, "ramp_step": 5}
#: Blocks of a head that the caller's thread launches when the rest of the load goes to library
#: threads (a second thread launches the rest of the head, the first plans the body once they are
#: launched): a model waiting on layer 0 can start only once ``load`` has returned, and with the
#: caller's first two blocks the model no longer waits at layer 1 for the second.
CALLER_HEAD_BLOCKS = 2
#: The staged bodies of idle loads plan, upload and enqueue their blocks in waves from one block
#: (``LoadSplit.plan_wave``), so the first blocks copy while the rest are planned.
WAVES = {"plan_wave": 1}
#: The staging scatter of ``layer_first`` loads of several layers with slots in runs takes 16 CTAs
#: instead of the copier's 4: it finishes each block four times sooner, and beside the model's
#: matmuls the time a scatter holds SMs is what the matmuls lose. ``page_first`` keeps the copier's
#: 4, with which its idle loads are faster.
STAGING_SCATTER_CTAS = {"staging_ctas": 16}
#: ``page_first`` loads of several layers with slots in runs while the model computes beside them
#: (``TransferOptions.beside_compute``): after the head, the copy engines take every component, the
#: indexer rows in blocks of 8 layers (one 67 KB row per slot instead of eight 8 KB rows), each
#: block one staged group ahead of its first layer's, and the staging scatter takes 32 CTAs.
#: ``MIXED_LOADS``' split has the UVA kernel move every indexer row, holding SMs for the whole
#: load; this one hides more of the load beside the matmuls but is 2-3% slower idle, so it is the
#: split for loads beside the model, not the default.
PITCHED_RUNS_LOADS = LoadSplit(1.0, **HEAD, **WAVES, minor_layers_per_copy=8, minor_lead_groups=1, staging_ctas=32)
#: Loads of several layers with slots in runs beside the model's compute, by dense host rows (the
#: rest as ``MIXED_LOADS``: its ``layer_first`` split already hides the load beside the model).
BESIDE_COMPUTE_LOADS = {False: PITCHED_RUNS_LOADS}
#: ``mixed`` loads by (host rows dense, several layers). Dense host rows (``layer_first``) stream at
#: full rate through the copy engines alone; pitched rows (``page_first``: one 42 KB latent and one
#: 8 KB indexer row per slot and layer) do not, so the copy engines take the latent rows and the
#: kernel every indexer row. A single layer is too short to hide a staging hop: its copy-engine rows
#: go straight into the device pages in one ``cudaMemcpyBatchAsync`` (dense rows: all of them,
#: leaving every SM to the model; pitched rows: the latent, beside the kernel's indexer rows).
MIXED_LOADS = {
    (True, True): LoadSplit(1.0, **HEAD, **WAVES, **STAGING_SCATTER_CTAS),
    (True, False): LoadSplit(1.0, ce_path="batch"),
    (False, True): LoadSplit(0.6, by="components", **HEAD, **WAVES),
    (False, False): LoadSplit(by="components", ce_path="batch"),
}
#: Single-layer splits where ``cudaMemcpyBatchAsync`` cannot run (runtime or driver before 12.8):
#: the best staged page shares.
SINGLE_LAYER_WITHOUT_BATCH = {True: LoadSplit(0.4), False: LoadSplit(0.25)}
#: ``mixed`` loads while a backup is in flight, by host rows dense: UVA reads from the SMs would cut
#: into both directions, so everything after the head goes through the copy engines. ``page_first``
#: rows of one layer (42 KB and 8 KB, 3 MB apart) do not stream beside a backup, so its loads move
#: blocks of 8 adjacent layers: one wide latent and one wide indexer row per slot and block.
MIXED_LOADS_BESIDE_BACKUP = {True: LoadSplit(1.0, **HEAD), False: LoadSplit(1.0, layers_per_copy=8, **HEAD)}

#: Loads through the ``kernel`` path: launches of ramped blocks (1, 2, 4, then 8 layers), 10
#: launches instead of 61 for DeepSeek-V3.2, so the caller's issue of a 61-layer load takes less
#: than half as long at the same bandwidth, and layer 0 is still ready after one layer's copy.
KERNEL_LOADS = LoadSplit(kernel_blocks=8, ramp=True)

#: ``auto`` sends a transfer through the copy engines (``staged``) when the host slots come in runs
#: at least this long on average; shorter runs count as scattered (see ``AUTO_PATHS``).
STAGED_MIN_MEAN_RUN = 8
#: ``auto`` skips the staging hop (``direct``) when device pages *and* host slots run together.
DIRECT_MIN_MEAN_RUN = 64

#: ``auto`` by (to host, host slots scattered, dense host rows, one layer alone). Host runs go
#: through the copy engines: staged for backups, mixed (copy engines + kernel at once) for loads.
#: Scattered slots:
#: - ``page_first`` (pitched rows): a slot's pieces are contiguous, so the staging ring moves
#:   whole-slot rows (backups) or rows of a block of layers (loads, ``SCATTERED_LOADS``), few
#:   copies, one memcpy batch per unit.
#: - ``layer_first`` (dense rows): every slot is its own row per (component, layer); backups go
#:   ``mixed`` (``MIXED_BACKUPS``: the UVA kernel and a small copy-engine share at once), loads of
#:   many layers ``mixed`` too (``SCATTERED_LOADS``: the kernel and a batch share).
#: - one layer alone: the latent rows in one memcpy batch, the indexer rows by the kernel
#:   (``mixed``, single-layer split) where batched copies exist, else the kernel.
AUTO_PATHS = {
    # backups
    (True, False, False, False): "staged", (True, False, True, False): "staged",
    (True, True, False, False): "staged", (True, True, True, False): "mixed",
    # loads of several layers
    (False, False, False, False): "mixed", (False, False, True, False): "mixed",
    (False, True, False, False): "mixed", (False, True, True, False): "mixed",
    # one layer alone
    (False, False, False, True): "mixed", (False, False, True, True): "mixed",
    (False, True, False, True): "mixed", (False, True, True, True): "mixed",
}
#: Where batched copies cannot run (keys as ``AUTO_PATHS``): scattered slots whose path needs them
#: (``layer_first`` rows, one layer alone) go through the UVA kernel.
AUTO_PATHS_WITHOUT_BATCH = {(True, True, True, False): "kernel", (False, True, True, False): "kernel",
                            (False, True, False, True): "kernel", (False, True, True, True): "kernel"}
#: Splits of ``mixed`` loads of several layers from scattered slots, by dense host rows, chosen by
#: what the engine costs the model beside it as well as by idle bandwidth:
#: - ``page_first``: every page through the copy engines in rows of blocks of layers (one latent
#:   and one indexer row per slot and block) that grow with the layer index after an 8-layer
#:   kernel head, the staging scatter at 32 CTAs, the first three blocks planned by calls of their
#:   own (``lead_blocks``) so copying starts while the rest is planned. Each staged block of
#:   scattered slots costs its issuing thread about the same whatever its layers, so blocks grow
#:   no faster than the load gets ahead of a model consuming it.
#: - ``layer_first``: 70% of the pages through the UVA kernel (ramped blocks), 30% as memcpy batches
#:   on a library thread, after a head of single-layer blocks. Copy engines alone are faster idle
#:   on some hosts, but their 62k row copies are issued from Python threads and on a slower CPU
#:   the load then lags a model consuming it layer by layer, so the kernel takes most pages.
SCATTERED_LOADS = {False: LoadSplit(1.0, layers_per_copy=8, kernel_blocks=8, ramp=True, ramp_step=4, head_layers=8,
                                    staging_ctas=32, lead_blocks=3, **WAVES),
                   True: LoadSplit(0.3, ce_path="batch", kernel_blocks=8, **HEAD, head_ramp_step=8)}
#: The same beside a backup in flight: ``page_first`` loads keep to the copy engines after a short
#: kernel head (UVA reads would cut into the backup; the head's only overlap its first layers),
#: ``layer_first`` keeps its split (a staged copy-engine load of scattered dense rows is 8-11 GB/s).
SCATTERED_LOADS_BESIDE_BACKUP = {False: MIXED_LOADS_BESIDE_BACKUP[False], True: SCATTERED_LOADS[True]}
#: Without batched copies (runtime or driver before 12.8): the kernel alone, ramped blocks.
SCATTERED_LOADS_WITHOUT_BATCH = replace(KERNEL_LOADS, ce_fraction=0.0)
#: Library threads that issue a ``batch`` load of several layers, each on its own stream, ordered
#: after the caller's stream by an event (1 024 row copies per NSA layer at about 1 us of CPU each:
#: one thread issues a 61-layer load in 96 ms, four in 27 ms, under its 30 ms of copying).
ISSUE_THREADS = 4
#: The most library issue threads an engine starts.
MAX_ISSUE_THREADS = 8


@dataclass(frozen=True)
class TransferOptions:
    """The knobs of a transfer engine, fixed when it is made (or per call): one frozen value.

    load_split: the whole split of a load (None: ``choose_split`` for ``mixed`` / ``staged``,
        ``KERNEL_LOADS`` for ``kernel``).
    ce_fraction: only the copy-engine share of pages of a ``mixed`` load (over the split chosen).
    backup_ce_fraction: share of a ``mixed`` backup's pages that the copy engines move (one
        memcpy batch from the device pages) beside the UVA kernel (None: ``choose_backup_split``).
    batch_flags: ``cudaMemcpyFlags`` of the ``batch`` path's calls.
    num_ctas: CTA budget of the UVA kernel launches (None: measured per direction).
    issue_threads: library threads that issue a GPU load (0: the caller's thread; None:
        ``ISSUE_THREADS_BY_PATH``).
    beside_compute: the model computes on the GPU while loads run (a serving engine that waits
        on layers with ``wait_layer``): ``auto`` then takes the splits measured beside the model's
        matmuls (``BESIDE_COMPUTE_LOADS``), which leave the model its SMs at a small cost in idle
        rate; off: the splits of the best idle rate.
    """

    load_split: LoadSplit | None = None
    ce_fraction: float | None = None
    backup_ce_fraction: float | None = None
    batch_flags: int = 0
    num_ctas: int | None = None
    issue_threads: int | None = None
    beside_compute: bool = False

    def __post_init__(self) -> None:
        if self.load_split is not None and not isinstance(self.load_split, LoadSplit):
            raise ConfigError(f"TransferOptions.load_split must be a LoadSplit or None: {self}")
        for name in ("ce_fraction", "backup_ce_fraction"):
            _fraction(self, name, optional=True)
        _count(self, "num_ctas", low=1, optional=True)
        _count(self, "batch_flags", low=0, optional=False)
        _count(self, "issue_threads", low=0, high=MAX_ISSUE_THREADS, optional=True)
        _flag(self, "beside_compute")


def mean_host_run(host_slots: torch.Tensor) -> float:
    """The mean run of adjacent host slots (CPU ids, in any order): what ``auto`` decides by."""
    from ..kernels import mean_run_length

    return mean_run_length(host_slots)


def is_scattered(host_slots: torch.Tensor) -> bool:
    """Whether the host slots run shorter than ``STAGED_MIN_MEAN_RUN`` on average (CPU ids)."""
    return mean_host_run(host_slots) < STAGED_MIN_MEAN_RUN


def choose_path(host_slots: torch.Tensor, device_pages: torch.Tensor, *, to_host: bool, dense_host_rows: bool,
                single_layer: bool, has_batch: bool, scattered: bool | None = None) -> str:
    """The ``auto`` rule for a GPU transfer, from how the ids run (CPU tensors, no device work).

    Args:
        dense_host_rows: the host layout's rows are dense (``layer_first``).
        single_layer: a load of one layer alone.
        has_batch: batched copies can run.
        scattered: ``is_scattered(host_slots)`` when the caller has it already.
    """
    from ..kernels import mean_run_length

    if scattered is None:
        scattered = is_scattered(host_slots)
    if not scattered and mean_run_length(host_slots, device_pages) >= DIRECT_MIN_MEAN_RUN:
        return "direct"
    key = (to_host, scattered, dense_host_rows, single_layer and not to_host)
    return AUTO_PATHS[key] if has_batch else AUTO_PATHS_WITHOUT_BATCH.get(key, AUTO_PATHS[key])


def choose_split(*, dense_host_rows: bool, num_layers: int, backup_in_flight: bool, scattered: bool,
                 has_batch: bool, options: TransferOptions = TransferOptions()) -> LoadSplit:
    """How a ``mixed`` load is split now: the options' split, else from scattered slots (several
    layers) ``SCATTERED_LOADS`` (``SCATTERED_LOADS_BESIDE_BACKUP`` beside a backup), else beside a
    backup ``MIXED_LOADS_BESIDE_BACKUP``, else with ``options.beside_compute`` (several layers)
    ``BESIDE_COMPUTE_LOADS`` where it has the layout, else ``MIXED_LOADS``; then the options'
    ``ce_fraction`` over it."""
    if options.load_split is not None:
        split = options.load_split
    elif scattered and num_layers > 1:
        split = (SCATTERED_LOADS_BESIDE_BACKUP if backup_in_flight else SCATTERED_LOADS)[dense_host_rows]
        if split.ce_path == "batch" and not has_batch:
            split = SCATTERED_LOADS_WITHOUT_BATCH
    elif backup_in_flight:
        split = MIXED_LOADS_BESIDE_BACKUP[dense_host_rows]
    elif options.beside_compute and num_layers > 1 and dense_host_rows in BESIDE_COMPUTE_LOADS:
        split = BESIDE_COMPUTE_LOADS[dense_host_rows]
    else:
        split = MIXED_LOADS[(dense_host_rows, num_layers > 1)]
        if split.ce_path == "batch" and not has_batch:
            split = SINGLE_LAYER_WITHOUT_BATCH[dense_host_rows]
    if options.ce_fraction is not None:
        split = replace(split, ce_fraction=options.ce_fraction, by="pages")
    return split


@dataclass(frozen=True)
class BackupSplit:
    """A ``mixed`` backup: ``ce_fraction`` of the pages (in host-slot order) as one memcpy batch
    straight from the device pages, the rest by the UVA kernel with ``kernel_ctas`` CTAs (None:
    the measured default), both at once."""

    ce_fraction: float
    kernel_ctas: int | None = None


#: ``mixed`` backups by (dense host rows, scattered slots); None: staged (copy engines on host runs
#: or whole-slot rows, the kernel gathers on the device). Scattered ``layer_first`` rows: the
#: kernel alone writes about 94% of the ceiling, the copy engines alone far less (42 KB rows into
#: scattered host rows, and 80 ms of issue); 15% of the pages through the copy engines beside the
#: kernel at 32 CTAs reaches about 96%.
MIXED_BACKUPS: dict[tuple[bool, bool], BackupSplit | None] = {
    (False, False): None, (False, True): None, (True, False): None, (True, True): BackupSplit(0.15, kernel_ctas=32),
}


#: ``mixed`` backups while a load of the same engine is in flight, by (dense host rows, scattered
#: slots); the rest keep ``MIXED_BACKUPS``. Scattered ``layer_first`` rows: the UVA kernel alone at
#: its default CTAs. Beside a load, ``MIXED_BACKUPS``' kernel at 32 CTAs gets too little of PCIe
#: from the load's kernel, and load + backup moved barely more than one direction; with the
#: kernel's default CTAs they move about 1.2x one direction. ``page_first`` keeps its staged backups.
MIXED_BACKUPS_BESIDE_LOAD: dict[tuple[bool, bool], BackupSplit] = {(True, True): BackupSplit(0.0)}


def choose_backup_split(*, dense_host_rows: bool, scattered: bool, has_batch: bool = True,
                        load_in_flight: bool = False) -> BackupSplit | None:
    """How a ``mixed`` backup is split (``MIXED_BACKUPS``, or ``MIXED_BACKUPS_BESIDE_LOAD`` while a
    load of the same engine is in flight); None: staged. Without batched copies the kernel takes
    every page."""
    key = (dense_host_rows, scattered)
    split = MIXED_BACKUPS_BESIDE_LOAD.get(key) if load_in_flight else None
    if split is None:
        split = MIXED_BACKUPS[key]
    if split is not None and not has_batch:
        split = replace(split, ce_fraction=0.0)
    return split


#: Library threads that issue a GPU load of several layers by path, when the options say nothing:
#: ``batch`` (1 024 row copies per layer) on ``ISSUE_THREADS``; ``staged`` and ``mixed`` (10-20 ms
#: of the caller's thread for a 61-layer load with slots in runs, up to ~100 ms with scattered
#: slots, which would delay the model's own launches behind it) on one; the kernel (4-7 ms) and
#: the rest on the caller's. Backups are always issued on the caller's thread: the copy engines
#: write scattered rows no faster however many threads issue them.
ISSUE_THREADS_BY_PATH = {"batch": ISSUE_THREADS, "staged": 1, "mixed": 1}


def issue_threads(path: str, num_layers: int, options: TransferOptions) -> int:
    """Library threads that issue a GPU load (0: the caller's thread), see ``ISSUE_THREADS_BY_PATH``."""
    if options.issue_threads is not None:
        return options.issue_threads
    return ISSUE_THREADS_BY_PATH.get(path, 0) if num_layers > 1 else 0


__all__ = ["AUTO_PATHS", "BESIDE_COMPUTE_LOADS", "CALLER_HEAD_BLOCKS", "DIRECT_MIN_MEAN_RUN", "ISSUE_THREADS",
           "ISSUE_THREADS_BY_PATH", "KERNEL_LOADS", "LOAD_STREAM_PRIORITY", "MAX_ISSUE_THREADS", "MIXED_BACKUPS",
           "MIXED_BACKUPS_BESIDE_LOAD", "MIXED_LOADS", "MIXED_LOADS_BESIDE_BACKUP", "PATHS", "PITCHED_RUNS_LOADS",
           "SCATTERED_LOADS", "SCATTERED_LOADS_BESIDE_BACKUP", "SCATTERED_LOADS_WITHOUT_BATCH",
           "SINGLE_LAYER_WITHOUT_BATCH", "STAGED_MIN_MEAN_RUN", "BackupSplit", "LoadSplit", "TransferOptions",
           "choose_backup_split", "choose_path", "choose_split", "is_scattered", "issue_threads", "mean_host_run"]
