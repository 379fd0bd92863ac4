"""How the transfer engine splits a copy between paths: the measured policy, apart from the mechanics.

``TransferEngine`` issues copies; this module decides which path (``choose_path``: by direction,
host-slot runs, host layout and single layer), how a load through the copy engines shares its
bytes between copy engines and the UVA kernel (``choose_split``: ``LoadSplit`` and the tables
below; conditions: a backup in flight, scattered slots) and from which thread a load is issued
(``issue_threads``); ``TransferOptions`` holds the knobs that override them. Every number here was chosen by a measurement on the H200
recorded in docs/benchmarks.md ("GPU transfers"); change them only with a new measurement.
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

#: Streams a staged load may split its copy-engine copies over (``LoadSplit.copy_streams``).
MAX_COPY_STREAMS = 4


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


#: ``LoadSplit``'s counts: (lowest, highest or None, may be None).
_SPLIT_COUNTS = {
    "copy_streams": (1, MAX_COPY_STREAMS, False), "layers_per_copy": (1, None, False),
    "kernel_blocks": (1, None, False), "head_layers": (0, None, False), "unit_rows": (1, None, True),
    "staging_ctas": (1, None, True), "ramp_step": (1, None, True), "kernel_ctas": (1, None, True),
    "kernel_tile": (1, None, True), "lead_blocks": (1, None, False), "issue_halves": (1, 2, False),
    "head_ramp_step": (1, None, True), "head_ctas": (1, None, True), "plan_wave": (1, None, True),
    "minor_layers_per_copy": (1, None, True), "minor_lead_groups": (0, None, False),
}


@dataclass(frozen=True)
class LoadSplit:
    """How a ``mixed`` load shares its bytes between the copy engines and the UVA kernel.

    by: ``"pages"`` sends the first ``ce_fraction`` of the pages (in host-slot order) through the
        copy engines and the rest through the kernel; ``"components"`` sends every page's largest
        component (NSA: the 42 KB latent) through the copy engines and the others (the 8 KB
        indexer) through the kernel, so no copy engine moves small pitched rows (specs with one
        component, or components of one size, fall back to ``"pages"`` with ``ce_fraction``).
    copy_streams: copy streams the copy-engine half is split over (staged: by rows, see
        ``StagedCopier``; batch: by copies).
    unit_rows: most rows per staging unit (None: a whole layer), so one layer pipelines.
    staging_ctas: CTAs of the staging scatter (None: the copier's).
    ce_path: how the copy-engine half moves: ``"staged"`` (2-D copies into the staging ring, then
        a scatter kernel) or ``"batch"`` (one ``cudaMemcpyBatchAsync`` per layer, straight into
        the device pages: no staging hop, more CPU per layer).
    layers_per_copy: adjacent layers the staged half moves as one group; with ``"components"``
        and ``page_first`` slots (components layer-major) that is one ``layers_per_copy`` x 42 KB
        row per slot and copy instead of one 42 KB row per layer. The events of a block's layers
        are recorded once the whole block landed, so the first layers are ready later.
    ramp: blocks grow 1, 2, 4, ... layers up to ``layers_per_copy`` (and ``kernel_blocks``), so
        the first layers are ready after one layer's copy (a model waiting on layer 0 starts
        early) and the rest move in wide rows / few launches.
    kernel_blocks: adjacent layers the UVA kernel half (and the ``kernel`` path) moves in one
        launch; a block's layers are ready together.
    ramp_step: with ``ramp``, the block starting at the load's layer index j has
        ``1 + j // ramp_step`` layers (up to the block size) instead of doubling: a model
        consuming layers about as fast as they land (compute 1.25x the load) reaches a block's
        first layer only a little after the block started, so blocks may only grow as fast as
        the load gets ahead (None: 1, 2, 4, ...).
    head_layers: the load's first layers go through the UVA kernel from the caller's thread
        before anything else of the load is planned or issued, so layer 0 lands about one
        layer's copy after the call (the model waits for it anyway: the kernel's SMs cost it
        nothing then); the rest follows on its path, its copies ordered after the head's (see
        ``body_after_head``).
    kernel_ctas: CTA budget of the kernel half (None: ``TransferOptions.num_ctas``, else the
        measured default); a small share of the pages needs few CTAs, and every CTA is an SM the
        model does not get while the load runs.
    kernel_tile: words each kernel program moves per step (a power of two; None: the kernel's
        default, 4096): a larger tile keeps more host reads in flight per CTA, so fewer CTAs (SMs
        taken from the model) reach the same rate. Warps follow the tile (8 up to 8192 words, 16
        above).
    issue_halves: 2 splits a staged copy-engine half into two halves of its pages (in host-slot
        order), each planned and issued by its own thread through its own staging ring and copy
        stream, joined per block of layers: a scattered ``page_first`` load alone is bound by the
        one thread that issues its rows (36-42 ms against 30 back to back, tenth session). The
        second half's thread is a library issue thread (the third); on CPU both run in turn.
        Measured on the H200 (2026-12-02 nineteenth probe): it does not help (beside the matmuls
        at 1.25x, scattered ``page_first``: 0.67 of the load hidden against 0.78), so no table
        sets it.
    lead_blocks: blocks of a staged copy-engine half that are each planned and enqueued by a
        call of their own before the rest go in one call (planned whole, or in waves with
        ``plan_wave``): copying starts while the issuing thread plans what follows; each call
        costs a sort of the ids and a table upload.
    head_ramp_step: the head's kernel blocks grow by one layer every this many layers (None:
        ``ramp_step``); the body's blocks continue ``ramp_step``'s ramp from the head's end either
        way. Beside the model the head lands about as fast as the model consumes it, so a head
        block of two layers keeps the model waiting about one layer's copy at its first layer.
    head_ctas: CTA budget of the head's kernel launches (None: ``kernel_ctas``; a user's
        ``TransferOptions.num_ctas`` overrides both); only the head's layers take the model's SMs
        by it.
    body_after_head: with a head, the body's copies start once the head has landed (True: layers
        reach PCIe in order) or right away, beside the head's (False). Beside the model the head's
        UVA kernel is held back by the model's CTAs and leaves part of the link idle, which the
        body's copy engines could use; its thread then also plans without waiting for the
        head's launches.
    plan_wave: every call of a staged copy-engine half into the staging ring (the lead blocks'
        calls, the rest's, and the second half's with ``issue_halves``) plans, uploads and enqueues
        its blocks in waves of this many blocks, then twice as many each time, instead of planning
        every block before its first copy (None); the uploads then go on the ring's own stream.
        With slots in runs the body's thread planned the 52 blocks after its first in 3.3-4.4 ms
        on the H200's host while only that first block (0.5 ms) was copying (2026-12-02 issue
        timeline, fifteenth session).
    minor_layers_per_copy: where the copy engines take every component of a page (``by``
        ``"pages"``), the smaller components (NSA: the 8 KB indexer rows) of a staged copy-engine
        half move in blocks of this many adjacent layers of the load, each block with the staged
        group of its first layer (None: with their own layer, like the largest component). In a
        ``page_first`` slot a component's layers lie side by side, so a block is one wide row per
        slot (8 layers: 67 KB) instead of one 8 KB row per layer, which the copy engines move
        slowly; the largest component keeps its groups (``layers_per_copy``), so its layers are
        still ready one by one. A block's rows land with its first layer, before any of its
        layers is ready, and the layers after it are ready as their largest component lands.
    minor_lead_groups: with ``minor_layers_per_copy``, each block goes this many staged groups
        ahead of its first layer's (as far as the load's first group): that layer's group then
        carries only its own rows, so a model waiting on it does not wait for the block's too.
    body_ramp: with a head, the body's blocks ramp again from one layer (True) or start at their
        full size (False); with ``ramp_step`` they continue ``ramp_step``'s ramp from the head's
        end either way (whatever ``head_ramp_step`` made of the head). A staged
        copy-engine block of scattered slots costs its issuing thread the same whatever its
        layers (one row per slot and component, about 2 us each), so short blocks right after
        the head cost the most issue time per layer landed.
    """

    ce_fraction: float = 1.0
    by: str = "pages"
    copy_streams: int = 1
    unit_rows: int | None = None
    staging_ctas: int | None = None
    layers_per_copy: int = 1
    ce_path: str = "staged"
    ramp: bool = False
    kernel_blocks: int = 1
    ramp_step: int | None = None
    head_layers: int = 0
    kernel_ctas: int | None = None
    kernel_tile: int | None = None
    issue_halves: int = 1
    lead_blocks: int = 1
    body_ramp: bool = True
    head_ramp_step: int | None = None
    head_ctas: int | None = None
    body_after_head: bool = True
    plan_wave: int | None = None
    minor_layers_per_copy: int | None = None
    minor_lead_groups: int = 0

    def __post_init__(self) -> None:
        # Types first, so the range checks below compare numbers (a str raised TypeError, a float
        # count failed deep inside a load): counts are ints (``as_int``), kept as Python ints.
        _fraction(self, "ce_fraction", optional=False)
        for name, (low, high, optional) in _SPLIT_COUNTS.items():
            _count(self, name, low=low, high=high, optional=optional)
        for name in ("ramp", "body_ramp", "body_after_head"):
            _flag(self, name)
        if self.kernel_tile is not None and (self.kernel_tile < 256 or self.kernel_tile & (self.kernel_tile - 1)):
            raise ConfigError(f"LoadSplit.kernel_tile must be a power of two >= 256: {self}")
        if self.ramp_step is not None and not self.ramp:
            raise ConfigError(f"LoadSplit.ramp_step applies to a ramp: set ramp=True as well: {self}")
        if self.by not in ("pages", "components"):
            raise ConfigError(f"LoadSplit.by must be 'pages' or 'components': {self}")
        if self.ce_path not in ("staged", "batch"):
            raise ConfigError(f"LoadSplit.ce_path must be 'staged' or 'batch': {self}")
        if self.minor_layers_per_copy is not None and (self.by != "pages" or self.ce_path != "staged"):
            raise ConfigError("LoadSplit.minor_layers_per_copy applies where a staged copy-engine half takes every "
                              f"component (by='pages', ce_path='staged'): {self}")
        if self.minor_lead_groups and self.minor_layers_per_copy is None:
            raise ConfigError(f"LoadSplit.minor_lead_groups applies to minor blocks: set minor_layers_per_copy as well: {self}")


#: ``mixed`` loads by (host rows dense, several layers), measured on the H200 (docs/benchmarks.md,
#: "ce_fraction", "Load splits" and "Batched copies"): dense host rows (layer_first) stream at full
#: rate through the copy engines alone; pitched rows (page_first: one 42 KB latent and one 8 KB
#: indexer row per slot and layer) do not: the copy engines take the latent rows and the kernel
#: every indexer row (53.2-53.3 against 52.4-52.5 GB/s for a 0.6 page share in two runs; beside the
#: model's compute several layers go ``PITCHED_RUNS_LOADS``' way, see ``BESIDE_COMPUTE_LOADS``; specs
#: without a smaller component keep the 0.6 page share). A single layer is too short to hide a
#: staging hop: the copy engines take the latent rows straight into the device pages in one
#: ``cudaMemcpyBatchAsync`` while the kernel takes the indexer rows (52.2-53.4 GB/s, 96-101% of a
#: contiguous copy of the same bytes, against 48-50.5 for the best staged split). With dense host
#: rows (layer_first) the batch alone moves the indexer rows as fast (same runs: 52.9-53.1 against
#: 52.4-53.2 for the split, with a narrower spread) and leaves every SM to the model, so it takes
#: the whole layer there; pitched page_first rows keep the kernel half (51.5-52.2 batch alone
#: against 51.9-53.2).
#: Loads of several layers start with a head (``HEAD``): the first 8 layers through the UVA kernel
#: from the caller's thread, in blocks that grow with the layer index (``ramp_step`` 5: 1, 1, 1, 1,
#: 1, 2, 1 layers), the rest as before, ordered after the head. Beside the model's matmuls at 1.25x
#: (H200, 2026-12-01 sixth probe, docs/benchmarks.md "Serving conditions, third round") layer 0
#: lands 1.7-2.0 ms after the call instead of 4.0-4.2 (planning the staged copies came first), and
#: 0.89 (page_first) / 0.91 (layer_first) of the load is hidden instead of 0.74 / 0.84, at a compute
#: slowdown of 1.01-1.02; idle, 96.2 / 96.1% of the ceiling instead of 97.3 / 96.4%.
HEAD = {"head_layers": 8, "ramp": True, "ramp_step": 5}
#: Blocks of a head (its first two layers with ``HEAD``) that the caller's thread launches when the rest
#: of the load goes to a library thread; a second library thread launches the rest of the head,
#: and the first plans the body once they are launched (at once with ``body_after_head`` False). A model waiting on layer 0 can only start once ``load`` has
#: returned, and with the whole head on the caller that was after layer 0 had landed (tenth
#: session, ``page_first`` runs: return at 2.15 ms, layer 0 at 2.02). Measured on the H200
#: (eleventh session, ``serving_probe.py --set eighteenth``, two runs, docs/benchmarks.md "Serving
#: conditions, seventh round"): the call returns 0.2-0.9 ms sooner (1.30-1.41 ms for a 61-layer
#: load against 1.63-2.31 idle), the idle loads are the same, and the share hidden beside the
#: matmuls at 1.25x is the same within the spread (0.826 on average over 8 cells against 0.825
#: with the whole head on the caller, 0.823 with 2 blocks). With the later splits (``ramp_step`` 4
#: for scattered ``page_first``: head blocks 1, 1, 1, 1, 2, 2) the model waited at layer 1 in every
#: case, for the head's second block that library thread 1 launched after ``load`` returned (0.2-1.6
#: ms, ``issue_timeline.py``), so the caller now launches two blocks: layers 0 and 1. Measured on
#: the H200 (2026-12-02, ``serving_probe.py --set twentyfourth``, docs/benchmarks.md "Serving
#: conditions, ninth round"): hidden beside the matmuls at 1.25x 0.90 / 0.84 (scattered page_first
#: / layer_first) instead of 0.81 / 0.76, the runs 0.85 / 0.88 instead of 0.88 / 0.85 (within the
#: spread), at a compute slowdown of 0.99-1.03; idle loads the same (92.9-94.9% of the ceiling
#: against 92.5-94.9%), the caller's issue 1.6-2.0 ms instead of 1.6-1.8.
CALLER_HEAD_BLOCKS = 2
#: The staged bodies of idle loads plan, upload and enqueue their blocks in waves from one block
#: (``plan_wave``): with slots in runs the body's thread had issued layer 9 3.3-4.4 ms after layer
#: 8 (it planned the other 52 blocks first), the link idle about 3 ms of it. Measured on the H200
#: (2026-12-02, fifteenth session, ``serving_probe.py --set thirtieth`` / ``thirtyfirst``,
#: docs/benchmarks.md "Serving conditions, eleventh round"): layers 8, 9, 10 issued at 3.4, 4.1,
#: 4.6 ms; idle 61-layer loads the same once the waves' uploads left the scatter's stream (52.7 /
#: 51.9 / 53.2 GB/s against 52.8 / 52.0 / 52.8, ``page_first`` runs / scattered, ``layer_first``
#: runs); beside the matmuls at 1.25x hidden 0.90 / 0.88 against 0.91 / 0.90 (``page_first``
#: runs), 0.79 / 0.88 against 0.82 / 0.80 (scattered), 0.90 / 0.97 against 0.85 / 0.93
#: (``layer_first`` runs), within a spread the unchanged control showed as 0.74-0.88. Loads beside
#: a backup were not measured with waves and keep one call.
WAVES = {"plan_wave": 1}
#: A staged backup plans, uploads and enqueues its units in waves from this many units
#: (``TransferOptions.backup_plan_wave``; 0: one wave). Planned whole, a backup's first gather
#: waited for every unit's table: on the H200 (2026-12-03, twenty-second session,
#: ``benchmarks/backup_timeline.py``) it was launched 2.7-3.8 ms after the call (planning 1.4-1.7
#: ms, the upload 0.35-0.9 ms of it) while each unit then copies about 0.55 ms: that start is what
#: staged backups lost from the call (2.2-2.8 ms, twenty-first session). Waves of 1, 2 and 4 units
#: moved the first gather only 0.3-1.8 ms earlier (each wave's tables and upload had a fixed cost
#: of about 0.6 and 0.3 ms) and kept the caller's thread 2.3-5.6 ms longer, so one wave stays the
#: default; the ring now keeps each list's tables on the device instead (``kernels.staged_copy``).
BACKUP_PLAN_WAVE = 0


def backup_plan_wave(options: TransferOptions) -> int | None:
    """The staging ring's ``unit_wave`` for a staged backup under ``options`` (None: one wave)."""
    wave = BACKUP_PLAN_WAVE if options.backup_plan_wave is None else options.backup_plan_wave
    return wave or None


