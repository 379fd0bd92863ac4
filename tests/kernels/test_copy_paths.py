"""Every copy path against the reference, on CPU (Triton's interpreter for the kernels).

Grid: every small spec x both host layouts x backup (all layers in one call) and load (one
layer) x page lists that are empty, single, irregular and random. Data and poison are fresh
random bytes each run; checks are byte for byte, untouched bytes included.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch

from tiered_kv.kernels import StagedCopier, copy_pages_batch, copy_pages_direct, copy_pages_uva, find_runs, mean_run_length
from tiered_kv.kernels.batch_copy import plan_copy_list
from tiered_kv.transfers.torch_path import backup_pairs, load_pairs

from .pools import adjacent_ids, check_copy, make_device_pool, make_host_pool, random_ids, small_specs, spans

SPECS = small_specs()
NUM_PAGES = 24
NUM_SLOTS = 20


def _uva(pairs, src, dst):
    copy_pages_uva(pairs, src, dst, num_ctas=3)


def _direct(pairs, src, dst):
    copy_pages_direct(pairs, src, dst)


def _staged(pairs, src, dst, *, to_device, roomy=False, host_batch=None):
    # A tiny ring forces several units per call and several pair groups per unit; a roomy one
    # takes two whole page_first slots per unit (the span layout of all-layer backups).
    biggest = max(p[0].shape[1] for p in pairs)
    size = 2 * sum(p[0].shape[1] for p in pairs) + 300 if roomy else 3 * biggest + 7
    copier = StagedCopier("cpu", buffer_bytes=size, num_buffers=2, host_batch=host_batch)
    if to_device:
        copier.to_device(pairs, src, dst)
    else:
        copier.to_host(pairs, src, dst)


# ``_batch``: the staging ring's host copies as one memcpy batch per unit (memmove on CPU).
PATHS = ["uva", "direct", "batch", "staged", "staged_roomy", "staged_batch", "staged_roomy_batch"]


def _runner(path: str, to_device: bool):
    if path == "uva":
        return _uva
    if path == "direct":
        return _direct
    if path == "batch":  # on CPU the same copy list runs through memmove
        return copy_pages_batch
    return functools.partial(_staged, to_device=to_device, roomy="roomy" in path,
                             host_batch=True if path.endswith("_batch") else None)


def _ids(count: int, kind: str, low: int, high: int) -> torch.Tensor:
    return adjacent_ids(count, low, high) if kind == "runs" else random_ids(count, low, high)


@pytest.mark.parametrize("count", [0, 1, 7, 13])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("spec_name", sorted(SPECS))
@pytest.mark.parametrize("path", PATHS)
def test_backup_all_layers(path, spec_name, layout, count):
    spec = SPECS[spec_name]
    device = make_device_pool(spec, NUM_PAGES)
    host = make_host_pool(spec, NUM_SLOTS, layout)
    pages = _ids(count, "random", 1, NUM_PAGES)
    slots = _ids(count, "runs", 0, NUM_SLOTS)
    pairs = backup_pairs(device.pool, host)
    run = _runner(path, to_device=False)
    check_copy(pairs, pages, slots, [host.buffer], lambda: run(pairs, pages, slots))


@pytest.mark.parametrize("count", [0, 1, 9, 16])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("spec_name", sorted(SPECS))
@pytest.mark.parametrize("path", PATHS)
def test_load_one_layer(path, spec_name, layout, count):
    spec = SPECS[spec_name]
    device = make_device_pool(spec, NUM_PAGES)
    host = make_host_pool(spec, NUM_SLOTS, layout)
    slots = _ids(count, "runs", 0, NUM_SLOTS)
    pages = _ids(count, "random", 1, NUM_PAGES)
    layer = int(torch.randint(0, spec.num_layers, ()).item())
    pairs = load_pairs(host, device.pool, layer)
    run = _runner(path, to_device=True)
    check_copy(pairs, slots, pages, device.roots, lambda: run(pairs, slots, pages))


@pytest.mark.parametrize("num_ctas", [1, 2, 5, 64])
@pytest.mark.parametrize("block", [16, 64, 4096])
def test_uva_any_budget_and_tile(num_ctas, block):
    """Tiles smaller than a chunk (tails), more programs than tiles, one program for everything."""
    spec = SPECS["nsa"]
    device = make_device_pool(spec, NUM_PAGES)
    host = make_host_pool(spec, NUM_SLOTS, "page_first")
    pages = random_ids(5, 1, NUM_PAGES)
    slots = random_ids(5, 0, NUM_SLOTS)
    pairs = backup_pairs(device.pool, host)[:3]
    check_copy(pairs, pages, slots, [host.buffer],
               lambda: copy_pages_uva(pairs, pages, slots, num_ctas=num_ctas, block=block))


def test_uva_duplicate_sources():
    """Loads may read one host slot into two device pages; destinations stay unique."""
    spec = SPECS["mla"]
    device = make_device_pool(spec, NUM_PAGES)
    host = make_host_pool(spec, NUM_SLOTS, "layer_first")
    slots = torch.tensor([4, 4, 9, 4], dtype=torch.int64)
    pages = random_ids(4, 1, NUM_PAGES)
    pairs = load_pairs(host, device.pool, 1)
    check_copy(pairs, slots, pages, device.roots, lambda: copy_pages_uva(pairs, slots, pages, num_ctas=2))


def test_uva_rejects_mismatched_ids():
    spec = SPECS["mla"]
    device = make_device_pool(spec, NUM_PAGES)
    host = make_host_pool(spec, NUM_SLOTS, "layer_first")
    with pytest.raises(ValueError, match="ids"):
        copy_pages_uva(load_pairs(host, device.pool, 0), torch.tensor([1, 2]), torch.tensor([3]))


def test_find_runs_cover_every_pair_once():
    for _ in range(20):
        n = int(torch.randint(0, 40, ()).item())
        src = adjacent_ids(n, 0, 60)
        dst = adjacent_ids(n, 0, 60)
        runs = find_runs(src, dst)
        covered = set()
        for s, d, length in zip(runs.src_starts.tolist(), runs.dst_starts.tolist(), runs.lengths.tolist()):
            assert length >= 1
            covered |= {(s + k, d + k) for k in range(length)}
        assert covered == set(zip(src.tolist(), dst.tolist()))
        assert int(runs.lengths.sum()) == n


def test_find_runs_merges_adjacent():
    src = torch.tensor([10, 11, 12, 13, 40, 41], dtype=torch.int64)
    dst = torch.tensor([3, 4, 5, 6, 7, 8], dtype=torch.int64)
    perm = torch.randperm(6)
    runs = find_runs(src[perm], dst[perm])
    assert runs.lengths.tolist() == [4, 2]
    assert runs.src_starts.tolist() == [10, 40] and runs.dst_starts.tolist() == [3, 7]


@pytest.mark.parametrize("sort_by", ["dst", "src"])
def test_mean_run_length_is_find_runs_mean_length(sort_by):
    """The path choice's fast mean run agrees with ``find_runs`` on every kind of id list:
    runs, reversed runs, scattered, one id, none (and positions as destinations)."""
    cases = [torch.tensor([5, 4, 3, 10, 11, 2]), torch.arange(7, 19), torch.arange(19, 7, -1), torch.tensor([3]),
             torch.zeros(0, dtype=torch.int64)]
    cases += [adjacent_ids(int(torch.randint(1, 40, ()).item()), 0, 60) for _ in range(20)]
    cases += [random_ids(int(torch.randint(1, 40, ()).item()), 0, 60) for _ in range(20)]
    for src in cases:
        n = src.numel()
        for dst in (adjacent_ids(n, 0, 80), random_ids(n, 0, 80), torch.arange(n) + 9):
            assert mean_run_length(src, dst, sort_by=sort_by) == pytest.approx(find_runs(src, dst, sort_by=sort_by).mean_length)
        assert mean_run_length(src) == pytest.approx(find_runs(src, torch.arange(n), sort_by="src").mean_length)
    with pytest.raises(ValueError, match="ids"):
        mean_run_length(torch.arange(3), torch.arange(4))


def test_staged_rejects_chunk_larger_than_buffer():
    spec = SPECS["nsa"]
    device = make_device_pool(spec, NUM_PAGES)
    host = make_host_pool(spec, NUM_SLOTS, "page_first")
    copier = StagedCopier("cpu", buffer_bytes=64)
    with pytest.raises(ValueError, match="does not fit"):
        copier.to_device(load_pairs(host, device.pool, 0), torch.tensor([1]), torch.tensor([2]))


def test_staged_span_layout_is_used_for_page_first_backups():
    """All layers of page_first slots tile each slot's payload: one copy per run of slots; a
    gap splits the row into pieces, each still one copy per run."""
    spec = SPECS["nsa"]
    device = make_device_pool(spec, NUM_PAGES)
    page_first = make_host_pool(spec, NUM_SLOTS, "page_first")
    layer_first = make_host_pool(spec, NUM_SLOTS, "layer_first")
    hosts = [dst for _, dst in backup_pairs(device.pool, page_first)]
    assert spans(hosts) == [(page_first.chunk_view(0, 0).data_ptr(), spec.page_bytes)]
    assert len(spans(hosts[1:])) == 1  # still one piece, starting at the next chunk
    pieces = spans(hosts[:2] + hosts[3:])  # the chunk between two pieces missing: a gap
    assert len(pieces) == 2 and sum(width for _, width in pieces) == spec.page_bytes - hosts[2].shape[1]
    assert spans(hosts + hosts[:1]) is None  # overlapping views
    assert spans([dst for _, dst in backup_pairs(device.pool, layer_first)]) is None  # pitches differ


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_staged_groups_call_back_in_order(layout):
    """One call for every layer of a load: bytes land, and each group reports done in order."""
    spec = SPECS["nsa"]
    device = make_device_pool(spec, NUM_PAGES)
    host = make_host_pool(spec, NUM_SLOTS, layout)
    slots, pages = adjacent_ids(11, 0, NUM_SLOTS), random_ids(11, 1, NUM_PAGES)
    groups = [load_pairs(host, device.pool, layer) for layer in range(spec.num_layers)]
    groups.insert(1, [])  # a group without pairs is reported too
    copier = StagedCopier("cpu", buffer_bytes=4 * 2624, num_buffers=3)
    done = []
    pairs = [pair for group in groups for pair in group]
    check_copy(pairs, slots, pages, device.roots,
               lambda: copier.to_device_groups(groups, slots, pages, on_group_done=done.append))
    assert done == list(range(len(groups)))


@pytest.mark.parametrize(("count", "first", "expected"), [
    (0, 1, []), (1, None, [(0, 1)]), (7, None, [(0, 7)]), (1, 1, [(0, 1)]),
    (7, 1, [(0, 1), (1, 3), (3, 7)]), (8, 1, [(0, 1), (1, 3), (3, 7), (7, 8)]),
    (10, 2, [(0, 2), (2, 6), (6, 10)]), (3, 8, [(0, 3)]),
])
def test_waves_tile_the_groups_in_doubling_ranges(count, first, expected):
    from tiered_kv.kernels.staged_copy import waves

    assert waves(count, first) == expected


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("first_wave", [1, 2, 64])
def test_staged_waves_plan_the_first_groups_then_enqueue_them_before_planning_the_rest(monkeypatch, layout,
                                                                                    first_wave):
    """With ``first_wave`` the ring plans a wave of groups, sends its tables (one upload per wave,
    the ids with the first) and enqueues its work before it plans the next wave; every byte lands
    and every group reports done once, in order, as in one wave."""
    from tiered_kv.kernels import staged_copy
    from tiered_kv.kernels.staged_copy import waves

    spec = SPECS["nsa"]
    device = make_device_pool(spec, NUM_PAGES)
    host = make_host_pool(spec, NUM_SLOTS, layout)
    slots, pages = random_ids(9, 0, NUM_SLOTS), random_ids(9, 1, NUM_PAGES)
    # 9 groups, each of its own views (the ring keeps the tables of views it has seen: a group of
    # them sends none), three of each layer.
    groups = [[(h[:], d[:]) for h, d in load_pairs(host, device.pool, layer)]
              for layer in range(spec.num_layers) for _ in range(3)]
    copier = StagedCopier("cpu", buffer_bytes=4 * 2624, num_buffers=3)
    events, uploads, sent = [], [], []
    units, table, real_upload = copier._units, copier._table, staged_copy.upload

    def planned(host_views, *args, **kwargs):
        events.append("plan")
        return units(host_views, *args, **kwargs)

    def tabled(*args, **kwargs):
        sent.append("table")
        return table(*args, **kwargs)

    def counted(device, tensors):
        uploads.append(len(tensors))
        sent.append(("upload", len(tensors)))
        return real_upload(device, tensors)
    monkeypatch.setattr(copier, "_units", planned)
    monkeypatch.setattr(copier, "_table", tabled)
    monkeypatch.setattr(staged_copy, "upload", counted)
    pairs = [pair for group in groups for pair in group]
    check_copy(pairs, slots, pages, device.roots,
               lambda: copier.to_device_groups(groups, slots, pages, on_group_done=lambda g: events.append(g),
                                               first_wave=first_wave))
    expected = []
    for g0, g1 in waves(len(groups), first_wave):
        expected += ["plan"] * (g1 - g0) + list(range(g0, g1))
    assert events == expected
    assert len(uploads) == len(waves(len(groups), first_wave))
    # Each upload carries the tables built since the last one; the first also the ids (device
    # pages, staging rows), the later ones nothing else.
    built, first = 0, True
    for item in sent:
        if item == "table":
            built += 1
            continue
        assert item[1] == built + (2 if first else 0), sent
        built, first = 0, False
    assert built == 0


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_a_backup_plans_every_table_then_uploads_once_then_gathers_each_unit(monkeypatch, layout):
    """A backup's units are cut once, then every table it needs is built, sent in one upload with
    the ids (on the kernel stream, not the ring's own) and its units gathered and copied; every
    byte lands."""
    from tiered_kv.kernels import staged_copy

    spec = SPECS["nsa"]
    device = make_device_pool(spec, NUM_PAGES)
    host = make_host_pool(spec, NUM_SLOTS, layout)
    slots, pages = random_ids(9, 0, NUM_SLOTS), random_ids(9, 1, NUM_PAGES)
    pairs = backup_pairs(device.pool, host)
    copier = StagedCopier("cpu", buffer_bytes=3 * max(p[0].shape[1] for p in pairs) + 7, num_buffers=3)
    events, cut = [], []
    units, table, kernel, real_upload = copier._units, copier._table, copier._kernel, staged_copy.upload

    def planned(*args, **kwargs):
        cut.append(units(*args, **kwargs))
        return cut[-1]

    def tabled(*args, **kwargs):
        events.append("table")
        return table(*args, **kwargs)

    def gathered(*args, **kwargs):
        events.append("gather")
        return kernel(*args, **kwargs)

    def counted(device, tensors):
        events.append(("upload", len(tensors)))
        return real_upload(device, tensors)
    monkeypatch.setattr(copier, "_units", planned)
    monkeypatch.setattr(copier, "_table", tabled)
    monkeypatch.setattr(copier, "_kernel", gathered)
    asked, send = [], copier._send

    def sent(parts, kernel_stream, *, own_stream):
        asked.append(own_stream)
        return send(parts, kernel_stream, own_stream=own_stream)
    monkeypatch.setattr(staged_copy, "upload", counted)
    monkeypatch.setattr(copier, "_send", sent)
    for _d, h in pairs:  # poison the slots, so the check below needs the backup's bytes
        h[slots] = 0
    copier.to_host(pairs, pages, slots)
    for d, h in pairs:
        assert torch.equal(h[slots], d[pages])
    assert len(cut) == 1 and len(cut[0]) > 2  # one cut into units, and several of them
    units_count = len(cut[0])
    built = events.index(("upload", events.count("table") + 2))  # the tables, then their upload with the ids
    assert events[:built] == ["table"] * built
    assert events[built + 1:] == ["gather"] * units_count
    # A table per ring slot and staging layout: page_first spans share one per slot.
    layouts = {(slot % 3, unit.pairs[0], len(unit.pairs), tuple(unit.stage_views)) for slot, unit in enumerate(cut[0])}
    assert built == len(layouts)
    assert asked == [False]  # one upload, on the kernel stream


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("count", [8, 9])
def test_the_ring_keeps_a_lists_tables_across_calls_until_its_views_change(monkeypatch, layout, count):
    """A second backup of the same views (the same list or another) builds and uploads only the
    tables whose layout follows its size (a dense unit of fewer rows than a full one), with its
    ids, and still writes every byte; other views, in place of the first in the same list or new
    views of the same memory, are planned anew and copy their own bytes."""
    from tiered_kv.kernels import staged_copy

    spec = SPECS["nsa"]
    device = make_device_pool(spec, NUM_PAGES)
    host, other = make_host_pool(spec, NUM_SLOTS, layout), make_host_pool(spec, NUM_SLOTS, layout)
    pairs = backup_pairs(device.pool, host)
    # One buffer: every unit is staged in slot 0, so a call's units map to the tables of the last.
    copier = StagedCopier("cpu", buffer_bytes=3 * max(p[0].shape[1] for p in pairs) + 7, num_buffers=1)
    built, uploads, table, real_upload = [], [], copier._table, staged_copy.upload

    def tabled(*args, **kwargs):
        built.append(1)
        return table(*args, **kwargs)

    def counted(device, tensors):
        uploads.append(len(tensors))
        return real_upload(device, tensors)
    monkeypatch.setattr(copier, "_table", tabled)
    monkeypatch.setattr(staged_copy, "upload", counted)

    def per_call(pairs, slots) -> int:
        """Tables a call builds even once the rest are kept: one per unit of fewer rows than a full one."""
        ordered = np.sort(slots.numpy())
        breaks = np.flatnonzero(np.diff(ordered) != 1) + 1
        units = copier._units([h for _, h in pairs], ordered, np.concatenate(([0], breaks)),
                              np.concatenate((breaks, [ordered.size])))
        return sum(unit.stage_rows is None for unit in units)

    def backup(pairs, seed):
        slots, pages = random_ids(count, seed, NUM_SLOTS), random_ids(count, seed + 1, NUM_PAGES)
        for _, h in pairs:
            h[slots] = 0
        built.clear(), uploads.clear()
        copier.to_host(pairs, pages, slots)
        assert all(torch.equal(h[slots], d[pages]) for d, h in pairs)
        return len(built), list(uploads), per_call(pairs, slots)

    first, first_uploads, short = backup(pairs, 0)
    assert first > short and first_uploads == [first + 2]
    assert backup(pairs, 3) == (short, [short + 2], short)  # the ids (and the size's own tables) only
    assert backup(list(pairs), 4) == (short, [short + 2], short)  # another list of the same views
    assert backup([(d[:], h[:]) for d, h in pairs], 5)[0] == first  # new views of the same memory
    pairs[:] = backup_pairs(device.pool, other)  # the same list, other views
    assert backup(pairs, 7)[0] == first
    # A span layout (page_first) and full dense units keep everything: 8 ids fill whole units.
    if count == 8:
        assert short == 0


def test_the_ring_does_not_keep_dropped_host_memory_alive_and_plans_its_successor_anew():
    """The kept geometry holds views weakly: once their owner drops host memory and its pairs, the
    memory is freed; new host memory (its views' ids possibly reused) gets its own bytes. Plain
    tensors stand in for a host pool (the test harness keeps every ``HostPool`` to check it)."""
    import gc
    import weakref

    spec = SPECS["nsa"]
    device = make_device_pool(spec, NUM_PAGES)
    device_views = [d for d, _ in backup_pairs(device.pool, make_host_pool(spec, NUM_SLOTS, "layer_first"))]
    copier = StagedCopier("cpu", buffer_bytes=4 * 2624, num_buffers=2)
    for round_ in range(3):
        memory = torch.zeros(len(device_views), NUM_SLOTS, max(d.shape[1] for d in device_views), dtype=torch.uint8)
        pairs = [(d, memory[k, :, :d.shape[1]]) for k, d in enumerate(device_views)]
        slots, pages = random_ids(6, 0, NUM_SLOTS), random_ids(6, 1, NUM_PAGES)
        copier.to_host(pairs, pages, slots)
        assert all(torch.equal(h[slots], d[pages]) for d, h in pairs)
        gone = weakref.ref(memory)
        del memory, pairs
        gc.collect()
        assert gone() is None, round_


def test_the_rings_kept_geometries_and_tables_stay_within_their_bounds(monkeypatch):
    """With room for one list and two tables, backups alternating between two lists and of
    changing sizes keep at most that much and still write every byte."""
    from tiered_kv.kernels import staged_copy

    monkeypatch.setattr(staged_copy, "GEOMETRIES_KEPT", 1)
    monkeypatch.setattr(staged_copy, "TABLES_KEPT", 2)
    spec = SPECS["nsa"]
    device = make_device_pool(spec, NUM_PAGES)
    host = make_host_pool(spec, NUM_SLOTS, "layer_first")
    lists = [backup_pairs(device.pool, host), [(d[:], h[:]) for d, h in backup_pairs(device.pool, host)]]
    copier = StagedCopier("cpu", buffer_bytes=3 * max(p[0].shape[1] for p in lists[0]) + 7, num_buffers=3)
    for call in range(6):
        pairs = lists[call % 2]
        slots, pages = random_ids(4 + call, call, NUM_SLOTS), random_ids(4 + call, call + 1, NUM_PAGES)
        for _, h in pairs:
            h[slots] = 0
        copier.to_host(pairs, pages, slots)
        assert all(torch.equal(h[slots], d[pages]) for d, h in pairs)
        assert len(copier._geometries) == 1
        assert all(len(geometry.tables) <= 2 for geometry in copier._geometries.values())


@pytest.mark.parametrize(("first_wave", "own"), [(None, False), (1, True), (64, True)])
def test_only_calls_with_waves_upload_on_the_rings_own_stream(monkeypatch, first_wave, own):
    """``_run`` asks ``_send`` for the ring's own stream exactly when the call has ``first_wave``
    (a call without it uploads on the kernel stream)."""
    spec = SPECS["nsa"]
    device, host = make_device_pool(spec, NUM_PAGES), make_host_pool(spec, NUM_SLOTS, "page_first")
    slots, pages = random_ids(9, 0, NUM_SLOTS), random_ids(9, 1, NUM_PAGES)
    groups = [load_pairs(host, device.pool, layer) for layer in range(spec.num_layers)]
    copier = StagedCopier("cpu", buffer_bytes=4 * 2624, num_buffers=3)
    asked, send = [], copier._send

    def recorded(parts, kernel_stream, *, own_stream):
        asked.append(own_stream)
        return send(parts, kernel_stream, own_stream=own_stream)
    monkeypatch.setattr(copier, "_send", recorded)
    pairs = [pair for group in groups for pair in group]
    check_copy(pairs, slots, pages, device.roots,
               lambda: copier.to_device_groups(groups, slots, pages, first_wave=first_wave))
    assert asked and all(flag is own for flag in asked)


@pytest.mark.parametrize("first_wave", [None, 1])
def test_groups_without_pairs_are_reported_done_and_copy_nothing(first_wave):
    """A call whose groups hold no pairs (ids given) reports each group done and changes no byte
    (there is no unit to size the staging rows by)."""
    spec = SPECS["nsa"]
    device = make_device_pool(spec, NUM_PAGES)
    copier = StagedCopier("cpu", buffer_bytes=4 * 2624, num_buffers=3)
    before = [root.clone() for root in device.roots]
    done = []
    copier.to_device_groups([[], [], []], random_ids(5, 0, NUM_SLOTS), random_ids(5, 1, NUM_PAGES),
                            on_group_done=done.append, first_wave=first_wave)
    assert done == [0, 1, 2]
    assert all(torch.equal(a, b) for a, b in zip(before, device.roots))


def test_waves_upload_on_the_copiers_own_stream_and_the_kernel_stream_waits_for_each(monkeypatch):
    """On a GPU a wave's upload goes on the copier's upload stream (which waits for nothing), and
    the kernel stream waits on that upload's event, recorded after it; the device copy is kept for
    the kernel stream. One wave (``first_wave`` None) stays on the kernel stream. Stand-in streams."""
    from tests.fake_cuda import FakeStream, patch_cuda
    from tiered_kv.kernels import staged_copy

    copier = StagedCopier("cpu", buffer_bytes=4 * 2624, num_buffers=3)
    default = patch_cuda(monkeypatch)
    copier._on_gpu = True
    current, kept = [], []

    class Sent(torch.Tensor):
        def record_stream(self, stream):
            kept.append(stream)

    def upload(device, parts):
        current.append(torch.cuda.current_stream())  # the stream current while the upload is enqueued
        return [torch.zeros(1).as_subclass(Sent) for _ in parts]

    monkeypatch.setattr(staged_copy, "upload", upload)
    kernel_stream = FakeStream()
    copier._send([torch.zeros(2)], kernel_stream, own_stream=False)
    assert current == [kernel_stream] and kernel_stream.waited == [] and kept == []
    for _ in range(2):
        copier._send([torch.zeros(2), torch.zeros(3)], kernel_stream, own_stream=True)
    assert current[1] is copier._upload_stream and current[2] is copier._upload_stream
    assert copier._upload_stream is not kernel_stream
    # Each wait binds to the record made right after its own upload (one record per event).
    assert [count for _, count in kernel_stream.waited] == [1, 1]
    assert all(event.records == [copier._upload_stream] for event, _ in kernel_stream.waited)
    assert kept == [kernel_stream, kernel_stream]
    assert torch.cuda.current_stream() is default  # each upload's stream made current only for it


def test_batch_copy_list_merges_only_rows_adjacent_on_both_sides():
    src = torch.zeros(10, 8, dtype=torch.uint8)
    dst = torch.zeros(12, 8, dtype=torch.uint8)
    # Sorted by source: 2->5, 3->6, 4->7 is one run; 8->0 and 9->2 are adjacent in the source
    # only, so they stay two copies.
    copies = plan_copy_list([(src, dst)], torch.tensor([3, 9, 2, 8, 4]), torch.tensor([6, 2, 5, 0, 7]))
    base_s, base_d = src.data_ptr(), dst.data_ptr()
    got = sorted(zip((copies.srcs - base_s).tolist(), (copies.dsts - base_d).tolist(), copies.sizes.tolist()))
    assert got == [(16, 40, 24), (64, 0, 8), (72, 16, 8)]
    assert copies.nbytes == 5 * 8


def test_batch_copy_list_merges_runs_of_dense_rows_and_keeps_pitched_rows_apart():
    src = torch.arange(6 * 12, dtype=torch.uint8).view(6, 12)
    dst = torch.zeros(6, 12, dtype=torch.uint8)
    dense = [(src, dst)]
    pitched = [(src[:, :5], dst[:, :5]), (src[:, 5:], dst[:, 5:])]  # two components per row
    ids, targets = torch.tensor([3, 1, 2]), torch.tensor([4, 2, 3])
    copies = plan_copy_list(dense, ids, targets)
    assert len(copies) == 1 and copies.sizes.tolist() == [36]
    copies = plan_copy_list(pitched, ids, targets)
    assert len(copies) == 6 and copies.nbytes == 36  # rows of a pair are 12 B apart, not 5 or 7
    assert len(plan_copy_list(dense, ids, targets, merge=False)) == 3
    copy_pages_batch(pitched, ids, targets)
    assert torch.equal(dst[2:5], src[1:4]) and dst[[0, 1, 5]].eq(0).all()


def test_batch_copy_list_rejects_mismatched_ids_and_widths():
    src = torch.zeros(4, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="ids"):
        plan_copy_list([(src, src)], torch.tensor([0, 1]), torch.tensor([2]))
    with pytest.raises(ValueError, match="bytes per row"):
        plan_copy_list([(src, torch.zeros(4, 6, dtype=torch.uint8))], torch.tensor([0]), torch.tensor([1]))


@pytest.mark.parametrize("to_device", [True, False])
def test_unit_tables_hold_source_then_destination_columns_and_share_one_anchor(to_device):
    """A unit's table is (src offset, dst offset, src pitch, dst pitch, chunk bytes) per pair, the
    staging side in the ring slot's buffer; every plan's anchor is the one view of the storage for
    its word size (made once, not per unit)."""
    spec = SPECS["nsa"]
    device = make_device_pool(spec, NUM_PAGES)
    host = make_host_pool(spec, NUM_SLOTS, "layer_first")
    pairs = [p for layer in range(spec.num_layers) for p in load_pairs(device.pool, host, layer)] if to_device \
        else backup_pairs(device.pool, host)
    copier = StagedCopier("cpu", buffer_bytes=4 * 2624, num_buffers=3)
    slots = np.sort(random_ids(9, 2, NUM_SLOTS).numpy())
    breaks = np.flatnonzero(np.diff(slots) != 1) + 1
    geometry = copier._geometry_of(pairs, to_device)
    host_views = [p[0] if to_device else p[1] for p in pairs]
    units = copier._units(host_views, slots, np.concatenate(([0], breaks)), np.concatenate((breaks, [slots.size])))
    storage = copier._storage.data_ptr()
    anchors = set()
    for slot, unit in zip(itertools.cycle(range(3)), units):
        table = copier._table(unit, slot, geometry, to_device)
        for row, k, (offset, pitch, chunk) in zip(table.tolist(), unit.pairs, unit.stage_views):
            view = pairs[k][1] if to_device else pairs[k][0]
            stage, dev = (slot * copier.buffer_bytes + offset, pitch), (view.data_ptr() - storage, view.stride(0))
            src, dst = (stage, dev) if to_device else (dev, stage)
            assert row == [src[0], dst[0], src[1], dst[1], chunk]
        anchors.add(id(copier._plan_table(table).plan.anchor))
    assert len(anchors) == len(copier._anchors) <= 2
