"""How the transfer engine splits a copy between paths: the measured policy, apart from the mechanics.

``TransferEngine`` issues copies; this module decides which path (``choose_path``) and, for loads
through the copy engines, how the bytes are shared between copy engines and the UVA kernel
(``LoadSplit`` and the tables below). Every number here was chosen by a measurement on the H200
recorded in docs/benchmarks.md ("GPU transfers"); change them only with a new measurement.
Pure CPU logic on CPU id tensors: nothing here touches a device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PATHS = ("auto", "kernel", "direct", "batch", "staged", "mixed", "torch")

#: Streams a staged load may split its copy-engine copies over (``LoadSplit.copy_streams``).
MAX_COPY_STREAMS = 4


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
    """

    ce_fraction: float = 1.0
    by: str = "pages"
    copy_streams: int = 1
    unit_rows: int | None = None
    staging_ctas: int | None = None
    layers_per_copy: int = 1
    ce_path: str = "staged"

    def __post_init__(self) -> None:
        if self.by not in ("pages", "components") or not 0.0 <= self.ce_fraction <= 1.0:
            raise ValueError(f"LoadSplit needs by 'pages' or 'components' and 0 <= ce_fraction <= 1: {self}")
        if self.ce_path not in ("staged", "batch"):
            raise ValueError(f"LoadSplit.ce_path must be 'staged' or 'batch': {self}")
        rows_ok = self.unit_rows is None or self.unit_rows >= 1
        if not 1 <= self.copy_streams <= MAX_COPY_STREAMS or self.layers_per_copy < 1 or not rows_ok:
            raise ValueError(f"LoadSplit needs 1..{MAX_COPY_STREAMS} copy streams, positive unit_rows and layers: {self}")


#: ``mixed`` loads by (host rows dense, several layers), measured on the H200 (docs/benchmarks.md,
#: "ce_fraction", "Load splits" and "Batched copies"): dense host rows (layer_first) stream at full
#: rate through the copy engines alone; pitched rows (page_first: one 42 KB latent and one 8 KB
#: indexer row per slot and layer) do not: the copy engines take the latent rows and the kernel
#: every indexer row (53.2-53.3 against 52.4-52.5 GB/s for a 0.6 page share in two runs; specs
#: without a smaller component keep the 0.6 page share). A single layer is too short to hide a
#: staging hop: the copy engines take the latent rows straight into the device pages in one
#: ``cudaMemcpyBatchAsync`` while the kernel takes the indexer rows (52.2-53.4 GB/s, 96-101% of a
#: contiguous copy of the same bytes, against 48-50.5 for the best staged split). With dense host
#: rows (layer_first) the batch alone moves the indexer rows as fast (same runs: 52.9-53.1 against
#: 52.4-53.2 for the split, with a narrower spread) and leaves every SM to the model, so it takes
#: the whole layer there; pitched page_first rows keep the kernel half (51.5-52.2 batch alone
#: against 51.9-53.2).
MIXED_LOADS = {
    (True, True): LoadSplit(1.0),
    (True, False): LoadSplit(1.0, ce_path="batch"),
    (False, True): LoadSplit(0.6, by="components"),
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
MIXED_LOADS_BESIDE_BACKUP = {True: LoadSplit(1.0), False: LoadSplit(1.0, layers_per_copy=8)}

#: ``auto`` sends a transfer through the copy engines (``staged``) when the host slots come in runs
#: at least this long on average; scattered slots make one copy-engine copy per slot and layer,
#: which the CPU cannot issue fast enough, so those go through the UVA kernel.
STAGED_MIN_MEAN_RUN = 8
#: ``auto`` skips the staging hop (``direct``) when device pages *and* host slots run together.
DIRECT_MIN_MEAN_RUN = 64


def choose_path(host_slots: torch.Tensor, device_pages: torch.Tensor, *, to_host: bool,
                single_layer_batch: bool = False) -> str:
    """The ``auto`` rule for a GPU transfer, from how the ids run (CPU tensors, no device work).

    Scattered host slots make one copy-engine copy per slot and layer, more than the CPU can
    issue for many layers: the UVA kernel takes those, except a single-layer load where the
    batched copies exist (``single_layer_batch``): one batch call per layer costs the same for
    any slots. Host runs go through the copy engines: staged for backups, mixed (copy engines +
    kernel reading at once) for loads; pages adjacent on both sides skip the staging hop.
    """
    from .kernels import find_runs

    host_runs = find_runs(host_slots, torch.arange(host_slots.numel()), sort_by="src")
    if host_runs.mean_length < STAGED_MIN_MEAN_RUN:
        return "mixed" if single_layer_batch and not to_host else "kernel"
    if find_runs(host_slots, device_pages).mean_length >= DIRECT_MIN_MEAN_RUN:
        return "direct"
    return "staged" if to_host else "mixed"


__all__ = ["DIRECT_MIN_MEAN_RUN", "MAX_COPY_STREAMS", "MIXED_LOADS", "MIXED_LOADS_BESIDE_BACKUP", "PATHS",
           "SINGLE_LAYER_WITHOUT_BATCH", "STAGED_MIN_MEAN_RUN", "LoadSplit", "choose_path"]