#: The staging scatter of ``layer_first`` loads of several layers with slots in runs takes 16 CTAs
#: instead of the copier's 4: it finishes each block four times sooner, and beside the model's
#: matmuls the time a scatter holds SMs is what the matmuls lose. Measured on the H200 with compute alone and
#: both at once in turn (``benchmarks/beside_floor.py --set second`` / ``third``, 2026-12-02,
#: docs/benchmarks.md "Serving conditions, thirteenth round"), at 1.25x: ``layer_first`` runs hid
#: 0.915 / 0.912 / 0.921 / 0.906 at a slowdown of 1.024 / 1.016 / 1.001 / 1.023 against ``auto``'s
#: 0.764 / 0.771 / 0.775 / 0.891 at 1.130 / 1.124 / 1.123 / 1.027 (32 CTAs: 0.902 / 0.916), idle
#: 53.8-53.9 GB/s against 53.5; ``page_first`` runs (its indexer rows still through the UVA
#: kernel) 0.866 / 0.875 at 1.059 / 1.051 against 0.749 / 0.770 at 1.144 / 1.127, idle 52.3 /
#: 52.4 GB/s against 53.1 / 53.1 (95.9% of the ceiling against 97.3%). One contiguous copy per
#: layer of the same bytes hid 0.92-0.94 at 1.017-1.028 in the same runs. ``page_first`` keeps
#: the copier's 4: with 16 its idle load fell to 93.0% of the ceiling in the run of record
#: (``transfer_gpu.py``, same day) against 95.3-96.2% before, and the issue keeps idle loads with
#: slots in runs as they were.
STAGING_SCATTER_CTAS = {"staging_ctas": 16}
#: ``page_first`` loads of several layers with slots in runs while the model computes beside them
#: (``TransferOptions.beside_compute``): after the head, the copy engines take every component, the
#: indexer rows in blocks of 8 layers (``minor_layers_per_copy``: one 67 KB row per slot instead of
#: eight 8 KB rows, which the copy engines move slowly), each block one staged group ahead of its
#: first layer's, and the staging scatter takes 32 CTAs; ``MIXED_LOADS``' split has the UVA kernel
#: move every indexer row, holding SMs for the whole load. Measured on the H200
#: (``benchmarks/beside_floor.py --set fourth`` ... ``seventh``, compute alone and both in turn,
#: three rounds each, docs/benchmarks.md "Serving conditions, fourteenth round"), beside the
#: matmuls at 1.25x: 0.907 / 0.919 / 0.899 and 0.879 / 0.926 / 0.882 of the load hidden at a
#: slowdown of 1.024 / 1.019 / 1.030 and 1.046 / 1.011 / 1.043, against 0.754 / 0.806 / 0.746 at
#: 1.133 / 1.078 / 1.141 and 0.760 / 0.847 / 0.813 at 1.145 / 1.069 / 1.093 for ``MIXED_LOADS``'
#: split in the same runs (the floor: 0.909-0.948 at 1.012-1.034). Idle it is slower: 61-layer
#: loads of 51.2-51.9 GB/s against 52.6-53.2 (93-95% of the ceiling against 96-97%; 93.7% in a
#: run of record against 95.3%): the copy engines alone move the pitched latent rows a little
#: slower than the copy engines and the kernel at once, so it is the split for loads beside the
#: model, not the default. Rings of 3 or 4 buffers did not change the idle rate; a kernel share of
#: 10% of the pages at 8 CTAs raised it to 52.6 but hid only 0.79-0.83. Without the blocks (indexer
#: rows per layer) 0.83-0.89 hidden at 50.1 GB/s; blocks of 4 45 GB/s; of 16 0.88-0.90 at 52.1;
#: 4 scatter CTAs 0.69-0.75 hidden (each block's 53 MB group waits on a slow scatter); 16
#: 0.86-0.87; 64 0.90-0.91 at 1.02-1.04.
PITCHED_RUNS_LOADS = LoadSplit(1.0, **HEAD, **WAVES, minor_layers_per_copy=8, minor_lead_groups=1, staging_ctas=32)
#: Loads of several layers with slots in runs beside the model's compute, by dense host rows (the
#: rest as ``MIXED_LOADS``: its ``layer_first`` split met the beside target, 0.92-0.93 hidden at
#: 1.002-1.007, and kept its idle rate).
BESIDE_COMPUTE_LOADS = {False: PITCHED_RUNS_LOADS}
MIXED_LOADS = {
    (True, True): LoadSplit(1.0, **HEAD, **WAVES, **STAGING_SCATTER_CTAS),
    (True, False): LoadSplit(1.0, ce_path="batch"),
    (False, True): LoadSplit(0.6, by="components", **HEAD, **WAVES),
    (False, False): LoadSplit(by="components", ce_path="batch"),
}
#: Single-layer splits where ``cudaMemcpyBatchAsync`` cannot run (runtime or driver before 12.8): the
#: staged split measured best before the batched path existed.
SINGLE_LAYER_WITHOUT_BATCH = {True: LoadSplit(0.4), False: LoadSplit(0.25)}
#: ``mixed`` loads while a backup is in flight, by host rows dense: UVA reads from the SMs would cut
#: into both directions (H200, page_first: 1.3x one direction with the kernel reading all pages),
#: so everything goes through the copy engines. Dense rows stream beside the backup (1.7-1.8x);
#: page_first rows of one layer (42 KB and 8 KB, 3 MB apart) do not (1.5x), so page_first loads
#: move blocks of adjacent layers: one 336 KB latent and one 67 KB indexer row per slot and block
#: of 8 layers (raw copies: 1.79x; whole-slot rows 1.8x but every layer ready only at the end).
#: A block's layers are ready together, once the block landed.
#: With the head (``HEAD``, blocks after it growing by ``ramp_step``) as beside compute, load +
#: backup at once did not lose: 1.66-1.67x against 1.63-1.69x without (sixth probe; within the noise).
MIXED_LOADS_BESIDE_BACKUP = {True: LoadSplit(1.0, **HEAD), False: LoadSplit(1.0, layers_per_copy=8, **HEAD)}

