"""The worker-side transfer engine: L1 <-> L2 page copies on the library's own CUDA streams.

    engine = TransferEngine(device_pool, host_pool)           # path="auto"
    load = engine.load(host_slots, device_pages)              # every layer, one event per layer
    for layer in range(num_layers):
        load.wait_layer(layer)                                # the engine's stream waits for
        ...                                                   # exactly this layer (all components)
    backup = engine.backup(device_pages, host_slots)          # all layers, returns at once
    host_pool.free(slots, completion=backup)                  # released only once it completed

Rules this module keeps:
- Every CUDA call is issued under the pool's device, on streams this engine owns (loads: kernel,
  copy-engine and UVA streams, and one stream per library issue thread; backups: kernel and
  copy-engine streams), never on the default stream, from the caller's thread or, for loads whose
  issue costs more CPU than their copies take, from a library issue thread
  (``TransferOptions.issue_threads``). Each transfer first waits for the work already enqueued on
  the caller's current stream (the pages it reads or overwrites may still be in use there); an
  issue thread's stream waits on an event the caller's thread recorded there first. ``wait_layer``
  of a layer that a library thread has not issued yet waits on the CPU until it has (never on the
  device).
- Validation (``tiered_kv.transfers.torch_path.validate``) runs on CPU copies of the ids before anything is
  enqueued, so no call forces a device sync and a rejected call writes nothing.
- A load of several layers may start with a head (``LoadSplit.head_layers``, ``auto``'s policy):
  its first layers go through the UVA kernel from the caller's thread before anything else of
  the load is planned, so a model waiting on layer 0 starts about one layer's copy after the
  call; the rest follows on its path, its copies ordered after the head's.
- A load records a CUDA event for each layer after *every* component of that layer (latent and
  indexer) has landed; ``wait_layer(i)`` waits on exactly that event (layers that land together,
  a kernel block, share one).
- A backup returns a completion (``done()`` / ``query()``) that never blocks; host slots and
  device pages it touches are to be released only through it.
- On a CPU machine the same calls run the copy at once and return completed handles.

Paths are a table (``COPY_PATHS``): each one a small class with the same two methods, the backup
of every layer and the load of a list of layers, which run on a GPU (enqueue on the engine's
streams) and on CPU pools (at once, kernels through Triton's interpreter) alike.
``kernel`` (Triton UVA kernel), ``direct`` (copy engines, runs of adjacent pages),
``batch`` (copy engines, every row of a layer or backup in one ``cudaMemcpyBatchAsync``),
``staged`` (copy engines on host runs + kernel scatter/gather on the device), ``mixed`` (loads:
part copy engines, part UVA kernel, at once, split by pages or by component: ``LoadSplit``),
``torch`` (the reference), ``auto`` (chosen per call from the direction, the id runs, the host
geometry, the number of layers and whether a backup is in flight: ``transfer_policy``, which holds
the measured rules). The knobs (split, copy-engine share, batch flags, CTA budget, issue threads)
are one frozen ``TransferOptions`` given to the engine, or to one call. This module must never
block on the device: it only queries an event (non-blocking) to choose a path.
"""

from __future__ import annotations

import functools
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch

from ..model.device_pool import DevicePool
from ..errors import ConfigError, IndexValidationError, PoolError, SpecMismatchError
from ..model.host_pool import HostPool
from ..model.integers import as_int
from ..kernels import copy_pages_reference
from ..kernels.owned_streams import StreamLease
from ..kernels.streams import on_stream
from .torch_path import IdsLike, PageCopy, backup_pairs, load_pairs, validate
from .policy import (
    KERNEL_LOADS,
    BackupSplit,
    CALLER_HEAD_BLOCKS,
    LOAD_STREAM_PRIORITY,
    MAX_ISSUE_THREADS,
    PATHS,
    LoadSplit,
    TransferOptions,
    choose_backup_split,
    choose_path,
    choose_split,
    issue_threads,
)


@dataclass
class _KernelPart:
    """A load's UVA part, uploaded: one plan and table per block of layers, the ids, which block
    each layer index is in and each block's last index, and the indices waiting for their block."""

    stream: torch.cuda.Stream | None
    plans: list
    tables: list[torch.Tensor]
    slots: torch.Tensor
    pages: torch.Tensor
    block_of: list[int]
    last_of: list[int]
    waiting: list[int] = field(default_factory=list)


class _Issued:
    """Which layers of a load a library thread has issued (their events recorded), and its error.

    The caller's thread waits here (on the CPU, never on the device) before it makes a stream
    wait on a layer's event: a wait on an event not yet recorded would wait on nothing.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._layers: set[int] = set()
        self._pending = 0
        self.error: BaseException | None = None

    def add_jobs(self, count: int) -> None:
        with self._cond:
            self._pending += count

    def layer(self, layer: int) -> None:
        with self._cond:
            self._layers.add(layer)
            self._cond.notify_all()

    def job_done(self, error: BaseException | None = None) -> None:
        with self._cond:
            self._pending -= 1
            if error is not None and self.error is None:
                self.error = error
            self._cond.notify_all()

    def wait(self, layer: int | None = None) -> None:
        """Until ``layer`` (None: every job) was issued; re-raises a library thread's error."""
        with self._cond:
            self._cond.wait_for(lambda: self.error is not None or self._pending == 0
                                or (layer is not None and layer in self._layers))
            if self.error is not None:
                raise self.error

    def busy(self) -> bool:
        """Whether a job is still issuing (never raises: a failed job counts as finished)."""
        with self._cond:
            return self.error is None and self._pending > 0

    def settled(self, layers: Sequence[int] = ()) -> bool:
        """Whether every job finished, or every one of ``layers`` was issued (a job may still be
        returning after recording its last event); re-raises a library thread's error."""
        with self._cond:
            if self.error is not None:
                raise self.error
            return self._pending == 0 or bool(layers) and self._layers.issuperset(layers)


