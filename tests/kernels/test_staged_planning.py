"""Planning of the staged copy (units, host copies, copy lists), on CPU.

The planner builds each group's host copies as numpy tables. These tests hold it to a plain
per-run planner (``_reference_units`` below, tuple by tuple and in order), check the copy lists
made from the tables against row-by-row expansions, and run staged loads and backups by blocks
of layers with scattered slots and runs cut at unit boundaries, byte for byte against the
reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tiered_kv import nsa_spec
from tiered_kv.kernels import StagedCopier
from tiered_kv.kernels.batch_copy import CopyList, merge_copy_list
from tiered_kv.kernels import staged_copy
from tiered_kv.kernels.staged_copy import _batch_rows
from tiered_kv.transfers.torch_path import backup_pairs, load_pairs

from .pools import adjacent_ids, check_copy, make_device_pool, make_host_pool, random_ids, spans

SPEC = nsa_spec(num_layers=4, page_size=4)  # latent 2624 B, indexer 528 B per layer and page
NUM_PAGES = 40
NUM_SLOTS = 36
#: Span layout of a 2-layer block: staging rows of 5248 + 1280 bytes, so three (two) rows per unit.
THREE_BLOCK_ROWS = 3 * 6528 + 7
TWO_BLOCK_ROWS = 2 * 6528 + 7


def _round(value: int) -> int:
    return -(-value // 256) * 256


def _sorted_runs(host_ids: torch.Tensor):
    """What ``_run`` hands the planner: host ids sorted, and their runs of adjacent ids."""
    host_sorted = np.sort(host_ids.numpy().astype(np.int64), kind="stable")
    breaks = np.flatnonzero(np.diff(host_sorted) != 1) + 1
    return host_sorted, np.concatenate(([0], breaks)), np.concatenate((breaks, [host_sorted.size]))


def _reference_units(buffer_bytes, host_views, host_sorted, run_starts, run_ends):
    """The planner written plainly: per unit ``(pairs, r0, r1, copies, stage_views)``, copies as
    7-tuples (the last one an index into ``host_views``), built run by run."""
    n = host_sorted.size
    pieces = spans(host_views)
    if pieces is not None:
        columns = [0]
        for _, width in pieces:
            columns.append(columns[-1] + _round(width))
        stage_pitch = columns[-1]
        if stage_pitch > buffer_bytes:
            pieces = None
    if pieces is not None:
        rows_per_unit = buffer_bytes // stage_pitch
    else:
        rows_per_unit = buffer_bytes // max(_round(v.shape[1]) for v in host_views)
    units = []
    for r0 in range(0, n, rows_per_unit):
        r1 = min(n, r0 + rows_per_unit)
        clipped = [(max(s, r0), min(e, r1)) for s, e in zip(run_starts.tolist(), run_ends.tolist()) if s < r1 and e > r0]
        if pieces is not None:
            stage = []
            for v in host_views:
                j = max(k for k, (start, _) in enumerate(pieces) if start <= v.data_ptr())
                stage.append((columns[j] + v.data_ptr() - pieces[j][0], stage_pitch, v.shape[1]))
            pitch = host_views[0].stride(0)
            copies = [(start + int(host_sorted[s]) * pitch, pitch, (s - r0) * stage_pitch + column, stage_pitch, width, e - s, 0)
                      for (start, width), column in zip(pieces, columns) for s, e in clipped]
            units.append((list(range(len(host_views))), r0, r1, copies, stage))
            continue
        group, used = [], 0
        groups = []
        for k, view in enumerate(host_views):
            need = _round((r1 - r0) * view.shape[1])
            if group and used + need > buffer_bytes:
                groups.append(group)
                group, used = [], 0
            group.append(k)
            used += need
        groups.append(group)
        for group in groups:
            stage, copies, offset = [], [], 0
            for k in group:
                view = host_views[k]
                chunk, pitch = view.shape[1], view.stride(0)
                stage.append((offset, chunk, chunk))
                copies += [(view.data_ptr() + int(host_sorted[s]) * pitch, pitch, offset + (s - r0) * chunk, chunk, chunk, e - s, k)
                           for s, e in clipped]
                offset += _round((r1 - r0) * chunk)
            units.append((group, r0, r1, copies, stage))
    return units


def _groups(host, device, layers_per_group: int):
    """Load pairs of all layers in groups of adjacent layers (latent and indexer of each)."""
    layers = SPEC.num_layers
    return [[pair for layer in range(s, min(s + layers_per_group, layers)) for pair in load_pairs(host, device, layer)]
            for s in range(0, layers, layers_per_group)]


def _slots(kind: str, count: int) -> torch.Tensor:
    if kind == "scattered":
        return random_ids(count, 0, NUM_SLOTS)
    if kind == "runs":
        return adjacent_ids(count, 0, NUM_SLOTS)
    return torch.arange(5, 5 + count)[torch.randperm(count)]  # one run, shuffled


@pytest.mark.parametrize("kind", ["scattered", "runs", "one_run"])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("per", [1, 2, 4])
@pytest.mark.parametrize("buffer_bytes", [THREE_BLOCK_ROWS, TWO_BLOCK_ROWS, 4 * 2624 + 7, 1 << 20])
def test_units_match_the_per_run_planner(kind, layout, per, buffer_bytes):
    """Every unit: the same rows, pairs, staging views and host copies, in the same order."""
    device = make_device_pool(SPEC, NUM_PAGES)
    host = make_host_pool(SPEC, NUM_SLOTS, layout)
    host_sorted, run_starts, run_ends = _sorted_runs(_slots(kind, 17))
    copier = StagedCopier("cpu", buffer_bytes=buffer_bytes)
    cuts = 0
    for group in _groups(host, device.pool, per):
        views = [h for h, _ in group]
        got = copier._units(views, host_sorted, run_starts, run_ends)
        want = _reference_units(copier.buffer_bytes, views, host_sorted, run_starts, run_ends)
        assert len(got) == len(want)
        for unit, (pairs, r0, r1, copies, stage) in zip(got, want):
            assert (unit.pairs, unit.r0, unit.r1, unit.stage_views) == (pairs, r0, r1, stage)
            assert unit.host_copies.dtype == np.int64 and unit.host_copies.tolist() == [list(c) for c in copies]
            assert all(unit.host_views[c[6]].data_ptr() <= c[0] for c in copies)
        cuts += sum(r0 > 0 and r0 not in run_starts for _, r0, _, _, _ in want)
    if kind == "one_run" and buffer_bytes in (THREE_BLOCK_ROWS, TWO_BLOCK_ROWS):
        assert cuts > 0  # the case this grid is for: a run cut at unit boundaries


def test_units_of_views_with_a_gap_are_two_spans_per_run():
    """Layers 0 and 2 of a page_first slot: two latent and two indexer pieces, each one copy per run."""
    device = make_device_pool(SPEC, NUM_PAGES)
    host = make_host_pool(SPEC, NUM_SLOTS, "page_first")
    views = [h for layer in (0, 2) for h, _ in load_pairs(host, device.pool, layer)]
    host_sorted, run_starts, run_ends = _sorted_runs(adjacent_ids(13, 0, NUM_SLOTS))
    copier = StagedCopier("cpu", buffer_bytes=5 * 4 * 3328)
    got = copier._units(views, host_sorted, run_starts, run_ends)
    want = _reference_units(copier.buffer_bytes, views, host_sorted, run_starts, run_ends)
    assert len(spans(views)) == 4
    assert [u.host_copies.tolist() for u in got] == [[list(c) for c in w[3]] for w in want]


def _expanded_copy_list(copies: np.ndarray, buffer_addr: int, to_device: bool) -> CopyList:
    rows = [(h + j * hp, buffer_addr + o + j * sp, w) for h, hp, o, sp, w, height, _ in copies.tolist() for j in range(height)]
    host, stage, sizes = (np.array(column, dtype=np.uint64) for column in zip(*rows))
    dsts, srcs = (stage, host) if to_device else (host, stage)
    return merge_copy_list(CopyList(dsts, srcs, sizes))


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("kind", ["scattered", "runs", "one_run"])
def test_copy_list_is_the_merged_row_by_row_list(layout, kind):
    """Dense copies (layer_first runs) listed whole, pitched ones row by row, joins merged."""
    device = make_device_pool(SPEC, NUM_PAGES)
    host = make_host_pool(SPEC, NUM_SLOTS, layout)
    host_sorted, run_starts, run_ends = _sorted_runs(_slots(kind, 17))
    copier = StagedCopier("cpu", buffer_bytes=THREE_BLOCK_ROWS)
    checked = 0
    for per in (1, 2, 4):
        for group in _groups(host, device.pool, per):
            for unit in copier._units([h for h, _ in group], host_sorted, run_starts, run_ends):
                for to_device in (True, False):
                    got = StagedCopier._copy_list(unit.host_copies, 7 << 20, to_device)
                    want = _expanded_copy_list(unit.host_copies, 7 << 20, to_device)
                    for a, b in zip((got.dsts, got.srcs, got.sizes), (want.dsts, want.srcs, want.sizes)):
                        assert a.dtype == np.uint64 and a.flags.c_contiguous and a.tolist() == b.tolist()
                    checked += 1
    assert checked > 0


#: 64 slots of 128 in 16 runs of 4, none adjacent to the next (16 copies per unit and pair).
RUNS_OF_4 = torch.tensor([b * 4 + k for b in range(0, 32, 2) for k in range(4)])
#: A spec whose page (and layer block) bytes are multiples of the staging alignment, as DeepSeek-V3.2's.
ALIGNED = nsa_spec(num_layers=4, page_size=64)


@pytest.mark.parametrize("spec", [SPEC, ALIGNED], ids=["unaligned", "aligned"])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("kind", ["scattered", "runs", "one_run", "runs_of_4"])
def test_batch_rows_is_the_length_of_the_unmerged_copy_list(layout, kind, spec, monkeypatch):
    """What the batch decision counts is the 1-D copies ``_copy_list`` builds before joins merge
    (a dense copy one, a pitched copy one per row): the list itself, merging turned off."""
    from tiered_kv.kernels import batch_copy

    monkeypatch.setattr(batch_copy, "merge_copy_list", lambda copy_list: copy_list)
    device = make_device_pool(spec, NUM_PAGES)
    host = make_host_pool(spec, 128, layout)
    slots = RUNS_OF_4[torch.randperm(64)] if kind == "runs_of_4" else _slots(kind, 17)
    host_sorted, run_starts, run_ends = _sorted_runs(slots)
    copier = StagedCopier("cpu", buffer_bytes=THREE_BLOCK_ROWS if spec is SPEC else 1 << 20)
    several_rows = 0
    for per in (1, 2, 4):
        layers = spec.num_layers
        groups = [[pair for layer in range(s, min(s + per, layers)) for pair in load_pairs(host, device.pool, layer)]
                  for s in range(0, layers, per)]
        for group in groups:
            for unit in copier._units([h for h, _ in group], host_sorted, run_starts, run_ends):
                copies = unit.host_copies
                assert _batch_rows(copies) == len(StagedCopier._copy_list(copies, 0, True).sizes)
                several_rows += int(copies[:, 5].max()) > 1
    assert several_rows > 0 or kind == "scattered"  # copies of several rows were counted


def ring_decisions(spec, layout: str, layers: range, slots: torch.Tensor = RUNS_OF_4,
                   host_slots: int = 128, buffer_bytes: int = 64 << 20, to_device: bool = True) -> set[tuple[int, bool]]:
    """(copies, batched) of every unit of a load (``to_device``; else a backup) of ``layers`` from
    ``slots`` (default 16 runs of 4 slots of 128), the ring's batch decision alone (nothing is
    copied); ``_batch_available`` as patched."""
    device = make_device_pool(spec, NUM_PAGES)
    host = make_host_pool(spec, host_slots, layout)
    copier = StagedCopier("cpu", buffer_bytes=buffer_bytes)  # every run in one unit
    copier._on_gpu = True  # the decision only; nothing is copied
    group = [pair for layer in layers for pair in load_pairs(host, device.pool, layer)]
    units = copier._units([h for h, _ in group], *_sorted_runs(slots))
    return {(len(u.host_copies), copier._batched(u.host_copies, to_device)) for u in units}


#: 16 runs of 80 slots (of 2048), one every 128: pitched copies of more rows than the batch takes.
RUNS_OF_80 = (torch.arange(16)[:, None] * 128 + torch.arange(80)).flatten()


def test_runs_of_layer_first_rows_go_out_as_one_batch(monkeypatch):
    """Slots in 16 runs of 4 with layer_first rows: every copy is a dense run, so a unit of many
    copies takes the memcpy batch (a dense run counts as one copy, not one per row). page_first rows
    are 2-D copies of four rows each (a block of layers has the slot's other layers between its rows, and
    whole slots are padded to 4 KiB in the host pool, so even
    DeepSeek-V3.2's 256-aligned 3,076,352-byte page is a pitched row there); up to
    ``BATCH_MAX_MEAN_ROWS`` rows on average they batch row by row too, and runs of 80 stay one
    2-D call per copy."""
    monkeypatch.setattr(staged_copy, "_batch_available", lambda: True)
    assert 4 <= staged_copy.BATCH_MAX_MEAN_ROWS < 80
    for spec in (SPEC, ALIGNED):
        assert ring_decisions(spec, "layer_first", range(spec.num_layers)) == {(16 * 2 * spec.num_layers, True)}
        for layers in (range(2), range(spec.num_layers)):
            for slots, host_slots, batched in ((RUNS_OF_4, 128, True), (RUNS_OF_80, 2048, False)):
                # a buffer that holds every run: 1,280 of ALIGNED's 201,728-byte slots for RUNS_OF_80
                decided = ring_decisions(spec, "page_first", layers, slots, host_slots, buffer_bytes=288 << 20)
                assert {b for _, b in decided} == {batched}
                assert all(copies >= staged_copy.BATCH_MIN_COPIES for copies, _ in decided)  # decided by rows


def test_a_few_dense_runs_of_one_layer_go_out_as_one_batch(monkeypatch):
    """Three runs of layer_first rows, one layer: six dense copies (a run per component) already
    batch in a load (``layer_first`` runs of 64 are 14-16 copies a unit); a unit of fewer copies
    than ``BATCH_MIN_COPIES`` stays 2-D calls, and so does a backup's under
    ``BATCH_MIN_COPIES_TO_HOST``."""
    monkeypatch.setattr(staged_copy, "_batch_available", lambda: True)
    three_runs = torch.cat([torch.arange(s, s + 4) for s in (0, 8, 16)])
    assert ring_decisions(SPEC, "layer_first", range(1), three_runs) == {(6, True)}
    # A backup of the same slots keeps its 2-D calls: it is issued on the caller's thread.
    assert staged_copy.BATCH_MIN_COPIES_TO_HOST > 6
    assert ring_decisions(SPEC, "layer_first", range(1), three_runs, to_device=False) == {(6, False)}
    # ... while a backup's unit of at least that many copies batches: 16 runs of 4, every layer.
    many = 16 * 2 * SPEC.num_layers
    assert many >= staged_copy.BATCH_MIN_COPIES_TO_HOST
    assert ring_decisions(SPEC, "layer_first", range(SPEC.num_layers), to_device=False) == {(many, True)}
    monkeypatch.setattr(staged_copy, "BATCH_MIN_COPIES", 7)
    assert ring_decisions(SPEC, "layer_first", range(1), three_runs) == {(6, False)}


def test_copy_list_merges_rows_that_join_across_copies():
    """Planned units rarely join rows of two copies; a table where they do: the pitched copy's
    last row runs into the next copy, which runs into a dense one; the last copy joins nothing."""
    table = np.array([
        (1000, 300, 0, 100, 100, 3, 0),  # rows at 1000, 1300, 1600 -> staging 0, 100, 200
        (1700, 500, 300, 100, 100, 1, 0),  # continues row 1600 -> 200 on both sides
        (1800, 64, 400, 64, 64, 4, 1),  # dense, continues the row before
        (9000, 64, 2000, 64, 64, 2, 1),  # dense, apart from everything
    ], dtype=np.int64)
    for to_device in (True, False):
        got = StagedCopier._copy_list(table, 1 << 20, to_device)
        want = _expanded_copy_list(table, 1 << 20, to_device)
        assert [a.tolist() for a in (got.dsts, got.srcs, got.sizes)] == [a.tolist() for a in (want.dsts, want.srcs, want.sizes)]
        assert got.sizes.tolist() == [100, 100, 456, 128]


def _staged_load(groups, slots, pages, *, buffer_bytes, host_batch, first_wave=None):
    copier = StagedCopier("cpu", buffer_bytes=buffer_bytes, num_buffers=2, host_batch=host_batch)
    done = []
    copier.to_device_groups(groups, slots, pages, on_group_done=done.append, first_wave=first_wave)
    assert done == list(range(len(groups)))


@pytest.mark.parametrize("host_batch,first_wave", [(None, None), (True, None), (None, 1)])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("kind", ["scattered", "one_run"])
@pytest.mark.parametrize("per,buffer_bytes", [(2, THREE_BLOCK_ROWS), (4, TWO_BLOCK_ROWS), (1, 4 * 2624 + 7),
                                              (1, 1 << 20)])
def test_staged_load_by_blocks_of_layers(per, buffer_bytes, kind, layout, host_batch, first_wave):
    """Blocks of layers, scattered slots or one run cut at unit boundaries, planned whole or in
    waves: every copied byte right, every other device byte untouched."""
    device = make_device_pool(SPEC, NUM_PAGES)
    host = make_host_pool(SPEC, NUM_SLOTS, layout)
    slots, pages = _slots(kind, 11), random_ids(11, 1, NUM_PAGES)
    groups = _groups(host, device.pool, per)
    pairs = [pair for group in groups for pair in group]
    check_copy(pairs, slots, pages, device.roots,
               lambda: _staged_load(groups, slots, pages, buffer_bytes=buffer_bytes, host_batch=host_batch,
                                    first_wave=first_wave))


@pytest.mark.parametrize("host_batch", [None, True])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("kind", ["scattered", "one_run"])
def test_staged_backup_with_scattered_slots(kind, layout, host_batch):
    """All layers in one call (whole-slot spans on page_first), short units of three slots."""
    device = make_device_pool(SPEC, NUM_PAGES)
    host = make_host_pool(SPEC, NUM_SLOTS, layout)
    pages, slots = random_ids(11, 1, NUM_PAGES), _slots(kind, 11)
    pairs = backup_pairs(device.pool, host)
    copier = StagedCopier("cpu", buffer_bytes=3 * SPEC.page_bytes + 300, num_buffers=2, host_batch=host_batch)
    check_copy(pairs, pages, slots, [host.buffer],
               lambda: copier.to_host(pairs, pages, slots))


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("buffer_bytes", [THREE_BLOCK_ROWS, 5 * 2624 + 11, 1 << 20])
def test_a_units_first_pair_pair_count_and_stage_rows_name_its_staging_layout(layout, buffer_bytes):
    """The ring keeps a unit's kernel table by (slot, first pair, pairs, ``stage_rows``) across
    calls, so across calls of any size and slots those must fix the unit's staging layout (and
    pairs must be consecutive, as ``_table`` reads them); units whose layout follows the call's
    size say so (``stage_rows`` None: fewer rows than a full dense unit) and are not kept."""
    device = make_device_pool(SPEC, NUM_PAGES)
    host = make_host_pool(SPEC, NUM_SLOTS, layout)
    host_views = [pair[1] for pair in backup_pairs(device.pool, host)]
    copier = StagedCopier("cpu", buffer_bytes=buffer_bytes, num_buffers=2)
    layouts, seen = {}, 0
    for count in (1, 7, 11, 20, 36):
        for slots in (random_ids(count, 0, NUM_SLOTS), adjacent_ids(count, 0, NUM_SLOTS)):
            units = copier._units(host_views, *_sorted_runs(slots))
            for unit in units:
                assert unit.pairs == list(range(unit.pairs[0], unit.pairs[0] + len(unit.pairs)))
                if unit.stage_rows is None:  # a dense unit short of a full one's rows: not kept
                    assert unit.stage_views and unit.host_copies.size
                    continue
                key = (unit.pairs[0], len(unit.pairs), unit.stage_rows)
                assert layouts.setdefault(key, unit.stage_views) == unit.stage_views, key
                seen += 1
    # The kept layouts recur, as the kept tables need (a buffer bigger than every call keeps none
    # of its dense units: all are short of a full one).
    assert seen > len(layouts) >= 1 or (seen == 0 and layout == "layer_first" and buffer_bytes == 1 << 20)