#: Loads through the ``kernel`` path: launches of ramped blocks (1, 2, 4, then 8 layers), 10
#: launches instead of 61 for DeepSeek-V3.2, so the caller's issue of a 61-layer load of 512 pages
#: takes 2.2-2.9 ms instead of 6.0-6.9 (H200; a model waiting on layer 0 starts that much earlier)
#: at the same bandwidth, and layer 0 is still ready after one layer's copy.
KERNEL_LOADS = LoadSplit(kernel_blocks=8, ramp=True)

#: ``auto`` sends a transfer through the copy engines (``staged``) when the host slots come in runs
#: at least this long on average; shorter runs count as scattered (see ``AUTO_PATHS``).
STAGED_MIN_MEAN_RUN = 8
#: ``auto`` skips the staging hop (``direct``) when device pages *and* host slots run together.
DIRECT_MIN_MEAN_RUN = 64

#: ``auto`` by (to host, host slots scattered, dense host rows, one layer alone). Host runs go
#: through the copy engines: staged for backups, mixed (copy engines + kernel at once) for loads.
#: Scattered slots, measured on the H200 (docs/benchmarks.md, "Serving conditions"):
#: - ``page_first`` (pitched rows): a slot's pieces are contiguous, so the staging ring moves
#:   whole-slot rows (backups: 95.3-95.4% of the ceiling) or rows of a block of layers (loads,
#:   ``SCATTERED_LOADS``), few copies, one memcpy batch per unit.
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
#: what the engine pays beside its own compute as well as by idle-GPU bandwidth (H200, 2026-12-01
#: probes, docs/benchmarks.md "Serving conditions, second round"):
#: - ``page_first``: 80% of the pages through the copy engines in rows of blocks of layers (one
#:   latent and one indexer row per slot and block; ramped 1, 2, 4, then 8 until 2026-12-02, now
#:   growing with the layer index after an 8-layer kernel head, see below), 20% through the UVA
#:   kernel in blocks of the same sizes, both at once, issued on a library thread: 53.2 GB/s (96.0%)
#:   against 51.6 (93%) for copy engines alone and 51.0 (92%) for the kernel alone. Since
#:   2026-12-03 the copy engines alone again, with a wider staging scatter (see below).
#: - ``layer_first``: 70% of the pages through the UVA kernel (ramped blocks), 30% as memcpy batches
#:   on a library thread: 52.1 GB/s (94%) and, beside the model's matmuls, 0.86 of the load hidden
#:   at a compute slowdown of 1.00, where ``batch`` on 4 issue threads (53.4 GB/s, 96%) hid 0.45 at
#:   1.29x (119 ms of CPU for 62k row copies): the engine pays far less in total.
#: Until 2026-12-02 (sixth probe, 1.25x): ``page_first`` with 4 head layers (blocks doubling as
#: before; 8 head layers with blocks by ``ramp_step`` hid 0.78 but fell to 94.4% idle) 95.8% idle
#: and 0.72 hidden against 96.2% and 0.69; ``layer_first`` with ``HEAD``: 93.3% idle (was 94.3%)
#: and 0.82 hidden (was 0.74), the kernel share's 16 CTAs slowing the matmuls 1.08x.
#: Since 2026-12-02 (twelfth session) ``page_first`` takes a head of 8 layers and full 8-layer
#: blocks right after it (``body_ramp`` False). The issue timeline (``benchmarks/issue_timeline.py``, H200, 2026-12-02)
#: showed the body bound by its issuing thread: each staged block of scattered slots costs about
#: the same (one ``cudaMemcpyBatchAsync`` row per slot and component, ~2 us each) whatever its
#: layers, and the body ramped again from one layer after the head, so the load took 40-42 ms from
#: the call against 30 ms of copying, and the model waited 3-4 ms on the body's second block.
#: Measured (``serving_probe.py --set twentysecond``, the candidate against ``auto`` in the same run): from the call 31.8 ms instead of
#: 40.6, beside the matmuls at 1.25x 0.82 hidden instead of 0.76 (5.6 ms added to the compute
#: instead of 9.7) at a slowdown of 1.00; idle 52.7 GB/s against 51.3. Heads of 12 and 16 layers
#: hid 0.80, with idle 52.3 / 51.7 GB/s; planning the first three blocks one call each
#: (``lead_blocks`` 3) 0.81 and 0.72 in two runs.
#: Then blocks that grow with the layer index, head and body alike (``ramp_step`` 4: 1, 1, 1, 1,
#: 2, 2 head layers, then 3, 3, 4, 5, 6, 8 ... layers a block): a layer of a block is ready only
#: once the whole block landed, and at 1.25x the model gains only ~0.14 ms a layer on the copy, so
#: full 8-layer blocks from layer 8 on kept the model waiting 1.5-2.0 ms at layer 8. Measured
#: against the full blocks in the same runs (``serving_probe.py --set twentythird --layouts
#: page_first --slots scattered``, twice): 0.87 / 0.84 of the load hidden against 0.80 / 0.81, the
#: compute 4.1 / 5.2 ms longer instead of 6.2 / 5.8, at a slowdown of 0.98-0.99; idle 52.2 / 52.2
#: GB/s against 52.5 / 52.7. Step 5 hid 0.85 / 0.80, a head of 12 at step 4 0.84 / 0.85.
#: Since 2026-12-02 (fourteenth session) ``layer_first``'s head is 8 single-layer blocks
#: (``head_ramp_step`` 8; ``HEAD``'s step 5 gave 1, 1, 1, 1, 1, 2, 1): beside the matmuls the head
#: lands about as fast as the model takes it, so its 2-layer block kept the model waiting at
#: layer 5. Measured at 1.25x against ``auto`` in the same runs (``serving_probe.py --set
#: twentyseventh`` and ``twentyeighth``, ``--skip both --beside-reps 12``): scattered
#: ``layer_first`` hid 0.84 / 0.82 against 0.72 / 0.71 (with the head at 32 CTAs or the body beside
#: the head as well, 0.87 / 0.85), at a slowdown of 1.04-1.05 against 1.01-1.03; idle 51.6 / 51.4
#: GB/s, as ``auto``; a third A/B (``--set twentyninth``) 0.77 / 1.059 against 0.75 / 1.029. In the
#: two final runs of that session the cell was 0.81 and 0.76, inside the previous session's
#: 0.77-0.90: the gain shows within a run, smaller than the spread between runs. Beside a backup
#: (the same entry) load + backup moved 1.02x / 1.01x against 1.00x / 1.00x / 0.96x before. In the
#: other cases the single-layer head moved hidden by -0.06 to +0.10 between the two runs
#: (``page_first`` runs lost in both), so they keep their heads.
#: Since 2026-12-03 (eighteenth session) ``page_first`` moves every page of the body through the copy
#: engines (no kernel share holding SMs for the whole load), its staging scatter takes 32 CTAs
#: (each block's group is scattered sooner) and its first three blocks are planned and enqueued
#: by calls of their own (``lead_blocks``), so copying starts while the issuing thread plans the
#: rest. Measured on the H200 (``benchmarks/beside_floor.py --set eighth``, two rounds, compute
#: alone and both in turn, docs/benchmarks.md "Serving conditions, fourteenth round"): idle
#: 61-layer loads 53.07 / 53.02 GB/s (96.2 / 96.1% of that run's 55.17 ceiling) against ``auto``'s
#: 52.06 / 52.00 (94.4 / 94.3%); beside the matmuls at 1.25x 0.838 / 0.885 of the load hidden at
#: a slowdown of 1.053 / 1.017 against 0.717 / 0.796 at 1.137 / 1.064. Copy engines alone with
#: scatter 32 and one lead block: 53.21 / 52.98 GB/s, 0.795 / 0.800 at 1.069 / 1.060; with
#: ``ramp_step`` 6: 52.2 / 52.0, 0.843 / 0.879 at 1.040 / 1.025; blocks of 4 layers: 51.7 / 51.8,
#: 0.880 / 0.793 at 1.027 / 1.061. (Before: ``ce_fraction`` 0.8, the copier's 4 scatter CTAs, one
#: lead block; copy engines alone were 93% idle then, with 4 scatter CTAs.) Again in ``--set
#: ninth``: 52.99 / 53.02 GB/s (95.5 / 95.6% of 55.47), 0.888 / 0.789 hidden at 1.037 / 1.055;
#: ``ramp_step`` 6 (with scatter 64 too), a head of 4 layers and two copy streams won in neither
#: round (the model's stall at block starts varies 0.7-6 ms between rounds).
#: Tried on 2026-12-03 (nineteenth session) and reverted: idle scattered ``layer_first`` loads on
#: the copy engines (``MIXED_LOADS[(True, True)]``, 96.9% in the thirteenth run of record). On a
#: host with a slower CPU the same split gave 90.6% as ``auto`` and 97.7% as ``mixed`` in one run,
#: and a load consumed layer by layer took 142 ms instead of 32 (62k rows issued from Python
#: threads; docs/benchmarks.md "Serving conditions, fifteenth round"); the kernel share moved by a
#: point between the two hosts.
#: Tried on 2026-12-03 (twentieth session) and reverted: idle loads through 0.8 copy engines (staged,
#: blocks of 8) + 0.2 kernel, which reached >= 95% in 20 of 24 recorded runs (median 96.8%) but
#: fell to 77-92% in 3, guarded by a pace: a block issued too far behind a rate sent the rest
#: through the kernel. It fell back in nearly every load (35-37 per run; 92.3-92.6% against 96.3-96.9%
#: unguarded in the same runs), both at 42 GB/s counted from the call with 2 ms of slack and at 38
#: GB/s counted from the first block with 4 ms (docs/benchmarks.md "Twentieth session").
#: Why, measured in the twenty-first session by asking the GPU (``StagedCopier.lag``: had the unit
#: before already landed when the next was issued?): that split's idle rate needs the benchmark's 40
#: ms device sleep ahead of the load. Timed from the call its thread issues about 50k rows in 90-110
#: ms of CPU, every copy-engine unit finds the copy engines idle (826 of 826), and the load moves
#: 14-18 GB/s (25-32%); one call into the ring per block is no slower. The pace was right to fall
#: back. From the call, this table's kernel-heavy split is the best candidate in both layouts
#: (``layer_first`` 90-92%, ``page_first`` 93-95%; the kernel alone 89%; docs/benchmarks.md
#: "Twenty-first session").
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