class LoadHandle:
    """A load in flight: a CUDA event per loaded layer, shared by layers that land together (None
    on CPU, where it is complete)."""

    def __init__(self, device: torch.device, layers: Sequence[int], events: dict[int, torch.cuda.Event] | None,
                 copy: PageCopy, path: str, issued: _Issued | None = None) -> None:
        self.device = device
        self.layers = tuple(layers)
        self.path = path
        self.copy = copy
        self._events = events
        self._issued = issued

    def _check(self, layer: int) -> int:
        """``layer`` as an int of this load; IndexValidationError otherwise."""
        layer = _layer_index(layer, "layer")
        if layer not in self.layers:
            raise IndexValidationError(f"layer {layer} is not part of this load (layers {self.layers})")
        return layer

    def wait_layer(self, layer: int, stream: torch.cuda.Stream | None = None) -> None:
        """Make ``stream`` (default: the current stream) wait until ``layer`` has fully landed.

        Covers every component of the layer (NSA: latent and indexer). Never blocks the caller on
        the device (at most on a library thread's issue of that layer).
        """
        layer = self._check(layer)
        if self._events is None:
            return
        if stream is None:
            stream = torch.cuda.current_stream(self.device)
        stream.wait_event(self.event(layer))

    def event(self, layer: int) -> torch.cuda.Event | None:
        """The CUDA event recorded once ``layer`` has landed (None on CPU)."""
        layer = self._check(layer)
        if self._events is None:
            return None
        if self._issued is not None:
            self._issued.wait(layer)
        return self._events[layer]

    def layer_done(self, layer: int) -> bool:
        """Whether ``layer`` has landed (non-blocking)."""
        layer = self._check(layer)
        if self._events is None:
            return True
        if self._issued is not None and not self._issued.settled((layer,)):
            return False
        return self._events[layer].query()

    def done(self) -> bool:
        """Whether every layer has landed (non-blocking): the completion for slots and pages."""
        if self._events is None:
            return True
        if self._issued is not None and not self._issued.settled(self.layers):
            return False
        return all(e.query() for e in self._events.values())

    query = done

    def in_flight(self) -> bool:
        """Whether the load is still issuing or copying (never raises: what a path choice asks)."""
        if self._events is None:
            return False
        if self._issued is not None:
            if self._issued.busy():
                return True
            if self._issued.error is not None:
                return False
        # Later layers land last: the common answer comes from the first event asked.
        return not all(self._events[layer].query() for layer in reversed(self.layers) if layer in self._events)

    def synchronize(self) -> None:
        """Block the calling thread until the load completed (tests, benchmarks; not the hot path)."""
        if self._events is not None:
            if self._issued is not None:
                self._issued.wait()
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

    def in_flight(self) -> bool:
        """Whether the backup is still copying (never raises: what a path choice asks)."""
        return self._event is not None and not self._event.query()

    @property
    def event(self) -> torch.cuda.Event | None:
        """The event recorded after the backup's last copy."""
        return self._event

    def synchronize(self) -> None:
        """Block the calling thread until the backup completed (tests, benchmarks)."""
        if self._event is not None:
            self._event.synchronize()


class _IssueThreads:
    """The engine's library issue threads: one daemon thread and one stream each, FIFO jobs.

    A job runs under the pool's device with the thread's stream current. Jobs of one load on one
    thread run in order; the engine's lock serialises what they share with other loads.
    """

    def __init__(self, device: torch.device, count: int, priority: int = 0, streams: StreamLease | None = None) -> None:
        self.device = device
        self._lease = streams if streams is not None else StreamLease(device)
        self.streams = [self._lease.take(priority) for _ in range(count)]
        self._queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(count)]
        self._stopped = False
        self._threads = [threading.Thread(target=self._work, args=(k,), name=f"tiered-kv-issue-{k}", daemon=True)
                         for k in range(count)]
        for thread in self._threads:
            thread.start()

    def __len__(self) -> int:
        return len(self.streams)

    def submit(self, k: int, job: Callable[[], None], issued: _Issued) -> None:
        issued.add_jobs(1)
        self._queues[k].put((job, issued))

    def _work(self, k: int) -> None:
        try:
            with torch.cuda.device(self.device):
                while True:
                    item = self._queues[k].get()
                    if item is None:
                        return
                    job, issued = item
                    try:
                        with torch.cuda.stream(self.streams[k]):
                            job()
                    except BaseException as exc:  # handed to the caller's thread through the handle
                        issued.job_done(exc)
                    else:
                        issued.job_done()
                    # A finished job's closure holds its engine: not kept while this thread waits.
                    item = job = issued = None
        finally:
            self._lease.give_back([self.streams[k]])  # this thread issues nothing more on it

    def stop(self) -> None:
        """Ask every thread to end after the jobs already queued (once; returns at once, so a
        finalizer may call it from any thread). Each thread gives its stream back as it ends."""
        if not self._stopped:
            self._stopped = True
            for q in self._queues:
                q.put(None)

    def close(self) -> None:
        """``stop``, then wait for the threads (not from one of them: a job cannot wait for itself)."""
        self.stop()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()


# --- the copy paths -------------------------------------------------------------------------------

@dataclass
class _Backup:
    """One backup call: what a path's ``backup`` needs. ``done_on``: the stream whose work the
    completion event follows (the path sets it; None on CPU)."""

    engine: "TransferEngine"
    copy: PageCopy
    options: TransferOptions
    done_on: torch.cuda.Stream | None = None

    @property
    def pairs(self):
        return self.engine._backup_pairs

    def stream(self, name: str) -> torch.cuda.Stream | None:
        return getattr(self.engine, name) if self.engine.on_gpu else None

    def copy_rows(self, device_pages: torch.Tensor, host_slots: torch.Tensor, stream: torch.cuda.Stream | None) -> None:
        """The copy-engine rows of ``device_pages`` -> ``host_slots`` (every pair) as one memcpy
        batch on ``stream`` (memmove on CPU)."""
        from ..kernels.batch_copy import plan_copy_list, run_copy_list

        if len(host_slots):
            run_copy_list(plan_copy_list(self.pairs, device_pages, host_slots), stream=stream,
                          on_gpu=self.engine.on_gpu, flags=self.options.batch_flags)


