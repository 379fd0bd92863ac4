"""The worker-side transfer engine: L1 <-> L2 page copies on the library's own CUDA streams.

    engine = TransferEngine(device_pool, host_pool)           # path="auto"
    load = engine.load(host_slots, device_pages)              # every layer, one event per layer
    for layer in range(num_layers):
        load.wait_layer(layer)                                # the engine's stream waits for
        ...                                                   # exactly this layer (all components)
    backup = engine.backup(device_pages, host_slots)          # all layers, returns at once
    host_pool.free(slots, completion=backup)                  # released only once it completed

Rules this module keeps:
- Every CUDA call is issued from the caller's thread, under the pool's device, on streams this
  engine owns (loads: kernel, copy-engine and UVA streams; backups: kernel and copy-engine
  streams), never on the default stream. Each transfer first waits for the work already enqueued on the caller's
  current stream (the pages it reads or overwrites may still be in use there).
- Validation (``tiered_kv.transfer.validate``) runs on CPU copies of the ids before anything is
  enqueued, so no call forces a device sync and a rejected call writes nothing.
- A load records one CUDA event per layer after *every* component of that layer (latent and
  indexer) has landed; ``wait_layer(i)`` waits on exactly that event.
- A backup returns a completion (``done()`` / ``query()``) that never blocks; host slots and
  device pages it touches are to be released only through it.
- On a CPU machine the same calls run the copy at once and return completed handles.

Paths: ``kernel`` (Triton UVA kernel), ``direct`` (copy engines, runs of adjacent pages),
``batch`` (copy engines, every row of a layer or backup in one ``cudaMemcpyBatchAsync``),
``staged`` (copy engines on host runs + kernel scatter/gather on the device), ``mixed`` (loads:
part copy engines, part UVA kernel, at once, split by pages or by component: ``LoadSplit``),
``torch`` (the reference), ``auto`` (chosen per call from the id runs, the host geometry, the
number of layers and whether a backup is in flight: ``transfer_policy``, which holds the measured
rules). This module must never block on the device: it only queries an event (non-blocking) to
choose a path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from .device_pool import DevicePool
from .errors import IndexValidationError, PoolError, SpecMismatchError
from .host_pool import HostPool
from .kernels import copy_pages_reference
from .transfer import IdsLike, PageCopy, backup_pairs, load_pairs, validate
from .transfer_policy import (
    MAX_COPY_STREAMS,
    MIXED_LOADS,
    MIXED_LOADS_BESIDE_BACKUP,
    PATHS,
    SINGLE_LAYER_WITHOUT_BATCH,
    LoadSplit,
    choose_path,
)

class LoadHandle:
    """A load in flight: one CUDA event per loaded layer (None on CPU, where it is complete)."""

    def __init__(self, device: torch.device, layers: Sequence[int], events: dict[int, torch.cuda.Event] | None,
                 copy: PageCopy, path: str) -> None:
        self.device = device
        self.layers = tuple(layers)
        self.path = path
        self.copy = copy
        self._events = events

    def wait_layer(self, layer: int, stream: torch.cuda.Stream | None = None) -> None:
        """Make ``stream`` (default: the current stream) wait until ``layer`` has fully landed.

        Covers every component of the layer (NSA: latent and indexer). Never blocks the caller.
        """
        if layer not in self.layers:
            raise IndexValidationError(f"layer {layer} is not part of this load (layers {self.layers[0]}..{self.layers[-1]})")
        if self._events is None:
            return
        if stream is None:
            stream = torch.cuda.current_stream(self.device)
        stream.wait_event(self._events[layer])

    def event(self, layer: int) -> torch.cuda.Event | None:
        """The CUDA event recorded once ``layer`` has landed (None on CPU)."""
        return None if self._events is None else self._events[layer]

    def layer_done(self, layer: int) -> bool:
        """Whether ``layer`` has landed (non-blocking)."""
        if layer not in self.layers:
            raise IndexValidationError(f"layer {layer} is not part of this load")
        return self._events is None or self._events[layer].query()

    def done(self) -> bool:
        """Whether every layer has landed (non-blocking): the completion for slots and pages."""
        return self._events is None or all(e.query() for e in self._events.values())

    query = done

    def synchronize(self) -> None:
        """Block the calling thread until the load completed (tests, benchmarks; not the hot path)."""
        if self._events is not None:
            for event in self._events.values():
                event.synchronize()


class BackupHandle:
    """A backup in flight: one event after the last byte reached host memory (None on CPU)."""

    def __init__(self, event: torch.cuda.Event | None, copy: PageCopy, path: str) -> None:
        self._event = event
        self.copy = copy
        self.path = path

    def done(self) -> bool:
        """Whether the backup completed (non-blocking); pass the handle as a pool completion."""
        return self._event is None or self._event.query()

    query = done

    @property
    def event(self) -> torch.cuda.Event | None:
        return self._event

    def synchronize(self) -> None:
        """Block the calling thread until the backup completed (tests, benchmarks)."""
        if self._event is not None:
            self._event.synchronize()


class TransferEngine:
    """Copies pages between one device pool and one host pool of the same spec.

    Args:
        device_pool, host_pool: pools of one spec; the host pool pinned when the device is a GPU.
        path: default path for every call (see module docstring).
        num_ctas: CTA budget of the UVA kernel launches (default: measured per direction).
        staging_bytes, staging_buffers, staging_ctas: the device staging ring per direction
            (``staged`` / ``mixed`` paths, allocated on first use) and its kernel's CTA budget.
        timing: create the handles' events with timing enabled (benchmarks; slightly costlier).
    """

    def __init__(self, device_pool: DevicePool, host_pool: HostPool, *, path: str = "auto", num_ctas: int | None = None,
                 staging_bytes: int | None = None, staging_buffers: int = 2, staging_ctas: int | None = None,
                 timing: bool = False) -> None:
        if device_pool.spec.fingerprint != host_pool.spec.fingerprint:
            raise SpecMismatchError(
                f"device pool spec ({device_pool.spec.describe()}) differs from host pool spec ({host_pool.spec.describe()})"
            )
        self._check_path(path)
        self.device_pool = device_pool
        self.host_pool = host_pool
        self.path = path
        self.num_ctas = num_ctas
        self.device = device_pool.device
        self.on_gpu = self.device.type == "cuda"
        self._staging_bytes = staging_bytes
        self._staging_buffers = staging_buffers
        self._staging_ctas = staging_ctas
        self._timing = timing
        #: Overrides for ``mixed`` loads: the whole split (None: ``MIXED_LOADS`` by geometry, load
        #: length and backups in flight), then its copy-engine share alone.
        self.load_split: LoadSplit | None = None
        self.ce_fraction: float | None = None
        #: ``cudaMemcpyFlags`` of the ``batch`` path's calls (benchmarks compare them).
        self.batch_flags = 0
        self._last_backup: torch.cuda.Event | None = None
        self._word: int | None = None
        self._copiers: dict[str, object] = {}
        self._backup_pairs = backup_pairs(device_pool, host_pool)
        self._load_pairs = [load_pairs(host_pool, device_pool, layer) for layer in range(device_pool.spec.num_layers)]
        # Host rows are dense when every per-layer host chunk view has pitch == chunk.
        self._dense_host_rows = all(h.stride(0) == h.shape[1] for pairs in self._load_pairs for h, _ in pairs)
        self._plans: dict[object, object] = {}
        from .kernels.batch_copy import available as batch_available

        # On CPU the batch path is memmove over the same copy list: always there.
        self._has_batch = not self.on_gpu or batch_available()
        if self.on_gpu:
            if not host_pool.memory.pinned:
                # UVA kernels and async copy-engine copies both need page-locked host memory.
                raise PoolError("a GPU transfer engine needs a pinned host pool (HostPool(..., pin=True))")
            with torch.cuda.device(self.device):
                self.load_stream = torch.cuda.Stream(self.device)
                self.load_copy_stream = torch.cuda.Stream(self.device)
                self.backup_stream = torch.cuda.Stream(self.device)
                self.backup_copy_stream = torch.cuda.Stream(self.device)
                self.load_uva_stream = torch.cuda.Stream(self.device)  # the kernel half of ``mixed`` loads
                # More copy streams for staged loads split over several copy engines.
                self._load_copy_extra = [torch.cuda.Stream(self.device) for _ in range(MAX_COPY_STREAMS - 1)]
                # Join events of ``mixed`` loads, re-recorded per layer (a wait binds to the record
                # before it, so reuse across layers is safe).
                self._uva_done = [torch.cuda.Event() for _ in range(4)]
                # Fork / join of batched copies split over several copy streams (re-recorded per layer).
                self._batch_fork = torch.cuda.Event()
                self._batch_join = [torch.cuda.Event() for _ in range(MAX_COPY_STREAMS - 1)]

    # --- public ----------------------------------------------------------------------------------
    def backup(self, device_pages: IdsLike, host_slots: IdsLike, *, path: str | None = None,
               token_indices: bool = False) -> BackupHandle:
        """Copy every component and layer of ``device_pages`` into ``host_slots``; returns at once.

        Args:
            device_pages: page ids (or engine token indices with ``token_indices=True``), any
                int sequence or 1-D integer tensor; CPU tensors avoid a device sync.
            host_slots: slot ids of the host pool, unique.
        """
        copy = validate(self.device_pool, self.host_pool, device_pages, host_slots, to_host=True, token_indices=token_indices)
        path = self._choose(path, copy, to_host=True)
        if path == "mixed":
            path = "staged"  # splitting pays off for host reads only; device -> host copy engines run at full rate
        if not self.on_gpu:
            self._run_on_cpu(path, self._backup_pairs, copy.device_pages, copy.host_slots, to_host=True, key="backup")
            return BackupHandle(None, copy, path)
        with torch.cuda.device(self.device):
            caller = torch.cuda.current_stream(self.device)
            self.backup_stream.wait_stream(caller)
            self.backup_copy_stream.wait_stream(caller)
            done_on = self.backup_stream
            if len(copy):
                if path == "kernel":
                    with torch.cuda.stream(self.backup_stream):
                        self._uva(self._plan("backup", self._backup_pairs), copy.device_pages, copy.host_slots)
                elif path == "staged":
                    self.staging_copier("backup").to_host(self._backup_pairs, copy.device_pages, copy.host_slots,
                                                   copy_stream=self.backup_copy_stream, kernel_stream=self.backup_stream)
                    done_on = self.backup_copy_stream
                elif path == "direct":
                    from .kernels import copy_pages_direct

                    copy_pages_direct(self._backup_pairs, copy.device_pages, copy.host_slots, stream=self.backup_stream)
                elif path == "batch":
                    from .kernels.batch_copy import plan_copy_list, run_copy_list

                    copies = plan_copy_list(self._backup_pairs, copy.device_pages, copy.host_slots)
                    run_copy_list(copies, stream=self.backup_stream, on_gpu=True, flags=self.batch_flags)
                else:
                    with torch.cuda.stream(self.backup_stream):
                        copy_pages_reference(self._backup_pairs, copy.device_pages, copy.host_slots)
            event = torch.cuda.Event(enable_timing=self._timing)
            event.record(done_on)
            self._last_backup = event
        return BackupHandle(event, copy, path)

    def load(self, host_slots: IdsLike, device_pages: IdsLike, *, layers: Sequence[int] | None = None,
             path: str | None = None, token_indices: bool = False) -> LoadHandle:
        """Copy ``host_slots`` into ``device_pages`` layer by layer (default: every layer, in order).

        Enqueues everything at once and returns; each layer gets its own event, recorded once all
        of its components have landed, so the engine can compute layer i while i+1 is in flight.
        """
        num_layers = self.device_pool.spec.num_layers
        layers = list(range(num_layers)) if layers is None else [int(layer) for layer in layers]
        for layer in layers:
            if not 0 <= layer < num_layers:
                raise IndexValidationError(f"layer {layer} outside 0..{num_layers - 1}")
        if len(set(layers)) != len(layers):
            raise IndexValidationError(f"layers repeat: {layers}")
        copy = validate(self.device_pool, self.host_pool, device_pages, host_slots, to_host=False, token_indices=token_indices)
        path = self._choose(path, copy, to_host=False, single_layer=len(layers) == 1)
        split = self._load_split(len(layers)) if path in ("mixed", "staged") else LoadSplit()
        if path == "staged":
            split = replace(split, ce_fraction=1.0, by="pages")
        if not self.on_gpu:
            if path in ("staged", "mixed") and len(copy):
                self._staged_load_on_cpu(path, layers, copy, split)
            else:
                for layer in layers:
                    self._run_on_cpu(path, self._load_pairs[layer], copy.host_slots, copy.device_pages, to_host=False,
                                     key=("load", layer))
            return LoadHandle(self.device, layers, None, copy, path)
        with torch.cuda.device(self.device):
            events = _GpuLoad(self, layers, copy, path, split).enqueue()
        return LoadHandle(self.device, layers, events, copy, path)

    def _load_split(self, num_layers: int) -> LoadSplit:
        """How a ``mixed`` load of ``num_layers`` layers is split now (see ``MIXED_LOADS``)."""
        if self.load_split is not None:
            split = self.load_split
        elif self._last_backup is not None and not self._last_backup.query():
            split = MIXED_LOADS_BESIDE_BACKUP[self._dense_host_rows]
        else:
            split = MIXED_LOADS[(self._dense_host_rows, num_layers > 1)]
            if split.ce_path == "batch" and not self._has_batch:
                split = SINGLE_LAYER_WITHOUT_BATCH[self._dense_host_rows]
        if self.ce_fraction is not None:
            split = replace(split, ce_fraction=self.ce_fraction, by="pages")
        return split

    def _parts(self, copy: PageCopy, path: str,
               split: LoadSplit) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """(kernel part, copy-engine part) of a load: every page to both when split by component
        (each side then copies only its components), else ``_split`` by pages."""
        if path == "mixed" and self._components(split)[0] is not None:
            return (copy.host_slots, copy.device_pages), (copy.host_slots, copy.device_pages)
        return self._split(copy, path, split.ce_fraction)

    def _components(self, split: LoadSplit) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
        """(components of each layer the UVA kernel copies, None for all; those the copy engines copy)."""
        sizes = [c.bytes_per_layer for c in self.device_pool.spec.components]
        everything = tuple(range(len(sizes)))
        if split.by != "components" or len(set(sizes)) == 1:
            return None, everything
        largest = max(everything, key=lambda ci: sizes[ci])
        return tuple(ci for ci in everything if ci != largest), (largest,)

    def _ce_fraction(self, num_layers: int) -> float:
        """Share of a ``mixed`` load's pages that goes through the copy engines (see ``MIXED_LOADS``)."""
        return self._load_split(num_layers).ce_fraction

    def _split(self, copy: PageCopy, path: str,
               fraction: float) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """(kernel part, copy-engine part) of a load as (host slots, device pages) each.

        ``mixed`` gives the copy engines the first ``fraction`` of the pages in host-slot order
        (so their runs stay long) and the UVA kernel the rest; both read PCIe at once, which fills
        the link better than either alone (see docs/benchmarks.md).
        """
        if path == "kernel":
            return (copy.host_slots, copy.device_pages), (copy.host_slots[:0], copy.device_pages[:0])
        order = torch.argsort(copy.host_slots, stable=True)
        slots, pages = copy.host_slots[order], copy.device_pages[order]
        k = int(round(fraction * len(copy)))
        return (slots[k:], pages[k:]), (slots[:k], pages[:k])

    def load_layer(self, host_slots: IdsLike, device_pages: IdsLike, layer: int, **options) -> LoadHandle:
        """``load`` of one layer."""
        return self.load(host_slots, device_pages, layers=[layer], **options)

    # --- path choice -----------------------------------------------------------------------------
    @staticmethod
    def _check_path(path: str) -> None:
        if path not in PATHS:
            raise ValueError(f"unknown transfer path {path!r}; choose one of {PATHS}")

    def _choose(self, path: str | None, copy: PageCopy, *, to_host: bool, single_layer: bool = False) -> str:
        path = path or self.path
        self._check_path(path)
        if path != "auto":
            return path
        if not self.on_gpu or len(copy) == 0:
            return "torch"
        return choose_path(copy.host_slots, copy.device_pages, to_host=to_host,
                           single_layer_batch=single_layer and self._has_batch)

    # --- helpers ---------------------------------------------------------------------------------
    def _plan(self, key, pairs):
        plan = self._plans.get(key)
        if plan is None:
            from .kernels import plan_uva_copy

            plan = self._plans[key] = plan_uva_copy(pairs)
        return plan

    def _load_plan(self, layer: int, components: tuple[int, ...] | None = None):
        """The UVA plan of one layer's load (of ``components``, default all); all layers share one
        anchor, so one upload serves all."""
        key = ("load", layer, components)
        plan = self._plans.get(key)
        if plan is None:
            from .kernels import plan_uva_copy

            anchor = self.device_pool.chunk_view(0, 0)
            pairs = self._load_pairs[layer] if components is None else [self._load_pairs[layer][ci] for ci in components]
            plan = self._plans[key] = plan_uva_copy(pairs, anchor=anchor, word_bytes=self._load_word)
        return plan

    @property
    def _load_word(self) -> int:
        """One word size for every layer's plan (shared upload): 4 B unless some layer needs bytes."""
        if self._word is None:
            from .kernels import plan_uva_copy

            pairs = [pair for layer_pairs in self._load_pairs for pair in layer_pairs]
            self._word = plan_uva_copy(pairs, anchor=self.device_pool.chunk_view(0, 0)).word_bytes
        return self._word

    def _uva(self, plan, src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
        from .kernels import copy_pages_uva

        copy_pages_uva(plan, src_ids, dst_ids, num_ctas=self.num_ctas)

    def staging_copier(self, direction: str):
        """The staging ring of ``"load"`` or ``"backup"`` (created on first use; tune ``num_ctas`` on it)."""
        copier = self._copiers.get(direction)
        if copier is None:
            from .kernels import StagedCopier
            from .kernels.staged_copy import DEFAULT_BUFFER_BYTES
            from .kernels.uva_copy import DEFAULT_CTAS_ON_DEVICE

            copier = self._copiers[direction] = StagedCopier(
                self.device, buffer_bytes=self._staging_bytes or DEFAULT_BUFFER_BYTES, num_buffers=self._staging_buffers,
                num_ctas=self._staging_ctas or DEFAULT_CTAS_ON_DEVICE,
            )
        return copier

    def _staged_load_on_cpu(self, path: str, layers: Sequence[int], copy: PageCopy, split: LoadSplit) -> None:
        """A staged or mixed load on CPU pools, split and grouped as on a GPU (``load``)."""
        kernel_components, ce_components = self._components(split)
        staged = (copy.host_slots, copy.device_pages)
        if path == "mixed":
            kernel, staged = self._parts(copy, path, split)
            for layer in layers:
                pairs = self._load_pairs[layer]
                kernel_pairs = pairs if kernel_components is None else [pairs[ci] for ci in kernel_components]
                if len(kernel[0]):
                    self._uva(self._plan(("load", layer, kernel_components), kernel_pairs), *kernel)
        if split.ce_path == "batch" and path == "mixed":
            from .kernels.batch_copy import copy_pages_batch

            for layer in layers:
                copy_pages_batch([self._load_pairs[layer][ci] for ci in ce_components], *staged)
            return
        groups = [[self._load_pairs[layers[i]][ci] for i in block for ci in ce_components]
                  for block in _blocks(len(layers), split)]
        self.staging_copier("load").to_device_groups(groups, *staged, copy_stream=[None] * split.copy_streams,
                                                     unit_rows=split.unit_rows)

    def _run_on_cpu(self, path: str, pairs, src_ids: torch.Tensor, dst_ids: torch.Tensor, *, to_host: bool,
                    key) -> None:
        """CPU pools: the same paths run synchronously (kernels through Triton's interpreter)."""
        if len(src_ids) == 0:
            return
        if path == "kernel":
            self._uva(self._plan(key, pairs), src_ids, dst_ids)
        elif path == "staged":  # backups (staged and mixed loads: _staged_load_on_cpu)
            self.staging_copier("backup").to_host(pairs, src_ids, dst_ids)
        elif path == "direct":
            from .kernels import copy_pages_direct

            copy_pages_direct(pairs, src_ids, dst_ids)
        elif path == "batch":
            from .kernels.batch_copy import copy_pages_batch

            copy_pages_batch(pairs, src_ids, dst_ids)
        else:
            copy_pages_reference(pairs, src_ids, dst_ids)


class _GpuLoad:
    """Enqueues one load on a GPU: per layer, the UVA kernel's half and the copy engines' half
    (whichever the path uses), then the layer's event once every component has landed.

    One object per ``TransferEngine.load`` call; it borrows the engine's streams, events, plans
    and staging ring, and is dropped when the call returns. Runs under the pool's device.
    """

    def __init__(self, engine: "TransferEngine", layers: list[int], copy: PageCopy, path: str, split: LoadSplit) -> None:
        self.engine, self.layers, self.copy, self.path, self.split = engine, layers, copy, path, split
        self.kernel_components, self.ce_components = engine._components(split)
        self.events: dict[int, torch.cuda.Event] = {}
        self.ce_ids = (copy.host_slots, copy.device_pages)  # the copy engines' pages (all of them unless split)
        self.uva = None  # (stream, plans, tables, slots on the device, pages on the device)

    def enqueue(self) -> dict[int, torch.cuda.Event]:
        engine, path = self.engine, self.path
        caller = torch.cuda.current_stream(engine.device)
        for stream in (engine.load_stream, engine.load_copy_stream, engine.load_uva_stream):
            stream.wait_stream(caller)
        if not len(self.copy):
            for index in range(len(self.layers)):
                self._finish_layer(index)
        else:
            if path in ("kernel", "mixed"):
                self._prepare_kernel_half()
            if path == "mixed" and self.split.ce_path == "batch":
                self._batched_copy_engine_half()
            elif path in ("staged", "mixed"):
                self._staged_copy_engine_half()
            else:
                self._per_layer()
        return self.events

    def _prepare_kernel_half(self) -> None:
        """Split the pages (``mixed``) and upload every layer's kernel table and the ids at once."""
        from .kernels.uva_copy import upload

        engine = self.engine
        kernel_part, self.ce_ids = engine._parts(self.copy, self.path, self.split)
        stream = engine.load_stream if self.path == "kernel" else engine.load_uva_stream
        plans = [engine._load_plan(layer, self.kernel_components) for layer in self.layers]
        with torch.cuda.stream(stream):
            uploaded = upload(engine.device, [p.table for p in plans] + list(kernel_part))
        self.uva = (stream, plans, uploaded[:-2], uploaded[-2], uploaded[-1])

    def _finish_layer(self, index: int) -> None:
        """Launch the layer's kernel half (if any), join it, and record the layer's event."""
        engine = self.engine
        if self.uva is not None:
            from .kernels.uva_copy import launch_uva

            stream, plans, tables, slots_dev, pages_dev = self.uva
            with torch.cuda.stream(stream):
                launch_uva(plans[index], tables[index], slots_dev, pages_dev, num_ctas=engine.num_ctas)
            if self.path == "mixed":
                # The layer is complete only once both halves of it have landed.
                joined = engine._uva_done[index % len(engine._uva_done)]
                joined.record(stream)
                engine.load_stream.wait_event(joined)
        event = torch.cuda.Event(enable_timing=engine._timing)
        event.record(engine.load_stream)
        self.events[self.layers[index]] = event

    def _batched_copy_engine_half(self) -> None:
        """Per layer, one memcpy batch straight into the pages, on load_stream itself (split over
        ``copy_streams`` streams that fork from and join back into it), so ``_finish_layer``'s
        join of the kernel half completes the layer there."""
        from .kernels.batch_copy import plan_copy_list, run_copy_list, split_copy_list

        engine = self.engine
        slots, pages = self.ce_ids
        extra = engine._load_copy_extra[:self.split.copy_streams - 1]
        for index, layer in enumerate(self.layers):
            pairs = engine._load_pairs[layer]
            copies = plan_copy_list([pairs[ci] for ci in self.ce_components], slots, pages)
            parts = split_copy_list(copies, 1 + len(extra))
            if extra:
                engine._batch_fork.record(engine.load_stream)
            for stream, part in zip(extra, parts[1:]):
                stream.wait_event(engine._batch_fork)
                run_copy_list(part, stream=stream, on_gpu=True, flags=engine.batch_flags)
            run_copy_list(parts[0], stream=engine.load_stream, on_gpu=True, flags=engine.batch_flags)
            for stream, joined in zip(extra, engine._batch_join):
                joined.record(stream)
                engine.load_stream.wait_event(joined)
            self._finish_layer(index)

    def _staged_copy_engine_half(self) -> None:
        """Copy engines into the staging ring, scattered by its kernel on load_stream; blocks of
        ``layers_per_copy`` layers, whose events are recorded once the whole block landed."""
        engine, split = self.engine, self.split
        blocks = _blocks(len(self.layers), split)
        groups = [[engine._load_pairs[self.layers[i]][ci] for i in block for ci in self.ce_components]
                  for block in blocks]
        copy_streams = [engine.load_copy_stream, *engine._load_copy_extra[:split.copy_streams - 1]]

        def finish_block(b: int) -> None:
            for index in blocks[b]:
                self._finish_layer(index)

        # One call for every layer: sorting, runs and the table upload happen once.
        engine.staging_copier("load").to_device_groups(
            groups, *self.ce_ids, copy_stream=copy_streams, kernel_stream=engine.load_stream,
            on_group_done=finish_block, unit_rows=split.unit_rows, num_ctas=split.staging_ctas)

    def _per_layer(self) -> None:
        """``kernel``, ``direct``, ``batch`` and ``torch``: each layer's copy, then its event."""
        engine, copy = self.engine, self.copy
        runs = None
        for index, layer in enumerate(self.layers):
            pairs = engine._load_pairs[layer]
            if self.path == "direct":
                from .kernels import copy_pages_direct, find_runs

                if runs is None:
                    runs = find_runs(copy.host_slots, copy.device_pages)
                copy_pages_direct(pairs, copy.host_slots, copy.device_pages, stream=engine.load_stream, runs=runs)
            elif self.path == "batch":
                from .kernels.batch_copy import plan_copy_list, run_copy_list

                copies = plan_copy_list(pairs, copy.host_slots, copy.device_pages)
                run_copy_list(copies, stream=engine.load_stream, on_gpu=True, flags=engine.batch_flags)
            elif self.path == "torch":
                with torch.cuda.stream(engine.load_stream):
                    copy_pages_reference(pairs, copy.host_slots, copy.device_pages)
            self._finish_layer(index)


def _blocks(num_layers: int, split: LoadSplit) -> list[list[int]]:
    """Indices of a load's layers in blocks of ``split.layers_per_copy`` (the staged groups)."""
    per = max(1, split.layers_per_copy)
    return [list(range(start, min(start + per, num_layers))) for start in range(0, num_layers, per)]


__all__ = ["MIXED_LOADS", "MIXED_LOADS_BESIDE_BACKUP", "PATHS", "SINGLE_LAYER_WITHOUT_BATCH", "BackupHandle",
           "LoadHandle", "LoadSplit", "TransferEngine", "choose_path"]