@dataclass(frozen=True)
class TransferOptions:
    """The knobs of a transfer engine, fixed when it is made (or per call): one frozen value
    instead of attributes that benchmarks and tests used to set on the engine.

    load_split: the whole split of a load (None: ``choose_split`` for ``mixed`` / ``staged``,
        ``KERNEL_LOADS`` for ``kernel``).
    ce_fraction: only the copy-engine share of pages of a ``mixed`` load (over the split chosen).
    backup_ce_fraction: share of a ``mixed`` backup's pages that the copy engines move (one
        memcpy batch from the device pages) beside the UVA kernel (None: ``choose_backup_split``).
    batch_flags: ``cudaMemcpyFlags`` of the ``batch`` path's calls.
    num_ctas: CTA budget of the UVA kernel launches (None: measured per direction).
    issue_threads: library threads that issue a GPU load (0: the caller's thread; None:
        ``ISSUE_THREADS`` for ``batch`` loads of several layers, else the caller's).
    backup_issue_threads: library threads that issue the copy-engine rows of a GPU backup
        (``batch``, and the copy-engine share of ``mixed``; 0: the caller's thread; None:
        ``backup_issue_threads``'s policy). A backup's pairs are dealt to them in byte-balanced
        runs of adjacent layers, each thread plans and issues its own memcpy batch on its own
        stream, and the last one to finish joins them into the handle's event. Backups have
        their own threads, so a load never queues behind a backup's issue.
    caller_head_blocks: blocks of a load's head that the caller's thread launches when the rest
        of the load goes to library threads (None: ``CALLER_HEAD_BLOCKS``; as many as the head
        has: the whole head, as before the hand-off).
    pitched_batch: the staging ring's copy-engine copies of scattered host slots go out as
        pitched ops in one ``cudaMemcpy3DBatchAsync`` per unit, a slot's rows of a unit's
        ``layer_first`` layers folded into one op (``kernels.staged_copy``; CUDA 12.8+, else
        ignored). Measured on the H200 (2026-12-01, ``benchmarks/batch3d_probe.py``): the copy
        engines run pitched ops far slower than the same bytes as 1-D rows (a 61-layer load of
        512 scattered slots: 7.8 GB/s at one row per op, 28.6 at 8, 44.1 at 61 against 41.5 for
        1-D rows), so ``auto`` never sets it; kept for runtimes where that changes.
    device_tables: a load's UVA kernel tables stay on the device once uploaded (one set per
        block of layers and components), and each load uploads only its ids, through a pinned
        ring the engine keeps (``kernels.ids_ring.IdsRing``), instead of packing tables and ids
        into a freshly pinned tensor per load. About 0.5 ms of the caller's path before a load's
        first launch is that upload (H200, ``benchmarks/issue_timeline.py``, 2026-12-02). Measured
        (H200, 2026-12-02, ``serving_probe.py --set twentyfourth``): no gain. The load's start
        beside the matmuls is the same (1.75-2.03 ms against 1.75-2.26), the share hidden at 1.25x
        0.88 / 0.69 / 0.87 / 0.75 (page_first runs / scattered, layer_first runs / scattered)
        against 0.88 / 0.81 / 0.85 / 0.76, idle loads the same; so off by default.
    backup_plan_wave: a staged backup's ring plans, uploads and enqueues its units in waves of
        this many units, then twice as many each time, so the first units gather and copy while
        the rest are planned (None: ``BACKUP_PLAN_WAVE``; 0: one wave, every unit planned and its
        table uploaded before the first gather, as before waves).
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
    pitched_batch: bool = False
    backup_issue_threads: int | None = None
    caller_head_blocks: int | None = None
    device_tables: bool = False
    beside_compute: bool = False
    backup_plan_wave: int | None = None

    def __post_init__(self) -> None:
        if self.load_split is not None and not isinstance(self.load_split, LoadSplit):
            raise ConfigError(f"TransferOptions.load_split must be a LoadSplit or None: {self}")
        for name in ("ce_fraction", "backup_ce_fraction"):
            _fraction(self, name, optional=True)
        _count(self, "num_ctas", low=1, optional=True)
        _count(self, "batch_flags", low=0, optional=False)
        for name in ("issue_threads", "backup_issue_threads"):
            _count(self, name, low=0, high=MAX_ISSUE_THREADS, optional=True)
        _count(self, "caller_head_blocks", low=1, optional=True)
        _count(self, "backup_plan_wave", low=0, optional=True)
        for name in ("pitched_batch", "device_tables", "beside_compute"):
            _flag(self, name)


#: The most library issue threads an engine starts.
MAX_ISSUE_THREADS = 8


def mean_host_run(host_slots: torch.Tensor) -> float:
    """The mean run of adjacent host slots (CPU ids, in any order): what ``auto`` decides by."""
    from ..kernels import mean_run_length

    return mean_run_length(host_slots)


def is_scattered(host_slots: torch.Tensor) -> bool:
    """Whether the host slots run shorter than ``STAGED_MIN_MEAN_RUN`` on average (CPU ids)."""
    return mean_host_run(host_slots) < STAGED_MIN_MEAN_RUN


def choose_path(host_slots: torch.Tensor, device_pages: torch.Tensor, *, to_host: bool,
                single_layer_batch: bool = False, dense_host_rows: bool | None = None,
                single_layer: bool | None = None, has_batch: bool | None = None, scattered: bool | None = None) -> str:
    """The ``auto`` rule for a GPU transfer, from how the ids run (CPU tensors, no device work).

    Args:
        dense_host_rows: the host layout's rows are dense (``layer_first``); None: the rule of
            before that knew no layouts (scattered slots to the UVA kernel).
        single_layer: a load of one layer alone (default: ``single_layer_batch``).
        has_batch: batched copies can run (default: ``single_layer_batch``).
        single_layer_batch: both of the above (the older form of the call).
        scattered: ``is_scattered(host_slots)`` when the caller has it already.
    """
    from ..kernels import mean_run_length

    single = single_layer_batch if single_layer is None else single_layer
    batch = single_layer_batch if has_batch is None else has_batch
    if scattered is None:
        scattered = is_scattered(host_slots)
    if not scattered and mean_run_length(host_slots, device_pages) >= DIRECT_MIN_MEAN_RUN:
        return "direct"
    if scattered and dense_host_rows is None:
        return "mixed" if single and batch and not to_host else "kernel"
    key = (to_host, scattered, bool(dense_host_rows), single and not to_host)
    return AUTO_PATHS[key] if batch else AUTO_PATHS_WITHOUT_BATCH.get(key, AUTO_PATHS[key])


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
#: kernel alone writes 52.0 GB/s (94%), copy engines alone 34 GB/s (42 KB rows into scattered host
#: rows, and 80 ms of issue); 15% of the pages through the copy engines beside the kernel at 32 CTAs:
#: 52.98 GB/s (95.8%; 0.1: 95.3%, 0.2: 95.7%), 6.6 ms of the caller's thread (H200, 2026-12-01).
MIXED_BACKUPS: dict[tuple[bool, bool], BackupSplit | None] = {
    (False, False): None, (False, True): None, (True, False): None, (True, True): BackupSplit(0.15, kernel_ctas=32),
}


#: ``mixed`` backups while a load of the same engine is in flight, by (dense host rows, scattered
#: slots); the rest keep ``MIXED_BACKUPS``. Scattered ``layer_first`` rows: the UVA kernel alone at
#: its default CTAs. Beside a load, ``MIXED_BACKUPS``' split (its kernel at 32 CTAs) gets too little
#: of PCIe from the load's kernel, and load + backup moved 1.01-1.02x one direction in every run of
#: record since the tenth session. Measured on the H200 (2026-12-04, twenty-fourth session,
#: ``serving_probe.py --set thirtyfourth --skip load61,backup,beside --both-order load``, the
#: load issued first): ``auto``'s load + a kernel backup 65.6 GB/s (1.19x) against 55.9 (1.01x) for
#: ``auto`` + ``auto``; the backup without its copy-engine share but still at 32 CTAs 57.0 (1.03x), so
#: the CTAs are what counts; backup issued first 64.4 against 55.9. ``page_first`` keeps its staged
#: backups (``auto`` + ``auto`` 86-91 GB/s, a kernel backup 61).
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
#: the rest on the caller's.
ISSUE_THREADS_BY_PATH = {"batch": ISSUE_THREADS, "staged": 1, "mixed": 1}


def issue_threads(path: str, num_layers: int, options: TransferOptions) -> int:
    """Library threads that issue a GPU load (0: the caller's thread), see ``ISSUE_THREADS_BY_PATH``."""
    if options.issue_threads is not None:
        return options.issue_threads
    return ISSUE_THREADS_BY_PATH.get(path, 0) if num_layers > 1 else 0


#: Library threads that issue a GPU backup's copy-engine rows by path, when the options say nothing
#: (every other path: the caller's thread). Empty: measured on the H200 (eleventh session,
#: ``serving_probe.py --set seventeenth``), a batch backup of 512 scattered slots issues in
#: 0.6-0.7 ms of the caller instead of 79-81 ms from 2-8 threads, but the copy engines write
#: scattered rows at 38 (``page_first``) / 46 (``layer_first``) GB/s however many threads issue,
#: against 52.7-52.9 for ``auto``'s kernel-mostly split; and beside a load on the copy engines both
#: directions fell to 28-42 GB/s in total at about 3 us of CPU per row.
BACKUP_ISSUE_THREADS_BY_PATH: dict[str, int] = {}


def backup_issue_threads(path: str, options: TransferOptions) -> int:
    """Library threads that issue a GPU backup's copy-engine rows (0: the caller's thread), see
    ``BACKUP_ISSUE_THREADS_BY_PATH``."""
    if options.backup_issue_threads is not None:
        return options.backup_issue_threads
    return BACKUP_ISSUE_THREADS_BY_PATH.get(path, 0)


__all__ = ["BACKUP_ISSUE_THREADS_BY_PATH", "BESIDE_COMPUTE_LOADS", "CALLER_HEAD_BLOCKS", "backup_issue_threads", "AUTO_PATHS", "DIRECT_MIN_MEAN_RUN", "ISSUE_THREADS", "ISSUE_THREADS_BY_PATH", "KERNEL_LOADS", "LOAD_STREAM_PRIORITY", "MAX_COPY_STREAMS", "MAX_ISSUE_THREADS", "MIXED_LOADS",
           "MIXED_BACKUPS", "MIXED_BACKUPS_BESIDE_LOAD", "MIXED_LOADS_BESIDE_BACKUP", "PATHS", "PITCHED_RUNS_LOADS", "SCATTERED_LOADS", "SCATTERED_LOADS_BESIDE_BACKUP",
           "SCATTERED_LOADS_WITHOUT_BATCH", "SINGLE_LAYER_WITHOUT_BATCH", "STAGED_MIN_MEAN_RUN",
           "BackupSplit", "LoadSplit", "TransferOptions", "choose_backup_split", "choose_path", "choose_split", "is_scattered", "issue_threads", "mean_host_run"]