@dataclass
class _Load:
    """One load call: the layers, ids and split, and the per-layer completion events.

    A path's ``load`` enqueues each layer's copies and calls ``finish_layer(index)`` right after
    the layer's last copy was enqueued on ``load_stream``; on CPU the copies run at once and
    ``finish_layer`` records nothing.
    """

    engine: "TransferEngine"
    layers: list[int]
    copy: PageCopy
    split: LoadSplit
    options: TransferOptions
    events: dict[int, torch.cuda.Event] = field(default_factory=dict)  # layer -> its event, once issued
    issued: _Issued | None = None
    load_stream: torch.cuda.Stream | None = None
    uva: _KernelPart | None = None
    # Index of ``layers[0]`` in the whole load (a body after a head): a ``ramp_step`` ramp continues
    # from it; a doubling ramp starts again at one layer.
    first_index: int = 0
    # A load's head (``LoadSplit.head_layers``): its kernel tables stay on the device (``kernel_part``).
    head: bool = False

    def __post_init__(self) -> None:
        if self.engine.on_gpu and self.load_stream is None:
            self.load_stream = self.engine.load_stream

    def pairs(self, layer: int):
        return self.engine._load_pairs[layer]

    def finish_layer(self, index: int) -> None:
        """Launch the layer's kernel part (if any), join it, and record the layer's event.

        The kernel part moves blocks of layers (``kernel_part``): a layer whose block is not
        complete yet waits, and the block's launch records every waiting layer's event.
        """
        engine = self.engine
        indices = [index]
        if self.uva is not None:
            from ..kernels.uva_copy import launch_uva

            part = self.uva
            stream = part.stream
            part.waiting.append(index)
            block = part.block_of[index]
            if index != part.last_of[block]:
                return
            indices, part.waiting = part.waiting, []
            with on_stream(stream):
                launch_uva(part.plans[block], part.tables[block], part.slots, part.pages, num_ctas=self.options.num_ctas)
            if stream is not None and stream is not self.load_stream:
                # The layer is complete only once both parts of it have landed.
                joined = engine._uva_done[block % len(engine._uva_done)]
                joined.record(stream)
                self.load_stream.wait_event(joined)
        if not engine.on_gpu:
            return
        # One event for the layers that land together (a kernel block): fewer records on the
        # issuing thread, which a model waiting on layer 0 waits for.
        event = torch.cuda.Event(enable_timing=engine._timing)
        event.record(self.load_stream)
        for i in indices:
            layer = self.layers[i]
            self.events[layer] = event
            if self.issued is not None:
                self.issued.layer(layer)

    def kernel_part(self, kernel_part: tuple[torch.Tensor, torch.Tensor], components, stream) -> None:
        """Upload the kernel's tables (one per block of ``split.kernel_blocks`` layers, see
        ``_blocks``) and ids at once; ``finish_layer`` launches a block once its last layer is
        reached. Blocks cut the launches of a 61-layer load (about 0.1 ms of the issuing thread
        each) while a ramp keeps the first layer ready after one layer's copy."""
        from ..kernels.uva_copy import upload

        if not len(kernel_part[0]):
            # The copy engines take every page (``ce_fraction`` 1): no tables to plan or send, which
            # cost the body's thread about 1 ms on the H200's host before its first copy.
            return
        engine = self.engine
        blocks = _blocks(len(self.layers), self.split, kernel=True, offset=self.first_index)
        keys = [tuple(self.layers[i] for i in block) for block in blocks]
        plans = [engine._load_plan(key, components) for key in keys]
        device = engine.device if engine.on_gpu else torch.device("cpu")
        with on_stream(stream):
            if self.head:
                # A head's tables are uploaded once and kept; only the ids travel (``IdsRing``):
                # its upload is on the caller's path to layer 0, where a packed, freshly pinned
                # upload of tables and ids was over a quarter of the caller's time on the H200's
                # host, and its blocks are the same few for every load.
                tables = [engine._device_table(key, components) for key in keys]
                if stream is not None:
                    for table in tables:  # read here too: its memory stays until this stream is done
                        table.record_stream(stream)
                uploaded = tables + engine._upload_ids(kernel_part)
            else:
                uploaded = upload(device, [p.table for p in plans] + list(kernel_part))
        self.uva = _KernelPart(stream, plans, uploaded[:-2], uploaded[-2], uploaded[-1],
                               block_of=[b for b, block in enumerate(blocks) for _ in block],
                               last_of=[block[-1] for block in blocks])

    def staged_part(self, ce_ids, ce_components) -> None:
        """Copy engines into the staging ring, scattered by its kernel on ``load_stream``; blocks
        of ``layers_per_copy`` layers, whose events are recorded once the whole block landed.

        The first ``split.lead_blocks`` blocks are each planned and enqueued before the next one
        is planned (one call into the ring each), then the rest in one call, so copying starts
        while the issuing thread plans what follows."""
        engine, split = self.engine, self.split
        blocks = _blocks(len(self.layers), split, offset=self.first_index)
        sizes = [c.bytes_per_layer for c in engine.device_pool.spec.components]
        groups = [[self.pairs(self.layers[i])[ci] for i, ci in group]
                  for group in staged_groups(blocks, ce_components, sizes, split.minor_layers_per_copy,
                                             split.minor_lead_groups)]
        copy_stream = engine.load_copy_stream if engine.on_gpu else None
        copier = engine.staging_copier("load")
        lead = max(0, min(split.lead_blocks, len(groups) - 1))
        parts = [(g, g + 1) for g in range(lead)] + [(lead, len(groups))]
        for first, last in parts:
            def finish_block(b: int, first=first) -> None:
                for index in blocks[first + b]:
                    self.finish_layer(index)

            # One call per part: sorting and runs happen once per part, the table upload once per part
            # or, with ``plan_wave``, once per wave of it.
            copier.to_device_groups(groups[first:last], *ce_ids, copy_stream=copy_stream, kernel_stream=self.load_stream,
                                    on_group_done=finish_block, num_ctas=split.staging_ctas, first_wave=split.plan_wave)

    def batched_part(self, ce_ids, ce_components) -> None:
        """Per layer, one memcpy batch straight into the pages on ``load_stream``."""
        from ..kernels.batch_copy import plan_copy_list, run_copy_list

        for index, layer in enumerate(self.layers):
            copies = plan_copy_list([self.pairs(layer)[ci] for ci in ce_components], *ce_ids)
            run_copy_list(copies, stream=self.load_stream, on_gpu=self.engine.on_gpu, flags=self.options.batch_flags)
            self.finish_layer(index)


class CopyPath:
    """One way of moving pages; every path has these two methods (see ``COPY_PATHS``).

    ``backup(job)``: enqueue (GPU) or run (CPU) the copy of every layer of ``job.copy`` and set
    ``job.done_on``. ``load(job)``: the same for ``job.layers``, calling ``job.finish_layer(i)``
    after each layer; ``load_split`` gives the ``LoadSplit`` the load's job carries. ``name`` is
    the path's name in ``PATHS`` (what the handles report).
    """

    name = ""
    #: Whether a load of several layers through this path may start with a head
    #: (``LoadSplit.head_layers``): paths that plan or issue more than a kernel launch per block
    #: before their first copy do.
    takes_head = False

    def backup(self, job: _Backup) -> None:
        raise NotImplementedError

    def load_split(self, engine: "TransferEngine", num_layers: int, options: TransferOptions,
                   copy: PageCopy | None) -> LoadSplit:
        """The split a load of ``num_layers`` layers through this path takes (``copy`` only when
        ``auto`` chose the path: its slots may count as scattered)."""
        return options.load_split or LoadSplit()

    def load(self, job: _Load) -> None:
        raise NotImplementedError

    def per_layer(self, job: _Load, copy_layer: Callable[[list, torch.cuda.Stream | None], None]) -> None:
        for index, layer in enumerate(job.layers):
            copy_layer(job.pairs(layer), job.load_stream)
            job.finish_layer(index)


class TorchPath(CopyPath):
    """The reference: index_select + copy + index_copy_ (CPU pools' default)."""

    name = "torch"

    def backup(self, job: _Backup) -> None:
        job.done_on = job.stream("backup_stream")
        with torch.cuda.stream(job.done_on) if job.done_on is not None else nullcontext():
            copy_pages_reference(job.pairs, job.copy.device_pages, job.copy.host_slots)

    def load(self, job: _Load) -> None:
        def copy_layer(pairs, stream):
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                copy_pages_reference(pairs, job.copy.host_slots, job.copy.device_pages)
        self.per_layer(job, copy_layer)


class KernelPath(CopyPath):
    """The Triton UVA kernel: one launch for a backup, one per layer for a load (one upload)."""

    name = "kernel"

    def load_split(self, engine, num_layers, options, copy) -> LoadSplit:
        return options.load_split or KERNEL_LOADS

    def backup(self, job: _Backup) -> None:
        job.done_on = job.stream("backup_stream")
        with torch.cuda.stream(job.done_on) if job.done_on is not None else nullcontext():
            job.engine._uva(job.engine._plan("backup", job.pairs), job.copy.device_pages, job.copy.host_slots,
                            job.options.num_ctas)

    def load(self, job: _Load) -> None:
        self.start_load(job, None)

    def start_load(self, job: _Load, blocks: int | None) -> Callable[[], None] | None:
        """Upload the load's tables and ids and launch its first ``blocks`` blocks of layers (None:
        all) now; returns the launches of the rest, for a library thread to make (None: none left)."""
        job.kernel_part((job.copy.host_slots, job.copy.device_pages), None, job.load_stream)
        last_of = job.uva.last_of if job.uva is not None else [len(job.layers) - 1]
        now = len(job.layers) if blocks is None or blocks >= len(last_of) else last_of[blocks - 1] + 1
        for index in range(now):
            job.finish_layer(index)
        if now == len(job.layers):
            return None

        def rest() -> None:
            for index in range(now, len(job.layers)):
                job.finish_layer(index)
        return rest


class DirectPath(CopyPath):
    """Copy engines, one (2-D) copy per run of pages adjacent on both sides and pair."""

    name = "direct"
    takes_head = True

    def backup(self, job: _Backup) -> None:
        from ..kernels import copy_pages_direct

        job.done_on = job.stream("backup_stream")
        copy_pages_direct(job.pairs, job.copy.device_pages, job.copy.host_slots, stream=job.done_on)

    def load(self, job: _Load) -> None:
        from ..kernels import copy_pages_direct, find_runs

        runs = find_runs(job.copy.host_slots, job.copy.device_pages)
        self.per_layer(job, lambda pairs, stream: copy_pages_direct(pairs, job.copy.host_slots, job.copy.device_pages,
                                                                    stream=stream, runs=runs))


class BatchPath(CopyPath):
    """Copy engines, every row of a backup (or of a layer) in one ``cudaMemcpyBatchAsync``."""

    name = "batch"
    takes_head = True

    def backup(self, job: _Backup) -> None:
        job.done_on = job.stream("backup_stream")
        job.copy_rows(job.copy.device_pages, job.copy.host_slots, job.done_on)

    def load(self, job: _Load) -> None:
        from ..kernels.batch_copy import plan_copy_list, run_copy_list

        def copy_layer(pairs, stream):
            copies = plan_copy_list(pairs, job.copy.host_slots, job.copy.device_pages)
            run_copy_list(copies, stream=stream, on_gpu=job.engine.on_gpu, flags=job.options.batch_flags)
        self.per_layer(job, copy_layer)


class StagedPath(CopyPath):
    """Copy engines on host runs through the device staging ring, its kernel on the device side."""

    name = "staged"
    takes_head = True

    def load_split(self, engine, num_layers, options, copy) -> LoadSplit:
        # The copy engines take every page; the split's blocks and streams still apply.
        return replace(engine._load_split(num_layers, options, copy), ce_fraction=1.0, by="pages")

    def backup(self, job: _Backup) -> None:
        job.done_on = job.stream("backup_copy_stream")
        job.engine.staging_copier("backup").to_host(job.pairs, job.copy.device_pages, job.copy.host_slots,
                                                    copy_stream=job.done_on, kernel_stream=job.stream("backup_stream"))

    def load(self, job: _Load) -> None:
        job.staged_part((job.copy.host_slots, job.copy.device_pages), job.engine._components(job.split)[1])


class MixedPath(StagedPath):
    """Loads: copy engines and the UVA kernel at once, split by ``LoadSplit``. Backups: with a
    ``BackupSplit`` (``choose_backup_split``, which also asks whether a load of this engine is in
    flight; ``TransferOptions.backup_ce_fraction`` overrides its share) that share of the pages goes
    out as one memcpy batch straight from the device pages while the UVA kernel writes the rest,
    both at once; without one, staged (its copy engines already run at full rate on host runs)."""

    name = "mixed"

    def load_split(self, engine, num_layers, options, copy) -> LoadSplit:
        return engine._load_split(num_layers, options, copy)

    def backup(self, job: _Backup) -> None:
        engine = job.engine
        split = choose_backup_split(dense_host_rows=engine._dense_host_rows, scattered=job.copy.scattered,
                                    has_batch=engine._has_batch, load_in_flight=engine._load_running())
        if job.options.backup_ce_fraction is not None:
            split = BackupSplit(job.options.backup_ce_fraction, split.kernel_ctas if split is not None else None)
        if split is None:
            StagedPath.backup(self, job)
            return
        fraction = split.ce_fraction
        ctas = job.options.num_ctas if job.options.num_ctas is not None else split.kernel_ctas
        # Both parts in host-slot order, so the copy engines' share keeps whatever runs exist.
        (kernel_slots, kernel_pages), (ce_slots, ce_pages) = engine._split(job.copy, "mixed", fraction)
        kernel_stream, copy_stream = job.stream("backup_stream"), job.stream("backup_copy_stream")
        if len(kernel_slots):
            with torch.cuda.stream(kernel_stream) if kernel_stream is not None else nullcontext():
                engine._uva(engine._plan("backup", job.pairs), kernel_pages, kernel_slots, ctas)
        job.done_on = kernel_stream
        job.copy_rows(ce_pages, ce_slots, copy_stream)
        if kernel_stream is not None:
            # The completion follows both parts: the kernel's stream waits for the batch.
            kernel_stream.wait_stream(copy_stream)

    def load(self, job: _Load) -> None:
        engine = job.engine
        kernel_components, ce_components = engine._components(job.split)
        kernel_part, ce_part = engine._parts(job.copy, "mixed", job.split)
        job.kernel_part(kernel_part, kernel_components, engine.load_uva_stream if engine.on_gpu else None)
        if job.split.ce_path == "batch":
            job.batched_part(ce_part, ce_components)
        else:
            job.staged_part(ce_part, ce_components)


#: Every path by name (``auto`` is resolved by ``transfer_policy.choose_path`` first).
COPY_PATHS: dict[str, CopyPath] = {path.name: path for path in (TorchPath(), KernelPath(), DirectPath(), BatchPath(),
                                                                  StagedPath(), MixedPath())}


class TransferEngine:
    """Copies pages between one device pool and one host pool of the same spec.

    Args:
        device_pool, host_pool: pools of one spec; the host pool pinned when the device is a GPU.
        path: default path for every call (see module docstring).
        options: the knobs (``TransferOptions``: load split, copy-engine share, batch flags, CTA
            budget, issue threads); any call may pass its own.
        num_ctas: CTA budget of the UVA kernel launches (default: measured per direction); the
            same as ``options.num_ctas``.
        staging_bytes, staging_buffers, staging_ctas: the device staging ring per direction
            (``staged`` / ``mixed`` paths, allocated on first use) and its kernel's CTA budget.
        timing: create the handles' events with timing enabled (benchmarks; slightly costlier).
        high_priority_loads: load streams (and the issue threads' streams) get the device's
            highest stream priority, so the CTAs of a load's kernels (UVA part, staging scatter)
            are scheduled before the model's queued CTAs as SMs free up: a load waited on layer by
            layer is on the model's critical path (docs/benchmarks.md, "Transfers on the H200").
            Backups keep the default priority.
    """

    def __init__(self, device_pool: DevicePool, host_pool: HostPool, *, path: str = "auto", num_ctas: int | None = None,
                 staging_bytes: int | None = None, staging_buffers: int = 2, staging_ctas: int | None = None,
                 timing: bool = False, options: TransferOptions | None = None, high_priority_loads: bool = True) -> None:
        if not isinstance(device_pool, DevicePool) or not isinstance(host_pool, HostPool):
            raise PoolError(f"a transfer engine needs a DevicePool and a HostPool, got {type(device_pool).__name__} "
                            f"and {type(host_pool).__name__}")
        if device_pool.spec.fingerprint != host_pool.spec.fingerprint:
            raise SpecMismatchError(
                f"device pool spec ({device_pool.spec.describe()}) differs from host pool spec ({host_pool.spec.describe()})"
            )
        self._check_path(path)
        options = _check_options(options) or TransferOptions()
        if num_ctas is not None:
            options = replace(options, num_ctas=num_ctas)
        self.device_pool = device_pool
        self.host_pool = host_pool
        self.path = path
        self.options = options
        self.device = device_pool.device
        self.on_gpu = self.device.type == "cuda"
        self._staging_bytes = staging_bytes
        self._staging_buffers = staging_buffers
        self._staging_ctas = staging_ctas
        self._timing = timing
        #: Stream priority of loads: torch maps a number below the device's range to its highest.
        self._load_priority = LOAD_STREAM_PRIORITY if high_priority_loads else 0
        self._last_backup: BackupHandle | None = None
        self._last_load: LoadHandle | None = None
        self._word: int | None = None
        self._copiers: dict[str, object] = {}
        self._backup_pairs = backup_pairs(device_pool, host_pool)
        self._load_pairs = [load_pairs(host_pool, device_pool, layer) for layer in range(device_pool.spec.num_layers)]
        # Host rows are dense when every per-layer host chunk view has pitch == chunk.
        self._dense_host_rows = all(h.stride(0) == h.shape[1] for pairs in self._load_pairs for h, _ in pairs)
        self._plans: dict[object, object] = {}
        # Heads' kernel tables kept on the device, ids through a pinned ring; made on first use, under
        # a lock of their own (the engine's is held by a body's whole issue, which the caller's head
        # must not wait for).
        self._device_tables: dict[object, torch.Tensor] = {}
        self._ids_ring = None
        self._table_stream = None
        self._tables_lock = threading.Lock()
        self._issuer: _IssueThreads | None = None
        self._issuer_stop: weakref.finalize | None = None
        # Loads issued by library threads and by the caller share plans and the staging ring.
        self._lock = threading.RLock()
        # Every stream of the engine is its own, never one of torch's pool that other code in the
        # process may be handed too (``kernels.owned_streams``); they go back with the engine.
        self._streams = StreamLease(self.device)
        from ..kernels.batch_copy import available as batch_available

        # On CPU the batch path is memmove over the same copy list: always there.
        self._has_batch = not self.on_gpu or batch_available()
        if self.on_gpu:
            if not host_pool.memory.pinned:
                # UVA kernels and async copy-engine copies both need page-locked host memory.
                raise PoolError("a GPU transfer engine needs a pinned host pool (HostPool(..., pin=True))")
            with torch.cuda.device(self.device):
                high = self._load_priority
                take = self._streams.take
                self.load_stream = take(high)
                self.load_copy_stream = take(high)
                self.backup_stream = take()
                self.backup_copy_stream = take()
                self.load_uva_stream = take(high)  # the kernel part of ``mixed`` loads
                # Heads (``LoadSplit.head_layers``), one stream per load in turn: a handed-over head's
                # rest is launched by a library thread after its call returned, and the next load's
                # caller makes its head stream wait on the caller's stream (compute queued since),
                # which must not hold back an earlier load's layers still to be launched.
                self._head_streams = [take(high) for _ in range(HEAD_STREAMS)]
                self._head_turn = 0
                self.load_head_stream = self._head_streams[0]
                # Join events of ``mixed`` loads, re-recorded per layer (a wait binds to the record
                # before it, so reuse across layers is safe).
                self._uva_done = [torch.cuda.Event() for _ in range(4)]

    # --- public ----------------------------------------------------------------------------------
    def backup(self, device_pages: IdsLike, host_slots: IdsLike, *, path: str | None = None,
               token_indices: bool = False, options: TransferOptions | None = None) -> BackupHandle:
        """Copy every component and layer of ``device_pages`` into ``host_slots``; returns at once.

        Args:
            device_pages: page ids (or engine token indices with ``token_indices=True``), any
                int sequence or 1-D integer tensor; CPU tensors avoid a device sync.
            host_slots: slot ids of the host pool, unique.
            options: this call's knobs (default: the engine's).
        """
        options = _check_options(options) or self.options
        self._check_host_pinned()
        copy = validate(self.device_pool, self.host_pool, device_pages, host_slots, to_host=True, token_indices=token_indices)
        name = self._choose(path, copy, to_host=True)
        job = _Backup(self, copy, options)
        if not self.on_gpu:
            if len(copy):
                COPY_PATHS[name].backup(job)
            return BackupHandle(None, copy, name)
        with torch.cuda.device(self.device):
            caller = torch.cuda.current_stream(self.device)
            self.backup_stream.wait_stream(caller)
            self.backup_copy_stream.wait_stream(caller)
            job.done_on = self.backup_stream
            if len(copy):
                COPY_PATHS[name].backup(job)
            event = torch.cuda.Event(enable_timing=self._timing)
            event.record(job.done_on)
            handle = BackupHandle(event, copy, name)
            self._last_backup = handle
        return handle

    def load(self, host_slots: IdsLike, device_pages: IdsLike, *, layers: Sequence[int] | None = None,
             path: str | None = None, token_indices: bool = False, options: TransferOptions | None = None) -> LoadHandle:
        """Copy ``host_slots`` into ``device_pages`` layer by layer (default: every layer, in order).

        Enqueues everything at once (on the caller's thread, or on library issue threads; see
        ``TransferOptions.issue_threads``) and returns; each layer gets its own event, recorded
        once all of its components have landed, so the engine can compute layer i while i+1 is
        in flight. A head (``LoadSplit.head_layers``, ``auto``'s policy for loads of several
        layers) is issued on the caller's thread even when the rest goes to a library thread, so
        that layer 0 lands about one layer's copy after this call returns (docs/benchmarks.md,
        "Transfers on the H200").
        """
        num_layers = self.device_pool.spec.num_layers
        layers = list(range(num_layers)) if layers is None else _layer_indices(layers)
        for layer in layers:
            if not 0 <= layer < num_layers:
                raise IndexValidationError(f"layer {layer} outside 0..{num_layers - 1}")
        if len(set(layers)) != len(layers):
            raise IndexValidationError(f"layers repeat: {layers}")
        options = _check_options(options) or self.options
        self._check_host_pinned()
        copy = validate(self.device_pool, self.host_pool, device_pages, host_slots, to_host=False, token_indices=token_indices)
        auto = (path or self.path) == "auto"
        name = self._choose(path, copy, to_host=False, single_layer=len(layers) == 1)
        split = COPY_PATHS[name].load_split(self, len(layers), options, copy if auto else None)
        head = min(split.head_layers, len(layers) - 1) if len(copy) and COPY_PATHS[name].takes_head else 0
        job = _Load(self, layers[head:], copy, _body_split(split), options, first_index=head)
        # The head has a stream of its own (see below).
        head_stream = self._next_head_stream() if self.on_gpu and head else None
        head_job = _Load(self, layers[:head], copy, _head_split(split), options,
                         load_stream=head_stream, head=True) if head else None
        if not self.on_gpu:
            if head_job is not None:
                COPY_PATHS["kernel"].load(head_job)
            if len(copy):
                COPY_PATHS[name].load(job)
            return LoadHandle(self.device, layers, None, copy, name)
        threads = min(issue_threads(name, len(job.layers), options), len(job.layers)) if len(copy) else 0
        # Every layer's event lands here as it is issued (``finish_layer``), from the head and the rest.
        events: dict[int, torch.cuda.Event] = {}
        issued = _Issued() if threads else None
        for part in (job, head_job) if head_job is not None else (job,):
            part.events, part.issued = events, issued
        with torch.cuda.device(self.device):
            caller = torch.cuda.current_stream(self.device)
            ready_on = caller
            rest_of_head = None
            if head_job is not None:
                # On its own stream the head waits neither for a library thread still issuing an
                # earlier load on the load streams nor for the engine's lock, and none of the load
                # streams is made to wait from this thread while a thread uses them.
                head_stream.wait_stream(caller)
                head_path = COPY_PATHS["kernel"]
                if threads and name != "batch":
                    # The caller launches the head's first blocks and returns; a library thread
                    # launches the rest of the head, and another plans the body once they are
                    # launched.
                    rest_of_head = head_path.start_load(head_job, CALLER_HEAD_BLOCKS)
                else:
                    head_path.load(head_job)
                # The rest starts copying once the head has landed: layers reach PCIe in order.
                ready_on = head_stream
            if threads:
                self._load_on_threads(job, name, threads, torch.cuda.Event(), rest_of_head, head_stream, ready_on)
                self._last_load = LoadHandle(self.device, layers, events, copy, name, issued)
                return self._last_load
            for stream in (self.load_stream, self.load_copy_stream, self.load_uva_stream):
                stream.wait_stream(ready_on)
            with self._lock:
                if len(copy):
                    COPY_PATHS[name].load(job)
                else:
                    for index in range(len(layers)):
                        job.finish_layer(index)
        self._last_load = LoadHandle(self.device, layers, events, copy, name)
        return self._last_load

    def _check_host_pinned(self) -> None:
        """A GPU engine's copies read and write the host pool through its pinned mapping (the UVA
        kernel, the copy engines): once the pool is closed (unpinned) they would fault on the
        device, which ends the whole CUDA context. Refused first, before anything is enqueued."""
        if self.on_gpu and not self.host_pool.memory.pinned:
            raise PoolError(f"the host pool ({self.host_pool!r}) was closed and is no longer pinned; "
                            "a GPU transfer engine cannot copy to or from it")

    def close(self) -> None:
        """Stop the library issue threads (if any were started); the engine stays usable."""
        if self._issuer is not None:
            self._close_issuer()

    def _load_on_threads(self, job: _Load, name: str, threads: int, ready: torch.cuda.Event,
                         rest_of_head: Callable[[], None] | None = None,
                         head_stream: torch.cuda.Stream | None = None,
                         ready_on: torch.cuda.Stream | None = None) -> None:
        """Hand ``job`` to ``threads`` library threads, their streams ordered after ``ready`` (an
        event on the caller's stream, or on the head's stream after a head).

        ``batch`` loads deal their layers round-robin over the threads (each thread's stream is
        that layer's ``load_stream``); any other path runs whole on the first thread, on the
        engine's streams. ``rest_of_head`` (the head's launches after the caller's first blocks)
        runs on the second thread, which records ``ready`` on the head's stream once it
        launched them: the body's thread waits for that on the CPU before its streams wait on
        ``ready`` (a wait on an event not yet recorded would wait on nothing), so the body's
        copies still reach PCIe after the head's. Without a handed-over head, ``ready`` is
        recorded here on ``ready_on`` (the caller's stream, or the head's when the caller launched
        all of it), before anything is handed over, and the body's thread starts at once.
        """
        if rest_of_head is None:
            ready.record(ready_on)
        if name != "batch":
            # The body runs on thread 0 alone, the head's rest on thread 1.
            issuer = self._issue_threads(max(threads, 2) if rest_of_head is not None else threads)
            head_issued = None
            if rest_of_head is not None:
                head_issued = threading.Event()
                head_error: list[BaseException] = []

                def run_head() -> None:
                    try:
                        rest_of_head()
                        ready.record(head_stream if head_stream is not None else self.load_head_stream)
                    except BaseException as exc:
                        head_error.append(exc)
                        raise
                    finally:
                        head_issued.set()
                issuer.submit(1, run_head, job.issued)

            def run_whole() -> None:
                if head_issued is not None:
                    head_issued.wait()
                    if head_error:  # ``ready`` unrecorded: a wait on it would order nothing
                        raise head_error[0]  # the body is not issued; the handle re-raises the head's error
                with self._lock:
                    for stream in (self.load_stream, self.load_copy_stream, self.load_uva_stream):
                        stream.wait_event(ready)
                    COPY_PATHS[name].load(job)
            issuer.submit(0, run_whole, job.issued)
            return
        issuer = self._issue_threads(threads)
        for k in range(threads):
            indices = list(range(k, len(job.layers), threads))

            def run_share(indices=indices, stream=issuer.streams[k]) -> None:
                stream.wait_event(ready)
                share = replace(job, layers=[job.layers[i] for i in indices], load_stream=stream)
                COPY_PATHS["batch"].load(share)
            issuer.submit(k, run_share, job.issued)

    def _next_head_stream(self) -> torch.cuda.Stream:
        """The head stream of the next load (``HEAD_STREAMS`` in turn)."""
        stream = self._head_streams[self._head_turn]
        self._head_turn = (self._head_turn + 1) % len(self._head_streams)
        return stream

    def _issue_threads(self, count: int) -> _IssueThreads:
        """The library threads of loads, at least ``count`` of them."""
        if count > MAX_ISSUE_THREADS:
            raise ConfigError(f"at most {MAX_ISSUE_THREADS} issue threads, asked for {count}")
        issuer = self._issuer
        if issuer is None or len(issuer) < count:
            if issuer is not None:
                self._close_issuer()
            issuer = self._issuer = _IssueThreads(self.device, count, self._load_priority, self._streams)
            # An engine dropped without ``close`` still ends its threads (and so gives their streams back).
            self._issuer_stop = weakref.finalize(self, issuer.stop)
        return issuer

    def _close_issuer(self) -> None:
        self._issuer.close()
        self._issuer = None
        if self._issuer_stop is not None:
            self._issuer_stop.detach()
            self._issuer_stop = None

    def _load_running(self) -> bool:
        """Whether this engine's last load is still issuing or copying (``choose_backup_split``).
        A finished load is dropped, so later backups ask no events until the next load."""
        if self._last_load is not None and not self._last_load.in_flight():
            self._last_load = None
        return self._last_load is not None

    def _load_split(self, num_layers: int, options: TransferOptions | None = None,
                    copy: PageCopy | None = None) -> LoadSplit:
        """How a ``mixed`` load of ``num_layers`` layers is split now (``choose_split``); ``copy``
        only for loads whose path ``auto`` chose (their slots may count as scattered)."""
        backup_running = self._last_backup is not None and self._last_backup.in_flight()
        scattered = copy is not None and copy.scattered
        return choose_split(dense_host_rows=self._dense_host_rows, num_layers=num_layers, backup_in_flight=backup_running,
                            scattered=scattered, has_batch=self._has_batch, options=options or self.options)

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

    # --- path choice -----------------------------------------------------------------------------
    @staticmethod
    def _check_path(path: str) -> None:
        if path not in PATHS:
            raise ConfigError(f"unknown transfer path {path!r}; choose one of {PATHS}")

    def _choose(self, path: str | None, copy: PageCopy, *, to_host: bool, single_layer: bool = False) -> str:
        path = path or self.path
        self._check_path(path)
        if path != "auto":
            return path
        if not self.on_gpu or len(copy) == 0:
            return "torch"
        return choose_path(copy.host_slots, copy.device_pages, to_host=to_host, single_layer=single_layer,
                           has_batch=self._has_batch, dense_host_rows=self._dense_host_rows, scattered=copy.scattered)

    # --- helpers ---------------------------------------------------------------------------------
    def _plan(self, key, pairs):
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                from ..kernels import plan_uva_copy

                plan = self._plans[key] = plan_uva_copy(pairs)
            return plan

    def _load_plan(self, layers: int | tuple[int, ...], components: tuple[int, ...] | None = None):
        """The UVA plan of the load of one layer or a block of layers (of ``components``, default
        all); all plans share one anchor, so one upload serves all."""
        layers = (layers,) if isinstance(layers, int) else tuple(layers)
        key = ("load", layers, components)
        plan = self._plans.get(key)
        if plan is None:
            from ..kernels import plan_uva_copy

            anchor = self.device_pool.chunk_view(0, 0)
            pairs = [pair for layer in layers for ci, pair in enumerate(self._load_pairs[layer])
                     if components is None or ci in components]
            plan = self._plans[key] = plan_uva_copy(pairs, anchor=anchor, word_bytes=self._load_word)
        return plan

    def _device_table(self, layers: tuple[int, ...], components: tuple[int, ...] | None) -> torch.Tensor:
        """The load plan's table of ``layers`` / ``components`` on the device, uploaded on first
        use and kept. The first upload goes on a stream of its own, which waits for nothing, and
        is waited for on the CPU (once per block shape, a few microseconds), so a kernel on any
        other stream that reads the table later reads it complete."""
        key = (layers, components)
        table = self._device_tables.get(key)
        if table is None:
            from ..kernels.uva_copy import upload

            with self._tables_lock:
                table = self._device_tables.get(key)
                if table is None:
                    plan_table = self._load_plan(layers, components).table
                    if self.on_gpu:
                        if self._table_stream is None:
                            self._table_stream = self._streams.take()
                        with torch.cuda.stream(self._table_stream):
                            table = upload(self.device, [plan_table])[0]
                        self._table_stream.synchronize()
                    else:
                        table = upload(torch.device("cpu"), [plan_table])[0]
                    self._device_tables[key] = table
        return table

    def _upload_ids(self, parts) -> list[torch.Tensor]:
        """A load's ids on the device, through the engine's pinned ring (``kernels.ids_ring``)."""
        if self._ids_ring is None:
            from ..kernels.ids_ring import IdsRing

            with self._tables_lock:
                if self._ids_ring is None:
                    self._ids_ring = IdsRing(self.device if self.on_gpu else "cpu")
        return self._ids_ring.upload(list(parts))

    @property
    def _load_word(self) -> int:
        """One word size for every layer's plan (shared upload): 4 B unless some layer needs bytes."""
        if self._word is None:
            from ..kernels import plan_uva_copy

            pairs = [pair for layer_pairs in self._load_pairs for pair in layer_pairs]
            self._word = plan_uva_copy(pairs, anchor=self.device_pool.chunk_view(0, 0)).word_bytes
        return self._word

    def _uva(self, plan, src_ids: torch.Tensor, dst_ids: torch.Tensor, num_ctas: int | None = None) -> None:
        from ..kernels import copy_pages_uva

        copy_pages_uva(plan, src_ids, dst_ids, num_ctas=num_ctas if num_ctas is not None else self.options.num_ctas)

    def staging_copier(self, direction: str):
        """The staging ring of ``"load"`` or ``"backup"`` (created on first use; tune ``num_ctas`` on it)."""
        copier = self._copiers.get(direction)
        if copier is None:
            from ..kernels import StagedCopier
            from ..kernels.staged_copy import DEFAULT_BUFFER_BYTES
            from ..kernels.uva_copy import DEFAULT_CTAS_ON_DEVICE

            copier = self._copiers[direction] = StagedCopier(
                self.device, buffer_bytes=self._staging_bytes or DEFAULT_BUFFER_BYTES, num_buffers=self._staging_buffers,
                num_ctas=self._staging_ctas or DEFAULT_CTAS_ON_DEVICE, streams=self._streams,
            )
        return copier


#: Head streams a GPU engine takes in turn (``_next_head_stream``): two, so that the next load's
#: stream wait never lands before the previous load's handed-over launches (a head's rest is
#: launched within about a millisecond of its call).
HEAD_STREAMS = 2


def _check_options(options):
    """``options`` if it is a ``TransferOptions`` or None; ConfigError otherwise (a dict or a
    ``LoadSplit`` failed later with AttributeError)."""
    if options is not None and not isinstance(options, TransferOptions):
        raise ConfigError(f"options must be a TransferOptions (or None), got {type(options).__name__}")
    return options


def _layer_index(value, what: str) -> int:
    """A layer index as an int (``integers.as_int``: bools and floats are not layers), naming the value."""
    layer = as_int(value)
    if layer is None:
        raise IndexValidationError(f"{what}: {repr(value)[:40]} is not a layer index (an int), but {type(value).__name__}")
    return layer


def _layer_indices(layers) -> list[int]:
    """``load``'s ``layers`` as ints (``_layer_index`` each): any iterable but a string."""
    if isinstance(layers, (str, bytes, bytearray)) or not hasattr(layers, "__iter__"):
        raise IndexValidationError(f"layers: expected a sequence of ints, got {type(layers).__name__}")
    return [_layer_index(layer, "layers") for layer in layers]


# Both splits below are derived from the load's split on the caller's path before its first
# launch, where a ``replace`` (the new split's checks in ``LoadSplit.__post_init__``) costs about
# 0.1 ms on the H200's host; splits are frozen and few, so each is made once.
@functools.lru_cache(maxsize=256)
def _body_split(split: LoadSplit) -> LoadSplit:
    """The rest of a load after its head: ``split`` without the head."""
    return replace(split, head_layers=0)


@functools.lru_cache(maxsize=256)
def _head_split(split: LoadSplit) -> LoadSplit:
    """The kernel blocks of a load's head: ramped like the load (a model waits on its layers one
    by one) or by ``head_ramp_step``, the whole head's pages through the kernel."""
    step = split.head_ramp_step if split.head_ramp_step is not None else split.ramp_step
    return replace(KERNEL_LOADS, ramp=True, ramp_step=step)


def staged_groups(blocks: Sequence[Sequence[int]], components: Sequence[int], sizes: Sequence[int],
                  minor_layers: int | None = None, lead: int = 0) -> list[list[tuple[int, int]]]:
    """The (layer index, component) pairs of a staged copy-engine part, one group per block of
    ``blocks`` (indices into the load's layers, in order).

    Every group holds its block's layers of ``components``; with ``minor_layers``
    (``LoadSplit.minor_layers_per_copy``) only of the largest one (by ``sizes``, bytes per layer
    of each component), and the other components move in blocks of ``minor_layers`` adjacent
    indices, each block in the group of the block holding its first index, or ``lead`` groups
    before it (``LoadSplit.minor_lead_groups``; at the earliest the first). Every (index,
    component) pair is in exactly one group, and none in a group after its own layer's.
    """
    if minor_layers is None or len(components) < 2 or len({sizes[ci] for ci in components}) == 1:
        return [[(i, ci) for i in block for ci in components] for block in blocks]
    largest = max(components, key=lambda ci: sizes[ci])
    minor = [ci for ci in components if ci != largest]
    groups = [[(i, largest) for i in block] for block in blocks]
    group_of = {i: g for g, block in enumerate(blocks) for i in block}
    indices = [i for block in blocks for i in block]
    for k in range(0, len(indices), minor_layers):
        chunk = indices[k:k + minor_layers]
        groups[max(0, group_of[chunk[0]] - lead)] += [(i, ci) for ci in minor for i in chunk]
    return groups


def _blocks(num_layers: int, split: LoadSplit, *, kernel: bool = False, offset: int = 0) -> list[list[int]]:
    """Indices of a load's layers in blocks of ``split.layers_per_copy`` (the staged groups; with
    ``kernel``: ``split.kernel_blocks``, the UVA launches); with ``split.ramp`` the blocks grow
    1, 2, 4, ... up to that size, or with ``split.ramp_step`` by one layer every ``ramp_step``
    layers of the whole load (``offset``: the index of this part's first layer in it). A body
    after a head (``offset`` > 0) restarts a doubling ramp at one layer; a ``ramp_step`` ramp
    continues from ``offset``. The same holds for kernel blocks."""
    per = max(1, split.kernel_blocks if kernel else split.layers_per_copy)
    blocks, start, size = [], 0, 1 if split.ramp else per
    while start < num_layers:
        if split.ramp and split.ramp_step:
            size = min(per, 1 + (offset + start) // split.ramp_step)
        blocks.append(list(range(start, min(start + size, num_layers))))
        start += size
        if not split.ramp_step:
            size = min(per, 2 * size)
    return blocks


__all__ = ["COPY_PATHS", "PATHS", "BackupHandle", "CopyPath", "LoadHandle", "LoadSplit", "TransferEngine",
           "TransferOptions", "choose_path"]
